"""A delivery batch's reads, made set-based: what every delivery of a batch asks of
the database before its step, asked once for the whole batch.

A delivery run alone claims its message, reads its address and, at its step, takes its
execution's lock and reads its row: four round trips each. :func:`prepare` does the
same for N deliveries in a fixed number of statements, whatever N: the claims in one,
the addresses in one, the executions' locks in one (on PostgreSQL; SQLite's transaction
holds the single writer already) and their rows in one
(:meth:`~statifier.persistence.Storage.read_ahead`). Each delivery then runs with its
answer (:class:`~statifier.router.delivery.Claimed`) and its steps enter the locks
held (:meth:`Unit.holding <statifier.router.transaction.Unit.holding>`).

What a batch reads up front can change before a later delivery of the batch runs, when
two deliveries of the batch share something:

- a message twice on one binding: its first delivery claims it, the later ones are
  duplicates, as they would be one at a time;
- an address twice: an earlier delivery may insert it (a create) or see its execution
  end (the stamp). The later deliveries to it read the address when they run, as a
  delivery alone does (one statement each, only for them); its execution's lock, if it
  had one, is taken with the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from statifier.router.binding import Create
from statifier.router.delivery import Claimed, Delivery
from statifier.router.transaction import Unit

__all__ = ["Prepared", "prepare"]


@dataclass(frozen=True, slots=True)
class Prepared:
    """What :func:`prepare` read for a batch.

    Attributes:
        claims: each delivery's claim and address, in the deliveries' order; ``True``
            for a fresh claim whose address an earlier delivery of the batch shares
            (it reads the address when it runs).
        held: the executions whose locks the transaction took, and whose rows the
            storage holds read (for their steps to enter and read at once).
    """

    claims: tuple[Claimed | bool, ...]
    held: frozenset[str]


async def prepare(unit: Unit, deliveries: Sequence[Delivery], now: datetime) -> Prepared:
    """Claim every delivery's message, read every fresh claim's address, lock the
    executions those addresses name (unless ended) and read their rows, in ``unit``,
    in a fixed number of statements. The caller holds the batch's router locks (every
    claim's and address's) already.

    Raises:
        LockTimeout: on PostgreSQL, the executions' locks were not granted within the
            configuration's ``lock_wait``; the transaction (or the savepoint the call
            runs in) must be rolled back.
    """
    asked: dict[tuple[str, str], tuple[datetime, int]] = {}
    for delivery in deliveries:
        plan = delivery.plan
        asked.setdefault((plan.id, delivery.message_id), (now + plan.horizon, delivery.bucket))
    claims = [
        (binding, message, expires, bucket)
        for (binding, message), (expires, bucket) in asked.items()
    ]
    fresh = await unit.sql.claim_many(claims, now)
    # A message asked twice on one binding is claimed by its first delivery alone.
    firsts: set[tuple[str, str]] = set()
    firsts_fresh: list[bool] = []
    for delivery in deliveries:
        pair = (delivery.plan.id, delivery.message_id)
        firsts_fresh.append(pair in fresh and pair not in firsts)
        firsts.add(pair)
    wanted = list(
        dict.fromkeys(
            _address(delivery)
            for delivery, claimed in zip(deliveries, firsts_fresh, strict=True)
            if claimed and delivery.plan.create is not Create.ALWAYS_NEW
        )
    )
    found = await unit.sql.find_addresses(wanted)
    held = frozenset(row.execution_id for row in found.values() if row.terminal_seen_at is None)
    await unit.lock_executions(held, "a delivery batch's executions")
    answers: list[Claimed | bool] = []
    seen: set[tuple[str, str, str]] = set()
    for delivery, claimed in zip(deliveries, firsts_fresh, strict=True):
        address = _address(delivery)
        if not claimed:
            answers.append(Claimed(False, None))
        elif address in seen:
            answers.append(True)
        else:
            answers.append(Claimed(True, found.get(address)))
        if delivery.plan.create is not Create.ALWAYS_NEW:
            seen.add(address)
    return Prepared(tuple(answers), held)


def _address(delivery: Delivery) -> tuple[str, str, str]:
    return (delivery.scope, delivery.plan.document, delivery.key)
