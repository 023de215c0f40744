"""What PostgreSQL and SQLite do differently under statifier's SQL, said once.

A statement is written once, as SQL text with named parameters in SQLite's style
(``:name``), against the table names of :mod:`statifier.sql.tables`. A
:class:`Dialect` turns that text into what its driver binds (:meth:`Dialect.statement`),
converts the values that its driver stores differently (times, keys, JSON documents,
lists), hashes lock keys (:func:`lock_key`, which :mod:`statifier.sql.locks` takes),
and runs the statement on the driver's connection of a
transaction (:meth:`Dialect.execute`, :meth:`Dialect.rows`, :meth:`Dialect.row`), so
that a module of statements reads the same for both databases. A savepoint's
statements, the same on both, are here as well (:func:`savepoint_statements`). The
two dialects are
:data:`statifier.sql.postgres.POSTGRES` (psycopg 3's ``AsyncConnection``) and
:data:`statifier.sql.sqlite.SQLITE` (``sqlite3.Connection``). A statement that truly
reads differently on the two is chosen in its table family's module by what the
database can do (the attributes below), never by its name.

Times are stored as aware UTC datetimes on PostgreSQL and as UTC wall-time text with
microseconds on SQLite (the text SQLAlchemy's ``DATETIME`` writes, which sorts as the
times do); :func:`utc_text` and :func:`utc_time` convert.

>>> from statifier.sql.sqlite import SQLITE
>>> from statifier.sql.postgres import POSTGRES
>>> text = "SELECT id FROM t WHERE due_at <= :now AND kind = 'a:b' LIMIT :limit"
>>> POSTGRES.statement(text)
"SELECT id FROM t WHERE due_at <= %(now)s AND kind = 'a:b' LIMIT %(limit)s"
>>> SQLITE.statement(text) == text
True
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

__all__ = [
    "Dialect",
    "Savepoint",
    "Values",
    "execution_lock_key",
    "lock_key",
    "named_to_pyformat",
    "ping",
    "savepoint_statements",
    "spliced_key",
    "utc_text",
    "utc_time",
]

Values = Mapping[str, Any]
"""A statement's parameters, by name."""

# A parameter is a colon and a name, not preceded by a colon (PostgreSQL's ``::type``
# cast) nor by a name's character (a time such as '10:30' in a literal).
_PARAMETER: Final = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


def utc_text(value: datetime | None) -> str | None:
    """A time as SQLite stores it: the UTC wall time, microseconds always written.

    Raises:
        ValueError: a naive time (stored times are aware).
    """
    if value is None:
        return None
    if value.tzinfo is not UTC:
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"stored times must be timezone-aware, not {value!r}")
        value = value.astimezone(UTC)
    # In UTC the text ends in "+00:00"; cutting it is cheaper than replace(tzinfo=None).
    return value.isoformat(" ", "microseconds")[:-6]


