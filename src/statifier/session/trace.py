"""Drive a chart through a list of events on a virtual clock, recording each step.

This is the engine behind ``statifier trace``. It performs the effects a chart needs to
make progress on its own: an event the chart sends to itself (no target, or
``#_scxml_<session>``) joins its external queue; a delayed send waits on a virtual
clock and is dropped by ``<cancel>``. Sends to anything else (a parent, an invoked
child, another session) are only reported.

Order of delivery, which makes every run deterministic:

1. after each step, events the chart sent to itself are delivered first, in order;
2. then the next given event;
3. when no given event remains, pending delayed sends fire in order of due time
   (ties by the order they were sent), advancing the virtual clock, until none remain,
   the chart finishes, or ``max_steps`` steps have been taken.

>>> from statifier.chart import compile_chart
>>> chart = compile_chart(
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="a">'
...     '<state id="a"><onentry><send event="tick" delay="5s"/></onentry>'
...     '<transition event="tick" target="b"/></state><final id="b"/></scxml>'
... )
>>> [(step.event, step.configuration) for step in run(chart, [])]
[(None, ('a',)), ('tick', ('b',))]
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from statifier.chart import Machine
from statifier.core import (
    SCXML_PROCESSOR,
    Event,
    MachineState,
    StartOptions,
    deliver_internal,
    handle_event,
    initialize,
)
from statifier.core.effects import Cancel, Done, Effect, Send, SendDelayed

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
    """Start ``machine``, deliver ``events`` and return every step taken."""
    state, effects = initialize(machine, StartOptions(session_id=SESSION_ID, trace=trace))
    driver = _Driver()
    steps = [driver.record(None, state, effects)]
    given = deque(events)
    while state.running and len(steps) < max_steps:
        if driver.queue:
            event = driver.queue.popleft()
        elif given:
            event = given.popleft()
        elif driver.timers:
            event = driver.fire()
        else:
            break
        if event.type == "internal":  # a delayed send to #_internal whose time came
            state, effects = deliver_internal(state, event)
        else:
            state, effects = handle_event(state, event)
        steps.append(driver.record(event.name, state, effects))
    return steps


class _Driver:
    def __init__(self) -> None:
        self.queue: deque[Event] = deque()
        self.timers: list[tuple[int, int, str, Event]] = []
        self.now = 0

    def record(self, name: str | None, state: MachineState, effects: list[Effect]) -> Step:
        configuration = state.leaf_configuration()
        for effect in effects:
            if isinstance(effect, Done):
                configuration = effect.configuration
            self.perform(effect)
        return Step(name, configuration, tuple(effects), self.now, not state.running)

    def perform(self, effect: Effect) -> None:
        if isinstance(effect, Send | SendDelayed):
            if effect.type not in (None, "scxml", SCXML_PROCESSOR):
                return
            internal = effect.target in ("#_internal", "_internal")
            if not internal and effect.target not in (None, f"#_scxml_{SESSION_ID}"):
                return
            event = Event(
                effect.event,
                "internal" if internal else "external",
                effect.data,
                sendid=effect.send_id if effect.author_id else None,
                origin=None if internal else f"#_scxml_{SESSION_ID}",
                origintype=None if internal else SCXML_PROCESSOR,
            )
            if isinstance(effect, SendDelayed):
                due = self.now + effect.delay_ms
                heapq.heappush(self.timers, (due, effect.ordinal, effect.send_id, event))
            else:
                self.queue.append(event)
        elif isinstance(effect, Cancel):
            self.timers = [timer for timer in self.timers if timer[2] != effect.send_id]
            heapq.heapify(self.timers)

    def fire(self) -> Event:
        due, _, _, event = heapq.heappop(self.timers)
        self.now = max(self.now, due)
        return event
