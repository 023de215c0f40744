"""The rows of the router's tables, as plain values.

:class:`AddressRow`, :class:`ReapRow` and :class:`LedgerRow` (what the router says
happened to one event, written as a routing-ledger row and read back as one) are the
storage layer's rows (:mod:`statifier.sql.routing`), exported here as the router's.
"""

from __future__ import annotations

from statifier.sql.routing import AddressRow, LedgerRow, ReapRow

__all__ = ["AddressRow", "LedgerRow", "ReapRow"]
