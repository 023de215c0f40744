"""Execution ids minted for the host (by the router, by ``Durable``): a prefix and a
ULID, time-sortable and random after the millisecond, never derived from anything the
execution is about.

>>> new_execution_id().startswith("ex_"), len(new_execution_id())
(True, 29)
"""

from __future__ import annotations

import secrets
import time
from typing import Final

__all__ = ["new_execution_id", "ulid"]

_CROCKFORD: Final = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def ulid(now_ms: int | None = None) -> str:
    """A ULID: 48 bits of Unix milliseconds, then 80 random bits, in 26 characters of
    Crockford base 32 (ids made in later milliseconds sort after earlier ones)."""
    milliseconds = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    value = (milliseconds & ((1 << 48) - 1)) << 80 | secrets.randbits(80)
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def new_execution_id(*_about: str) -> str:
    """A fresh execution id: ``ex_`` and a ULID. Any arguments are ignored, so it serves
    where a host's own minting function takes some (the router passes ``(scope,
    document, key)``)."""
    return "ex_" + ulid()
