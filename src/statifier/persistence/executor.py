"""The executor seam: every effect of a durable step reaches the host through it.

An executor performs an effect, or answers :class:`Refused` for one it did not perform
(a send nothing delivers, an invocation nothing starts). A refusal is not an error of
the step: the lifecycle tells the chart, in the same step and before anything is
stored, with the event a live session raises for the same miss
(:func:`refusal_event`), so a chart behaves alike under ``statifier trace`` and when
stepped durably.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass

from statifier.callbacks import awaited
from statifier.core import Event
from statifier.core import effects as fx

__all__ = [
    "EffectContext",
    "Executor",
    "Refused",
    "ignore_effects",
    "perform",
    "refusal_event",
    "refuse_unperformed",
]


@dataclass(frozen=True, slots=True)
class EffectContext:
    """Where an effect comes from, handed to the executor beside it.

    Attributes:
        execution_id: the execution that emitted it.
        via: the call that emitted it (``"create"``, ``"step"``, ``"answer"``,
            ``"cancel"``, ``"timer"``).
        ordinal: its place in that call's effects, from 0.
        macrostep, microstep, round: the interpreter's counters stamped on it.
        key: ``"<execution id>/<macrostep>.<microstep>.<round>/<ordinal>"``. Re-driving
            the same event from the same stored position emits the same effects under
            the same keys, so a host that makes its side effects idempotent on ``key``
            performs each once, although effects are delivered at least once.
    """

    execution_id: str
    _: KW_ONLY
    via: str
    ordinal: int
    macrostep: int
    microstep: int
    round: int

    @property
    def key(self) -> str:
        return f"{self.execution_id}/{self.macrostep}.{self.microstep}.{self.round}/{self.ordinal}"

    @classmethod
    def of(cls, effect: fx.Effect, execution_id: str, via: str, ordinal: int) -> EffectContext:
        """The context of ``effect``, the ``ordinal``-th effect of a call of ``via``
        on ``execution_id``: its counters are the effect's own."""
        return cls(
            execution_id,
            via=via,
            ordinal=ordinal,
            macrostep=effect.macrostep,
            microstep=effect.microstep,
            round=effect.round,
        )


@dataclass(frozen=True, slots=True)
class Refused:
    """An executor's answer for a send or an invocation it did not perform.

    The chart hears ``error.communication`` (a send: ``sendid`` is the send's id) or
    ``error.execution`` (an invocation: ``invokeid`` is its id), with ``{"message":
    reason}`` as data, in the same step; the step stands.

    >>> Refused("no route named 'ledger'").reason
    "no route named 'ledger'"
    """

    reason: str


Executor = Callable[[fx.Effect, EffectContext], "Awaitable[Refused | None] | Refused | None"]
"""A plain function or a coroutine function taking ``(effect, context)`` and answering
``None`` (performed, or nothing to perform) or :class:`Refused` (a send or an invocation
not performed). Effects arrive one at a time, in order; the next is handed over only
once the previous returned. What it raises aborts the step before anything is stored."""


def ignore_effects(effect: fx.Effect, context: EffectContext) -> None:
    """The executor that does nothing: for charts whose effects nobody needs (a send
    goes nowhere and the chart is not told)."""


def refuse_unperformed(effect: fx.Effect, context: EffectContext) -> Refused | None:
    """The default executor: performs nothing, and refuses every send and invocation,
    so a chart that waits on one hears why instead of waiting forever.

    >>> from statifier.chart import compile_chart
    >>> from statifier.core import initialize
    >>> chart = compile_chart(
    ...     '<scxml xmlns="http://www.w3.org/2005/07/scxml"><state id="s"><onentry>'
    ...     '<send event="ping" target="#_elsewhere"/></onentry></state></scxml>'
    ... )
    >>> state, effects = initialize(chart)
    >>> send = next(e for e in effects if type(e).__name__ == "Send")
    >>> context = EffectContext("ex_1", via="create", ordinal=0, macrostep=0,
    ...                         microstep=0, round=0)
    >>> refuse_unperformed(send, context).reason
    "nothing delivers a send to '#_elsewhere' from a durable execution"
    """
    if isinstance(effect, fx.Send | fx.SendDelayed):
        target = "its own external queue" if effect.target is None else repr(effect.target)
        kind = "" if effect.type is None else f" of type {effect.type!r}"
        return Refused(f"nothing delivers a send{kind} to {target} from a durable execution")
    if isinstance(effect, fx.Invoke):
        return Refused(f"nothing starts an invocation of type {effect.type!r}")
    return None


def refusal_event(effect: fx.Effect, refused: Refused) -> Event:
    """The event that tells a chart ``effect`` was refused.

    Raises:
        TypeError: ``effect`` is neither a send nor an invocation (nothing else may be
            refused).
    """
    data = {"message": refused.reason}
    if isinstance(effect, fx.Send | fx.SendDelayed):
        sendid = effect.send_id if effect.author_id else None
        return Event("error.communication", type="platform", data=data, sendid=sendid)
    if isinstance(effect, fx.Invoke):
        return Event("error.execution", type="platform", data=data, invokeid=effect.invoke_id)
    raise TypeError(f"an executor may refuse a send or an invocation, not {type(effect).__name__}")


async def perform(
    executor: Executor, effects: list[fx.Effect], execution_id: str, via: str
) -> list[Event]:
    """Hand ``effects`` to ``executor`` in order, leaving out :class:`~fx.Done` (the
    lifecycle consumes it), and answer the events its refusals raise, in order.

    Raises:
        TypeError: the executor refused an effect that cannot be refused, or answered
            something other than ``None`` or :class:`Refused`.
    """
    refusals: list[Event] = []
    for ordinal, effect in enumerate(effects):
        if isinstance(effect, fx.Done):
            continue
        context = EffectContext.of(effect, execution_id, via, ordinal)
        answer = await awaited(executor(effect, context))
        if answer is None:
            continue
        if not isinstance(answer, Refused):
            raise TypeError(f"the executor answered {answer!r}, not None or Refused")
        refusals.append(refusal_event(effect, answer))
    return refusals
