"""The console's audit trail: one row per operator action, who and when.

Every action the console takes (cancel an execution, retry or discard a dead letter,
rotate a BasicHTTP location, pause or resume a schedule) is written here with the
operator who confirmed it, what it was done to, and how it ended; the table is
``console_audit`` of :mod:`statifier.sql.tables`, built by the migration
``statifier_0006``. Rows are only ever added. :meth:`Audit.record` writes a row in a
transaction of its own (an action refused or failed: nothing happened to be joined);
:meth:`Audit.record_in` writes it inside the action's own transaction, so a done action
and its row commit together.

>>> import asyncio, os, tempfile
>>> from statifier.sql import migrations
>>> from statifier.sql.engines import sqlite_engine
>>> from statifier.sql.tables import Tables
>>> url = f"sqlite:///{os.path.join(tempfile.mkdtemp(), 'doc.db')}"
>>> migrations.upgrade(url)
>>> async def main() -> list[str]:
...     audit = Audit(sqlite_engine(url), Tables.define())
...     await audit.record(AuditEntry("ops-1", action="cancel", target="order-7"))
...     page = await audit.entries()
...     return [f"{e.actor} {e.action} {e.target} {e.outcome}" for e in page.rows]
>>> asyncio.run(main())
['ops-1 cancel order-7 done']

Inside a transaction of the adapter, the row goes the way the transaction goes:

>>> from statifier.persistence.sql import SqlAdapter
>>> async def joined() -> list[str]:
...     engine = sqlite_engine(url)
...     audit = Audit(engine, Tables.define())
...     async with SqlAdapter(engine) as adapter:
...         try:
...             async with adapter.transaction() as tx:
...                 entry = AuditEntry("ops-1", action="rotate", target="order-8")
...                 await audit.record_in(tx, entry)
...                 raise RuntimeError("the action failed after its row was written")
...         except RuntimeError:
...             pass
...         async with adapter.transaction() as tx:
...             await audit.record_in(tx, AuditEntry("ops-1", action="cancel", target="order-9"))
...     return [e.target for e in (await audit.entries()).rows]
>>> asyncio.run(joined())
['order-9', 'order-7']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from datetime import UTC, datetime
from typing import Any, Final

from statifier.console.queries import (
    DEFAULT_PAGE,
    MAX_PAGE,
    BadCursor,
    Page,
    decode_cursor,
    encode_cursor,
)
from statifier.extras import MissingExtra
from statifier.persistence.sql import SqlTransaction
from statifier.sql.audit import AUDIT_COLUMNS, AuditTable
from statifier.sql.engines import dialect_of, run_on
from statifier.sql.tables import Tables, UtcDateTime

try:
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import AsyncEngine
except ModuleNotFoundError as missing:  # SQLAlchemy: the sqlite extra
    raise MissingExtra.of(missing) from missing

__all__ = ["ACTIONS", "OUTCOMES", "Audit", "AuditEntry", "AuditRow"]

ACTIONS: Final = frozenset(
    {
        "bulk",
        "cancel",
        "pause",
        "resume",
        "migrate",
        "retry",
        "retry_outbox",
        "discard_outbox",
        "retry_consumer",
        "discard_consumer",
        "rotate",
        "schedule.pause",
        "schedule.resume",
    }
)
"""The actions the console records."""

OUTCOMES: Final = frozenset({"done", "parked", "refused", "failed", "stopped"})
"""How an action ended: done, parked (a migration that could not carry the execution
and parked it instead), refused (nothing to do: already ended, gone...), failed (an
error; ``detail`` says which), stopped (a bulk run that ended early: cancelled, or an
error such as its database going down; ``detail`` says which and what it had done)."""

MAX_TEXT: Final = 1000
"""The most characters kept of ``actor``, ``target`` and ``detail``."""


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """An action to record.

    Attributes:
        actor: who confirmed it (the operator's name from the login token).
        action: one of :data:`ACTIONS`.
        target: what it was done to (an execution id, a dead letter's id, ...).
        outcome: one of :data:`OUTCOMES`.
        detail: a free text (an error's message, a reason), never a secret.

    Raises:
        ValueError: an unknown action or outcome, or an empty actor or target.
    """

    actor: str
    _: KW_ONLY
    action: str
    target: str
    outcome: str = "done"
    detail: str | None = None

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown action {self.action!r}; one of {sorted(ACTIONS)}")
        if self.outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {self.outcome!r}; one of {sorted(OUTCOMES)}")
        if not self.actor or not self.target:
            raise ValueError("an audit entry names its actor and its target")


@dataclass(frozen=True, slots=True)
class AuditRow:
    """A recorded action: the entry, its key and when it was written."""

    id: Any
    _: KW_ONLY
    at: datetime
    actor: str
    action: str
    target: str
    outcome: str
    detail: str | None


class Audit:
    """Writes and reads the audit table.

    Args:
        engine: an :class:`~sqlalchemy.ext.asyncio.AsyncEngine` (PostgreSQL) or a
            synchronous :class:`~sqlalchemy.Engine` (SQLite).
        tables: the tables the migrations built.
        clock: the time written with each row (aware).
    """

    def __init__(
        self,
        engine: sa.Engine | AsyncEngine,
        tables: Tables,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.engine = engine
        self.tables = tables
        self._clock = clock
        self._table = AuditTable(tables, dialect_of(engine))

    async def record(self, entry: AuditEntry) -> AuditRow:
        """Write ``entry`` in a transaction of its own (texts cut to
        :data:`MAX_TEXT` characters) and answer the row written."""
        table = self.tables.console_audit
        values = self._values(entry)
        statement = table.insert().values(values).returning(table.c.id)

        def write(connection: sa.Connection) -> Any:
            return connection.execute(statement).scalar_one()

        key = await run_on(self.engine, write, write=True)
        return AuditRow(key, **{name: values[name] for name in _FIELDS})

    async def record_in(self, tx: SqlTransaction, entry: AuditEntry) -> AuditRow:
        """Write ``entry`` inside ``tx``, a transaction the caller opened on an adapter
        over this audit's database and tables (``adapter.transaction()``, or a router
        unit's ``tx``), and answer the row it will hold: the row commits with ``tx``
        and vanishes if ``tx`` rolls back, so an action written in ``tx`` and its row
        are never one without the other.

        The statement runs on ``tx.driver`` (psycopg on PostgreSQL; on SQLite the
        ``sqlite3`` connection that holds the adapter's single writer), as the
        router's own statements do; texts are cut as :meth:`record` cuts them.

        Raises:
            Exception: the driver's error; ``tx`` should then be rolled back, which
                its block does when the error leaves it.
        """
        values = self._values(entry)
        key = await self._table.insert(tx.driver, values)
        return AuditRow(key, **{name: values[name] for name in _FIELDS})

    def _values(self, entry: AuditEntry) -> dict[str, Any]:
        values: dict[str, Any] = {
            "at": self._clock(),
            "actor": _cut(entry.actor),
            "action": entry.action,
            "target": _cut(entry.target),
            "outcome": entry.outcome,
            "detail": None if entry.detail is None else _cut(entry.detail),
        }
        new_key = self.tables.options.new_key
        if new_key is not None:
            values["id"] = new_key()
        return values

    async def entries(
        self, *, target: str | None = None, cursor: str | None = None, size: int = DEFAULT_PAGE
    ) -> Page[AuditRow]:
        """Recorded actions, newest first (of ``target`` only, if given).

        Raises:
            statifier.console.queries.BadCursor: a cursor this list did not make.
            ValueError: ``size`` outside ``1..MAX_PAGE``.
        """
        given: object = size
        if isinstance(given, bool) or not isinstance(given, int) or not 1 <= given <= MAX_PAGE:
            raise ValueError(f"a page holds 1 to {MAX_PAGE} rows, not {size!r}")
        table = self.tables.console_audit
        statement = sa.select(table).order_by(table.c.at.desc(), table.c.id.desc()).limit(size + 1)
        if target is not None:
            statement = statement.where(table.c.target == target)
        if cursor is not None:
            at, key = decode_cursor(cursor, "audit")
            statement = statement.where(
                sa.tuple_(table.c.at, table.c.id)
                < sa.tuple_(
                    sa.literal(at, UtcDateTime()), sa.literal(self._key(key), table.c.id.type)
                )
            )

        def read(connection: sa.Connection) -> list[sa.Row[Any]]:
            return list(connection.execute(statement))

        rows = await run_on(self.engine, read)
        chosen = [_row(row) for row in rows[:size]]
        next_cursor = None
        if len(rows) > size:
            next_cursor = encode_cursor("audit", chosen[-1].at, chosen[-1].id)
        return Page(tuple(chosen), next_cursor)

    def _key(self, text: str) -> Any:
        try:
            return self.tables.options.key_from_text(text)
        except ValueError:
            raise BadCursor(f"not a cursor of this list: a bad key {text!r}") from None


_FIELDS: Final = AUDIT_COLUMNS


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "\u2026"


def _row(row: sa.Row[Any]) -> AuditRow:
    return AuditRow(
        row.id,
        at=row.at,
        actor=row.actor,
        action=row.action,
        target=row.target,
        outcome=row.outcome,
        detail=row.detail,
    )
