"""Rewrites every blob under a new key from a process of its own, for the crash test.

Usage: ``python blob_rewriter.py URL PREFIX SCHEMA`` (``SCHEMA`` ``-`` for none), with
the keys in the environment variables ``NEW_KEY`` and ``OLD_KEY``. Prints ``ready`` once
imported, then runs :func:`statifier.sql.blobs.rewrite_blobs` one row a batch, pausing a
little at each blob so that a kill from outside lands anywhere in the sweep; prints
``done`` and the counts when it finishes.
"""

from __future__ import annotations

import sys
import time

from statifier.persistence.fernet import FernetCodec
from statifier.sql import TableOptions
from statifier.sql.blobs import rewrite_blobs


def main(url: str, prefix: str, schema: str) -> None:
    options = TableOptions(prefix=prefix, schema=None if schema == "-" else schema)
    codec = FernetCodec.from_env(["NEW_KEY", "OLD_KEY"])

    def rotate(blob: bytes) -> bytes:
        time.sleep(0.002)
        return codec.rotate(blob)

    print("ready", flush=True)
    counts = rewrite_blobs(url, rotate, options, batch=1)
    print("done", sum(counts.values()), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
