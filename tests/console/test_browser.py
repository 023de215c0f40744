"""The console in a real browser: headless Chromium, driven by Selenium, against a real
``statifier serve`` on loopback over SQLite, with executions the test creates through
the service's webhook.

One walk through the console as an operator would make it: refused without the token,
logged in with it, an execution opened with its active states lit, its input log
stepped through, a datamodel value holding markup shown as text (no script ran), the
execution cancelled behind its confirmation (and audited), the executions list updated
live while the page stays loaded. Another follows a chart error from the list's errors
filter to its execution and its step, finds it on the failures page, and tells a paid
order from an expired one. A third types an order's key in the list's search. A fourth
pauses an order, sees the payment sent meanwhile wait on its page, and resumes it. A
fifth cancels the orders a filter selects in bulk, from the list to the run's end. With
``STATIFIER_SCREENSHOTS=1`` the walks write the screenshots of ``docs/console.md``.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime

import httpx
import pytest
import sqlalchemy as sa
from selenium.common.exceptions import (
    NoAlertPresentException,
    StaleElementReferenceException,
    TimeoutException,
    WebDriverException,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.wait import WebDriverWait
from tests.console.conftest import (
    OPERATOR_TOKEN,
    READER_TOKEN,
    SCREENSHOTS,
    SCREENSHOTS_ENV,
    ServedConsole,
)

from statifier.console.audit import Audit
from statifier.console.auth import COOKIE
from statifier.console.queries import ConsoleQueries
from statifier.sql.tables import Tables

MARKUP = "<script>alert(1)</script>"
WAIT = 20.0


def _address(database: str, key: str) -> str:
    async def find() -> str:
        async with ConsoleQueries.open(database, Tables.define()) as queries:
            (address,) = await queries.addresses(key)
            return address.execution_id

    return asyncio.run(find())


def _status(database: str, execution_id: str) -> str | None:
    async def read() -> str | None:
        async with ConsoleQueries.open(database, Tables.define()) as queries:
            detail = await queries.execution(execution_id)
            return None if detail is None else detail.record.status.value

    return asyncio.run(read())


def _audited(database: str, target: str) -> list[tuple[str, str, str]]:
    async def read() -> list[tuple[str, str, str]]:
        async with ConsoleQueries.open(database, Tables.define()) as queries:
            page = await Audit(queries.engine, queries.tables).entries(target=target)
            return [(row.actor, row.action, row.outcome) for row in page.rows]

    return asyncio.run(read())


def _dead_letter(database: str) -> None:
    """A message a stream consumer gave up on, as the consumer writes it."""
    engine = sa.create_engine(database)
    try:
        with engine.begin() as connection:
            connection.execute(
                Tables.define().consumer_dead_letters.insert(),
                {
                    "source": "scans",
                    "partition": "3",
                    "position": 1042771,
                    "message_id": "scan-1042771",
                    "reason": "malformed: not a JSON object",
                    "raw": b"<not json>",
                    "dead_at": datetime.now(UTC),
                },
            )
    finally:
        engine.dispose()


def _screenshot(browser: WebDriver, name: str) -> None:
    if os.environ.get(SCREENSHOTS_ENV) != "1":
        return
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(SCREENSHOTS / name))


def _wait(browser: WebDriver) -> WebDriverWait[WebDriver]:
    return WebDriverWait(browser, WAIT)


def _active_states(browser: WebDriver) -> set[str]:
    found = browser.find_elements(By.CSS_SELECTOR, "#diagram g.state.active[data-state]")
    return {str(element.get_attribute("data-state")) for element in found}


def _follow(browser: WebDriver, element: WebElement) -> None:
    """Click ``element`` and wait until its page has been replaced by the next one."""
    element.click()
    _wait(browser).until(lambda _: _gone(element))


def _gone(element: WebElement) -> bool:
    """Whether ``element`` has left its document. Chromium, asked in the instant its
    page is being replaced, may answer that the node "does not belong to the
    document" rather than that the reference is stale: the same fact."""
    try:
        element.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as error:
        if "does not belong to the document" in str(error.msg):
            return True
        raise
    return False


