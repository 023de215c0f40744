"""The card payment example runs on every backend, and as a script on SQLite."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from statifier.examples.card_payment import run
from statifier.persistence import Status, Storage
from statifier.persistence.adapter import Adapter


@pytest.mark.asyncio
async def test_the_payment_settles_across_restarts(adapter: Adapter) -> None:
    out = io.StringIO()
    record = await run(lambda: Storage(adapter), out)
    assert record.status is Status.COMPLETED
    text = out.getvalue()
    assert "gateway side effects performed: 2 (one per key)" in text
    assert "replayed from its input log to the same position: True" in text


def test_the_script_runs_on_sqlite() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "statifier.examples.card_payment"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "the gateway called back: completed" in done.stdout
    assert "replayed from its input log to the same position: True" in done.stdout
