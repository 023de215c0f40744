"""The routing part of ``statifier demo`` (:mod:`statifier.examples.ad_join`): what it
routes, and what it prints."""

from __future__ import annotations

import io
import re
from collections import Counter
from pathlib import Path

import pytest

from statifier.examples import ad_join


def _ledger_lines(text: str) -> list[list[str]]:
    """The printed ledger rows, each split into binding, message id, outcome, key (the
    columns are at least two spaces apart; an outcome has one space inside)."""
    lines = text.split("a day later:")[0].splitlines()[1:]
    return [re.split(r"\s{2,}", line.strip()) for line in lines if line.strip()]


def _join_lines(text: str) -> dict[str, str]:
    """The printed joins: key to its execution's status."""
    lines = text.split("joins:")[1].splitlines()
    return dict(line.split(None, 1) for line in lines if line.strip())


@pytest.mark.asyncio
async def test_the_demo_prints_each_delivery_with_its_outcome_and_key(tmp_path: Path) -> None:
    out = io.StringIO()
    await ad_join.run(f"sqlite:///{tmp_path / 'ads.db'}", out)
    assert _ledger_lines(out.getvalue()) == [
        ["impressions_to_join", "ad_server/0/1", "created_and_delivered", "imp_1"],
        ["impressions_to_join", "ad_server/0/2", "created_and_delivered", "imp_2"],
        ["impressions_to_join", "ad_server/0/3", "created_and_delivered", "imp_3"],
        ["clicks_to_join", "click_tracker/0/1", "delivered", "imp_1"],
        ["clicks_to_join", "click_tracker/0/2", "delivered", "imp_2"],
        ["clicks_to_join", "click_tracker/0/1", "duplicate", "imp_1"],
        ["clicks_to_join", "click_tracker/0/3", "dropped: no_execution", "imp_404"],
    ]


@pytest.mark.asyncio
async def test_both_joins_complete_and_the_unknown_click_opens_none(tmp_path: Path) -> None:
    out = io.StringIO()
    await ad_join.run(f"sqlite:///{tmp_path / 'ads.db'}", out)
    assert _join_lines(out.getvalue()) == {
        "imp_1": "completed",
        "imp_2": "completed",
        "imp_3": "completed",
        "imp_404": "no execution",
    }


@pytest.mark.asyncio
async def test_the_unclicked_window_closes_by_timer_and_the_outbox_is_drained(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    await ad_join.run(f"sqlite:///{tmp_path / 'ads.db'}", out)
    text = out.getvalue()
    assert "a day later: 1 click window(s) closed by the timer queue" in text
    drained = text.split("drained after the commit:")[1].split("joins:")[0]
    assert sorted(line.split()[:2] for line in drained.splitlines() if line.strip()) == [
        ["joined", "pair.joined"],
        ["joined", "pair.joined"],
        ["orphaned", "impression.orphaned"],
    ]


@pytest.mark.asyncio
async def test_a_second_run_on_the_same_database_is_all_duplicates(tmp_path: Path) -> None:
    """Every message was claimed by the first run (the dropped click too), so the same
    messages again reach no execution: the joins stay as the first run left them."""
    url = f"sqlite:///{tmp_path / 'ads.db'}"
    await ad_join.run(url, io.StringIO())
    out = io.StringIO()
    rows = await ad_join.run(url, out)
    # Both runs' rows, 12 in all: the second run only added duplicates.
    assert Counter(row.spelled for row in rows) == {
        "created_and_delivered": 3,
        "delivered": 2,
        "duplicate": 1 + 7,
        "dropped: no_execution": 1,
    }
    assert _join_lines(out.getvalue())["imp_1"] == "completed"
