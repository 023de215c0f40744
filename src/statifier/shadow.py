"""Shadow replay: a revision of a chart tried on the input logs of recorded
executions, before it is deployed, without writing anything.

Every durable execution keeps its input log, and the core is pure: the log replayed
through the chart the execution runs gives back every position it went through (see
:mod:`statifier.console.replay`). :func:`shadow_replay` replays each selected
execution's log twice, on its own stored chart and on the revision, in lockstep, with
the same start options (the ones its stored position keeps, as
:func:`statifier.console.replay.stored_options` reads them, and its logged start data), every
effect recorded and none performed: a send or an invocation is taken as performed, as
:func:`~statifier.console.replay.assume_performed` takes it, so no refusal is told to
either chart. It returns one :class:`ShadowResult` per execution:

* where the two first part (:class:`Divergence`): the input after which the active
  states, the datamodel or what the step handed over (sends, delayed sends, cancels)
  differ, with what each side had;
* whether they end in the same configuration;
* the error events the revision raised that the stored chart did not, at the same
  input (:class:`NewError`);
* or why the replay cannot be trusted (``untrusted``): the log was closed at its cap or
  the execution migrated between revisions, the stored chart is gone or calls a host
  function not given, the replay on the stored chart does not end where the execution
  is (its log does not hold everything it saw), an input past ``max_inputs``, or a
  failure. Such an execution is never reported as the same.

:func:`compare_logs` is the same comparison on one log in memory, with no database.

Reading is read-only: :func:`open_read_only` opens a URL so that the database itself
refuses a write (SQLite ``mode=ro``; PostgreSQL ``default_transaction_read_only``).

>>> from datetime import UTC, datetime
>>> from statifier.chart import compile_chart
>>> from statifier.core import Event
>>> from statifier.persistence import LoggedInput
>>> def chart(limit: int) -> Machine:
...     return compile_chart(
...         '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">'
...         '<datamodel><data id="n" expr="0"/></datamodel>'
...         f'<state id="open"><transition event="add" cond="n &lt; {limit}">'
...         '<assign location="n" expr="n + 1"/></transition></state></scxml>'
...     )
>>> at = datetime(2026, 1, 1, tzinfo=UTC)
>>> log = [LoggedInput(seq, "step", Event("add"), at) for seq in range(3)]
>>> compare_logs(chart(5), chart(5), log).verdict
<Verdict.SAME: 'same'>
>>> result = compare_logs(chart(5), chart(2), log)
>>> result.verdict, result.divergence.index, result.divergence.parts
(<Verdict.DIVERGED: 'diverged'>, 3, ('datamodel',))
>>> dict(result.divergence.old.datamodel), dict(result.divergence.new.datamodel)
({'n': 3}, {'n': 2})
"""

from __future__ import annotations

import asyncio
import enum
import heapq
import itertools
import multiprocessing
import multiprocessing.util
import pickle
import random
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence, Set
from concurrent.futures import ProcessPoolExecutor
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import KW_ONLY, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from statifier.chart import InvalidChart, Machine, ReadLimits, compile_chart
from statifier.chart.validation import SYSTEM_VARIABLES
from statifier.core import Event, MachineState, StartOptions, handle_event, initialize
from statifier.core import effects as fx
from statifier.core.interpreter import cancel as cancel_chart
from statifier.core.interpreter import deliver_internal
from statifier.core.positions import PositionError
from statifier.expr import Function, Value, tagged
from statifier.persistence import (
    PLAIN,
    BlobCodec,
    ExecutionRecord,
    Executions,
    LoggedInput,
    PersistenceError,
    Status,
    StepError,
    Storage,
    UndecodableBlob,
)
from statifier.persistence.executions import logged_input, logged_start
from statifier.persistence.migration import MIGRATE_VIA
from statifier.persistence.step_errors import step_errors

if TYPE_CHECKING:
    from statifier.persistence.adapter import Adapter
    from statifier.persistence.sql import SqlAdapter
    from statifier.sql import TableOptions

__all__ = [
    "MAX_INPUTS",
    "MAX_NEW_ERRORS",
    "Divergence",
    "NewError",
    "Selection",
    "ShadowResult",
    "ShadowSummary",
    "Side",
    "Verdict",
    "compare_logs",
    "open_read_only",
    "read_revision",
    "shadow_replay",
    "shadow_replay_stores",
]

MAX_INPUTS: Final = 10_000
"""The most logged inputs replayed per execution by default; an execution with more
that has not parted before is reported untrusted (its rest was not compared)."""

MAX_NEW_ERRORS: Final = 16
"""The most new errors kept per execution; :attr:`ShadowResult.new_error_count`
counts them all (a chart failing in a loop raises thousands)."""

_UNKNOWN_FUNCTION: Final = "Unknown function: "
"""How the expression language spells the ``reason`` of a call to a function it does
not have, in the ``error.execution`` it raises (as the console's replay reads it)."""

_READ_AHEAD: Final = 200
"""Executions whose records are read in one query."""


_YIELD_EVERY: Final = 25
"""Executions replayed between two chances for the loop's other tasks to run (about
7 ms on the benchmark's machine)."""


class Verdict(enum.Enum):
    """What a shadow replay found for one execution.

    ``SAME``: the revision went through every input as the stored chart did.
    ``DIVERGED``: they parted at some input (:attr:`ShadowResult.divergence`).
    ``NEW_ERRORS``: they never parted, but the revision raised error events the stored
    chart did not. ``UNTRUSTED``: the replay cannot be trusted
    (:attr:`ShadowResult.untrusted` says why), whatever it found.
    """

    SAME = "same"
    DIVERGED = "diverged"
    NEW_ERRORS = "new_errors"
    UNTRUSTED = "untrusted"


