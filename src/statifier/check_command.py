"""``statifier check CONFIG [--charts DIR] [--json]``: the router's publish-time
contracts (:func:`statifier.router.contracts.check`) over one chart, from the shell.

``CONFIG`` is a TOML file (or JSON, by its ``.json`` suffix; at most 1 MiB) naming
what the router would run with:

``document`` (required)
    The document being published; its chart is ``DIR/DOCUMENT.scxml``.
``charts``
    ``DIR``, relative to the file (``--charts`` wins over it). Every ``*.scxml`` there
    is compiled, named by its stem (at most 1,000): the published charts that judge a
    document the declarations leave out.
``bindings``
    A bindings file as :func:`~statifier.router.load_bindings` reads it (relative to
    the file), or the bindings themselves (``[[bindings]]`` tables, a JSON list).
``send_type``, ``send_types``
    The router's send type, and the other send types the host handles.
``routes``
    The names of the registered routes.
``timer_queue``
    Whether delayed sends have a timer queue (default ``true``).
``declarations``
    A table: document -> the list of event names it declares it accepts (in JSON,
    ``null`` declares nothing, as leaving the document out does).

For example::

    document = "depot"
    charts = "charts"
    send_type = "myapp:router"
    routes = ["doorstep_photos"]
    timer_queue = false

    [declarations]
    parcel = ["parcel.scanned", "parcel.delivered"]

It prints one line per finding, ``FILE:LINE:COL: reason: event (document)`` (a
binding's finding names the bindings' file and no line), in document order, or
``FILE: ok``; with ``--json``, one document ``{"contracts": {...}}`` with the five
lists. Exit status: 0 clean, 1 when anything is reported, 2 when the input cannot be
used: one line ``statifier check: FILE: message`` naming the key.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TextIO

if TYPE_CHECKING:
    from statifier.chart import Machine
    from statifier.persistence import Refused
    from statifier.router import Binding, RouterConfig
    from statifier.router.contracts import Contracts

__all__ = ["MAX_CHARTS", "MAX_INPUT_BYTES", "CheckInputError", "add_parser", "run"]

MAX_INPUT_BYTES: Final = 1 << 20
"""The largest configuration or bindings file read."""
MAX_CHARTS: Final = 1000
"""The most charts read from one directory."""
MAX_ENTRIES: Final = 10_000
"""The most routes, send types, declared documents, or names in one declaration."""

_KEYS: Final = frozenset(
    {
        "document",
        "charts",
        "bindings",
        "send_type",
        "send_types",
        "routes",
        "timer_queue",
        "declarations",
    }
)


class CheckInputError(ValueError):
    """Input ``statifier check`` cannot use; ``str()`` is ``FILE: message``."""


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Add ``check`` to ``commands`` (what ``ArgumentParser.add_subparsers``
    returned) and return its parser."""
    parser = commands.add_parser(
        "check", help="check a chart against the router's publish-time contracts"
    )
    parser.add_argument("config", metavar="CONFIG", help="a TOML (or .json) file; see the docs")
    parser.add_argument("--charts", default=None, metavar="DIR", help="DIR/NAME.scxml charts")
    parser.add_argument("--json", action="store_true", help='print {"contracts": {...}}')
    return parser  # type: ignore[no-any-return]


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``statifier check``; returns the exit status."""
    from statifier.router.contracts import check

    try:
        loaded = _Input.load(Path(args.config), args.charts)
        report = check(
            loaded.config, loaded.document, loaded.chart, loaded.declarations, loaded.charts
        )
    except CheckInputError as error:
        sys.stderr.write(f"statifier check: {_one_line(error)}\n")
        return 2
    if args.json:
        out.write(json.dumps({"contracts": report.as_json()}, ensure_ascii=False) + "\n")
    else:
        _print(report, loaded, out)
    return 0 if report.clean else 1


def _print(report: Contracts, loaded: _Input, out: TextIO) -> None:
    if report.clean:
        out.write(f"{loaded.chart_file}: ok\n")
        return
    for finding in report.findings():
        file = loaded.bindings_file if finding.binding_id is not None else loaded.chart_file
        out.write(finding.format(str(file)) + "\n")


@dataclass(frozen=True, slots=True)
class _Input:
    """What a configuration file names, read and checked."""

    config: RouterConfig
    document: str
    chart: Machine
    chart_file: Path
    declarations: dict[str, list[str] | None]
    charts: dict[str, Machine]
    bindings_file: Path

    @classmethod
    def load(cls, path: Path, charts_option: str | None) -> _Input:
        # Imported here: the router needs the sql extra, the other commands do not.
        from statifier.core import StartOptions
        from statifier.persistence.sql import SqlAdapter
        from statifier.router import RouterConfig, RouterError, StaticResolver
        from statifier.router.routes import RouteEntry

        raw = _table(path)
        name = path.name
        unknown = sorted(set(raw) - _KEYS)
        if unknown:
            raise CheckInputError(f"{name}: unknown key {unknown[0]!r}")
        document = _text(raw, "document", name, required=True)
        assert document is not None
        directory = charts_option if charts_option is not None else raw.get("charts")
        if not isinstance(directory, str) or not directory:
            raise CheckInputError(f"{name}: key 'charts': give the chart directory (or --charts)")
        folder = Path(directory) if charts_option is not None else path.parent / directory
        charts = _charts(folder, name)
        chart_file = folder / f"{document}.scxml"
        if document not in charts:
            raise CheckInputError(f"{name}: key 'document': no chart {chart_file}")
        bindings, bindings_file = _bindings(raw.get("bindings", []), path)
        send_type = _text(raw, "send_type", name)
        send_types = frozenset(_names(raw, "send_types", name))
        routes = _names(raw, "routes", name)
        timer_queue = raw.get("timer_queue", True)
        if not isinstance(timer_queue, bool):
            raise CheckInputError(f"{name}: key 'timer_queue': must be true or false")
        declarations = _declarations(raw.get("declarations", {}), name)

        named: dict[str | tuple[str, str], Machine] = dict(charts.items())
        try:
            config = RouterConfig(
                SqlAdapter("sqlite://"),
                bindings=bindings,
                resolver=StaticResolver(named),
                send_type=send_type,
                start_options=StartOptions(send_types=send_types),
                routes={route: RouteEntry(_Unrouted()) for route in routes},
                timer_queue="built-in" if timer_queue else None,
            )
        except (RouterError, ValueError, TypeError) as error:
            raise CheckInputError(f"{name}: {_one_line(error)}") from None
        return cls(
            config, document, charts[document], chart_file, declarations, charts, bindings_file
        )


class _Unrouted:
    """The adapter of every route named: never handed anything (the check is pure)."""

    def deliver(self, *_: object) -> Refused:
        from statifier.persistence import Refused

        return Refused("statifier check delivers nothing")


def _read(path: Path, shown: str) -> bytes:
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_INPUT_BYTES + 1)
    except OSError as error:
        raise CheckInputError(f"{shown}: cannot read: {error.strerror}") from None
    if len(data) > MAX_INPUT_BYTES:
        raise CheckInputError(f"{shown}: larger than {MAX_INPUT_BYTES} bytes")
    return data


def _parse(path: Path, data: bytes, *, toml: bool) -> Any:
    kind = "TOML" if toml else "JSON"
    try:
        text = data.decode("utf-8")
        return tomllib.loads(text) if toml else json.loads(text)
    except (ValueError, UnicodeDecodeError) as error:  # JSON and TOML errors are ValueErrors
        raise CheckInputError(f"{path}: not valid {kind}: {_one_line(error)}") from None


def _table(path: Path) -> dict[str, Any]:
    raw = _parse(path, _read(path, str(path)), toml=path.suffix != ".json")
    if not isinstance(raw, dict):
        raise CheckInputError(f"{path}: the configuration is a table (a JSON object)")
    return raw


def _text(raw: Mapping[str, Any], key: str, name: str, *, required: bool = False) -> str | None:
    if key not in raw:
        if required:
            raise CheckInputError(f"{name}: key {key!r} is required")
        return None
    value = raw[key]
    if not isinstance(value, str) or not value:
        raise CheckInputError(f"{name}: key {key!r}: must be a non-empty string")
    return value


def _names(raw: Mapping[str, Any], key: str, name: str) -> list[str]:
    value = raw.get(key, [])
    if (
        not isinstance(value, list)
        or len(value) > MAX_ENTRIES
        or not all(isinstance(item, str) and item for item in value)
    ):
        raise CheckInputError(
            f"{name}: key {key!r}: must be a list of at most {MAX_ENTRIES} non-empty strings"
        )
    return value


def _declarations(value: object, name: str) -> dict[str, list[str] | None]:
    if not isinstance(value, dict) or len(value) > MAX_ENTRIES:
        raise CheckInputError(
            f"{name}: key 'declarations': must be a table of at most {MAX_ENTRIES} documents"
        )
    declared: dict[str, list[str] | None] = {}
    for document, events in value.items():
        if events is None:
            declared[document] = None
            continue
        declared[document] = _names(value, document, f"{name}: key 'declarations'")
    return declared


def _bindings(value: object, path: Path) -> tuple[list[Binding], Path]:
    from statifier.router import RouterError, load_bindings

    if isinstance(value, str) and value:
        file = path.parent / value
        shown = file
        data = _read(file, str(file))  # bounded before load_bindings reads it again
        entries = _parse(file, data, toml=file.suffix == ".toml")  # as load_bindings reads it
        if isinstance(entries, dict):
            entries = entries.get("bindings", [])
    elif isinstance(value, list):
        shown, entries = path, value
    else:
        raise CheckInputError(f"{path.name}: key 'bindings': a file name or a list of tables")
    if not isinstance(entries, list):
        raise CheckInputError(f"{shown}: key 'bindings': must be a list of tables")
    try:
        return load_bindings(entries), shown
    except (RouterError, TypeError, ValueError) as error:
        raise CheckInputError(f"{shown}: key 'bindings': {_one_line(error)}") from None


def _charts(folder: Path, name: str) -> dict[str, Machine]:
    from statifier.chart import InvalidChart, ReadLimits, compile_chart

    if not folder.is_dir():
        raise CheckInputError(f"{name}: key 'charts': {folder} is not a directory")
    files = sorted(folder.glob("*.scxml"))
    if len(files) > MAX_CHARTS:
        raise CheckInputError(f"{folder}: more than {MAX_CHARTS} charts")
    limit = ReadLimits().max_bytes
    charts: dict[str, Machine] = {}
    for file in files:
        try:
            with file.open("rb") as handle:
                source = handle.read(limit + 1)  # compile_chart refuses what is over
        except OSError as error:
            raise CheckInputError(f"{file}: cannot read: {error.strerror}") from None
        try:
            charts[file.stem] = compile_chart(source, name=file.stem)
        except InvalidChart as invalid:
            raise CheckInputError(f"{file}:{invalid.problems[0]}") from None
    return charts


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
