"""GapTracker: a reader never passes a position that may still appear."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scriba.sources.gaps import MAX_READS_PER_CALL, GapTracker


def _read(tracker: GapTracker, visible: set[int], running: set[int], limit: int) -> list[int]:
    """One read as the sources make it: select after the cursor, accept, fence with
    the writers running just after, close the gaps and read again once they have all ended."""
    out: list[int] = []
    for _ in range(MAX_READS_PER_CALL):
        rows = sorted(p for p in visible if p > tracker.cursor)[: limit - len(out)]
        accepted = tracker.accept(rows)
        out.extend(rows[:accepted])
        if not tracker.blocked or len(out) >= limit:
            break
        if tracker.fenced_writers is None:
            tracker.fence(rows[-1], frozenset(str(p) for p in running))
        writers = tracker.fenced_writers
        assert writers is not None
        if any(int(w) in running for w in writers):
            break
        tracker.close_gaps()
    return out


@settings(max_examples=300, deadline=None)
@given(
    outcomes=st.lists(st.booleans(), min_size=1, max_size=30),
    data=st.data(),
    limit=st.integers(1, 8),
)
def test_a_reader_never_passes_a_position_that_still_commits(
    outcomes: list[bool], data: st.DataObject, limit: int
) -> None:
    """Positions 1..n are drawn at once by n transactions that end in any order, each
    committing (True) or rolling back; the reader reads between any two endings."""
    n = len(outcomes)
    order = data.draw(st.permutations(range(1, n + 1)))
    tracker = GapTracker(0, gaps_can_fill=True)
    visible: set[int] = set()
    running = set(range(1, n + 1))
    delivered: list[int] = []
    commits = {p for p, ok in zip(range(1, n + 1), outcomes, strict=True) if ok}
    for position in order:
        for _ in range(data.draw(st.integers(0, 2))):
            got = _read(tracker, visible, running, limit)
            for p in got:  # every committing position below p was delivered already
                assert all(q in delivered for q in commits if q < p and q not in got)
            delivered.extend(got)
        running.discard(position)
        if position in commits:
            visible.add(position)
    while got := _read(tracker, visible, running, limit):
        delivered.extend(got)
    assert delivered == sorted(commits)


def test_without_fillable_gaps_everything_visible_is_accepted() -> None:
    tracker = GapTracker(2, gaps_can_fill=False)
    assert tracker.accept([5, 9]) == 2
    assert tracker.cursor == 9
    assert not tracker.blocked


def test_positions_must_ascend_above_the_cursor() -> None:
    tracker = GapTracker(3, gaps_can_fill=True)
    with pytest.raises(ValueError, match="above 3"):
        tracker.accept([3])
    with pytest.raises(ValueError, match="0 or more"):
        GapTracker(-1, gaps_can_fill=True)


def test_the_first_fence_is_kept_until_closed() -> None:
    tracker = GapTracker(0, gaps_can_fill=True)
    assert tracker.accept([2]) == 0
    tracker.fence(2, frozenset({"a"}))
    tracker.fence(9, frozenset({"b"}))
    assert tracker.fenced_writers == frozenset({"a"})
    tracker.close_gaps()
    assert _writers(tracker) is None
    assert tracker.accept([2, 4]) == 1  # 1 is passed; 3 is above the closed horizon
    assert tracker.blocked


def _writers(tracker: GapTracker) -> frozenset[str] | None:
    # A function, so that mypy does not keep the narrowing from before close_gaps().
    return tracker.fenced_writers
