"""Recording a session's inputs, and replaying them through the pure core.

A session started with ``record=True`` keeps, in order, every input it stepped: its
start, each external event, each event delivered to its internal queue (a delayed
``#_internal`` send, an ``error.communication``), and a cancel, together with the
answers its routes gave (which targets were reachable). :func:`replay` drives the
pure core through the same inputs and returns the same effect stream, with no
clock, task or other session involved.

>>> import asyncio
>>> from statifier.chart import compile_chart
>>> from statifier.session.clock import VirtualClock
>>> from statifier.session.live import System
>>> chart = compile_chart(
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="a">'
...     '<state id="a"><onentry><send event="tick" delay="1s"/></onentry>'
...     '<transition event="tick" target="b"/></state><final id="b"/></scxml>'
... )
>>> async def main():
...     async with System(VirtualClock()) as system:
...         session = await system.start(chart, record=True)
...         await system.run_until_idle()
...         return session
>>> session = asyncio.run(main())
>>> replay(chart, session.recording) == session.performed
True
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Literal

from statifier.chart import Machine
from statifier.core import Event, MachineState, StartOptions, handle_event, initialize
from statifier.core import effects as fx
from statifier.core.interpreter import cancel, deliver_internal
from statifier.expr import Value

__all__ = ["Input", "Recording", "RecordingRoutes", "replay", "step"]


@dataclass(frozen=True, slots=True)
class Input:
    """One stepped input and the route answers the step observed."""

    kind: Literal["event", "internal", "cancel"]
    event: Event | None
    routes: Mapping[str, bool]


@dataclass(slots=True)
class Recording:
    """Everything needed to replay a session: how it started and what it stepped."""

    session_id: str
    _: KW_ONLY
    datamodel: Mapping[str, Value]
    start_routes: Mapping[str, bool] = field(default_factory=dict)
    inputs: list[Input] = field(default_factory=list)
    send_types: frozenset[str] = frozenset()
    """The send types the session had registered (the core accepts only those)."""
    invoke_types: frozenset[str] | None = None
    """The invoke types it had registered (``None``: any)."""


class RecordingRoutes:
    """Wraps a routes view, remembering every answer it gives."""

    __slots__ = ("answers", "inner")

    def __init__(self, inner: Container[str]) -> None:
        self.inner = inner
        self.answers: dict[str, bool] = {}

    def __contains__(self, target: object) -> bool:
        answer = target in self.inner
        if isinstance(target, str):
            self.answers[target] = answer
        return answer


class _Answers:
    """The recorded answers, given again."""

    __slots__ = ("answers",)

    def __init__(self, answers: Mapping[str, bool]) -> None:
        self.answers = answers

    def __contains__(self, target: object) -> bool:
        return isinstance(target, str) and self.answers.get(target, False)


def replay(machine: Machine, recording: Recording) -> list[fx.Effect]:
    """The effects the recorded session produced, recomputed by the pure core."""
    state, effects = initialize(
        machine,
        StartOptions(
            session_id=recording.session_id,
            datamodel=recording.datamodel,
            routes=_Answers(recording.start_routes),
            send_types=recording.send_types,
            invoke_types=recording.invoke_types,
        ),
    )
    stream = list(effects)
    for item in recording.inputs:
        state, effects = step(state._replace(routes=_Answers(item.routes)), item.kind, item.event)
        stream.extend(effects)
    return stream


def step(
    state: MachineState, kind: Literal["event", "internal", "cancel"], event: Event | None
) -> tuple[MachineState, list[fx.Effect]]:
    """Step the pure core with one input of a session: an external ``event``, an event
    for the internal queue, or a cancel (``event`` None). Live sessions and
    :func:`replay` both step through here, so a replay takes the same paths."""
    if kind == "cancel":
        return cancel(state)
    assert event is not None
    if kind == "internal":
        return deliver_internal(state, event)
    return handle_event(state, event)
