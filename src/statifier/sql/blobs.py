"""Rewriting every stored blob: what retires an old key.

A blob codec (``statifier.persistence.codec``) encodes the blob columns of durable
executions and of the fronts' dead letters (:data:`BLOB_COLUMNS`), and seals the JSON
documents the router and the fronts keep of events not yet handled: pending timers,
outbox rows, inbound events (:data:`SEALED_DOCUMENTS`). A position is written again on
every step, but a chart's source is written once, and input-log entries, outcomes and
saved positions of executions that no longer step stay as they were, as do the rows
still waiting: before a key is dropped, what it encoded must be encoded again under the
newest one. :func:`rewrite_blobs` does that, in batches, while the executions run.

Each batch is read in one short transaction, rewritten outside any (a codec's work holds
no lock), and written back in a second one, row by row. A blob is written only where the
column still holds the bytes that were read: a step that stored a newer position in
between keeps it (written by the new codec already), and is not counted. A sealed
document is written once, when its row is inserted, so it is written back by its key
alone (a row taken off its queue meanwhile is not counted); a plain document is left
as it is.

>>> import os, tempfile
>>> from statifier.sql import migrations
>>> url = f"sqlite:///{os.path.join(tempfile.mkdtemp(), 'blobs.db')}"
>>> migrations.upgrade(url)
>>> rewrite_blobs(url, lambda blob: blob[::-1])
{'charts.chart_blob': 0, 'positions.position_blob': 0, 'executions.position_blob': 0, \
'executions.outcome_blob': 0, 'inputs.input_blob': 0, 'consumer_dead_letters.raw': 0, \
'timers.payload': 0, 'outbox.payload.event': 0, 'inbound_events.data': 0}
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

import sqlalchemy as sa

from statifier.extras import MissingExtra
from statifier.sealed import sealed_blob, sealed_document
from statifier.sql.engines import database_url, new_engine
from statifier.sql.tables import TableOptions, Tables

__all__ = ["BLOB_COLUMNS", "SEALED_DOCUMENTS", "rewrite_blobs"]

BLOB_COLUMNS: Final = (
    ("charts", "chart_blob"),
    ("positions", "position_blob"),
    ("executions", "position_blob"),
    ("executions", "outcome_blob"),
    ("inputs", "input_blob"),
    ("consumer_dead_letters", "raw"),
)
"""``(table, column)`` of every blob a codec encodes."""

SEALED_DOCUMENTS: Final = (
    ("timers", "payload", None),
    ("outbox", "payload", "event"),
    ("inbound_events", "data", None),
)
"""``(table, column, field)`` of every JSON document a codec seals: the column itself,
or, with a ``field``, the JSON text under that key of the column's document. Every
other column stays plain."""


def rewrite_blobs(
    target: str | sa.URL | sa.Engine,
    rewrite: Callable[[bytes], bytes],
    tables: Tables | TableOptions | None = None,
    *,
    batch: int = 500,
) -> dict[str, int]:
    """Replace every non-null blob of :data:`BLOB_COLUMNS` by ``rewrite(blob)``, and
    the encoded blob of every sealed document of :data:`SEALED_DOCUMENTS` likewise.

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
        prefix; ``"table.column.field"`` for a document's field).

    Raises:
        ValueError: ``batch`` below 1, a URL of another database, or a sealed
            document with no base64 blob (altered in the database).
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
        for table_name, column, field in SEALED_DOCUMENTS:
            table = getattr(defined, table_name)
            name = f"{table_name}.{column}" if field is None else f"{table_name}.{column}.{field}"
            counts[name] = _reseal_column(engine, table, column, field, rewrite, batch)
    return counts


@contextmanager
def _engine(target: str | sa.URL | sa.Engine) -> Iterator[sa.Engine]:
    if isinstance(target, sa.Engine):
        yield target
        return
    try:
        engine = new_engine(database_url(target))
    except ModuleNotFoundError as missing:  # psycopg: the postgres extra
        raise MissingExtra.of(missing) from missing
    try:
        yield engine
    finally:
        engine.dispose()


Change = Callable[[Any], dict[str, Any] | None]
"""The write for one row's stored value: the update's parameters beside ``row_id``, or
``None`` to leave the row as it is."""


def _rewrite_column(
    engine: sa.Engine,
    table: sa.Table,
    column: str,
    rewrite: Callable[[bytes], bytes],
    batch: int,
) -> int:
    blob = table.c[column]
    write = (
        table.update()
        .where(table.c["id"] == sa.bindparam("row_id"), blob == sa.bindparam("old"))
        .values({column: sa.bindparam("new")})
    )
    return _sweep(
        engine,
        table,
        blob,
        lambda old: {"old": old, "new": rewrite(bytes(old))},
        write,
        batch,
        blob.is_not(None),
    )


def _reseal_column(
    engine: sa.Engine,
    table: sa.Table,
    column: str,
    field: str | None,
    rewrite: Callable[[bytes], bytes],
    batch: int,
) -> int:
    def change(stored: Any) -> dict[str, Any] | None:
        new = _resealed(stored, field, rewrite)
        return None if new is None else {"new": new}

    write = (
        table.update()
        .where(table.c["id"] == sa.bindparam("row_id"))
        .values({column: sa.bindparam("new")})
    )
    return _sweep(engine, table, table.c[column], change, write, batch)


def _sweep(
    engine: sa.Engine,
    table: sa.Table,
    value: sa.Column[Any],
    change: Change,
    write: sa.Update,
    batch: int,
    *where: sa.ColumnElement[bool],
) -> int:
    """Read ``table``'s rows in key order, ``batch`` at a time, each batch in a short
    transaction; compute each row's change outside any; write the changes in a second
    transaction. Returns how many rows the writes reached."""
    key = table.c["id"]
    page = sa.select(key, value).where(*where).order_by(key).limit(batch)
    rewritten = 0
    after: Any = None
    while True:
        with engine.begin() as connection:
            query = page if after is None else page.where(key > after)
            rows = connection.execute(query).all()
        if not rows:
            return rewritten
        changes = []
        for row_id, stored in rows:
            found = change(stored)
            if found is not None:
                changes.append({"row_id": row_id, **found})
        if changes:
            with engine.begin() as connection:
                for one in changes:
                    rewritten += connection.execute(write, one).rowcount
        if len(rows) < batch:
            return rewritten
        after = rows[-1][0]


def _resealed(stored: Any, field: str | None, rewrite: Callable[[bytes], bytes]) -> Any | None:
    """The column's new document, or ``None`` when what it holds is plain."""
    document = stored if field is None else stored[field]
    parsed = json.loads(document) if isinstance(document, (str, bytes)) else document
    blob = sealed_blob(parsed)
    if blob is None:
        return None
    new = sealed_document(rewrite(blob))
    return new if field is None else {**stored, field: json.dumps(new)}
