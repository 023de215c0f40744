"""The shortest way in to durable executions: :class:`Durable`."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Final

from statifier.chart import Machine
from statifier.core import Event, MachineState, StartOptions
from statifier.durable.charts import ChartSource, _compiled
from statifier.durable.database import _options, _prepare, _redacted
from statifier.durable.errors import UnknownChart
from statifier.durable.values import (
    CHART_KEY,
    Cancelled,
    Description,
    ExecutionSummary,
    Moved,
    PendingTimer,
    Position,
    Send,
    Sent,
    _configuration,
    _datamodel,
    _execution_id,
    _final_state,
    _host_metadata,
    _in_language,
    _text,
    status_named,
)
from statifier.expr import UNDEFINED, Function, Value
from statifier.ids import new_execution_id
from statifier.persistence import (
    PLAIN,
    BlobCodec,
    Discarded,
    ErrorPolicy,
    ExecutionRecord,
    Executions,
    Executor,
    LoggedInput,
    Migrated,
    MigrationPlan,
    MigrationSummary,
    OnError,
    Parked,
    PersistenceError,
    Status,
    StepError,
    Stepped,
    Storage,
    decode_outcome,
)
from statifier.persistence.executions import storable_text
from statifier.persistence.executor import refuse_unperformed
from statifier.persistence.serialization import DEFAULT_LOCK_WAIT
from statifier.persistence.step_errors import decode_error

__all__ = ["MAX_SENDS", "Durable"]


if TYPE_CHECKING:
    from statifier.persistence.adapter import Adapter
    from statifier.router import FirePass, Resumed, Router, Sink
    from statifier.router.timers import DueTimer, UnreadableTimer
    from statifier.router.transaction import Unit
    from statifier.sql import TableOptions

MAX_SENDS: Final = 1_000
"""Sends at most in one :meth:`Durable.send_many` (a router's delivery batch's bound:
one transaction takes a lock per execution, and PostgreSQL's lock table is shared by
the whole server)."""
_DESCRIBED_ERRORS: Final = 20
"""How many of an execution's most recent errors :meth:`Durable.describe` reads."""
_DESCRIBED_TIMERS: Final = 100


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
        executor: receives every effect ``Durable`` does not carry out itself (see
            below and :class:`~statifier.persistence.Executor`); by default it refuses
            every send and invocation it is handed, so the chart hears
            ``error.communication``.
        lock_wait: the most seconds a call waits for an execution's lock
            (:class:`~statifier.persistence.LockTimeout`; 30 by default); ``None``: no
            bound.
        on_error: what an error event no transition takes does (see
            :class:`~statifier.persistence.OnError`): ``"continue"`` (SCXML's way, the
            default) or ``"fail"``, for every chart, or a mapping of chart names to
            either (the others continue).
        loader: reads ``<data src>`` and ``<script src>`` when a chart is compiled.
        functions: host expression functions the charts' conditions, values and scripts
            may call (:class:`~statifier.expr.Function` by name; see
            ``compile_chart(functions=...)``): pure, and the same in every process that
            opens the database, since a stored chart is compiled again with them.
        input_log_cap: the most entries one input log keeps (see
            :class:`~statifier.persistence.Storage`).
        codec: encodes every blob stored (positions, outcomes, inputs, chart sources)
            and decodes every blob read, e.g. a
            :class:`~statifier.persistence.fernet.FernetCodec` to encrypt them; stored
            as given by default (:data:`~statifier.persistence.PLAIN`).
        clock: "now", an aware UTC datetime, for the times written on records and for
            when timers are due (:meth:`fire_due` without ``now`` fires what is due
            by it); the wall clock by default. A test gives a clock it moves itself
            (``statifier.testing.ManualClock``).

    On a SQL database the calls step through the router's transaction
    (:mod:`statifier.router`), as :meth:`~statifier.router.Router.route` does: a delayed
    ``<send>`` and a send to the execution itself become rows of the database's timer
    queue, a BasicHTTP send a row of its outbox, each committed with the step; a
    ``<cancel>`` deletes them. :meth:`run` fires the timers and drains the outbox as
    they come due (:meth:`fire_due` once); ``statifier serve`` or ``statifier
    executions run`` on the same database do the same. Until a worker runs, a send's
    answer says what waits (:attr:`Sent.notices`). On an adapter that is not SQL
    (:class:`~statifier.persistence.MemoryAdapter`) there is no timer queue: such
    sends go to the executor.

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
        lock_wait: float | None = DEFAULT_LOCK_WAIT,
        loader: Callable[[str], str] | None = None,
        functions: Mapping[str, Function] | None = None,
        input_log_cap: int | None = None,
        codec: BlobCodec = PLAIN,
        on_error: OnError | str | Mapping[str, OnError | str] = OnError.CONTINUE,
        clock: Callable[[], datetime] | None = None,
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
        self._codec = codec
        self._clock = clock
        self._charts = _compiled(charts, loader, self._functions)
        self._names = {machine.identity.content_hash: n for n, machine in self._charts.items()}
        self._on_error = self._policy(on_error)
        self._executions: Executions | None = None
        self._router: Router | None = None
        self._owned: Adapter | None = None
        self._workers = 0

    def __repr__(self) -> str:
        where = _redacted(self._database) if isinstance(self._database, str) else "an adapter"
        return f"Durable({where}, charts={sorted(self._charts)})"

    @property
    def charts(self) -> Mapping[str, Machine]:
        """The compiled charts, by name."""
        return dict(self._charts)

    @property
    def router(self) -> Router | None:
        """The router its calls step through on a SQL database, once open (its timers,
        outbox and held events are the router's); ``None`` on another adapter or
        before :meth:`open`."""
        return self._router

    @property
    def executions(self) -> Executions:
        """The lifecycle underneath, for what ``Durable`` does not offer (``fail``,
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
            codec=self._codec,
        )
        if self._clock is not None:
            # The storage's "now" is the router's and its timer worker's too.
            storage.clock = self._clock
        executor = self._executor or refuse_unperformed
        self._executions = Executions(
            storage, executor=executor, lock_wait=self._lock_wait, on_error=self._on_error
        )
        self._router = _router(storage, self._charts, executor, self._lock_wait, self._on_error)
        return self

    async def close(self) -> None:
        """Close the adapter it opened (an adapter given stays open)."""
        owned, self._owned, self._executions = self._owned, None, None
        self._router = None
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
        _execution_id(execution_id)
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

        async def start(lifecycle: Executions) -> Stepped:
            return await lifecycle.create(execution_id, machine, options=options, metadata=pairs)

        stepped, timers = await self._call(start)
        return self._described(stepped.execution, stepped.state, "kept", (), timers, stepped.errors)

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
        _execution_id(execution_id)
        _text(event, "an event name")
        _in_language(data)
        answer, held, timers = await self._step_or_hold(execution_id, Event(event, data=data))
        return await self._sent(event, answer, held, timers)

    async def send_many(self, sends: Sequence[Send]) -> list[Sent]:
        """Step each of ``sends`` into its execution, in one transaction: they commit
        together or not at all. Answers one :class:`Sent` per send, in order, each what
        :meth:`send` would have answered at its turn, but for its ``timers`` (and the
        ``notices`` about them): its execution's pending timers after the batch.

        On a SQL database the cost of a batch is a few statements whatever its size:
        the executions' locks are taken in one (in one sorted order, so two batches
        never deadlock) and their rows read in one, the steps' writes go together (on
        PostgreSQL, one statement), and the pending timers of every execution stepped
        are read in one. Sends to one execution step in the order given. An execution
        that has ended or is parked discards its event and a paused one holds it for
        its resume, as :meth:`send` does. On an adapter that is not SQL
        (:class:`~statifier.persistence.MemoryAdapter`), which has no transactions,
        the sends are stepped one after the other, and an error leaves the earlier
        ones stepped.

        Args:
            sends: the events, each a :class:`Send` (execution id, event name, data).

        Raises:
            ExecutionNotFound: an execution of ``sends`` does not exist; nothing of the
                batch is committed. The error's notes name the send.
            LockTimeout: the executions stayed locked longer than ``lock_wait``;
                nothing of the batch is committed.
            TypeError: an element of ``sends`` is not a :class:`Send`, or its execution
                id or event name is not a non-empty string; nothing is sent.
            ValueError: more than :data:`MAX_SENDS` sends (a lock per execution, in
                one transaction), or an execution id no database can store; nothing
                is sent.
        """
        if len(sends) > MAX_SENDS:
            raise ValueError(f"send_many takes at most {MAX_SENDS} sends, not {len(sends)}")
        for send in sends:
            if not isinstance(send, Send):
                raise TypeError(f"send_many takes Send values, not {type(send).__name__}")
            _execution_id(send.execution_id)
            _text(send.event, "an event name")
            _in_language(send.data)
        router = self._router
        if router is None:
            sent: list[Sent] = []
            for index, send in enumerate(sends):
                try:
                    sent.append(await self.send(send.execution_id, send.event, send.data))
                except Exception as error:
                    error.add_note(
                        f"send {index + 1} of {len(sends)}: {send.event!r} to "
                        f"{send.execution_id!r}; the {index} before it stay stepped"
                    )
                    raise
            return sent
        from statifier.router.timers import SqlTimerQueue
        from statifier.router.transaction import Delivering

        now = router.storage.clock()
        stepped: list[tuple[Stepped | Discarded, bool]] = []
        async with router.transaction() as unit:
            ids = {send.execution_id for send in sends}
            held_ids = await unit.lock_executions(ids, "a batch of sends' executions")
            with unit.holding(held_ids):
                # A call of the host's delivers nothing: its sends resolve in no scope,
                # and its delayed sends are timed from now. Made in the block: its steps
                # enter the locks taken above.
                executions = unit.executions(Delivering(None, now))
                async with unit.deferred_steps():
                    for index, send in enumerate(sends):
                        event = Event(send.event, data=send.data)
                        try:
                            answer = await executions.step(send.execution_id, None, event)
                        except Exception as error:
                            error.add_note(
                                f"send {index + 1} of {len(sends)}: {send.event!r} to "
                                f"{send.execution_id!r}; nothing of the batch is committed"
                            )
                            raise
                        held = await _held_if_paused(unit, answer, event, now)
                        stepped.append((answer, held))
            delivered = sorted(
                {answer.execution.id for answer, _ in stepped if isinstance(answer, Stepped)}
            )
            queue = unit.timers
            assert isinstance(queue, SqlTimerQueue)
            pending = await queue.pending_many(unit.tx, delivered, _DESCRIBED_TIMERS)
        return [
            await self._sent(
                send.event,
                answer,
                held,
                ()
                if isinstance(answer, Discarded)
                else _pending_timers(pending.get(answer.execution.id, [])),
            )
            for send, (answer, held) in zip(sends, stepped, strict=True)
        ]

    async def _sent(
        self,
        event: str,
        answer: Stepped | Discarded,
        held: bool,
        timers: tuple[PendingTimer, ...],
    ) -> Sent:
        """The answer of a send of ``event``: ``answer`` its step, ``held`` whether a
        paused execution kept the event, ``timers`` its execution's pending timers
        after it (none read for a discarded event)."""
        if isinstance(answer, Discarded):
            record = answer.execution
            state, _ = await self._state(record)
            return Sent(
                execution_id=record.id,
                event=event,
                delivered=False,
                held=held,
                matched=False,
                finished=False,
                status=record.status,
                configuration=_configuration(state),
                final_state=_final_state(state),
                outcome=decode_outcome(record),
                failure=record.failure,
            )
        record, state = answer.execution, answer.state
        return Sent(
            execution_id=record.id,
            event=event,
            delivered=True,
            matched=answer.matched,
            finished=answer.finished,
            status=record.status,
            configuration=_configuration(state),
            final_state=_final_state(state),
            outcome=decode_outcome(record),
            failure=record.failure,
            errors=answer.errors,
            timers=timers,
            notices=self._waiting(record, timers),
        )

    async def pause(self, execution_id: str) -> bool:
        """Pause the active execution: until :meth:`resume`, what is sent to it (by
        :meth:`send`, or routed) and its timers that come due are held, in order, and
        stepped in on resume (:mod:`statifier.router.pausing`).

        Returns:
            ``True`` when it was paused now; ``False`` when it was not active.

        Raises:
            ExecutionNotFound: no such execution.
            RuntimeError: the database is not SQL (only a SQL database holds events).
        """
        _execution_id(execution_id)
        return await self._sql("hold for a paused execution").pause(execution_id)

    async def resume(self, execution_id: str) -> Resumed | None:
        """Resume the paused execution and step in what was held for it, oldest first,
        in one transaction (see :meth:`statifier.router.Router.resume`).

        Returns:
            what the resume did, or ``None`` when it was not paused.

        Raises:
            ExecutionNotFound: no such execution.
            RuntimeError: the database is not SQL.
        """
        _execution_id(execution_id)
        return await self._sql("hold for a paused execution").resume(execution_id)

    async def _step_or_hold(
        self, execution_id: str, event: Event
    ) -> tuple[Stepped | Discarded, bool, tuple[PendingTimer, ...]]:
        """One step of ``event``; on a SQL database, an event a paused execution
        discards is held for its resume in the same transaction (second: whether it
        was), and a stepped execution's pending timers are read in it too (third;
        none for a discarded event)."""
        router = self._router
        if router is None:
            return await self.executions.step(execution_id, None, event), False, ()
        from statifier.router.transaction import Delivering

        now = router.storage.clock()
        async with router.transaction() as unit:
            # A call of the host's delivers nothing: its sends resolve in no scope, and
            # its delayed sends are timed from now.
            answer = await unit.executions(Delivering(None, now)).step(execution_id, None, event)
            if isinstance(answer, Discarded):
                return answer, await _held_if_paused(unit, answer, event, now), ()
            return answer, False, await _timers_in(unit, execution_id)

    async def describe(self, execution_id: str) -> Description:
        """The execution as stored: status, configuration or final state, outcome,
        inputs, pending timers, errors.

        Raises:
            ExecutionNotFound: no such execution.
        """
        _execution_id(execution_id)
        executions = self.executions
        record = await executions.storage.fetch_execution(execution_id)
        state, position = await self._state(record)
        inputs = tuple(await executions.inputs(execution_id))
        stored = await executions.storage.errors(execution_id, _DESCRIBED_ERRORS)
        timers = await self._timers(execution_id)
        errors = tuple(decode_error(error) for error in stored)
        return self._described(record, state, position, inputs, timers, errors)

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
            ValueError: an unknown status, or a metadata value a database cannot
                store (a NUL, a lone surrogate).
            TypeError: a metadata value that is not a str.
        """
        wanted = None if status is None else status_named(status)
        for key, value in metadata.items():
            if not isinstance(value, str):
                raise TypeError(f"metadata filters are strings, not {key}={value!r}")
            storable_text(value, f"the metadata filter {key}")
        pairs = dict(metadata)
        if chart is not None:
            pairs[CHART_KEY] = chart
        records = await self.executions.storage.list_executions(**pairs)
        chosen = [r for r in records if wanted is None or r.status is wanted]
        chosen.sort(key=lambda r: (r.created_at is None, r.created_at, r.id))
        return tuple(
            ExecutionSummary(
                id=r.id,
                chart=self._chart_name(r),
                status=r.status,
                failure=r.failure,
                metadata=_host_metadata(r),
                created_at=r.created_at,
                updated_at=r.updated_at,
                ended_at=r.ended_at,
                final_state=r.final_state,
                error_count=r.error_count,
                last_error_at=r.last_error_at,
            )
            for r in chosen
        )

    async def cancel(self, execution_id: str) -> Cancelled:
        """Stop the execution from outside: its active states are exited (their onexit
        content runs through the executor) and the durable children it started are
        cancelled too, and what it held while paused is dropped. An execution that has
        ended is left as it is (``cancelled`` ``False``).

        Raises:
            ExecutionNotFound: no such execution.
        """
        _execution_id(execution_id)
        router = self._router
        if router is None:
            answer = await self.executions.cancel(execution_id)
        else:
            from statifier.router.transaction import Delivering

            async with router.transaction() as unit:
                lifecycle = unit.executions(Delivering(None, router.storage.clock()))
                answer = await lifecycle.cancel(execution_id)
                if not isinstance(answer, Discarded):
                    # What it held while paused goes with it.
                    await unit.sql.drop_held(execution_id)
        record = answer.execution
        return Cancelled(
            execution_id=record.id,
            cancelled=not isinstance(answer, Discarded),
            status=record.status,
        )

    async def migrate(
        self,
        execution_id: str,
        *,
        state_map: Mapping[str, str | None] | None = None,
        data: Mapping[str, Value] | None = None,
    ) -> Moved:
        """Move the execution onto the chart now given under its name (a new revision
        of the one it was created from), by state id: ``state_map`` names the states
        renamed (old id to new) or removed on purpose (to ``None``); every other id
        keeps its id. ``data`` gives values for variables the revision declares that
        the execution lacks. One guarded operation under the execution's lock, logged
        in its input log; no executable content runs (see
        :meth:`~statifier.persistence.Executions.migrate`).

        An execution whose position cannot be carried (one of its active states was
        removed and not mapped, say) is parked as ``needs_migration`` with the reason
        (``migrated`` ``False``; :meth:`describe` shows it as its ``failure``): it
        takes no event until migrated with a corrected map, or
        ``durable.executions.unpark(id)`` puts it back on its old chart.

        Raises:
            ExecutionNotFound: no such execution.
            UnknownChart: its chart's name is not among the charts given (or it was
                created elsewhere, without one).
            InvalidMigrationPlan: the map names ids the charts lack, or ``data`` a
                variable the revision does not declare.
            LockTimeout: another call held it longer than ``lock_wait``.
        """
        executions = self.executions
        record = await executions.storage.fetch_execution(_execution_id(execution_id))
        name = self._chart_name(record)
        if name is None:  # created elsewhere, under no name: the hash is all it has
            raise UnknownChart(record.content_hash, sorted(self._charts))
        target = self.chart(name)
        if record.content_hash == target.identity.content_hash:
            return await self._moved(record, False, "already on the chart given")
        source = await executions.storage.machine(record.content_hash)
        plan = MigrationPlan(source, target, state_map=state_map or {}, data=data or {})
        answer = await executions.migrate(record.id, plan)
        if isinstance(answer, Migrated):
            state = answer.state
            return Moved(
                execution_id=record.id,
                migrated=True,
                status=answer.execution.status,
                content_hash=answer.execution.content_hash,
                configuration=_configuration(state),
            )
        if isinstance(answer, Parked):
            return await self._moved(answer.execution, False, answer.reason)
        return await self._moved(answer.execution, False, f"it is {answer.execution.status.value}")

    async def migrate_all(
        self,
        chart: str,
        *,
        state_map: Mapping[str, str | None] | None = None,
        data: Mapping[str, Value] | None = None,
        progress: Callable[[MigrationSummary], object] | None = None,
    ) -> MigrationSummary:
        """Move every execution of the chart named ``chart`` that still runs an
        earlier revision (``active`` or parked) onto the chart now given under that
        name, as :meth:`migrate` does for one, in batches, one earlier revision after
        the other. Each earlier revision gets its plan from the same ``state_map`` and
        ``data``, and every plan is built before any execution moves: a map or data
        that does not fit one of the revisions is refused with nothing migrated. Safe
        to run again: what moved stays moved.

        Args:
            progress: called with what each earlier revision's migration did, once it
                is done: a caller whose call fails later (the database went away)
                knows what had moved before. Executions of the revision being
                migrated when it failed may have moved too; running the migration
                again finishes it.

        Returns:
            the :class:`~statifier.persistence.MigrationSummary`: ids migrated, parked
            (with the reasons), left unchanged, and failed (a lock wait ran out, say).

        Raises:
            UnknownChart: no chart has that name.
            InvalidMigrationPlan: the map or data does not fit one of the revisions;
                nothing was migrated.
            Exception: whatever the database raised part way; what moved before
                stays moved (``progress`` was told of each revision done).
        """
        target = self.chart(chart)
        executions = self.executions
        records = await executions.storage.list_executions(**{CHART_KEY: chart})
        earlier = sorted(
            {
                r.content_hash
                for r in records
                if r.status.pins and r.content_hash != target.identity.content_hash
            }
        )
        # Every revision's plan first: one that does not fit refuses the whole call
        # before anything moved.
        plans = [
            MigrationPlan(
                await executions.storage.machine(content_hash),
                target,
                state_map=state_map or {},
                data=data or {},
            )
            for content_hash in earlier
        ]
        summary = MigrationSummary()
        for plan in plans:
            done = await executions.migrate_all(plan.source_hash, plan)
            if progress is not None:
                progress(done)
            summary = summary + done
        return summary

    # Workers.

    async def run(
        self, stop: asyncio.Event | None = None, *, sinks: Mapping[str, Sink] | None = None
    ) -> None:
        """Fire the timers as they come due and drain the outbox, until ``stop`` is
        set (or the task is cancelled): the workers ``statifier serve`` runs, for the
        executions of this database. Any number of processes may run them on one
        PostgreSQL database; each timer fires once.

        Args:
            stop: set it to stop; the workers finish what they started.
            sinks: ``queue -> sink`` for the outbox (see
                :class:`~statifier.router.OutboxDrain`); BasicHTTP sends are drained
                by the BasicHTTP sink unless a sink is given for ``basichttp``.

        Raises:
            RuntimeError: not open, or the database is not SQL (no timer queue).
            Exception: a worker's pass failed (the database went away).
        """
        router = self._sql("run its workers")
        from statifier.router import OutboxDrain, TimerWorker

        stopping = stop or asyncio.Event()
        drain = OutboxDrain(router.storage, _sinks(router, sinks))
        self._workers += 1
        try:
            await asyncio.gather(TimerWorker(router).run(stopping), drain.run(stopping))
        finally:
            self._workers -= 1

    async def next_due(self) -> datetime | None:
        """When the earliest pending timer of the database is due; ``None`` when none
        is.

        Raises:
            RuntimeError: not open, or the database is not SQL (no timer queue).
        """
        from statifier.router import TimerWorker

        return await TimerWorker(self._sql("read timers")).next_due()

    async def fire_due(self, now: datetime | None = None) -> int:
        """Fire every timer due at ``now`` (the storage's clock by default), once;
        returns how many were taken off the queue (fired, or discarded because their
        execution had ended). Sends to the outbox are left to :meth:`run`.

        Raises:
            RuntimeError: not open, or the database is not SQL (no timer queue).
        """
        return (await self.fire_pass(now)).taken

    async def fire_pass(self, now: datetime | None = None) -> FirePass:
        """Fire every timer due at ``now`` as :meth:`fire_due` does, and answer how many
        were taken off the queue, how many failed (each logged as a warning, and due
        again a few seconds later) and how many another worker held
        (:class:`~statifier.router.FirePass`).

        Raises:
            RuntimeError: not open, or the database is not SQL (no timer queue).
        """
        from statifier.router import TimerWorker

        return await TimerWorker(self._sql("fire timers")).fire_pass(now)

    # Helpers.

    def _sql(self, what: str) -> Router:
        router = self._router
        if router is None:
            if self._executions is None:
                raise RuntimeError("open the Durable first: async with Durable(...) as durable")
            raise RuntimeError(f"only a SQL database keeps timers: nothing to {what} here")
        return router

    async def _call(
        self, work: Callable[[Executions], Awaitable[Stepped]]
    ) -> tuple[Stepped, tuple[PendingTimer, ...]]:
        """``work`` on the lifecycle, in a router transaction on a SQL database (its
        sends become timer and outbox rows committed with the step), and the pending
        timers of the execution it stepped, read in the same transaction (none without
        a timer queue)."""
        router = self._router
        if router is None:
            return await work(self.executions), ()
        from statifier.router.transaction import Delivering

        async with router.transaction() as unit:
            # A call of the host's delivers nothing: its sends resolve in no scope, and
            # its delayed sends are timed from now.
            stepped = await work(unit.executions(Delivering(None, router.storage.clock())))
            return stepped, await _timers_in(unit, stepped.execution.id)

    async def _timers(self, execution_id: str) -> tuple[PendingTimer, ...]:
        """The execution's pending timers (none without a timer queue)."""
        router = self._router
        if router is None:
            return ()
        async with router.transaction() as unit:
            return await _timers_in(unit, execution_id)

    def _waiting(
        self, record: ExecutionRecord, timers: tuple[PendingTimer, ...]
    ) -> tuple[str, ...]:
        """What waits for a worker that does not run here, said, so that nothing the
        chart scheduled is silently left behind."""
        if not timers or self._workers or record.status.terminal:
            return ()
        first = min(timers, key=lambda timer: timer.due_at)
        count = f"{len(timers)} timer{'s' if len(timers) != 1 else ''}"
        notice = (
            f"{count} pending (the first, {first.event or first.send_id!r}, due "
            f"{first.due_at.isoformat()}); no worker runs in this process to fire them: "
            "run Durable.run(), `statifier executions run`, or `statifier serve` on "
            "this database"
        )
        return (notice,)

    def _policy(self, on_error: OnError | str | Mapping[str, OnError | str]) -> ErrorPolicy:
        if isinstance(on_error, OnError | str):
            return ErrorPolicy(OnError.of(on_error))
        if not isinstance(on_error, Mapping):  # untyped callers pass anything
            raise TypeError(
                f"on_error is an OnError, its name, or a map of chart names to them, "
                f"not {on_error!r}"
            )
        charts: dict[str, OnError] = {}
        for name, value in on_error.items():
            charts[self.chart(name).identity.content_hash] = OnError.of(value)
        return ErrorPolicy(OnError.CONTINUE, charts)

    async def _moved(self, record: ExecutionRecord, migrated: bool, reason: str | None) -> Moved:
        state, _ = await self._state(record)
        return Moved(
            execution_id=record.id,
            migrated=migrated,
            status=record.status,
            content_hash=record.content_hash,
            configuration=_configuration(state),
            reason=reason,
        )

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
        timers: tuple[PendingTimer, ...],
        errors: tuple[StepError, ...],
    ) -> Description:
        return Description(
            id=record.id,
            chart=self._chart_name(record),
            content_hash=record.content_hash,
            status=record.status,
            configuration=_configuration(state),
            final_state=_final_state(state),
            outcome=decode_outcome(record),
            failure=record.failure,
            metadata=_host_metadata(record),
            inputs=inputs,
            timers=timers,
            position=position,
            created_at=record.created_at,
            updated_at=record.updated_at,
            ended_at=record.ended_at,
            error_count=record.error_count,
            errors=errors,
        )


