"""What a shadow replay and a migration dry run report when they cannot do their work:
a selection that chooses no execution is no pass (``statifier replay`` exits 1 and
says what it selected by), and an input-log entry that cannot be decoded makes its
execution alone untrusted, the others compared."""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3
from pathlib import Path

import pytest

from statifier import cli
from statifier.chart import Machine, compile_chart
from statifier.core import Event
from statifier.migration_dry_run import migration_dry_run
from statifier.persistence import Executions, Status, Storage
from statifier.persistence.executor import ignore_effects
from statifier.persistence.migration import MIGRATE_VIA
from statifier.persistence.sql import SqlAdapter
from statifier.shadow import Selection, Verdict, shadow_replay
from statifier.sql import migrations

CART = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="cart">
<datamodel><data id="total" expr="0"/></datamodel>
<state id="cart">
  <transition event="add"><assign location="total" expr="total + _event.data.amount"/></transition>
  <transition event="checkout" target="paying"/>
</state>
<state id="paying"><transition event="paid" target="done"/></state>
<final id="done"/>
</scxml>
"""

IDS = ("ex-0", "ex-1", "ex-2")

DEEP = b"[" * 100_000 + b"]" * 100_000
"""An input-log entry nested far deeper than anything written (the decoder's stack
gives out long before its end)."""


def cart() -> Machine:
    return compile_chart(CART, name="cart")


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A SQLite database holding three executions of ``cart``, each with two inputs."""
    database = f"sqlite:///{tmp_path / 'shadow.db'}"
    migrations.upgrade(database)

    async def record() -> None:
        machine = cart()
        async with SqlAdapter(database) as adapter:
            lifecycle = Executions(Storage(adapter), executor=ignore_effects)
            for execution_id in IDS:
                await lifecycle.create(execution_id, machine)
                await lifecycle.step(execution_id, machine, Event("add", data={"amount": 10}))
                await lifecycle.step(execution_id, machine, Event("checkout"))

    asyncio.run(record())
    return database


def damage(url: str, execution_id: str, blob: bytes, via: str | None = None) -> None:
    """Overwrite the first input-log entry of ``execution_id`` (and its ``via``)."""
    with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
        connection.execute(
            "update statifier_inputs set input_blob = ?, via = coalesce(?, via)"
            " where execution_id = ? and seq = (select min(seq) from statifier_inputs"
            " where execution_id = ?)",
            (blob, via, execution_id, execution_id),
        )


def run_cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return cli.main(["replay", *argv], out), out.getvalue()


def chart_file(tmp_path: Path, name: str) -> str:
    path = tmp_path / f"{name}.scxml"
    path.write_text(CART, encoding="utf-8")
    return str(path)


# Nothing selected.


