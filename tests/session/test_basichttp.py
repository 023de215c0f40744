"""The BasicHTTP Event I/O Processor against a real local server.

The W3C BasicHTTP tests are not in the corpus; these are equivalents of what they
check: events crossing between sessions over HTTP, ``_scxmleventname`` naming the
event, fields and content becoming ``_event.data``, delivery failures raising
``error.communication`` in the sender, the receiving end's answers, and
``_ioprocessors`` naming the location. test201 (optional) runs with the processor
registered.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, MutableMapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from statifier.chart import compile_chart
from statifier.core.positions import dump, load
from statifier.session.basichttp import BASICHTTP, BasicHTTP, basichttp_app
from statifier.session.clock import RealClock, VirtualClock
from statifier.session.live import Session, System

NS = "http://www.w3.org/2005/07/scxml"
TEST201 = Path(__file__).parent.parent / "conformance" / "scxml" / "optional" / "send"
LOCATION = f"_ioprocessors['{BASICHTTP}'].location"


@asynccontextmanager
async def served(system: System, *, body_limit: int = 64 * 1024) -> AsyncIterator[str]:
    """Serve the system's BasicHTTP app on 127.0.0.1 (a free port); yield its base URL."""
    config = uvicorn.Config(
        basichttp_app(system, body_limit=body_limit),
        host="127.0.0.1",
        port=0,
        log_level="warning",
        lifespan="on",
        ws="none",
        http="h11",
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())

    async def started() -> None:
        while not server.started:
            assert not task.done(), "the server did not start"
            await asyncio.sleep(0.01)

    try:
        await asyncio.wait_for(started(), timeout=10)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=10)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def chart(body: str, initial: str = "a") -> str:
    return f'<scxml xmlns="{NS}" initial="{initial}">{body}</scxml>'


RECEIVER = chart(
    '<datamodel><data id="got" expr="[]"/></datamodel>'
    '<state id="a"><transition event="stop" target="end"/>'
    '<transition event="*"><assign location="got" '
    'expr="got + [[_event.name, _event.data, _event.origintype]]"/></transition></state>'
    '<final id="end"/>'
)


def events(session: Session) -> list[Any]:
    got = session.state.datamodel["got"]
    assert isinstance(got, list)
    return got


async def drained(system: System) -> None:
    """Every queued event handled and every send answered (a POST that was answered
    has already queued its event)."""
    await asyncio.wait_for(system.drain(), timeout=10)


def test_two_sessions_exchange_events_over_http() -> None:
    pinger = chart(
        '<datamodel><data id="peer"/><data id="answer"/></datamodel>'
        '<state id="a"><onentry>'
        f'<send type="{BASICHTTP}" targetexpr="peer" event="ping">'
        f'<param name="reply" expr="{LOCATION}"/><param name="n" expr="1"/></send>'
        '</onentry><transition event="pong" target="done">'
        '<assign location="answer" expr="_event.data"/></transition>'
        '<transition event="error.*" target="failed"/></state>'
        '<final id="done"/><final id="failed"/>'
    )
    ponger = chart(
        '<state id="a"><transition event="ping" cond="_event.data.n == \'1\'" target="done">'
        '<send type="basichttp" targetexpr="_event.data.reply" event="pong">'
        '<content>thanks</content></send></transition></state><final id="done"/>'
    )

    async def main() -> tuple[Session, Session]:
        async with System(RealClock()) as system, served(system) as base:
            http = BasicHTTP(base_url=base).send_types()
            other = await system.start(compile_chart(ponger), send_types=http)
            io = other.state.datamodel["_ioprocessors"]
            assert isinstance(io, dict)
            peer = io[BASICHTTP]["location"]
            one = await system.start(
                compile_chart(pinger), datamodel={"peer": peer}, send_types=http
            )
            await asyncio.wait_for(asyncio.gather(one.wait(), other.wait()), timeout=5)
            return one, other

    one, other = asyncio.run(main())
    assert one.configuration == ("done",)
    assert other.configuration == ("done",)
    assert one.state.datamodel["answer"] == "thanks"


def test_names_fields_and_content_become_the_event() -> None:
    sender = chart(
        '<datamodel><data id="peer"/></datamodel><state id="a"><onentry>'
        f'<send type="{BASICHTTP}" targetexpr="peer" event="note.one">'
        '<param name="who" expr="\'me\'"/><param name="n" expr="2"/>'
        '<param name="list" expr="[1, \'x\']"/></send>'
        f'<send type="{BASICHTTP}" targetexpr="peer" event="note.two"><content>plain words'
        "</content></send>"
        '</onentry><transition event="error.*" target="failed"/></state><final id="failed"/>'
    )

    async def main() -> tuple[list[Any], Session]:
        async with System(RealClock()) as system, served(system) as base:
            http = BasicHTTP(base_url=base).send_types()
            receiver = await system.start(compile_chart(RECEIVER), send_types=http)
            peer = f"{base}/{receiver.id}"
            one = await system.start(
                compile_chart(sender), datamodel={"peer": peer}, send_types=http
            )
            await drained(system)
            async with httpx.AsyncClient() as client:
                unnamed = await client.post(peer, data={"k": "v"})
                raw = await client.post(peer, content=b"{not a form}")
                assert (unnamed.status_code, raw.status_code) == (204, 204)
            await drained(system)
            return events(receiver), one

    got, one = asyncio.run(main())
    assert sorted(got[:2]) == [
        ["note.one", {"who": "me", "n": "2", "list": '[1,"x"]'}, BASICHTTP],
        ["note.two", "plain words", BASICHTTP],
    ]
    assert got[2:] == [
        ["HTTP.POST", {"k": "v"}, BASICHTTP],
        ["HTTP.POST", "{not a form}", BASICHTTP],
    ]
    assert one.configuration == ("a",)  # no error.communication


