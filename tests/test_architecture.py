"""The rules import-linter cannot express (docs/architecture.md):

- a module or name whose name starts with an underscore is private to its package, so
  no module outside that package imports it;
- a package is used through its facade (its ``__init__``) and the public modules the
  architecture page lists, so no module of one package imports another module of
  another package.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).parent.parent
SRC: Final = ROOT / "src"
ARCHITECTURE: Final = ROOT / "docs" / "architecture.md"


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _owner(parts: list[str]) -> str:
    """The package a private module or name belongs to: the package it sits in (a name
    defined in module ``pkg.mod`` belongs to ``pkg``, as does a module ``pkg._mod``)."""
    if (SRC.joinpath(*parts) / "__init__.py").exists():
        return ".".join(parts)
    return ".".join(parts[:-1])


def _imports(path: Path) -> Iterator[tuple[ast.stmt, list[str]]]:
    """Each import statement of the module at ``path`` (those inside functions and
    ``if TYPE_CHECKING:`` too), with what it names: the module, and for ``from m import
    n`` also ``m.n`` (a submodule, or a name of ``m``)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node, [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            yield node, [alias.name for alias in node.names]


def _violations() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        module = _module(path)
        package = _package_of(module, path)
        for _, targets in _imports(path):
            for target in targets:
                parts = target.split(".")
                if parts[0] not in ("statifier", "scriba"):
                    continue
                for index, part in enumerate(parts):
                    if _private(part):
                        owner = _owner(parts[:index])
                        if package != owner and not package.startswith(owner + "."):
                            found.append(f"{module} imports {target} (private to {owner})")
                        break
    return found


def test_no_module_imports_what_another_package_keeps_private() -> None:
    assert _violations() == []


def test_the_check_sees_a_private_import() -> None:
    probe = SRC / "statifier" / "router" / "_architecture_probe.py"
    probe.write_text("from statifier.persistence.sql.schema import _hidden  # noqa\n")
    try:
        expected = (
            "statifier.router._architecture_probe imports "
            "statifier.persistence.sql.schema._hidden (private to statifier.persistence.sql)"
        )
        assert _violations() == [expected]
    finally:
        probe.unlink()


# Facades and public modules.


def public_modules(page: str) -> frozenset[str]:
    """The modules the bullets under "Public modules besides the packages themselves"
    of the architecture page name (every dotted name in backquotes)."""
    _, found, rest = page.partition("Public modules besides the packages themselves:\n")
    assert found, "docs/architecture.md lost its list of public modules"
    bullets = re.match(r"\n*((?:(?:- |  ).*\n)+)", rest)
    assert bullets, "the list of public modules is not a bulleted list"
    return frozenset(re.findall(r"`((?:statifier|scriba)(?:\.\w+)+)`", bullets[1]))


PUBLIC: Final = public_modules(ARCHITECTURE.read_text(encoding="utf-8"))


def _unit(module: str) -> str:
    """What a module belongs to, for this rule: a package of ``statifier`` (its first two
    parts), a top-level module of ``statifier`` (itself), or ``scriba``."""
    parts = module.split(".")
    return parts[0] if parts[0] == "scriba" else ".".join(parts[:2])


def _is_package(parts: list[str]) -> bool:
    return (SRC.joinpath(*parts) / "__init__.py").is_file()


def _is_module(parts: list[str]) -> bool:
    return _is_package(parts) or SRC.joinpath(*parts[:-1], f"{parts[-1]}.py").is_file()


def _imported_modules(node: ast.stmt, targets: list[str]) -> set[str]:
    """The modules an import statement reaches: for ``from m import n``, ``m.n`` when it
    is a module, else ``m``."""
    if isinstance(node, ast.Import):
        return set(targets)
    module, *names = targets
    return {name if _is_module(name.split(".")) else module for name in names}


def non_public_imports(public: frozenset[str]) -> set[tuple[str, str]]:
    """Every (importing module, imported module) of ``src`` where the imported module is
    of another package (or top-level module), is no package, and is not in ``public``.
    Private modules are the privacy rule's to judge, and left out."""
    found = set()
    for path in sorted(SRC.rglob("*.py")):
        module = _module(path)
        for node, targets in _imports(path):
            for target in _imported_modules(node, targets):
                parts = target.split(".")
                if parts[0] not in ("statifier", "scriba") or any(map(_private, parts)):
                    continue
                if _unit(target) == _unit(module) or _is_package(parts) or target in public:
                    continue
                found.add((module, target))
    return found


def test_no_module_imports_what_another_package_does_not_make_public() -> None:
    unlisted = sorted(non_public_imports(PUBLIC))
    # Either the module is public (list it in docs/architecture.md, if users need it), or
    # the importer takes the name from the package's facade.
    assert unlisted == []


def test_every_public_module_exists() -> None:
    missing = sorted(name for name in PUBLIC if not _is_module(name.split(".")))
    assert missing == []
    assert {"statifier.telemetry", "statifier.persistence.sql.schema"} <= PUBLIC


def test_the_check_sees_an_import_of_a_module_that_is_not_public() -> None:
    probe = SRC / "statifier" / "router" / "_architecture_probe.py"
    probe.write_text("from statifier.persistence.storage import Storage  # noqa\n")
    try:
        found = non_public_imports(PUBLIC)
        assert ("statifier.router._architecture_probe", "statifier.persistence.storage") in found
        assert ("statifier.router._architecture_probe", "statifier.persistence") not in found
    finally:
        probe.unlink()
    page = (
        "Public modules besides the packages themselves:\n\n"
        "- `statifier.a.b` and\n  `scriba.c`;\n\n"
        "Not `statifier.d.e`.\n"
    )
    assert public_modules(page) == {"statifier.a.b", "scriba.c"}


def test_the_library_takes_no_name_from_the_root_package() -> None:
    # The root package's names are the user's shortcuts, loaded on first use; a module
    # of the library imports each from the layer that owns it.
    found = [
        f"{_module(path)} imports {alias.name} from statifier"
        for path in sorted(SRC.rglob("*.py"))
        for node, _ in _imports(path)
        if isinstance(node, ast.ImportFrom) and node.module == "statifier"
        for alias in node.names
        if not _is_module(["statifier", alias.name])
    ]
    assert found == []