@dataclass(frozen=True, slots=True)
class Handed:
    """A send, delayed send or cancel a step handed over, as compared: a generated
    send id (not the author's) is left out, since adding a send elsewhere in a chart
    renumbers them.

    Attributes:
        kind: ``"send"``, ``"delayed"`` or ``"cancel"``.
        send_id: the author's send id (for a cancel, the one it cancels), else ``None``.
        event, type, target, data: the send's (``None``/undefined for a cancel).
        delay_ms: a delayed send's delay.
    """

    kind: str
    send_id: str | None
    event: str | None = None
    type: str | None = None
    target: str | None = None
    data: Value = None
    delay_ms: int | None = None

    def as_json(self) -> dict[str, Any]:
        """The fields as JSON (``data`` in the tagged encoding)."""
        return {
            "kind": self.kind,
            "send_id": self.send_id,
            "event": self.event,
            "type": self.type,
            "target": self.target,
            "data": tagged.encode(self.data),
            "delay_ms": self.delay_ms,
        }

    def describe(self) -> str:
        """One short phrase: ``delayed timeout +5000ms``, ``cancel t1``."""
        if self.kind == "cancel":
            return f"cancel {self.send_id}"
        delay = "" if self.delay_ms is None else f" +{self.delay_ms}ms"
        to = "" if self.target is None else f" to {self.target}"
        return f"{self.kind} {self.event}{to}{delay}"


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a divergence, after the input where the two parted.

    Attributes:
        configuration: the sorted ids of the active atomic states (empty once ended).
        final_state: the top-level final the chart ended in, if it did.
        datamodel: the variables whose values differ between the sides, as this side
            had them (a variable this side lacks is absent); empty when the datamodels
            agree.
        handed: what the step handed over, in order.
    """

    configuration: tuple[str, ...]
    final_state: str | None
    datamodel: Mapping[str, Value]
    handed: tuple[Handed, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "configuration": list(self.configuration),
            "final_state": self.final_state,
            "datamodel": {name: tagged.encode(value) for name, value in self.datamodel.items()},
            "handed": [item.as_json() for item in self.handed],
        }


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where the revision first parted from the stored chart.

    Attributes:
        index: 0 for the start, ``n`` for after the ``n``-th logged input (the start
            data's entry, when the log opens with one, is the start).
        seq: that input's entry in the log (``None`` for the start).
        event: that input's event name (``None`` for the start).
        parts: what differed, among ``"configuration"`` (active states or final
            state), ``"datamodel"`` and ``"handed"`` (sends, delayed sends, cancels).
        old, new: what the stored chart and the revision had.
    """

    index: int
    seq: int | None
    event: str | None
    parts: tuple[str, ...]
    old: Side
    new: Side

    def as_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "seq": self.seq,
            "event": self.event,
            "parts": list(self.parts),
            "old": self.old.as_json(),
            "new": self.new.as_json(),
        }


@dataclass(frozen=True, slots=True)
class NewError:
    """An error event the revision raised at an input where the stored chart raised
    no such error (the same name, element, reason and message; where it is in the
    source is not compared, since a revision moves lines).

    Attributes:
        index, seq, event: the input, as in :class:`Divergence`.
        error: the error event.
    """

    index: int
    seq: int | None
    event: str | None
    error: StepError

    def as_json(self) -> dict[str, Any]:
        described = self.error.as_json()
        for unset in ("via", "seq", "recorded_at"):
            described.pop(unset)
        return {"index": self.index, "seq": self.seq, "event": self.event, "error": described}


@dataclass(frozen=True, slots=True)
class ShadowResult:
    """What replaying one execution's log on the revision found.

    Attributes:
        execution_id: the execution.
        verdict: see :class:`Verdict`.
        inputs: how many logged inputs were replayed on both sides.
        same_final: whether both ended in the same configuration (and final state);
            ``None`` when no replay finished.
        divergence: where they first parted, if they did (also when untrusted, if it
            was found before the replay stopped being trustworthy).
        new_errors: the first :data:`MAX_NEW_ERRORS` errors only the revision raised.
        new_error_count: how many there were.
        untrusted: why the replay cannot be trusted, or ``None``.
        chart: the stored chart's name; content_hash: its hash.
        status: the execution's status when read.
    """

    execution_id: str
    _: KW_ONLY
    verdict: Verdict
    inputs: int = 0
    same_final: bool | None = None
    divergence: Divergence | None = None
    new_errors: tuple[NewError, ...] = ()
    new_error_count: int = 0
    untrusted: str | None = None
    chart: str | None = None
    content_hash: str | None = None
    status: Status | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "execution_id": self.execution_id,
            "verdict": self.verdict.value,
            "inputs": self.inputs,
            "same_final": self.same_final,
            "divergence": None if self.divergence is None else self.divergence.as_json(),
            "new_errors": [error.as_json() for error in self.new_errors],
            "new_error_count": self.new_error_count,
            "untrusted": self.untrusted,
            "chart": self.chart,
            "content_hash": self.content_hash,
            "status": None if self.status is None else self.status.value,
        }


@dataclass(frozen=True, slots=True)
class ShadowSummary:
    """The results of one shadow replay, oldest execution first.

    Attributes:
        revision: the revision's content hash.
        results: one per execution replayed.
        counts: how many executions got each verdict (every verdict present).
    """

    revision: str
    results: tuple[ShadowResult, ...]
    counts: Mapping[Verdict, int]

    @property
    def selected(self) -> int:
        """How many executions the selection chose (each has a result). ``0``: nothing
        was compared, which is no evidence about the revision: :attr:`all_same` is
        then true of nothing, and a gate checks this first (``statifier replay``
        exits 1)."""
        return len(self.results)

    @classmethod
    def of(cls, revision: str, results: Sequence[ShadowResult]) -> ShadowSummary:
        tally = Counter(result.verdict for result in results)
        return cls(revision, tuple(results), {verdict: tally[verdict] for verdict in Verdict})

    @property
    def all_same(self) -> bool:
        """Whether every execution replayed the same (none diverged, raised new errors
        or could not be trusted). True when none was selected: see :attr:`selected`."""
        return self.counts[Verdict.SAME] == len(self.results)

    def as_json(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "selected": self.selected,
            "counts": {verdict.value: count for verdict, count in self.counts.items()},
            "results": [result.as_json() for result in self.results],
        }


@dataclass(frozen=True, slots=True)
class Selection:
    """Which executions a shadow replay reads.

    Attributes:
        document: the name of the chart whose executions are replayed (the name their
            chart was stored under); ``None``: the revision's own name, or every
            execution when the revision has none.
        status: only executions in this status.
        scope: only executions the router addresses in this scope (a row of its
            address table names them); SQL storage only.
        created_after, created_before: only executions created at or after, and
            before, these times (timezone-aware).
        sample: draw this many at random among those selected (``seed`` fixes the
            draw).
        limit: replay at most this many, the oldest first.
        seed: the random draw's seed.
    """

    document: str | None = None
    status: Status | None = None
    scope: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    sample: int | None = None
    limit: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("sample", "limit"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} is a count of executions, not {value!r}")
        for moment in (self.created_after, self.created_before):
            if moment is not None and moment.tzinfo is None:
                raise ValueError(f"a created time must be timezone-aware, not {moment!r}")


