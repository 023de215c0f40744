"""The "try a revision" form read: the uploaded chart compiled under the limits every
chart is read with, and the filter turned into a :class:`statifier.shadow.Selection`.

>>> from statifier.console.upload import FileField
>>> chart = FileField("order.scxml", b'<scxml xmlns="http://www.w3.org/2005/07/scxml"/>')
>>> compile_upload(chart, document="").identity.name
'order'
>>> chosen = read_selection({"status": "active", "sample": "10"})
>>> chosen.status, chosen.sample, chosen.document
(<Status.ACTIVE: 'active'>, 10, None)
>>> read_selection({"sample": "ten"})
Traceback (most recent call last):
...
ValueError: sample: a number of executions, not 'ten'
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import PurePosixPath, PureWindowsPath
from typing import Final

from statifier.chart import InvalidChart, Machine, ReadLimits, compile_chart
from statifier.console.upload import FileField
from statifier.expr import Function
from statifier.persistence import Status
from statifier.shadow import Selection

__all__ = ["FILTER_FIELDS", "ChartRefused", "ChartTooLarge", "compile_upload", "read_selection"]

FILTER_FIELDS: Final = (
    "document",
    "scope",
    "status",
    "created_after",
    "created_before",
    "sample",
)
"""The filter's fields, as the form names them."""

_MAX_NUMBER: Final = 9


class ChartRefused(ValueError):  # noqa: N818 - names the refusal
    """The uploaded chart is missing or is not a valid chart (the message says why)."""


class ChartTooLarge(ChartRefused):
    """The uploaded chart is over the size limit every chart is read with."""


def compile_upload(
    upload: FileField | None,
    *,
    document: str,
    functions: Mapping[str, Function] | None = None,
    limits: ReadLimits | None = None,
) -> Machine:
    """The uploaded chart compiled under ``limits`` (the charts' defaults, as
    :func:`statifier.shadow.read_revision` reads a file) with the host's ``functions``,
    named ``document`` or, when that is empty, after the file's name (its stem).

    Raises:
        ChartTooLarge: over ``limits.max_bytes``.
        ChartRefused: no file, an empty one, or not a valid chart (the message names
            the file and the first problem).
    """
    limits = limits or ReadLimits()
    if upload is None or not upload.content:
        raise ChartRefused("choose a chart file (SCXML) to try")
    shown = _basename(upload.filename) or "the chart"
    if len(upload.content) > limits.max_bytes:
        raise ChartTooLarge(
            f"{shown}: {len(upload.content)} bytes, over the {limits.max_bytes} a chart may have"
        )
    name = document or PurePosixPath(_basename(upload.filename)).stem or None
    try:
        return compile_chart(upload.content, name=name, limits=limits, functions=functions)
    except InvalidChart as invalid:
        raise ChartRefused(f"{shown}:{invalid.problems[0]}") from None


def read_selection(fields: Mapping[str, str]) -> Selection:
    """The filter's fields (:data:`FILTER_FIELDS`; empty or absent: not filtered) as a
    selection. Times are ISO 8601, UTC when they name no offset.

    Raises:
        ValueError: a status, time or count that is not one (the message names the
            field).
    """
    text = {name: fields.get(name, "").strip() for name in FILTER_FIELDS}
    status = None
    if text["status"]:
        try:
            status = Status(text["status"])
        except ValueError:
            raise ValueError(f"status: not a status: {text['status'][:40]!r}") from None
    return Selection(
        document=text["document"] or None,
        status=status,
        scope=text["scope"] or None,
        created_after=_time(text["created_after"], "created after"),
        created_before=_time(text["created_before"], "created before"),
        sample=_count(text["sample"], "sample"),
    )


def _basename(filename: str) -> str:
    """The file's own name: a browser may send a path, of either kind."""
    return PureWindowsPath(PurePosixPath(filename).name).name[:120]


def _time(value: str, name: str) -> datetime | None:
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{name}: not an ISO 8601 time: {value[:40]!r}") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _count(value: str, name: str) -> int | None:
    if not value:
        return None
    if not value.isdigit() or len(value) > _MAX_NUMBER:
        raise ValueError(f"{name}: a number of executions, not {value[:40]!r}")
    return int(value)
