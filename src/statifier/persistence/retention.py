"""Retention: clearing what finished executions no longer need, keeping their rows.

>>> import asyncio
>>> from datetime import UTC, datetime
>>> from statifier.persistence import MemoryAdapter, Storage, prune
>>> asyncio.run(prune(Storage(MemoryAdapter()), datetime(2026, 1, 1, tzinfo=UTC)))
0
"""

from __future__ import annotations

from datetime import datetime

from statifier.persistence.storage import Storage

__all__ = ["prune"]


async def prune(storage: Storage, ended_before: datetime, *, batch_size: int = 500) -> int:
    """Clear the position and the input log of every execution that ended before
    ``ended_before``, ``batch_size`` executions at a time; their rows stay (status,
    outcome, ``ended_at``), so counts and a parent's reading of a child's answer still
    work. The cutoff is the host's policy: nothing here reads a clock. Returns how many
    executions were pruned.

    Raises:
        ValueError: ``ended_before`` is naive or ``batch_size`` is below 1.
    """
    if ended_before.tzinfo is None:
        raise ValueError("ended_before must be timezone-aware")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")
    total = 0
    while True:
        pruned = await storage.prune(ended_before, batch_size)
        total += len(pruned)
        if len(pruned) < batch_size:
            return total
