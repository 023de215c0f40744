"""The card payment's inputs, projected into a read model by scriba.

The durable execution keeps its input log; a projection turns that log into a
``payment_history`` table an application can query, one row per input, exactly once:
the rows, the stream's cursor and the watermark commit together, and a second run that
is handed the whole log again adds nothing.

>>> import asyncio, io, os, tempfile
>>> from pathlib import Path
>>> from statifier.examples.card_payment import run_on_sqlite
>>> path = Path(tempfile.mkdtemp()) / "payments.db"
>>> _ = asyncio.run(run_on_sqlite(path, io.StringIO()))
>>> out = io.StringIO()
>>> asyncio.run(project(path, out))
4
>>> "second run over the whole log again: 4 rows" in out.getvalue()
True
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, TextIO

from scriba import Event, Insert, MemorySource, Meta, Projection, Result, Scriba
from scriba.sql import SqlTarget, upgrade
from statifier.examples.card_payment import TRANSACTION
from statifier.expr import tagged
from statifier.extras import MissingExtra
from statifier.persistence import Executions, Storage
from statifier.persistence.sql import SqlAdapter

try:
    import sqlalchemy as sa
except ModuleNotFoundError as missing:  # SQLAlchemy: the sqlite extra
    raise MissingExtra.of(missing) from missing

__all__ = ["HISTORY", "PaymentHistory", "project"]

_METADATA: Final = sa.MetaData()
HISTORY: Final = sa.Table(
    "payment_history",
    _METADATA,
    sa.Column("execution_id", sa.Text, primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("via", sa.Text, nullable=False),
    sa.Column("event", sa.Text, nullable=False),
    sa.Column("data", sa.JSON),
)
"""The read model: one row per input an execution saw."""


class PaymentHistory(Projection):
    """One history row per logged input."""

    name = "payment_history"
    batch_timeout = 0.01

    def handle(self, event: Event, meta: Meta) -> Result:
        seq, via, data = event.data
        return Insert(
            HISTORY,
            {
                "execution_id": event.stream_id,
                "seq": seq,
                "via": via,
                "event": event.type,
                "data": data,
            },
        )


async def project(path: Path, out: TextIO) -> int:
    """Project the input log of the card payment stored in the SQLite database at
    ``path`` into ``payment_history`` beside it, twice; returns the rows there."""
    url = f"sqlite:///{path}"
    async with SqlAdapter(url) as adapter:
        inputs = await Executions(Storage(adapter)).inputs(TRANSACTION)
    events = [
        Event(
            id=f"{TRANSACTION}/{entry.seq}",
            stream_id=TRANSACTION,
            type=entry.event.name,
            data=(entry.seq, entry.via, tagged.encode(entry.event.data)),
            position=entry.seq + 1,
            occurred_at=entry.recorded_at,
        )
        for entry in inputs
        if entry.event is not None
    ]
    engine = sa.create_engine(url)
    try:
        _METADATA.create_all(engine)
        upgrade(engine)
        rows: Sequence[Any] = ()
        for attempt in ("first run", "second run over the whole log again"):
            # The second source hands over every event again, as a source that lost
            # its place would; the stored cursor makes the projection skip them.
            source = MemorySource(events, replay_from_zero=True)
            async with Scriba() as runtime:
                await runtime.start(PaymentHistory, source=source, target=SqlTarget(engine))
                await runtime.wait_until_caught_up(PaymentHistory)
                info = await runtime.info(PaymentHistory)
            with engine.connect() as connection:
                rows = connection.execute(
                    sa.select(HISTORY.c.seq, HISTORY.c.via, HISTORY.c.event).order_by(HISTORY.c.seq)
                ).all()
            out.write(
                f"  {attempt}: {len(rows)} rows, cursors {info.stream_positions}, "
                f"watermark {info.watermark}\n"
            )
        for seq, via, name in rows:
            out.write(f"    {seq} {via:<6} {name}\n")
        return len(rows)
    finally:
        engine.dispose()