# Reading a revision.


def read_revision(
    path: str | Path,
    *,
    name: str | None = None,
    functions: Mapping[str, Function] | None = None,
    limits: ReadLimits | None = None,
) -> Machine:
    """The chart file ``path`` compiled under ``limits`` (the charts' defaults, as the
    command line reads charts), named ``name`` (by default the file's stem), with the
    host's expression ``functions``.

    Raises:
        ValueError: the file cannot be read, is over the size limit or is not a valid
            chart (the message names the file and the first problem).
    """
    file = Path(path)
    limits = limits or ReadLimits()
    try:
        with file.open("rb") as handle:
            source = handle.read(limits.max_bytes + 1)  # compile_chart refuses what is over
    except OSError as error:
        raise ValueError(f"{file}: cannot read: {error.strerror}") from None
    try:
        return compile_chart(source, name=name or file.stem, limits=limits, functions=functions)
    except InvalidChart as invalid:
        raise ValueError(f"{file}:{invalid.problems[0]}") from None


# Comparing one log.


def compare_logs(
    old: Machine,
    new: Machine,
    inputs: Sequence[LoggedInput],
    *,
    execution_id: str = "session",
    options: StartOptions | None = None,
    stored: MachineState | None = None,
    status: Status | None = None,
    max_inputs: int = MAX_INPUTS,
) -> ShadowResult:
    """Replay ``inputs`` (an input log, in order) on ``old`` and on ``new`` in
    lockstep and compare them after the start and after every input.

    Args:
        old: the chart the log was recorded on.
        new: the revision.
        execution_id: the execution's id (its ``_sessionid``).
        options: its start options (the session id is replaced by ``execution_id``);
            a log that opens with the start data adds its values, as
            :func:`statifier.console.replay.replay` does.
        stored: the execution's stored position, if known: the replay on ``old`` must
            end there (after a cancel, for a cancelled ``status``), else the result is
            untrusted.
        status: the execution's status.
        max_inputs: the most inputs replayed.

    Never raises for what the log holds: what cannot be replayed is reported untrusted.

    Raises:
        ValueError: ``max_inputs`` is negative.
    """
    if max_inputs < 0:
        raise ValueError(f"max_inputs is a count of inputs, not {max_inputs!r}")
    start = replace(options or StartOptions(), session_id=execution_id, trace=False)
    start, rest = logged_start(inputs, start)
    return _Comparison(old, new, execution_id, status).run(start, rest, stored, max_inputs)


_Stepped = tuple[MachineState, list[fx.Effect], tuple[tuple[Handed, ...], bool]]
"""A step of the stored chart: its position, its effects and their scan."""


@dataclass(slots=True)
class _Comparison:
    """One log replayed on both charts; what it found so far.

    ``old_id`` names a stored chart's state as the revision would (a migration plan's
    map), so the configurations compare by what the revision calls them; ``hidden``
    are the variables not compared besides the interpreter's (the ones a plan adds)."""

    old: Machine
    new: Machine
    execution_id: str
    status: Status | None
    old_id: Callable[[str], str | None] | None = None
    hidden: Set[str] = SYSTEM_VARIABLES
    replayed: int = 0
    divergence: Divergence | None = None
    new_errors: list[NewError] = field(default_factory=list)
    new_error_count: int = 0
    _last_placed: tuple[object, ...] | None = None

    def run(
        self,
        start: StartOptions,
        inputs: Sequence[LoggedInput],
        stored: MachineState | None,
        max_inputs: int,
    ) -> ShadowResult:
        started = _start_stored(self.old, start)
        if isinstance(started, str):
            return self._untrusted(started)
        old_state, old_effects, old_scan = started
        try:
            new_state, new_effects = initialize(self.new, start)
        except Exception as error:  # noqa: BLE001 - reported, never raised
            return self._untrusted(f"the revision could not be started: {_said(error)}")
        self._compare(0, None, old_state, old_effects, old_scan, new_state, new_effects)
        return self.follow(old_state, new_state, inputs, 1, stored, max_inputs)

    def follow(
        self,
        old_state: MachineState,
        new_state: MachineState,
        inputs: Sequence[LoggedInput],
        first: int,
        stored: MachineState | None,
        max_inputs: int,
    ) -> ShadowResult:
        """Replay ``inputs`` on both positions in lockstep, the first as input
        ``first`` of the log, comparing after each; then the verdict."""
        for index, entry in enumerate(inputs, start=first):
            if index > max_inputs:
                return self._untrusted(f"the log is longer than {max_inputs} inputs")
            stepped = _step_stored(index, entry, old_state)
            if isinstance(stepped, str):
                return self._untrusted(stepped)
            old_state, old_effects, old_scan = stepped
            assert entry.event is not None  # _step_stored refused the others
            # A durable execution takes nothing once its chart has stopped: neither
            # does the revision's.
            if new_state.running:
                try:
                    new_state, new_effects = _deliver(new_state, entry.event, _internal(entry))
                except Exception as error:  # noqa: BLE001 - reported, never raised
                    why = f"the revision could not replay it: {_said(error)}"
                    return self._untrusted(f"input {index}: {why}")
            else:
                new_effects = []
            self.replayed = index
            self._compare(index, entry, old_state, old_effects, old_scan, new_state, new_effects)
        if stored is not None and not _ends_at(old_state, stored, self.status):
            return self._untrusted(
                "the replay on the stored chart does not end where the execution is "
                "(its log does not hold all it saw: start options, refused sends or a "
                "host's routes)"
            )
        same_final = self._old_where(old_state) == _where(new_state)
        if self.divergence is not None:
            verdict = Verdict.DIVERGED
        elif self.new_error_count:
            verdict = Verdict.NEW_ERRORS
        else:
            verdict = Verdict.SAME
        return self._result(verdict, same_final=same_final)

    def _compare(
        self,
        index: int,
        entry: LoggedInput | None,
        old: MachineState,
        old_effects: list[fx.Effect],
        old_scan: tuple[tuple[Handed, ...], bool],
        new: MachineState,
        new_effects: list[fx.Effect],
    ) -> None:
        old_handed = old_scan[0]
        new_handed, new_errors = _scanned(new_effects)
        if new_errors:
            self._errors(index, entry, old_effects, new_effects)
        if self.divergence is not None:
            return  # the first parting is the one reported
        parts: list[str] = []
        if not self._placed_alike(old, new):
            parts.append("configuration")
        changed = _changed(old.datamodel, new.datamodel, self.hidden)
        if changed:
            parts.append("datamodel")
        if not _same_handed(old_handed, new_handed):
            parts.append("handed")
        if parts:
            self.divergence = Divergence(
                index,
                None if entry is None else entry.seq,
                None if entry is None or entry.event is None else entry.event.name,
                tuple(parts),
                _side(old, changed, old_handed, self._old_where(old)),
                _side(new, changed, new_handed, _where(new)),
            )

    def _placed_alike(self, old: MachineState, new: MachineState) -> bool:
        """Whether both are in the same states (by id) and final state. Until they part,
        a step that changed neither configuration (the same objects as the last
        comparison's, which found them alike) needs no ids computed."""
        seen = (old.configuration, new.configuration, old.running, new.running)
        last = self._last_placed
        if last is not None and all(a is b for a, b in zip(seen, last, strict=True)):
            return True
        alike = self._old_where(old) == _where(new)
        self._last_placed = seen if alike else None
        return alike

    def _old_where(self, state: MachineState) -> tuple[tuple[str, ...], str | None]:
        """Where the stored chart is, in the revision's ids when a plan renames them
        (an id the plan removes keeps its own, so it differs)."""
        where = _where(state)
        renamed = self.old_id
        if renamed is None:
            return where
        configuration, final = where
        ids = tuple(sorted(renamed(old) or old for old in configuration))
        return ids, None if final is None else (renamed(final) or final)

    def _errors(
        self,
        index: int,
        entry: LoggedInput | None,
        old_effects: list[fx.Effect],
        new_effects: list[fx.Effect],
    ) -> None:
        raised = Counter(_error_key(error) for error in step_errors(old_effects))
        for error in step_errors(new_effects):
            key = _error_key(error)
            if raised[key]:
                raised[key] -= 1
                continue
            self.new_error_count += 1
            if len(self.new_errors) < MAX_NEW_ERRORS:
                seq = None if entry is None else entry.seq
                name = None if entry is None or entry.event is None else entry.event.name
                self.new_errors.append(NewError(index, seq, name, error))

    def _untrusted(self, why: str) -> ShadowResult:
        return self._result(Verdict.UNTRUSTED, untrusted=why)

    def _result(
        self, verdict: Verdict, *, same_final: bool | None = None, untrusted: str | None = None
    ) -> ShadowResult:
        return ShadowResult(
            self.execution_id,
            verdict=verdict,
            inputs=self.replayed,
            same_final=same_final,
            divergence=self.divergence,
            new_errors=tuple(self.new_errors),
            new_error_count=self.new_error_count,
            untrusted=untrusted,
            content_hash=self.old.identity.content_hash,
            chart=self.old.identity.name,
            status=self.status,
        )


