"""The inbound-events table: a stream of events a host keeps in the router's database.

A host (or a front of its own: a webhook) enqueues events with :func:`append_events`,
on a transaction of its own or of the caller's, so an event is in the stream exactly
when what enqueued it committed. :class:`TableSource` reads the table as a
:class:`~statifier.fronts.source.Source` for :class:`~statifier.fronts.consumer.StreamConsumer`:

- A row sits at ``(partition, position)``. :func:`append_events` gives each row the
  next position of its partition while holding the partition's lock until its
  transaction ends (PostgreSQL: a transaction-scoped lock; SQLite: the single
  writer), so positions commit in order and a reader never passes a position a
  writer could still fill.
- Consumers of one group share the partitions through
  :class:`~statifier.fronts.leases.PartitionLeases`: each reads only the partitions it
  holds, a fair share among the live members. Several processes share them on
  PostgreSQL (and on one SQLite file).
- :meth:`TableSource.commit` stores the group's position per partition in
  ``consumer_positions``, only while the partition's lease is this member's (a member
  whose lease passed on commits nothing for it: the next holder reads from the last
  committed position and the router finds the repeats ``duplicate``). Positions only
  grow.

Keep one key's events in one partition (:class:`ByKey` chooses it as the consumer
chooses lanes), or two members could route one key's events side by side.

A row's scope, source and message id are the event's, unless the source is given
``normalize``: a function of the row as read (:class:`~statifier.sql.inbound.EventRow`)
and its decoded data answering :class:`~statifier.fronts.normalize.Normalized`, whose
parts take the place of the row's (an envelope a host's own SQL wrote, say).

>>> import asyncio, tempfile
>>> from pathlib import Path
>>> from statifier.persistence.sql import SqlAdapter
>>> from statifier.router import InboundEvent
>>> from statifier.sql import migrations
>>> url = f"sqlite:///{Path(tempfile.mkdtemp()) / 'inbound.db'}"
>>> migrations.upgrade(url)
>>> class Quiet:
...     async def assigned(self, partitions): print("assigned", sorted(partitions))
...     async def revoked(self, partitions): print("revoked", sorted(partitions))
>>> async def main():
...     async with SqlAdapter(url) as adapter:
...         event = InboundEvent(scope="shop", source="orders", message_id="o-1",
...                              data={"order_id": "o-1"})
...         print(await append_events(adapter, [event], partition="a"))
...         source = TableSource(adapter, group="billing", partitions=["a", "b"])
...         await source.start(Quiet())
...         [message] = await source.fetch(10, wait=0.1)
...         print(message.partition, message.position, message.event.message_id)
...         await source.commit({"a": message.position})
...         print(await source.committed())
...         await source.close()
>>> asyncio.run(main())
[('a', 1)]
assigned ['a', 'b']
a 1 o-1
{'a': 1}
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Final

from statifier.callbacks import awaited
from statifier.fronts.lanes import lane_of
from statifier.fronts.leases import Clock, LeaseChange, PartitionLeases
from statifier.fronts.normalize import Normalize, normalized_event
from statifier.fronts.source import Malformed, Message, Rebalance, stored_object
from statifier.persistence import PLAIN, BlobCodec, UndecodableBlob
from statifier.persistence.codec import opened_json, sealed_json
from statifier.persistence.sql import SqlAdapter, SqlTransaction
from statifier.repeats import Repeats
from statifier.router import ConfigError, InboundEvent, Router
from statifier.sql import Tables
from statifier.sql.dialect import Dialect
from statifier.sql.inbound import EventRow, InboundTable, NewEvent
from statifier.telemetry import report

__all__ = ["ByKey", "Partitioner", "TableSource", "append_events"]

_log = logging.getLogger(__name__)
_TROUBLE: Final = "statifier.fronts.trouble"
_IDLE: Final = 0.05
"""Seconds between looks at the table while a fetch waits for a first row."""

Partitioner = Callable[[InboundEvent], "str | Awaitable[str]"]
"""Chooses an event's partition: a plain function or a coroutine function."""


def _wall_clock() -> datetime:
    return datetime.now(UTC)


