"""How live sessions end when something goes wrong, and who hears of it.

A step that raises, a macrostep out of its round budget, a system closed under its
sessions, a transport failing after its sender finished, events sent to an ended
session or to a full queue, and secrets in a BasicHTTP target: each is told to someone
(a log line, telemetry, ``wait()``, an error raised to the caller) and nothing is left
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

from statifier.chart import compile_chart
from statifier.core import Event
from statifier.core import effects as fx
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