async def _held_if_paused(
    unit: Unit, answer: Stepped | Discarded, event: Event, now: datetime
) -> bool:
    """Whether ``answer`` is a paused execution's discard of ``event``; if so, the
    event is held in ``unit`` for its resume."""
    if not isinstance(answer, Discarded) or answer.execution.status is not Status.PAUSED:
        return False
    from statifier.router.pausing import STEP_VIA, hold_event

    await hold_event(
        unit,
        answer.execution.id,
        event,
        via=STEP_VIA,
        internal=False,
        scope=None,
        message_id=None,
        now=now,
    )
    return True


async def _timers_in(unit: Unit, execution_id: str) -> tuple[PendingTimer, ...]:
    """The execution's pending timers (the first :data:`_DESCRIBED_TIMERS`), read in
    the router transaction ``unit``."""
    from statifier.router.timers import SqlTimerQueue

    queue = unit.timers
    assert isinstance(queue, SqlTimerQueue)
    return _pending_timers(await queue.pending(unit.tx, execution_id, _DESCRIBED_TIMERS))


def _pending_timers(rows: Sequence[DueTimer | UnreadableTimer]) -> tuple[PendingTimer, ...]:
    """Timer rows as :class:`PendingTimer` values (a row whose payload cannot be
    decoded here keeps its own columns)."""
    from statifier.router.timers import DueTimer

    return tuple(
        PendingTimer(
            send_id=row.entry.send_id,
            event=row.entry.event.name,
            kind=row.entry.kind.value,
            due_at=row.entry.due_at,
            route=row.entry.route,
            attempts=row.entry.attempts,
        )
        if isinstance(row, DueTimer)
        else PendingTimer(send_id=row.send_id, event=None, kind=row.kind.value, due_at=row.due_at)
        for row in rows
    )


