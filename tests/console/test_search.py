"""The executions list searched by address key, final state and error name, on SQLite
and PostgreSQL: each filter alone and every combination of them (with the status and
errors filters) lists exactly what a reading of the rows by hand lists, a page at a
time; bad search texts are refused with a typed error."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from tests.console.conftest import ConsoleDb
from tests.console.test_queries import _walk

from statifier.buckets import address_bucket, bucket_of
from statifier.console.queries import (
    MAX_SEARCH,
    BadCursor,
    BadFilter,
    ExecutionFilter,
)
from statifier.persistence import Status

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
COUNT = 40
FINALS = ("shipped", "returned")


@dataclass(frozen=True)
class Seeded:
    """The rows written, as the test reads them by hand."""

    executions: list[dict[str, Any]]
    addresses: list[tuple[str, str, str, str]]  # scope, document, key, execution id
    errors: dict[str, set[str]]  # execution id -> the names of its step errors


def _seed(db: ConsoleDb) -> Seeded:
    t = db.store.tables
    executions = []
    for index in range(COUNT):
        status = ("active", "completed", "failed", "completed")[index % 4]
        final = FINALS[index % 3 % 2] if status == "completed" and index % 5 else None
        executions.append(
            {
                "execution_id": f"ex-{index:04d}",
                "content_hash": "h-a",
                "status": status,
                "metadata": {},
                "created_at": T0 + timedelta(seconds=index // 3),  # ties on purpose
                "updated_at": T0 + timedelta(seconds=index),
                "final_state": final,
                "error_count": 0,
                "last_error_at": None,
                "bucket": bucket_of(f"ex-{index:04d}"),
            }
        )
    addresses = [
        ("eu" if i % 4 else "us", "order", f"k{i}", f"ex-{i:04d}") for i in range(0, COUNT, 2)
    ]
    addresses += [
        # One key in two scopes and two documents, naming three executions.
        ("eu", "order", "shared", "ex-0001"),
        ("us", "order", "shared", "ex-0003"),
        ("eu", "parcel", "shared", "ex-0005"),
        # An execution found through either of its two addresses.
        ("eu", "order", "alias-4", "ex-0004"),
    ]
    errors: dict[str, set[str]] = {}
    error_rows = []
    for index in range(COUNT):
        names = ["error.execution"] * (index % 5 == 0) + ["error.communication"] * (index % 7 == 0)
        for n, name in enumerate(names * 2):  # each name twice: one execution listed once
            error_rows.append(
                {
                    "execution_id": f"ex-{index:04d}",
                    "seq": n,
                    "via": "step",
                    "name": name,
                    "taken": False,
                    "error_blob": b'{"message":"boom"}',
                    "recorded_at": T0 + timedelta(seconds=index, milliseconds=n),
                }
            )
            errors.setdefault(f"ex-{index:04d}", set()).add(name)
            executions[index]["error_count"] = len(names) * 2
            executions[index]["last_error_at"] = T0 + timedelta(seconds=index, milliseconds=n)
    db.insert(t.executions, executions)
    db.insert(
        t.addresses,
        [
            {
                "scope": s,
                "document": d,
                "key": k,
                "execution_id": e,
                "inserted_at": T0,
                "bucket": address_bucket(s, d, k),
            }
            for s, d, k, e in addresses
        ],
    )
    db.insert(t.step_errors, error_rows)
    return Seeded(executions, addresses, errors)


def _expected(seeded: Seeded, where: ExecutionFilter) -> list[str]:
    """What ``where`` lists, read off the rows by hand, in the list's order."""

    def keep(row: dict[str, Any]) -> bool:
        execution_id = row["execution_id"]
        if where.status is not None and row["status"] != where.status.value:
            return False
        if (where.key is not None or where.scope is not None) and not any(
            e == execution_id
            and (where.key is None or k == where.key)
            and (where.scope is None or s == where.scope)
            for s, _, k, e in seeded.addresses
        ):
            return False
        if where.final_state is not None and row["final_state"] != where.final_state:
            return False
        if where.error is not None and where.error not in seeded.errors.get(execution_id, ()):
            return False
        return not where.errors or row.get("last_error_at") is not None

    moment = "last_error_at" if where.errors else "created_at"
    kept = sorted(
        (r for r in seeded.executions if keep(r)),
        key=lambda r: (r[moment], r["execution_id"]),
        reverse=True,
    )
    return [r["execution_id"] for r in kept]