def _start_stored(old: Machine, start: StartOptions) -> _Stepped | str:
    """The stored chart started, or why its replay cannot be trusted."""
    try:
        state, effects = initialize(old, start)
    except Exception as error:  # noqa: BLE001 - reported, never raised
        return f"the stored chart could not be started: {_said(error)}"
    scan = _scanned(effects)
    missing = _missing_function(effects) if scan[1] else None
    if missing is not None:
        return f"at the start, {missing}"
    return state, effects, scan


def _step_stored(index: int, entry: LoggedInput, old: MachineState) -> _Stepped | str:
    """Input ``index`` of the log (``entry``) replayed on the stored chart, or why the
    replay cannot be trusted from there."""
    why = _unreplayable(entry, old)
    if why is not None:
        return f"input {index}: {why}"
    assert entry.event is not None  # _unreplayable refused the others
    try:
        state, effects = _deliver(old, entry.event, _internal(entry))
    except Exception as error:  # noqa: BLE001 - reported, never raised
        return f"input {index}: the stored chart could not replay it: {_said(error)}"
    scan = _scanned(effects)
    missing = _missing_function(effects) if scan[1] else None
    if missing is not None:
        return f"input {index}: {missing}"
    return state, effects, scan


def _internal(entry: LoggedInput) -> bool:
    # A fired timer of a send to #_internal goes on the internal queue, as the timer
    # worker steps it; everything else is an external event.
    return entry.via == "timer" and entry.event is not None and entry.event.type == "internal"


def _unreplayable(entry: LoggedInput, old: MachineState) -> str | None:
    if entry.via == MIGRATE_VIA:
        return "the execution moved between revisions of its chart here"
    if entry.event is None:
        return "the log was closed here at its cap"
    if not old.running:
        return "the log goes on after the stored chart stopped"
    return None


def _deliver(
    state: MachineState, event: Event, internal: bool
) -> tuple[MachineState, list[fx.Effect]]:
    if internal:
        return deliver_internal(state, event)
    return handle_event(state, event)


def _missing_function(effects: list[fx.Effect]) -> str | None:
    """Why a step cannot be trusted when the stored chart called a function it was not
    compiled with: the host that ran it may have had that function."""
    for effect in effects:
        if isinstance(effect, fx.ChartError):
            data = effect.event.data
            reason = data.get("reason") if isinstance(data, dict) else None
            if isinstance(reason, str) and reason.startswith(_UNKNOWN_FUNCTION):
                name = reason.removeprefix(_UNKNOWN_FUNCTION)
                return f"the stored chart called {name}(), a host function not given"
    return None


def _where(state: MachineState) -> tuple[tuple[str, ...], str | None]:
    return state.leaf_configuration(), state.final_state()


def _ends_at(replayed: MachineState, stored: MachineState, status: Status | None) -> bool:
    """Whether the replay on the stored chart ended where the execution is: a cancel is
    not logged, so a cancelled execution's replay is cancelled first."""
    if status is Status.CANCELLED and replayed.running:
        replayed, _ = cancel_chart(replayed)
    alike = _where(replayed)[0] == stored.leaf_configuration()
    return alike and not _changed(replayed.datamodel, stored.datamodel)


