"""scriba.testing: handlers run and commit without a pipeline, and failures are reported."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from scriba import Error, Event, Insert, MemoryTarget, Meta, Projection, Result, Skip
from scriba.target import FailureKind
from scriba.testing import project

ROWS = sa.Table("t_rows", sa.MetaData(), sa.Column("id", sa.Text, primary_key=True))
NOW = datetime.now(UTC)


def event(position: int, stream: str, kind: str = "E") -> Event:
    return Event(f"e{position}", stream, kind, None, position, NOW)


class Handler(Projection):
    name = "testing"
    target = MemoryTarget

    async def handle(self, event: Event, meta: Meta) -> Result:
        assert meta.attempt == 1
        if event.type == "raise":
            raise ValueError("bad event")
        if event.type == "error":
            return Error("refused")
        if event.type == "skip":
            return Skip()
        return Insert(ROWS, {"id": event.id})


@pytest.mark.asyncio
async def test_results_are_reported_and_only_operations_commit() -> None:
    target = MemoryTarget()
    events = [event(1, "a"), event(2, "a", "skip"), event(3, "b", "raise"), event(4, "b", "error")]
    report = await project(Handler, events, target=target)
    assert report.committed
    assert [type(h.result).__name__ for h in report.handled] == [
        "Insert",
        "Skip",
        "NoneType",
        "Error",
    ]
    assert isinstance(report.handled[2].exception, ValueError)
    assert [h.failed for h in report.handled] == [False, False, True, True]
    assert target.rows(ROWS) == [{"id": "e1"}]
    # Failed events do not move their stream's cursor; nothing is dead-lettered.
    assert target.cursors(Handler.key()) == {"a": 2}
    assert (await target.dead_letter_stats(Handler.key())).total == 0


@pytest.mark.asyncio
async def test_no_dedup_and_no_retry_a_failing_commit_is_reported() -> None:
    target = MemoryTarget()
    first = await project(Handler, [event(1, "a")], target=target)
    again = await project(Handler, [event(1, "a")], target=target)  # no dedup: a duplicate
    assert first.committed
    assert not again.committed
    assert again.failure is not None
    assert again.failure.kind is FailureKind.INTEGRITY
    assert target.calls == 2  # no replay either


@pytest.mark.asyncio
async def test_without_commit_only_the_handler_runs_and_the_class_target_is_used() -> None:
    report = await project(Handler, [event(1, "a")], commit=False)
    assert not report.committed
    assert [type(op).__name__ for op in report.operations] == ["Insert"]
    made = await project(Handler, [event(1, "a")])  # the class's target factory
    assert made.committed