def _classes(browser: WebDriver, state: str) -> list[str]:
    element = browser.find_element(By.CSS_SELECTOR, f'#diagram [data-state="{state}"]')
    return str(element.get_attribute("class")).split()


def _no_alert(browser: WebDriver) -> None:
    with pytest.raises(TimeoutException):
        WebDriverWait(browser, 1.0).until(expected_conditions.alert_is_present())
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert  # noqa: B018 - the property raises when there is none


def _log_in(browser: WebDriver, served: ServedConsole, token: str) -> None:
    browser.get(f"{served.url}/console/executions")
    _wait(browser).until(expected_conditions.url_contains("/console/login"))
    assert browser.find_elements(By.ID, "executions") == []
    browser.find_element(By.ID, "token").send_keys(token)
    _follow(browser, browser.find_element(By.ID, "login"))
    assert browser.find_elements(By.ID, "executions") != []


def test_refused_without_a_token(served_console: ServedConsole) -> None:
    served = served_console
    served.scan("p-1", "m-1")
    execution_id = _address(served.database, "p-1")
    with httpx.Client(base_url=served.url, follow_redirects=False, timeout=10) as client:
        page = client.get("/console/executions")
        assert page.status_code == 303
        assert page.headers["location"].startswith("/console/login")
        assert execution_id not in page.text
        assert client.get("/console/events").status_code == 401
        detail = client.get(f"/console/executions/{execution_id}")
        assert detail.status_code == 303
        cancel = client.post(f"/console/executions/{execution_id}/cancel", data={"csrf": "x"})
        assert cancel.status_code in (303, 401, 403)
        wrong = client.post("/console/login", data={"token": "not-" + OPERATOR_TOKEN})
        assert wrong.status_code == 401
        assert COOKIE not in "".join(wrong.headers.get_list("set-cookie"))
    with httpx.Client(base_url=served.url, timeout=10) as reader:
        reader.post("/console/login", data={"token": READER_TOKEN, "next": "/console/"})
        assert COOKIE in reader.cookies
        shown = reader.get(f"/console/executions/{execution_id}")
        assert shown.status_code == 200
        assert 'id="cancel"' not in shown.text  # a read-only operator sees no action
        refused = reader.post(f"/console/executions/{execution_id}/cancel", data={"csrf": "x"})
        assert refused.status_code == 403
    assert _audited(served.database, execution_id) == []
    assert _status(served.database, execution_id) == "active"  # nothing was cancelled