def _start_options(state: MachineState) -> StartOptions:
    """The start options a stored position keeps (as the console's replay starts a
    log): the send and invoke types its host handles, and its round budget."""
    return StartOptions(
        round_budget=state.round_budget,
        send_types=state.send_types,
        invoke_types=state.invoke_types,
    )


def _changed(
    old: Mapping[str, Value], new: Mapping[str, Value], hidden: Set[str] = SYSTEM_VARIABLES
) -> tuple[str, ...]:
    """The variables (the interpreter's own and ``hidden`` left out) whose values
    differ, by name."""
    if old.keys() == new.keys():
        names: list[str] = [
            name
            for name, value in old.items()
            if name not in hidden and value is not (other := new[name]) and not _same(value, other)
        ]
        return tuple(sorted(names)) if names else ()
    missing = object()
    names = [
        name
        for name in old.keys() | new.keys()
        if name not in hidden and not _same(old.get(name, missing), new.get(name, missing))
    ]
    return tuple(sorted(names))


def _same(left: object, right: object) -> bool:
    """Equal values of the same type, as the language's ``===`` sees them: ``1``,
    ``1.0`` and ``true`` differ (Python's ``==`` would not tell them apart)."""
    if type(left) is not type(right):
        return False
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_same(v, right[k]) for k, v in left.items())
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(_same, left, right))
    return bool(left == right)


def _same_handed(old: tuple[Handed, ...], new: tuple[Handed, ...]) -> bool:
    """Whether two steps handed over the same, their data compared as :func:`_same`."""
    if len(old) != len(new):
        return False
    return all(
        a == b and (a.data is b.data or _same(a.data, b.data))
        for a, b in zip(old, new, strict=True)
    )


def _scanned(effects: list[fx.Effect]) -> tuple[tuple[Handed, ...], bool]:
    """What a step handed over, and whether it raised an error event: one pass."""
    found: list[Handed] = []
    errors = False
    for effect in effects:
        if isinstance(effect, fx.ChartError):
            errors = True
        elif isinstance(effect, fx.Cancel):
            found.append(Handed("cancel", effect.send_id))
        elif isinstance(effect, (fx.Send, fx.SendDelayed)):
            delay = effect.delay_ms if isinstance(effect, fx.SendDelayed) else None
            found.append(
                Handed(
                    "send" if delay is None else "delayed",
                    effect.send_id if effect.author_id else None,
                    effect.event,
                    effect.type,
                    effect.target,
                    effect.data,
                    delay,
                )
            )
    return tuple(found), errors


def _side(
    state: MachineState,
    changed: Sequence[str],
    handed: tuple[Handed, ...],
    where: tuple[tuple[str, ...], str | None],
) -> Side:
    data = state.datamodel
    return Side(
        where[0],
        where[1],
        {name: data[name] for name in changed if name in data},
        handed,
    )


def _error_key(error: StepError) -> tuple[str, str | None, str | None, str | None]:
    return error.name, error.element, error.reason, error.message


def _said(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


# Reading the database.


@asynccontextmanager
async def open_read_only(
    url: str, *, tables: TableOptions | None = None
) -> AsyncIterator[SqlAdapter]:
    """``async with open_read_only(url) as adapter:`` a
    :class:`~statifier.persistence.sql.SqlAdapter` on connections the database itself
    keeps from writing: SQLite opened with ``mode=ro``, PostgreSQL sessions with
    ``default_transaction_read_only`` on. ``tables``: the tables' options
    (:class:`statifier.sql.TableOptions`).

    Raises:
        ValueError: not a PostgreSQL or SQLite URL, or SQLite in memory (nothing is
            recorded there for another connection to read).
        MissingExtra: the sqlite or postgres extra is missing.
    """
    from statifier.persistence.sql import SqlAdapter
    from statifier.sql.engines import dispose, read_only_engine

    engine = read_only_engine(url)
    try:
        async with SqlAdapter(engine, tables) as adapter:
            yield adapter
    finally:
        await dispose(engine)


Progress = Callable[[int, int, ShadowResult], None]
"""Told after each execution: ``(done, total, its result)``."""


async def shadow_replay(
    source: Storage | Adapter | str,
    revision: Machine,
    selection: Selection | None = None,
    *,
    codec: BlobCodec = PLAIN,
    functions: Mapping[str, Function] | None = None,
    tables: TableOptions | None = None,
    max_inputs: int = MAX_INPUTS,
    progress: Progress | None = None,
    workers: int = 1,
) -> ShadowSummary:
    """Replay the selected executions' logs on their stored charts and on
    ``revision``, and compare them (:func:`compare_logs`). Nothing is written.

    Args:
        source: a :class:`~statifier.persistence.Storage`, an adapter, or a database
            URL (opened read-only: :func:`open_read_only`, under ``tables``).
        revision: the new chart, compiled with the host's functions if it calls any.
        selection: which executions (every one of the revision's chart by default).
        codec, functions: for an adapter or a URL, the storage's blob codec and the
            host's expression functions the stored charts are compiled with.
        max_inputs: the most inputs replayed per execution.
        progress: called after each execution.
        workers: the processes that replay (1: this one). With more, ``source`` is a
            URL, each process reads and replays batches of executions on its own
            read-only connection, and ``codec`` and ``functions`` are pickled to them
            (module-level functions pickle; a lambda does not). The results are the
            same, in the same order.

    Returns:
        The results, oldest execution first, with their counts; none when the
        selection chose none (:attr:`ShadowSummary.selected` is ``0``).

    Raises:
        ValueError: a bad selection or source, ``workers`` below 1, or more than one
            with a source that is not a URL or a codec or functions that do not
            pickle.
        PersistenceError: the database could not be read (a record or an input-log
            entry it cannot decode is reported untrusted instead, that execution's
            alone).
    """
    chosen = selection or Selection()
    if chosen.document is None and revision.identity.name is not None:
        chosen = replace(chosen, document=revision.identity.name)
    count: object = workers  # untyped callers pass anything
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"workers is a whole number of at least 1, not {workers!r}")
    if isinstance(source, str):
        async with open_read_only(source, tables=tables) as adapter:
            storage = Storage(adapter, codec=codec, functions=functions)
            ids = await _selected(storage, chosen)
            if workers == 1:
                return await _replay_all(storage, revision, ids, max_inputs, progress)
            job = _Job.of(source, tables, codec, functions, revision)
            results = await _replay_shared(
                storage, job, revision, ids, workers, max_inputs, progress
            )
            return ShadowSummary.of(revision.identity.content_hash, results)
    if workers > 1:
        raise ValueError("a replay in several processes reads a database URL")
    if not isinstance(source, Storage):
        source = Storage(source, codec=codec, functions=functions)
    ids = await _selected(source, chosen)
    return await _replay_all(source, revision, ids, max_inputs, progress)


