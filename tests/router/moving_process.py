"""Moves every bucket from one store to another, for the reshard crash test.

Usage: ``python -m tests.router.moving_process SOURCE_URL SOURCE_SCHEMA TARGET_URL
TARGET_SCHEMA PREFIX`` (a schema ``-`` for none). It prints ``moving`` once its imports
are done, moves buckets 0 to 1023 one bucket a part
(:func:`statifier.sql.moves.move_range`), and prints ``moved N`` at the end. A test
kills it anywhere and starts it again until a run goes through.
"""

from __future__ import annotations

import sys

from statifier.sql import TableOptions
from statifier.sql.moves import move_range


def main(argv: list[str]) -> None:
    source, source_schema, target, target_schema, prefix = argv

    def options(schema: str) -> TableOptions:
        return TableOptions(prefix=prefix, schema=None if schema == "-" else schema)

    print("moving", flush=True)
    moved = move_range(
        source,
        target,
        (0, 1024),
        options=options(source_schema),
        target_options=options(target_schema),
        step=1,
    )
    print(f"moved {moved.total}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