@pytest.mark.parametrize(
    ("where", "found"),
    [
        (ExecutionFilter(key="k6"), ["ex-0006"]),
        (ExecutionFilter(key="shared"), ["ex-0005", "ex-0003", "ex-0001"]),
        (ExecutionFilter(key="shared", scope="eu"), ["ex-0005", "ex-0001"]),
        (ExecutionFilter(key="shared", scope="asia"), []),
        (ExecutionFilter(key="alias-4"), ["ex-0004"]),
        (ExecutionFilter(key="k4", scope="us"), ["ex-0004"]),
        (ExecutionFilter(key="k4", scope="eu"), []),  # k4 lives in us, alias-4 in eu
        (ExecutionFilter(key="K6"), []),  # exact
        (
            ExecutionFilter(final_state="returned"),
            ["ex-0037", "ex-0031", "ex-0019", "ex-0013", "ex-0007", "ex-0001"],
        ),
        (ExecutionFilter(final_state="ship"), []),  # exact
        (
            ExecutionFilter(error="error.communication"),
            ["ex-0035", "ex-0028", "ex-0021", "ex-0014", "ex-0007", "ex-0000"],
        ),
        (ExecutionFilter(error="error"), []),  # the name, exactly
    ],
)
@pytest.mark.asyncio
async def test_each_search_alone_finds_what_it_says(
    console_db: ConsoleDb, where: ExecutionFilter, found: list[str]
) -> None:
    seeded = _seed(console_db)
    assert _expected(seeded, where) == found  # the reading by hand is the literal answer
    assert await _walk(console_db.queries, where, 2) == found


@pytest.mark.asyncio
async def test_every_combination_pages_exactly_what_the_rows_say(console_db: ConsoleDb) -> None:
    seeded = _seed(console_db)
    combinations = itertools.product(
        (None, "k8", "shared", "alias-4", "nowhere"),
        (None, "eu"),
        (None, *FINALS),
        (None, "error.execution", "error.communication"),
        (None, Status.COMPLETED),
        (False, True),
    )
    listed = 0
    for key, scope, final, error, status, errors in combinations:
        where = ExecutionFilter(
            key=key, scope=scope, final_state=final, error=error, status=status, errors=errors
        )
        expected = _expected(seeded, where)
        assert await _walk(console_db.queries, where, 3) == expected, where
        listed += len(expected)
    assert listed > 100  # the combinations list something, not only empty pages


@pytest.mark.asyncio
async def test_a_search_keeps_its_pages_and_refuses_another_lists_cursor(
    console_db: ConsoleDb,
) -> None:
    seeded = _seed(console_db)
    where = ExecutionFilter(final_state="shipped")
    expected = _expected(seeded, where)
    assert len(expected) > 5
    for size in (1, 4, len(expected), 500):
        assert await _walk(console_db.queries, where, size) == expected
    by_error = ExecutionFilter(error="error.execution", errors=True)
    assert await _walk(console_db.queries, by_error, 2) == _expected(seeded, by_error)
    # With ``errors`` the search is ordered by the newest error: a cursor of the list
    # by creation is not its cursor.
    first = await console_db.queries.executions(where, size=1)
    assert first.next_cursor is not None
    with pytest.raises(BadCursor):
        await console_db.queries.executions(by_error, cursor=first.next_cursor)


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"key": ""}, "key: a non-empty text"),
        ({"key": "k" * (MAX_SEARCH + 1)}, f"key: at most {MAX_SEARCH} characters"),
        ({"final_state": "a\x00b"}, "final_state: a NUL character"),
        ({"error": "e" * (MAX_SEARCH + 1)}, "error: at most"),
        ({"scope": "s\x00"}, "scope: a NUL character"),
        ({"document": ""}, "document: a non-empty text"),
    ],
)
def test_bad_search_texts_are_refused(fields: dict[str, Any], said: str) -> None:
    with pytest.raises(BadFilter, match=said):
        ExecutionFilter(**fields)


@pytest.mark.asyncio
async def test_the_longest_search_text_is_a_search(console_db: ConsoleDb) -> None:
    _seed(console_db)
    longest = "k" * MAX_SEARCH
    where = ExecutionFilter(key=longest, final_state=longest, error=longest)
    assert await _walk(console_db.queries, where, 5) == []
