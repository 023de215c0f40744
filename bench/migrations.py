"""How long the bucket revisions take to fill the rows already there: `statifier_0021`
(each dedupe claim's bucket, read from the routing-ledger row its delivery wrote),
`statifier_0022` (each execution's bucket, from its id), `statifier_0023` (each
ledger row's, from its address, execution or message id), `statifier_0024` (each saved
position's, from its key) and `statifier_0025` (each event a cap holds, from its
address), on SQLite and PostgreSQL.

For each database and revision the bench makes fresh tables (a SQLite file, a
PostgreSQL schema of `--url`), upgrades them to the revision before, inserts `--rows`
rows with one statement (for 0021: `--rows` claims and twice as many ledger rows, one
of the claim's binding and one of another binding, so a lookup by binding alone reads
many rows; for 0023: ledger rows, two in three naming an address, the others a refused
send's execution; for 0025: held creates over 1,000 addresses), then times the upgrade
to the revision: the fill in Python, the column made required, the index made. It
checks that every row got the bucket Python computes for it. A revision runs in one
transaction: the time is also how long the upgrade holds the tables.

    python bench/migrations.py                    # 100,000 rows on both databases
    python bench/migrations.py --rows 1000000 --only postgresql
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from harness import machine_info, machine_summary, new_parser, versions_line

from statifier.buckets import address_bucket, bucket_of
from statifier.sql import TableOptions, migrations

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
SCHEMA = "bench_migrations"


def _series(postgresql: bool) -> tuple[str, str, str]:
    """The SQL that numbers ``x`` from 1 to ``:n`` (a prefix and a FROM item) and a
    time literal, for the database."""
    if postgresql:
        return "", "generate_series(1, :n) AS g(x)", "now()"
    counting = "WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < :n) "
    return counting, "g", "'2026-01-01 00:00:00.000000'"


def _fill_dedupe(connection: sa.Connection, rows: int, postgresql: bool) -> None:
    prefix, numbers, now = _series(postgresql)
    schema = f"{SCHEMA}." if postgresql else ""
    connection.execute(
        sa.text(
            f"{prefix}INSERT INTO {schema}b_dedupe (binding_id, message_id, expires_at) "
            f"SELECT 'b', 'm' || x, {now} FROM {numbers}"
        ),
        {"n": rows},
    )
    for binding in ("b", "other"):
        connection.execute(
            sa.text(
                f"{prefix}INSERT INTO {schema}b_routing_ledger (binding_id, message_id, "
                f"scope, outcome, document, key, inserted_at) SELECT '{binding}', 'm' || x, 's', "
                f"'delivered', 'd', 'k' || (x % 1000), {now} FROM {numbers}"
            ),
            {"n": rows},
        )


def _fill_executions(connection: sa.Connection, rows: int, postgresql: bool) -> None:
    prefix, numbers, now = _series(postgresql)
    schema = f"{SCHEMA}." if postgresql else ""
    connection.execute(
        sa.text(
            f"{prefix}INSERT INTO {schema}b_executions (execution_id, content_hash, status, "
            f"metadata, created_at, updated_at) SELECT 'ex-' || x, 'h', 'active', '{{}}', "
            f"{now}, {now} FROM {numbers}"
        ),
        {"n": rows},
    )


def _fill_ledger(connection: sa.Connection, rows: int, postgresql: bool) -> None:
    prefix, numbers, now = _series(postgresql)
    schema = f"{SCHEMA}." if postgresql else ""
    connection.execute(
        sa.text(
            f"{prefix}INSERT INTO {schema}b_routing_ledger (binding_id, message_id, scope, "
            "outcome, document, key, execution_id, inserted_at) SELECT 'b', 'm' || x, 's', "
            "'delivered', CASE WHEN x % 3 = 0 THEN NULL ELSE 'd' END, 'k' || (x % 1000), "
            f"'ex-' || (x % 1000), {now} FROM {numbers}"
        ),
        {"n": rows},
    )


def _fill_positions(connection: sa.Connection, rows: int, postgresql: bool) -> None:
    prefix, numbers, now = _series(postgresql)
    schema = f"{SCHEMA}." if postgresql else ""
    connection.execute(
        sa.text(
            f"{prefix}INSERT INTO {schema}b_positions (key, content_hash, position_blob, "
            f"saved_at) SELECT 'session-' || x, 'h', :blob, {now} FROM {numbers}"
        ),
        {"n": rows, "blob": b"position"},
    )


def _fill_held(connection: sa.Connection, rows: int, postgresql: bool) -> None:
    prefix, numbers, now = _series(postgresql)
    schema = f"{SCHEMA}." if postgresql else ""
    connection.execute(
        sa.text(
            f"{prefix}INSERT INTO {schema}b_held_creates (document, scope, key, seq, "
            "binding_id, create_mode, message_id, event_blob, arrived_at) SELECT 'd', 's', "
            f"'k' || (x % 1000), x, 'b', 'always', 'm' || x, :blob, {now} FROM {numbers}"
        ),
        {"n": rows, "blob": b"event"},
    )


def _check(connection: sa.Connection, revision: str, postgresql: bool) -> int:
    """How many rows have another bucket than Python computes for them."""
    schema = f"{SCHEMA}." if postgresql else ""
    if revision == "statifier_0021":
        found = connection.execute(sa.text(f"SELECT message_id, bucket FROM {schema}b_dedupe"))
        wrong = [
            message
            for message, bucket in found
            if bucket != address_bucket("s", "d", f"k{int(message[1:]) % 1000}")
        ]
    elif revision == "statifier_0022":
        found = connection.execute(
            sa.text(f"SELECT execution_id, bucket FROM {schema}b_executions")
        )
        wrong = [execution for execution, bucket in found if bucket != bucket_of(execution)]
    elif revision == "statifier_0024":
        found = connection.execute(sa.text(f"SELECT key, bucket FROM {schema}b_positions"))
        wrong = [key for key, bucket in found if bucket != bucket_of(key)]
    elif revision == "statifier_0025":
        found = connection.execute(sa.text(f"SELECT key, bucket FROM {schema}b_held_creates"))
        wrong = [key for key, bucket in found if bucket != address_bucket("s", "d", key)]
    else:
        found = connection.execute(
            sa.text(f"SELECT document, key, execution_id, bucket FROM {schema}b_routing_ledger")
        )
        wrong = [
            key
            for document, key, execution, bucket in found
            if bucket
            != (bucket_of(execution) if document is None else address_bucket("s", document, key))
        ]
    return len(wrong)


FILLS = {
    "statifier_0021": _fill_dedupe,
    "statifier_0022": _fill_executions,
    "statifier_0023": _fill_ledger,
    "statifier_0024": _fill_positions,
    "statifier_0025": _fill_held,
}


def run(database: str, revision: str, rows: int, url: str, folder: Path) -> dict[str, Any]:
    """Time the upgrade to ``revision`` over ``rows`` rows on fresh tables."""
    postgresql = database == "postgresql"
    if postgresql:
        options = TableOptions(prefix="b_", schema=SCHEMA)
        engine = sa.create_engine(migrations.sync_url(url))
        with engine.begin() as connection:
            connection.execute(sa.text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
            connection.execute(sa.text(f"CREATE SCHEMA {SCHEMA}"))
    else:
        options = TableOptions(prefix="b_")
        path = folder / f"{revision}.db"
        path.unlink(missing_ok=True)
        url = f"sqlite:///{path}"
        engine = sa.create_engine(migrations.sync_url(url))
    previous = f"statifier_{int(revision.rsplit('_', 1)[1]) - 1:04d}"
    try:
        migrations.upgrade(url, options, previous)
        with engine.begin() as connection:
            FILLS[revision](connection, rows, postgresql)
        started = time.perf_counter()
        migrations.upgrade(url, options, revision)
        seconds = time.perf_counter() - started
        with engine.connect() as connection:
            wrong = _check(connection, revision, postgresql)
    finally:
        if postgresql:
            with engine.begin() as connection:
                connection.execute(sa.text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        engine.dispose()
    return {"database": database, "revision": revision, "seconds": seconds, "wrong": wrong}


def main() -> int:
    parser = new_parser(__doc__)
    parser.add_argument("--rows", type=int, default=100_000, help="rows to fill (default 100,000)")
    parser.add_argument("--only", choices=("sqlite", "postgresql"), help="one database")
    parser.add_argument("--url", default=DEFAULT_URL, help="the PostgreSQL URL")
    args = parser.parse_args()
    if args.rows < 1:
        parser.error("--rows is at least 1")
    info = machine_info(["statifier", "sqlalchemy", "psycopg", "alembic"])
    print(machine_summary(info))
    print(versions_line(info))
    databases = [args.only] if args.only else ["sqlite", "postgresql"]
    revisions = tuple(FILLS)
    with tempfile.TemporaryDirectory() as folder:
        results = [
            run(database, revision, args.rows, args.url, Path(folder))
            for database in databases
            for revision in revisions
        ]
    print(f"\n{args.rows:,} rows filled (0021: claims, beside twice as many ledger rows)\n")
    print(f"{'database':<12}{'revision':<16}{'seconds':>9}{'rows/s':>10}  wrong")
    for row in results:
        rate = args.rows / row["seconds"]
        print(
            f"{row['database']:<12}{row['revision']:<16}{row['seconds']:>9.2f}"
            f"{rate:>10,.0f}  {row['wrong']}"
        )
    return 1 if any(row["wrong"] for row in results) else 0


if __name__ == "__main__":
    sys.exit(main())
