"""The test kit's parts: a plugin that loads nothing heavy and hides no fixture, the
manual clock's refusals, the exported file's format and bounds, and ``statifier
executions export``."""

from __future__ import annotations

import ast
import asyncio
import importlib.metadata
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.test_durable import DOOR

from statifier import cli
from statifier.core import Event
from statifier.durable import Durable, UnknownChart
from statifier.durable.export import (
    ExportedExecution,
    ExportError,
    export_input_logs,
    input_logs_json,
    read_input_logs,
)
from statifier.persistence import LoggedInput, Status
from statifier.testing import (
    ManualClock,
    TimerStuck,
    assert_replays_same,
    replay_input_logs,
    sqlite_durable,
)

TESTS = Path(__file__).parent


def test_the_plugin_is_registered_under_the_pytest11_entry_point() -> None:
    found = [
        entry.value
        for entry in importlib.metadata.entry_points(group="pytest11")
        if entry.name == "statifier"
    ]
    assert found == ["statifier.testing.plugin"]


def test_loading_the_plugin_imports_nothing_of_the_library() -> None:
    probe = (
        "import sys, statifier.testing.plugin; "
        "print(sorted(m for m in sys.modules if m.startswith(('statifier.', 'sqlalchemy'))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert ast.literal_eval(loaded) == [
        "statifier.testing",
        "statifier.testing.clock",
        "statifier.testing.plugin",
        "statifier.testing.replay",
        "statifier.testing.scenario",
        "statifier.testing.store",
    ]


def _fixture_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if "fixture" in ast.unparse(target):
                    names.add(node.name)
    return names


def test_every_fixture_of_the_plugin_is_namespaced_and_none_is_the_suites_own() -> None:
    import statifier.testing.plugin as plugin

    ours = _fixture_names(ast.parse(Path(plugin.__file__).read_text(encoding="utf-8")))
    assert ours == {
        "statifier_charts",
        "statifier_clock",
        "statifier_durable",
        "statifier_scenario",
    }
    suites = set()
    for path in TESTS.rglob("*.py"):
        suites |= _fixture_names(ast.parse(path.read_text(encoding="utf-8")))
    assert not ours & suites


