"""A chart drawn as SVG: nested boxes for states, arrows for transitions.

:func:`render_chart_svg` draws a compiled chart by itself (no network, no external
binary), with the active configuration highlighted, for the console's execution page.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

from statifier.chart import Machine

__all__ = ["MAX_DRAWN_STATES", "render_chart_svg"]

MAX_DRAWN_STATES: Final = 400
"""The most states one diagram draws; a larger chart is drawn up to the cap, with a
note saying how many states were left out."""


def render_chart_svg(machine: Machine, active: Collection[str] = ()) -> str:
    """Draw ``machine`` as one standalone ``<svg>`` element, inline-able in HTML.

    Args:
        machine: a compiled chart (:func:`statifier.chart.compile_chart`).
        active: author ids of the active states (any of the configuration: leaves,
            ancestors, or both); ids the chart does not have are ignored.

    Returns:
        The SVG text. Every drawn state is a ``<g>`` with ``data-state="<id>"`` (unnamed
        states get a generated ``data-state`` of the form ``#<index>``) and the class
        ``state`` (``state active`` when its id is in ``active``); compound and
        parallel states are boxes holding their children, a parallel's regions side by
        side with dashed separators; transitions are arrows labelled with their events,
        a self-transition a loop, a targetless one listed inside its state; the initial
        child is marked with a dot. Every text is escaped; the same input gives the same
        bytes.
    """
    raise NotImplementedError("being written")