def utc_time(text: str | None) -> datetime | None:
    """A time SQLite stored (:func:`utc_text`) read back as an aware UTC datetime."""
    if text is None:
        return None
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def lock_key(*parts: str) -> int:
    """A signed 64-bit lock key (taken by :mod:`statifier.sql.locks`) for what
    ``parts`` name: a kind of thing, then what identifies it. The same parts give the
    same key in every process and every version."""
    # The leading name is part of every key ever taken: changing it would let a process
    # of an older version and one of this version hold the same thing at once.
    digest = hashlib.blake2b("\x00".join(("statifier.router", *parts)).encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big", signed=True)


def execution_lock_key(execution_id: str) -> int:
    """The lock key of an execution: the one key every statement that holds an
    execution's lock takes (an ``exclusive`` block of the SQL adapter, a delivery
    batch's locks, the timer claim, which reads it from the timer's row).

    Computed here rather than by the database, so that a database without
    PostgreSQL's own hash functions takes the same key.

    >>> execution_lock_key("order-1") == lock_key("execution", "order-1")
    True
    """
    return lock_key("execution", execution_id)


@dataclass(frozen=True, slots=True)
class Savepoint:
    """The statements of one savepoint, the same on both databases: run ``begin`` where
    it starts; where it ends, ``undo`` (only if what followed must be undone), then
    ``release``.

    Attributes:
        begin: opens it.
        undo: rolls the transaction back to it, which stays open (and usable again
            after an error).
        release: forgets it, keeping what was written since.
    """

    begin: str
    undo: str
    release: str


@functools.lru_cache(maxsize=64)
def savepoint_statements(number: int) -> Savepoint:
    """The savepoint ``number`` of a transaction (numbered from 1 as they are opened,
    so that nested ones have names of their own)."""
    name = f"statifier_{number}"
    return Savepoint(
        begin=f"SAVEPOINT {name}",
        undo=f"ROLLBACK TO SAVEPOINT {name}",
        release=f"RELEASE SAVEPOINT {name}",
    )


class Dialect:
    """One database's way of binding, converting and running statifier's statements.

    Subclassed once per database; the instances are constants. Every method is safe to
    call from any task: a dialect holds no state.

    Attributes:
        name: ``"postgresql"`` or ``"sqlite"``, as SQLAlchemy names the database.
        row_locks: whether a statement can lock the rows it reads and skip those
            another transaction holds (``FOR UPDATE SKIP LOCKED``), and take locks
            (:mod:`statifier.sql.locks`); SQLite's writers are serialized instead.
        server_clock: the SQL that reads the database's own clock in a statement, or
            ``None`` where the process's clock is bound instead (SQLite, whose writers
            are serialized, so that one process's clock orders them).
        single_writer: whether a transaction holds the database's one writer from its
            start to its end (SQLite), so that it already excludes every other writer
            and needs no lock of an execution's own to read what that execution's
            steps write; where false (PostgreSQL), such a read takes the execution's
            lock.
        schemas: whether tables may live in a schema of their own (PostgreSQL's
            ``schema.table``); SQLite has one namespace per file.
        writes_in_with: whether a statement's ``WITH`` clause can hold an ``INSERT``,
            ``UPDATE`` or ``DELETE`` whose ``RETURNING`` rows the rest of the statement
            reads, so that a write and a read (or two writes, the second depending on
            the first) take one round trip; where it cannot (SQLite), they are separate
            statements, run in process.
    """

    name: str = ""
    row_locks: bool = False
    server_clock: str | None = None
    single_writer: bool = False
    schemas: bool = False
    writes_in_with: bool = False

    def statement(self, text: str) -> str:
        """``text`` (parameters as ``:name``) as this dialect's driver binds it."""
        return text

    def json(self, parameter: str) -> str:
        """The SQL (parameters as ``:name``, like the statement it goes in) for a bound
        JSON document ``:parameter`` stored in a JSON column."""
        return f":{parameter}"

    def among(self, parameter: str) -> str:
        """The SQL (parameters as ``:name``) that follows a value to test whether it is
        one of the list bound as ``:parameter`` (made by :meth:`listed`), so that a list
        of any length is one parameter: ``f"WHERE id {dialect.among('ids')}"``."""
        raise NotImplementedError

    def listed(self, values: Iterable[Any]) -> Any:
        """``values`` as this driver binds the list that :meth:`among` reads."""
        raise NotImplementedError

    def table_of(self, parameter: str, columns: Mapping[str, str]) -> str:
        """The SQL (parameters as ``:name``) of a table, aliased ``r``, whose rows are
        the objects of the JSON array bound as ``:parameter`` (made by
        :meth:`tabled`): ``columns`` maps each column to its SQL type (``text``,
        ``timestamptz``), so that a statement reads any number of rows from one
        parameter: ``f"INSERT INTO t (a) SELECT a FROM {dialect.table_of('rows',
        {'a': 'text'})}"``."""
        raise NotImplementedError

    def tabled(self, rows: Iterable[Mapping[str, Any]]) -> str:
        """``rows`` (each a mapping of :meth:`table_of`'s columns) as the JSON array
        :meth:`table_of` reads; a time is written as :meth:`time` would bind it into a
        time column."""
        return json.dumps(list(rows), separators=(",", ":"), default=self._json_time)

    def _json_time(self, value: object) -> object:
        if isinstance(value, datetime):
            return value.isoformat()
        raise TypeError(f"{type(value).__name__} is not a table's value")

    def json_has(self, column: Any, pairs: Mapping[str, str]) -> list[Any]:
        """SQLAlchemy conditions that the JSON object in ``column`` holds every
        ``key: value`` of ``pairs`` (text values), for a Core statement: what
        :meth:`json_has_sql` asks in a statement of text."""
        raise NotImplementedError

    def json_has_sql(self, column: str, parameter: str) -> str:
        """The SQL condition (parameters as ``:name``) that the JSON object in
        ``column`` (SQL naming a column) holds every ``key: value`` of the JSON object
        bound as ``:parameter`` (a document, bound as :meth:`json` takes it): one
        statement, and one parameter, for any number of pairs."""
        raise NotImplementedError

    def json_text_sql(self, column: str, key: str) -> str:
        """The SQL of the text the JSON object in ``column`` (SQL naming a column) holds
        under ``key``, ``NULL`` when it holds none. ``key`` is spliced into the SQL: a
        name the package chooses (letters, digits, dots, underscores), never a caller's.

        Raises:
            ValueError: ``key`` holds another character.
        """
        raise NotImplementedError

    def bucket(self, column: Any, start: int, width: int) -> Any:
        """A SQLAlchemy expression of the number of whole ``width``-second buckets from
        ``start`` (seconds since 1970) to the time in ``column`` (not before
        ``start``), for a Core statement."""
        raise NotImplementedError

    def time(self, value: datetime) -> Any:
        """An aware time as this driver binds it into a time column."""
        return value

    def read_time(self, value: Any) -> datetime | None:
        """A time column's value as this driver reads it, as an aware UTC datetime."""
        return value  # type: ignore[no-any-return]

    def key(self, value: Any) -> Any:
        """A row's key as this driver binds it into a key column (a UUID key as the
        driver stores it; an integer as it is)."""
        return value

    def read_key(self, value: Any) -> Any:
        """A key column's value as this driver reads it, as :meth:`key` was given it
        (a UUID key as a :class:`uuid.UUID`; an integer as it is)."""
        return value

    def lock_not_granted(self, error: BaseException) -> bool:
        """Whether ``error``, raised by a statement that waited for a lock, says the
        wait ran past the bound the transaction set (the transaction must then be
        rolled back, or rolled back to a savepoint). Never, where nothing waits for a
        lock in a statement (SQLite)."""
        return False

    async def execute(self, driver: Any, sql: str, values: Values | None = None) -> int:
        """Run ``sql`` (already :meth:`statement`) on ``driver``; the rows it changed."""
        raise NotImplementedError

    async def execute_many(self, driver: Any, sql: str, values: Sequence[Values]) -> None:
        """Run ``sql`` on ``driver`` once for each of ``values``, in order, sending them
        together where the driver can."""
        raise NotImplementedError

    async def rows(
        self, driver: Any, sql: str, values: Values | None = None
    ) -> list[tuple[Any, ...]]:
        """Run ``sql`` on ``driver`` and read every row it returns."""
        raise NotImplementedError

    async def row(
        self, driver: Any, sql: str, values: Values | None = None
    ) -> tuple[Any, ...] | None:
        """Run ``sql`` on ``driver`` and read its first row, or ``None``."""
        raise NotImplementedError


async def ping(dialect: Dialect, driver: Any) -> None:
    """Run the smallest statement on ``driver``: returns once the database responded,
    raises what the driver raised when it did not."""
    await dialect.row(driver, "SELECT 1")


def named_to_pyformat(text: str) -> str:
    """``text`` with ``:name`` parameters written as ``%(name)s`` and every other
    ``%`` doubled, as psycopg binds a statement with parameters by name."""
    return _PARAMETER.sub(r"%(\1)s", text.replace("%", "%%"))


_SPLICED_KEY = re.compile(r"[A-Za-z0-9_.]+")


def spliced_key(key: str) -> str:
    """``key`` unchanged, checked fit to splice into a statement's SQL (see
    :meth:`Dialect.json_text_sql`).

    Raises:
        ValueError: ``key`` is empty or holds another character than letters, digits,
            dots and underscores.
    """
    if _SPLICED_KEY.fullmatch(key) is None:
        raise ValueError(f"{key!r} is not a metadata key to splice into SQL")
    return key
