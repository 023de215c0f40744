"""The rows of the router's tables, as plain values.

:class:`AddressRow`, :class:`ReapRow`, :class:`LedgerRow` (what the router says
happened to one event, written as a routing-ledger row and read back as one) and
:class:`HeldRow` (an event kept for a paused execution) are the
storage layer's rows (:mod:`statifier.sql.routing`), exported here as the router's.
"""

from __future__ import annotations

from statifier.sql.routing import AddressRow, HeldRow, LedgerRow, ReapRow

__all__ = ["AddressRow", "HeldRow", "LedgerRow", "ReapRow"]
