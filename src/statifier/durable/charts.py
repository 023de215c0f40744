"""The charts :class:`~statifier.durable.Durable` is given, compiled once by name."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeAlias

from statifier.chart import InvalidChart, Machine, ReadLimits, compile_chart
from statifier.durable.errors import ChartUnusable
from statifier.durable.values import _text
from statifier.expr import Function

__all__ = ["ChartSource"]

ChartSource: TypeAlias = "Machine | bytes | str | os.PathLike[str]"
"""A chart as :class:`Durable` takes it: a compiled :class:`~statifier.chart.Machine`,
SCXML source (``bytes``, or a ``str`` whose first non-blank character is ``<``), or
the path of an SCXML file (any other ``str``, or a path object)."""


def _compiled(
    charts: Mapping[str, ChartSource] | str | os.PathLike[str] | None,
    loader: Callable[[str], str] | None,
    functions: Mapping[str, Function],
) -> dict[str, Machine]:
    if charts is None:
        return {}
    if isinstance(charts, (str, os.PathLike)):
        directory = Path(charts)
        if not directory.is_dir():
            raise ChartUnusable("*", str(directory), "not a directory of *.scxml files")
        files = sorted(directory.glob("*.scxml"))
        return {path.stem: _compile(path.stem, path, loader, functions) for path in files}
    if not isinstance(charts, Mapping):
        raise TypeError(f"charts maps names to charts, or is a directory, not {charts!r}")
    compiled = {}
    for name, source in charts.items():
        compiled[_text(name, "a chart name")] = _compile(name, source, loader, functions)
    return compiled


def _compile(
    name: str,
    source: ChartSource,
    loader: Callable[[str], str] | None,
    functions: Mapping[str, Function],
) -> Machine:
    if isinstance(source, Machine):
        return source
    origin = "source"
    if isinstance(source, str) and not source.lstrip().startswith("<"):
        source = Path(source)
    if isinstance(source, os.PathLike):
        origin = os.fspath(source)
        source = _read(name, origin)
    if not isinstance(source, (bytes, str)):
        raise TypeError(f"chart {name!r} is a Machine, SCXML source or a path, not {source!r}")
    try:
        return compile_chart(source, name=name, loader=loader, functions=functions)
    except InvalidChart as invalid:
        problems = "; ".join(str(problem) for problem in invalid.problems)
        raise ChartUnusable(name, origin, problems) from None


def _read(name: str, path: str) -> bytes:
    """The chart file at ``path``, read no further than the reader's size bound (one
    byte past it: the reader then refuses it by its size).

    Raises:
        ChartUnusable: it cannot be read (naming the chart and the path).
    """
    try:
        with open(path, "rb") as file:
            return file.read(ReadLimits().max_bytes + 1)
    except (OSError, ValueError) as error:  # ValueError: a NUL in the path
        why = error.strerror if isinstance(error, OSError) else str(error)
        raise ChartUnusable(name, path, f"cannot read: {why}") from None
