"""The examples in docstrings and in docs/ run and give what they show."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

import scriba
import statifier

ROOT = Path(__file__).parent.parent
DOCS = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]


def _modules() -> list[str]:
    names = []
    for package in (statifier, scriba):
        names.append(package.__name__)
        prefix = f"{package.__name__}."
        names.extend(info.name for info in pkgutil.walk_packages(package.__path__, prefix))
    return sorted(names)


@pytest.mark.parametrize("name", _modules())
def test_module_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


@pytest.mark.parametrize("path", DOCS, ids=[str(path.relative_to(ROOT)) for path in DOCS])
def test_document_examples(path: Path) -> None:
    result = doctest.testfile(
        str(path), module_relative=False, optionflags=doctest.ELLIPSIS, encoding="utf-8"
    )
    assert result.failed == 0
