"""Input logs exported to a JSON file: what recorded executions were given, with the
chart each ran and where it ended, so that a later revision of the chart can be
replayed on them away from the database (``statifier.testing.assert_replays_same``,
``statifier executions export``).

The file is one JSON object:

``format``
    ``"statifier.input-logs"``; ``version``: ``1``.
``charts``
    content hash -> ``{"name", "source"}``: each chart an exported execution ran, its
    SCXML source as it was stored.
``executions``
    oldest first, each ``{"id", "chart", "content_hash", "status", "configuration",
    "final_state", "outcome", "options", "inputs"}``: ``chart`` the name it was created
    under (``null`` when unknown), ``configuration`` its sorted active leaf states,
    ``final_state`` the top-level ``<final>`` it ended in, ``outcome`` its donedata
    in the tagged JSON encoding (:mod:`statifier.expr.tagged`; ``null`` when it left
    none), ``options`` the start options its position keeps (``round_budget``,
    ``send_types``, ``invoke_types``), and ``inputs`` its input log, each entry
    ``{"seq", "via", "recorded_at", "entry"}``, ``entry`` the stored entry (an event
    as ``statifier.core.positions.dump_event`` writes it, a migration's record, or
    ``null`` for the marker that closed a log at its cap).

Reading a file is bounded: at most ``max_bytes`` (:data:`MAX_EXPORT_BYTES` by
default), JSON nested at most :data:`~statifier.expr.jsontext.MAX_JSON_DEPTH` deep;
anything else is an :class:`ExportError` naming the file and what is wrong.

>>> import asyncio, json, tempfile
>>> from pathlib import Path
>>> from statifier.durable import Durable
>>> folder = Path(tempfile.mkdtemp())
>>> door = (
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">'
...     '<state id="open"><transition event="close" target="closed"/></state>'
...     '<final id="closed"/></scxml>'
... )
>>> async def record():
...     url = f"sqlite:///{folder / 'app.db'}"
...     async with Durable(url, charts={"door": door}, migrate=True) as durable:
...         await durable.create("door", "door_1")
...         await durable.send("door_1", "close")
...         return await export_input_logs(durable, folder / "logs.json", chart="door")
>>> asyncio.run(record())
1
>>> [(e.id, e.status.value, e.final_state, [i.event.name for i in e.inputs])
...  for e in read_input_logs(folder / "logs.json")]
[('door_1', 'completed', 'closed', ['close'])]
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from statifier.core import MachineState, StartOptions
from statifier.core import positions as stored
from statifier.expr import UNDEFINED, Value, parse_datetime, tagged
from statifier.expr.jsontext import JSONTextError, loads
from statifier.persistence import LoggedInput, PersistenceError, Status
from statifier.persistence.executions import logged_input

if TYPE_CHECKING:
    from statifier.durable.front import Durable

__all__ = [
    "FORMAT",
    "MAX_EXPORT_BYTES",
    "VERSION",
    "ExportError",
    "ExportedExecution",
    "export_input_logs",
    "input_logs_json",
    "read_input_logs",
    "write_input_logs",
]

FORMAT: Final = "statifier.input-logs"
VERSION: Final = 1
MAX_EXPORT_BYTES: Final = 64 << 20
"""The largest file :func:`read_input_logs` reads by default (64 MiB)."""


class ExportError(ValueError):
    """An export refused: a file that cannot be read (too big, not JSON, nested too
    deep, or not the format; the message names the file and the first thing wrong), or
    an execution that cannot be written to one (its position was pruned, its chart
    retired or sealed under a key the codec lacks; the message names it)."""


@dataclass(frozen=True, slots=True)
class ExportedExecution:
    """One execution as a file holds it.

    Attributes:
        id, chart, content_hash, status, configuration, final_state, outcome: as
            :class:`~statifier.durable.Description` had them when exported
            (``outcome`` is ``UNDEFINED`` when it left none).
        source: the SCXML source of the chart it ran.
        options: the start options its position kept (send and invoke types, round
            budget): a replay starts with them.
        inputs: its input log, in order.
    """

    id: str
    chart: str | None
    content_hash: str
    status: Status
    configuration: tuple[str, ...]
    final_state: str | None
    outcome: Value
    source: str
    options: StartOptions
    inputs: tuple[LoggedInput, ...]

    def ended(self) -> str:
        """Where it was, in words: ``completed in closed``, ``active in open``."""
        where = self.final_state or " ".join(self.configuration)
        return f"{self.status.value} in {where}" if where else self.status.value


async def input_logs_json(
    durable: Durable,
    *,
    chart: str | None = None,
    status: Status | str | None = None,
    execution_ids: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The executions of ``durable`` (optionally only those of the chart named
    ``chart``, in ``status``, or with the ids given), as the JSON object of the module
    docstring, oldest first.

    Raises:
        ExecutionNotFound: an id given names no execution.
        ValueError: an unknown status.
        ExportError: an execution's chart or position cannot be read (retired,
            pruned, sealed under a key the durable's codec lacks).
    """
    if execution_ids is None:
        ids = [row.id for row in await durable.list(status, chart=chart)]
    else:
        ids = list(execution_ids)
    storage = durable.executions.storage
    charts: dict[str, dict[str, Any]] = {}
    executions = []
    for execution_id in ids:
        described = await durable.describe(execution_id)
        record = await storage.fetch_execution(execution_id)
        try:
            state = storage.load(record, await storage.machine(record.content_hash))
            stored_chart = await storage.fetch_chart(record.content_hash)
        except (PersistenceError, stored.PositionError) as error:
            raise ExportError(f"{execution_id}: cannot be exported: {error}") from None
        if record.content_hash not in charts and stored_chart.source is not None:
            charts[record.content_hash] = {
                "name": described.chart or stored_chart.name,
                "source": stored_chart.source.decode("utf-8"),
            }
        executions.append(
            {
                "id": described.id,
                "chart": described.chart,
                "content_hash": described.content_hash,
                "status": described.status.value,
                "configuration": list(described.configuration),
                "final_state": described.final_state,
                "outcome": None
                if described.outcome is UNDEFINED
                else tagged.encode(described.outcome),
                "options": _options_json(state),
                "inputs": [_input_json(entry) for entry in described.inputs],
            }
        )
    return {"format": FORMAT, "version": VERSION, "charts": charts, "executions": executions}


