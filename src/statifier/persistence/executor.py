"""The executor seam: every effect of a durable step reaches the host through it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass

from statifier.callbacks import settle
from statifier.core import effects as fx

__all__ = ["EffectContext", "Executor", "ignore_effects", "perform"]


@dataclass(frozen=True, slots=True)
class EffectContext:
    """Where an effect comes from, handed to the executor beside it.

    Attributes:
        execution_id: the execution that emitted it.
        door: the call that emitted it (``"create"``, ``"step"``, ``"answer"``,
            ``"cancel"``).
        ordinal: its place in that call's effects, from 0.
        macrostep, microstep, round: the interpreter's counters stamped on it.
        key: ``"<execution id>/<macrostep>.<microstep>.<round>/<ordinal>"``. Re-driving
            the same event from the same stored position emits the same effects under
            the same keys, so a host that makes its side effects idempotent on ``key``
            performs each once, although effects are delivered at least once.
    """

    execution_id: str
    _: KW_ONLY
    door: str
    ordinal: int
    macrostep: int
    microstep: int
    round: int

    @property
    def key(self) -> str:
        return f"{self.execution_id}/{self.macrostep}.{self.microstep}.{self.round}/{self.ordinal}"


Executor = Callable[[fx.Effect, EffectContext], Awaitable[None] | None]
"""A plain function or a coroutine function taking ``(effect, context)``. Effects arrive
one at a time, in order; the next is handed over only once the previous returned. What
it raises aborts the step before anything is stored."""


def ignore_effects(effect: fx.Effect, context: EffectContext) -> None:
    """The executor that does nothing: for charts whose effects nobody needs."""


async def perform(
    executor: Executor, effects: list[fx.Effect], execution_id: str, door: str
) -> None:
    """Hand ``effects`` to ``executor`` in order, leaving out :class:`~fx.Done` (the
    lifecycle consumes it)."""
    for ordinal, effect in enumerate(effects):
        if isinstance(effect, fx.Done):
            continue
        context = EffectContext(
            execution_id,
            door=door,
            ordinal=ordinal,
            macrostep=effect.macrostep,
            microstep=effect.microstep,
            round=effect.round,
        )
        await settle(executor(effect, context))