async def shadow_replay_stores(
    urls: Sequence[str],
    revision: Machine,
    selection: Selection | None = None,
    *,
    codec: BlobCodec = PLAIN,
    functions: Mapping[str, Function] | None = None,
    tables: Sequence[TableOptions | None] | None = None,
    max_inputs: int = MAX_INPUTS,
    progress: Progress | None = None,
) -> ShadowSummary:
    """:func:`shadow_replay` over executions spread over several stores (decision
    0119): each database of ``urls`` opened read-only under its tables' options (the
    same place in ``tables``; by default the package's), the selection
    made over all of them as if they were one (the oldest first, a sample drawn and
    ``limit`` counted over every store's executions), and each execution replayed
    from its own store.

    Returns:
        The results, oldest execution first (executions created at the same time in
        several stores by store, in ``urls``' order), with their counts.

    Raises:
        ValueError: no URL, not as many tables' options as URLs, a bad selection or
            URL.
        PersistenceError: a store could not be read.
    """
    options = [None] * len(urls) if tables is None else list(tables)
    if not urls or len(options) != len(urls):
        raise ValueError(f"{len(urls)} store URLs with {len(options)} tables' options")
    chosen = selection or Selection()
    if chosen.document is None and revision.identity.name is not None:
        chosen = replace(chosen, document=revision.identity.name)
    async with AsyncExitStack() as stack:
        storages = [
            Storage(
                await stack.enter_async_context(open_read_only(url, tables=of_store)),
                codec=codec,
                functions=functions,
            )
            for url, of_store in zip(urls, options, strict=True)
        ]
        found = await asyncio.gather(*(_selected_rows(s.adapter, chosen) for s in storages))
        # Each store's rows are oldest first already: merged by time, ties by store.
        each = [[(row, number) for row in rows] for number, rows in enumerate(found)]
        merged = list(heapq.merge(*each, key=lambda item: item[0][1]))
        store_of = {execution_id: number for (execution_id, _), number in merged}
        ids = _drawn([row for row, _ in merged], chosen)
        results: dict[str, ShadowResult] = {}

        def told(_done: int, _total: int, result: ShadowResult) -> None:
            results[result.execution_id] = result
            if progress is not None:
                progress(len(results), len(ids), result)

        for number, storage in enumerate(storages):
            mine = [execution_id for execution_id in ids if store_of[execution_id] == number]
            await _replay_all(storage, revision, mine, max_inputs, told)
    return ShadowSummary.of(
        revision.identity.content_hash, [results[execution_id] for execution_id in ids]
    )


async def _replay_all(
    storage: Storage,
    revision: Machine,
    ids: Sequence[str],
    max_inputs: int,
    progress: Progress | None,
) -> ShadowSummary:
    results: list[ShadowResult] = []
    for first in range(0, len(ids), _READ_AHEAD):
        for result in await _replay_batch(
            storage, revision, ids[first : first + _READ_AHEAD], max_inputs
        ):
            results.append(result)
            if progress is not None:
                progress(len(results), len(ids), result)
    return ShadowSummary.of(revision.identity.content_hash, results)


async def _replay_batch(
    storage: Storage, revision: Machine, batch: Sequence[str], max_inputs: int
) -> list[ShadowResult]:
    """The executions of ``batch`` replayed, their records and logs read in one
    query each."""
    lifecycle = Executions(storage)  # only read through: its input log, decoded
    sql = _sql_adapter(storage)
    await storage.read_ahead(batch)
    logs = None if sql is None else await _read_logs(sql, storage.codec, batch)
    results = []
    for number, execution_id in enumerate(batch, start=1):
        log = None if logs is None else logs.get(execution_id, [])
        results.append(
            await _replay_one(storage, lifecycle, revision, execution_id, log, max_inputs)
        )
        if number % _YIELD_EVERY == 0 or number == len(batch):
            # Replaying never suspends: other tasks of the loop (in a replay in several
            # processes, handing the others their next batches) wait for this.
            await asyncio.sleep(0)
    return results


async def _replay_share(
    storage: Storage, revision: Machine, share: Sequence[str], max_inputs: int
) -> list[ShadowResult]:
    """The executions of ``share`` replayed, :data:`_READ_AHEAD` read at a time."""
    results: list[ShadowResult] = []
    for first in range(0, len(share), _READ_AHEAD):
        part = share[first : first + _READ_AHEAD]
        results += await _replay_batch(storage, revision, part, max_inputs)
    return results


# Replaying in several processes.


@dataclass(frozen=True)
class _Job:
    """What a replaying process needs, pickled: the database, and the revision as its
    source (a compiled chart holds closures, which do not pickle)."""

    url: str
    tables: TableOptions | None
    codec: BlobCodec
    functions: Mapping[str, Function] | None
    source: bytes
    name: str | None
    version: str | None

    @classmethod
    def of(
        cls,
        url: str,
        tables: TableOptions | None,
        codec: BlobCodec,
        functions: Mapping[str, Function] | None,
        revision: Machine,
    ) -> _Job:
        identity = revision.identity
        return cls(url, tables, codec, functions, revision.source, identity.name, identity.version)

    def revision(self) -> Machine:
        # Compiled once already, in the process that started the replay, under the
        # bounds its caller chose: they held there.
        unbounded = ReadLimits(
            max_bytes=len(self.source) + 1, max_depth=sys.maxsize, max_elements=sys.maxsize
        )
        return compile_chart(
            self.source,
            name=self.name,
            version=self.version,
            functions=self.functions,
            limits=unbounded,
        )


