"""Import every module of the installed ``statifier`` and ``scriba`` and say how each
import ended, as one JSON document on standard output.

Run by ``tests/test_extras.py`` inside a fresh virtual environment, with ``python -I``
(no ``PYTHONPATH``, no user site, not the current directory): it must see the installed
distribution alone. It needs nothing but the standard library and the package it walks.

The modules are those of ``modules(root)``: every ``.py`` file of a regular package
(a directory with ``__init__.py``) under the installed ``statifier`` and ``scriba``,
whose dotted name has no part starting with an underscore. Each is imported in sorted
order in this one process; a failed import leaves nothing behind in ``sys.modules``, so
an import that failed once fails the same way when a later module needs it.

Each module's outcome is one of:

- ``{"outcome": "imported"}``;
- ``{"outcome": "missing_extra", "extra": ..., "message": ...}``: it raised
  :class:`statifier.extras.MissingExtra`;
- ``{"outcome": "error", "type": ..., "missing": ..., "message": ...}``: anything else
  (``missing`` is the module a :class:`ModuleNotFoundError` names, else ``null``).

The document also holds ``prefix`` (``sys.prefix``), ``located`` (the directory each
package was imported from) and ``distributions`` (the names of the installed
distributions), so that the test can tell this environment from another.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import sys
from pathlib import Path

PACKAGES = ("statifier", "scriba")


def modules(root: Path, package: str) -> list[str]:
    """The dotted names of the modules under ``root``, the directory of ``package``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if not (path.parent / "__init__.py").is_file():
            continue  # Alembic's revision files: loaded by path, never imported
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        if not any(part.startswith("_") for part in parts):
            found.append(".".join(parts))
    return found


def outcome(name: str) -> dict[str, object]:
    """How importing ``name`` ended."""
    from statifier.extras import MissingExtra

    try:
        importlib.import_module(name)
    except MissingExtra as missing:
        return {"outcome": "missing_extra", "extra": missing.extra, "message": str(missing)}
    except BaseException as error:  # noqa: BLE001 - every other ending is reported
        missing_name = error.name if isinstance(error, ModuleNotFoundError) else None
        return {
            "outcome": "error",
            "type": type(error).__name__,
            "missing": missing_name,
            "message": str(error),
        }
    return {"outcome": "imported"}


def main() -> None:
    roots = {}
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)  # finds it without importing it
        assert spec is not None, package
        assert spec.submodule_search_locations, package
        roots[package] = Path(next(iter(spec.submodule_search_locations)))
    names = [name for package in PACKAGES for name in modules(roots[package], package)]
    report = {
        "prefix": sys.prefix,
        "located": {package: str(root) for package, root in roots.items()},
        "distributions": sorted(
            distribution.metadata["Name"].lower()
            for distribution in importlib.metadata.distributions()
        ),
        "modules": {name: outcome(name) for name in sorted(names)},
    }
    json.dump(report, sys.stdout, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