def test_a_clock_refuses_a_naive_time_and_a_backward_or_malformed_step(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        ManualClock(datetime(2026, 1, 1))  # noqa: DTZ001 - the naive time refused
    clock = ManualClock(datetime(2026, 3, 1, 12, tzinfo=UTC))

    async def advance(by: Any) -> int:
        async with sqlite_durable(tmp_path, clock=clock) as durable:
            return int(await clock.advance(durable, by))

    with pytest.raises(ValueError, match="forward"):
        asyncio.run(advance(timedelta(seconds=-1)))
    with pytest.raises(ValueError, match="not a duration"):
        asyncio.run(advance("P1M"))
    assert asyncio.run(advance("P2D")) == 0
    assert clock() == datetime(2026, 3, 3, 12, tzinfo=UTC)


def test_a_timer_whose_fire_raises_stops_the_advance(tmp_path: Path) -> None:
    ticking = (
        '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="a">'
        '<state id="a"><onentry><send event="tick" delay="5s"/></onentry>'
        '<transition event="tick" target="b"><log expr="\'ticked\'"/></transition></state>'
        '<final id="b"/></scxml>'
    )

    def broken(effect: Any, context: Any) -> None:
        if type(effect).__name__ == "Log":
            raise RuntimeError("the host's log is down")

    clock = ManualClock()

    async def run() -> None:
        async with sqlite_durable(
            tmp_path, charts={"ticking": ticking}, clock=clock, executor=broken
        ) as durable:
            await durable.create("ticking", "t_1")
            await clock.advance(durable, "PT1M")

    with pytest.raises(TimerStuck, match=r"the timer due at 2026-01-01T00:00:05\+00:00"):
        asyncio.run(run())


def test_sqlite_durable_needs_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a directory"):
        sqlite_durable(tmp_path / "missing")


async def _doors(folder: Path) -> dict[str, Any]:
    async with sqlite_durable(folder, charts={"door": DOOR}, clock=ManualClock()) as durable:
        await durable.create("door", "d_1", data={"knocks": 2})
        await durable.send(
            "d_1", "knock", {"by": "the postman", "at": datetime(2026, 1, 2, tzinfo=UTC)}
        )
        await durable.send("d_1", "close")
        await durable.create("door", "d_2")
        await durable.cancel("d_2")
        return await input_logs_json(durable)


def test_an_export_holds_each_chart_once_and_each_log_as_stored(tmp_path: Path) -> None:
    document = asyncio.run(_doors(tmp_path))
    assert document["format"] == "statifier.input-logs"
    [(content_hash, chart)] = document["charts"].items()
    assert chart == {"name": "door", "source": DOOR}
    first, second = document["executions"]
    assert first["content_hash"] == content_hash
    assert (first["status"], first["final_state"], first["outcome"]) == (
        "completed",
        "closed",
        {"knocks": 3},
    )
    assert [entry["via"] for entry in first["inputs"]] == ["create", "step", "step"]
    assert (second["status"], second["configuration"], second["inputs"]) == ("cancelled", [], [])
    file = tmp_path / "doors.json"
    file.write_text(json.dumps(document), encoding="utf-8")
    read = read_input_logs(file)
    assert [(e.id, e.status, e.final_state) for e in read] == [
        ("d_1", Status.COMPLETED, "closed"),
        ("d_2", Status.CANCELLED, None),
    ]
    knocked = read[0].inputs[1].event
    assert knocked is not None
    assert knocked.data == {"by": "the postman", "at": datetime(2026, 1, 2, tzinfo=UTC)}
    replayed = assert_replays_same(file, {"door": DOOR})
    assert [entry.result.inputs for entry in replayed] == [2, 0]


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"{" * 20_000, "larger than 10000 bytes"),
        (b"[" * 200 + b"]" * 200, "not JSON (depth)"),
        (b"{'format': 1}", "not JSON (syntax)"),
        (b'{"format": "statifier.input-logs", "version": 2}', "format and version"),
        (
            b'{"format": "statifier.input-logs", "version": 1, "charts": {}}',
            "the key 'executions' is missing",
        ),
        (
            b'{"format": "statifier.input-logs", "version": 1, "charts": {}, "executions": [1]}',
            "executions[0] is not an object",
        ),
    ],
)
def test_reading_a_file_is_bounded_and_says_what_is_wrong(
    tmp_path: Path, content: bytes, said: str
) -> None:
    file = tmp_path / "logs.json"
    file.write_bytes(content)
    with pytest.raises(ExportError) as refused:
        read_input_logs(file, max_bytes=10_000)
    assert str(refused.value).startswith(f"{file}: ")
    assert said in str(refused.value)


def test_reading_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="cannot read"):
        read_input_logs(tmp_path / "absent.json")


values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=5).filter(lambda k: k != "$type"), inner, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=10), values), max_size=5))
def test_a_log_read_back_from_a_file_is_the_log_exported(
    tmp_path_factory: pytest.TempPathFactory, events: list[tuple[str, Any]]
) -> None:
    from statifier.durable.export import FORMAT, VERSION, _input_json

    at = datetime(2026, 1, 1, tzinfo=UTC)
    log = [
        LoggedInput(seq, "step", Event(name, data=data), at)
        for seq, (name, data) in enumerate(events)
    ]
    document = {
        "format": FORMAT,
        "version": VERSION,
        "charts": {"h": {"name": "door", "source": DOOR}},
        "executions": [
            {
                "id": "x",
                "chart": "door",
                "content_hash": "h",
                "status": "active",
                "configuration": ["open"],
                "final_state": None,
                "outcome": None,
                "options": {"round_budget": 100, "send_types": [], "invoke_types": None},
                "inputs": [_input_json(entry) for entry in log],
            }
        ],
    }
    file = tmp_path_factory.mktemp("logs") / "logs.json"
    file.write_text(json.dumps(document), encoding="utf-8")
    [execution] = read_input_logs(file)
    assert list(execution.inputs) == log


