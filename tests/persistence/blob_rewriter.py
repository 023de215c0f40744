"""Rewrites every blob under a new key from a process of its own, for the crash test.

Usage: ``python blob_rewriter.py URL PREFIX SCHEMA`` (``SCHEMA`` ``-`` for none), with
the keys in the environment variables ``NEW_KEY`` and ``OLD_KEY``. Runs
:func:`statifier.sql.blobs.rewrite_blobs` one row a batch, pausing a little at each
blob so that a kill from outside lands anywhere in the sweep; prints ``ready`` as it
starts on the first blob (kills timed from start-up, slow on a busy machine, would
land before the sweep), and ``done`` and the counts when it finishes.
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

    started = False

    def rotate(blob: bytes) -> bytes:
        nonlocal started
        if not started:  # the sweep is under way: a kill from now on lands in it
            print("ready", flush=True)
            started = True
        time.sleep(0.002)
        return codec.rotate(blob)

    counts = rewrite_blobs(url, rotate, options, batch=1)
    if not started:
        print("ready", flush=True)
    print("done", sum(counts.values()), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
