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