def test_undeliverable_sends_raise_error_communication_in_the_sender() -> None:
    sender = chart(
        '<datamodel><data id="peer"/><data id="why"/></datamodel><state id="a"><onentry>'
        f'<send id="s" type="{BASICHTTP}" targetexpr="peer" event="hello"/>'
        '</onentry><transition event="error.communication" target="failed" '
        'cond="_event.sendid == \'s\'"><assign location="why" expr="_event.data.message"/>'
        "</transition></state>"
        '<final id="failed"/>'
    )

    async def attempt(peer: str, base: str | None, system: System) -> Session:
        session = await system.start(
            compile_chart(sender), datamodel={"peer": peer}, send_types=BasicHTTP().send_types()
        )
        await asyncio.wait_for(session.wait(), timeout=10)
        return session

    async def main() -> list[Session]:
        async with System(RealClock()) as system, served(system) as base:
            unreachable = await attempt(f"http://127.0.0.1:{closed_port()}/x", None, system)
            unknown = await attempt(f"{base}/nobody", base, system)
            return [unreachable, unknown]

    unreachable, unknown = asyncio.run(main())
    assert unreachable.configuration == unknown.configuration == ("failed",)
    assert "404" in str(unknown.state.datamodel["why"])


def test_the_app_answers_404_405_and_413() -> None:
    async def main() -> list[int]:
        async with System(RealClock()) as system, served(system, body_limit=1024) as base:
            session = await system.start(compile_chart(RECEIVER))
            finished = await system.start(compile_chart(chart('<final id="a"/>')))
            async with httpx.AsyncClient() as client:

                async def chunks() -> AsyncIterator[bytes]:
                    for _ in range(4):
                        yield b"x" * 400

                answers = [
                    await client.post(f"{base}/nobody", data={"a": "b"}),
                    await client.post(f"{base}/{finished.id}", data={"a": "b"}),
                    await client.get(f"{base}/{session.id}"),
                    await client.post(f"{base}/{session.id}", content=b"x" * 1025),
                    await client.post(f"{base}/{session.id}", content=chunks()),
                    await client.post(f"{base}/{session.id}", data={"_scxmleventname": "a b"}),
                    await client.post(f"{base}/{session.id}", content=b"x" * 1024),
                ]
            await drained(system)
            assert events(session) == [["HTTP.POST", "x" * 1024, BASICHTTP]]
            return [answer.status_code for answer in answers]

    assert asyncio.run(main()) == [404, 404, 405, 413, 413, 400, 204]


def test_ioprocessors_lists_the_location_and_positions_keep_it() -> None:
    async def main() -> Session:
        async with System(VirtualClock()) as system:
            sender = BasicHTTP(base_url="http://127.0.0.1:8123/events/")
            return await system.start(
                compile_chart(RECEIVER), session_id="s7", send_types=sender.send_types()
            )

    session = asyncio.run(main())
    io = session.state.datamodel["_ioprocessors"]
    assert io == {
        BASICHTTP: {"location": "http://127.0.0.1:8123/events/s7"},
        "basichttp": {"location": "http://127.0.0.1:8123/events/s7"},
        "http://www.w3.org/TR/scxml/#SCXMLEventProcessor": {"location": "#_scxml_s7"},
        "scxml": {"location": "#_scxml_s7"},
    }
    assert load(session.machine, dump(session.state)).datamodel["_ioprocessors"] == io


def test_w3c_test201_passes_with_the_processor_registered() -> None:
    source = (TEST201 / "test201.scxml").read_bytes()

    async def main(send_types: dict[str, Any]) -> tuple[str, ...]:
        async with System(VirtualClock()) as system:
            session = await system.start(compile_chart(source), send_types=send_types)
            await asyncio.wait_for(system.run_until_idle(), timeout=5)
            return session.configuration

    assert asyncio.run(main(BasicHTTP().send_types())) == ("pass",)
    assert asyncio.run(main({})) == ("fail",)  # unsupported: error.execution comes first


def test_the_app_answers_503_when_the_sessions_queue_is_full() -> None:
    async def main() -> tuple[int, dict[bytes, bytes], bytes]:
        async with System(VirtualClock(), max_queued=1) as system:
            session = await system.start(compile_chart(RECEIVER))
            app = basichttp_app(system)
            answered: list[Any] = []

            async def receive() -> dict[str, Any]:
                return {"type": "http.request", "body": b"late", "more_body": False}

            async def send(message: MutableMapping[str, Any]) -> None:
                answered.append(message)

            scope = {"type": "http", "method": "POST", "path": f"/{session.id}", "headers": []}
            session.send("first")  # the queue's one place; nothing runs before the post
            await app(scope, receive, send)
            start, body = answered
            return start["status"], dict(start["headers"]), body["body"]

    status, headers, body = asyncio.run(main())
    assert status == 503
    assert headers[b"retry-after"] == b"1"
    assert b"is full (1 inputs)" in body
