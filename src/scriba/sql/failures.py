"""How a failed commit is handled, read from the database's own error codes.

:func:`classify` maps an exception to a :class:`~scriba.target.FailureKind`:

- ``TRANSIENT``: the database could not do it now (a lost connection, a lock or
  resource limit, a serialization failure, a deadlock); the same batch may succeed
  later, so it is replayed after a backoff.
- ``INTEGRITY``: the data of some event was refused (a constraint, a value out of
  range); deterministic and specific to an event, so events are isolated and the
  offenders dead-lettered.
- ``STRUCTURAL``: the schema or the permissions do not match the code (a missing table
  or column, a syntax error), and anything not recognised; replaying cannot fix it, so
  the projection halts and says why.

PostgreSQL errors are read by SQLSTATE (psycopg 3 puts it on ``exc.sqlstate``), SQLite
errors by their extended result code (``sqlite3.Error.sqlite_errorcode``), in both cases
through SQLAlchemy's wrapper (``DBAPIError.orig``) too. Only when there is no code does
the class of the exception decide.

>>> import sqlite3
>>> connection = sqlite3.connect(":memory:")
>>> try:
...     connection.execute("select missing from nowhere")
... except sqlite3.Error as error:
...     classify(error)
<FailureKind.STRUCTURAL: 'structural'>
>>> connection.close()
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping
from typing import Final

import sqlalchemy as sa

from scriba.target import ApplyFailed, FailureKind

__all__ = ["SQLITE_CODES", "SQLSTATE_CLASSES", "SQLSTATE_CODES", "classify"]

TRANSIENT: Final = FailureKind.TRANSIENT
INTEGRITY: Final = FailureKind.INTEGRITY
STRUCTURAL: Final = FailureKind.STRUCTURAL

SQLSTATE_CODES: Final[Mapping[str, FailureKind]] = {
    "40001": TRANSIENT,  # serialization_failure
    "40P01": TRANSIENT,  # deadlock_detected
    "55P03": TRANSIENT,  # lock_not_available (lock_timeout, NOWAIT)
    "40002": INTEGRITY,  # transaction_integrity_constraint_violation (deferred constraints)
}
"""Whole SQLSTATEs with a kind of their own; they win over their class."""

SQLSTATE_CLASSES: Final[Mapping[str, FailureKind]] = {
    "08": TRANSIENT,  # connection exception
    "53": TRANSIENT,  # insufficient resources (disk full, out of memory, too many connections)
    "57": TRANSIENT,  # operator intervention (shutdown, query canceled, statement timeout)
    "22": INTEGRITY,  # data exception (out of range, invalid text, too long)
    "23": INTEGRITY,  # integrity constraint violation
    "42": STRUCTURAL,  # syntax error or access rule violation (missing table or column)
}
"""SQLSTATE classes (the first two characters); any other class is ``STRUCTURAL``."""

SQLITE_CODES: Final[Mapping[int, FailureKind]] = {
    5: TRANSIENT,  # SQLITE_BUSY: another connection holds the lock
    6: TRANSIENT,  # SQLITE_LOCKED: a conflict inside a shared cache
    7: TRANSIENT,  # SQLITE_NOMEM
    9: TRANSIENT,  # SQLITE_INTERRUPT
    13: TRANSIENT,  # SQLITE_FULL: the disk is full
    15: TRANSIENT,  # SQLITE_PROTOCOL: a locking race
    17: TRANSIENT,  # SQLITE_SCHEMA: the schema changed under a prepared statement
    18: INTEGRITY,  # SQLITE_TOOBIG: a string or blob over the limit
    19: INTEGRITY,  # SQLITE_CONSTRAINT, and every SQLITE_CONSTRAINT_* extended code
    20: INTEGRITY,  # SQLITE_MISMATCH: a datatype mismatch
    25: INTEGRITY,  # SQLITE_RANGE: a value out of range
    1: STRUCTURAL,  # SQLITE_ERROR: no such table or column, syntax errors
    3: STRUCTURAL,  # SQLITE_PERM
    8: STRUCTURAL,  # SQLITE_READONLY
    23: STRUCTURAL,  # SQLITE_AUTH
}
"""SQLite primary result codes (an extended code's low byte); any other is
``STRUCTURAL``."""

_MAX_CHAIN: Final = 16


def classify(error: BaseException) -> FailureKind:
    """The failure kind of ``error``, raised while committing a batch.

    The error and what it wraps (SQLAlchemy's ``orig``, then ``__cause__`` and
    ``__context__``) are searched for a database code: the first SQLSTATE or SQLite
    result code found decides. Without one, a lost connection or a timeout is
    ``TRANSIENT``; the DB-API's ``IntegrityError`` and ``DataError``, and a value
    SQLAlchemy could not convert for the driver, are ``INTEGRITY``; everything else is
    ``STRUCTURAL``. An :class:`~scriba.target.ApplyFailed` keeps
    its kind.

    Never raises.
    """
    chain = list(_chain(error))
    for link in chain:
        if isinstance(link, ApplyFailed):
            return link.kind
        code = _sqlstate(link)
        if code is not None:
            return SQLSTATE_CODES.get(code, SQLSTATE_CLASSES.get(code[:2], STRUCTURAL))
        sqlite_code = _sqlite_code(link)
        if sqlite_code is not None:
            return SQLITE_CODES.get(sqlite_code & 0xFF, STRUCTURAL)
    for link in chain:
        kind = _kind_without_code(link)
        if kind is not None:
            return kind
    return STRUCTURAL


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and what it wraps, each once, nearest first."""
    seen: set[int] = set()
    pending: list[BaseException] = [error]
    while pending and len(seen) < _MAX_CHAIN:
        link = pending.pop(0)
        if id(link) in seen:
            continue
        seen.add(id(link))
        yield link
        wrapped = link.orig if isinstance(link, sa.exc.StatementError) else None
        pending.extend(
            candidate
            for candidate in (wrapped, link.__cause__, link.__context__)
            if isinstance(candidate, BaseException)
        )


def _sqlstate(error: BaseException) -> str | None:
    # psycopg 3 (and asyncpg) name it sqlstate, psycopg 2 pgcode.
    for attribute in ("sqlstate", "pgcode"):
        code = getattr(error, attribute, None)
        if isinstance(code, str) and len(code) == 5:
            return code.upper()
    return None


def _sqlite_code(error: BaseException) -> int | None:
    if not isinstance(error, sqlite3.Error):
        return None
    code = getattr(error, "sqlite_errorcode", None)
    return code if isinstance(code, int) else None


def _kind_without_code(error: BaseException) -> FailureKind | None:
    if isinstance(error, sa.exc.DBAPIError) and error.connection_invalidated:
        return TRANSIENT
    if (
        isinstance(error, sa.exc.StatementError)
        and not isinstance(error, sa.exc.DBAPIError)
        and isinstance(error.orig, TypeError | ValueError)
    ):
        # SQLAlchemy could not convert one of the values for the driver (a str for a
        # SQLite date, say): the event's data, like a changeset that does not cast.
        return INTEGRITY
    if isinstance(error, sa.exc.TimeoutError | TimeoutError | ConnectionError):
        return TRANSIENT  # pool exhausted, socket timeouts, refused or reset connections
    # The DB-API (PEP 249) names its exception classes the same in every driver.
    names = {cls.__name__ for cls in type(error).__mro__}
    if names & {"IntegrityError", "DataError"}:
        return INTEGRITY
    if names & {"OperationalError", "InterfaceError"}:
        # With no code, a DB-API OperationalError is the driver losing its connection.
        return TRANSIENT
    return None
