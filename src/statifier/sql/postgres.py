"""PostgreSQL's dialect (:class:`PostgresDialect`, the constant :data:`POSTGRES`): its
statements run on a psycopg 3 ``AsyncConnection``, with parameters bound by name
(``%(name)s``), times and UUID keys as the driver's own types, JSON documents cast
to ``jsonb`` where they are bound, a list of values as an array, and advisory
locks held until the transaction ends.

Nothing here imports psycopg: the connection is handed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from statifier.sql.dialect import Dialect, Values, named_to_pyformat

__all__ = ["POSTGRES", "PostgresDialect"]

_NO_VALUES: Final[Values] = {}


class PostgresDialect(Dialect):
    """PostgreSQL through psycopg 3 (see :class:`~statifier.sql.dialect.Dialect`)."""

    name = "postgresql"
    row_locks = True
    server_clock = "clock_timestamp()"
    writes_in_with = True
    json_contains = True

    def statement(self, text: str) -> str:
        return named_to_pyformat(text)

    def json(self, parameter: str) -> str:
        return f":{parameter}::jsonb"

    def among(self, parameter: str) -> str:
        return f"= ANY(:{parameter})"

    def listed(self, values: Iterable[Any]) -> Any:
        # psycopg binds a list as an array.
        return list(values)

    def advisory_lock(self, parameter: str, *, shared: bool = False) -> str | None:
        function = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
        return f"SELECT {function}(:{parameter})"

    async def execute(self, driver: Any, sql: str, values: Values | None = None) -> int:
        # Always a mapping: psycopg reads a text bound without one as it is, and the
        # statement's "%%" would reach the server.
        cursor = await driver.execute(sql, _NO_VALUES if values is None else values)
        return int(cursor.rowcount)

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
