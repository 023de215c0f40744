"""The pytest plugin: fixtures for testing charts with statifier.

Registered under the ``pytest11`` entry point ``statifier``, so pytest loads it where
statifier is installed; ``-p no:statifier`` leaves it out, and
``-p statifier.testing.plugin`` (or ``pytest_plugins = ["statifier.testing.plugin"]``)
loads it where plugins are not loaded automatically. Loading it imports pytest and
the small modules of :mod:`statifier.testing`, nothing else: the library (charts,
persistence, SQLAlchemy) is imported when a test uses a fixture. Every fixture's name
starts with ``statifier_``, so none replaces a fixture of the host's own.

Fixtures, each new for every test:

``statifier_charts``
    An empty directory (a :class:`~pathlib.Path`) for the test's ``NAME.scxml`` charts.
``statifier_clock``
    A :class:`~statifier.testing.ManualClock` at :data:`~statifier.testing.START`.
``statifier_durable``
    A factory: ``statifier_durable(charts=None, **options)`` answers a
    :class:`~statifier.durable.Durable`, not yet opened, on a SQLite file of the
    test's own (the same file on every call), migrated when it opens, on
    ``statifier_clock``, with the charts of ``statifier_charts`` unless ``charts`` is
    given (compiled at the call: write them first).
``statifier_scenario``
    A :class:`~statifier.testing.ScenarioRunner` on ``statifier_charts``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from statifier.testing.clock import ManualClock
from statifier.testing.scenario import ScenarioRunner
from statifier.testing.store import sqlite_durable

if TYPE_CHECKING:
    import os

    from statifier.durable import Durable
    from statifier.durable.charts import ChartSource

__all__ = [
    "statifier_charts",
    "statifier_clock",
    "statifier_durable",
    "statifier_scenario",
]

DurableFactory = Callable[..., "Durable"]


@pytest.fixture
def statifier_charts(tmp_path: Path) -> Path:
    """An empty directory for the test's ``NAME.scxml`` charts."""
    charts = tmp_path / "statifier_charts"
    charts.mkdir()
    return charts


@pytest.fixture
def statifier_clock() -> ManualClock:
    """A clock that moves when the test advances it."""
    return ManualClock()


@pytest.fixture
def statifier_durable(
    tmp_path: Path, statifier_charts: Path, statifier_clock: ManualClock
) -> DurableFactory:
    """A factory of :class:`~statifier.durable.Durable` on the test's own SQLite file
    and clock (see the module docstring)."""
    folder = tmp_path / "statifier_store"
    folder.mkdir()

    def durable(
        charts: Mapping[str, ChartSource] | str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> Durable:
        chosen = statifier_charts if charts is None else charts
        return sqlite_durable(folder, charts=chosen, clock=statifier_clock, **options)

    return durable


@pytest.fixture
def statifier_scenario(statifier_charts: Path) -> ScenarioRunner:
    """Routing cases run on the charts of ``statifier_charts``."""
    return ScenarioRunner(statifier_charts)
