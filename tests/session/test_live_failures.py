"""How live sessions end when something goes wrong, and who hears of it.

A step that raises, a macrostep out of its round budget, a system closed under its
sessions, a transport failing after its sender finished, events sent to an ended
session or to a full queue, secrets in a BasicHTTP target, a start that raises, and an
error event of the chart's that no transition takes: each is told to someone (a log
line, telemetry, ``wait()``, an error raised to the caller) and nothing is left
hanging; ended children and cancelled invocations leave nothing behind. The timeouts
below only guard against hangs; nothing here is timed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from unittest import mock

import httpx
import pytest

from statifier.chart import Machine, compile_chart
from statifier.core import Event
from statifier.core import effects as fx
from statifier.repeats import IntervalTally
from statifier.session.basichttp import BasicHTTP
from statifier.session.clock import VirtualClock
from statifier.session.handlers import Delivery, InvokePlan, InvokePort
from statifier.session.live import (
    Session,
    SessionClosed,
    SessionFailed,
    SessionNotRunning,
    SessionQueueFull,
    System,
)
from statifier.telemetry import attach, detach

NS = "http://www.w3.org/2005/07/scxml"
GUARD = 5  # seconds: only so that a regression fails instead of hanging

TWO_STEPS = compile_chart(
    f'<scxml xmlns="{NS}" initial="a">'
    '<state id="a"><transition event="go" target="b"/></state>'
    '<state id="b"><transition event="done" target="f"/></state><final id="f"/></scxml>'
)
# An eventless loop that never settles: each macrostep spends its whole round budget.
LOOP = compile_chart(
    f'<scxml xmlns="{NS}" initial="a">'
    '<state id="a"><transition cond="true" target="b"/></state>'
    '<state id="b"><transition cond="true" target="a"/></state></scxml>'
)

_ids = itertools.count()


@contextmanager
def session_errors() -> Iterator[list[Mapping[str, Any]]]:
    """The metadata of every ``statifier.session.error`` reported inside the block."""
    seen: list[Mapping[str, Any]] = []
    handler_id = f"test_live_failures_{next(_ids)}"
    attach(handler_id, "statifier.session.error", lambda _n, _m, about: seen.append(about))
    try:
        yield seen
    finally:
        detach(handler_id)


@contextmanager
def through_the_loop(yes: bool) -> Iterator[None]:
    """With ``yes``, every turn is taken by a callback or the task, none by drain()."""
    if not yes:
        yield
        return
    with mock.patch.object(System, "_turn_on_callers_turn", return_value=False):
        yield


# -- 1. a step that raises ------------------------------------------------------------------


@pytest.mark.parametrize("loop", [False, True])
def test_a_step_that_raises_fails_the_session_and_says_so(
    loop: bool, caplog: pytest.LogCaptureFixture
) -> None:
    def observe(_session: Session, event: Event | None, _effects: list[fx.Effect]) -> None:
        if event is not None and event.name == "go":
            raise RuntimeError("host observer bug")

    async def main() -> None:
        system = System(VirtualClock())
        session = await system.start(TWO_STEPS, on_step=observe)
        session.send("go")
        await asyncio.wait_for(system.drain(), GUARD)
        assert not session.running
        assert session.configuration == ("b",)  # where it was when it failed
        assert session not in system.active
        assert session not in system.unfinished
        with pytest.raises(SessionFailed) as failed:
            await asyncio.wait_for(session.wait(), GUARD)
        assert failed.value.reason == "step_raised"
        assert failed.value.session_id == session.id
        assert isinstance(failed.value.__cause__, RuntimeError)
        with pytest.raises(SessionNotRunning):
            session.send("done")
        assert not session._inbox
        await asyncio.wait_for(system.drain(), GUARD)  # nothing left to spin on
        await system.close()

    with (
        caplog.at_level(logging.ERROR, "statifier.session.live"),
        session_errors() as errors,
        through_the_loop(loop),
    ):
        asyncio.run(main())
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "session_1 failed (step_raised)" in record.getMessage()
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], RuntimeError)
    [error] = errors
    assert error["error"] == "step_raised"
    assert error["raised"] is False
    assert "host observer bug" in error["message"]


class _Breaks:
    """An addressable send type whose ``location()`` raises once told to."""

    def __init__(self) -> None:
        self.broken = False

    def location(self, session_id: str) -> str | None:
        if self.broken:
            raise RuntimeError("location broke")
        return f"x:{session_id}"

    def plan(self, target: str | None, event: Event) -> Delivery | str:
        return Delivery(target or "", event)

    async def perform(self, delivery: Delivery) -> str | None:
        return None


def test_a_delayed_send_whose_handler_raises_fails_the_session() -> None:
    chart = compile_chart(
        f'<scxml xmlns="{NS}" initial="a"><state id="a">'
        '<onentry><send type="x" event="later" delay="1s"/></onentry></state></scxml>'
    )
    handler = _Breaks()

    async def main() -> None:
        async with System(VirtualClock()) as system:
            session = await system.start(chart, send_types={"x": handler})
            handler.broken = True
            await asyncio.wait_for(system.run_until_idle(), GUARD)
            assert not session.running
            with pytest.raises(SessionFailed) as failed:
                await asyncio.wait_for(session.wait(), GUARD)
            assert isinstance(failed.value.__cause__, RuntimeError)

    asyncio.run(main())


def test_a_failed_child_tells_its_parent() -> None:
    chart = compile_chart(
        f'<scxml xmlns="{NS}" initial="a"><state id="a">'
        '<invoke id="kid" type="scxml"><content>'
        f'<scxml xmlns="{NS}" initial="x">'
        '<state id="x"><transition cond="true" target="y"/></state>'
        '<state id="y"><transition cond="true" target="x"/></state></scxml>'
        "</content></invoke>"
        '<transition event="error.communication.invoke.kid" target="told"/></state>'
        '<final id="told"/></scxml>'
    )

    async def main() -> None:
        async with System(VirtualClock()) as system:
            parent = await system.start(chart)
            await asyncio.wait_for(parent.wait(), GUARD)
            assert parent.configuration == ("told",)

    asyncio.run(main())


# -- 2. and 3. closing the system -----------------------------------------------------------


def test_close_wakes_waiters_with_session_closed_and_refuses_more() -> None:
    async def main() -> None:
        system = System()
        session = await system.start(TWO_STEPS)
        waiter = asyncio.create_task(session.wait())
        await asyncio.sleep(0)
        await system.close()
        assert not session.running
        with pytest.raises(SessionClosed):
            await asyncio.wait_for(waiter, GUARD)
        with pytest.raises(SessionClosed):
            session.send("go")
        with pytest.raises(SessionClosed):
            await system.start(TWO_STEPS)
        await system.close()  # again: nothing to do

    asyncio.run(main())


class _Hook:
    def __init__(self) -> None:
        self.performed: list[str] = []

    def plan(self, target: str | None, event: Event) -> Delivery | str:
        return Delivery(target or "", event)

    async def perform(self, delivery: Delivery) -> str | None:
        self.performed.append(delivery.event.name)
        return None


def test_close_disarms_delayed_sends() -> None:
    chart = compile_chart(
        f'<scxml xmlns="{NS}" initial="a"><state id="a"><onentry>'
        '<send type="hook" target="payments" event="charge.card" delay="50ms"/>'
        "</onentry></state></scxml>"
    )
    hook = _Hook()

    async def main() -> None:
        clock = VirtualClock()
        system = System(clock)
        await system.start(chart, send_types={"hook": hook})
        await system.close()
        assert clock.pending() == 0
        clock.advance()  # (a timer still armed would fire here)
        for _ in range(5):
            await asyncio.sleep(0)

    asyncio.run(main())
    assert hook.performed == []


class _Poller:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def plan(self, effect: fx.Invoke) -> InvokePlan | str:
        return InvokePlan.of(effect)

    async def start(self, plan: InvokePlan, port: InvokePort) -> str | None:
        self.calls.append(("start", plan.invoke_id))
        return None

    async def cancel(self, invoke_id: str) -> None:
        self.calls.append(("cancel", invoke_id))

    async def forward(self, invoke_id: str, event: Event) -> None:
        pass


def test_close_cancels_invoked_services() -> None:
    chart = compile_chart(
        f'<scxml xmlns="{NS}" initial="a"><state id="a"><invoke type="poller" id="p"/>'
        "</state></scxml>"
    )
    poller = _Poller()

    async def main() -> None:
        system = System(VirtualClock())
        await system.start(chart, invoke_types={"poller": poller})
        await asyncio.wait_for(system.drain(), GUARD)
        await system.close()

    asyncio.run(main())
    assert poller.calls == [("start", "p"), ("cancel", "p")]


# -- 4. the round budget --------------------------------------------------------------------


def test_a_spent_round_budget_fails_the_session(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with System(VirtualClock()) as system:
            session = await system.start(LOOP)
            await asyncio.wait_for(system.run_until_idle(), GUARD)
            assert not session.running
            assert session not in system.unfinished
            with pytest.raises(SessionFailed) as failed:
                await asyncio.wait_for(session.wait(), GUARD)
            assert failed.value.reason == "round_budget"
            assert failed.value.__cause__ is None

    with caplog.at_level(logging.ERROR, "statifier.session.live"), session_errors() as errors:
        asyncio.run(main())
    assert any("round_budget" in r.getMessage() for r in caplog.records)
    assert [error["error"] for error in errors] == ["round_budget"]


# -- 5. a transport failing after its sender finished ---------------------------------------


class _Late:
    """Answers each send with a refusal, once ``answer`` is set."""

    def __init__(self) -> None:
        self.answer = asyncio.Event()

    def plan(self, target: str | None, event: Event) -> Delivery | str:
        return Delivery(target or "", event)

    async def perform(self, delivery: Delivery) -> str | None:
        await self.answer.wait()
        return "the broker refused the message (503)"


def test_a_send_failing_after_its_sender_finished_is_logged_and_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    chart = compile_chart(
        f'<scxml xmlns="{NS}" initial="a">'
        '<state id="a"><onentry><send type="q" target="orders" event="order.paid"/></onentry>'
        '<transition target="done"/></state><final id="done"/></scxml>'
    )

    async def main() -> None:
        late = _Late()
        async with System(VirtualClock()) as system:
            session = await system.start(chart, send_types={"q": late})
            await asyncio.wait_for(session.wait(), GUARD)
            late.answer.set()
            await asyncio.wait_for(system.drain(), GUARD)

    with caplog.at_level(logging.WARNING, "statifier.session.live"), session_errors() as errors:
        asyncio.run(main())
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "order.paid" in record.getMessage()
    assert "503" in record.getMessage()
    [error] = errors
    assert error["error"] == "error.communication"
    assert error["raised"] is False
    assert "503" in error["message"]


# -- 6. sending to an ended session ---------------------------------------------------------


def test_send_to_a_finished_session_raises_and_keeps_nothing() -> None:
    async def main() -> None:
        async with System(VirtualClock()) as system:
            session = await system.start(TWO_STEPS)
            session.send("go")
            session.send("done")
            await asyncio.wait_for(system.drain(), GUARD)
            assert not session.running
            with pytest.raises(SessionNotRunning):
                session.send("pay")
            session.request_cancel()  # stopping an ended chart does nothing
            assert not session._inbox
            assert session not in system.active
            await asyncio.wait_for(session.wait(), GUARD)  # it finished: no error

    asyncio.run(main())


# -- 7. secrets in a BasicHTTP target -------------------------------------------------------

SECRET_TARGET = "http://svc:S3CRET-PASS@127.0.0.1:9/hook?token=TOKEN-abc123"


@pytest.mark.parametrize("answer", ["refused", "500"])
def test_basichttp_failures_do_not_show_the_targets_secrets(answer: str) -> None:
    def respond(request: httpx.Request) -> httpx.Response:
        if answer == "refused":
            raise httpx.ConnectError(f"cannot reach {request.url}", request=request)
        return httpx.Response(500)

    chart = compile_chart(
        f'<scxml xmlns="{NS}" initial="a"><datamodel><data id="why"/></datamodel>'
        f'<state id="a"><onentry><send type="basichttp" target="{SECRET_TARGET}" event="ping"/>'
        '</onentry><transition event="error.communication" target="f">'
        '<assign location="why" expr="_event.data.message"/></transition></state>'
        '<final id="f"/></scxml>'
    )

    async def main() -> str:
        async with httpx.AsyncClient(transport=httpx.MockTransport(respond)) as client:
            http = BasicHTTP(client).send_types()
            async with System(VirtualClock()) as system:
                session = await system.start(chart, send_types=http, keep_effects=True)
                await asyncio.wait_for(session.wait(), GUARD)
                return str(session.logs) + str(session.state.datamodel.get("why"))

    with session_errors() as errors:
        why = asyncio.run(main())
    [error] = errors
    for text in (why, error["message"]):
        assert "http://127.0.0.1:9/hook" in text
        assert "S3CRET" not in text
        assert "TOKEN" not in text
        assert "svc" not in text


# -- 8a. what ended invocations leave behind ------------------------------------------------


def test_ended_children_are_forgotten() -> None:
    chart = compile_chart(
        f'<scxml xmlns="{NS}" initial="a">'
        '<state id="a"><invoke type="scxml"><content>'
        f'<scxml xmlns="{NS}" initial="c"><state id="c"/></scxml>'
        '</content></invoke><transition event="flip" target="b"/></state>'
        '<state id="b"><transition event="flip" target="a"/></state></scxml>'
    )

    async def main() -> None:
        async with System(VirtualClock()) as system:
            parent = await system.start(chart)
            for _ in range(100):
                parent.send("flip")
                await asyncio.wait_for(system.drain(), GUARD)
            # The parent is back in a with its latest child; the 50 before it ended.
            assert len(system.sessions) == 2
            assert parent._cancelled == set()

    asyncio.run(main())


def test_what_a_cancelled_child_left_queued_is_still_dropped() -> None:
    # The child sends twice in its onentry; "hello" makes the parent leave the
    # invoking state, so "again" is still queued when the child is cancelled.
    chart = compile_chart(
        f'<scxml xmlns="{NS}" initial="a">'
        '<state id="a"><invoke id="kid" type="scxml"><content>'
        f'<scxml xmlns="{NS}" initial="c"><state id="c"><onentry>'
        '<send target="#_parent" event="hello"/><send target="#_parent" event="again"/>'
        "</onentry></state></scxml>"
        '</content></invoke><transition event="hello" target="b"/></state>'
        '<state id="b"><onentry><send event="check"/></onentry>'
        '<transition event="again" target="bad"/><transition event="check" target="ok"/>'
        '</state><final id="ok"/><final id="bad"/></scxml>'
    )

    async def main() -> None:
        async with System(VirtualClock()) as system:
            parent = await system.start(chart)
            await asyncio.wait_for(parent.wait(), GUARD)
            assert parent.configuration == ("ok",)

    asyncio.run(main())


# -- 8b. a bounded queue --------------------------------------------------------------------


def test_a_full_queue_refuses_the_hosts_send() -> None:
    async def main() -> None:
        async with System(VirtualClock(), max_queued=3) as system:
            session = await system.start(TWO_STEPS)
            for _ in range(3):  # queued, not stepped: nothing yields in between
                session.send("noise")
            with pytest.raises(SessionQueueFull):
                session.send("go")
            assert len(session._inbox) == 3
            await asyncio.wait_for(system.drain(), GUARD)
            session.send("go")  # room again once it has stepped
            await asyncio.wait_for(system.drain(), GUARD)
            assert session.configuration == ("b",)

    asyncio.run(main())


def test_a_chart_flooding_its_own_queue_is_refused_with_error_communication(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Each x it takes sends two more: unbounded, the queue grows without end.
    chart = compile_chart(
        f'<scxml xmlns="{NS}" initial="a">'
        '<datamodel><data id="refused" expr="0"/></datamodel>'
        '<state id="a"><onentry><send event="x"/></onentry>'
        '<transition event="x"><send event="x"/><send event="x"/></transition>'
        '<transition event="error.communication">'
        '<assign location="refused" expr="refused + 1"/></transition></state></scxml>'
    )

    async def main() -> None:
        async with System(VirtualClock(), max_queued=20) as system:
            session = await system.start(chart)
            for _ in range(100):  # it never idles: let its task take turns
                await asyncio.sleep(0)
                assert len(session._inbox) <= 20 + 1  # (+ the error event raised first)
            assert session.state.macrostep > 100
            assert session.state.datamodel["refused"] > 0

    with caplog.at_level(logging.WARNING, "statifier.session.live"):
        asyncio.run(main())
    [record] = [r for r in caplog.records if "is full" in r.getMessage()]
    assert "(20 inputs)" in record.getMessage()


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_max_queued_is_a_positive_count(bad: Any) -> None:
    with pytest.raises(ValueError, match="max_queued"):
        System(VirtualClock(), max_queued=bad)


# -- 9. a start that raises -----------------------------------------------------------------

# Everything a start can leave behind: a delayed send, an invoked service, a child.
HOLDING = compile_chart(
    f'<scxml xmlns="{NS}" initial="a"><state id="a">'
    '<onentry><send type="hook" target="payments" event="charge.card" delay="50ms"/></onentry>'
    '<invoke type="poller" id="p"/>'
    f'<invoke type="scxml" id="kid"><content><scxml xmlns="{NS}" initial="c"><state id="c"/>'
    "</scxml></content></invoke></state></scxml>"
)


def test_an_observer_raising_on_the_start_fails_the_session_and_start_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hook, poller = _Hook(), _Poller()
    started: list[Session] = []

    def observe(session: Session, event: Event | None, _effects: list[fx.Effect]) -> None:
        started.append(session)
        if event is None:
            raise RuntimeError("observer broke on the start")

    async def main() -> None:
        clock = VirtualClock()
        system = System(clock)
        with pytest.raises(RuntimeError, match="observer broke") as raised:
            await system.start(
                HOLDING, on_step=observe, send_types={"hook": hook}, invoke_types={"poller": poller}
            )
        [session] = started
        assert not session.running
        assert session.configuration == ("a",)  # where it was when it failed
        assert session not in system.unfinished
        assert session not in system.active
        [child] = system.sessions.values()  # told to cancel: it ends on its next turn
        assert child.invoked
        await asyncio.wait_for(system.drain(), GUARD)
        assert system.sessions == {}
        assert system.unfinished == set()
        assert clock.pending() == 0  # the delayed send was disarmed
        clock.advance()  # (a timer still armed would fire here)
        await asyncio.wait_for(system.drain(), GUARD)
        with pytest.raises(SessionFailed) as failed:
            await asyncio.wait_for(session.wait(), GUARD)
        assert failed.value.reason == "step_raised"
        assert failed.value.__cause__ is raised.value
        with pytest.raises(SessionNotRunning):
            session.send("go")
        await asyncio.wait_for(system.close(), GUARD)

    with caplog.at_level(logging.ERROR, "statifier.session.live"), session_errors() as errors:
        asyncio.run(main())
    assert hook.performed == []
    assert poller.calls == [("start", "p"), ("cancel", "p")]
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "session_1 failed (step_raised)" in record.getMessage()
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], RuntimeError)
    [error] = errors
    assert (error["session_id"], error["error"], error["raised"]) == (
        "session_1",
        "step_raised",
        False,
    )
    assert "observer broke on the start" in error["message"]


class _BreaksOnTheSend(_Breaks):
    """Gives ``_ioprocessors`` its location, then raises when a send asks again."""

    def location(self, session_id: str) -> str | None:
        location = super().location(session_id)
        self.broken = True
        return location


def test_a_start_effect_that_raises_fails_the_session_and_start_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Its first send queues an event on itself, its second arms a timer; its third, of
    # type x and with no target, asks the handler's location() for its origin: raises.
    chart = compile_chart(
        f'<scxml xmlns="{NS}" initial="a"><state id="a"><onentry><send event="note"/>'
        '<send type="x" event="later" delay="1s"/><send type="x" event="now"/>'
        "</onentry></state></scxml>"
    )

    async def main() -> None:
        clock = VirtualClock()
        system = System(clock)
        with pytest.raises(RuntimeError, match="location broke"):
            await system.start(chart, send_types={"x": _BreaksOnTheSend()})
        assert system.sessions == {}
        assert system.unfinished == set()
        assert system.active == set()  # its queued note went with it
        assert clock.pending() == 0  # its delayed send was disarmed (before any close)
        await asyncio.wait_for(system.drain(), GUARD)
        await asyncio.wait_for(system.close(), GUARD)

    with caplog.at_level(logging.ERROR, "statifier.session.live"), session_errors() as errors:
        asyncio.run(main())
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "failed (step_raised)" in record.getMessage()
    assert [error["error"] for error in errors] == ["step_raised"]


def test_a_start_that_raises_before_its_chart_runs_leaves_nothing_registered() -> None:
    handler = _Breaks()
    handler.broken = True  # _ioprocessors asks it for its location first of all

    async def main() -> None:
        async with System(VirtualClock()) as system:
            with pytest.raises(RuntimeError, match="location broke"):
                await system.start(TWO_STEPS, session_id="s", send_types={"x": handler})
            assert system.sessions == {}
            assert system.unfinished == set()
            await asyncio.wait_for(system.drain(), GUARD)

    with session_errors() as errors:
        asyncio.run(main())
    assert [(error["session_id"], error["error"]) for error in errors] == [("s", "step_raised")]


class _BreaksForChildren(_Breaks):
    """A location for the session ``main``; any other (a child) raises."""

    def location(self, session_id: str) -> str | None:
        self.broken = session_id != "main"
        return super().location(session_id)


def test_a_child_whose_start_raises_fails_alone_and_tells_its_parent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    chart = compile_chart(
        f'<scxml xmlns="{NS}" initial="a"><state id="a">'
        f'<invoke id="kid" type="scxml"><content><scxml xmlns="{NS}" initial="c">'
        '<state id="c"/></scxml></content></invoke>'
        '<transition event="error.communication.invoke.kid" target="told"/></state>'
        '<final id="told"/></scxml>'
    )

    async def main() -> None:
        async with System(VirtualClock()) as system:
            parent = await system.start(
                chart, session_id="main", send_types={"x": _BreaksForChildren()}
            )
            await asyncio.wait_for(parent.wait(), GUARD)
            assert parent.configuration == ("told",)
            assert list(system.sessions) == ["main"]
            assert system.unfinished == set()

    with caplog.at_level(logging.ERROR, "statifier.session.live"):
        asyncio.run(main())
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "session_1 failed (step_raised): its start raised" in record.getMessage()


# -- 10. an error event of the chart's that no transition takes ---------------------------


@contextmanager
def untaken_errors() -> Iterator[list[Mapping[str, Any]]]:
    """The ``statifier.session.error`` metadata reported for untaken errors."""
    with session_errors() as errors:
        untaken: list[Mapping[str, Any]] = []
        yield untaken
        untaken.extend(error for error in errors if error.get("untaken"))


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


# An <assign> multiplying a string: on the start (onentry) or on the event go.
FAILING_ASSIGN = {
    "start": compile_chart(
        f'<scxml xmlns="{NS}" initial="a"><datamodel><data id="n" expr="0"/></datamodel>'
        '<state id="a"><onentry><assign location="n" expr="\'two\' * 2"/></onentry></state>'
        "</scxml>"
    ),
    "step": compile_chart(
        f'<scxml xmlns="{NS}" initial="a"><datamodel><data id="n" expr="0"/></datamodel>'
        '<state id="a"><transition event="go" target="b">'
        '<assign location="n" expr="_event.data * 2"/></transition></state>'
        '<state id="b"/></scxml>'
    ),
}


@pytest.mark.parametrize("when", ["start", "step"])
def test_an_untaken_error_execution_is_logged_and_reported(
    when: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with System(VirtualClock()) as system:
            session = await system.start(FAILING_ASSIGN[when], session_id="order_1")
            session.send(Event("go", data="two"))
            await asyncio.wait_for(system.drain(), GUARD)
            assert session.running  # the chart goes on, as SCXML has it

    with caplog.at_level(logging.WARNING, "statifier.session.live"), untaken_errors() as errors:
        asyncio.run(main())
    [error] = errors
    column = error["column"]
    assert isinstance(column, int)
    assert {key: value for key, value in error.items() if key != "chart"} == {
        "session_id": "order_1",
        "error": "error.execution",
        "message": "'*' expects numbers, got a string",
        "element": "assign",
        "line": 1,
        "column": column,
        "raised": False,
        "untaken": True,
    }
    said = (
        f"error.execution at <assign>, line 1, column {column}: '*' expects numbers, got a string"
    )
    assert warnings_of(caplog) == [f"session order_1: {said} (no transition took it)"]


def _start_and_collect(chart: Machine, caplog: pytest.LogCaptureFixture) -> list[Mapping[str, Any]]:
    """Start ``chart`` in a system of its own (the session runs to its first stable
    point) and answer the untaken errors it reported; its warnings stay in ``caplog``."""

    async def main() -> None:
        async with System(VirtualClock()) as system:
            await system.start(chart)

    with caplog.at_level(logging.WARNING, "statifier.session.live"), untaken_errors() as errors:
        asyncio.run(main())
    return errors


def test_an_untaken_error_communication_is_logged_and_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    chart = compile_chart(
        f'<scxml xmlns="{NS}" initial="a"><state id="a">'
        '<onentry><send target="#_scxml_nobody" event="hello"/></onentry></state></scxml>'
    )

    errors = _start_and_collect(chart, caplog)
    [error] = errors
    assert (error["error"], error["element"]) == ("error.communication", "send")
    assert "#_scxml_nobody" in error["message"]
    [warning] = warnings_of(caplog)
    assert warning.startswith("session session_1: error.communication at <send>, line 1")
    assert warning.endswith("(no transition took it)")


def test_an_untaken_errors_text_is_bounded(caplog: pytest.LogCaptureFixture) -> None:
    # The chart's own error event, its data a long string: the message, cut.
    chart = compile_chart(
        f'<scxml xmlns="{NS}" initial="a"><state id="a"><onentry>'
        f'<send event="error.custom" target="#_internal"><content>{"x" * 5000}</content></send>'
        "</onentry></state></scxml>"
    )

    errors = _start_and_collect(chart, caplog)
    [error] = errors
    assert error["message"] == "x" * 999 + "…"
    assert (error["element"], error["line"], error["column"]) == (None, None, None)
    [warning] = warnings_of(caplog)
    assert warning == f"session session_1: error.custom: {'x' * 999}… (no transition took it)"


def test_an_error_a_transition_took_stays_silent(caplog: pytest.LogCaptureFixture) -> None:
    # In a the chart takes its error.execution; in b none does, the same error.
    chart = compile_chart(
        f'<scxml xmlns="{NS}" initial="a"><datamodel><data id="n" expr="0"/></datamodel>'
        '<state id="a"><transition event="go"><assign location="n" expr="_event.data * 2"/>'
        '</transition><transition event="error.execution" target="b"/></state>'
        '<state id="b"><transition event="go">'
        '<assign location="n" expr="_event.data * 2"/></transition></state></scxml>'
    )

    async def main() -> None:
        async with System(VirtualClock()) as system:
            session = await system.start(chart)
            session.send(Event("go", data="two"))
            await asyncio.wait_for(system.drain(), GUARD)
            assert session.configuration == ("b",)  # it took the error
            assert errors == []
            assert warnings_of(caplog) == []
            session.send(Event("go", data="two"))  # (so that the check above is seen to work)
            await asyncio.wait_for(system.drain(), GUARD)
            assert [error["untaken"] for error in errors] == [True]
            assert len(warnings_of(caplog)) == 1

    with caplog.at_level(logging.WARNING, "statifier.session.live"), session_errors() as errors:
        asyncio.run(main())


def test_steps_without_an_error_report_none(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with System(VirtualClock()) as system:
            session = await system.start(FAILING_ASSIGN["step"])
            for _ in range(3):
                session.send("noise")  # no transition takes it: no error either
            await asyncio.wait_for(system.drain(), GUARD)
            assert errors == []
            assert warnings_of(caplog) == []
            session.send(Event("go", data="two"))
            await asyncio.wait_for(system.drain(), GUARD)
            assert [error["error"] for error in errors] == ["error.execution"]

    with caplog.at_level(logging.WARNING, "statifier.session.live"), session_errors() as errors:
        asyncio.run(main())


def test_an_error_repeated_on_every_event_is_one_line_an_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    chart = compile_chart(  # a targetless transition: the same error on every go
        f'<scxml xmlns="{NS}" initial="a"><datamodel><data id="n" expr="0"/></datamodel>'
        '<state id="a"><transition event="go"><assign location="n" expr="_event.data * 2"/>'
        "</transition></state></scxml>"
    )

    async def main() -> None:
        async with System(VirtualClock()) as system:
            system.untaken = IntervalTally(interval=0.05)
            session = await system.start(chart, session_id="flood")
            for _ in range(5):
                session.send(Event("go", data="two"))
            await asyncio.wait_for(system.drain(), GUARD)
            await asyncio.sleep(0.2)  # the interval ends: its count is written

    with caplog.at_level(logging.WARNING, "statifier.session.live"), untaken_errors() as errors:
        asyncio.run(main())
    assert len(errors) == 5  # telemetry sees every one
    first, count = warnings_of(caplog)
    assert first.startswith("session flood: error.execution at <assign>, line 1")
    assert count.startswith("4 more of: error.execution at <assign>, line 1")
    assert count.endswith("(the last in session flood)")
