"""Reading a TOML configuration: a file read up to a bound, and :class:`Table`, one
table of it with typed getters that name the file, the table and the key in every
refusal (:class:`~statifier.service.settings.ServiceConfigError`) and refuse any key no
getter asked for.

>>> table = Table("s.toml", {}, "http", {"port": 80, "hots": "x"})
>>> table.integer("port", 8080, minimum=0, maximum=65535)
80
>>> table.done()
Traceback (most recent call last):
...
statifier.service.settings.ServiceConfigError: s.toml: [http] hots: unknown key
"""

from __future__ import annotations

import json
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from statifier.service.settings import ServiceConfigError

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_NAMED",
    "MISSING",
    "Table",
    "leaf",
    "one_line",
    "read_bounded",
    "shown",
]

MAX_CONFIG_BYTES: Final = 1 << 20
"""The largest configuration (or bindings) file read; a larger one is refused."""
MAX_NAMED: Final = 1000
"""The most routes, sinks, fronts or sources of one configuration."""
MISSING: Final = object()
"""The default of a required key: its absence is refused."""

_SHOWN_LIMIT: Final = 40
_LARGE: Final = 10**_SHOWN_LIMIT
_NEVER: Final = float("inf")


def one_line(error: BaseException) -> str:
    """``error``'s message on one line (its type's name when it has none)."""
    return " ".join(str(error).split()) or type(error).__name__


def toml_document(data: bytes) -> dict[str, Any]:
    """``data`` parsed as a TOML document.

    Raises:
        ValueError: it is not one, said in one line starting ``not valid TOML:``: not
            UTF-8, not TOML, arrays or inline tables nested deeper than the parser
            goes, or an integer of more digits than the interpreter reads.
    """
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"not valid TOML: {one_line(error)}") from None
    except RecursionError:  # nested deeper than the parser's recursion goes
        raise ValueError("not valid TOML: nested too deeply") from None
    except ValueError as error:  # tomllib's int(): past the interpreter's limit of digits
        digits = sys.get_int_max_str_digits()
        said = f"an integer has more than {digits} digits" if digits else one_line(error)
        raise ValueError(f"not valid TOML: {said}") from None


def shown(value: object) -> str:
    """A value as the file spells it, short: strings quoted, tables, lists and integers
    of more than 40 digits named."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= _SHOWN_LIMIT else text[: _SHOWN_LIMIT - 2] + '…"'
    if isinstance(value, int) and abs(value) >= _LARGE:
        return "a very large integer"  # never converted: past 4300 digits str() raises
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"


def read_bounded(path: Path, file: str, key: str) -> bytes:
    """The bytes of ``path``, at most :data:`MAX_CONFIG_BYTES` of them.

    Raises:
        ServiceConfigError: ``path`` cannot be read or is larger, named as ``key`` of
            ``file`` (the file being loaded, which may be ``path`` itself).
    """
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise ServiceConfigError(file, "", key, f"cannot read {path}: {error.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ServiceConfigError(file, "", key, f"{path} is larger than {MAX_CONFIG_BYTES} bytes")
    return data


class Table:
    """One table of the file being read: typed getters that name the table and key in
    every refusal, and :meth:`done`, which refuses any key no getter asked for.

    Args:
        file: the file as it was named, for refusals.
        environ: where :meth:`secret` reads the variables ``*_env`` keys name.
        name: the dotted table (``fronts.webhook.carrier``), ``""`` at the top level.
        raw: the table as TOML read it.
    """

    def __init__(
        self, file: str, environ: Mapping[str, str], name: str, raw: Mapping[str, Any]
    ) -> None:
        self.file = file
        self.environ = environ
        self.name = name
        self.raw = raw
        self.seen: set[str] = set()

    def refuse(self, key: str, message: str) -> ServiceConfigError:
        """The refusal of ``key`` of this table (``""``: the table as a whole)."""
        return ServiceConfigError(self.file, self.name, key, message)

    def has(self, key: str) -> bool:
        return key in self.raw

    def value(self, key: str, default: object) -> object:
        self.seen.add(key)
        if key in self.raw:
            return self.raw[key]
        if default is MISSING:
            raise self.refuse(key, "required")
        return default

    def text(self, key: str, default: object = MISSING) -> str:
        value = self.value(key, default)
        if not isinstance(value, str) or not value:
            raise self.refuse(key, f"must be a non-empty string, not {shown(value)}")
        return value

    def optional_text(self, key: str) -> str | None:
        self.seen.add(key)
        return self.text(key) if key in self.raw else None

    def integer(
        self, key: str, default: int, *, minimum: int = 1, maximum: int | None = None
    ) -> int:
        value = self.value(key, default)
        if type(value) is not int or value < minimum or (maximum is not None and value > maximum):
            if minimum == 1 and maximum is None:
                wanted = "a positive integer"
            elif maximum is None:
                wanted = f"an integer of at least {minimum}"
            else:
                wanted = f"an integer from {minimum} to {maximum}"
            raise self.refuse(key, f"must be {wanted}, not {shown(value)}")
        return value

    def optional_integer(self, key: str, *, maximum: int) -> int | None:
        self.seen.add(key)
        return self.integer(key, 1, maximum=maximum) if key in self.raw else None

    def seconds(self, key: str, default: float) -> float:
        value = self.value(key, default)
        if not isinstance(value, bool) and isinstance(value, int | float) and 0 < value < _NEVER:
            try:
                return float(value)
            except OverflowError:  # an integer past the largest float: refused below
                pass
        raise self.refuse(key, f"must be a positive number of seconds, not {shown(value)}")

    def optional_seconds(self, key: str) -> float | None:
        self.seen.add(key)
        return self.seconds(key, 0.0) if key in self.raw else None

    def boolean(self, key: str, default: bool) -> bool:
        value = self.value(key, default)
        if not isinstance(value, bool):
            raise self.refuse(key, f"must be true or false, not {shown(value)}")
        return value

    def table(self, key: str) -> Table:
        """The sub-table ``key`` (an empty one when absent)."""
        value = self.value(key, {})
        if not isinstance(value, dict):
            raise self.refuse(key, f"must be a table, not {shown(value)}")
        return Table(self.file, self.environ, f"{self.name}.{key}" if self.name else key, value)

    def named(self, key: str) -> list[Table]:
        """The sub-tables of table ``key``, one per name (``[routes.NAME]``)."""
        outer = self.table(key)
        if len(outer.raw) > MAX_NAMED:
            raise self.refuse(key, f"at most {MAX_NAMED} entries")
        return [outer.table(name) for name in outer.raw]

    def secret(self, key: str) -> str:
        """The value of the environment variable that ``key`` (a ``*_env`` key) names."""
        variable = self.text(key)
        value = self.environ.get(variable)
        if not value:
            raise self.refuse(key, f"the environment variable {variable} is not set (or empty)")
        return value

    def done(self) -> None:
        """Refuse the first key of the table no getter asked for."""
        for key in self.raw:
            if key not in self.seen:
                raise self.refuse(key, "unknown key")


def leaf(table: Table) -> str:
    """The last part of the table's name: the NAME of ``[routes.NAME]``."""
    return table.name.rpartition(".")[2]
