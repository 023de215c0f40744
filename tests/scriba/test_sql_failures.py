"""Failure classification: by table over driver errors, then with real database errors."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING

import psycopg
import psycopg.errors
import pytest
import sqlalchemy as sa

from scriba.sql import classify
from scriba.target import ApplyFailed, FailureKind

if TYPE_CHECKING:
    from tests.scriba.conftest import SqlDatabase

TRANSIENT, INTEGRITY, STRUCTURAL = (
    FailureKind.TRANSIENT,
    FailureKind.INTEGRITY,
    FailureKind.STRUCTURAL,
)

SQLSTATES = [
    ("08006", TRANSIENT),  # connection_failure
    ("08001", TRANSIENT),  # sqlclient_unable_to_establish_sqlconnection
    ("53300", TRANSIENT),  # too_many_connections
    ("53100", TRANSIENT),  # disk_full
    ("57014", TRANSIENT),  # query_canceled (statement_timeout)
    ("57P01", TRANSIENT),  # admin_shutdown
    ("40001", TRANSIENT),  # serialization_failure
    ("40P01", TRANSIENT),  # deadlock_detected
    ("55P03", TRANSIENT),  # lock_not_available
    ("40002", INTEGRITY),  # transaction_integrity_constraint_violation
    ("22001", INTEGRITY),  # string_data_right_truncation
    ("22003", INTEGRITY),  # numeric_value_out_of_range
    ("22P02", INTEGRITY),  # invalid_text_representation
    ("23505", INTEGRITY),  # unique_violation
    ("23502", INTEGRITY),  # not_null_violation
    ("23514", INTEGRITY),  # check_violation
    ("23503", INTEGRITY),  # foreign_key_violation
    ("42P01", STRUCTURAL),  # undefined_table
    ("42703", STRUCTURAL),  # undefined_column
    ("42601", STRUCTURAL),  # syntax_error
    ("42501", STRUCTURAL),  # insufficient_privilege
    ("40000", STRUCTURAL),  # transaction_rollback: not one of the named ones
    ("0A000", STRUCTURAL),  # feature_not_supported
    ("XX000", STRUCTURAL),  # internal_error
    ("28000", STRUCTURAL),  # invalid_authorization_specification
]


@pytest.mark.parametrize(("sqlstate", "kind"), SQLSTATES)
def test_psycopg_errors_by_sqlstate(sqlstate: str, kind: FailureKind) -> None:
    error = psycopg.errors.lookup(sqlstate)("refused")
    assert error.sqlstate == sqlstate
    assert classify(error) is kind


@pytest.mark.parametrize(("sqlstate", "kind"), SQLSTATES)
def test_sqlstate_through_sqlalchemy(sqlstate: str, kind: FailureKind) -> None:
    wrapped = sa.exc.DBAPIError("insert ...", {}, psycopg.errors.lookup(sqlstate)("refused"))
    assert classify(wrapped) is kind


SQLITE_CODES = [
    ("SQLITE_BUSY", 5, TRANSIENT),
    ("SQLITE_BUSY_SNAPSHOT", 517, TRANSIENT),
    ("SQLITE_LOCKED", 6, TRANSIENT),
    ("SQLITE_LOCKED_SHAREDCACHE", 262, TRANSIENT),
    ("SQLITE_FULL", 13, TRANSIENT),
    ("SQLITE_NOMEM", 7, TRANSIENT),
    ("SQLITE_INTERRUPT", 9, TRANSIENT),
    ("SQLITE_CONSTRAINT", 19, INTEGRITY),
    ("SQLITE_CONSTRAINT_UNIQUE", 2067, INTEGRITY),
    ("SQLITE_CONSTRAINT_PRIMARYKEY", 1555, INTEGRITY),
    ("SQLITE_CONSTRAINT_NOTNULL", 1299, INTEGRITY),
    ("SQLITE_CONSTRAINT_CHECK", 275, INTEGRITY),
    ("SQLITE_CONSTRAINT_FOREIGNKEY", 787, INTEGRITY),
    ("SQLITE_MISMATCH", 20, INTEGRITY),
    ("SQLITE_TOOBIG", 18, INTEGRITY),
    ("SQLITE_RANGE", 25, INTEGRITY),
    ("SQLITE_ERROR", 1, STRUCTURAL),
    ("SQLITE_READONLY", 8, STRUCTURAL),
    ("SQLITE_PERM", 3, STRUCTURAL),
    ("SQLITE_CORRUPT", 11, STRUCTURAL),
    ("SQLITE_CANTOPEN", 14, STRUCTURAL),
]


@pytest.mark.parametrize(("name", "code", "kind"), SQLITE_CODES)
def test_sqlite_errors_by_result_code(name: str, code: int, kind: FailureKind) -> None:
    error = sqlite3.OperationalError(name)
    error.sqlite_errorcode = code
    error.sqlite_errorname = name
    assert classify(error) is kind
    assert classify(sa.exc.OperationalError("insert ...", {}, error)) is kind


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (psycopg.OperationalError("server closed the connection unexpectedly"), TRANSIENT),
        (psycopg.InterfaceError("the connection is closed"), TRANSIENT),
        (sa.exc.TimeoutError("QueuePool limit reached"), TRANSIENT),
        (ConnectionResetError("reset by peer"), TRANSIENT),
        (TimeoutError(), TRANSIENT),
        (sqlite3.IntegrityError("no code"), INTEGRITY),
        (psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes"), INTEGRITY),
        (psycopg.ProgrammingError("no code"), STRUCTURAL),
        (sa.exc.ArgumentError("table 'orders' has no column 'x'"), STRUCTURAL),
        (sa.exc.CompileError("Unconsumed column names: x"), STRUCTURAL),
        (KeyError("x"), STRUCTURAL),
        (RuntimeError("anything else"), STRUCTURAL),
        (ApplyFailed(TRANSIENT, "already classified"), TRANSIENT),
        (sa.exc.StatementError("bind", "insert", {}, TypeError("not a date")), INTEGRITY),
        (sa.exc.StatementError("bind", "insert", {}, KeyError("x")), STRUCTURAL),
    ],
    ids=repr,
)
def test_errors_without_a_code(error: BaseException, kind: FailureKind) -> None:
    assert classify(error) is kind


def test_a_lost_connection_seen_by_sqlalchemy_is_transient() -> None:
    error = sa.exc.DBAPIError("select 1", {}, psycopg.Error("gone"), connection_invalidated=True)
    assert classify(error) is TRANSIENT


def test_the_code_is_found_through_causes() -> None:
    outer = RuntimeError("the batch failed")
    outer.__cause__ = psycopg.errors.lookup("40P01")("deadlock")
    assert classify(outer) is TRANSIENT


def test_a_cause_cycle_ends() -> None:
    first, second = RuntimeError("a"), RuntimeError("b")
    first.__cause__, second.__cause__ = second, first
    assert classify(first) is STRUCTURAL


# Real errors, raised by the databases themselves.


def _raised(database: SqlDatabase, statement: str) -> BaseException:
    with pytest.raises(sa.exc.DBAPIError) as caught, database.engine.begin() as connection:
        connection.exec_driver_sql(statement)
    return caught.value


def _setup(database: SqlDatabase) -> Callable[[str], str]:
    schema = f"{database.schema}." if database.schema else ""
    with database.engine.begin() as connection:
        connection.exec_driver_sql(
            f"create table {schema}accounts (id integer primary key, "
            "owner text not null, balance integer check (balance >= 0))"
        )
        connection.exec_driver_sql(f"insert into {schema}accounts values (1, 'ann', 5)")
    return lambda name: f"{schema}{name}"


REAL = [
    ("insert into {accounts} values (1, 'bob', 0)", INTEGRITY),  # unique
    ("insert into {accounts} values (2, null, 0)", INTEGRITY),  # not null
    ("insert into {accounts} values (3, 'cy', -1)", INTEGRITY),  # check
    ("insert into {accounts} (id, owner, nickname) values (4, 'di', 'd')", STRUCTURAL),  # column
    ("insert into {missing} values (1)", STRUCTURAL),  # table
    ("update {accounts} set owner = 'x' where nickname = 'y'", STRUCTURAL),  # column in a filter
    ("selct 1", STRUCTURAL),  # syntax
]


@pytest.mark.parametrize(("statement", "kind"), REAL, ids=[s for s, _ in REAL])
def test_real_database_errors(sql_database: SqlDatabase, statement: str, kind: FailureKind) -> None:
    name = _setup(sql_database)
    error = _raised(sql_database, statement.format(accounts=name("accounts"), missing=name("nope")))
    assert classify(error) is kind
    assert isinstance(error, sa.exc.DBAPIError)
    assert error.orig is not None
    assert classify(error.orig) is kind


def test_real_sqlite_datatype_mismatch(tmp_path: object) -> None:
    connection = sqlite3.connect(":memory:")
    connection.execute("create table t (id integer primary key)")
    with pytest.raises(sqlite3.Error) as caught:
        connection.execute("insert into t (id) values ('not a number')")
    connection.close()
    assert caught.value.sqlite_errorname == "SQLITE_MISMATCH"
    assert classify(caught.value) is INTEGRITY


def test_real_postgresql_data_errors(database_url: str) -> None:
    engine = sa.create_engine(sa.make_url(database_url).set(drivername="postgresql+psycopg"))
    try:
        for statement in ("select 1 / 0", "select 'abc'::integer", "select 2147483648::integer"):
            with pytest.raises(sa.exc.DBAPIError) as caught, engine.connect() as connection:
                connection.exec_driver_sql(statement)
            assert classify(caught.value) is INTEGRITY, statement
    finally:
        engine.dispose()