def test_an_operators_walk_through_the_console(
    served_console: ServedConsole, browser: WebDriver
) -> None:
    served = served_console
    served.scan("p-1", "m-1", note=MARKUP)
    served.scan("p-1", "m-2")
    served.scan("p-2", "m-3", note="fragile")
    first = _address(served.database, "p-1")
    second = _address(served.database, "p-2")

    _log_in(browser, served, OPERATOR_TOKEN)
    rows = browser.find_elements(By.CSS_SELECTOR, "#executions tr[data-execution-id]")
    assert {row.get_attribute("data-execution-id") for row in rows} == {first, second}

    # The execution: its active configuration lit in the diagram.
    _follow(browser, browser.find_element(By.CSS_SELECTOR, f'tr[data-execution-id="{first}"] a'))
    assert _active_states(browser) == {"transit", "van"}
    assert "active" in _classes(browser, "van")
    assert "active" not in _classes(browser, "hub")
    assert "state" in _classes(browser, "hub")
    # The datamodel's markup is text on the page, and no script of it ran.
    datamodel = browser.find_element(By.ID, "datamodel")
    assert MARKUP in datamodel.text
    assert datamodel.find_elements(By.TAG_NAME, "script") == []
    _no_alert(browser)

    # The timeline replays it: step 0 is the start, then one step per scan.
    steps = browser.find_elements(By.CSS_SELECTOR, "#timeline a.replay-step")
    assert [step.get_attribute("data-step") for step in steps] == ["0", "1", "2"]
    expected = {"0": {"received"}, "1": {"transit", "hub"}, "2": {"transit", "van"}}
    for index, states in expected.items():
        link = browser.find_element(
            By.CSS_SELECTOR, f'#timeline a.replay-step[data-step="{index}"]'
        )
        _follow(browser, link)
        assert browser.current_url.endswith(f"?step={index}")
        assert _active_states(browser) == states
        current = browser.find_element(By.CSS_SELECTOR, "#timeline a[aria-current=step]")
        assert current.get_attribute("data-step") == index
    _follow(
        browser, browser.find_element(By.CSS_SELECTOR, '#timeline a.replay-step[data-step="1"]')
    )
    assert MARKUP in browser.find_element(By.ID, "datamodel").text
    _no_alert(browser)

    # Cancel, behind its confirmation; the audit trail names the operator.
    _follow(browser, browser.find_element(By.ID, "cancel"))
    _follow(browser, browser.find_element(By.ID, "confirm"))
    _wait(browser).until(
        expected_conditions.text_to_be_present_in_element((By.ID, "status"), "cancelled")
    )
    assert browser.find_elements(By.ID, "cancel") == []
    assert _audited(served.database, first) == [("ada", "cancel", "done")]

    # The list updates live: a new execution appears without the page reloading.
    browser.get(f"{served.url}/console/executions")
    _wait(browser).until(expected_conditions.presence_of_element_located((By.ID, "executions")))
    cancelled = browser.find_element(By.CSS_SELECTOR, f'tr[data-execution-id="{first}"] .status')
    assert cancelled.text == "cancelled"
    browser.execute_script("window.stillTheSamePage = true;")
    served.scan("p-3", "m-4", note="express")
    third = _address(served.database, "p-3")
    _wait(browser).until(
        expected_conditions.presence_of_element_located(
            (By.CSS_SELECTOR, f'#executions tr[data-execution-id="{third}"]')
        )
    )
    assert browser.execute_script("return window.stillTheSamePage === true;") is True
    rows = browser.find_elements(By.CSS_SELECTOR, "#executions tr[data-execution-id]")
    assert rows[0].get_attribute("data-execution-id") == third  # newest first

    served.scan("p-3", "m-5")
    for scan in range(6):
        served.scan(f"p-{10 + scan}", f"m-{10 + scan}")
    browser.get(f"{served.url}/console/routing")
    _wait(browser).until(expected_conditions.title_contains("Routing"))
    assert "carrier_scans" in browser.find_element(By.TAG_NAME, "main").text
    _screenshot(browser, "routing.png")
    _dead_letter(served.database)
    browser.get(f"{served.url}/console/failures")
    _wait(browser).until(expected_conditions.title_contains("Failures"))
    assert "malformed: not a JSON object" in browser.find_element(By.TAG_NAME, "main").text
    browser.get(f"{served.url}/console/executions")
    rows = browser.find_elements(By.CSS_SELECTOR, "#executions tr[data-execution-id]")
    assert len(rows) == 9  # p-1 (cancelled), p-2, p-3 and p-10 to p-15


def _wait_for_status(database: str, execution_id: str, status: str) -> None:
    """Poll the database (bounded) until the execution has ``status``."""
    deadline = time.monotonic() + WAIT
    while _status(database, execution_id) != status:
        assert time.monotonic() < deadline, f"{execution_id} never became {status}"
        time.sleep(0.1)


