"""Running W3C conformance charts as durable executions through the router.

Two halves:

- :func:`self_send_charts` selects, by reading the XML, the vendored W3C charts whose
  every ``<send>`` goes to the chart itself (no target, ``#_internal``, or a computed
  target that is plainly its own ``#_scxml_`` address), delayed or not, with
  ``<cancel>`` allowed, and nothing a durable execution has no counterpart for.
- :func:`run_durable` creates one as a durable execution and drives the built-in timer
  queue on a hand-moved clock until the execution ends or nothing is pending.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tests.router.conftest import Clock
from tests.session.test_scxml_sessions import CORPUS

from statifier.chart import Machine
from statifier.persistence import Status
from statifier.router import Router
from statifier.router.timer_worker import TimerWorker
from statifier.router.transaction import Delivering

__all__ = [
    "SCOPE",
    "DurableEnd",
    "Selected",
    "excluded_charts",
    "final_ids",
    "run_durable",
    "self_send_charts",
]

SCOPE: Final = "w3c"
"""The scope every durable execution of these tests is created in."""

MAX_PASSES: Final = 200
"""The most timer passes one run makes: a chart that re-arms a timer forever ends the
run there, still active, instead of spinning the test."""

_NS: Final = "{http://www.w3.org/2005/07/scxml}"
_SCXML_PROCESSOR: Final = "http://www.w3.org/TR/scxml/#SCXMLEventProcessor"
_OWN_TYPES: Final = frozenset({_SCXML_PROCESSOR, "scxml"})
_INTERNAL: Final = "#_internal"


# Reading a chart.


class _Own:
    """An abstract value a computed target or type can be known to have."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


SESSION_ID: Final = _Own("_sessionid")
"""The session's own id (``_sessionid``; a durable execution's is its execution id)."""
OWN_ADDRESS: Final = _Own("#_scxml_<own id>")
"""The chart's own SCXML address: ``'#_scxml_' + _sessionid``, or the origin of an
event it sent itself."""
OWN_TYPE: Final = _Own("<SCXML processor>")
"""The origin type of an event the chart sent itself: the SCXML I/O processor."""
UNKNOWN: Final = _Own("<unknown>")

Abstract = str | _Own

_LITERAL = re.compile(r"""^(?:'([^'\\]*)'|"([^"\\]*)")$""")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _evaluate(expr: str, env: Mapping[str, Abstract]) -> Abstract:
    """What ``expr`` is known to be, over a tiny vocabulary: string literals,
    ``_sessionid``, ``_event.origin`` and ``_event.origintype``, variables and ``+``.

    ``_event.origin`` is the chart's own address because the selection admits only
    charts whose every send goes to themselves and which invoke nothing: no one else
    can send them an event (an event the platform raises has no origin at all, and a
    send to it fails alike in both runs).
    """
    text = expr.strip()
    if "+" in text:
        parts = [_evaluate(part, env) for part in text.split("+")]
        if all(isinstance(part, str) for part in parts):
            return "".join(part for part in parts if isinstance(part, str))
        if parts == ["#_scxml_", SESSION_ID]:
            return OWN_ADDRESS
        return UNKNOWN
    literal = _LITERAL.match(text)
    if literal is not None:
        return literal.group(1) if literal.group(1) is not None else literal.group(2)
    if text == "_sessionid":
        return SESSION_ID
    if text == "_event.origin":
        return OWN_ADDRESS
    if text == "_event.origintype":
        return OWN_TYPE
    if _NAME.match(text):
        return env.get(text, UNKNOWN)
    return UNKNOWN


def _local(element: ET.Element) -> str:
    return element.tag.removeprefix(_NS)


def _why_not(root: ET.Element, text: str) -> str | None:
    """Why the chart is not one the durable path can run alike, or ``None``.

    Computed targets and types are evaluated over the datamodel's writes in document
    order (``<data>``, then every ``<assign>`` in the order it is written). In these
    charts that is the order they run in, and the check keeps it honest: a variable a
    computed target reads must not be written after the send, nor by a ``<script>`` or
    a ``<foreach>``. Should a send still slip through that goes elsewhere, the durable
    run hands it to the default executor, which refuses it as error.communication: the
    chart then ends where a live session's failed send leaves it, or the test fails.
    """
    elements = list(root.iter())
    tags = {_local(element) for element in elements}
    if "invoke" in tags:
        return "invoke"
    if "_ioprocessors" in text:
        return "_ioprocessors"
    if any(_local(e) in ("data", "script") and "src" in e.attrib for e in elements):
        return "external content (src): the stored chart has no loader"
    sends = [e for e in elements if _local(e) == "send"]
    if not sends:
        return "no send"
    env: dict[str, Abstract] = {}
    read: set[str] = set()
    for element in elements:
        tag = _local(element)
        if tag in ("data", "assign"):
            name = element.attrib.get("id" if tag == "data" else "location", "")
            expr = element.attrib.get("expr")
            env[name] = UNKNOWN if expr is None else _evaluate(expr, env)
        elif tag == "send":
            attrs = element.attrib
            target: Abstract | None = attrs.get("target")
            if "targetexpr" in attrs:
                target = _evaluate(attrs["targetexpr"], env)
                read |= _names(attrs["targetexpr"])
            kind: Abstract | None = attrs.get("type")
            if "typeexpr" in attrs:
                kind = _evaluate(attrs["typeexpr"], env)
                read |= _names(attrs["typeexpr"])
            if target not in (None, _INTERNAL, OWN_ADDRESS):
                return f"a send to {target!r}"
            if kind is not None and kind is not OWN_TYPE and kind not in _OWN_TYPES:
                return f"a send of type {kind!r}"
    foreach = {
        e.attrib.get(k) for e in elements if _local(e) == "foreach" for k in ("item", "index")
    }
    for name in sorted(read):
        if "script" in tags or name in foreach:
            return f"a computed target reads {name!r}, which a script or a foreach may write"
        if _written_after_last_read(elements, name):
            return f"a computed target reads {name!r}, written again after the send"
    return None


