"""Lock keys are hashed in Python and never change: a process of one version and one of
the next must take the same key for the same execution, or both could hold it."""

from __future__ import annotations

from statifier.sql.dialect import execution_lock_key, lock_key


def test_execution_lock_keys_are_pinned() -> None:
    # Values computed once and written down: a change to the hash, its person or its
    # leading name fails here before it lets two versions step one execution at once.
    assert execution_lock_key("order-1") == lock_key("execution", "order-1")
    assert [execution_lock_key(i) for i in ("order-1", "ex_a/payment", "")] == [
        -5395075056329965075,
        4474490825884983558,
        7991704396789264295,
    ]