class ByKey:
    """A :data:`Partitioner`: the partition an event's partition key hashes to, among
    ``partitions`` (as :mod:`statifier.fronts.lanes` chooses lanes), so one key's
    events share a partition.

    Raises:
        ConfigError: no partitions.
    """

    def __init__(self, router: Router, partitions: Sequence[str]) -> None:
        if not partitions:
            raise ConfigError("ByKey needs at least one partition")
        self.router = router
        self.partitions = tuple(partitions)

    async def __call__(self, event: InboundEvent) -> str:
        key = (await self.router.plan(event)).key
        return self.partitions[lane_of(key, len(self.partitions))]


async def append_events(
    adapter: SqlAdapter,
    events: Sequence[InboundEvent],
    *,
    partition: str | Partitioner,
    tx: SqlTransaction | None = None,
    now: datetime | None = None,
    codec: BlobCodec = PLAIN,
) -> list[tuple[str, int]]:
    """Append ``events`` to the inbound-events table, in order: each at the next
    position of its partition (``partition`` itself, or what it returns for the
    event). On ``tx`` (a transaction of ``adapter``'s), the rows commit with it, and
    the partitions stay locked for appends until it ends; otherwise in a transaction
    of their own. With a blob codec (the router configuration storage's; the source
    must read with the same), each event's data is stored in the codec's sealed form.
    Returns each event's ``(partition, position)``.

    Raises:
        ValueError: an event's data is not JSON, a partition is blank, or ``now`` is
            naive.
        Exception: from the database or the partitioner; nothing was appended.
    """
    moment = now or _wall_clock()
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"now must be timezone-aware, not {moment!r}")
    chosen: list[str] = []
    for event in events:
        name = partition if isinstance(partition, str) else await awaited(partition(event))
        if not name:
            raise ValueError(f"a partition is a non-empty string, not {name!r}")
        chosen.append(name)
    try:
        rows = [
            NewEvent(
                name,
                event.scope,
                event.source,
                event.message_id,
                sealed_json(codec, json.dumps(dict(event.data), allow_nan=False)),
            )
            for name, event in zip(chosen, events, strict=True)
        ]
    except (TypeError, ValueError) as error:
        raise ValueError(f"an inbound event's data is not JSON: {error}") from None
    table = _inbound_table(adapter.tables, adapter.dialect)
    if tx is not None:
        return await table.append(tx.driver, rows, moment)
    async with adapter.transaction() as own:
        return await table.append(own.driver, rows, moment)


@functools.lru_cache(maxsize=32)
def _inbound_table(tables: Tables, dialect: Dialect) -> InboundTable:
    """The statements of ``tables`` on ``dialect``, made once for all the appends that
    use them rather than on each (binding the texts for psycopg takes about 0.1 ms)."""
    return InboundTable(tables, dialect)


