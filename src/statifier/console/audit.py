"""The console's audit trail: one row per operator action, who and when.

Every action the console takes (cancel an execution, retry or discard a dead letter,
rotate a BasicHTTP location) is written here with the operator who confirmed it, what
it was done to, and how it ended; the table is ``console_audit`` of
:mod:`statifier.sql.tables`, built by the migration ``statifier_0006``. Rows are only
ever added.

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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from datetime import UTC, datetime
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from statifier.console.queries import DEFAULT_PAGE, Page
from statifier.sql.tables import Tables

__all__ = ["ACTIONS", "OUTCOMES", "Audit", "AuditEntry", "AuditRow"]

ACTIONS: Final = frozenset(
    {"cancel", "retry_outbox", "discard_outbox", "retry_consumer", "discard_consumer", "rotate"}
)
"""The actions the console records."""

OUTCOMES: Final = frozenset({"done", "refused", "failed"})
"""How an action ended: done, refused (nothing to do: already ended, gone...), failed
(an error; ``detail`` says which)."""

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

    async def record(self, entry: AuditEntry) -> AuditRow:
        """Write ``entry`` in a transaction of its own and answer the row written."""
        raise NotImplementedError

    async def entries(
        self, *, target: str | None = None, cursor: str | None = None, size: int = DEFAULT_PAGE
    ) -> Page[AuditRow]:
        """Recorded actions, newest first (of ``target`` only, if given).

        Raises:
            statifier.console.queries.BadCursor: a cursor this list did not make.
            ValueError: ``size`` outside ``1..MAX_PAGE``.
        """
        raise NotImplementedError
