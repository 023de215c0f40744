"""The HTTP API's watcher: a read that keeps failing is logged once per interval, and
the waiter is answered with what it last saw when its time is up."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import pytest

from statifier.api.views import Snapshot
from statifier.api.watcher import Mark, Watcher


@pytest.mark.asyncio
async def test_a_read_that_keeps_failing_is_logged_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reads: list[int] = []

    async def read_marks(ids: Sequence[str]) -> Mapping[str, Mark]:
        reads.append(len(ids))
        raise ConnectionError("the database went away")

    async def load(execution_id: str) -> Snapshot | None:
        raise AssertionError("nothing is loaded without a mark")

    watcher = Watcher(read_marks, load, poll=0.02)
    try:
        with caplog.at_level(logging.WARNING, "statifier.api"):
            assert await watcher.wait("ex_1", "done", within=0.3) is None
    finally:
        await watcher.close()
    assert len(reads) > 3  # read again at each interval
    said = [r for r in caplog.records if "reading the executions waited on" in r.getMessage()]
    assert [(r.levelname, r.getMessage()) for r in said] == [
        (
            "WARNING",
            "api: reading the executions waited on failed: ConnectionError: the database went away",
        )
    ]
