"""``src/`` uses no private name of another distribution (decision 0096): it imports no
module or name starting with one underscore from a library or the standard library, and
reads no such attribute from their objects, as far as the source tells.

An attribute is a library's when the expression it is read from starts at a name an
``import`` of a library bound (``sa.sql._x``, ``KafkaError._X``), or when no module of
``src/`` defines an attribute of that name at all, so the object can only be someone
else's (``script._upgrade_revs``, ``column._copy()``). ``getattr``, ``hasattr``,
``setattr`` and ``delattr`` with a literal name count as reading that attribute. A name
defined in ``src/`` under the same spelling as a library's private one hides the second
rule; the first still holds for names bound by imports.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).parent.parent / "src"
PROJECT = frozenset({"statifier", "scriba"})

# Underscore names their libraries document as public. Named tuples (collections and
# typing) give their methods and attributes an underscore only so that they cannot
# clash with field names.
DOCUMENTED = frozenset({"_asdict", "_field_defaults", "_fields", "_make", "_replace"})
# confluent-kafka lists librdkafka's local error codes among KafkaError's constants,
# spelled with one leading underscore (broker errors have none).
DOCUMENTED_ON = {"confluent_kafka.KafkaError": re.compile(r"_[A-Z][A-Z0-9_]*")}

_BY_NAME = frozenset({"getattr", "hasattr", "setattr", "delattr"})


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _ours(module: str) -> bool:
    return module.split(".")[0] in PROJECT


def _literal_name(call: ast.Call) -> str | None:
    """The attribute name ``getattr(obj, "name", ...)`` and its kin spell out."""
    if not (isinstance(call.func, ast.Name) and call.func.id in _BY_NAME):
        return None
    if len(call.args) < 2:
        return None
    name = call.args[1]
    return name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else None


def _defined(trees: dict[Path, ast.Module]) -> set[str]:
    """Every name ``src/`` defines somewhere: modules, functions, classes, variables,
    parameters, attributes it assigns, names it imports as, ``__slots__`` entries and
    names it sets with ``setattr``."""
    names: set[str] = set()
    for path, tree in trees.items():
        names.add(path.stem)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[0])
            elif isinstance(node, ast.Call):
                func = node.func
                setter = isinstance(func, ast.Name) and func.id == "setattr"
                setter |= isinstance(func, ast.Attribute) and func.attr == "__setattr__"
                literal = node.args[1] if setter and len(node.args) >= 2 else None
                if isinstance(literal, ast.Constant) and isinstance(literal.value, str):
                    names.add(literal.value)
            elif isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "__slots__" for target in node.targets
            ):
                for item in ast.walk(node.value):
                    if isinstance(item, ast.Constant) and isinstance(item.value, str):
                        names.add(item.value)
    return names


def _imported(tree: ast.Module) -> dict[str, str]:
    """The names imports from libraries bind in a module, with what each stands for
    (``sa`` -> ``sqlalchemy``, ``KafkaError`` -> ``confluent_kafka.KafkaError``)."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _ours(alias.name):
                    local = alias.asname or alias.name.split(".")[0]
                    bound[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names if not _ours(node.module) else ():
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def _import_violations(node: ast.stmt) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if not _ours(alias.name) and any(map(_private, alias.name.split("."))):
                yield f"imports the private module {alias.name}"
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        if _ours(node.module):
            return
        if any(map(_private, node.module.split("."))):
            yield f"imports from the private module {node.module}"
        for alias in node.names:
            if _private(alias.name):
                yield f"imports the private name {node.module}.{alias.name}"


def _reading(
    node: ast.Attribute | ast.Call, holder: ast.expr, name: str, bound: dict[str, str]
) -> tuple[str, str] | None:
    """What is wrong with reading attribute ``name`` of ``holder`` (``node`` is the
    reading itself, shown in the message), if anything: ``(how, what)``, ``how`` being
    ``"import"`` for a library's name bound by an import, ``"undefined"`` otherwise."""
    if not _private(name) or name in DOCUMENTED:
        return None
    start = _root(holder)
    if isinstance(start, ast.Name) and start.id in bound:
        origin = bound[start.id]
        allowed = DOCUMENTED_ON.get(origin) if start is holder else None
        if allowed is not None and allowed.fullmatch(name):
            return None
        return "import", f"{ast.unparse(node)} reads {origin}'s private {name}"
    return "undefined", f"{ast.unparse(node)}: no module here defines {name}"


def violations(root: Path) -> list[str]:
    """Every use of a library's private name in the Python files under ``root``, as
    ``path:line: what``, in file and line order."""
    trees = {
        path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(root.rglob("*.py"))
    }
    defined = _defined(trees)
    found: list[tuple[Path, int, str]] = []
    for path, tree in trees.items():
        bound = _imported(tree)
        where = path.relative_to(root)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                found.extend((where, node.lineno, what) for what in _import_violations(node))
                continue
            if isinstance(node, ast.Attribute):
                holder, name = node.value, node.attr
            elif isinstance(node, ast.Call) and (literal := _literal_name(node)) is not None:
                holder, name = node.args[0], literal
            else:
                continue
            wrong = _reading(node, holder, name, bound)
            if wrong is not None and (wrong[0] == "import" or name not in defined):
                found.append((where, node.lineno, wrong[1]))
    return [f"{where}:{line}: {what}" for where, line, what in sorted(found)]


def test_src_uses_no_private_name_of_a_library() -> None:
    assert violations(SRC) == []


def test_the_check_sees_each_kind_of_use(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(
        "import json\n"
        "import json._private\n"
        "import sqlalchemy as sa\n"
        "from alembic.script import ScriptDirectory\n"
        "from confluent_kafka import KafkaError\n"
        "from sqlalchemy.sql.base import _NoArg\n"
        "from statifier.core.state import MachineState\n"
        "\n"
        "def run(script: ScriptDirectory, column: sa.Column, state: MachineState) -> None:\n"
        "    script._upgrade_revs('head', ())\n"
        "    column._copy()\n"
        "    sa.sql._typing\n"
        "    getattr(json.encoder, '_make_encoder', None)\n"
        "    KafkaError._PARTITION_EOF\n"
        "    KafkaError._not_a_code\n"
        "    state._replace(running=False)\n"
        "    self_made._own\n"
        "\n"
        "class Own:\n"
        "    _own = 1\n"
    )
    assert violations(tmp_path) == [
        "probe.py:2: imports the private module json._private",
        "probe.py:6: imports the private name sqlalchemy.sql.base._NoArg",
        "probe.py:10: script._upgrade_revs: no module here defines _upgrade_revs",
        "probe.py:11: column._copy: no module here defines _copy",
        "probe.py:12: sa.sql._typing reads sqlalchemy's private _typing",
        (
            "probe.py:13: getattr(json.encoder, '_make_encoder', None) reads json's private "
            "_make_encoder"
        ),
        (
            "probe.py:15: KafkaError._not_a_code reads confluent_kafka.KafkaError's private "
            "_not_a_code"
        ),
    ]
