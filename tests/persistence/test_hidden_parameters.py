"""A failed statement's error names the statement and the database's words, never its
parameters: they are the events' payloads, tokens included, and the error's text
reaches logs, the console and stored errors."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import sqlalchemy as sa
from tests.persistence.conftest import (  # noqa: F401 - fixtures used by name
    SqlStore,
    postgresql_rows_store,
    postgresql_store,
    sql_store,
    sqlite_store,
)

from statifier.sql.engines import (
    dispose,
    open_engine,
    read_only_engine,
    run_on,
    sync_engine,
)
from statifier.sql.migrations import sync_url

SECRET = "tok-7f3a9c-do-not-show"
SRC = Path(__file__).resolve().parents[2] / "src"
MADE_HERE = SRC / "statifier" / "sql" / "engines.py"


def _fail(connection: sa.Connection) -> None:
    connection.execute(sa.text("SELECT * FROM no_such_table WHERE id = :id"), {"id": SECRET})


@pytest.mark.asyncio
async def test_each_engine_keeps_the_parameters_out_of_its_errors(sql_store: SqlStore) -> None:  # noqa: F811 - the fixture
    url = sync_url(sql_store.url)
    said: list[str] = []
    for made in (open_engine(url), read_only_engine(url)):
        try:
            with pytest.raises(sa.exc.DBAPIError) as failed:
                await run_on(made, _fail)
            said.append(str(failed.value))
        finally:
            await dispose(made)
    engine = sync_engine(url)
    try:
        with pytest.raises(sa.exc.DBAPIError) as failed, engine.connect() as connection:
            _fail(connection)
        said.append(str(failed.value))
    finally:
        engine.dispose()
    for text in said:
        assert "no_such_table" in text  # the statement and the database's words stay
        assert SECRET not in text
        assert "parameters hidden" in text


def test_the_check_would_see_a_parameter_shown() -> None:
    """What the test above reads for: SQLAlchemy's own engine shows the parameters."""
    engine = sa.create_engine("sqlite://")
    try:
        with pytest.raises(sa.exc.DBAPIError) as failed, engine.connect() as connection:
            _fail(connection)
    finally:
        engine.dispose()
    assert SECRET in str(failed.value)


def _makes_an_engine(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute | ast.Name)
        and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
        in ("create_engine", "create_async_engine")
        for node in ast.walk(tree)
    )


def test_every_engine_of_the_library_is_made_where_its_parameters_are_hidden() -> None:
    """``statifier.sql.engines`` makes every engine (``new_engine``,
    ``new_async_engine``); the examples, written for a host to copy, make their own."""
    makers = sorted(
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if path != MADE_HERE
        and "examples" not in path.parts
        and _makes_an_engine(ast.parse(path.read_text(), str(path)))
    )
    assert makers == []
    assert _makes_an_engine(ast.parse("import sqlalchemy as sa\nsa.create_engine('sqlite://')"))
