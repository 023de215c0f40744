"""Drive a chart through a list of events on a virtual clock, recording each step.

This is the engine behind ``statifier trace``. The chart runs as a live session
(:mod:`statifier.session.live`) on a :class:`~statifier.session.clock.VirtualClock`,
so it sends, arms and cancels timers, and invokes child charts exactly as it would in
production, but never waits. Only the traced chart's own steps are recorded; invoked
children run inside it.

Order of delivery, which makes every run deterministic:

1. after each step, events the chart sent to itself (and those its children sent to
   it) are delivered first, in order;
2. then the next given event;
3. when no given event remains, pending delayed sends fire in order of due time
   (ties by the order they were armed), advancing the virtual clock, until none
   remain, the chart finishes, or ``max_steps`` steps have been taken.

>>> from statifier.chart import compile_chart
>>> chart = compile_chart(
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="a">'
...     '<state id="a"><onentry><send event="tick" delay="5s"/></onentry>'
...     '<transition event="tick" target="b"/></state><final id="b"/></scxml>'
... )
>>> [(step.event, step.configuration, step.at_ms) for step in run(chart, [])]
[(None, ('a',), 0), ('tick', ('b',), 5000)]
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from statifier.chart import Machine
from statifier.core import Event
from statifier.core.effects import Effect
from statifier.session.clock import VirtualClock
from statifier.session.live import Session, System

__all__ = ["Step", "run"]

DEFAULT_MAX_STEPS = 1_000
SESSION_ID = "trace"


@dataclass(frozen=True, slots=True)
class Step:
    """One step: the event delivered (``None`` for the start), the sorted active leaf
    configuration afterwards (the one held at the end, once finished), the effects,
    and the virtual time in milliseconds at which it ran."""

    event: str | None
    configuration: tuple[str, ...]
    effects: tuple[Effect, ...]
    at_ms: int
    finished: bool


def run(
    machine: Machine,
    events: Iterable[Event],
    *,
    trace: bool = False,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> list[Step]:
    """Start ``machine``, deliver ``events`` and return every step the chart took.

    Runs its own event loop, so call it from synchronous code (inside a running loop,
    start a ``System`` with a ``VirtualClock`` and an ``on_step`` observer instead).
    """
    return asyncio.run(_run(machine, list(events), trace, max_steps))


async def _run(machine: Machine, events: list[Event], trace: bool, max_steps: int) -> list[Step]:
    clock = VirtualClock()
    steps: list[Step] = []

    def record(session: Session, event: Event | None, effects: list[Effect]) -> None:
        if len(steps) < max_steps:
            name = None if event is None else event.name
            steps.append(
                Step(
                    name, session.configuration, tuple(effects), clock.now_ms(), not session.running
                )
            )

    async with System(clock) as system:
        session = await system.start(machine, session_id=SESSION_ID, trace=trace, on_step=record)
        await system.settle()
        for event in events:
            if not session.running or len(steps) >= max_steps:
                break
            session.send(event)
            await system.settle()
        while session.running and len(steps) < max_steps:
            await system.settle()
            if not clock.advance():
                break
        await system.settle()
    return steps
