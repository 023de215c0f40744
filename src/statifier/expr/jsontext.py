"""``JSON.parse`` and ``JSON.stringify`` for the language's values, and the one JSON
rule every front of the library reads untrusted text by.

Parsing is strict RFC 8259 over UTF-8, with the further rules of I-JSON (RFC 7493)
that keep a parsed value storable and writable again: nesting at most
:data:`MAX_JSON_DEPTH` deep, optionally at most ``max_bytes`` bytes, no number that
is not finite (``NaN``, ``Infinity``, or one out of a float's range, ``1e999999``),
and no lone surrogate, escaped (``"\\ud800"``) or raw (its UTF-8 encoding, or a
surrogate code point in a ``str``). A failure is a :class:`JSONTextError` whose
``rule`` names the rule broken and whose message says where, e.g. ``unexpected byte
0x6F at position 1`` or ``a lone surrogate U+D800 at position 7``.

Stringifying writes compact JSON with map keys sorted, so equal values give equal
text. Dates and datetimes become ISO 8601 strings and durations their canonical
string (``"2w3d"``); an undefined map entry is left out and an undefined elsewhere
is written as ``null``.
"""

from __future__ import annotations

import json
import math
from datetime import date, datetime
from typing import Final, Literal

from statifier.expr.values import Duration, Undefined, Value, format_datetime

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_JSON_NODES",
    "RULES",
    "JSONTextError",
    "Rule",
    "dumps",
    "loads",
]

MAX_JSON_DEPTH: Final = 128

Rule = Literal["syntax", "utf-8", "depth", "size", "non-finite", "surrogate"]
"""The rule a JSON text broke: ``syntax`` (not JSON), ``utf-8`` (bytes that are not
UTF-8), ``depth`` (nested deeper than :data:`MAX_JSON_DEPTH`), ``size`` (over the
bound given, or an integer of more digits than Python converts), ``non-finite`` (a
number that is not finite) and ``surrogate`` (a lone surrogate)."""
RULES: Final[tuple[Rule, ...]] = ("syntax", "utf-8", "depth", "size", "non-finite", "surrogate")


class JSONTextError(ValueError):
    """JSON text the rule refuses (or a value :func:`dumps` cannot write); the message
    says what and where.

    Attributes:
        rule: the rule broken (:data:`Rule`).
        position: the byte offset in the UTF-8 text where it was found, when there is
            one.
    """

    def __init__(self, message: str, rule: Rule = "syntax", position: int | None = None) -> None:
        super().__init__(message)
        self.rule: Rule = rule
        self.position = position


_WHITESPACE: Final = b" \t\n\r"
_ESCAPES: Final = {
    ord('"'): '"',
    ord("\\"): "\\",
    ord("/"): "/",
    ord("b"): "\b",
    ord("f"): "\f",
    ord("n"): "\n",
    ord("r"): "\r",
    ord("t"): "\t",
}
_NON_FINITE: Final = (b"NaN", b"Infinity", b"-Infinity")
"""Words some encoders write for numbers JSON has no text for."""
_NON_FINITE_START: Final = frozenset(word[0] for word in _NON_FINITE)


def loads(text: str | bytes, *, max_bytes: int | None = None) -> Value:
    """Parse JSON text: a ``str``, or ``bytes`` that must be UTF-8 (without a byte
    order mark).

    Args:
        text: the text.
        max_bytes: the most bytes its UTF-8 encoding may have (unbounded when
            ``None``).

    Raises:
        JSONTextError: text the rule refuses (see the module docstring); ``rule`` says
            which rule.

    >>> loads('{"b": [1, 2.5, null, true]}')
    {'b': [1, 2.5, None, True]}
    >>> loads("not json")
    Traceback (most recent call last):
    ...
    statifier.expr.jsontext.JSONTextError: unexpected byte 0x6F at position 1
    >>> loads(b'{"n": 1e999999}')
    Traceback (most recent call last):
    ...
    statifier.expr.jsontext.JSONTextError: a non-finite number (out of range) at position 6
    >>> loads('["\\\\ud800"]')
    Traceback (most recent call last):
    ...
    statifier.expr.jsontext.JSONTextError: a lone surrogate U+D800 at position 2
    """
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    if max_bytes is not None and len(data) > max_bytes:
        raise JSONTextError(f"{len(data)} bytes, over the {max_bytes}", "size")
    _check_utf8(data)
    parser = _Parser(data)
    parser.skip()
    value = parser.value(0)
    parser.skip()
    if parser.offset < len(data):
        raise parser.unexpected()
    return value


