"""The statements of the durable executions' tables: charts, executions, saved
positions, input logs, step errors, child answers and fan-out ends, one text each.

:class:`ExecutionStatements` holds every statement of the SQL adapter
(:mod:`statifier.persistence.sql`) for one set of tables on one database, bound once
when it is made. The adapter's per-database modules run them on their driver's
connection (the hot path of every durable step: no work per call here) and decide
what a row means (records, codecs, errors).

Where the two databases truly differ, a capability of the :class:`Dialect` chooses:
row locks (:attr:`Dialect.row_locks`: an execution's row held ``FOR UPDATE`` inside a
block, a chart's row held between a retirement and a create), and the two writes of a step
in one statement (:attr:`Dialect.writes_in_with`); the metadata query asks the
dialect (:meth:`Dialect.json_has_sql`). A list of ids is one parameter
(:meth:`Dialect.among`, bound by :meth:`Dialect.listed`).

>>> from statifier.sql import TableOptions
>>> from statifier.sql.postgres import POSTGRES
>>> from statifier.sql.sqlite import SQLITE
>>> tables = TableOptions().define()
>>> s = ExecutionStatements(tables, POSTGRES, pinning=("running",))
>>> s.fetch_execution_locked.endswith("FOR UPDATE")
True
>>> s = ExecutionStatements(tables, SQLITE, pinning=("running",))
>>> s.fetch_execution_locked == s.fetch_execution, s.record_step
(True, None)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from statifier.sql.dialect import Dialect
from statifier.sql.keys import RowKeys
from statifier.sql.locks import locks_of
from statifier.sql.names import TableNames
from statifier.sql.tables import PARENT_METADATA_KEY, Tables

__all__ = [
    "ANSWER_COLUMNS",
    "CHART_COLUMNS",
    "ERROR_COLUMNS",
    "EXECUTION_COLUMNS",
    "ExecutionStatements",
]

# The columns of an execution record, in the order ExecutionRecord takes them.
EXECUTION_COLUMNS: Final = (
    "execution_id, content_hash, status, position_blob, metadata, outcome_blob, failure, "
    "created_at, updated_at, ended_at, error_count, last_error_at, final_state"
)
# The columns of an error record, in the order ErrorRecord takes them.
ERROR_COLUMNS: Final = "execution_id, seq, via, name, taken, error_blob, recorded_at"
# The columns of an answer record, in the order AnswerRecord takes them.
ANSWER_COLUMNS: Final = (
    "child_id, parent_id, invoke_id, content_hash, kind, answer_blob, failure, created_at, "
    "delivered_at"
)
CHART_COLUMNS: Final = "content_hash, chart_blob, name, version, saved_at, retired_at, retired_by"
_STEPPED: Final = (
    ("execution_id", "text"),
    ("status", "text"),
    ("position_blob", "bytea"),
    ("outcome_blob", "bytea"),
    ("failure", "text"),
    ("updated_at", "timestamptz"),
    ("ended_at", "timestamptz"),
    ("error_count", "integer"),
    ("last_error_at", "timestamptz"),
    ("final_state", "text"),
)
"""The columns a step writes (the key first) and their PostgreSQL types: the arrays of
``record_steps``, one per column."""


class ExecutionStatements:
    """The statements of one set of durable executions' tables on one database, each
    an attribute holding the text as the dialect's driver binds it.

    Args:
        tables: the tables the migrations built (names them, and says whether keys
            are made by the client: then every insert binds ``:id``, see ``keyed``).
        dialect: the database's dialect (``SqlAdapter.dialect``).
        pinning: the execution statuses that keep a chart from retiring (stored
            values); what a status means is the adapter's.
        waiting: the statuses of a parent whose owed answers ``undelivered`` leaves
            out (it takes none now; stored values).

    Parameters by statement (``:name``):

    - ``insert_chart``: the chart's columns; does nothing where the hash is stored.
      ``save_chart``: the chart's columns and ``h``; returns the stored row (``None``
      without :attr:`Dialect.writes_in_with`).
      ``fetch_chart``, ``lock_chart``, ``guard_chart``: ``h``. ``retire_chart``:
      ``h``, ``at``, ``by``.
    - ``insert_execution``: the execution's columns (``metadata`` a JSON document) and
      its ``bucket`` (:func:`~statifier.buckets.bucket_of`; its ``parent`` is taken from
      ``metadata``);
      returns a row only when it inserted. ``fetch_execution`` (and ``_locked``):
      ``id``. ``fetch_executions`` (and ``_locked``): ``ids``, a :meth:`Dialect.listed`
      list, rows in ``execution_id`` order. ``update_execution``: the columns a step
      changes and ``execution_id``; ``update_position`` (SQLite only, else ``None``):
      the same parameters, writing the position and the time of a row whose other
      columns already hold theirs (no row otherwise). ``rechart_execution``: ``id``,
      ``from``, ``to``, ``status``, ``position_blob``, ``failure``, ``updated_at``.
      ``count_executions``, ``pinning``, ``linked``: ``h``.
    - ``append_input``: ``execution_id``, ``via``, ``cap``, ``input_blob``,
      ``recorded_at``; returns the new ``seq``, or no row where the log is closed.
      ``record_step``: the parameters of both; ``None`` without
      :attr:`Dialect.writes_in_with`. ``record_steps`` (``None`` likewise, and where
      the client makes keys): ``cap``; per step, in order, ``ids``, ``vias``,
      ``blobs``, ``ats``; per execution, its last step's ``update_execution``
      parameters, each column an array named ``f_`` and the column
      (``f_execution_id``, ``f_status`` ...); returns the ids of the rows updated.
      ``inputs``: ``id``.
    - ``insert_error``: the error's columns. ``errors``: ``id``, ``limit``.
    - ``insert_answer``: the answer's columns. ``fetch_answer``: ``id``.
      ``undelivered``: ``limit``. ``mark_delivered``: ``ids``, ``at``.
    - ``take_fan_out_end``: ``parent``, ``invoke``, ``at``; returns a row only when it
      took it. ``fan_out_ended``: ``parent``, ``invoke``.
    - ``save_position``: the position's columns. ``fetch_position``,
      ``delete_position``: ``key``. ``count_positions``: ``h``.
    - ``prune``: ``before``, ``limit``; returns the pruned executions' ids.
      ``drop_logs``, ``drop_errors``: ``ids``.
    - ``lock_execution``: ``key``, the execution's
      :func:`~statifier.sql.dialect.execution_lock_key`; ``try_lock_execution``:
      ``key``, returns a row whose first column is true when the lock was granted
      (:class:`~statifier.sql.locks.Locks`); both ``None`` without
      :attr:`Dialect.row_locks`.
      ``claim_writer``: no parameters; ``None`` without :attr:`Dialect.single_writer`.
    - ``by_metadata`` (every column of :data:`EXECUTION_COLUMNS`),
      ``statuses_by_metadata`` (``execution_id, status``): ``metadata``, a JSON
      document whose every pair the executions' metadata holds;
      ``by_parent_metadata``, ``statuses_by_parent_metadata``: the same, and
      ``parent``, the pairs' parent (:meth:`metadata_query` chooses).
    """

    def __init__(
        self, tables: Tables, dialect: Dialect, pinning: Iterable[str], waiting: Iterable[str] = ()
    ) -> None:
        self.dialect = dialect
        t = TableNames.of(tables)
        self.executions = t.executions
        keys = RowKeys.of(tables, dialect)
        self.keyed = keys.keyed
        """``values`` for an insert, with the row's new key (``:id``) where the client
        makes keys (:meth:`RowKeys.keyed`)."""
        sql = dialect.statement
        # Row locks where the database has them; SQLite's single writer serializes
        # every writer instead, so there the locked forms read as the plain ones.
        for_update = " FOR UPDATE" if dialect.row_locks else ""
        self.insert_chart = sql(
            f"{keys.insert(t.charts, CHART_COLUMNS.split(', '))} "
            "ON CONFLICT (content_hash) DO NOTHING"
        )
        self.fetch_chart = sql(f"SELECT {CHART_COLUMNS} FROM {t.charts} WHERE content_hash = :h")
        # The save and the read of what is stored in one round trip where a WITH
        # clause can write: the row inserted, or else the row stored. A row another
        # transaction committed while the insert waited on it is not in this
        # statement's snapshot: then nothing comes back, and fetch_chart reads it.
        self.save_chart: str | None = None
        if dialect.writes_in_with:
            self.save_chart = sql(
                f"WITH saved AS ({keys.insert(t.charts, CHART_COLUMNS.split(', '))} "
                f"ON CONFLICT (content_hash) DO NOTHING RETURNING {CHART_COLUMNS}) "
                f"SELECT {CHART_COLUMNS} FROM saved UNION ALL SELECT {CHART_COLUMNS} "
                f"FROM {t.charts} WHERE content_hash = :h AND NOT EXISTS (SELECT 1 FROM saved)"
            )
        self.retire_chart = sql(
            f"UPDATE {t.charts} SET chart_blob = NULL, retired_at = :at, retired_by = :by "
            "WHERE content_hash = :h AND retired_at IS NULL"
        )
        # Retirement and create meet on the chart's row: a retirement holds it FOR
        # UPDATE from its count to its tombstone; a create holds it FOR KEY SHARE
        # (which creates do not contend on) until its transaction ends. On SQLite both
        # are writes, which the single writer already serializes; each reads the
        # chart's row inside its write transaction.
        self.lock_chart = sql(
            f"SELECT retired_at FROM {t.charts} WHERE content_hash = :h{for_update}"
        )
        key_share = " FOR KEY SHARE" if dialect.row_locks else ""
        self.guard_chart = sql(
            f"SELECT retired_at, retired_by FROM {t.charts} WHERE content_hash = :h{key_share}"
        )
        # The bucket is written beside the record's columns, never read back into it;
        # the parent too, taken from the metadata by the database.
        parent = dialect.json_text_sql(dialect.json("metadata"), PARENT_METADATA_KEY)
        metadata = {"metadata": dialect.json("metadata"), "parent": parent}
        inserted = (*EXECUTION_COLUMNS.split(", "), "bucket", "parent")
        self.insert_execution = sql(
            f"{keys.insert(t.executions, inserted, metadata)} "
            "ON CONFLICT (execution_id) DO NOTHING RETURNING 1"
        )
        fetch = f"SELECT {EXECUTION_COLUMNS} FROM {t.executions} WHERE execution_id = :id"
        self.fetch_execution = sql(fetch)
        # Inside a block the row lock too: it keeps out writers that bypass the
        # execution's lock; outside, it would cost a lock for nothing.
        self.fetch_execution_locked = sql(f"{fetch}{for_update}")
        fetch_many = (
            f"SELECT {EXECUTION_COLUMNS} FROM {t.executions} "
            f"WHERE execution_id {dialect.among('ids')} ORDER BY execution_id"
        )
        self.fetch_executions = sql(fetch_many)
        # In one order: two transactions locking overlapping sets cannot deadlock.
        self.fetch_executions_locked = sql(f"{fetch_many}{for_update}")
        update = (
            f"UPDATE {t.executions} SET status = :status, position_blob = :position_blob, "
            "outcome_blob = :outcome_blob, failure = :failure, updated_at = :updated_at, "
            "ended_at = :ended_at, error_count = :error_count, last_error_at = :last_error_at, "
            "final_state = :final_state WHERE execution_id = :execution_id"
        )
        self.update_execution = sql(update)
        # SQLite rewrites an index's entry whenever the update assigns one of its
        # columns, even to the value it holds: a page more in the commit per index.
        # Most steps change only the position and the time, neither indexed, so the
        # SQLite adapter first tries this, which matches only a row whose other
        # columns already hold the values given. (PostgreSQL compares the values and
        # keeps such an update on the row's page: it needs no second form.)
        self.update_position: str | None = None
        if dialect.name == "sqlite":
            self.update_position = sql(
                f"UPDATE {t.executions} SET position_blob = :position_blob, "
                "updated_at = :updated_at WHERE execution_id = :execution_id "
                "AND status = :status AND outcome_blob IS :outcome_blob "
                "AND failure IS :failure AND ended_at IS :ended_at "
                "AND error_count = :error_count AND last_error_at IS :last_error_at "
                "AND final_state IS :final_state"
            )
        self.rechart_execution = sql(
            f"UPDATE {t.executions} SET content_hash = :to, status = :status, "
            "position_blob = :position_blob, failure = :failure, updated_at = :updated_at "
            "WHERE execution_id = :id AND content_hash = :from"
        )
        self.count_executions = sql(
            f"SELECT status, count(*) FROM {t.executions} WHERE content_hash = :h GROUP BY status"
        )
        pins = ", ".join(f"'{status}'" for status in pinning)
        self.pinning = sql(
            f"SELECT execution_id FROM {t.executions} "
            f"WHERE content_hash = :h AND status IN ({pins})"
        )
        self.linked = sql(
            f"SELECT count(*) FROM {t.child_answers} AS a JOIN {t.executions} AS p "
            "ON p.execution_id = a.parent_id "
            f"WHERE a.content_hash = :h AND p.status IN ({pins})"
        )
        self.insert_answer = sql(
            f"{keys.insert(t.child_answers, ANSWER_COLUMNS.split(', '))} "
            "ON CONFLICT (child_id) DO NOTHING"
        )
        self.fetch_answer = sql(
            f"SELECT {ANSWER_COLUMNS} FROM {t.child_answers} WHERE child_id = :id"
        )
        # Answers to a waiting parent would come first for ever (oldest first) and hide
        # the rest from a redrive that takes the oldest few.
        waits = ", ".join(f"'{status}'" for status in waiting) or "NULL"
        self.undelivered = sql(
            f"SELECT {ANSWER_COLUMNS} FROM {t.child_answers} AS a WHERE delivered_at IS NULL "
            f"AND NOT EXISTS (SELECT 1 FROM {t.executions} AS p "
            f"WHERE p.execution_id = a.parent_id AND p.status IN ({waits})) "
            "ORDER BY created_at, child_id LIMIT :limit"
        )
        self.mark_delivered = sql(
            f"UPDATE {t.child_answers} SET delivered_at = :at "
            f"WHERE child_id {dialect.among('ids')} AND delivered_at IS NULL"
        )
        ending = {"parent_id": ":parent", "invoke_id": ":invoke", "ended_at": ":at"}
        self.take_fan_out_end = sql(
            f"{keys.insert(t.fan_out_ends, tuple(ending), ending)} "
            "ON CONFLICT (parent_id, invoke_id) DO NOTHING RETURNING 1"
        )
        self.fan_out_ended = sql(
            f"SELECT 1 FROM {t.fan_out_ends} WHERE parent_id = :parent AND invoke_id = :invoke"
        )
        position = ("key", "content_hash", "position_blob", "saved_at", "bucket")
        self.save_position = sql(
            f"{keys.insert(t.positions, position)} "
            "ON CONFLICT (key) DO UPDATE SET content_hash = excluded.content_hash, "
            "position_blob = excluded.position_blob, saved_at = excluded.saved_at"
        )
        self.fetch_position = sql(
            f"SELECT key, content_hash, position_blob, saved_at FROM {t.positions} WHERE key = :key"
        )
        self.delete_position = sql(f"DELETE FROM {t.positions} WHERE key = :key")
        self.count_positions = sql(f"SELECT count(*) FROM {t.positions} WHERE content_hash = :h")
        # One statement appends at the next seq: nothing when the log is closed (its
        # last entry is the marker), the marker when the entry takes the cap's last slot.
        entry = {
            "seq": "following.seq",
            "input_blob": "CASE WHEN CAST(:cap AS INTEGER) IS NOT NULL "
            "AND following.seq >= CAST(:cap AS INTEGER) - 1 THEN NULL ELSE :input_blob END",
        }
        inputs = ("execution_id", "seq", "via", "input_blob", "recorded_at")
        append = (
            f"{keys.insert(t.inputs, inputs, entry, select=True)} "
            "FROM (SELECT coalesce(max(seq), -1) + 1 AS seq "
            f"FROM {t.inputs} WHERE execution_id = :execution_id) AS following "
            f"WHERE NOT EXISTS (SELECT 1 FROM {t.inputs} AS last "
            "WHERE last.execution_id = :execution_id AND last.seq = following.seq - 1 "
            "AND last.input_blob IS NULL)"
        )
        self.append_input = sql(f"{append} RETURNING seq")
        # A step's two writes in one round trip: the row's update, and the log's
        # append only where the update found the row. Returns (rows updated, seq).
        # Without writes in WITH (SQLite, in process) they are two statements, the
        # update first, which cost no round trip.
        self.record_step: str | None = None
        if dialect.writes_in_with:
            self.record_step = sql(
                f"WITH stepped AS ({update} RETURNING 1), "
                f"logged AS ({append} AND EXISTS (SELECT 1 FROM stepped) RETURNING seq) "
                "SELECT (SELECT count(*) FROM stepped), (SELECT seq FROM logged)"
            )
        # Many steps' writes in one statement, from arrays (PostgreSQL): each
        # execution's row updated once, to its last step's columns (the ``f_``
        # arrays); every step's entry appended in the arrays' order, numbered on from
        # its log's last seq, none in a closed log, the marker in the cap's last slot.
        # Returns the ids of the rows updated. Where the client makes keys, each entry
        # needs one of its own: the steps are written one at a time.
        self.record_steps: str | None = None
        if dialect.writes_in_with and keys.new_key is None:
            cap = "CAST(:cap AS INTEGER)"
            final_arrays = ", ".join(f"CAST(:f_{name} AS {kind}[])" for name, kind in _STEPPED)
            final_names = ", ".join(name for name, _ in _STEPPED)
            final_set = ", ".join(f"{name} = f.{name}" for name, _ in _STEPPED[1:])
            self.record_steps = sql(
                "WITH s AS (SELECT * FROM unnest(CAST(:ids AS text[]), "
                "CAST(:vias AS text[]), CAST(:blobs AS bytea[]), "
                "CAST(:ats AS timestamptz[])) WITH ORDINALITY "
                "AS s(execution_id, via, input_blob, recorded_at, ord)), "
                f"f AS (SELECT * FROM unnest({final_arrays}) AS f({final_names})), "
                f"stepped AS (UPDATE {t.executions} AS e SET {final_set} FROM f "
                "WHERE e.execution_id = f.execution_id RETURNING e.execution_id), "
                "tops AS (SELECT stepped.execution_id, coalesce((SELECT max(seq) "
                f"FROM {t.inputs} WHERE execution_id = stepped.execution_id), -1) AS top "
                "FROM stepped), "
                "numbered AS (SELECT s.execution_id, s.via, s.input_blob, s.recorded_at, "
                "CAST(tops.top + row_number() OVER (PARTITION BY s.execution_id "
                "ORDER BY s.ord) AS INTEGER) AS seq FROM s JOIN tops "
                f"ON tops.execution_id = s.execution_id WHERE NOT EXISTS (SELECT 1 FROM "
                f"{t.inputs} AS last WHERE last.execution_id = tops.execution_id "
                "AND last.seq = tops.top AND last.input_blob IS NULL)), "
                f"logged AS (INSERT INTO {t.inputs} (execution_id, seq, via, input_blob, "
                f"recorded_at) SELECT execution_id, seq, via, CASE WHEN {cap} IS NOT NULL "
                f"AND seq >= {cap} - 1 THEN NULL ELSE input_blob END, recorded_at "
                f"FROM numbered WHERE {cap} IS NULL OR seq <= {cap} - 1) "
                "SELECT execution_id FROM stepped"
            )
        self.inputs = sql(
            f"SELECT execution_id, seq, via, input_blob, recorded_at FROM {t.inputs} "
            "WHERE execution_id = :id ORDER BY seq"
        )
        self.prune = sql(
            f"UPDATE {t.executions} SET position_blob = NULL WHERE id IN (SELECT id "
            f"FROM {t.executions} WHERE ended_at < :before AND position_blob IS NOT NULL "
            "ORDER BY ended_at, id LIMIT :limit) RETURNING execution_id"
        )
        self.drop_logs = sql(f"DELETE FROM {t.inputs} WHERE execution_id {dialect.among('ids')}")
        self.drop_errors = sql(
            f"DELETE FROM {t.step_errors} WHERE execution_id {dialect.among('ids')}"
        )
        self.insert_error = sql(keys.insert(t.step_errors, ERROR_COLUMNS.split(", ")))
        self.errors = sql(
            f"SELECT {ERROR_COLUMNS} FROM (SELECT id, {ERROR_COLUMNS} FROM {t.step_errors} "
            "WHERE execution_id = :id ORDER BY id DESC LIMIT :limit) AS newest ORDER BY id"
        )
        # An execution's own lock, held until the transaction ends (an ``exclusive``
        # block): taken, or only tried (returns whether it was granted). Without row
        # locks (SQLite) the single writer excludes every other writer instead, and a
        # transaction becomes that writer, in a caller's transaction already open, by a
        # write that touches no row.
        self.lock_execution: str | None = None
        self.try_lock_execution: str | None = None
        self.claim_writer: str | None = None
        locks = locks_of(tables, dialect)
        if locks is not None:
            self.lock_execution = locks.take_one
            self.try_lock_execution = locks.try_one
        if dialect.single_writer:
            self.claim_writer = sql(f"UPDATE {t.executions} SET status = status WHERE 0")
        # The executions whose metadata holds every pair asked, bound as one JSON
        # document: every column, or the id and the status.
        holds = dialect.json_has_sql(f"{t.executions}.metadata", "metadata")
        self.by_metadata = sql(f"SELECT {EXECUTION_COLUMNS} FROM {t.executions} WHERE {holds}")
        self.statuses_by_metadata = sql(
            f"SELECT execution_id, status FROM {t.executions} WHERE {holds}"
        )
        # The same, when the pairs name a parent: its column, indexed, narrows first.
        under = f"{t.executions}.parent = :parent AND {holds}"
        self.by_parent_metadata = sql(
            f"SELECT {EXECUTION_COLUMNS} FROM {t.executions} WHERE {under}"
        )
        self.statuses_by_parent_metadata = sql(
            f"SELECT execution_id, status FROM {t.executions} WHERE {under}"
        )

    def metadata_query(self, pairs: Mapping[str, str], *, statuses: bool) -> str:
        """The statement that reads the executions whose metadata holds every one of
        ``pairs``: ``statuses`` (``execution_id, status``) or every column; bind
        ``metadata`` (the pairs, one JSON document) and ``parent`` (the value of
        :data:`~statifier.sql.tables.PARENT_METADATA_KEY` among them, or ``None``)."""
        if PARENT_METADATA_KEY in pairs:
            return self.statuses_by_parent_metadata if statuses else self.by_parent_metadata
        return self.statuses_by_metadata if statuses else self.by_metadata
