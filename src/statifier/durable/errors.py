"""What :class:`~statifier.durable.Durable` raises, besides persistence's own errors."""

from __future__ import annotations

import builtins
import difflib

__all__ = ["ChartUnusable", "DurableError", "UnknownChart"]


class DurableError(Exception):
    """Something ``Durable`` refuses; nothing was changed."""


class UnknownChart(DurableError, LookupError):  # noqa: N818 - names the refusal
    """No chart was given under this name; ``known`` lists those that were."""

    def __init__(self, name: str, known: builtins.list[str]) -> None:
        names = ", ".join(known) if known else "none (pass charts={name: chart})"
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        super().__init__(f"no chart named {name!r}{hint}; the charts are: {names}")
        self.name = name
        self.known = known


class ChartUnusable(DurableError, ValueError):  # noqa: N818
    """A chart given to :class:`Durable` cannot be read or does not compile; the
    message names the chart, where it came from, and every problem."""

    def __init__(self, name: str, origin: str, why: str) -> None:
        super().__init__(f"chart {name!r} ({origin}): {why}")
        self.name = name
        self.origin = origin