class TableSource:
    """The inbound-events table as a source, for one member of a consumer group (see
    the module docstring).

    Args:
        adapter: the SQL adapter of the router's database.
        group: the consumer group: its members share the partitions and one committed
            position per partition.
        partitions: every partition of the group (the same in every member).
        owner: this member's name in the group; a fresh one (host, process, random) by
            default. A member started again in the same process should keep its name:
            it then takes its own leases back at once, where a new name would wait
            for them to run out.
        ttl: seconds the member's leases last; they are renewed every ``ttl / 3``.
        clock: the time leases and commits are measured by.
        codec: decodes each event's data (what :func:`append_events` was given); a row
            it cannot decode is a malformed message (dead-lettered by the consumer).
        normalize: a function of the row as read and its decoded data answering
            :class:`~statifier.fronts.normalize.Normalized`: the data, and the scope,
            message id and source in place of the row's (``None`` keeps the row's);
            a row it raises for, or answers data that is not JSON for, is malformed.

    Raises:
        ConfigError: see :class:`~statifier.fronts.leases.PartitionLeases`.
    """

    def __init__(
        self,
        adapter: SqlAdapter,
        *,
        group: str,
        partitions: Sequence[str],
        owner: str | None = None,
        ttl: float = 15.0,
        clock: Clock | None = None,
        codec: BlobCodec = PLAIN,
        normalize: Normalize[EventRow] | None = None,
    ) -> None:
        self.adapter = adapter
        self.codec = codec
        self.normalize = normalize
        self.group = group
        self.owner = owner or f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}"
        self.clock = clock or _wall_clock
        self.leases = PartitionLeases(
            adapter, group=group, partitions=partitions, owner=self.owner, ttl=ttl, clock=clock
        )
        self.renew_every = ttl / 3
        self.table = InboundTable(adapter.tables, adapter.dialect)
        self._rebalance: Rebalance | None = None
        self._cursors: dict[str, int] = {}
        """The partitions being read, each with the last position handed over."""
        self._changes: list[LeaseChange] = []
        self._renewer: asyncio.Task[None] | None = None
        self._turn = 0
        self._waiting: tuple[str, ...] = ()
        """The partitions the last claim found waiting for a reader."""
        self._unrenewed: str | None = None
        """Why the last renewal failed (the error's class), ``None`` once one succeeds."""
        self._repeats = Repeats()

    @property
    def name(self) -> str:
        """``inbound_events/<group>``."""
        return f"inbound_events/{self.group}"

    def trouble(self) -> str | None:
        """Why this member does not read its share now, for readiness; ``None`` when
        it does.

        - ``"leases not renewed: <error class>"``: the last renewal failed (the
          database did not answer); until one succeeds.
        - ``"no partition while N wait"``: the member holds no partition while the last
          claim found partitions waiting for a reader: free, expired, or leased by a
          member that missed a renewal (see :func:`~statifier.fronts.leases.waiting`).
        """
        if self._unrenewed is not None:
            return f"leases not renewed: {self._unrenewed}"
        if not self.leases.held and self._waiting:
            return f"no partition while {len(self._waiting)} wait"
        return None

    async def start(self, rebalance: Rebalance) -> None:
        """Claim this member's share of the partitions, tell ``rebalance`` which, and
        keep the leases renewed from then on (a task of its own, so a consumer that is
        busy routing keeps them)."""
        self._rebalance = rebalance
        change = await self.leases.claim()
        self._waiting = change.waiting
        await self._apply(change)
        self._renewer = asyncio.create_task(self._renew())

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.renew_every)
            try:
                change = await self.leases.claim()
            except Exception as error:  # noqa: BLE001 - the leases run on until they expire
                if self._unrenewed is None:
                    trouble = f"leases not renewed: {type(error).__name__}"
                    report(_TROUBLE, {}, {"source": self.name, "trouble": trouble})
                self._unrenewed = type(error).__name__
                self._repeats.log(
                    _log,
                    logging.WARNING,
                    self._unrenewed,
                    "%s: renewing the leases failed, tried again in %.1f s: %s",
                    self.name,
                    self.renew_every,
                    self._unrenewed,
                    extra={"source": self.name, "error": self._unrenewed},
                )
                continue
            if self._unrenewed is not None:
                held = self._repeats.forget(self._unrenewed)
                _log.warning(
                    "%s: the leases are renewed again (after %d more failures)",
                    self.name,
                    held,
                    extra={"source": self.name, "repeated": held},
                )
                self._unrenewed = None
                report(_TROUBLE, {}, {"source": self.name, "trouble": None})
            self._waiting = change.waiting
            # Applied by the next fetch: a rebalance runs beside the intake only.
            self._changes.append(change)

    async def _apply(self, change: LeaseChange) -> None:
        """Bring the partitions read in line with the leases held: revoke those no
        longer held, revoke and release the surplus, assign the new ones."""
        rebalance = self._rebalance
        assert rebalance is not None
        held = self.leases.held
        surplus = set(change.surplus) & held
        gone = sorted(p for p in self._cursors if p not in held or p in surplus)
        if gone:
            for partition in gone:
                self._cursors.pop(partition)
            await rebalance.revoked(gone)
        if surplus:
            await self.leases.release(surplus)
        fresh = sorted(p for p in self.leases.held if p not in self._cursors)
        if fresh:
            async with self.adapter.transaction() as tx:
                known = await self.table.positions(tx.driver, self.group, fresh)
            for partition in fresh:
                self._cursors[partition] = known.get(partition, 0)
            await rebalance.assigned(fresh)

    async def fetch(self, max_messages: int, wait: float) -> Sequence[Message]:
        """Up to ``max_messages`` rows past each held partition's last handed-over
        position, the partitions taken in turn; looks again every 50 ms for up to
        ``wait`` seconds while there are none. A lease change the renewal found is
        applied first (``revoked``, then ``assigned``)."""
        deadline = time.monotonic() + wait
        while True:
            while self._changes:
                await self._apply(self._changes.pop(0))
            messages = await self._read(max_messages)
            if messages or time.monotonic() >= deadline:
                return messages
            await asyncio.sleep(min(_IDLE, max(deadline - time.monotonic(), 0)))

    async def _read(self, limit: int) -> list[Message]:
        held = sorted(p for p in self._cursors if p in self.leases.held)
        if not held or limit < 1:
            return []
        self._turn = (self._turn + 1) % len(held)
        order = held[self._turn :] + held[: self._turn]
        messages: list[Message] = []
        async with self.adapter.transaction() as tx:
            for partition in order:
                after = self._cursors.get(partition)
                if after is None:
                    continue  # closed meanwhile
                if len(messages) >= limit:
                    break
                rows = await self.table.read(tx.driver, partition, after, limit - len(messages))
                messages.extend(
                    _message(partition, row, self.codec, self.normalize) for row in rows
                )
        for message in messages:
            self._cursors[message.partition] = max(
                self._cursors.get(message.partition, 0), message.position
            )
        return messages

    async def commit(self, positions: Mapping[str, int]) -> None:
        """Store ``positions`` as the group's, in one transaction, for the partitions
        whose lease is this member's (the others are left as they are, and logged). A
        position never moves back.

        Raises:
            Exception: from the database: nothing was stored.
        """
        if not positions:
            return
        async with self.adapter.transaction() as tx:
            stored = await self.table.commit(
                tx.driver, self.group, self.owner, dict(positions), self.clock()
            )
        fenced = sorted(set(positions) - stored)
        if fenced:
            _log.warning("%s: no lease on %s any more: not committed", self.name, fenced)

    async def committed(self) -> dict[str, int]:
        """The group's committed position of every partition that has one."""
        async with self.adapter.transaction() as tx:
            return await self.table.positions(tx.driver, self.group, self.leases.partitions)

    async def close(self) -> None:
        """Stop renewing, release every lease and leave the group (the positions
        committed stay)."""
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
            self._renewer = None
        self._cursors.clear()
        try:
            await self.leases.leave()
        except Exception:  # noqa: BLE001 - the leases expire on their own
            _log.exception("%s: leaving the group failed", self.name)


