"""A repeated error logged once per interval with a count: the first line of a key at
once, the same key within the interval only counted, the next line after it with the
count, keys apart from each other, a forgotten key logged at once again."""

from __future__ import annotations

import logging
import threading

import pytest

from statifier.repeats import Repeats


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_key_and_interval_with_the_count_of_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    repeats = Repeats(interval=10.0, clock=clock)
    log = logging.getLogger("tests.repeats")
    caplog.set_level(logging.INFO, "tests.repeats")
    said = []
    for at in (0.0, 1.0, 2.0, 9.9, 10.0, 10.5, 25.0):
        clock.now = 100.0 + at
        said.append(repeats.log(log, logging.WARNING, "down", "broker down: %s", "refused"))
    assert said == [True, False, False, False, True, False, True]
    assert [r.getMessage() for r in caplog.records] == [
        "broker down: refused",
        "broker down: refused (3 more like it in the last 10 s)",
        "broker down: refused (1 more like it in the last 15 s)",
    ]
    assert [vars(r)["repeated"] for r in caplog.records] == [0, 3, 1]
    assert {r.levelno for r in caplog.records} == {logging.WARNING}


def test_keys_are_apart_and_a_forgotten_key_is_logged_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    repeats = Repeats(interval=10.0, clock=clock)
    log = logging.getLogger("tests.repeats")
    caplog.set_level(logging.INFO, "tests.repeats")
    assert repeats.log(log, logging.ERROR, ("a", 1), "a", extra={"part": "a"})
    assert repeats.log(log, logging.ERROR, ("b", 1), "b")
    assert not repeats.log(log, logging.ERROR, ("a", 1), "a")
    assert repeats.forget(("a", 1)) == 1
    assert repeats.forget(("a", 1)) == 0
    assert repeats.log(log, logging.ERROR, ("a", 1), "a again")
    assert [r.getMessage() for r in caplog.records] == ["a", "b", "a again"]
    assert vars(caplog.records[0])["part"] == "a"


def test_many_threads_count_every_occurrence() -> None:
    repeats = Repeats(interval=3600.0)
    logged: list[int | None] = []

    def hammer() -> None:
        logged.extend(repeats.note("k") for _ in range(1000))

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [n for n in logged if n is not None] == [0]
    assert repeats.forget("k") == 3999


def test_the_interval_is_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Repeats(interval=0)
