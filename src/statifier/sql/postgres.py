"""PostgreSQL's dialect (:class:`PostgresDialect`, the constant :data:`POSTGRES`): its
statements run on a psycopg 3 ``AsyncConnection``, with parameters bound by name
(``%(name)s``), times and UUID keys as the driver's own types, JSON documents cast
to ``jsonb`` where they are bound, and a list in one parameter as an array.

Nothing here imports psycopg: the connection is handed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from statifier.sql.dialect import Dialect, Values, named_to_pyformat

__all__ = ["POSTGRES", "PostgresDialect", "lock_timeout"]

_NO_VALUES: Final[Values] = {}
_LOCK_NOT_AVAILABLE: Final = "55P03"  # the SQLSTATE of a wait past lock_timeout


def lock_timeout(wait: float) -> str:
    """PostgreSQL's ``lock_timeout`` for a wait in seconds (at least 1 ms: 0 means no
    bound there)."""
    return f"{max(1, round(wait * 1000))}ms"


class PostgresDialect(Dialect):
    """PostgreSQL through psycopg 3 (see :class:`~statifier.sql.dialect.Dialect`)."""

    name = "postgresql"
    row_locks = True
    server_clock = "clock_timestamp()"
    writes_in_with = True

    def statement(self, text: str) -> str:
        return named_to_pyformat(text)

    def json(self, parameter: str) -> str:
        return f":{parameter}::jsonb"

    def among(self, parameter: str) -> str:
        return f"= ANY(:{parameter})"

    def listed(self, values: Iterable[Any]) -> Any:
        return list(values)  # an array

    def lock_not_granted(self, error: BaseException) -> bool:
        # psycopg's errors carry the server's SQLSTATE; nothing here imports psycopg.
        return getattr(error, "sqlstate", None) == _LOCK_NOT_AVAILABLE

    async def execute(self, driver: Any, sql: str, values: Values | None = None) -> int:
        # Always a mapping: psycopg reads a text bound without one as it is, and the
        # statement's "%%" would reach the server.
        cursor = await driver.execute(sql, _NO_VALUES if values is None else values)
        return int(cursor.rowcount)

    async def execute_many(self, driver: Any, sql: str, values: Sequence[Values]) -> None:
        async with driver.cursor() as cursor:
            await cursor.executemany(sql, values)

    async def rows(
        self, driver: Any, sql: str, values: Values | None = None
    ) -> list[tuple[Any, ...]]:
        cursor = await driver.execute(sql, _NO_VALUES if values is None else values)
        return await cursor.fetchall()  # type: ignore[no-any-return]

    async def row(
        self, driver: Any, sql: str, values: Values | None = None
    ) -> tuple[Any, ...] | None:
        cursor = await driver.execute(sql, _NO_VALUES if values is None else values)
        return await cursor.fetchone()  # type: ignore[no-any-return]


POSTGRES: Final = PostgresDialect()