def _what_the_run_left(served: ServedConsole, browser: WebDriver, orders: list[str]) -> str:
    """What a bulk run's page, its orders' statuses and audit rows, and the service's
    log say: for a run whose counts are not the ones expected."""
    rows = {
        order: (_status(served.database, order), _audited(served.database, order))
        for order in orders
    }
    log = served.log.read_text(encoding="utf-8").splitlines()[-40:]
    return "\n".join([browser.find_element(By.ID, "run").text, repr(rows), *log])


def _texts(browser: WebDriver, selector: str) -> list[str]:
    return [element.text for element in browser.find_elements(By.CSS_SELECTOR, selector)]


def test_an_error_and_final_states_as_an_operator_sees_them(
    served_console: ServedConsole, browser: WebDriver
) -> None:
    """The newcomer's order: a checkout whose amount is a word raises error.execution
    at the <assign>, and the payment timeout is never armed; the error shows on the
    execution page, in the list's errors filter and on the failures page. A paid order
    and an expired one read apart."""
    served = served_console
    served.order("checkout", "o-stuck", "c-1", amount="two", timeout="15s")
    served.order("checkout", "o-paid", "c-2", amount=5, timeout="1h")
    served.order("pay", "o-paid", "p-2")
    served.order("checkout", "o-late", "c-3", amount=5, timeout="1s")
    stuck = _address(served.database, "o-stuck")
    paid = _address(served.database, "o-paid")
    late = _address(served.database, "o-late")
    _wait_for_status(served.database, paid, "completed")
    _wait_for_status(served.database, late, "completed")  # the service's timer fired
    _dead_letter(served.database)

    _log_in(browser, served, OPERATOR_TOKEN)
    row = '#executions tr[data-execution-id="{}"]'
    assert _texts(browser, row.format(paid) + " .final-state") == ["→ paid"]
    assert _texts(browser, row.format(late) + " .final-state") == ["→ expired"]
    assert _texts(browser, row.format(stuck) + " td.errors") == ["1"]
    assert _texts(browser, row.format(paid) + " td.errors") == ["\N{EN DASH}"]
    _screenshot(browser, "executions.png")

    # The errors filter: only the execution whose step raised.
    browser.find_element(By.ID, "errors-filter").click()
    _follow(browser, browser.find_element(By.CSS_SELECTOR, "form.filters button"))
    assert "errors=1" in browser.current_url
    listed = browser.find_elements(By.CSS_SELECTOR, "#executions tr[data-execution-id]")
    assert [r.get_attribute("data-execution-id") for r in listed] == [stuck]

    # Its page: the count, the error with where it was raised, and its step.
    _follow(browser, browser.find_element(By.CSS_SELECTOR, f'tr[data-execution-id="{stuck}"] a'))
    assert browser.find_element(By.ID, "status").text == "active"
    assert browser.find_element(By.ID, "error-count").text.startswith("1, the last ")
    (error,) = browser.find_elements(By.CSS_SELECTOR, "#execution-errors tr.error-row")
    cells = [cell.text for cell in error.find_elements(By.TAG_NAME, "td")]
    assert cells[1:7] == [
        "error.execution",
        "<assign>",
        "5",
        "7",
        "'*' expects numbers, got a string",
        "no transition took it",
    ]
    assert _texts(browser, "#timers tr[data-send-id]") == []  # no timeout was armed
    _screenshot(browser, "execution-error.png")
    _follow(browser, error.find_element(By.CSS_SELECTOR, "a.error-step"))
    assert browser.current_url.endswith("?step=1#step-1")
    step = browser.find_element(By.ID, "step-1")
    assert "selected" in str(step.get_attribute("class")).split()
    assert "error.execution at <assign>, line 5, column 7" in step.text
    assert "two" in step.find_element(By.CSS_SELECTOR, ".data-preview").text

    # The failures page names it beside the dead letters, and leads back to it.
    browser.get(f"{served.url}/console/failures")
    _wait(browser).until(expected_conditions.title_contains("Failures"))
    (listed_error,) = browser.find_elements(By.CSS_SELECTOR, "#chart-error-rows tr[data-error]")
    assert listed_error.get_attribute("data-execution-id") == stuck
    assert "expects numbers" in listed_error.text
    assert "malformed: not a JSON object" in browser.find_element(By.TAG_NAME, "main").text
    _screenshot(browser, "failures.png")
    _follow(browser, listed_error.find_element(By.TAG_NAME, "a"))
    assert browser.find_element(By.ID, "execution-id").text == stuck

    # A finished order says where it ended, in the header and at its last step.
    for execution_id, final in ((paid, "paid"), (late, "expired")):
        browser.get(f"{served.url}/console/executions/{execution_id}")
        _wait(browser).until(
            expected_conditions.presence_of_element_located((By.ID, "final-state"))
        )
        assert browser.find_element(By.ID, "final-state").text == final
        assert browser.find_elements(By.ID, "configuration") == []
        assert _active_states(browser) == {final}
        last = browser.find_elements(By.CSS_SELECTOR, "#timeline li.step")[-1]
        assert f"final {final}" in last.text
        if final == "expired":
            fired = browser.find_element(By.CSS_SELECTOR, "#step-1 .step-send")
            assert "fired at step 2" in fired.text
    _screenshot(browser, "execution.png")
    browser.execute_script("document.getElementById('timeline').scrollIntoView();")
    _screenshot(browser, "timeline.png")