def _router(
    storage: Storage,
    charts: Mapping[str, Machine],
    executor: Executor,
    lock_wait: float | None,
    on_error: ErrorPolicy,
) -> Router | None:
    """The router ``Durable`` steps through on a SQL database: no binding, the
    charts by name as documents, the built-in timer queue; ``None`` on another
    adapter."""
    from statifier.persistence.sql import SqlAdapter

    if not isinstance(storage.adapter, SqlAdapter):
        return None
    from statifier.router import Router, RouterConfig, StaticResolver

    documents: dict[str | tuple[str, str], Machine] = dict(charts.items())
    config = RouterConfig(
        storage,
        bindings=(),
        resolver=StaticResolver(documents),
        executor=executor,
        lock_wait=lock_wait,
        on_error=on_error,
    )
    return Router(config)


def _sinks(router: Router, given: Mapping[str, Sink] | None) -> dict[str, Sink]:
    """The outbox's sinks: ``given``, and the BasicHTTP sink for BasicHTTP sends when
    the ``http`` extra is installed and none was given for them."""
    from statifier.router import BASICHTTP_QUEUE

    sinks = dict(given or {})
    if BASICHTTP_QUEUE not in sinks:
        try:
            from statifier.router import basichttp_sink
        except ImportError:  # the http extra: BasicHTTP sends wait in the outbox
            return sinks
        sinks[BASICHTTP_QUEUE] = basichttp_sink(router)
    return sinks
