"""The "try a revision" page in a real browser: headless Chromium against a real
``statifier serve`` over SQLite (the fixtures of test_browser.py). An operator uploads
a revision of the parcel chart through the page's file input, watches the replay reach
its end, and opens one execution's divergence: the stored chart and the revision drawn
side by side, each with the states it had where they parted. With
``STATIFIER_SCREENSHOTS=1`` it writes the screenshot of ``docs/console.md``."""

from __future__ import annotations

from pathlib import Path

from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions
from tests.console.conftest import OPERATOR_TOKEN, PARCEL, ServedConsole
from tests.console.test_browser import _address, _follow, _log_in, _screenshot, _wait

REVISION = PARCEL.replace(
    '<state id="transit" initial="hub">', '<state id="transit" initial="van">'
)
"""The parcel chart with the hub skipped: a first scan takes a parcel to the van."""


def _lit(browser: WebDriver, figure: str) -> set[str]:
    found = browser.find_elements(By.CSS_SELECTOR, f"#{figure} g.state.active[data-state]")
    return {str(element.get_attribute("data-state")) for element in found}


def test_an_operator_tries_a_revision_and_sees_where_it_parts(
    served_console: ServedConsole, browser: WebDriver, tmp_path: Path
) -> None:
    served = served_console
    served.scan("p-1", "m-1")
    served.scan("p-1", "m-2")
    served.scan("p-2", "m-3")
    first = _address(served.database, "p-1")
    chart = tmp_path / "parcel.scxml"
    chart.write_text(REVISION, encoding="utf-8")

    _log_in(browser, served, OPERATOR_TOKEN)
    _follow(browser, browser.find_element(By.CSS_SELECTOR, 'header nav a[href$="/revisions"]'))
    browser.find_element(By.ID, "chart-file").send_keys(str(chart))
    _follow(browser, browser.find_element(By.ID, "try-revision"))
    assert "/console/revisions/" in browser.current_url

    # The job page follows the replay until its end (the script fetches it again).
    _wait(browser).until(
        expected_conditions.text_to_be_present_in_element((By.ID, "job-state"), "done")
    )
    assert browser.find_element(By.ID, "progress-text").text == "2 of 2 executions"
    progress = browser.find_element(By.ID, "progress")
    assert progress.get_attribute("value") == progress.get_attribute("max") == "2"
    counts = {
        str(cell.get_attribute("data-verdict")): cell.text
        for cell in browser.find_elements(By.CSS_SELECTOR, "#counts td[data-verdict]")
    }
    assert counts == {"same": "0", "diverged": "2", "new_errors": "0", "untrusted": "0"}

    # One execution's divergence: both charts, each lit where it was after the scan.
    row = browser.find_element(By.CSS_SELECTOR, f'#results tr[data-execution-id="{first}"]')
    assert "after input 1 (scan): configuration" in row.text
    _follow(browser, row.find_element(By.CSS_SELECTOR, "a.show-result"))
    assert browser.find_element(By.ID, "shown-execution").text == first
    assert _lit(browser, "diagram-old") == {"transit", "hub"}
    assert _lit(browser, "diagram-new") == {"transit", "van"}
    assert browser.find_element(By.ID, "old-configuration").text == "hub"
    assert browser.find_element(By.ID, "new-configuration").text == "van"
    browser.find_element(By.ID, "parted").location_once_scrolled_into_view  # noqa: B018
    _screenshot(browser, "revision.png")
