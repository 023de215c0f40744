"""Fresh installs that run: every documented extra set, installed alone in a fresh
virtual environment, imports what it promises and names what it lacks.

For each extra set the docs name (the core with no extra; each extra of the README's
table alone; every ``statifier[...]`` the README and the guides tell a user to install),
a fresh virtual environment (no system site-packages, no ``PYTHONPATH``) gets
the project's wheel with exactly that set, from a wheelhouse built once per run. Inside
it, ``tests/fresh_imports.py`` imports every module of ``statifier`` and ``scriba``.

Which modules: every module of a regular package whose dotted name has no part that
starts with an underscore. That is more than the public API of
``docs/architecture.md`` (the packages and the modules it lists): the internal modules
too, because the guides import modules that list does not name (the fronts' modules,
``statifier.router.outbox``, ``scriba.testing``) and an internal module is one refactor
away from being imported by a public one. Private modules (a part starting with ``_``,
such as ``statifier.examples.card_payment.__main__``) and Alembic's revision files (no
package: Alembic loads them by path) are left out.

How each import must end, under an extra set:

- a module the set is documented to enable (:data:`MATRIX`) imports;
- any other module imports, or raises :class:`statifier.extras.MissingExtra` naming an
  extra the set does not hold;
- anything else fails: a bare :class:`ModuleNotFoundError` for an optional library, a
  ``MissingExtra`` naming an extra the set holds, any other error. The one exception is
  :data:`TOOLS`: a module built for a test suite may name the test tool it needs.

Then the commands the docs promise run under their set: ``statifier demo`` under the
``demo`` extra (what ``./dev demo`` installs); the README's quickstart,
``statifier db upgrade``, ``statifier scenario`` and ``statifier check`` on SQLite under
``sqlite``; ``statifier db upgrade`` on PostgreSQL under ``postgres``; ``statifier
serve`` on SQLite under ``sqlite`` and ``http`` (the ``demo`` extra is exactly those),
reaching ``/healthz``. A command used without its extra answers one line naming it.

The README's table of extras is the human form of :data:`MATRIX`;
:func:`test_the_readme_table_and_the_matrix_agree` keeps the two in step.

Building the wheelhouse needs the package index the suite was installed from (pip's
cache makes a second run quick); every environment is then installed from the
wheelhouse alone, offline.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest

from .fresh_imports import modules
from .test_readme import quickstart_files, quickstart_session

ROOT: Final = Path(__file__).parent.parent
WALKER: Final = Path(__file__).parent / "fresh_imports.py"
PYPROJECT: Final = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
EXTRAS: Final[dict[str, list[str]]] = PYPROJECT["project"]["optional-dependencies"]
UNTESTED_EXTRAS: Final = frozenset({"dev", "bench"})  # the project's own tools, not a user's


@dataclass(frozen=True)
class Enables:
    """What one extra enables, as module trees (a name: that module, and every module
    under it when it is a package).

    Attributes:
        alone: what it enables by itself (the core beside it).
        beside_a_database: what it enables beside ``sqlite`` or ``postgres``.
    """

    alone: tuple[str, ...] = ()
    beside_a_database: tuple[str, ...] = ()


DATABASES: Final = frozenset({"sqlite", "postgres"})

MATRIX: Final[dict[str, Enables]] = {
    "sqlite": Enables(
        alone=("statifier.sql", "statifier.persistence.sql", "statifier.router", "statifier.fronts")
    ),
    "postgres": Enables(
        alone=(
            "statifier.sql",
            "statifier.persistence.sql",
            "statifier.persistence.sql.postgres",
            "statifier.router",
            "statifier.fronts",
        )
    ),
    "sql": Enables(alone=("statifier.sql",)),
    "http": Enables(
        alone=("statifier.session.basichttp", "statifier.client"),
        beside_a_database=(
            "statifier.fronts.webhook",
            "statifier.fronts.basichttp",
            "statifier.fronts.http_body",
            "statifier.fronts.verifiers",
            "statifier.api",
            "statifier.service",
        ),
    ),
    "kafka": Enables(beside_a_database=("statifier.fronts.kafka",)),
    "nats": Enables(beside_a_database=("statifier.fronts.nats",)),
    "otel": Enables(alone=("statifier.observability.otel",)),
    "crypto": Enables(alone=("statifier.persistence.fernet",)),
    "scriba": Enables(alone=("scriba",)),
    "console": Enables(beside_a_database=("statifier.console",)),
    "demo": Enables(alone=("statifier.examples",)),
}
"""Each extra of ``pyproject.toml`` a user installs: what it enables. The core (no
extra) enables :data:`CORE`. A module belongs to the rows whose tree names it most
closely (``statifier.persistence.sql.postgres`` to ``postgres`` alone, the rest of
``statifier.persistence.sql`` to ``sqlite`` and ``postgres``), and is enabled under a
set that satisfies one of them."""

CORE: Final = ("statifier",)
"""What no extra is needed for: everything of ``statifier`` no row claims more closely
(expressions, charts, the interpreter, live sessions, durable executions in memory, the
``statifier`` command itself, telemetry and the log bridge)."""

TOOLS: Final[dict[str, tuple[str, ...]]] = {
    "statifier.persistence.testing": ("pytest", "pytest_asyncio"),
    "statifier.testing.plugin": ("pytest",),
}
"""Modules for a test suite, and the test tools (no extra's) they import."""

DEMO: Final = frozenset({"demo"})
"""What ``./dev demo`` installs: exactly ``sqlite`` and ``http`` (``pyproject.toml``), the
extras ``docs/serve.md`` names for ``statifier serve`` on SQLite, which runs there too."""


def closure(extras: frozenset[str]) -> frozenset[str]:
    """``extras`` with the extras they name in turn (``console`` holds ``http``)."""
    found, todo = set(extras), list(extras)
    while todo:
        for requirement in EXTRAS[todo.pop()]:
            named = re.fullmatch(r"statifier\[([a-z,]+)\]", requirement)
            for extra in named[1].split(",") if named else ():
                if extra not in found:
                    found.add(extra)
                    todo.append(extra)
    return frozenset(found)


def enabled(module: str, extras: frozenset[str]) -> bool:
    """Whether ``module`` is documented to import under ``extras``."""
    held = closure(extras)
    claims = [(len(tree), True) for tree in CORE if _under(module, tree)]
    for extra, enables in MATRIX.items():
        with_database = extra in held and bool(held & DATABASES)
        claims += [(len(tree), extra in held) for tree in enables.alone if _under(module, tree)]
        claims += [
            (len(tree), with_database) for tree in enables.beside_a_database if _under(module, tree)
        ]
    if module in TOOLS or not claims:
        return False
    closest = max(length for length, _ in claims)
    return any(satisfied for length, satisfied in claims if length == closest)


def _under(module: str, tree: str) -> bool:
    return module == tree or module.startswith(tree + ".")


def judge(extras: frozenset[str], modules: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What is wrong with how the imports under ``extras`` ended (empty: nothing)."""
    held = closure(extras)
    wrong = []
    for module, ending in sorted(modules.items()):
        outcome = ending["outcome"]
        if outcome == "imported":
            continue
        if enabled(module, extras):
            wrong.append(f"{module}: documented to import, but {ending}")
        elif outcome == "missing_extra":
            if ending["extra"] in held or ending["extra"] not in EXTRAS:
                wrong.append(f"{module}: names the {ending['extra']} extra: {ending['message']}")
        elif not (
            ending["type"] == "ModuleNotFoundError"
            and str(ending["missing"]).partition(".")[0] in TOOLS.get(module, ())
        ):
            wrong.append(f"{module}: {ending['type']}: {ending['message']}")
    return wrong


def documented_sets() -> list[frozenset[str]]:
    """Every extra set to install: the core, each extra alone (``demo`` among them), and
    each set the README and the guides name in ``statifier[...]``."""
    sets = {frozenset[str]()}
    sets |= {frozenset({extra}) for extra in EXTRAS if extra not in UNTESTED_EXTRAS}
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for named in re.findall(r"statifier\[([a-z,]+)\]", page.read_text(encoding="utf-8")):
            sets.add(frozenset(named.split(",")))
    return sorted(sets, key=lambda extras: (len(extras), sorted(extras)))


def label(extras: frozenset[str]) -> str:
    return "+".join(sorted(extras)) or "core"


SETS: Final = documented_sets()


# The fresh environments.


def isolated(venv: Path | None = None) -> dict[str, str]:
    """The environment of a command in a fresh virtual environment: nothing of this
    test process's Python paths, pip reading no configuration of the machine."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV"))
    }
    environment |= {"PYTHONNOUSERSITE": "1", "PIP_CONFIG_FILE": os.devnull}
    if venv is not None:
        environment["PATH"] = f"{venv / 'bin'}{os.pathsep}{environment.get('PATH', '')}"
    return environment


def run(argv: list[str | Path], **options: Any) -> subprocess.CompletedProcess[str]:
    options.setdefault("timeout", 600)
    return subprocess.run(
        [str(part) for part in argv], capture_output=True, text=True, check=False, **options
    )


def checked(argv: list[str | Path], **options: Any) -> subprocess.CompletedProcess[str]:
    done = run(argv, **options)
    assert done.returncode == 0, f"{' '.join(map(str, argv))}\n{done.stdout}\n{done.stderr}"
    return done


@dataclass(frozen=True)
class Fresh:
    """One fresh virtual environment with the project and one extra set."""

    extras: frozenset[str]
    venv: Path
    report: dict[str, Any]

    def command(
        self, *argv: str | Path, cwd: Path, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """``statifier ARGV...`` of this environment, run in ``cwd``."""
        return run(
            [self.venv / "bin" / "statifier", *argv],
            cwd=cwd,
            env=isolated(self.venv),
            timeout=timeout,
        )


def build_wheelhouse(into: Path) -> Path:
    """The project's wheel, built once, and every wheel an extra needs, in ``into``;
    answers the project's wheel."""
    checked([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", into, ROOT])
    (wheel,) = into.glob("statifier-*.whl")
    everything = ",".join(sorted(set(EXTRAS) - UNTESTED_EXTRAS))
    checked(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--only-binary",
            ":all:",
            "--dest",
            into,
            f"{wheel}[{everything}]",
        ]
    )
    return wheel


def make_fresh(root: Path, wheelhouse: Path, wheel: Path, extras: frozenset[str]) -> Fresh:
    venv = root / label(extras)
    # No --system-site-packages, and no pip of its own: the test's pip installs into it.
    checked([sys.executable, "-m", "venv", "--without-pip", venv])
    requirement = f"{wheel}[{','.join(sorted(extras))}]" if extras else str(wheel)
    checked(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            venv / "bin" / "python",
            "install",
            "--no-index",
            "--find-links",
            wheelhouse,
            "--only-binary",
            ":all:",
            requirement,
        ],
        env=isolated(),
    )
    walked = checked([venv / "bin" / "python", "-I", WALKER], cwd=root, env=isolated(venv))
    return Fresh(extras, venv, json.loads(walked.stdout))


@pytest.fixture(scope="module")
def fresh() -> Iterator[dict[frozenset[str], Fresh]]:
    """A fresh environment per documented extra set, walked; two built at a time."""
    with tempfile.TemporaryDirectory(prefix="statifier-fresh-") as directory:
        root = Path(directory)
        wheelhouse = root / "wheelhouse"
        wheel = build_wheelhouse(wheelhouse)
        with ThreadPoolExecutor(max_workers=2) as pool:
            built = list(pool.map(lambda extras: make_fresh(root, wheelhouse, wheel, extras), SETS))
        yield {environment.extras: environment for environment in built}


# The imports.


@pytest.mark.parametrize("extras", SETS, ids=label)
def test_every_module_imports_or_names_an_extra_the_set_lacks(
    fresh: dict[frozenset[str], Fresh], extras: frozenset[str]
) -> None:
    environment = fresh[extras]
    report = environment.report
    # The walk saw this environment's install, not the source tree or the suite's venv.
    assert Path(report["prefix"]).resolve() == environment.venv.resolve()
    for located in report["located"].values():
        assert Path(located).resolve().is_relative_to(environment.venv.resolve())
    assert "pytest" not in report["distributions"]
    if not extras:
        assert report["distributions"] == ["statifier"]
    assert sorted(report["modules"]) == source_modules()
    assert judge(extras, report["modules"]) == []


def source_modules() -> list[str]:
    """The modules the walker must find: those of the source tree, by the same rule."""
    return sorted(
        name
        for package in ("statifier", "scriba")
        for name in modules(ROOT / "src" / package, package)
    )


def test_the_judge_refuses_what_a_fresh_install_must_not_do() -> None:
    imported = {"outcome": "imported"}
    bare = {
        "outcome": "error",
        "type": "ModuleNotFoundError",
        "missing": "psycopg",
        "message": "No module named 'psycopg'",
    }
    named = {"outcome": "missing_extra", "extra": "postgres", "message": "..."}
    sqlite = frozenset({"sqlite"})
    postgres_only = "statifier.persistence.sql.postgres"
    assert judge(sqlite, {postgres_only: named}) == []
    assert judge(frozenset({"postgres"}), {postgres_only: named}) != []
    assert judge(sqlite, {postgres_only: bare}) != []  # a bare missing library
    assert judge(sqlite, {"statifier.router": named}) != []  # documented under sqlite
    assert judge(sqlite, {"statifier.router": imported}) == []
    assert judge(sqlite, {"statifier.persistence.sql": {**named, "extra": "sqlite"}}) != []
    raised = {"outcome": "error", "type": "ValueError", "missing": None, "message": "x"}
    assert judge(frozenset(), {"statifier.fronts.kafka": raised}) != []
    tool = {**bare, "missing": "pytest", "message": "No module named 'pytest'"}
    assert judge(frozenset(), {"statifier.persistence.testing": tool}) == []
    assert judge(frozenset(), {"statifier.router": tool}) != []
    # The rows: the closest tree decides, and extras bring the extras they name.
    assert enabled("statifier.router.outbox", sqlite)
    assert not enabled(postgres_only, sqlite)
    assert enabled("statifier.session.basichttp", frozenset({"console"}))
    assert not enabled("statifier.console.app", frozenset({"console"}))
    assert enabled("statifier.console.app", frozenset({"console", "postgres"}))
    assert enabled("statifier.examples.parcel_service", frozenset({"demo"}))
    assert enabled("statifier.cli", frozenset())


def test_the_sets_are_the_documented_ones() -> None:
    labels = [label(extras) for extras in SETS]
    for expected in ("core", "sqlite", "http+postgres", "console+postgres", "demo"):
        assert expected in labels
    assert "dev" not in labels
    # ./dev demo installs the demo extra: sqlite and http, what serve on SQLite needs.
    assert "'.[demo]'" in (ROOT / "dev").read_text(encoding="utf-8")
    assert EXTRAS["demo"] == ["statifier[sqlite,http]"]
    serve = " ".join((ROOT / "docs" / "serve.md").read_text(encoding="utf-8").split())
    assert "It needs the `sqlite` (or `postgres`) and `http` extras" in serve


def test_the_readme_table_and_the_matrix_agree() -> None:
    install = (ROOT / "README.md").read_text(encoding="utf-8").split("## Install", 1)[1]
    rows = re.findall(r"^\| `([a-z]+)` \| (.*) \|$", install.split("\n## ", 1)[0], re.M)
    assert [extra for extra, _ in rows] == list(MATRIX)
    assert set(MATRIX) == set(EXTRAS) - UNTESTED_EXTRAS
    for extra, text in rows:
        enables = MATRIX[extra]
        named = set(re.findall(r"`((?:statifier|scriba)(?:\.[a-z_]+)*)`", text))
        named -= {"statifier"}
        # What the README promises, the matrix holds (and so the test checks).
        assert named <= {*enables.alone, *enables.beside_a_database}, extra
        assert ("beside `sqlite` or `postgres`" in text) == bool(enables.beside_a_database)


def test_the_errors_page_shows_what_an_import_without_its_extra_says(
    fresh: dict[frozenset[str], Fresh],
) -> None:
    modules = fresh[frozenset({"sqlite"})].report["modules"]
    page = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    for name in ("statifier.service", "scriba.sources"):
        assert modules[name]["outcome"] == "missing_extra"
        assert f"$ python -c 'import {name}'" in page
        assert f"statifier.extras.MissingExtra: {modules[name]['message']}\n" in page


# The commands the docs promise, under their set.


def test_the_demo_runs_under_the_demo_extra(
    fresh: dict[frozenset[str], Fresh], tmp_path: Path
) -> None:
    done = fresh[DEMO].command("demo", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "6. The whole service: statifier serve on SQLite" in done.stdout
    assert done.stdout.rstrip().endswith("stopped as on SIGTERM: exit status 0")


def test_the_sqlite_extra_runs_the_quickstart_and_the_sql_commands(
    fresh: dict[frozenset[str], Fresh], tmp_path: Path
) -> None:
    environment = fresh[frozenset({"sqlite"})]
    for name, text in quickstart_files().items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    for command, shown in quickstart_session():
        python, *arguments = command.split()
        done = run(
            [environment.venv / "bin" / python, *arguments],
            cwd=tmp_path,
            env=isolated(environment.venv),
        )
        assert (done.returncode, done.stdout) == (0, shown), done.stderr

    done = environment.command(
        "db", "upgrade", "--url", f"sqlite:///{tmp_path / 'db.db'}", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("statifier_tables at revision statifier_")

    example = ROOT / "examples" / "parcel_delivery"
    done = environment.command(
        "scenario", example / "two_sources.json", "--charts", example / "charts", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "completed"

    config = tmp_path / "check.toml"
    config.write_text(
        'document = "parcel_delivery"\n'
        f"charts = {json.dumps(str(example / 'charts'))}\n\n"
        "[[bindings]]\n"
        'id = "depot_scans_to_parcel"\n'
        'source = "depot_scanners"\n'
        "match = \"event.kind == 'scan'\"\n"
        'key = "trim(event.parcel_id::string)"\n'
        'document = "parcel_delivery"\n'
        'event = "parcel.scanned"\n',
        encoding="utf-8",
    )
    done = environment.command("check", config, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.endswith("parcel_delivery.scxml: ok\n")


def test_the_postgres_extra_migrates_postgresql(
    fresh: dict[frozenset[str], Fresh], tmp_path: Path, database_url: str
) -> None:
    import psycopg

    schema = f"fresh_{os.getpid()}_{int(time.time())}"
    try:
        done = fresh[frozenset({"postgres"})].command(
            "db", "upgrade", "--url", database_url, "--schema", schema, cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("statifier_tables at revision statifier_")
    finally:
        with psycopg.connect(database_url, autocommit=True) as connection:
            connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_serve_on_sqlite_answers_healthz_under_sqlite_and_http(
    fresh: dict[frozenset[str], Fresh], tmp_path: Path
) -> None:
    config = tmp_path / "serve.toml"
    config.write_text(
        'migrate = true\nshutdown_timeout = 5\n\n[database]\nurl = "sqlite:///serve.db"\n\n'
        "[http]\nport = 0\n",
        encoding="utf-8",
    )
    environment = fresh[DEMO]  # sqlite and http, see DEMO
    with (tmp_path / "out.txt").open("w") as out, (tmp_path / "err.txt").open("w") as err:
        process = subprocess.Popen(
            [environment.venv / "bin" / "statifier", "serve", config],
            cwd=tmp_path,
            env=isolated(environment.venv),
            stdout=out,
            stderr=err,
        )
        try:
            url = _listening(tmp_path / "out.txt", process)
            with urllib.request.urlopen(f"{url}/healthz", timeout=10) as answer:
                assert (answer.status, json.load(answer)) == (200, {"status": "ok"})
        finally:
            process.send_signal(signal.SIGTERM)
            status = process.wait(timeout=60)
    assert status == 0, (tmp_path / "err.txt").read_text()
    assert (tmp_path / "out.txt").read_text().endswith("statifier serve: stopped\n")


def _listening(out: Path, process: subprocess.Popen[bytes]) -> str:
    """The URL ``statifier serve`` says it listens on, waited for (60 s at most)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(r"listening on (http://\S+)", out.read_text())
        if found:
            return found[1]
        assert process.poll() is None, "statifier serve ended before it listened"
        time.sleep(0.1)
    raise AssertionError("statifier serve did not listen within 60 s")


@pytest.mark.parametrize(
    ("extras", "argv", "line"),
    [
        (
            frozenset(),
            ["db", "upgrade", "--url", "sqlite:///{tmp}/x.db"],
            (
                "statifier db upgrade: the SQL layer (durable executions, migrations, the router) "
                "needs the sqlite extra: pip install 'statifier[sqlite]'"
            ),
        ),
        (
            frozenset({"sqlite"}),
            ["serve", "{tmp}/serve.toml"],
            (
                "statifier serve: HTTP serving (Starlette, uvicorn) needs the http extra: "
                "pip install 'statifier[http]'"
            ),
        ),
        (
            frozenset({"sqlite"}),
            ["db", "upgrade", "--url", "postgresql://postgres@127.0.0.1:1/none"],
            (
                "statifier db upgrade: PostgreSQL needs the postgres extra: "
                "pip install 'statifier[postgres]'"
            ),
        ),
        (
            DEMO,
            ["console", "--database", "sqlite:///{tmp}/x.db"],
            (
                "statifier console: the operator console needs the console extra: "
                "pip install 'statifier[console]'"
            ),
        ),
    ],
    ids=["db-upgrade-core", "serve-sqlite", "postgresql-sqlite", "console-demo"],
)
def test_a_command_without_its_extra_names_it(
    fresh: dict[frozenset[str], Fresh],
    tmp_path: Path,
    extras: frozenset[str],
    argv: list[str],
    line: str,
) -> None:
    (tmp_path / "serve.toml").write_text(
        f'[database]\nurl = "sqlite:///{tmp_path}/serve.db"\n', encoding="utf-8"
    )
    if argv[0] == "console":  # a database it can open: the console checks it first
        migrated = fresh[extras].command(
            "db", "upgrade", "--url", f"sqlite:///{tmp_path}/x.db", cwd=tmp_path
        )
        assert migrated.returncode == 0, migrated.stderr
    done = fresh[extras].command(*(part.format(tmp=tmp_path) for part in argv), cwd=tmp_path)
    assert (done.returncode, done.stderr, done.stdout) == (2, line + "\n", "")
    # docs/errors.md shows each of these lines as it is.
    assert line in (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