async def export_input_logs(
    durable: Durable,
    path: str | os.PathLike[str],
    *,
    chart: str | None = None,
    status: Status | str | None = None,
    execution_ids: Sequence[str] | None = None,
) -> int:
    """Write :func:`input_logs_json` of the executions selected to the file ``path``
    (replacing it) and return how many it holds.

    Raises:
        OSError: the file cannot be written.
        the errors of :func:`input_logs_json`.
    """
    document = await input_logs_json(
        durable, chart=chart, status=status, execution_ids=execution_ids
    )
    return await write_input_logs(document, path)


async def write_input_logs(document: Mapping[str, Any], path: str | os.PathLike[str]) -> int:
    """Write ``document`` (what :func:`input_logs_json` made, or several of its
    documents joined: their charts and their executions) to the file ``path``
    (replacing it) and return how many executions it holds.

    Raises:
        OSError: the file cannot be written.
    """
    text = json.dumps(document, ensure_ascii=False, indent=1, sort_keys=True)
    await asyncio.to_thread(Path(path).write_text, text + "\n", encoding="utf-8")
    return len(document["executions"])


def read_input_logs(
    path: str | os.PathLike[str], *, max_bytes: int = MAX_EXPORT_BYTES
) -> tuple[ExportedExecution, ...]:
    """The executions of the file ``path`` that :func:`export_input_logs` wrote.

    Raises:
        ExportError: the file cannot be read, is over ``max_bytes``, is not JSON (or
            nested deeper than the JSON rule allows), or is not this format.
    """
    file = Path(path)
    try:
        with file.open("rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as error:
        raise ExportError(f"{file}: cannot read: {error.strerror}") from None
    if len(data) > max_bytes:
        raise ExportError(f"{file}: larger than {max_bytes} bytes")
    try:
        document = loads(data, max_bytes=max_bytes)
    except JSONTextError as error:
        raise ExportError(f"{file}: not JSON ({error.rule}): {error}") from None
    try:
        return _executions(document)
    except (KeyError, TypeError, ValueError, stored.PositionError) as error:
        raise ExportError(f"{file}: not an export of input logs: {_said(error)}") from None


def _options_json(state: MachineState) -> dict[str, Any]:
    invoke = state.invoke_types
    return {
        "round_budget": state.round_budget,
        "send_types": sorted(state.send_types),
        "invoke_types": None if invoke is None else sorted(invoke),
    }


def _input_json(entry: LoggedInput) -> dict[str, Any]:
    if entry.migration is not None:
        body: Any = json.loads(entry.migration.dump())
    elif entry.event is not None:
        body = json.loads(stored.dump_event(entry.event))
    else:
        body = None
    return {
        "seq": entry.seq,
        "via": entry.via,
        "recorded_at": entry.recorded_at.isoformat(),
        "entry": body,
    }


def _executions(document: Value) -> tuple[ExportedExecution, ...]:
    top = _mapping(document, "the file")
    if top.get("format") != FORMAT or top.get("version") != VERSION:
        raise ValueError(f"format and version are not {FORMAT!r} and {VERSION}")
    charts = _mapping(top["charts"], "charts")
    rows = top["executions"]
    if not isinstance(rows, list):
        raise TypeError("executions is not a list")
    return tuple(_execution(row, charts, index) for index, row in enumerate(rows))


def _execution(raw: Value, charts: Mapping[str, Value], index: int) -> ExportedExecution:
    row = _mapping(raw, f"executions[{index}]")
    content_hash = _string(row["content_hash"], "content_hash")
    chart = _mapping(charts[content_hash], f"charts[{content_hash!r}]")
    options = _mapping(row["options"], "options")
    inputs = row["inputs"]
    configuration = row["configuration"]
    if not isinstance(inputs, list) or not isinstance(configuration, list):
        raise TypeError(f"executions[{index}]: inputs and configuration are lists")
    outcome = row["outcome"]
    return ExportedExecution(
        id=_string(row["id"], "id"),
        chart=None if row["chart"] is None else _string(row["chart"], "chart"),
        content_hash=content_hash,
        status=Status(row["status"]),
        configuration=tuple(_string(state, "configuration") for state in configuration),
        final_state=None if row["final_state"] is None else _string(row["final_state"], "final"),
        outcome=UNDEFINED if outcome is None else tagged.decode(outcome),
        source=_string(chart["source"], "source"),
        options=_start_options(options),
        inputs=tuple(_logged(entry) for entry in inputs),
    )


def _start_options(raw: Mapping[str, Value]) -> StartOptions:
    budget = raw["round_budget"]
    invoke = raw["invoke_types"]
    send = raw["send_types"]
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool)):
        raise TypeError(f"round_budget is a count, not {budget!r}")
    if not isinstance(send, list) or not (invoke is None or isinstance(invoke, list)):
        raise TypeError("send_types and invoke_types are lists")
    return StartOptions(
        round_budget=budget,
        send_types=frozenset(_string(kind, "send_types") for kind in send),
        invoke_types=None
        if invoke is None
        else frozenset(_string(kind, "invoke_types") for kind in invoke),
    )


def _logged(raw: Value) -> LoggedInput:
    entry = _mapping(raw, "an input")
    seq = entry["seq"]
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise TypeError(f"seq is a number, not {seq!r}")
    body = entry["entry"]
    blob = None if body is None else json.dumps(body).encode()
    at = parse_datetime(_string(entry["recorded_at"], "recorded_at"))
    if not isinstance(at, datetime):
        raise ValueError(f"recorded_at is a datetime with an offset, not {at!r}")
    return logged_input(seq, _string(entry["via"], "via"), blob, at)


def _mapping(value: Value, what: str) -> Mapping[str, Value]:
    if not isinstance(value, dict):
        raise TypeError(f"{what} is not an object")
    return value


def _string(value: Value, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} is not a string: {value!r}")
    return value


def _said(error: Exception) -> str:
    if isinstance(error, KeyError):
        return f"the key {error.args[0]!r} is missing"
    return str(error)
