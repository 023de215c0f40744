"""One of the three ways of migrating, run as a process of its own by
``tests/test_migration_gate.py``: ``python migrating_process.py WAY URL SCHEMA DIR``.

- ``cli``: ``statifier db upgrade --url URL [--schema SCHEMA]``;
- ``durable``: ``Durable(URL, migrate=True)`` opened, one execution created and sent
  an event; prints its status;
- ``serve``: ``statifier serve`` on a file written to ``DIR`` that says
  ``migrate = true``, listening on a free port until SIGTERM.

``SCHEMA`` is ``-`` for none. Before it starts, the process writes ``DIR/WAY.started``.
Alembic's records (one ``Running upgrade A -> B`` line per revision applied) go to
standard error at INFO, so the test can count who migrated what.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

from statifier.cli import main as statifier
from statifier.durable import Durable
from statifier.sql import TableOptions

DOOR = (
    '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">'
    '<state id="open"><transition event="close" target="closed"/></state>'
    '<final id="closed"/></scxml>'
)


async def durable(url: str, schema: str | None) -> None:
    tables = TableOptions(schema=schema)
    async with Durable(url, charts={"door": DOOR}, migrate=True, tables=tables) as door:
        await door.create("door", "door_1")
        sent = await door.send("door_1", "close")
        print(sent.status.value)


def run(way: str, url: str, schema: str | None, directory: Path) -> int:
    (directory / f"{way}.started").touch()
    if way == "cli":
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
        on_schema = ["--schema", schema] if schema else []
        return statifier(["db", "upgrade", "--url", url, *on_schema])
    if way == "durable":
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
        asyncio.run(durable(url, schema))
        return 0
    config = directory / "serve.toml"
    database = f"url = {url!r}\n" + (f"schema = {schema!r}\n" if schema else "")
    config.write_text(
        "migrate = true\nshutdown_timeout = 5\n\n"
        f'[database]\n{database}\n[http]\nport = 0\n\n[logging]\nlevel = "info"\n',
        encoding="utf-8",
    )
    return statifier(["serve", str(config)])  # logs at INFO itself


if __name__ == "__main__":
    way, url, schema, directory = sys.argv[1:]
    sys.exit(run(way, url, None if schema == "-" else schema, Path(directory)))