def test_a_chart_without_a_revision_is_refused(tmp_path: Path) -> None:
    asyncio.run(_export(tmp_path))
    with pytest.raises(UnknownChart, match="no chart named 'door'"):
        replay_input_logs(tmp_path / "doors.json", {"dor": DOOR})


async def _export(folder: Path) -> int:
    document = await _doors(folder)
    (folder / "doors.json").write_text(json.dumps(document), encoding="utf-8")
    return len(document["executions"])


def test_an_execution_that_cannot_be_compared_fails_the_assertion(tmp_path: Path) -> None:
    asyncio.run(_export(tmp_path))
    [first, _] = read_input_logs(tmp_path / "doors.json")
    with pytest.raises(AssertionError) as failed:
        assert_replays_same([first], {"door": DOOR}, max_inputs=1)
    assert str(failed.value).startswith(
        "1 of 1 recorded execution replay differently on the revision:\n"
        "  d_1 (door, recorded completed in closed): cannot be compared: "
    )
    assert isinstance(first, ExportedExecution)


def test_the_command_exports_the_executions_it_is_asked_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_doors(tmp_path))
    url = f"sqlite:///{tmp_path / 'statifier.db'}"
    file = tmp_path / "out.json"
    assert (
        cli.main(["executions", "export", str(file), "--status", "completed", "--database", url])
        == 0
    )
    assert capsys.readouterr().out == f"1 execution exported to {file}\n"
    assert [e.id for e in read_input_logs(file)] == ["d_1"]
    assert (
        cli.main(
            ["executions", "export", str(file), "--id", "d_2", "--id", "d_1", "--database", url]
        )
        == 0
    )
    assert [e.id for e in read_input_logs(file)] == ["d_2", "d_1"]
    refused = [
        "executions",
        "export",
        str(file),
        "--id",
        "d_1",
        "--chart",
        "door",
        "--database",
        url,
    ]
    assert cli.main(refused) == 2
    assert "--id names the executions" in capsys.readouterr().err
    assert (
        cli.main(["executions", "export", str(tmp_path / "no" / "x.json"), "--database", url]) == 2
    )
    assert "cannot write" in capsys.readouterr().err


def test_export_input_logs_writes_the_file(tmp_path: Path) -> None:
    async def run() -> int:
        await _doors(tmp_path)
        async with Durable(f"sqlite:///{tmp_path / 'statifier.db'}") as durable:
            return await export_input_logs(durable, tmp_path / "all.json")

    assert asyncio.run(run()) == 2
    assert json.loads((tmp_path / "all.json").read_text(encoding="utf-8"))["version"] == 1


def test_an_execution_whose_position_was_pruned_cannot_be_exported(tmp_path: Path) -> None:
    clock = ManualClock()

    async def run() -> None:
        async with sqlite_durable(tmp_path, charts={"door": DOOR}, clock=clock) as durable:
            await durable.create("door", "d_1")
            await durable.send("d_1", "close")
            assert await durable.executions.storage.prune(clock() + timedelta(days=1), 10)
            await input_logs_json(durable)

    with pytest.raises(ExportError, match=r"^d_1: cannot be exported: "):
        asyncio.run(run())


def test_a_revision_that_raises_new_errors_fails_with_the_first(tmp_path: Path) -> None:
    asyncio.run(_export(tmp_path))
    noisy = DOOR.replace(
        '<assign location="knocks" expr="knocks + 1"/>',
        '<assign location="knocks" expr="knocks + 1"/><log expr="nobody.name"/>',
    )
    with pytest.raises(AssertionError) as failed:
        assert_replays_same(tmp_path / "doors.json", {"door": noisy})
    message = str(failed.value)
    assert message.startswith(
        "1 of 2 recorded executions replay differently on the revision:\n"
        "  d_1 (door, recorded completed in closed): the revision raised 1 new error, "
        "the first at input 1 ('knock'): error.execution at <log>"
    ), message


def test_next_due_needs_a_timer_queue() -> None:
    from statifier.persistence import MemoryAdapter

    async def run() -> None:
        async with Durable(MemoryAdapter()) as durable:
            await durable.next_due()

    with pytest.raises(RuntimeError, match="only a SQL database keeps timers"):
        asyncio.run(run())
