"""Run the card payment on SQLite: ``python -m statifier.examples.card_payment [DB]``.

Without a path the database lives in a temporary directory removed afterwards.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from statifier.examples.card_payment import run_on_sqlite


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print("usage: python -m statifier.examples.card_payment [DB]", file=sys.stderr)
        return 2
    if argv:
        asyncio.run(run_on_sqlite(Path(argv[0]), sys.stdout))
        return 0
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(run_on_sqlite(Path(directory) / "payments.db", sys.stdout))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
