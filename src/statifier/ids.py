"""Execution ids minted for the host (by the router, by ``Durable``): a prefix and a
ULID, time-sortable and random after the millisecond. An id minted for an address (the
router's) ends with the address's bucket (:mod:`statifier.buckets`), so that the
execution falls in the bucket of the address it was created for; nothing else of the
address is in it.

>>> new_execution_id().startswith("ex_"), len(new_execution_id())
(True, 29)
>>> from statifier.buckets import address_bucket, bucket_of
>>> minted = new_execution_id("web", "order", "o-17")
>>> len(minted), bucket_of(minted) == address_bucket("web", "order", "o-17")
(33, True)
"""

from __future__ import annotations

import secrets
import time
from typing import Final

from statifier.buckets import address_bucket, tagged

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


def new_execution_id(*about: str) -> str:
    """A fresh execution id: ``ex_`` and a ULID; given an address ``(scope, document,
    key)`` (as the router passes it), then ``_`` and the address's bucket in three hex
    digits (:func:`statifier.buckets.tagged`). Other arguments are ignored, so it serves
    where a host's own minting function takes some."""
    if len(about) == 3:
        return "ex_" + ulid() + tagged(address_bucket(*about))
    return "ex_" + ulid()
