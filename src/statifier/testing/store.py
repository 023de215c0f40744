"""A :class:`~statifier.durable.Durable` on a SQLite file of a test's own."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from statifier.durable import Durable
    from statifier.durable.charts import ChartSource
    from statifier.testing.clock import ManualClock

__all__ = ["DATABASE_FILE", "sqlite_durable"]

DATABASE_FILE: Final = "statifier.db"
"""The name of the SQLite file :func:`sqlite_durable` opens in its folder."""


def sqlite_durable(
    folder: str | os.PathLike[str],
    *,
    charts: Mapping[str, ChartSource] | str | os.PathLike[str] | None = None,
    clock: ManualClock | None = None,
    **options: Any,
) -> Durable:
    """A :class:`~statifier.durable.Durable`, not yet opened, on the SQLite file
    ``folder/statifier.db``, migrated when it opens; every call on one folder opens the
    same database, as a second process would.

    Args:
        folder: an existing directory (a test's ``tmp_path``).
        charts: as ``Durable(charts=...)``: names to charts, or a directory of
            ``*.scxml`` files (compiled now: fill it first).
        clock: the clock the executions and their timers run on (the wall clock if
            ``None``).
        options: any other argument of :class:`~statifier.durable.Durable`
            (``executor``, ``functions``, ``on_error``...).

    Raises:
        ValueError: ``folder`` is not a directory.
        statifier.durable.UnknownChart, statifier.durable.ChartUnusable: as ``Durable``.
        statifier.extras.MissingExtra: when it opens, the ``sqlite`` extra is missing.
    """
    from statifier.durable import Durable

    where = Path(folder)
    if not where.is_dir():
        raise ValueError(f"{where} is not a directory")
    url = f"sqlite:///{where / DATABASE_FILE}"
    if clock is not None:
        options["clock"] = clock
    return Durable(url, charts=charts, migrate=True, **options)