async def _replay_shared(
    storage: Storage,
    job: _Job,
    revision: Machine,
    ids: Sequence[str],
    workers: int,
    max_inputs: int,
    progress: Progress | None,
) -> list[ShadowResult]:
    """``ids`` replayed by this process and ``workers - 1`` others, a batch at a time
    (:func:`_batches`): each takes the next batch when it is done with its last, so this
    one, which needs no start, works while the others start, and all finish close
    together. The results are taken, and told to ``progress``, in the batches' order.

    The other processes are started with ``spawn``: a forked copy of a process running
    an event loop and its threads is not safe to use."""
    try:
        pickle.dumps(job)
    except Exception as error:  # noqa: BLE001 - whatever pickling raises, said as one error
        raise ValueError(
            "a replay in several processes pickles the table options, codec and "
            f"functions: {_said(error)}"
        ) from None
    loop = asyncio.get_running_loop()
    batches = _batches(ids, workers)
    replayed: list[list[ShadowResult] | None] = [None] * len(batches)
    untaken = iter(range(len(batches)))  # shared: each replayer takes the next
    results: list[ShadowResult] = []
    told = 0  # the batches whose results are taken

    def take() -> None:
        nonlocal told
        while told < len(batches) and (batch := replayed[told]) is not None:
            for result in batch:
                results.append(result)
                if progress is not None:
                    progress(len(results), len(ids), result)
            told += 1

    async def here(mine: int) -> None:
        for number in itertools.chain((mine,), untaken):
            replayed[number] = await _replay_share(storage, revision, batches[number], max_inputs)
            take()

    async def there(pool: ProcessPoolExecutor) -> None:
        for number in untaken:
            share = batches[number]
            replayed[number] = await loop.run_in_executor(
                pool, _replay_in_process, job, share, max_inputs
            )
            take()

    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(workers - 1, mp_context=context)
    try:
        # This one takes the first batch (a selection of one batch starts no
        # process), but the others start theirs first: its reads may not suspend.
        # They take two each, so that each has its next batch at hand when it
        # finishes one (it is handed out only when this one suspends: every
        # _YIELD_EVERY executions).
        mine = next(untaken)
        takers = [asyncio.ensure_future(there(pool)) for _ in range(2 * (workers - 1))]
        takers.append(asyncio.ensure_future(here(mine)))
        try:
            await asyncio.gather(*takers)
        finally:  # one failed: the others stop before the storage closes
            for taker in takers:
                taker.cancel()
            await asyncio.gather(*takers, return_exceptions=True)
    finally:
        # Not waiting for the processes to exit: their results are in, or not wanted.
        pool.shutdown(wait=False, cancel_futures=True)
    return results


_SHARE: Final = 500
"""The most executions in a batch of a replay in several processes: enough that
handing it over (its ids and results pickled) is small beside replaying it."""

_LEAST: Final = 50
"""The fewest executions in a batch (but the last): the batches shrink toward the
end, so that the processes finish close together."""


