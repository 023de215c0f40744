"""Locks a call's own caller holds.

A route, an executor or a sink runs inside the step it serves, whose transaction holds
the execution's lock (and, in a delivery, the router's locks of its address and
message). If it calls back into that execution (steps it, routes to it) it opens a
second transaction that waits for a lock the first one holds until the call returns:
it would wait for ever (or, where the lock is the task's own, step the execution from a
position the first step has not written yet). This module sees that call coming and
refuses it at once with :class:`~statifier.persistence.errors.ReentrantCall`.

Each transaction the library opens is registered, for as long as it is open, in the
task that opened it (a context variable: what a task's own callers hold is exactly
what nothing explicit can hand down through a host's callback). A transaction notes
each lock it takes in its ``held`` set; a lock another open transaction of the same
task, or of a task it started, holds already is refused.

>>> class Tx:
...     def __init__(self) -> None:
...         self.held: set[object] = set()
>>> outer, inner = Tx(), Tx()
>>> with opened(outer):
...     hold(outer, [("execution", "ex_1")], "execution 'ex_1'")
...     with opened(inner):
...         hold(inner, [("execution", "ex_2")], "execution 'ex_2'")  # another: fine
...         hold(inner, [("execution", "ex_1")], "execution 'ex_1'")
Traceback (most recent call last):
...
statifier.persistence.errors.ReentrantCall: ...
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import Protocol

from statifier.persistence.errors import ReentrantCall

__all__ = ["Holder", "hold", "opened", "register", "stepping", "unregister"]


class Holder(Protocol):
    """A transaction, with the locks it took."""

    held: set[object]


_OPEN: ContextVar[tuple[Holder, ...]] = ContextVar("statifier_open_transactions", default=())
_STEPPING: ContextVar[frozenset[str]] = ContextVar("statifier_stepping", default=frozenset())


@contextmanager
def stepping(execution_id: str) -> Iterator[None]:
    """Mark ``execution_id`` mid-step in this task (and the tasks it starts) for the
    block; a call for it from inside is refused.

    Raises:
        ReentrantCall: the execution is mid-step already in this task: the call comes
            from inside its own step (nested, it would step it from a position the
            outer step has not written yet).
    """
    current = _STEPPING.get()
    if execution_id in current:
        raise ReentrantCall(f"execution {execution_id!r}")
    token = _STEPPING.set(current | {execution_id})
    try:
        yield
    finally:
        _STEPPING.reset(token)


@contextmanager
def opened(tx: Holder) -> Iterator[None]:
    """Register ``tx`` as open in this task (and the tasks it starts) for the block."""
    token = register(tx)
    try:
        yield
    finally:
        unregister(token)


def register(tx: Holder) -> Token[tuple[Holder, ...]]:
    """:func:`opened`'s start, for a transaction a class opens and closes; hand the
    answer to :func:`unregister` in the same task."""
    return _OPEN.set((*_OPEN.get(), tx))


def unregister(token: Token[tuple[Holder, ...]]) -> None:
    """:func:`opened`'s end."""
    _OPEN.reset(token)


def hold(tx: Holder, keys: Iterable[Hashable], what: str) -> None:
    """Note that ``tx`` takes ``keys`` (``what`` names them), refusing the wait first
    if another open transaction of this task holds one of them.

    Raises:
        ReentrantCall: the wait could only end when the waiting call returns.
    """
    wanted = set(keys)
    for other in _OPEN.get():
        if other is not tx and not other.held.isdisjoint(wanted):
            raise ReentrantCall(what)
    tx.held.update(wanted)
