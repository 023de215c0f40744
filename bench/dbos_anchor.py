"""DBOS Transact as the anchor of the durable benchmarks: its idiom for "an execution
per key receiving its events" is a workflow per key (the key is its workflow id)
looping on ``DBOS.recv_async`` and counting, started by the key's first event
(``DBOS.start_workflow_async``), every event sent with ``DBOS.send_async``.

:func:`run` launches DBOS on a system database of its own for one measurement and
destroys it afterwards: on PostgreSQL the database ``dbos_bench`` on the same server
(DBOS creates it if missing), in a fresh schema dropped at the end; on SQLite a file in
the directory given. It answers the event rate (from the first send to the last event
received) and every event's latency from its send to its ``recv`` returning.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DATABASE", "Measured", "available", "run"]

DATABASE = "dbos_bench"


@dataclass
class Measured:
    """One DBOS measurement: events per second and each event's latency (seconds)."""

    rate: float
    latencies: list[float] = field(default_factory=list)
    sends_s: float = 0.0


@dataclass
class _Received:
    latencies: list[float]
    last: float = 0.0


_RECEIVED = _Received([])
_WORKFLOW: list[Any] = []


def available() -> bool:
    """Whether the ``dbos`` package (the ``bench`` extra) is installed."""
    try:
        import dbos  # noqa: F401
    except ImportError:
        return False
    return True


def _workflow() -> Any:
    """The counting workflow, registered with DBOS once per process."""
    if _WORKFLOW:
        return _WORKFLOW[0]
    from dbos import DBOS

    @DBOS.workflow(name="statifier_bench_counter")
    async def counter(expected: int, wait_s: float) -> int:
        count = 0
        while count < expected:
            sent = await DBOS.recv_async("tick", timeout_seconds=wait_s)
            if sent is None:
                break
            count += 1
            received = time.perf_counter()
            _RECEIVED.latencies.append(received - sent)
            _RECEIVED.last = received
        return count

    _WORKFLOW.append(counter)
    return counter


async def _workload(keys: int, events: int, senders: int, wait_s: float) -> Measured:
    from dbos import DBOS, SetWorkflowID

    counter = _workflow()
    run_id = uuid.uuid4().hex[:8]
    ids = [f"bench-{run_id}-k{index}" for index in range(keys)]
    handles: list[Any] = []
    _RECEIVED.latencies.clear()
    _RECEIVED.last = 0.0

    async def sender(share: list[str]) -> None:
        for turn in range(events):
            for workflow_id in share:
                if turn == 0:
                    with SetWorkflowID(workflow_id):
                        handles.append(await DBOS.start_workflow_async(counter, events, wait_s))
                await DBOS.send_async(workflow_id, time.perf_counter(), "tick")

    started = time.perf_counter()
    await asyncio.gather(*(sender(ids[index::senders]) for index in range(senders)))
    sent = time.perf_counter()
    counts = await asyncio.wait_for(
        asyncio.gather(*(handle.get_result() for handle in handles)), wait_s
    )
    if any(count != events for count in counts) or len(_RECEIVED.latencies) != keys * events:
        missing = keys * events - len(_RECEIVED.latencies)
        raise RuntimeError(f"DBOS: {missing} of {keys * events} events not received in time")
    elapsed = _RECEIVED.last - started
    return Measured(keys * events / elapsed, list(_RECEIVED.latencies), sent - started)


def _postgres_database_url(url: str, database: str) -> str:
    import sqlalchemy as sa

    return (
        sa.make_url(url)
        .set(drivername="postgresql", database=database)
        .render_as_string(hide_password=False)
    )


def run(
    database: str,
    postgres_url: str,
    directory: str,
    *,
    keys: int,
    events: int,
    senders: int,
    wait_s: float,
) -> Measured:
    """Measure DBOS on ``database`` (``"sqlite"`` or ``"postgresql"``): ``keys``
    workflows, ``events`` events each, sent by ``senders`` concurrent tasks; wait at
    most ``wait_s`` for the last event.

    Raises:
        RuntimeError: an event did not arrive within ``wait_s``.
    """
    import sqlalchemy as sa
    from dbos import DBOS, DBOSConfig

    schema = f"dbos_bench_{uuid.uuid4().hex[:8]}"
    if database == "sqlite":
        url = f"sqlite:///{os.path.join(directory, 'dbos.sqlite')}"
    else:
        url = _postgres_database_url(postgres_url, DATABASE)
    config: DBOSConfig = {
        "name": "statifier_bench",
        "system_database_url": url,
        "log_level": "WARNING",
        "dbos_system_schema": schema,
    }
    _workflow()
    DBOS(config=config)
    try:
        DBOS.launch()
        return asyncio.run(_workload(keys, events, senders, wait_s))
    finally:
        DBOS.destroy(destroy_registry=False)
        if database == "postgresql":
            engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
            with engine.begin() as connection:
                connection.execute(sa.schema.DropSchema(schema, cascade=True, if_exists=True))
            engine.dispose()
