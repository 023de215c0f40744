"""What the SQL adapter's statements are written against: the tables (defined with
SQLAlchemy Core in :mod:`statifier.sql.tables`, built by the Alembic migrations in
:mod:`statifier.sql.migrations` and named as SQL text spells them by
:mod:`statifier.sql.names`, all unchanged by this package), and the few rules every
dialect shares.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Final

from statifier.persistence.adapter import Capabilities
from statifier.persistence.records import (
    AnswerRecord,
    ChartRecord,
    ErrorRecord,
    ExecutionRecord,
    Status,
)
from statifier.sql.executions import (
    ANSWER_COLUMNS,
    ERROR_COLUMNS,
    EXECUTION_COLUMNS,
)
from statifier.sql.tables import TableOptions, Tables

__all__ = [
    "ANSWER_COLUMNS",
    "ERROR_COLUMNS",
    "EVERYTHING",
    "EXECUTION_COLUMNS",
    "PINNING",
    "STATUSES",
    "WAITING",
    "TableOptions",
    "Tables",
    "answer",
    "appended",
    "chart",
    "chosen_tables",
    "error",
    "error_values",
    "execution_record",
]

EVERYTHING: Final = Capabilities(
    lock=True, metadata=True, input_log=True, chart_retirement=True, answers=True, errors=True
)
STATUSES: Final = {status.value: status for status in Status}


def execution_record(
    row: Sequence[Any],
    time: Callable[[Any], datetime | None],
    metadata: Callable[[Any], Any],
) -> ExecutionRecord:
    """An execution row (its columns in ``EXECUTION_COLUMNS`` order) as a record; each
    dialect reads times and metadata its own way (``time``, ``metadata``)."""
    (
        execution_id,
        content_hash,
        status,
        position,
        stored_metadata,
        outcome,
        failure,
        created_at,
        updated_at,
        ended_at,
        error_count,
        last_error_at,
        final_state,
    ) = row
    return ExecutionRecord(
        execution_id,
        content_hash=content_hash,
        status=STATUSES.get(status) or Status(status),
        position=position,
        metadata=metadata(stored_metadata),
        outcome=outcome,
        failure=failure,
        created_at=time(created_at),
        updated_at=time(updated_at),
        ended_at=time(ended_at),
        error_count=error_count,
        last_error_at=None if last_error_at is None else time(last_error_at),
        final_state=final_state,
    )


def error_values(record: ErrorRecord, write_time: Callable[[datetime], Any]) -> dict[str, Any]:
    """The parameters of an error row's insert, by column name; each dialect writes
    times its own way (``write_time``)."""
    return {
        "execution_id": record.execution_id,
        "seq": record.seq,
        "via": record.via,
        "name": record.name,
        "taken": record.taken,
        "error_blob": record.error,
        "recorded_at": write_time(record.recorded_at),
    }


def error(row: Sequence[Any], read_time: Callable[[Any], datetime | None]) -> ErrorRecord:
    """An error record from a row of :data:`ERROR_COLUMNS`, times read by ``read_time``."""
    execution_id, seq, via, name, taken, blob, recorded = row
    recorded_at = read_time(recorded)
    assert recorded_at is not None  # the column is NOT NULL
    return ErrorRecord(
        execution_id,
        seq=seq,
        via=via,
        name=name,
        taken=bool(taken),
        error=bytes(blob),
        recorded_at=recorded_at,
    )


PINNING: Final = tuple(status.value for status in Status if status.pins)
WAITING: Final = tuple(status.value for status in Status if status.waits)


def chosen_tables(tables: Tables | TableOptions | None) -> Tables:
    """The tables an adapter is given, or their options, defined (the defaults if
    ``None``)."""
    if tables is None:
        return TableOptions().define()
    return tables.define() if isinstance(tables, TableOptions) else tables


def appended(rows: Sequence[Sequence[Any]], cap: int | None) -> int | None:
    """The ``seq`` an append returns: ``None`` when the log was closed (no row) or the
    entry became the closing marker."""
    if not rows:
        return None  # the log is closed
    seq = int(rows[0][0])
    return None if cap is not None and seq >= cap - 1 else seq  # the marker


def chart(row: Sequence[Any], read_time: Any) -> ChartRecord:
    """A chart record from a row of :data:`CHART_COLUMNS`, times read by ``read_time``."""
    content_hash, source, name, version, saved_at, retired_at, retired_by = row
    return ChartRecord(
        content_hash,
        source=source,
        name=name,
        version=version,
        saved_at=read_time(saved_at),
        retired_at=read_time(retired_at),
        retired_by=retired_by,
    )


def answer(row: Sequence[Any], read_time: Callable[[Any], datetime | None]) -> AnswerRecord:
    """An answer record from a row of :data:`ANSWER_COLUMNS`, times read by ``read_time``."""
    child_id, parent_id, invoke_id, content_hash, kind, blob, failure, created, delivered = row
    created_at = read_time(created)
    assert created_at is not None  # the column is NOT NULL
    return AnswerRecord(
        child_id,
        parent_id=parent_id,
        invoke_id=invoke_id,
        content_hash=content_hash,
        status=STATUSES.get(kind) or Status(kind),
        outcome=blob,
        failure=failure,
        created_at=created_at,
        delivered_at=read_time(delivered),
    )
