"""Packaging: one distribution, two typed import packages."""

from importlib import metadata, resources

import scriba
import statifier


def test_version_matches_distribution() -> None:
    assert statifier.__version__ == metadata.version("statifier")


def test_packages_are_typed() -> None:
    for package in (statifier, scriba):
        assert resources.files(package).joinpath("py.typed").is_file(), package.__name__


def test_the_library_never_evaluates_python() -> None:
    # Untrusted charts and expressions are compiled to closures; nothing in the library
    # may hand text to Python's evaluator (the expression benchmark uses eval as its
    # floor, outside the library).
    import ast
    from pathlib import Path

    forbidden = {"eval", "exec", "compile", "__import__"}
    offenders = [
        f"{path.name}:{node.lineno} {node.func.id}"
        for package in (statifier, scriba)
        for path in Path(str(resources.files(package))).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in forbidden
    ]
    assert offenders == []


def test_version_flag_prints_the_distribution_version() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "statifier.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, f"statifier {metadata.version('statifier')}\n")


def test_package_docstrings_name_what_exists() -> None:
    import importlib
    import pkgutil

    doc = statifier.__doc__ or ""
    assert "Only ``statifier.expr`` exists" not in doc
    subpackages = [info.name for info in pkgutil.iter_modules(statifier.__path__) if info.ispkg]
    assert len(subpackages) >= 8
    for name in subpackages:  # every layer that exists is named
        assert f"``statifier.{name}``" in doc, name
    assert "Planned" not in doc  # nothing named is still to come
    assert "console" in subpackages
    for name in subpackages:
        module = importlib.import_module(f"statifier.{name}")
        assert module.__doc__, name


def test_the_top_level_names_need_no_extra_and_load_nothing_until_used() -> None:
    import subprocess
    import sys

    # Every optional library made unimportable, as in an install with no extra.
    script = (
        "import sys\n"
        "for name in ('sqlalchemy', 'alembic', 'psycopg', 'httpx', 'starlette', 'uvicorn',\n"
        "             'jinja2', 'cryptography', 'opentelemetry', 'eventsourcing',\n"
        "             'confluent_kafka', 'nats'):\n"
        "    sys.modules[name] = None\n"
        "import statifier.telemetry\n"
        "print(sorted(name for name in sys.modules if name.startswith('statifier')))\n"
        "import statifier\n"
        "print([name for name in statifier.__all__ if getattr(statifier, name) is None])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["['statifier', 'statifier.telemetry']", "[]"]


def test_the_top_level_names_are_their_homes_objects() -> None:
    import importlib

    from statifier import durable

    for name in statifier.__all__:
        if name != "__version__":
            home = importlib.import_module(statifier._HOMES[name])
            assert getattr(statifier, name) is getattr(home, name), name
    assert statifier.Durable is durable.Durable
    assert set(statifier.__all__) <= set(dir(statifier))
