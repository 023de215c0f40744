"""The front door to durable executions: one object built from a database URL and
charts, with ``create``, ``send``, ``describe``, ``list`` and ``cancel``.

:class:`Durable` opens the SQL adapter (:mod:`statifier.persistence.sql`), checks that
the tables are migrated (or migrates them when asked), compiles the charts it is given
by name, and answers plain frozen values: :class:`Description`, :class:`Sent`,
:class:`Cancelled`, :class:`ExecutionSummary`. Underneath it is the lifecycle of
:mod:`statifier.persistence` (:class:`~statifier.persistence.Executions` over a
:class:`~statifier.persistence.Storage`), reachable as :attr:`Durable.executions`. See
``docs/durable.md``.

>>> import asyncio, os, tempfile
>>> door = (
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">'
...     '<state id="open"><transition event="close" target="closed"/></state>'
...     '<final id="closed"/></scxml>'
... )
>>> url = f"sqlite:///{os.path.join(tempfile.mkdtemp(), 'app.db')}"
>>> async def main():
...     async with Durable(url, charts={"door": door}, migrate=True) as durable:
...         await durable.create("door", "door_1")
...         sent = await durable.send("door_1", "close")
...         return sent.status.value, (await durable.describe("door_1")).final_state
>>> asyncio.run(main())
('completed', 'closed')

This module sits above :mod:`statifier.persistence` and beside :mod:`statifier.router`
(it imports neither the router nor the command line). SQLAlchemy, Alembic and the
database drivers are imported when a :class:`Durable` opens, not on import.
"""

from __future__ import annotations

import asyncio
import builtins
import difflib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

from statifier.chart import InvalidChart, Machine, compile_chart
from statifier.core import Event, MachineState, StartOptions
from statifier.expr import UNDEFINED, Function, Value, tagged
from statifier.ids import new_execution_id
from statifier.persistence import (
    Discarded,
    ExecutionExists,
    ExecutionNotFound,
    ExecutionRecord,
    Executions,
    Executor,
    LockTimeout,
    LoggedInput,
    PersistenceError,
    Status,
    Storage,
    decode_outcome,
)

if TYPE_CHECKING:
    from statifier.persistence.adapter import Adapter
    from statifier.sql import TableOptions

__all__ = [
    "CHART_KEY",
    "Cancelled",
    "ChartSource",
    "ChartUnusable",
    "Description",
    "Durable",
    "DurableError",
    "ExecutionExists",
    "ExecutionNotFound",
    "ExecutionSummary",
    "LockTimeout",
    "LoggedInput",
    "NotMigrated",
    "Position",
    "Sent",
    "Status",
    "UnknownChart",
    "new_execution_id",
]

CHART_KEY: Final = "statifier.chart"
"""The metadata key under which :meth:`Durable.create` files the name of the chart an
execution runs (as the driver files a child's parent under ``statifier.parent``)."""

ChartSource: TypeAlias = "Machine | bytes | str | os.PathLike[str]"
"""A chart as :class:`Durable` takes it: a compiled :class:`~statifier.chart.Machine`,
SCXML source (``bytes``, or a ``str`` whose first non-blank character is ``<``), or
the path of an SCXML file (any other ``str``, or a path object)."""

Position: TypeAlias = Literal["kept", "pruned", "chart_gone"]
"""Whether an execution's stored position could be read: ``"kept"``; ``"pruned"``
(:func:`statifier.persistence.prune` cleared it); ``"chart_gone"`` (its chart was
retired, or its stored source no longer compiles)."""

_MIGRATIONS: Final = "statifier.sql:migrations"
_MIGRATION_LOCK: Final = "statifier.migrations"
_MIGRATION_WAIT: Final = 60.0  # seconds a migrating process waits for another one


# Errors.


class DurableError(Exception):
    """Something the front door refuses; nothing was changed."""


class UnknownChart(DurableError, LookupError):  # noqa: N818 - names the refusal
    """No chart was given under this name; ``known`` lists those that were."""

    def __init__(self, name: str, known: builtins.list[str]) -> None:
        names = ", ".join(known) if known else "none (pass charts={name: chart})"
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        super().__init__(f"no chart named {name!r}{hint}; the charts are: {names}")
        self.name = name
        self.known = known