def test_an_operator_types_a_key_in_the_search_and_finds_its_execution(
    served_console: ServedConsole, browser: WebDriver
) -> None:
    """Three orders; the operator types one's business key in the list's search and
    finds that execution alone, the key kept in the field and said above the list;
    then narrows to the orders that ended paid."""
    served = served_console
    served.order("checkout", "o-wanted", "c-1", amount=5, timeout="1h")
    served.order("pay", "o-wanted", "p-1")
    served.order("checkout", "o-other", "c-2", amount=5, timeout="1h")
    served.order("checkout", "o-stuck", "c-3", amount="two", timeout="1h")
    wanted = _address(served.database, "o-wanted")
    _wait_for_status(served.database, wanted, "completed")

    _log_in(browser, served, OPERATOR_TOKEN)
    listed = browser.find_elements(By.CSS_SELECTOR, "#executions tr[data-execution-id]")
    assert len(listed) == 3
    field = browser.find_element(By.ID, "search-key")
    field.send_keys("o-wanted" + Keys.ENTER)  # Enter in the field submits the search
    _wait(browser).until(expected_conditions.staleness_of(field))
    assert "key=o-wanted" in browser.current_url
    listed = browser.find_elements(By.CSS_SELECTOR, "#executions tr[data-execution-id]")
    assert [r.get_attribute("data-execution-id") for r in listed] == [wanted]
    assert browser.find_element(By.ID, "search-key").get_attribute("value") == "o-wanted"
    said = browser.find_element(By.ID, "search-said").text
    assert said == "Executions addressed by the key o-wanted."

    # The final state alone: the paid order, not the one still waiting.
    browser.find_element(By.ID, "search-key").clear()
    final = browser.find_element(By.ID, "search-final")
    final.send_keys("paid")
    _follow(browser, browser.find_element(By.CSS_SELECTOR, "form.filters button"))
    listed = browser.find_elements(By.CSS_SELECTOR, "#executions tr[data-execution-id]")
    assert [r.get_attribute("data-execution-id") for r in listed] == [wanted]
    assert "final=paid" in browser.current_url


