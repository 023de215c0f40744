"""Dead letters: messages a stream consumer gave up on, kept with the reason.

A message is dead-lettered when it is malformed (no event could be read from it) or,
under :class:`~statifier.fronts.consumer.DeadLetterAfter`, when its routing failed
too often. The consumer hands a :class:`DeadLetterEntry` to a :class:`DeadLetters`
sink and, once the sink returned, counts the message done: it is acknowledged
with the others and never routed again. :class:`TableDeadLetters` keeps them in the
``consumer_dead_letters`` table of the router's database (both PostgreSQL and
SQLite); a sink of another kind (a topic) keeps the same protocol.

>>> import asyncio, tempfile
>>> from datetime import UTC, datetime
>>> from pathlib import Path
>>> from statifier.persistence.sql import SqlAdapter
>>> from statifier.sql import migrations
>>> url = f"sqlite:///{Path(tempfile.mkdtemp()) / 'dead.db'}"
>>> migrations.upgrade(url)
>>> letter = DeadLetterEntry("orders", "0", 7, None, "malformed: not JSON", b"{oops",
...                          datetime(2026, 1, 1, tzinfo=UTC))
>>> async def main():
...     async with SqlAdapter(url) as adapter:
...         table = TableDeadLetters(adapter)
...         await table.put(letter)
...         return await table.entries()
>>> asyncio.run(main()) == [letter]
True
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final, Protocol

from statifier.persistence import PLAIN, BlobCodec, UndecodableBlob
from statifier.persistence.codec import PlainBlobs
from statifier.persistence.sql import SqlAdapter
from statifier.sql.dead_letters import DeadLetterRow, DeadLetterTable

__all__ = ["DeadLetterEntry", "DeadLetters", "TableDeadLetters"]

REASON_LIMIT: Final = 1000
"""The most characters of a reason kept (a routing error's text can be long)."""


@dataclass(frozen=True, slots=True)
class DeadLetterEntry:
    """One message given up on.

    Attributes:
        source: the name of the source it was read from.
        partition, position: where it sat in the source.
        message_id: its message id, ``None`` when none could be read.
        reason: why it was given up on (``malformed: ...``, or the last routing
            error), at most :data:`REASON_LIMIT` characters.
        raw: the bytes as read (empty when the source keeps none).
        at: when it was given up on.
    """

    source: str
    partition: str
    position: int
    message_id: str | None
    reason: str
    raw: bytes
    at: datetime


class DeadLetters(Protocol):
    """Where a consumer puts the messages it gives up on."""

    async def put(self, letter: DeadLetterEntry) -> None:
        """Keep ``letter``; raises when it was not kept (the consumer tries again, and
        does not acknowledge the message meanwhile)."""


def cut(reason: str) -> str:
    """``reason``, cut to :data:`REASON_LIMIT` characters."""
    return reason if len(reason) <= REASON_LIMIT else f"{reason[: REASON_LIMIT - 1]}…"


class TableDeadLetters:
    """Dead letters in the ``consumer_dead_letters`` table of ``adapter``'s database,
    one row per :meth:`put`. With a blob codec (``codec``: the router configuration
    storage's), ``raw`` is stored encoded, and :meth:`entries` decodes it
    (:class:`~statifier.persistence.codec.UndecodableBlob` when it cannot)."""

    def __init__(self, adapter: SqlAdapter, codec: BlobCodec = PLAIN) -> None:
        self.adapter = adapter
        self.codec = codec
        self.table = DeadLetterTable(adapter.tables, adapter.dialect)

    async def put(self, letter: DeadLetterEntry) -> None:
        """Insert ``letter`` as a row of its own."""
        row = DeadLetterRow(
            letter.source,
            letter.partition,
            letter.position,
            letter.message_id,
            cut(letter.reason),
            self.codec.encode(letter.raw),
            letter.at,
        )
        async with self.adapter.transaction() as tx:
            await self.table.insert(tx.driver, row)

    async def entries(self, source: str | None = None) -> list[DeadLetterEntry]:
        """The dead letters kept (of ``source``, or all), oldest first."""
        async with self.adapter.transaction() as tx:
            rows = await self.table.rows(tx.driver, source)
        return [self._entry(row) for row in rows]

    def _entry(self, row: DeadLetterRow) -> DeadLetterEntry:
        raw = row.raw
        if not isinstance(self.codec, PlainBlobs):
            where = f"the dead letter of {row.source} at {row.partition}/{row.position}"
            try:
                raw = self.codec.decode(raw)
            except UndecodableBlob as failure:
                raise UndecodableBlob(f"{where} could not be decoded: {failure}") from None
        return DeadLetterEntry(
            row.source, row.partition, row.position, row.message_id, row.reason, raw, row.dead_at
        )