class ChartUnusable(DurableError, ValueError):  # noqa: N818
    """A chart given to :class:`Durable` cannot be read or does not compile; the
    message names the chart, where it came from, and every problem."""

    def __init__(self, name: str, origin: str, why: str) -> None:
        super().__init__(f"chart {name!r} ({origin}): {why}")
        self.name = name
        self.origin = origin


class NotMigrated(DurableError):  # noqa: N818
    """The database has no tables for durable executions, or not at the revision this
    version of statifier needs; the message says what to run.

    Attributes:
        revision: the revision the tables are at (``None``: no tables).
        head: the revision this version needs.
        finding: what is wrong, in one clause (``the database ... has no tables ...``).
        upgrade: the command that fixes it (``statifier db upgrade --url ...``).
    """

    def __init__(self, where: str, how: str, revision: str | None, head: str) -> None:
        if revision is None:
            state = "has no tables for durable executions"
        elif revision in _revisions():
            state = f"has its tables at revision {revision}, this statifier needs {head}"
        else:
            state = (
                f"has its tables at revision {revision}, which this statifier does not "
                f"know (it needs {head}; a newer statifier migrated them?)"
            )
        self.finding = f"the database {where} {state}"
        self.upgrade = f"statifier db upgrade {how}"
        super().__init__(f"{self.finding}: run `{self.upgrade}`, or pass migrate=True")
        self.revision = revision
        self.head = head


# Values answered.


@dataclass(frozen=True, slots=True)
class Description:
    """One execution as stored, in the user's words.

    Attributes:
        id: the execution id.
        chart: the name it was created under (``None`` for an execution created
            elsewhere, whose chart is none of those given).
        content_hash: the chart it runs for its whole life.
        status: a :class:`~statifier.persistence.Status`.
        configuration: the sorted ids of its active leaf states: where it is, or where
            it stopped when it failed without reaching a final state; ``()`` once it
            reached a final state or was cancelled.
        final_state: the id of the top-level ``<final>`` it ended in, else ``None``.
        outcome: its donedata, or ``{"reason": ...}`` for a failure; undefined while it
            runs and after a cancel.
        failure: ``"failed_final"``, ``"round_budget"`` or the host's reason; ``None``
            unless it failed.
        metadata: the host's identities given at create (without :data:`CHART_KEY`).
        inputs: the input log, decoded: every event it took, in order.
        timers: its pending timers: always ``()``, since statifier keeps none yet (a
            delayed ``<send>`` reaches the executor as ``SendDelayed``).
        position: whether the stored position could be read (see :data:`Position`);
            when not, ``configuration`` is ``()`` and ``final_state`` ``None``.
        created_at, updated_at, ended_at: timezone-aware UTC times; ``ended_at`` is
            ``None`` until it ends.
    """

    id: str
    chart: str | None
    content_hash: str
    status: Status
    configuration: tuple[str, ...]
    final_state: str | None
    outcome: Value
    failure: str | None
    metadata: Mapping[str, str]
    inputs: tuple[LoggedInput, ...]
    timers: tuple[()]
    position: Position
    created_at: datetime | None
    updated_at: datetime | None
    ended_at: datetime | None

    @property
    def finished(self) -> bool:
        """Whether it has ended (completed, failed or cancelled)."""
        return self.status.terminal

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict: values in the tagged encoding
        (:mod:`statifier.expr.tagged`, undefined as ``{"$type": "undefined"}``), times in
        ISO 8601."""
        return {
            "id": self.id,
            "chart": self.chart,
            "content_hash": self.content_hash,
            "status": self.status.value,
            "configuration": list(self.configuration),
            "final_state": self.final_state,
            "outcome": tagged.encode(self.outcome),
            "failure": self.failure,
            "metadata": dict(self.metadata),
            "inputs": [_input_json(entry) for entry in self.inputs],
            "timers": [],
            "position": self.position,
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
            "ended_at": _iso(self.ended_at),
        }


@dataclass(frozen=True, slots=True)
class Sent:
    """What one :meth:`Durable.send` did.

    Attributes:
        execution_id: the execution.
        event: the event's name.
        delivered: whether the chart ran the event; ``False`` when the execution does
            not take events (it has ended, or is parked): then nothing ran and nothing
            was recorded, and ``status`` says why.
        matched: whether a transition took the event (``False`` when it was discarded,
            or ran and no transition took it: it is in the input log, unused).
        finished: whether this send ended the execution.
        status: the status after the call.
        configuration, final_state, outcome, failure: as in :class:`Description`,
            after the call.
    """

    execution_id: str
    event: str
    delivered: bool
    matched: bool
    finished: bool
    status: Status
    configuration: tuple[str, ...]
    final_state: str | None
    outcome: Value = UNDEFINED
    failure: str | None = None

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict (values in the tagged encoding)."""
        return {
            "execution_id": self.execution_id,
            "event": self.event,
            "delivered": self.delivered,
            "matched": self.matched,
            "finished": self.finished,
            "status": self.status.value,
            "configuration": list(self.configuration),
            "final_state": self.final_state,
            "outcome": tagged.encode(self.outcome),
            "failure": self.failure,
        }


