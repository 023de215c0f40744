"""Replaying exported input logs on a revision of their charts, and the assertion
that it keeps the recorded outcomes."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from statifier.chart import Machine
    from statifier.durable.charts import ChartSource
    from statifier.durable.export import ExportedExecution
    from statifier.shadow import Divergence, ShadowResult, Side

__all__ = ["MAX_SHOWN", "Replayed", "assert_replays_same", "replay_input_logs"]

MAX_SHOWN: Final = 20
"""The most executions an assertion's message describes (it counts them all)."""

Logs = str | os.PathLike[str] | Sequence["ExportedExecution"]
Revisions = Mapping[str, "ChartSource"] | str | os.PathLike[str]


@dataclass(frozen=True, slots=True)
class Replayed:
    """One exported execution and what its log did on the revision.

    Attributes:
        execution: as the file holds it.
        result: :func:`statifier.shadow.compare_logs` of its log, on the chart it ran
            and on the revision.
    """

    execution: ExportedExecution
    result: ShadowResult

    def describe(self) -> str:
        """What went differently, in one line (``""`` when nothing did)."""
        from statifier.shadow import Verdict

        result = self.result
        head = f"{self.execution.id} ({self.execution.chart}, recorded {self.execution.ended()})"
        if result.verdict is Verdict.SAME:
            return ""
        if result.verdict is Verdict.UNTRUSTED:
            return f"{head}: cannot be compared: {result.untrusted}"
        if result.divergence is not None:
            return f"{head}: {_parted(result.divergence)}"
        first = result.new_errors[0]
        at = "the start" if first.event is None else f"input {first.index} ({first.event!r})"
        return (
            f"{head}: the revision raised {result.new_error_count} new error"
            f"{'s' if result.new_error_count != 1 else ''}, the first at {at}: "
            f"{first.error.describe()}"
        )


def replay_input_logs(
    logs: Logs, revisions: Revisions, *, max_inputs: int | None = None
) -> tuple[Replayed, ...]:
    """Replay each execution of ``logs`` (an exported file's path, or what
    :func:`statifier.durable.export.read_input_logs` read) on the chart it ran and on
    the revision of that chart in ``revisions``, with
    :func:`statifier.shadow.compare_logs`.

    Args:
        revisions: chart names to charts (as ``Durable(charts=...)`` takes them), or
            a directory of ``NAME.scxml`` files.
        max_inputs: the most inputs replayed per execution
            (:data:`statifier.shadow.MAX_INPUTS` if ``None``).

    Raises:
        statifier.durable.export.ExportError: the file cannot be read.
        statifier.durable.UnknownChart: an execution's chart has no revision given.
        statifier.durable.ChartUnusable: a revision, or a recorded chart, does not
            compile.
    """
    from statifier.chart import InvalidChart, compile_chart
    from statifier.durable import ChartUnusable, Durable, UnknownChart
    from statifier.durable.export import read_input_logs
    from statifier.persistence import MemoryAdapter
    from statifier.shadow import MAX_INPUTS, compare_logs

    executions = read_input_logs(logs) if isinstance(logs, str | os.PathLike) else tuple(logs)
    # Compiled as Durable compiles the charts it is given, by the same names and with
    # the same errors; the Durable is never opened.
    charts = Durable(MemoryAdapter(), charts=revisions).charts
    recorded: dict[str, Machine] = {}
    replayed = []
    for execution in executions:
        name = execution.chart or execution.content_hash
        revision = charts.get(name)
        if revision is None:
            raise UnknownChart(name, sorted(charts))
        old = recorded.get(execution.content_hash)
        if old is None:
            try:
                old = compile_chart(execution.source, name=name)
            except InvalidChart as invalid:
                problems = "; ".join(str(problem) for problem in invalid.problems)
                raise ChartUnusable(
                    name, f"as recorded, {execution.content_hash}", problems
                ) from None
            recorded[execution.content_hash] = old
        result = compare_logs(
            old,
            revision,
            execution.inputs,
            execution_id=execution.id,
            options=execution.options,
            status=execution.status,
            max_inputs=MAX_INPUTS if max_inputs is None else max_inputs,
        )
        replayed.append(Replayed(execution, result))
    return tuple(replayed)


def assert_replays_same(
    logs: Logs, revisions: Revisions, *, max_inputs: int | None = None
) -> tuple[Replayed, ...]:
    """Replay ``logs`` on ``revisions`` as :func:`replay_input_logs` does and fail
    unless every execution went through every input on the revision as on the chart
    it ran: the same active states, datamodel and sends after each input, and no new
    error. Answers what it replayed.

    Raises:
        AssertionError: one or more executions replayed differently (or could not be
            compared: a log closed at its cap, a migration in it, an input past
            ``max_inputs``); the message says how many, and for each (the first
            :data:`MAX_SHOWN`) where it was recorded to end, the input where the
            revision parted from it, and what each side had there.
        the errors of :func:`replay_input_logs`.
    """
    replayed = replay_input_logs(logs, revisions, max_inputs=max_inputs)
    lines = [line for line in (entry.describe() for entry in replayed) if line]
    if lines:
        shown = "\n".join(f"  {line}" for line in lines[:MAX_SHOWN])
        more = f"\n  ... and {len(lines) - MAX_SHOWN} more" if len(lines) > MAX_SHOWN else ""
        raise AssertionError(
            f"{len(lines)} of {len(replayed)} recorded execution"
            f"{'s' if len(replayed) != 1 else ''} replay differently on the revision:\n"
            f"{shown}{more}"
        )
    return replayed


def _parted(divergence: Divergence) -> str:
    at = (
        "at the start"
        if divergence.event is None
        else f"after input {divergence.index} ({divergence.event!r}, seq {divergence.seq})"
    )
    return (
        f"parted {at} in {', '.join(divergence.parts)}: recorded chart "
        f"{_side(divergence.old)}; revision {_side(divergence.new)}"
    )


def _side(side: Side) -> str:
    from statifier.expr.tagged import encode

    where = (
        f"in {side.final_state} (ended)"
        if side.final_state
        else (f"in {' '.join(side.configuration)}" if side.configuration else "in no state")
    )
    parts = [where]
    if side.datamodel:
        values = ", ".join(f"{name}={encode(value)!r}" for name, value in side.datamodel.items())
        parts.append(f"data {values}")
    if side.handed:
        parts.append("handed " + ", ".join(item.describe() for item in side.handed))
    return "; ".join(parts) if len(parts) == 1 else f"{parts[0]} ({'; '.join(parts[1:])})"
