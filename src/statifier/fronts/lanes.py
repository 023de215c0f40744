"""Which lane an event runs on: the lane its partition key hashes to.

The partition key of an event (:attr:`statifier.router.Planned.key`, read by
:meth:`statifier.router.Router.plan`) is the address ``scope/document/key`` of the first
enabled binding of the event's source, in binding order, whose order is
:attr:`~statifier.router.Order.BY_KEY`, whose match holds and whose key resolves; an
event no such binding keys falls back to its message id (it needs no order with any
other). A binding of order ``none`` is never a partition key: its events may run on
any lane. One key's events share a lane, and a lane routes its events in the order
they arrived, so one key's events are routed in order.

>>> lane_of("s/join/i7", 8)
0
"""

from __future__ import annotations

import zlib

__all__ = ["lane_of"]


def lane_of(key: str, lanes: int) -> int:
    """The lane of ``key`` among ``lanes`` (at least 1): ``crc32(key) % lanes``, the
    same in every process and every run."""
    return zlib.crc32(key.encode("utf-8")) % lanes
