"""The examples in docstrings and in docs/ run and give what they show."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re
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


GLOSSARY_WORDS = (
    "address",
    "answer",
    "binding",
    "dedupe",
    "door",
    "driver",
    "execution",
    "front",
    "held",
    "lane",
    "ledger",
    "macrostep",
    "microstep",
    "outbox",
    "position",
    "projection",
    "refusal",
    "route",
    "scope",
    "scriba",
    "settle",
    "sink",
    "step",
    "timer",
    "via",
)


def test_the_glossary_defines_its_words_and_ends_with_the_renames_proposed() -> None:
    page = (ROOT / "docs" / "glossary.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", page, re.M)
    defined = {word.strip("`").lower() for heading in headings for word in heading.split(", ")}
    assert set(GLOSSARY_WORDS) <= defined
    assert headings[-1] == "Renames proposed"
    for linking in (ROOT / "README.md", ROOT / "docs" / "architecture.md"):
        assert "glossary.md" in linking.read_text(encoding="utf-8"), linking.name
    # Every module and name the glossary points at exists.
    for dotted in sorted(set(re.findall(r"`((?:statifier|scriba)(?:\.\w+)+)", page))):
        parts = dotted.split(".")
        for split in range(len(parts), 0, -1):
            try:
                found: object = importlib.import_module(".".join(parts[:split]))
            except ModuleNotFoundError:
                continue
            for name in parts[split:]:
                found = getattr(found, name)
            break
