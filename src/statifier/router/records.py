"""The rows of the router's tables, as plain values.

:class:`AddressRow` and :class:`ReapRow` are the storage layer's rows
(:mod:`statifier.sql.routing`), exported here as the router's; :class:`LedgerRow` is
what the router says happened to one event, written as a routing-ledger row.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from datetime import datetime

from statifier.sql.routing import AddressRow, ReapRow

__all__ = ["AddressRow", "LedgerRow", "ReapRow"]


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """One routing-ledger row: what happened to one event on one binding.

    ``outcome`` is ``delivered``, ``created_and_delivered``, ``duplicate``,
    ``key_refused`` or ``dropped``; ``reason`` is the drop reason or the refusal.
    """

    binding_id: str
    _: KW_ONLY
    message_id: str | None
    scope: str | None
    source: str | None
    outcome: str
    reason: str | None
    document: str | None
    key: str | None
    execution_id: str | None
    inserted_at: datetime

    @property
    def spelled(self) -> str:
        """The outcome as the scenario report spells it (``dropped: finished``)."""
        if self.outcome == "dropped":
            return f"dropped: {self.reason}"
        return self.outcome