def _check_utf8(data: bytes) -> None:
    """Refuse bytes that are not UTF-8, naming a surrogate's encoding as such (the
    strict codec refuses both; a ``str`` holding a surrogate arrives here encoded)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        at = error.start
        lead, second, third = data[at : at + 3].ljust(3, b"\x00")
        if lead == 0xED and 0xA0 <= second <= 0xBF and 0x80 <= third <= 0xBF:
            code = 0xD000 | ((second & 0x3F) << 6) | (third & 0x3F)
            raise JSONTextError(
                f"a lone surrogate U+{code:04X} at position {at}", "surrogate", at
            ) from None
        raise JSONTextError(f"invalid UTF-8 at position {at}", "utf-8", at) from None


class _Parser:
    __slots__ = ("data", "offset")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.offset = 0

    def unexpected(self) -> JSONTextError:
        at = self.offset
        if at >= len(self.data):
            return JSONTextError(f"unexpected end of input at position {at}", "syntax", at)
        found = self.data[at]
        return JSONTextError(f"unexpected byte 0x{found:02X} at position {at}", "syntax", at)

    def skip(self) -> None:
        data, offset = self.data, self.offset
        while offset < len(data) and data[offset] in _WHITESPACE:
            offset += 1
        self.offset = offset

    def peek(self) -> int:
        return self.data[self.offset] if self.offset < len(self.data) else -1

    def value(self, depth: int) -> Value:
        byte = self.peek()
        if byte == ord("{"):
            return self.object(depth + 1)
        if byte == ord("["):
            return self.array(depth + 1)
        if byte == ord('"'):
            return self.string()
        if byte in _NON_FINITE_START:
            for word in _NON_FINITE:
                if self.data.startswith(word, self.offset):
                    raise JSONTextError(
                        f"a non-finite number ({word.decode()}) at position {self.offset}",
                        "non-finite",
                        self.offset,
                    )
        if byte == ord("-") or ord("0") <= byte <= ord("9"):
            return self.number()
        for word, result in ((b"true", True), (b"false", False), (b"null", None)):
            if byte == word[0]:
                for expected in word:
                    if self.peek() != expected:
                        raise self.unexpected()
                    self.offset += 1
                return result
        raise self.unexpected()

    def nest(self, depth: int) -> None:
        if depth > MAX_JSON_DEPTH:
            raise JSONTextError(
                f"nesting deeper than {MAX_JSON_DEPTH} at position {self.offset}",
                "depth",
                self.offset,
            )
        self.offset += 1
        self.skip()

    def object(self, depth: int) -> dict[str, Value]:
        self.nest(depth)
        result: dict[str, Value] = {}
        if self.peek() == ord("}"):
            self.offset += 1
            return result
        while True:
            if self.peek() != ord('"'):
                raise self.unexpected()
            key = self.string()
            self.skip()
            if self.peek() != ord(":"):
                raise self.unexpected()
            self.offset += 1
            self.skip()
            result[key] = self.value(depth)
            self.skip()
            if self.peek() == ord(","):
                self.offset += 1
                self.skip()
            elif self.peek() == ord("}"):
                self.offset += 1
                return result
            else:
                raise self.unexpected()

    def array(self, depth: int) -> list[Value]:
        self.nest(depth)
        result: list[Value] = []
        if self.peek() == ord("]"):
            self.offset += 1
            return result
        while True:
            result.append(self.value(depth))
            self.skip()
            if self.peek() == ord(","):
                self.offset += 1
                self.skip()
            elif self.peek() == ord("]"):
                self.offset += 1
                return result
            else:
                raise self.unexpected()

    def digits(self) -> int:
        start = self.offset
        while ord("0") <= self.peek() <= ord("9"):
            self.offset += 1
        if self.offset == start:
            raise self.unexpected()
        return self.offset - start

    def number(self) -> int | float:
        start = self.offset
        if self.peek() == ord("-"):
            self.offset += 1
        if self.peek() == ord("0"):
            self.offset += 1
        else:
            self.digits()
        is_float = False
        if self.peek() == ord("."):
            is_float = True
            self.offset += 1
            self.digits()
        if self.peek() in (ord("e"), ord("E")):
            is_float = True
            self.offset += 1
            if self.peek() in (ord("+"), ord("-")):
                self.offset += 1
            self.digits()
        text = self.data[start : self.offset].decode("ascii")
        if is_float:
            number = float(text)
            if not math.isfinite(number):
                raise JSONTextError(
                    f"a non-finite number (out of range) at position {start}", "non-finite", start
                )
            return number
        try:
            return int(text)
        except ValueError:  # more digits than Python converts
            raise JSONTextError(f"number too long at position {start}", "size", start) from None

    def string(self) -> str:
        self.offset += 1
        pieces: list[str] = []
        data = self.data
        while True:
            start = self.offset
            while (
                self.offset < len(data)
                and data[self.offset] not in b'"\\'
                and data[self.offset] >= 0x20
            ):
                self.offset += 1
            pieces.append(data[start : self.offset].decode("utf-8"))  # checked by loads
            byte = self.peek()
            if byte == ord('"'):
                self.offset += 1
                return "".join(pieces)
            if byte != ord("\\"):
                raise self.unexpected()
            self.offset += 1
            escape = self.peek()
            if escape in _ESCAPES:
                pieces.append(_ESCAPES[escape])
                self.offset += 1
            elif escape == ord("u"):
                pieces.append(self.unicode_escape())
            else:
                raise self.unexpected()

    def unicode_escape(self) -> str:
        start = self.offset - 1  # the backslash
        code = self.hex4()
        if 0xD800 <= code < 0xDC00 and self.data[self.offset : self.offset + 2] == b"\\u":
            saved = self.offset
            self.offset += 1
            low = self.hex4()
            if 0xDC00 <= low < 0xE000:
                return chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00))
            self.offset = saved
        if 0xD800 <= code < 0xE000:
            # A lone surrogate cannot be written as UTF-8: it would fail wherever the
            # value is stored or sent, long after this answer.
            raise JSONTextError(
                f"a lone surrogate U+{code:04X} at position {start}", "surrogate", start
            )
        return chr(code)

    def hex4(self) -> int:
        self.offset += 1
        code = 0
        for _ in range(4):
            byte = self.peek()
            digit = bytes([byte]).decode("ascii", "replace") if byte >= 0 else ""
            if not digit or digit not in "0123456789abcdefABCDEF":
                raise self.unexpected()
            code = code * 16 + int(digit, 16)
            self.offset += 1
        return code


def dumps(value: Value) -> str:
    """Compact JSON with sorted keys.

    Raises:
        JSONTextError: nesting deeper than :data:`MAX_JSON_DEPTH`, more than
            :data:`MAX_JSON_NODES` values (shared substructure counts each time it is
            written), or a non-finite number.

    >>> dumps({"name": "John", "age": 30})
    '{"age":30,"name":"John"}'
    """
    plain = _Plain().convert(value, 0)
    return json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


MAX_JSON_NODES: Final = 1_000_000


class _Plain:
    """Converts to JSON-ready data, counting values so the output stays bounded."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def convert(self, value: Value, depth: int) -> object:
        self.count += 1
        if self.count > MAX_JSON_NODES:
            raise JSONTextError(f"more than {MAX_JSON_NODES} values to write", "size")
        if depth > MAX_JSON_DEPTH:
            raise JSONTextError(f"nesting deeper than {MAX_JSON_DEPTH}", "depth")
        kind = type(value)
        if kind is dict:
            return {
                str(key): self.convert(item, depth + 1)
                for key, item in value.items()
                if type(item) is not Undefined
            }
        if kind is list:
            return [self.convert(item, depth + 1) for item in value]
        if kind is Undefined:
            return None
        if kind is datetime:
            return format_datetime(value)
        if kind is date:
            return value.isoformat()
        if kind is Duration:
            return str(value)
        if kind is float and not math.isfinite(value):
            raise JSONTextError("non-finite number", "non-finite")
        return value
