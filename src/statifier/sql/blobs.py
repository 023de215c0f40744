"""Rewriting every stored blob of durable executions: what retires an old key.

A blob codec (``statifier.persistence.codec``) encodes the five blob columns
(:data:`BLOB_COLUMNS`). A position is written again on every step, but a chart's source
is written once, and input-log entries, outcomes and saved positions of executions that
no longer step stay as they were: before a key is dropped, what it encoded must be
encoded again under the newest one. :func:`rewrite_blobs` does that, in batches, while
the executions run.

Each batch is read in one short transaction, rewritten outside any (a codec's work holds
no lock), and written back in a second one, row by row only where the column still
holds the bytes that were read: a step that stored a newer position in between keeps
it (written by the new codec already), and is not counted.

>>> import os, tempfile
>>> from statifier.sql import migrations
>>> url = f"sqlite:///{os.path.join(tempfile.mkdtemp(), 'blobs.db')}"
>>> migrations.upgrade(url)
>>> rewrite_blobs(url, lambda blob: blob[::-1])
{'charts.chart_blob': 0, 'positions.position_blob': 0, 'executions.position_blob': 0, \
'executions.outcome_blob': 0, 'inputs.input_blob': 0}
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

import sqlalchemy as sa

from statifier.extras import MissingExtra
from statifier.sql.engines import database_url
from statifier.sql.tables import TableOptions, Tables

__all__ = ["BLOB_COLUMNS", "rewrite_blobs"]

BLOB_COLUMNS: Final = (
    ("charts", "chart_blob"),
    ("positions", "position_blob"),
    ("executions", "position_blob"),
    ("executions", "outcome_blob"),
    ("inputs", "input_blob"),
)
"""``(table, column)`` of every blob a codec encodes; every other column stays plain."""


def rewrite_blobs(
    target: str | sa.URL | sa.Engine,
    rewrite: Callable[[bytes], bytes],
    tables: Tables | TableOptions | None = None,
    *,
    batch: int = 500,
) -> dict[str, int]:
    """Replace every non-null blob of :data:`BLOB_COLUMNS` by ``rewrite(blob)``.

    Args:
        target: a database URL (synchronous drivers: psycopg 3, ``sqlite3``) or a
            synchronous engine (the caller's to dispose).
        rewrite: the new stored bytes for the old ones, e.g. ``FernetCodec.rotate``
            (decrypt with any key, encrypt with the newest), or
            ``lambda blob: new.encode(old.decode(blob))`` between two codecs.
        tables: the tables (or their options) the migrations built; the defaults if
            ``None``.
        batch: rows read and written per transaction.

    Returns:
        how many rows were rewritten, by ``"table.column"`` (the table without its
        prefix).

    Raises:
        ValueError: ``batch`` below 1, or a URL of another database.
        Whatever ``rewrite`` raises (a codec's ``UndecodableBlob`` for a blob no key
        decodes): the batches before it are kept, the one it was in is not written.
    """
    if batch < 1:
        raise ValueError(f"a batch is at least 1 row, not {batch}")
    chosen = TableOptions().define() if tables is None else tables
    defined = chosen.define() if isinstance(chosen, TableOptions) else chosen
    counts: dict[str, int] = {}
    with _engine(target) as engine:
        for table_name, column in BLOB_COLUMNS:
            table: sa.Table = getattr(defined, table_name)
            counts[f"{table_name}.{column}"] = _rewrite_column(
                engine, table, column, rewrite, batch
            )
    return counts


@contextmanager
def _engine(target: str | sa.URL | sa.Engine) -> Iterator[sa.Engine]:
    if isinstance(target, sa.Engine):
        yield target
        return
    try:
        engine = sa.create_engine(database_url(target))
    except ModuleNotFoundError as missing:  # psycopg: the postgres extra
        raise MissingExtra.of(missing) from missing
    try:
        yield engine
    finally:
        engine.dispose()


def _rewrite_column(
    engine: sa.Engine,
    table: sa.Table,
    column: str,
    rewrite: Callable[[bytes], bytes],
    batch: int,
) -> int:
    key, blob = table.c["id"], table.c[column]
    page = sa.select(key, blob).where(blob.is_not(None)).order_by(key).limit(batch)
    write = (
        table.update()
        .where(key == sa.bindparam("row_id"), blob == sa.bindparam("old"))
        .values({column: sa.bindparam("new")})
    )
    rewritten = 0
    after: Any = None
    while True:
        with engine.begin() as connection:
            query = page if after is None else page.where(key > after)
            rows = connection.execute(query).all()
        if not rows:
            return rewritten
        changes = [
            {"row_id": row_id, "old": old, "new": rewrite(bytes(old))} for row_id, old in rows
        ]
        with engine.begin() as connection:
            for change in changes:
                rewritten += connection.execute(write, change).rowcount
        if len(rows) < batch:
            return rewritten
        after = rows[-1][0]
