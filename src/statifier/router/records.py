"""The rows of the router's tables, as plain values."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from datetime import datetime
from typing import Any

__all__ = ["AddressRow", "LedgerRow", "ReapRow"]


@dataclass(frozen=True, slots=True)
class AddressRow:
    """An address: which execution a (scope, document, key) names.

    Attributes:
        id: the row's surrogate key.
        execution_id: the execution the address names.
        terminal_seen_at: when the router first saw that execution ended, else ``None``.
    """

    id: Any
    _: KW_ONLY
    execution_id: str
    terminal_seen_at: datetime | None


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

    def values(self) -> dict[str, Any]:
        """The row as statement parameters (built by hand: ``asdict`` deep-copies)."""
        return {
            "binding_id": self.binding_id,
            "message_id": self.message_id,
            "scope": self.scope,
            "source": self.source,
            "outcome": self.outcome,
            "reason": self.reason,
            "document": self.document,
            "key": self.key,
            "execution_id": self.execution_id,
            "inserted_at": self.inserted_at,
        }

    @property
    def spelled(self) -> str:
        """The outcome as the scenario report spells it (``dropped: finished``)."""
        if self.outcome == "dropped":
            return f"dropped: {self.reason}"
        return self.outcome


@dataclass(frozen=True, slots=True)
class ReapRow:
    """An address as the reaper reads it, beside its execution's status (``None`` when
    the execution is gone)."""

    id: Any
    _: KW_ONLY
    document: str
    terminal_seen_at: datetime | None
    status: str | None