@dataclass(frozen=True, slots=True)
class Cancelled:
    """What one :meth:`Durable.cancel` did: ``cancelled`` is ``False`` when the
    execution had already ended (nothing changed); ``status`` is its status after."""

    execution_id: str
    cancelled: bool
    status: Status


@dataclass(frozen=True, slots=True)
class ExecutionSummary:
    """One row of :meth:`Durable.list`: what the record says, without loading the
    position or the input log."""

    id: str
    chart: str | None
    status: Status
    failure: str | None
    metadata: Mapping[str, str] = field(default_factory=dict)
    created_at: datetime | None = None
    updated_at: datetime | None = None
    ended_at: datetime | None = None

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "id": self.id,
            "chart": self.chart,
            "status": self.status.value,
            "failure": self.failure,
            "metadata": dict(self.metadata),
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
            "ended_at": _iso(self.ended_at),
        }


# The front door.


class Durable:
    """Durable executions in one database, of charts known by name.

    Use it as ``async with Durable(url, charts=...) as durable:``, or call
    :meth:`open` and :meth:`close`.

    Args:
        database: a database URL (``sqlite:///app.db``, ``postgresql://...``; the
            extras ``sqlite`` and ``postgres``), or an adapter you opened (a
            :class:`~statifier.persistence.MemoryAdapter`, or a ``SqlAdapter``): yours
            to close, and never checked nor migrated.
        charts: the charts executions are created from, by name: a mapping of names to
            :data:`ChartSource` values, or a directory, whose ``*.scxml`` files are named
            by their stem. Compiled at construction. Sending to, describing and
            cancelling an execution use the chart stored with it, so they need none.
        tables: the :class:`~statifier.sql.TableOptions` (prefix, schema) the tables
            were migrated under; the defaults if ``None``.
        migrate: run the migrations when opening (under a lock, so processes opening
            together do not race). By default the tables are only checked: a database
            that lacks them raises :class:`NotMigrated` naming ``statifier db upgrade``.
        executor: receives every effect of every call (see
            :class:`~statifier.persistence.Executor`); by default effects are dropped.
        lock_wait: the most seconds a call waits for an execution's lock
            (:class:`~statifier.persistence.LockTimeout`); ``None``: the adapter's
            default (on SQLite its busy timeout, 5 seconds unless the URL says).
        loader: reads ``<data src>`` and ``<script src>`` when a chart is compiled.
        functions: host expression functions the charts' conditions, values and scripts
            may call (:class:`~statifier.expr.Function` by name; see
            ``compile_chart(functions=...)``): pure, and the same in every process that
            opens the database, since a stored chart is compiled again with them.
        input_log_cap: the most entries one input log keeps (see
            :class:`~statifier.persistence.Storage`).

    Raises:
        UnknownChart, ChartUnusable: at construction, for the charts given.
    """

    def __init__(
        self,
        database: str | Adapter,
        *,
        charts: Mapping[str, ChartSource] | str | os.PathLike[str] | None = None,
        tables: TableOptions | None = None,
        migrate: bool = False,
        executor: Executor | None = None,
        lock_wait: float | None = None,
        loader: Callable[[str], str] | None = None,
        functions: Mapping[str, Function] | None = None,
        input_log_cap: int | None = None,
    ) -> None:
        if not isinstance(migrate, bool):
            raise TypeError(f"migrate is True or False, not {migrate!r}")
        self._database = database
        self._tables = tables
        self._migrate = migrate
        self._executor = executor
        self._lock_wait = lock_wait
        self._loader = loader
        self._functions = dict(functions or {})
        self._input_log_cap = input_log_cap
        self._charts = _compiled(charts, loader, self._functions)
        self._names = {machine.identity.content_hash: n for n, machine in self._charts.items()}
        self._executions: Executions | None = None
        self._owned: Adapter | None = None

    def __repr__(self) -> str:
        where = _redacted(self._database) if isinstance(self._database, str) else "an adapter"
        return f"Durable({where}, charts={sorted(self._charts)})"

    @property
    def charts(self) -> Mapping[str, Machine]:
        """The compiled charts, by name."""
        return dict(self._charts)

    @property
    def executions(self) -> Executions:
        """The lifecycle underneath, for what the front door does not offer (``fail``,
        ``park``, ``retire_chart``...).

        Raises:
            RuntimeError: not open.
        """
        if self._executions is None:
            raise RuntimeError("open the Durable first: async with Durable(...) as durable")
        return self._executions

    async def open(self) -> Durable:
        """Open the database: check the tables (or migrate them), then the adapter.

        Raises:
            NotMigrated: the tables are missing or at another revision (``migrate``
                unset).
            ValueError: the URL is not a PostgreSQL or SQLite one, or is an in-memory
                SQLite database (it would last one connection).
            statifier.extras.MissingExtra: the database's driver is not installed.
        """
        if self._executions is not None:
            return self
        database = self._database
        if isinstance(database, str):
            from statifier.persistence.sql import SqlAdapter

            options = _options(self._tables)
            await asyncio.to_thread(_prepare, database, options, self._migrate)
            adapter: Adapter = SqlAdapter(database, options)
            self._owned = adapter
        else:
            adapter = database
        storage = Storage(
            adapter,
            input_log_cap=self._input_log_cap,
            loader=self._loader,
            functions=self._functions,
        )
        if self._executor is None:
            self._executions = Executions(storage, lock_wait=self._lock_wait)
        else:
            self._executions = Executions(
                storage, executor=self._executor, lock_wait=self._lock_wait
            )
        return self

    async def close(self) -> None:
        """Close the adapter it opened (an adapter given stays open)."""
        owned, self._owned, self._executions = self._owned, None, None
        if owned is not None:
            close = getattr(owned, "close", None)
            if close is not None:
                await close()

    async def __aenter__(self) -> Durable:
        return await self.open()

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    def chart(self, name: str) -> Machine:
        """The chart given under ``name``.

        Raises:
            UnknownChart: no chart has that name (the message suggests a close one).
        """
        machine = self._charts.get(_text(name, "a chart name"))
        if machine is None:
            raise UnknownChart(name, sorted(self._charts))
        return machine

    async def create(
        self,
        chart: str,
        execution_id: str | None = None,
        *,
        data: Mapping[str, Value] | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> Description:
        """Start a new execution of the chart named ``chart``.

        Args:
            execution_id: the id; a fresh :func:`new_execution_id` if ``None``.
            data: initial datamodel values, overriding the chart's ``<data>`` of the
                same top-level name (their expressions are then not evaluated).
            metadata: host identities (strings to strings, never personal data),
                filed once and listed by :meth:`list`; keys starting with
                ``statifier.`` are statifier's own.

        Returns:
            the new execution's :class:`Description` (``id`` holds the id).

        Raises:
            UnknownChart: no chart has that name.
            ExecutionExists: the id is taken.
        """
        machine = self.chart(chart)
        if execution_id is None:
            execution_id = new_execution_id()
        _text(execution_id, "an execution id")
        pairs = dict(metadata or {})
        for key in pairs:
            if str(key).startswith("statifier."):
                raise ValueError(
                    f"metadata key {key!r}: keys starting with 'statifier.' are statifier's own"
                )
        executions = self.executions
        if executions.storage.capabilities.metadata:
            pairs[CHART_KEY] = chart
        options = None
        if data is not None:
            options = StartOptions(datamodel=_datamodel(data))
        stepped = await executions.create(execution_id, machine, options=options, metadata=pairs)
        return self._described(stepped.execution, stepped.state, "kept", ())

    async def send(self, execution_id: str, event: str, data: Value = UNDEFINED) -> Sent:
        """Step one external event into the execution.

        Args:
            event: the event's name.
            data: the event's data (``_event.data``); omitted, the event carries none
                (undefined), while ``None`` sends null.

        Returns:
            a :class:`Sent`. An execution that has ended, or is parked, discards the
            event: ``delivered`` is ``False`` and nothing is recorded; it never raises
            for that.

        Raises:
            ExecutionNotFound: no such execution.
            LockTimeout: another call held it longer than ``lock_wait``.
        """
        _text(event, "an event name")
        answer = await self.executions.step(execution_id, None, Event(event, data=data))
        if isinstance(answer, Discarded):
            record = answer.execution
            state, _ = await self._state(record)
            return Sent(
                record.id,
                event,
                False,
                False,
                False,
                record.status,
                _configuration(state),
                _final_state(state),
                decode_outcome(record),
                record.failure,
            )
        record, state = answer.execution, answer.state
        return Sent(
            record.id,
            event,
            True,
            state.microstep > 0,
            answer.finished,
            record.status,
            _configuration(state),
            _final_state(state),
            decode_outcome(record),
            record.failure,
        )

    async def describe(self, execution_id: str) -> Description:
        """The execution as stored: status, configuration or final state, outcome,
        inputs, timers.

        Raises:
            ExecutionNotFound: no such execution.
        """
        executions = self.executions
        record = await executions.storage.fetch_execution(execution_id)
        state, position = await self._state(record)
        inputs = tuple(await executions.inputs(execution_id))
        return self._described(record, state, position, inputs)

    async def list(
        self,
        status: Status | str | None = None,
        *,
        chart: str | None = None,
        **metadata: str,
    ) -> tuple[ExecutionSummary, ...]:
        """The executions, oldest first, optionally only those in ``status``, of the
        chart named ``chart``, and whose metadata holds every pair given.

        The status is filtered after the metadata, so a call with no pairs reads every
        execution of the database.

        Raises:
            ValueError: an unknown status.
        """
        wanted = None if status is None else _status(status)
        pairs = dict(metadata)
        if chart is not None:
            pairs[CHART_KEY] = chart
        records = await self.executions.storage.list_executions(**pairs)
        chosen = [r for r in records if wanted is None or r.status is wanted]
        chosen.sort(key=lambda r: (r.created_at is None, r.created_at, r.id))
        return tuple(
            ExecutionSummary(
                r.id,
                self._chart_name(r),
                r.status,
                r.failure,
                _host_metadata(r),
                r.created_at,
                r.updated_at,
                r.ended_at,
            )
            for r in chosen
        )

    async def cancel(self, execution_id: str) -> Cancelled:
        """Stop the execution from outside: its active states are exited (their onexit
        content runs through the executor) and the durable children it started are
        cancelled too. An execution that has ended is left as it is
        (``cancelled`` ``False``).

        Raises:
            ExecutionNotFound: no such execution.
        """
        answer = await self.executions.cancel(execution_id)
        record = answer.execution
        return Cancelled(record.id, not isinstance(answer, Discarded), record.status)

    # Helpers.

    async def _state(self, record: ExecutionRecord) -> tuple[MachineState | None, Position]:
        if record.position is None:
            return None, "pruned"
        storage = self.executions.storage
        try:
            machine = await storage.machine(record.content_hash)
        except PersistenceError:  # retired, or the stored source no longer compiles
            return None, "chart_gone"
        return storage.load(record, machine), "kept"

    def _chart_name(self, record: ExecutionRecord) -> str | None:
        return record.metadata.get(CHART_KEY) or self._names.get(record.content_hash)

    def _described(
        self,
        record: ExecutionRecord,
        state: MachineState | None,
        position: Position,
        inputs: tuple[LoggedInput, ...],
    ) -> Description:
        return Description(
            record.id,
            self._chart_name(record),
            record.content_hash,
            record.status,
            _configuration(state),
            _final_state(state),
            decode_outcome(record),
            record.failure,
            _host_metadata(record),
            inputs,
            (),
            position,
            record.created_at,
            record.updated_at,
            record.ended_at,
        )


# Reading positions.


def _configuration(state: MachineState | None) -> tuple[str, ...]:
    return () if state is None else state.leaf_configuration()


def _final_state(state: MachineState | None) -> str | None:
    """The top-level ``<final>`` a finished chart ended in, read off the position.

    A chart ends the moment it enters a top-level final, so at most one is ever
    entered, and the position keeps every state ever entered (``entered``): the final
    it holds is the one the finishing step's ``Done`` named. A cancelled chart entered
    none."""
    if state is None or state.running:
        return None
    states = state.machine.states
    for index in sorted(state.entered):
        node = states[index]
        if node.kind == "final" and node.parent == 0 and index != 0:
            return node.id
    return None


def _text(value: object, what: str) -> str:
    """``value`` if it is a non-blank str (untyped callers pass anything)."""
    if not isinstance(value, str) or not value.strip():
        raise TypeError(f"{what} is a non-empty str, not {value!r}")
    return value


def _datamodel(data: object) -> dict[str, Value]:
    if not isinstance(data, Mapping) or not all(isinstance(key, str) for key in data):
        raise TypeError(f"data maps variable names to values, not {data!r}")
    return dict(data)


def _host_metadata(record: ExecutionRecord) -> dict[str, str]:
    return {key: value for key, value in record.metadata.items() if key != CHART_KEY}


def _status(status: Status | str) -> Status:
    if isinstance(status, Status):
        return status
    try:
        return Status(status)
    except ValueError:
        known = ", ".join(s.value for s in Status)
        raise ValueError(f"unknown status {status!r}; the statuses are {known}") from None


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _input_json(entry: LoggedInput) -> dict[str, Any]:
    event = entry.event
    return {
        "seq": entry.seq,
        "door": entry.door,
        "event": None if event is None else event.name,
        "data": None if event is None else tagged.encode(event.data),
        "recorded_at": _iso(entry.recorded_at),
    }


# Charts.


def _compiled(
    charts: Mapping[str, ChartSource] | str | os.PathLike[str] | None,
    loader: Callable[[str], str] | None,
    functions: Mapping[str, Function],
) -> dict[str, Machine]:
    if charts is None:
        return {}
    if isinstance(charts, (str, os.PathLike)):
        directory = Path(charts)
        if not directory.is_dir():
            raise ChartUnusable("*", str(directory), "not a directory of *.scxml files")
        files = sorted(directory.glob("*.scxml"))
        return {path.stem: _compile(path.stem, path, loader, functions) for path in files}
    if not isinstance(charts, Mapping):
        raise TypeError(f"charts maps names to charts, or is a directory, not {charts!r}")
    compiled = {}
    for name, source in charts.items():
        compiled[_text(name, "a chart name")] = _compile(name, source, loader, functions)
    return compiled


def _compile(
    name: str,
    source: ChartSource,
    loader: Callable[[str], str] | None,
    functions: Mapping[str, Function],
) -> Machine:
    if isinstance(source, Machine):
        return source
    origin = "source"
    if isinstance(source, str) and not source.lstrip().startswith("<"):
        source = Path(source)
    if isinstance(source, os.PathLike):
        origin = os.fspath(source)
        try:
            source = Path(source).read_bytes()
        except OSError as error:
            raise ChartUnusable(name, origin, f"cannot read: {error.strerror}") from None
    if not isinstance(source, (bytes, str)):
        raise TypeError(f"chart {name!r} is a Machine, SCXML source or a path, not {source!r}")
    try:
        return compile_chart(source, name=name, loader=loader, functions=functions)
    except InvalidChart as invalid:
        problems = "; ".join(str(problem) for problem in invalid.problems)
        raise ChartUnusable(name, origin, problems) from None


# Opening the database (run in a thread: the migrations are synchronous).


@cache
def _revisions() -> tuple[str, ...]:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", _MIGRATIONS)
    script = ScriptDirectory.from_config(config)
    return tuple(revision.revision for revision in script.walk_revisions())


@cache
def _head() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", _MIGRATIONS)
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


def _options(tables: TableOptions | None) -> TableOptions:
    from statifier.sql import TableOptions

    if tables is None:
        return TableOptions()
    if not isinstance(tables, TableOptions):
        raise TypeError(f"tables is a statifier.sql.TableOptions, not {tables!r}")
    return tables


def _redacted(url: str) -> str:
    """The URL with its password hidden (``postgresql://user:***@host/db``)."""
    return re.sub(r"^([a-z][a-z0-9+.-]*://[^:/@]*):[^@]*@", r"\1:***@", url)


def _upgrade_command(url: str, options: TableOptions) -> str:
    from statifier.sql import DEFAULT_PREFIX

    parts = [f"--url {_redacted(url)}"]
    if options.prefix != DEFAULT_PREFIX:
        parts.append(f"--prefix {options.prefix}")
    if options.schema is not None:
        parts.append(f"--schema {options.schema}")
    return " ".join(parts)


def _prepare(url: str, options: TableOptions, migrate: bool) -> None:
    """Check the tables of ``options`` are at the head revision, or migrate them."""
    from statifier.sql import migrations
    from statifier.sql.engines import database_url

    try:
        parsed = database_url(url)
    except ValueError:
        raise ValueError(f"durable executions run on PostgreSQL or SQLite, not {url!r}") from None
    sqlite = parsed.get_backend_name() == "sqlite"
    if sqlite and parsed.database in (None, "", ":memory:"):
        raise ValueError(
            "an in-memory SQLite database lasts one connection: give a file, "
            "sqlite:///app.db (or a MemoryAdapter)"
        )
    head = _head()
    if migrate:
        (_migrate_sqlite if sqlite else _migrate_postgres)(url, options)
        return
    if sqlite and not Path(str(parsed.database)).exists():
        # Connecting would create an empty file: a mistyped path would look migrated-less
        # and leave a stray database behind.
        raise NotMigrated(_redacted(url), _upgrade_command(url, options), None, head)
    revision = migrations.current(url, options)
    if revision != head:
        raise NotMigrated(_redacted(url), _upgrade_command(url, options), revision, head)


def _migrate_sqlite(url: str, options: TableOptions) -> None:
    """Migrate inside ``BEGIN IMMEDIATE`` on a database in WAL mode: one process
    migrates, the others wait for it and then find nothing to do."""
    import sqlalchemy as sa

    from statifier.sql import migrations
    from statifier.sql.engines import database_url

    engine = sa.create_engine(database_url(url), connect_args={"timeout": _MIGRATION_WAIT})
    try:
        with engine.connect() as connection:
            driver = connection.connection.driver_connection
            assert driver is not None
            driver.isolation_level = None
            # WAL first, as the adapter's connections ask for it: switching needs the
            # database to itself, so it is done here, waiting, rather than by a process
            # opening while another migrates (whose switch would answer busy at once).
            driver.execute("PRAGMA journal_mode = WAL")
            driver.execute("BEGIN IMMEDIATE")
            connection.begin()  # the transaction begun above; pysqlite emits nothing
            migrations.upgrade(connection, options)
            connection.commit()
    finally:
        engine.dispose()


def _migrate_postgres(url: str, options: TableOptions) -> None:
    """Migrate holding a transaction-scoped advisory lock: one process migrates, the
    others wait for its commit and then find nothing to do."""
    import sqlalchemy as sa

    from statifier.sql import migrations
    from statifier.sql.engines import database_url

    engine = sa.create_engine(database_url(url))
    try:
        with engine.begin() as connection:
            connection.execute(
                sa.text("SELECT pg_advisory_xact_lock(hashtextextended(:name, 0))"),
                {"name": _MIGRATION_LOCK},
            )
            migrations.upgrade(connection, options)
    finally:
        engine.dispose()
