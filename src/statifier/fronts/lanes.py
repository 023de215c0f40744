"""Which lane an event runs on: its partition key, and the lane the key hashes to.

The partition key of an event is the address ``scope/document/key`` of the first
enabled binding of the event's source, in binding order, whose order is
:attr:`~statifier.router.Order.BY_KEY`, whose match holds and whose key resolves; an
event no such binding keys falls back to its message id (it needs no order with any
other). A binding of order ``none`` is never a partition key: its events may run on
any lane. One key's events share a lane, and a lane routes its events in the order
they arrived, so one key's events are routed in order.

>>> from statifier.router import Binding, InboundEvent
>>> clicks = Binding(id="clicks", source="ads", match="event.kind == 'click'",
...                  key="event.id", document="join", event="click")
>>> event = InboundEvent(scope="s", source="ads", message_id="m1",
...                      data={"kind": "click", "id": "i7"})
>>> partition_key([clicks], event)
's/join/i7'
>>> partition_key([clicks], InboundEvent(scope="s", source="ads", message_id="m2", data={}))
'm2'
>>> lane_of("s/join/i7", 8)
0
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from statifier.router import Binding, Door, InboundEvent, Keyed, Order, RouterConfig

__all__ = ["event_key", "lane_of", "partition_key"]


def partition_key(bindings: Sequence[Binding], event: InboundEvent) -> str:
    """The partition key of ``event`` among ``bindings`` (see the module docstring)."""
    for binding in bindings:
        if not binding.enabled or binding.source != event.source:
            continue
        if binding.order is not Order.BY_KEY:
            continue
        answer = binding.evaluate(event.data)
        if isinstance(answer, Keyed):
            return f"{event.scope}/{binding.document}/{answer.key}"
    return event.message_id


async def event_key(config: RouterConfig, event: InboundEvent) -> str:
    """The partition key of ``event`` among the bindings of its scope, read under the
    configuration's ``around_delivery`` with :attr:`~statifier.router.Door.PARTITION`.

    Raises:
        Exception: whatever reading the scope's bindings raised.
    """

    async def read() -> Sequence[Binding]:
        return await config.bindings_for(event.scope)

    around = config.around_delivery
    bindings = await read() if around is None else await around(event.scope, Door.PARTITION, read)
    return partition_key(bindings, event)


def lane_of(key: str, lanes: int) -> int:
    """The lane of ``key`` among ``lanes`` (at least 1): ``crc32(key) % lanes``, the
    same in every process and every run."""
    return zlib.crc32(key.encode("utf-8")) % lanes