def _message(
    partition: str, row: EventRow, codec: BlobCodec, normalize: Normalize[EventRow] | None
) -> Message:
    data = row.data
    try:
        loaded = opened_json(codec, data, f"inbound event {partition}/{row.position}")
    except UndecodableBlob as undecodable:
        stored = json.loads(data) if isinstance(data, str | bytes) else data
        raw = json.dumps({"scope": row.scope, "source": row.source, "data": stored}).encode("utf-8")
        return Message(partition, row.position, Malformed(str(undecodable)), raw)
    except (ValueError, RecursionError) as unreadable:  # text written past append_events
        found = stored_object(data, what="data")  # names the rule the text breaks
        if not isinstance(found, Malformed):
            found = Malformed(f"the data is not JSON: {type(unreadable).__name__}")
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else b""
        return Message(partition, row.position, found, raw)
    raw = json.dumps(
        {"scope": row.scope, "source": row.source, "message_id": row.message_id, "data": loaded}
    ).encode("utf-8")
    checked = stored_object(loaded, what="data")  # every front's one JSON rule
    event: InboundEvent | Malformed = (
        checked
        if isinstance(checked, Malformed)
        else normalized_event(
            row,
            checked,
            normalize,
            scope=row.scope,
            source=row.source,
            message_id=row.message_id,
        )
    )
    return Message(partition, row.position, event, raw)
