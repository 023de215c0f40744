"""Shadow replay at scale, on SQLite and PostgreSQL: executions of a cart recorded
through ``Executions``, replayed on one revision that renames a state, changes a guard
and adds a timer at once. Every verdict, divergence and new error is checked against
the same logs run through a fresh durable store on each chart (every divergence found,
none invented), and the source database is unchanged: its row counts, and on SQLite
its file's bytes.

The suite runs it on 200 executions; ``SHADOW_ACCEPTANCE_EXECUTIONS=10000`` runs the
same test on ten thousand (the figure recorded in ``bench/RESULTS.md``).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections import Counter
from pathlib import Path

from tests.test_shadow import (
    CART,
    Place,
    _counts,
    check_against_fresh_store,
    place,  # noqa: F401 - the fixture
    record,
)

from statifier.shadow import Verdict

EXECUTIONS = int(os.environ.get("SHADOW_ACCEPTANCE_EXECUTIONS", "200"))

REVISION = (
    CART.replace('"paying"', '"payment"')
    .replace("&gt; 100", "&gt; 50")
    .replace(
        '<state id="payment">',
        '<state id="payment"><onentry><send id="expire" event="expire" delay="1h"/></onentry>',
    )
)
"""The state ``paying`` renamed ``payment``, the review guard moved from 100 to 50,
and a timer sent on entering the renamed state."""


def _digest(where: Place) -> str | None:
    """The SQLite file's bytes, hashed (``None`` on PostgreSQL)."""
    if not where.url.startswith("sqlite:///"):
        return None
    return hashlib.sha256(Path(where.url.removeprefix("sqlite:///")).read_bytes()).hexdigest()


def test_a_revision_with_three_changes_against_a_fresh_store(place: Place) -> None:  # noqa: F811
    assert '"paying"' not in REVISION
    assert "delay=" in REVISION
    assert "&gt; 50" in REVISION
    asyncio.run(record(place, EXECUTIONS, seed=2026))
    before, digest = _counts(place), _digest(place)
    assert before["executions"] == EXECUTIONS
    results = asyncio.run(check_against_fresh_store(place, REVISION))
    assert _counts(place) == before
    assert _digest(place) == digest
    verdicts = Counter(result.verdict for result in results)
    parts = Counter(result.divergence.parts for result in results if result.divergence)
    # The recorded scripts reach every change: a renamed state and a timer at checkout,
    # and an amount between the two guards.
    assert verdicts[Verdict.DIVERGED] > 0
    assert verdicts[Verdict.SAME] > 0
    assert parts[("configuration", "handed")] > 0
    assert any("datamodel" in found for found in parts)
    print(
        f"{EXECUTIONS} executions, {sum(r.inputs for r in results)} inputs: "
        f"{dict(sorted((v.value, n) for v, n in verdicts.items()))}, parts {dict(parts)}"
    )
