"""The gapless prefix: whatever order messages are done in, the position a consumer
may commit never passes a message that is not done, and it only grows."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from statifier.fronts.acks import Acks

PARTITIONS = ("a", "b", "c")


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[str, str, int]]:
    """Fetches (positions increasing per partition, with gaps and repeats) and
    fetched positions done, interleaved, with commits between."""
    steps: list[tuple[str, str, int]] = []
    highest = dict.fromkeys(PARTITIONS, 0)
    fetched: list[tuple[str, int]] = []
    for _ in range(draw(st.integers(0, 60))):
        kind = draw(st.sampled_from(["fetch", "fetch", "done", "done", "commit", "repeat"]))
        partition = draw(st.sampled_from(PARTITIONS))
        if kind == "fetch":
            highest[partition] += draw(st.integers(1, 3))  # sources may skip positions
            fetched.append((partition, highest[partition]))
            steps.append(("fetch", partition, highest[partition]))
        elif kind == "repeat" and highest[partition]:
            steps.append(("fetch", partition, draw(st.integers(1, highest[partition]))))
        elif kind == "done" and fetched:
            chosen, position = draw(st.sampled_from(fetched))
            steps.append(("done", chosen, position))
        else:
            steps.append(("commit", partition, 0))
    return steps


@settings(max_examples=200, deadline=None, database=None)
@given(history=histories())
def test_the_committed_position_never_passes_a_pending_message(
    history: list[tuple[str, str, int]],
) -> None:
    acks = Acks()
    pending: dict[str, set[int]] = {p: set() for p in PARTITIONS}
    committed: dict[str, int] = {}
    acknowledged = 0
    done_count = 0
    for kind, partition, position in history:
        if kind == "fetch":
            if acks.fetched(partition, position):
                pending[partition].add(position)
        elif kind == "done":
            if position in pending[partition]:
                done_count += 1
            pending[partition].discard(position)
            acks.done(partition, position)
        else:
            positions = acks.committable()
            for name, at in positions.items():
                assert all(at < waiting for waiting in pending[name]), (name, at)
                assert at > committed.get(name, 0)  # monotone: every commit moves forward
            acknowledged += acks.committed(positions)
            committed.update(positions)
    assert acknowledged <= done_count
    assert acks.pending() == sum(len(waiting) for waiting in pending.values())
    # Once everything is done, the prefix reaches the highest fetched position.
    for partition, waiting in pending.items():
        for position in sorted(waiting):
            acks.done(partition, position)
    final = {**committed, **acks.committable()}
    for partition in PARTITIONS:
        fetched = [p for k, q, p in history if k == "fetch" and q == partition]
        if fetched:
            assert final[partition] == max(fetched)


def test_a_repeat_is_refused_and_forgetting_starts_afresh() -> None:
    acks = Acks()
    assert acks.fetched("p", 5)
    assert not acks.fetched("p", 5)
    assert not acks.fetched("p", 3)
    acks.forget(["p"])
    assert acks.fetched("p", 3)
    acks.done("p", 3)
    assert acks.committable() == {"p": 3}
    assert acks.committed({"p": 3}) == 1
    assert acks.committed({"p": 3}) == 0  # not again


def test_an_older_commit_acknowledges_only_what_it_covers() -> None:
    acks = Acks()
    for position in (1, 2, 3):
        acks.fetched("p", position)
    acks.done("p", 1)
    early = acks.committable()
    acks.done("p", 2)  # done while the commit of position 1 is under way
    assert acks.committed(early) == 1
    assert acks.committable() == {"p": 2}
    assert acks.committed({"p": 2}) == 1
    assert acks.pending() == 1
