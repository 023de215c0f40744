"""The gapless prefix: how far each partition may be acknowledged.

A consumer is done with messages out of order (lanes run concurrently), but a source
is acknowledged by position: committing position ``P`` of a partition acknowledges
every message up to ``P``. A message is *done* once its delivery committed or it was
dead-lettered. :class:`Acks` remembers, per partition, the positions fetched and still
pending, and returns the highest position whose every fetched message up to it is
done: the only position that may be committed without acknowledging a message
whose delivery has not committed.

>>> acks = Acks()
>>> for position in (1, 2, 3):
...     acks.fetched("p", position)
True
True
True
>>> acks.done("p", 2)
>>> acks.committable()
{}
>>> acks.done("p", 1)
>>> acks.committable()
{'p': 2}
>>> acks.committed({"p": 2})  # the messages it acknowledged
2
>>> acks.committable(), acks.pending()
({}, 1)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

__all__ = ["Acks"]


@dataclass
class _Partition:
    """One partition's fetched positions in order, and which of them are done."""

    waiting: deque[int] = field(default_factory=deque)
    done: set[int] = field(default_factory=set)
    highest: int | None = None
    """The highest position fetched."""
    prefix: int | None = None
    """The highest position whose every fetched predecessor is done."""
    committed: int | None = None
    passed: deque[int] = field(default_factory=deque)
    """The positions the prefix passed that no commit has covered yet."""


class Acks:
    """The fetched and done positions of every partition a consumer reads.

    Invariants: the prefix of a partition never passes a fetched position that is not
    done, and what :meth:`committable` returns only grows for a partition until it
    is :meth:`forget`-ten.
    """

    def __init__(self) -> None:
        self._partitions: dict[str, _Partition] = {}

    def fetched(self, partition: str, position: int) -> bool:
        """Note a message handed over by the source. Returns ``False`` (and notes
        nothing) for a position not beyond the partition's highest: a repeat, which is
        in flight or done already and must not be routed twice."""
        state = self._partitions.setdefault(partition, _Partition())
        if state.highest is not None and position <= state.highest:
            return False
        state.highest = position
        state.waiting.append(position)
        return True

    def done(self, partition: str, position: int) -> None:
        """Note that the message at ``position`` is done (its delivery committed, or
        it was dead-lettered); the prefix moves over every done position at its
        front. A position not waiting (forgotten, or never fetched) is ignored."""
        state = self._partitions.get(partition)
        if state is None or position in state.done or position not in state.waiting:
            return
        state.done.add(position)
        while state.waiting and state.waiting[0] in state.done:
            front = state.waiting.popleft()
            state.done.discard(front)
            state.prefix = front
            state.passed.append(front)

    def committable(self, partitions: Collection[str] | None = None) -> dict[str, int]:
        """Each partition's prefix (of ``partitions``, or of all) that is beyond its
        last commit."""
        return {
            name: state.prefix
            for name, state in self._partitions.items()
            if (partitions is None or name in partitions)
            and state.prefix is not None
            and (state.committed is None or state.prefix > state.committed)
        }

    def committed(self, positions: Mapping[str, int]) -> int:
        """Note that ``positions`` were committed; returns how many messages the
        commit acknowledged (those the prefixes passed since the previous commit)."""
        count = 0
        for name, position in positions.items():
            state = self._partitions.get(name)
            if state is None or (state.committed is not None and position <= state.committed):
                continue
            state.committed = position
            while state.passed and state.passed[0] <= position:
                state.passed.popleft()
                count += 1
        return count

    def pending(self, partitions: Collection[str] | None = None) -> int:
        """How many fetched messages (of ``partitions``, or of all) are not done."""
        return sum(
            len(state.waiting) - len(state.done)
            for name, state in self._partitions.items()
            if partitions is None or name in partitions
        )

    def forget(self, partitions: Collection[str]) -> None:
        """Drop everything known of ``partitions`` (given up): a later fetch of one of
        them starts afresh."""
        for name in partitions:
            self._partitions.pop(name, None)
