"""``JSON.parse`` and ``JSON.stringify`` for the language's values.

Parsing is strict RFC 8259 over UTF-8 with a nesting bound; a failure names the
offending byte and its offset, e.g. ``unexpected byte 0x6F at position 1``.
Stringifying writes compact JSON with map keys sorted, so equal values give equal
text. Dates and datetimes become ISO 8601 strings and durations their canonical
string (``"2w3d"``); an undefined map entry is left out and an undefined elsewhere
is written as ``null``.
"""

from __future__ import annotations

import json
import math
from datetime import date, datetime
from typing import Final

from statifier.expr.values import Duration, Undefined, Value, format_datetime

__all__ = ["MAX_JSON_DEPTH", "MAX_JSON_NODES", "JSONTextError", "dumps", "loads"]

MAX_JSON_DEPTH: Final = 128


class JSONTextError(ValueError):
    """Malformed JSON text; the message says which byte and where."""


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


def loads(text: str) -> Value:
    """Parse JSON text.

    Raises:
        JSONTextError: malformed text, or nesting deeper than :data:`MAX_JSON_DEPTH`.

    >>> loads('{"b": [1, 2.5, null, true]}')
    {'b': [1, 2.5, None, True]}
    >>> loads("not json")
    Traceback (most recent call last):
    ...
    statifier.expr.jsontext.JSONTextError: unexpected byte 0x6F at position 1
    """
    data = text.encode("utf-8", "surrogatepass")
    parser = _Parser(data)
    parser.skip()
    value = parser.value(0)
    parser.skip()
    if parser.offset < len(data):
        raise parser.unexpected()
    return value


class _Parser:
    __slots__ = ("data", "offset")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.offset = 0

    def unexpected(self) -> JSONTextError:
        if self.offset >= len(self.data):
            return JSONTextError(f"unexpected end of input at position {self.offset}")
        return JSONTextError(
            f"unexpected byte 0x{self.data[self.offset]:02X} at position {self.offset}"
        )

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
            raise JSONTextError(f"nesting deeper than {MAX_JSON_DEPTH} at position {self.offset}")
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
        try:
            return float(text) if is_float else int(text)
        except ValueError:
            raise JSONTextError(f"number too long at position {start}") from None

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
            try:
                pieces.append(data[start : self.offset].decode("utf-8"))
            except UnicodeDecodeError as error:
                self.offset = start + error.start
                raise self.unexpected() from None
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
        code = self.hex4()
        if 0xD800 <= code < 0xDC00 and self.data[self.offset : self.offset + 2] == b"\\u":
            saved = self.offset
            self.offset += 1
            low = self.hex4()
            if 0xDC00 <= low < 0xE000:
                return chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00))
            self.offset = saved
        if 0xD800 <= code < 0xE000:
            return "\ufffd"
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
            raise JSONTextError(f"more than {MAX_JSON_NODES} values to write")
        if depth > MAX_JSON_DEPTH:
            raise JSONTextError(f"nesting deeper than {MAX_JSON_DEPTH}")
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
            raise JSONTextError("non-finite number")
        return value
