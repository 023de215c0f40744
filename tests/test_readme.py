"""The README tells the truth: its quickstart runs as written, and it names the extras as
pyproject.toml defines them."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import statifier
from statifier.cli import main

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    """The text of the README's ``## title`` section, up to the next ``## `` heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.M | re.S)
    assert match, f"README.md has no '## {title}' section"
    return match[1]


def quickstart_files() -> dict[str, str]:
    """Each file of the quickstart: a fenced block right after a line ending in
    "`NAME`:"."""
    blocks = re.findall(r"`([\w.-]+)`:\n\n```\w+\n(.*?)^```", section("Quickstart"), re.M | re.S)
    return dict(blocks)


def quickstart_session() -> list[tuple[str, str]]:
    """The quickstart's shell session: (command, the output shown under it)."""
    (session,) = re.findall(r"^```console\n(.*?)^```", section("Quickstart"), re.M | re.S)
    steps: list[tuple[str, str]] = []
    for line in session.splitlines(keepends=True):
        if line.startswith("$ "):
            steps.append((line[2:].strip(), ""))
        else:
            command, shown = steps[-1]
            steps[-1] = (command, shown + line)
    return steps


def test_the_quickstart_runs_as_written_one_process_per_event(tmp_path: Path) -> None:
    files = quickstart_files()
    assert set(files) == {"order.scxml", "step.py"}
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    steps = quickstart_session()
    assert [command for command, _ in steps] == [
        "python step.py pay",
        "python step.py ship",
        "python step.py deliver",
    ]
    # The statifier under test (the one this suite imported), and nothing else of the
    # suite's paths.
    environment = {**os.environ, "PYTHONPATH": str(Path(statifier.__file__).parent.parent)}
    printed = []
    for command, shown in steps:
        program, *arguments = shlex.split(command)
        assert program == "python"
        done = subprocess.run(  # a new process for every event, in a fresh directory
            [sys.executable, *arguments],
            cwd=tmp_path,
            env=environment,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == shown, command
        printed.append(done.stdout)
    assert printed == [
        "order-1 active paid\n",
        "order-1 active shipped\n",
        "order-1 completed\n",
    ]
    assert (tmp_path / "orders.db").is_file()


def test_the_install_line_is_the_sqlite_extra() -> None:
    install = section("Install")
    assert "```sh\npip install 'statifier[sqlite]'\n```" in install
    assert "`pip install -e '.[sqlite]'`" in install  # the same, from a checkout


def test_the_readme_asks_for_one_install_line_and_two_set_up_commands() -> None:
    commands = re.findall(r"^```sh\n(.*?)^```", README, re.M | re.S)
    assert commands == ["pip install 'statifier[sqlite]'\n", "./dev demo\n", "./dev test\n"]
    assert "./dev demo" in section("Set up")
    assert "./dev test" in section("Set up")


def test_the_quickstart_is_written_on_durable() -> None:
    script = quickstart_files()["step.py"]
    assert "from statifier import Durable" in script
    lines = [line for line in script.splitlines() if line.strip()]
    assert len(lines) <= 15


def test_the_readme_names_every_extra() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    extras = set(pyproject["project"]["optional-dependencies"]) - {"dev", "bench"}
    with_code = set(re.findall(r"^\| `([a-z]+)` \|", section("Install"), re.M))
    assert with_code == extras


def test_what_the_readme_names_exists(capsys: pytest.CaptureFixture[str]) -> None:
    described = README.split("\n## ", 1)[0]  # the description, above the first section
    assert "Not built yet" not in described
    assert "**The operator console** (`statifier.console`)" in described
    assert (ROOT / "src" / "statifier" / "console" / "app.py").exists()
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    (choices,) = re.findall(r"\{([a-z,]+)\}", capsys.readouterr().out.split("\n\n")[0])
    assert {"scenario", "serve", "console"} <= set(choices.split(","))
