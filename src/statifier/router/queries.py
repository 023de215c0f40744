"""Reading the router's tables: the ledger and the addresses."""

from __future__ import annotations

from statifier.router.records import AddressRow, LedgerRow
from statifier.router.routing import Router

__all__ = ["address", "address_of", "ledger", "newest_address"]


async def ledger(router: Router, execution_id: str | None = None) -> list[LedgerRow]:
    """Routing-ledger rows, oldest first: every row, or those naming ``execution_id``.

    Rows written at the same instant come in insertion order with an integer key; with
    a UUID key (``TableOptions(key_type=sa.Uuid)``) their order among themselves is
    unspecified."""
    async with router.transaction() as unit:
        return await unit.sql.ledger(execution_id)


async def address(router: Router, scope: str, document: str, key: str) -> AddressRow | None:
    """The address row of ``(scope, document, key)``, if there is one."""
    async with router.transaction() as unit:
        return await unit.sql.find_address(scope, document, key)


async def address_of(router: Router, execution_id: str) -> tuple[str, str, str] | None:
    """The ``(scope, document, key)`` an execution is addressed under, if any."""
    async with router.transaction() as unit:
        return await unit.sql.address_of(execution_id)


async def newest_address(router: Router, scope: str, document: str) -> str | None:
    """The execution the newest address of ``document`` in ``scope`` names, if any."""
    async with router.transaction() as unit:
        return await unit.sql.named_by(scope, document)
