"""Key buckets: every execution and every address falls in one of :data:`BUCKETS`
virtual buckets, and a store holds whole ranges of them
(:mod:`statifier.persistence.shards`, decision 0116).

An execution's bucket is its root id's (:func:`bucket_of`): a durable child
(``parent/invoke``) falls with its parent. An address ``(scope, document, key)`` has a
bucket of its own (:func:`address_bucket`), and an id minted for an address carries it
(:func:`tagged`, what :func:`statifier.ids.new_execution_id` mints for the router), so
that the execution created for an address falls in the address's bucket and a bare id
still finds it. Both are hashes computed here, the same in every process and version.

>>> execution_id = "ex_01KBCDEFGHJKMNPQRSTVWXYZ01" + tagged(address_bucket("web", "order", "o-17"))
>>> bucket_of(execution_id) == address_bucket("web", "order", "o-17")
True
>>> bucket_of(execution_id + "/payment") == bucket_of(execution_id)
True
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

__all__ = [
    "ALL_BUCKETS",
    "BUCKETS",
    "address_bucket",
    "bucket_of",
    "bucket_range",
    "ledger_bucket",
    "one_bucket",
    "outbox_bucket",
    "tagged",
]

BUCKETS: Final = 1024
"""The virtual buckets, fixed for ever: a store holds whole ranges of them, so K can
grow to 1,024 stores without an execution changing bucket (decision 0116)."""

ALL_BUCKETS: Final = (0, BUCKETS)
"""Every bucket, as a range ``(start, end)`` with ``end`` excluded: the range a worker
claims from unless given a part (decision 0121)."""

_TAGGED: Final = re.compile(r"ex_[0-9A-HJKMNP-TV-Z]{26}_([0-3][0-9a-f]{2})")
"""An id minted for an address: ``ex_``, a ULID, ``_`` and the bucket in three hex
digits (below 1,024)."""


def _hashed(text: str) -> int:
    digest = hashlib.blake2b(text.encode(), digest_size=8, person=b"statifier.bkt").digest()
    return int.from_bytes(digest, "big") % BUCKETS


def bucket_of(execution_id: str) -> int:
    """The bucket of ``execution_id``: of its root (the part before the first ``/``),
    so that a durable child (``parent/invoke`` or ``parent/invoke/index``) falls with
    its parent; the bucket a root minted for an address carries (:func:`tagged`), or
    else a hash of the root.

    >>> bucket_of("order-17") == bucket_of("order-17/payment/3")
    True
    >>> 0 <= bucket_of("order-17") < BUCKETS
    True
    """
    root = execution_id.split("/", 1)[0]
    carried = _TAGGED.fullmatch(root)
    if carried is not None:
        return int(carried[1], 16)
    return _hashed(root)


def address_bucket(scope: str, document: str, key: str) -> int:
    """The bucket of the address ``(scope, document, key)``.

    >>> address_bucket("web", "order", "o-17") == address_bucket("web", "order", "o-17")
    True
    """
    return _hashed("\x00".join(("address", scope, document, key)))


def outbox_bucket(queue: str, key: str) -> int:
    """The bucket of an outbox row ``(queue, key)`` handed off outside any execution
    (a row an execution sends falls in the execution's bucket; decision 0122).

    >>> outbox_bucket("pickups", "p-1") == outbox_bucket("pickups", "p-1")
    True
    """
    return _hashed("\x00".join(("outbox", queue, key)))


def ledger_bucket(
    binding_id: str,
    *,
    scope: str | None,
    document: str | None,
    key: str | None,
    execution_id: str | None,
    message_id: str | None,
) -> int:
    """The bucket of a routing-ledger row (decision 0125): its address's where the row
    names one (a delivery, a drop, a duplicate: the bucket its dedupe claim and its
    execution fall in), else the execution's it names (a refused send), else its
    message id's (a key refused: the bucket a sharded router routes an event without
    a key in), else its binding's.

    >>> ledger_bucket("orders", scope="web", document="order", key="o-17",
    ...               execution_id=None, message_id="m-1") == address_bucket("web", "order", "o-17")
    True
    >>> ledger_bucket("route", scope="web", document=None, key="mailer",
    ...               execution_id="order-17", message_id="m-1") == bucket_of("order-17")
    True
    """
    if scope is not None and document is not None and key is not None:
        return address_bucket(scope, document, key)
    if execution_id is not None:
        return bucket_of(execution_id)
    return bucket_of(binding_id if message_id is None else message_id)


def one_bucket(bucket: int) -> int:
    """``bucket`` checked as one of the buckets.

    >>> one_bucket(1023)
    1023
    >>> one_bucket(1024)
    Traceback (most recent call last):
    ...
    ValueError: a bucket is from 0 to 1023, not 1024

    Raises:
        ValueError: it is not.
    """
    if not 0 <= bucket < BUCKETS:
        raise ValueError(f"a bucket is from 0 to {BUCKETS - 1}, not {bucket!r}")
    return bucket


def tagged(bucket: int) -> str:
    """What an id minted as ``ex_`` and a ULID ends with to carry ``bucket``.

    >>> tagged(5)
    '_005'

    Raises:
        ValueError: ``bucket`` is not one of the buckets.
    """
    return f"_{one_bucket(bucket):03x}"


def bucket_range(buckets: tuple[int, int]) -> tuple[int, int]:
    """``buckets`` checked as a range of buckets: ``(start, end)`` with ``end``
    excluded, not empty, within ``0..BUCKETS``.

    >>> bucket_range((0, 512))
    (0, 512)
    >>> bucket_range((512, 512))
    Traceback (most recent call last):
    ...
    ValueError: buckets is a range (start, end) with 0 <= start < end <= 1024, not (512, 512)

    Raises:
        ValueError: it is not.
    """
    start, end = buckets
    if not 0 <= start < end <= BUCKETS:
        raise ValueError(
            f"buckets is a range (start, end) with 0 <= start < end <= {BUCKETS}, not {buckets!r}"
        )
    return buckets
