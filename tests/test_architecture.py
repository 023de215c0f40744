"""The rule import-linter cannot express (docs/architecture.md): a module or name whose
name starts with an underscore is private to its package, so no module outside that
package imports it."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parent.parent / "src"


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


def _violations() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        module = _module(path)
        package = _package_of(module, path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
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