def _names(expr: str) -> set[str]:
    return {part.strip() for part in expr.split("+") if _NAME.match(part.strip())}


def _written_after_last_read(elements: list[ET.Element], name: str) -> bool:
    """Whether ``name`` is assigned after (in document order) the last send whose
    computed target or type reads it."""
    last_read = max(
        (
            i
            for i, e in enumerate(elements)
            if _local(e) == "send"
            and any(
                name in _names(e.attrib[k]) for k in ("targetexpr", "typeexpr") if k in e.attrib
            )
        ),
        default=-1,
    )
    return any(
        _local(e) == "assign" and e.attrib.get("location") == name
        for e in elements[last_read + 1 :]
    )


@dataclass(frozen=True, slots=True)
class Selected:
    """One selected chart: its W3C test name (``test190``) and its file."""

    name: str
    path: Path


def self_send_charts(corpus: Path = CORPUS) -> list[Selected]:
    """Every vendored W3C chart with at least one ``<send>``, all of whose sends go to
    the chart itself (see :func:`_why_not`), sorted by test name."""
    return [chart for chart, why in _verdicts(corpus) if why is None]


def excluded_charts(corpus: Path = CORPUS) -> dict[str, str]:
    """Every vendored chart the selection leaves out, with why."""
    return {chart.name: why for chart, why in _verdicts(corpus) if why is not None}


def _verdicts(corpus: Path) -> Iterator[tuple[Selected, str | None]]:
    paths = sorted(corpus.rglob("*.scxml"), key=lambda p: p.stem)
    for path in paths:
        if not path.with_suffix(".json").exists():
            continue  # a sub-document some test invokes, not a test
        text = path.read_text(encoding="utf-8")
        yield Selected(path.stem, path), _why_not(ET.fromstring(text), text)


# Running one as a durable execution.


def final_ids(machine: Machine) -> frozenset[str]:
    """The ids of the chart's top-level ``<final>`` states."""
    root = machine.states[0]
    return frozenset(
        state.id
        for state in (machine.states[i] for i in root.children)
        if state.kind == "final" and state.id is not None
    )


@dataclass(frozen=True, slots=True)
class DurableEnd:
    """Where a durable run stopped.

    Attributes:
        status: the stored status.
        configuration: the active leaf states, or for a completed execution the
            top-level final it entered (entering one ends the chart, so it entered one
            exactly), as a live session's ``configuration`` reads.
        passes: how many timer passes it took.
    """

    status: Status
    configuration: tuple[str, ...]
    passes: int


async def run_durable(
    router: Router, clock: Clock, machine: Machine, execution_id: str
) -> DurableEnd:
    """Create ``execution_id`` on ``machine`` and fire its timers until it ends, no
    timer is pending, or :data:`MAX_PASSES` passes have run; answer where it stopped,
    read back from the storage.

    The create runs in a router transaction as a delivery in ``SCOPE`` at the clock's
    time (as the timer worker's fire is one): the chart's initial sends go through the
    router's send handler and are timed from the clock.
    The router's doors would step an event into the new execution after the create,
    and W3C charts end in ``fail`` on any event they do not expect.

    Each pass fires what is due at the clock, then moves the clock to the next due
    time.
    """
    async with router.transaction() as unit:
        executions = unit.executions(Delivering(SCOPE, clock.now))
        await executions.create(execution_id, machine, options=unit.start_options)
    worker = TimerWorker(router, clock=clock)
    storage = router.storage
    passes = 0
    while passes < MAX_PASSES:
        passes += 1
        await worker.fire_due(clock.now)
        record = await storage.fetch_execution(execution_id)
        upcoming = await worker.next_due()
        if record.status.terminal or upcoming is None:
            break
        clock.now = max(clock.now, upcoming)
    record = await storage.fetch_execution(execution_id)
    state = storage.load(record, await storage.machine(record.content_hash))
    if record.status is Status.COMPLETED:
        entered = {machine.states[i].id for i in state.entered}
        configuration = tuple(sorted(final_ids(machine) & entered))
    else:
        configuration = tuple(sorted(state.leaf_configuration()))
    return DurableEnd(record.status, configuration, passes)
