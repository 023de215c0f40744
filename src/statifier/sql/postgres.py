"""PostgreSQL's dialect (:class:`PostgresDialect`, the constant :data:`POSTGRES`): its
statements run on a psycopg 3 ``AsyncConnection``, with parameters bound by name
(``%(name)s``), times and UUID keys as the driver's own types, JSON documents cast
to ``jsonb`` where they are bound, and a list of values as an array. How a
transaction holds a lock is :mod:`statifier.sql.locks`'s.

Nothing here imports psycopg: the connection is handed in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from statifier.sql.dialect import Dialect, Values, named_to_pyformat, spliced_key

__all__ = [
    "POSTGRES",
    "RESTORE_LOCK_TIMEOUT",
    "SET_LOCK_TIMEOUT",
    "PostgresDialect",
    "lock_timeout",
]

_NO_VALUES: Final[Values] = {}
_LOCK_NOT_AVAILABLE: Final = "55P03"  # the SQLSTATE of a wait past lock_timeout


def lock_timeout(wait: float) -> str:
    """PostgreSQL's ``lock_timeout`` for a wait in seconds (at least 1 ms: 0 means no
    bound there)."""
    return f"{max(1, round(wait * 1000))}ms"


# A bounded wait for a lock: SET_LOCK_TIMEOUT binds ``t`` (a lock_timeout()) for the
# rest of the transaction and returns the setting it replaced, which RESTORE_LOCK_TIMEOUT
# binds as ``t`` once the lock is held, so that later statements wait as before.
SET_LOCK_TIMEOUT: Final = named_to_pyformat(
    "SELECT current_setting('lock_timeout'), set_config('lock_timeout', :t, true)"
)
RESTORE_LOCK_TIMEOUT: Final = named_to_pyformat("SELECT set_config('lock_timeout', :t, true)")


_ARRAY_CAST: Final = re.compile(r"CAST\(%\((\w+)\)s AS ([a-z ]+)\[\]\)")
"""A parameter cast to an array type, as :func:`named_to_pyformat` writes it."""


class PostgresDialect(Dialect):
    """PostgreSQL through psycopg 3 (see :class:`~statifier.sql.dialect.Dialect`)."""

    name = "postgresql"
    row_locks = True
    server_clock = "clock_timestamp()"
    schemas = True
    writes_in_with = True

    def statement(self, text: str) -> str:
        """``text`` as psycopg binds it (:func:`named_to_pyformat`), a parameter cast to
        an array type (``CAST(:name AS type[])``) bound in binary: psycopg writes a
        list in text one element at a time in Python (about 9 us an element for
        ``bytea``, 3 for ``timestamptz``), in binary at a fraction of that, and the
        cast fixes the type either way."""
        return _ARRAY_CAST.sub(r"CAST(%(\1)b AS \2[])", named_to_pyformat(text))

    def json(self, parameter: str) -> str:
        return f":{parameter}::jsonb"

    def among(self, parameter: str) -> str:
        return f"= ANY(:{parameter})"

    def listed(self, values: Iterable[Any]) -> Any:
        # psycopg binds a list as an array.
        return list(values)

    def table_of(self, parameter: str, columns: Mapping[str, str]) -> str:
        typed = ", ".join(f"{name} {kind}" for name, kind in columns.items())
        return f"jsonb_to_recordset(:{parameter}::jsonb) AS r({typed})"

    def json_has(self, column: Any, pairs: Mapping[str, str]) -> list[Any]:
        # jsonb containment, which a GIN index on the column serves.
        return [sa.type_coerce(column, postgresql.JSONB()).contains(dict(pairs))]

    def json_has_sql(self, column: str, parameter: str) -> str:
        # jsonb containment, which a GIN index on the column serves.
        return f"{column} @> {self.json(parameter)}"

    def json_text_sql(self, column: str, key: str) -> str:
        return f"({column} ->> '{spliced_key(key)}')"

    def bucket(self, column: Any, start: int, width: int) -> Any:
        # date_part returns a double, several times cheaper per row than the numeric
        # that extract() returns.
        epoch = sa.func.floor(sa.func.date_part("epoch", column))
        return sa.cast(sa.func.floor((epoch - start) / width), sa.BigInteger)

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