def test_a_replay_that_selects_nothing_exits_1_and_names_the_selection(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    revision = chart_file(tmp_path, "cart-v2")
    # Named as stored: all three compared, the same.
    status, text = run_cli("--chart", revision, "--document", "cart", "--database", url)
    assert status == 0
    assert text.splitlines()[-1].startswith("3 executions replayed on sha256:")
    # The file's stem selects by default, and no chart is stored as 'cart-v2'.
    status, text = run_cli("--chart", revision, "--database", url)
    assert status == 1
    assert text.startswith(
        "no executions selected: document 'cart-v2' (the chart file's stem: "
        "--document names another); nothing tried on sha256:"
    )
    assert text.count("\n") == 1
    # A typo, with the other filters given named too.
    status, text = run_cli(
        "--chart",
        revision,
        "--database",
        url,
        "--document",
        "crat",
        "--status",
        "active",
        "--created-after",
        "2026-01-01T00:00:00+00:00",
        "--limit",
        "5",
    )
    assert status == 1
    assert text.startswith(
        "no executions selected: document 'crat', status active, "
        "created after 2026-01-01T00:00:00+00:00, at most 5; nothing tried on sha256:"
    )
    # Filters that leave nothing of the right chart.
    status, text = run_cli(
        "--chart", revision, "--database", url, "--document", "cart", "--status", "completed"
    )
    assert (status, text.split(";")[0]) == (
        1,
        "no executions selected: document 'cart', status completed",
    )
    capsys.readouterr()
    # With --json: the document on standard output says it, the line goes to stderr.
    status, text = run_cli("--chart", revision, "--database", url, "--json")
    assert status == 1
    assert json.loads(text)["selected"] == 0
    assert capsys.readouterr().err.startswith("no executions selected: document 'cart-v2'")


def test_a_migration_dry_run_that_selects_nothing_exits_1(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    revision = chart_file(tmp_path, "cart-v2")
    status, text = run_cli("--chart", revision, "--database", url, "--migrate")
    assert status == 1
    assert text.startswith("no executions selected: document 'cart-v2' (the chart file's stem")
    status, text = run_cli("--chart", revision, "--database", url, "--migrate", "--json")
    assert status == 1
    assert json.loads(text)["selected"] == 0
    assert capsys.readouterr().err.startswith("no executions selected: document 'cart-v2'")
    # Selected, and clean: 0.
    status, text = run_cli(
        "--chart", revision, "--database", url, "--migrate", "--document", "cart"
    )
    assert status == 0
    assert text.startswith("3 executions on sha256:")


def test_the_summaries_say_how_many_executions_were_selected(url: str) -> None:
    revision = cart()
    summary = asyncio.run(shadow_replay(url, revision))
    assert (summary.selected, summary.all_same, summary.as_json()["selected"]) == (3, True, 3)
    none = asyncio.run(shadow_replay(url, revision, Selection(document="crat")))
    assert (none.selected, none.as_json()["selected"], none.results) == (0, 0, ())
    dry = asyncio.run(migration_dry_run(url, revision, Selection(status=Status.COMPLETED)))
    assert (dry.selected, dry.as_json()["selected"]) == (0, 0)
    assert asyncio.run(migration_dry_run(url, revision)).selected == 3


# A damaged input-log entry.


def test_a_deeply_nested_input_entry_makes_its_execution_alone_untrusted(url: str) -> None:
    damage(url, "ex-1", DEEP)
    revision = cart()
    for workers in (1, 2):
        summary = asyncio.run(shadow_replay(url, revision, workers=workers))
        verdicts = {result.execution_id: result.verdict for result in summary.results}
        assert verdicts == {
            "ex-0": Verdict.SAME,
            "ex-1": Verdict.UNTRUSTED,
            "ex-2": Verdict.SAME,
        }
        why = summary.results[1].untrusted
        assert why is not None
        assert why.startswith("its input log cannot be read: input ")
        assert "NotAPosition: the bytes are not a stored event: nested too deep" in why
    # A continuation reads the logs too (of executions on another revision).
    v2 = compile_chart(CART.replace("</scxml>", "<!-- v2 --></scxml>"), name="cart")
    dry = asyncio.run(migration_dry_run(url, v2, at=0))
    continuations = [result.continuation for result in dry.results]
    assert [None if c is None else c.verdict for c in continuations] == [
        Verdict.SAME,
        Verdict.UNTRUSTED,
        Verdict.SAME,
    ]


def test_the_command_reports_a_deeply_nested_input_entry_and_compares_the_rest(
    url: str, tmp_path: Path
) -> None:
    damage(url, "ex-1", DEEP)
    revision = chart_file(tmp_path, "cart")
    status, text = run_cli("--chart", revision, "--database", url)
    lines = text.splitlines()
    assert status == 1
    assert lines[0].startswith("ex-1: untrusted: its input log cannot be read: input ")
    assert lines[1].endswith(": 2 same, 0 diverged, 0 with new errors, 1 untrusted")


def test_a_deeply_nested_migration_entry_makes_its_execution_alone_untrusted(
    url: str,
) -> None:
    # A migration's entry is read by json.loads, whose RecursionError the entry's
    # reader turns into NotAPosition, as any damaged entry.
    damage(url, "ex-2", DEEP, via=MIGRATE_VIA)
    summary = asyncio.run(shadow_replay(url, cart()))
    assert [result.verdict for result in summary.results] == [
        Verdict.SAME,
        Verdict.SAME,
        Verdict.UNTRUSTED,
    ]
    why = summary.results[2].untrusted
    assert why is not None
    assert "not a logged migration" in why
