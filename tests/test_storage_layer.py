"""Every SQL statement of statifier and every test of which database it runs on belong
in the storage layer, ``statifier.sql`` (decision 0095). The modules that still hold
either are listed here, to be moved; a module may leave the lists, never join them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
STORAGE = SRC / "statifier" / "sql"

_SQL = re.compile(
    r"\b(SELECT\s|INSERT INTO\s|UPDATE\s+\S+\s+SET\s|DELETE FROM\s|ON CONFLICT\b"
    r"|SAVEPOINT\s|BEGIN IMMEDIATE\b|PRAGMA\s)"
)

# Modules outside the storage layer that still hold SQL text (to be moved into it).
HOLDS_SQL: set[str] = set()
# Modules outside the storage layer that still ask which database they run on.
TESTS_DIALECT: set[str] = set()


def _modules() -> dict[str, ast.Module]:
    return {
        str(path.relative_to(SRC)): ast.parse(path.read_text(), str(path))
        for path in sorted((SRC / "statifier").rglob("*.py"))
        if STORAGE not in path.parents
    }


def _holds_sql(tree: ast.Module) -> bool:
    docstrings = {
        id(owner.body[0].value)
        for owner in ast.walk(tree)
        if isinstance(owner, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and owner.body
        and isinstance(owner.body[0], ast.Expr)
    }
    return any(_SQL.search(text) for node in ast.walk(tree) for text in _texts(node, docstrings))


def _texts(node: ast.AST, docstrings: set[int]) -> list[str]:
    """The string a constant holds, or an f-string's with a name where each value goes
    (so that ``f"UPDATE {table} SET"`` reads as a statement)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [] if id(node) in docstrings else [node.value]
    if isinstance(node, ast.JoinedStr):
        return [
            "".join(
                str(part.value) if isinstance(part, ast.Constant) else "t" for part in node.values
            )
        ]
    return []


def _tests_dialect(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        # isinstance(engine, AsyncEngine): the engine's class names the database.
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "isinstance"
            and any(isinstance(arg, ast.Name) and arg.id == "AsyncEngine" for arg in node.args)
        ):
            return True
        # self.postgres, engine.dialect.name == "sqlite", ...
        if isinstance(node, ast.Attribute) and node.attr in {"postgres", "_postgres"}:
            return True
        if isinstance(node, ast.Compare) and any(
            isinstance(part, ast.Constant) and part.value in {"postgresql", "sqlite"}
            for part in (node.left, *node.comparators)
        ):
            return True
    return False


def test_sql_text_lives_in_the_storage_layer() -> None:
    found = {name for name, tree in _modules().items() if _holds_sql(tree)}
    assert found - HOLDS_SQL == set(), "SQL text outside statifier.sql: move it there"
    assert HOLDS_SQL - found == set(), "these hold no SQL any more: take them off HOLDS_SQL"


def test_the_dialect_is_asked_in_the_storage_layer_alone() -> None:
    found = {name for name, tree in _modules().items() if _tests_dialect(tree)}
    assert found - TESTS_DIALECT == set(), "a dialect test outside statifier.sql: use Dialect"
    assert TESTS_DIALECT - found == set(), "these no longer ask: take them off TESTS_DIALECT"


def test_the_checks_see_what_they_look_for() -> None:
    sample = ast.parse('"""SELECT x FROM y"""\nQ = "DELETE FROM t WHERE id = :id"\n')
    assert _holds_sql(sample)
    assert not _holds_sql(ast.parse('"""SELECT x FROM y"""\n'))
    assert _holds_sql(ast.parse('q = f"UPDATE {table} SET status = status WHERE 0"'))
    assert _holds_sql(ast.parse('q = f"ROLLBACK TO SAVEPOINT {name}"'))
    assert _holds_sql(ast.parse('cursor.execute("BEGIN IMMEDIATE")'))
    assert _tests_dialect(ast.parse("ok = isinstance(engine, AsyncEngine)"))
    assert _tests_dialect(ast.parse("ok = engine.dialect.name == 'sqlite'"))
    assert not _tests_dialect(ast.parse("ok = adapter.dialect.row_locks"))
