"""The router's pin source: address rows hold their executions' chart back from
retirement.

>>> # executions.retire_chart(hash, retired_by="publisher", pin_sources=[AddressPins(router)])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from statifier.router.routing import Router

__all__ = ["AddressPins"]


class AddressPins:
    """A :class:`~statifier.persistence.executions.PinSource`: the number of address rows naming
    one of the active executions on the chart, as ``{"addresses": n}``.

    The count is over the execution ids retirement hands in (an address row carries no
    content hash); a pin releases when its execution leaves the active set.
    """

    def __init__(self, router: Router) -> None:
        self._router = router

    async def pins(self, content_hash: str, execution_ids: Sequence[str]) -> Mapping[str, int]:
        if not execution_ids:
            return {"addresses": 0}
        async with self._router.transaction() as unit:
            return {"addresses": await unit.sql.count_addresses(list(execution_ids))}
