"""Testing charts with statifier: a pytest plugin and the helpers it is made of.

A host's test suite checks its charts with these: executions on a SQLite file of the
test's own (:func:`sqlite_durable`), a clock that skips ahead and fires the durable
timers due on the way (:class:`ManualClock`), ``statifier scenario``'s routing cases
run from Python (:class:`ScenarioRunner`), and recorded executions' input logs,
exported to a JSON file (:func:`statifier.durable.export.export_input_logs`,
``statifier executions export``), replayed on a revision of their charts with an
assertion that it keeps their outcomes (:func:`assert_replays_same`).

The fixtures are in :mod:`statifier.testing.plugin`, which pytest loads through the
``statifier`` entry point. This package imports nothing heavy: what each helper needs
is imported when it is called. See ``docs/testing.md``.

>>> clock = ManualClock()
>>> clock().isoformat()
'2026-01-01T00:00:00+00:00'
"""

from statifier.testing.clock import START, ManualClock, TimerStuck
from statifier.testing.replay import Replayed, assert_replays_same, replay_input_logs
from statifier.testing.scenario import ScenarioRunner
from statifier.testing.store import sqlite_durable

__all__ = [
    "START",
    "ManualClock",
    "Replayed",
    "ScenarioRunner",
    "TimerStuck",
    "assert_replays_same",
    "replay_input_logs",
    "sqlite_durable",
]
