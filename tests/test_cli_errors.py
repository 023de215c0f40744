"""The command line's errors: one line on stderr, exit 2, a traceback only under
``--debug``; missing extras, unmigrated databases and bad revisions in the user's words
(issue 17, item 3)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

import statifier.cli as cli
from statifier.cli import main
from statifier.extras import MissingExtra, extra_for
from statifier.persistence.records import ChartRecord
from statifier.persistence.sql import SqlAdapter
from statifier.sql import TableOptions, TablesMissing, migrations

from .expr.test_messages import opcode_names_in


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


def _blocked(module: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """The command run in a fresh interpreter where ``module`` cannot be imported."""
    code = (
        "import sys\n"
        f"sys.modules[{module!r}] = None\n"
        "from statifier.cli import main\n"
        f"sys.exit(main({argv!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize(
    ("module", "argv", "line"),
    [
        (
            "psycopg",
            ["db", "upgrade", "--url", "postgresql://postgres@127.0.0.1:1/none"],
            (
                "statifier db upgrade: PostgreSQL needs the postgres extra: "
                "pip install 'statifier[postgres]'"
            ),
        ),
        (
            "sqlalchemy",
            ["db", "upgrade"],
            (
                "statifier db upgrade: the SQL layer (durable executions, migrations, the router) "
                "needs the sqlite extra: pip install 'statifier[sqlite]'"
            ),
        ),
        (
            "alembic",
            ["db", "upgrade"],
            (
                "statifier db upgrade: the SQL layer (durable executions, migrations, the router) "
                "needs the sqlite extra: pip install 'statifier[sqlite]'"
            ),
        ),
        (
            "sqlalchemy",
            ["scenario", "case.json", "--charts", "."],
            (
                "statifier scenario: the SQL layer (durable executions, migrations, the router) "
                "needs the sqlite extra: pip install 'statifier[sqlite]'"
            ),
        ),
    ],
)
def test_a_missing_extra_names_the_extra(
    module: str, argv: list[str], line: str, tmp_path: Path
) -> None:
    if argv[:2] == ["db", "upgrade"] and "--url" not in argv:
        argv += ["--url", f"sqlite:///{tmp_path / 'x.db'}"]
    done = _blocked(module, argv)
    assert (done.returncode, done.stderr, done.stdout) == (2, line + "\n", "")


def test_basichttp_without_the_http_extra(tmp_path: Path) -> None:
    chart = Path(cli.__file__).parent / "examples" / "order.scxml"
    done = _blocked("httpx", ["trace", str(chart), "--basichttp"])
    assert done.returncode == 2
    assert done.stderr == (
        "statifier trace: --basichttp: BasicHTTP needs the http extra: "
        "pip install 'statifier[http]'\n"
    )


def test_the_adapter_names_the_postgres_extra() -> None:
    code = (
        "import sys\nsys.modules['psycopg'] = None\n"
        "from statifier.persistence.sql import SqlAdapter\n"
        "try:\n    SqlAdapter('postgresql://postgres@127.0.0.1:1/none')\n"
        "except ModuleNotFoundError as e:\n    print(type(e).__name__, e.extra, e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout == (
        "MissingExtra postgres PostgreSQL needs the postgres extra: "
        "pip install 'statifier[postgres]'\n"
    )


def test_extra_for_knows_only_the_optional_libraries() -> None:
    assert extra_for(ModuleNotFoundError("x", name="psycopg_pool")) == ("postgres", "PostgreSQL")
    assert extra_for(ModuleNotFoundError("x", name="alembic.config"))[0] == "sqlite"  # type: ignore[index]
    assert extra_for(ModuleNotFoundError("x", name="json")) is None
    plain = ModuleNotFoundError("x", name="mystery")
    assert MissingExtra.of(plain) is plain


def test_a_bad_revision_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    assert run("db", "upgrade", "--url", url, "--revision", "nope") == (2, "")
    assert capsys.readouterr().err == (
        "statifier db upgrade: revision 'nope': there is no revision 'nope' "
        "(the revisions are head, base, statifier_0001, statifier_0002, statifier_0003, "
        "statifier_0004, statifier_0005, statifier_0006, statifier_0007, statifier_0008, "
        "statifier_0009, statifier_0010, statifier_0011, statifier_0012, statifier_0013, "
        "statifier_0014, statifier_0015, statifier_0016, statifier_0017, statifier_0018, "
        "statifier_0019, statifier_0020, statifier_0021, statifier_0022, statifier_0023, "
        "statifier_0024, statifier_0025, statifier_0026, statifier_0027, statifier_0028, "
        "statifier_0029)\n"
    )
    with pytest.raises(migrations.BadRevision) as raised:
        migrations.upgrade(url, revision="nope")
    assert isinstance(raised.value, ValueError)
    assert raised.value.revision == "nope"


def test_debug_adds_the_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    assert run("--debug", "db", "upgrade", "--url", url, "--revision", "nope") == (2, "")
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert err.endswith(
        "(the revisions are head, base, statifier_0001, statifier_0002, statifier_0003, "
        "statifier_0004, statifier_0005, statifier_0006, statifier_0007, statifier_0008, "
        "statifier_0009, statifier_0010, statifier_0011, statifier_0012, statifier_0013, "
        "statifier_0014, statifier_0015, statifier_0016, statifier_0017, statifier_0018, "
        "statifier_0019, statifier_0020, statifier_0021, statifier_0022, statifier_0023, "
        "statifier_0024, statifier_0025, statifier_0026, statifier_0027, statifier_0028, "
        "statifier_0029)\n"
    )


def test_an_unexpected_exception_is_one_line_naming_the_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(args: object, out: object) -> int:
        raise KeyError("oops")

    monkeypatch.setattr(cli, "_run_graph", broken)
    assert run("graph", "chart.scxml") == (2, "")
    assert capsys.readouterr().err == (
        "statifier graph: unexpected KeyError: 'oops' "
        "(statifier --debug graph ... shows the traceback)\n"
    )
    assert run("--debug", "graph", "chart.scxml") == (2, "")
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert "KeyError: 'oops'" in err
    assert err.endswith("statifier graph: unexpected KeyError: 'oops'\n")


@pytest.mark.parametrize(
    "error",
    [
        TablesMissing("statifier_charts"),
        sqlite3.OperationalError("no such table: statifier_charts"),
    ],
)
def test_a_database_without_the_tables_says_to_upgrade(
    error: Exception, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def unmigrated(args: object, out: object) -> int:
        raise error

    monkeypatch.setattr(cli, "_run_graph", unmigrated)
    assert run("graph", "chart.scxml") == (2, "")
    assert capsys.readouterr().err == (
        "statifier graph: the database has no table statifier_charts: run `statifier db "
        "upgrade` (with the same --url and --prefix) first\n"
    )


def _on_unmigrated(url: str, options: TableOptions) -> list[str]:
    async def go() -> list[str]:
        seen = []
        async with SqlAdapter(url, options) as adapter:
            now = datetime(2026, 1, 1, tzinfo=UTC)
            with pytest.raises(TablesMissing) as raised:
                await adapter.fetch_chart("h")
            seen.append(raised.value.table)
            with pytest.raises(TablesMissing) as raised:
                await adapter.save_chart(
                    ChartRecord("h", source=b"<scxml/>", name="c", version="1", saved_at=now)
                )
            seen.append(raised.value.table)
            with pytest.raises(TablesMissing) as raised:
                async with adapter.exclusive("e", None):
                    await adapter.fetch_execution("e")
            seen.append(raised.value.table)
            with pytest.raises(TablesMissing) as raised:
                async with adapter.transaction() as tx:
                    await tx.adapter.fetch_execution("e")
            seen.append(raised.value.table)
            assert "statifier db upgrade" in str(raised.value)
        return seen

    return asyncio.run(go())


def test_the_sqlite_adapter_raises_tables_missing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    assert _on_unmigrated(url, TableOptions()) == [
        "statifier_charts",
        "statifier_charts",
        "statifier_executions",
        "statifier_executions",
    ]


def test_the_postgres_adapter_raises_tables_missing() -> None:
    url = os.environ["DATABASE_URL"]
    options = TableOptions(prefix="never_migrated_")
    assert _on_unmigrated(url, options) == [
        "never_migrated_charts",
        "never_migrated_charts",
        "never_migrated_executions",
        "never_migrated_executions",
    ]


def test_a_missing_table_of_the_callers_own_stays_as_it_is(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'own.db'}"
    migrations.upgrade(url)

    async def go() -> None:
        async with SqlAdapter(url) as adapter, adapter.transaction() as tx:
            tx.driver.execute("SELECT * FROM my_own_table")

    with pytest.raises(sqlite3.OperationalError, match="my_own_table"):
        asyncio.run(go())


def test_no_cli_error_message_names_an_internal_opcode() -> None:
    sources = ["1 and true", "1 && true", "'a' || true", "not 5", "!5", "1 + true", "nope(1)"]
    for source in sources:
        status, text = run("expr", source)
        assert status == 1
        message = json.loads(text)["error"]["message"]
        assert opcode_names_in(message) == set(), message
    status, text = run("expr", "if 1 { x = 1 }", "--program")
    message = json.loads(text)["error"]["message"]
    assert opcode_names_in(message) == set(), message


def test_a_function_error_prints_its_code() -> None:
    status, text = run("expr", "nope(1)")
    assert status == 1
    assert json.loads(text)["error"] == {
        "type": "EvaluationError",
        "reason": "Unknown function: nope",
        "message": "Unknown function: nope",
        "code": "unknown_function",
        "line": 1,
        "column": 1,
    }
    status, text = run("expr", "1 and true")
    assert "code" not in json.loads(text)["error"]  # the reason is the code


def test_the_docs_show_these_outputs() -> None:
    """Each output line the tests above pin is shown as it is in docs/errors.md."""
    page = (Path(__file__).parent.parent / "docs" / "errors.md").read_text(encoding="utf-8")
    lines = [
        (
            "statifier db upgrade: PostgreSQL needs the postgres extra: "
            "pip install 'statifier[postgres]'"
        ),
        (
            "statifier db upgrade: the SQL layer (durable executions, migrations, the router) "
            "needs the sqlite extra: pip install 'statifier[sqlite]'"
        ),
        (
            "statifier trace: --basichttp: BasicHTTP needs the http extra: "
            "pip install 'statifier[http]'"
        ),
        (
            "statifier db upgrade: revision 'nope': there is no revision 'nope' "
            "(the revisions are head, base, statifier_0001, statifier_0002, statifier_0003, "
            "statifier_0004, statifier_0005, statifier_0006, statifier_0007, statifier_0008, "
            "statifier_0009, statifier_0010, statifier_0011, statifier_0012, statifier_0013, "
            "statifier_0014, statifier_0015, statifier_0016, statifier_0017, statifier_0018, "
            "statifier_0019, statifier_0020, statifier_0021, statifier_0022, statifier_0023, "
            "statifier_0024, statifier_0025, statifier_0026, statifier_0027, statifier_0028, "
            "statifier_0029)"
        ),
        (
            "statifier graph: unexpected KeyError: 'oops' "
            "(statifier --debug graph ... shows the traceback)"
        ),
        (
            "the database has no table statifier_charts: run `statifier db upgrade` "
            "(with the same --url and --prefix) first"
        ),
    ]
    lines += [run("expr", source)[1].rstrip("\n") for source in ("1 and true", "1 && true")]
    lines.append(run("expr", "nope(1)")[1].rstrip("\n"))
    lines.append(run("expr", "if 1 { x = 1 }", "--program")[1].rstrip("\n"))
    assert [line for line in lines if line not in page] == []


@pytest.mark.parametrize("command", [["executions", "list"], ["schedules", "list"]])
@pytest.mark.parametrize(
    "url",
    [
        "postgresql+asyncpg://app:hunter2@127.0.0.1/shop",  # another program's driver
        "postgresql://app:hunter2@127.0.0.1:54321x/shop",  # a port mistyped
    ],
)
def test_a_refused_url_is_named_without_its_password(
    command: list[str], url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, "--database", url]) == 2
    said = capsys.readouterr()
    assert "hunter2" not in said.out + said.err
    assert "app:***@127.0.0.1" in said.err