def test_an_operator_pauses_an_order_sees_what_waits_and_resumes_it(
    served_console: ServedConsole, browser: WebDriver
) -> None:
    """An order paused behind its confirmation: a payment posted meanwhile waits on its
    page under "Held while paused" and the order stays where it was; resumed, the
    payment is stepped in and the order ends paid. Both actions are audited."""
    served = served_console
    served.order("checkout", "o-held", "c-1", amount=5, timeout="1h")
    order = _address(served.database, "o-held")
    _wait_for_status(served.database, order, "active")

    _log_in(browser, served, OPERATOR_TOKEN)
    browser.get(f"{served.url}/console/executions/{order}")
    _follow(browser, browser.find_element(By.ID, "pause"))
    _follow(browser, browser.find_element(By.ID, "confirm"))
    _wait(browser).until(
        expected_conditions.text_to_be_present_in_element((By.ID, "status"), "paused")
    )
    assert browser.find_elements(By.ID, "pause") == []

    served.order("pay", "o-held", "p-1")  # answered 200: held, not refused
    browser.refresh()
    held = _texts(browser, "#held-events tr.held-row td:nth-child(2)")
    assert held == ["pay"]
    assert _active_states(browser) == {"awaiting_payment"}
    browser.execute_script("document.getElementById('held-panel').scrollIntoView()")
    _screenshot(browser, "paused.png")

    _follow(browser, browser.find_element(By.ID, "resume"))
    _follow(browser, browser.find_element(By.ID, "confirm"))
    _wait(browser).until(
        expected_conditions.text_to_be_present_in_element((By.ID, "status"), "completed")
    )
    assert browser.find_elements(By.ID, "held-events") == []
    assert _status(served.database, order) == "completed"
    assert _audited(served.database, order) == [
        ("ada", "resume", "done"),
        ("ada", "pause", "done"),
    ]


def test_an_operator_cancels_the_orders_a_filter_selects_in_bulk(
    served_console: ServedConsole, browser: WebDriver
) -> None:
    """From the filtered executions list to the bulk page: cancel chosen, previewed (the
    three waiting orders, not the paid one), confirmed; the run's page follows it to
    its end by itself. Each order is cancelled with its audit row."""
    served = served_console
    for n in range(3):
        served.order("checkout", f"o-bulk-{n}", f"c-bulk-{n}", amount=5, timeout="1h")
    served.order("checkout", "o-paid", "c-paid", amount=5, timeout="1h")
    served.order("pay", "o-paid", "p-paid")
    orders = [_address(served.database, f"o-bulk-{n}") for n in range(3)]
    paid = _address(served.database, "o-paid")
    for order in orders:
        _wait_for_status(served.database, order, "active")
    _wait_for_status(served.database, paid, "completed")

    _log_in(browser, served, OPERATOR_TOKEN)
    browser.get(f"{served.url}/console/executions?document=order&status=active")
    _follow(browser, browser.find_element(By.ID, "bulk-link"))
    action = browser.find_element(By.ID, "bulk-action")
    action.find_element(By.CSS_SELECTOR, 'option[value="cancel"]').click()
    _follow(browser, browser.find_element(By.ID, "bulk-preview"))
    said = browser.find_element(By.ID, "preview-said").text
    assert said == "3 executions selected to cancel."
    assert [_status(served.database, order) for order in orders] == ["active"] * 3
    _screenshot(browser, "bulk-preview.png")

    _follow(browser, browser.find_element(By.ID, "confirm-bulk"))
    # The whole word: "unfinished" holds "finished".
    _wait(browser).until(
        lambda _: (
            browser.find_element(By.ID, "run-state").text in ("finished", "stopped", "unfinished")
        )
    )
    counts = {
        str(cell.get_attribute("data-count")): cell.text
        for cell in browser.find_elements(By.CSS_SELECTOR, "#run-counts td[data-count]")
    }
    assert counts == {"done": "3", "skipped": "0", "failed": "0"}, _what_the_run_left(
        served, browser, orders
    )
    assert browser.find_element(By.ID, "run-state").text == "finished"
    _screenshot(browser, "bulk-run.png")
    assert [_status(served.database, order) for order in orders] == ["cancelled"] * 3
    assert _status(served.database, paid) == "completed"
    for order in orders:
        assert _audited(served.database, order) == [("ada", "cancel", "done")]