def _batches(ids: Sequence[str], workers: int) -> list[Sequence[str]]:
    """``ids`` cut into batches, in order. The first, which this process takes while the
    others start, is of :data:`_SHARE`: a selection no larger starts no process. Then
    batches of :data:`_SHARE` while many are left, then each a quarter of what is left
    per process, down to :data:`_LEAST`. A process holds at most two batches besides the
    one it replays, so when the last is taken, each has only a few small ones left.

    >>> [len(batch) for batch in _batches([str(n) for n in range(1_100)], 2)]
    [500, 75, 65, 57, 50, 50, 50, 50, 50, 50, 50, 50, 3]
    """
    batches: list[Sequence[str]] = [ids[:_SHARE]]
    first = _SHARE
    while first < len(ids):
        size = max(_LEAST, min(_SHARE, (len(ids) - first) // (4 * workers)))
        batches.append(ids[first : first + size])
        first += size
    return batches


@dataclass(slots=True)
class _Replayer:
    """What a replaying process keeps from one batch to the next: its event loop, its
    read-only storage (with the stored charts it compiled) and the revision. Opening
    them takes longer than replaying a small batch."""

    runner: asyncio.Runner
    opened: AsyncExitStack
    storage: Storage
    revision: Machine
    closing: multiprocessing.util.Finalize | None = None

    @classmethod
    def open(cls, job: _Job) -> _Replayer:
        """Open ``job``'s database read-only; closed when the process exits.

        Raises:
            PersistenceError: the database cannot be opened (nothing is kept).
        """
        runner = asyncio.Runner()
        opened = AsyncExitStack()
        try:
            adapter = runner.run(
                opened.enter_async_context(open_read_only(job.url, tables=job.tables))
            )
        except BaseException:
            runner.close()
            raise
        storage = Storage(adapter, codec=job.codec, functions=job.functions)
        replayer = cls(runner, opened, storage, job.revision())
        # A pool's process ends through multiprocessing, which runs these, not atexit's.
        replayer.closing = multiprocessing.util.Finalize(None, replayer._close, exitpriority=0)
        return replayer

    def replay(self, share: Sequence[str], max_inputs: int) -> list[ShadowResult]:
        return self.runner.run(self._replay(share, max_inputs))

    async def _replay(self, share: Sequence[str], max_inputs: int) -> list[ShadowResult]:
        return await _replay_share(self.storage, self.revision, share, max_inputs)

    def close(self) -> None:
        """Close the storage and the loop now, once; the process's exit does it else."""
        if self.closing is not None:
            self.closing()

    def _close(self) -> None:
        try:
            self.runner.run(self.opened.aclose())
        finally:
            self.runner.close()


_replayer: _Replayer | None = None
"""In a replaying process, what its first batch opened. A pool's processes serve one
replay (the pool is started for it and shut down after), so one is enough."""


def _replay_in_process(job: _Job, share: Sequence[str], max_inputs: int) -> list[ShadowResult]:
    """One share, in a replaying process, on what its first share opened."""
    global _replayer
    if _replayer is None:
        _replayer = _Replayer.open(job)
    return _replayer.replay(share, max_inputs)


async def _replay_one(
    storage: Storage,
    lifecycle: Executions,
    revision: Machine,
    execution_id: str,
    log: list[LoggedInput] | str | None,
    max_inputs: int,
) -> ShadowResult:
    """One execution replayed; ``log`` is its input log read ahead (a string: why it
    could not be read), or ``None`` to read it now."""

    def untrusted(why: str, record: ExecutionRecord | None = None) -> ShadowResult:
        return ShadowResult(
            execution_id,
            verdict=Verdict.UNTRUSTED,
            untrusted=why,
            content_hash=None if record is None else record.content_hash,
            status=None if record is None else record.status,
        )

    try:
        record = await storage.find_execution(execution_id)
    except UndecodableBlob as error:
        return untrusted(f"its record cannot be decoded: {error}")
    if record is None:
        return untrusted("it was deleted while the replay ran")
    try:
        old = await storage.machine(record.content_hash)
    except PersistenceError as error:  # not found, retired, damaged, undecodable
        return untrusted(f"its stored chart cannot be read: {_said(error)}", record)
    try:
        stored = storage.load(record, old)
    except PositionError as error:  # pruned, damaged, or another chart's
        return untrusted(f"its position cannot be read: {error}", record)
    if isinstance(log, str):
        return untrusted(f"its input log cannot be read: {log}", record)
    try:
        inputs = await lifecycle.inputs(execution_id) if log is None else log
    except (UndecodableBlob, PositionError) as error:
        return untrusted(f"its input log cannot be read: {_said(error)}", record)
    return compare_logs(
        old,
        revision,
        inputs,
        execution_id=execution_id,
        options=_start_options(stored),
        stored=stored,
        status=record.status,
        max_inputs=max_inputs,
    )


def _sql_adapter(storage: Storage) -> Any:
    """The storage's SQL adapter, or ``None`` for another (the memory adapter)."""
    adapter = storage.adapter
    return adapter if hasattr(adapter, "tables") and hasattr(adapter, "engine") else None


async def _read_logs(
    adapter: Any, codec: BlobCodec, execution_ids: Sequence[str]
) -> dict[str, list[LoggedInput] | str]:
    """The input logs of ``execution_ids`` in one query (one per execution through
    the storage would cost as much as replaying them), decoded as the storage and the
    lifecycle decode them; an execution with an entry that does not decode gets why."""
    import sqlalchemy as sa

    from statifier.sql.engines import run_on

    t = adapter.tables.inputs
    query = (
        sa.select(t.c.execution_id, t.c.seq, t.c.via, t.c.input_blob, t.c.recorded_at)
        .where(t.c.execution_id.in_(list(execution_ids)))
        .order_by(t.c.execution_id, t.c.seq)
    )

    def read(connection: sa.Connection) -> list[Any]:
        return list(connection.execute(query))

    logs: dict[str, list[LoggedInput] | str] = {}
    plain = codec is PLAIN
    for execution_id, seq, via, blob, recorded_at in await run_on(adapter.engine, read):
        log = logs.setdefault(execution_id, [])
        if isinstance(log, str):
            continue
        try:
            if blob is not None and not plain:
                blob = codec.decode(blob)
            log.append(logged_input(seq, via, blob, recorded_at))
        except (UndecodableBlob, PositionError) as error:
            logs[execution_id] = f"input {seq}: {_said(error)}"
    return logs


async def _selected(storage: Storage, selection: Selection) -> list[str]:
    """The ids of the selected executions, oldest first."""
    adapter = _sql_adapter(storage)
    if adapter is not None:
        rows = await _selected_rows(adapter, selection)
    else:
        rows = await _listed_rows(storage, selection)
    return _drawn(rows, selection)


def _drawn(rows: Sequence[tuple[str, datetime]], selection: Selection) -> list[str]:
    """The ids of ``rows`` (the selected executions, oldest first) that the
    selection's sample draws, at most its limit."""
    ids = [execution_id for execution_id, _ in rows]
    if selection.sample is not None and selection.sample < len(ids):
        drawn = set(random.Random(selection.seed).sample(ids, selection.sample))
        ids = [execution_id for execution_id in ids if execution_id in drawn]
    if selection.limit is not None:
        ids = ids[: selection.limit]
    return ids


async def _selected_rows(adapter: Any, selection: Selection) -> list[tuple[str, datetime]]:
    """The selection as one query on the SQL tables (ids and creation times only)."""
    import sqlalchemy as sa

    from statifier.sql.engines import run_on

    tables = adapter.tables
    e, c = tables.executions, tables.charts
    query = sa.select(e.c.execution_id, e.c.created_at)
    if selection.document is not None:
        query = query.join(c, c.c.content_hash == e.c.content_hash).where(
            c.c.name == selection.document
        )
    if selection.status is not None:
        query = query.where(e.c.status == selection.status.value)
    if selection.scope is not None:
        a = tables.addresses
        addressed = sa.select(a.c.execution_id).where(a.c.scope == selection.scope)
        query = query.where(e.c.execution_id.in_(addressed))
    if selection.created_after is not None:
        query = query.where(e.c.created_at >= selection.created_after)
    if selection.created_before is not None:
        query = query.where(e.c.created_at < selection.created_before)
    query = query.order_by(e.c.created_at, e.c.execution_id)
    if selection.sample is None and selection.limit is not None:
        query = query.limit(selection.limit)

    def read(connection: sa.Connection) -> list[tuple[str, datetime]]:
        return [(row[0], row[1]) for row in connection.execute(query)]

    rows: list[tuple[str, datetime]] = await run_on(adapter.engine, read)
    return rows


async def _listed_rows(storage: Storage, selection: Selection) -> list[tuple[str, datetime]]:
    """The selection from an adapter without SQL (the memory adapter), in Python.

    Raises:
        ValueError: a scope asked for (the router's addresses live in SQL only).
    """
    if selection.scope is not None:
        raise ValueError("a scope selects through the router's address table: SQL only")
    names: dict[str, str | None] = {}
    rows: list[tuple[str, datetime]] = []
    for record in await storage.list_executions():
        if not _chosen(record, selection):
            continue
        if selection.document is not None:
            name = names.get(record.content_hash, "")
            if name == "":
                chart = await storage.find_chart(record.content_hash)
                name = names[record.content_hash] = None if chart is None else chart.name
            if name != selection.document:
                continue
        assert record.created_at is not None
        rows.append((record.id, record.created_at))
    rows.sort(key=lambda row: (row[1], row[0]))
    return rows


def _chosen(record: ExecutionRecord, selection: Selection) -> bool:
    created = record.created_at
    if selection.status is not None and record.status is not selection.status:
        return False
    if selection.created_after is not None and (
        created is None or created < selection.created_after
    ):
        return False
    return selection.created_before is None or (
        created is not None and created < selection.created_before
    )
