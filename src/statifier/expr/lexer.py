"""The lexer: source text to tokens, each with its span.

Whitespace (space, tab, carriage return, newline) separates tokens and is otherwise
ignored, except between the parts of one duration literal (``1d 12h``), which stay
one token. A lexing problem is reported as a :class:`~statifier.expr.errors.ParseError`
raised as :class:`LexFailure`, which the parser turns into a returned value.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from typing import Final

from statifier.expr import durations
from statifier.expr.errors import ParseError, Span
from statifier.expr.values import Duration, to_utc

__all__ = ["KEYWORDS", "LexFailure", "Token", "tokenize"]

# Token kinds.
INT: Final = "int"
FLOAT: Final = "float"
STRING: Final = "string"
DATE: Final = "date"
DATETIME: Final = "datetime"
DURATION: Final = "duration"
IDENT: Final = "ident"
KEYWORD: Final = "keyword"
OP: Final = "op"
EOF: Final = "eof"

# Words that never name a variable. ``and``/``or``/``not`` are matched without regard
# to case; the rest only in lower case (plus the upper-case ``IN``/``CONTAINS``).
KEYWORDS: Final = frozenset(
    {
        "true",
        "false",
        "null",
        "undefined",
        "and",
        "or",
        "not",
        "in",
        "contains",
        "if",
        "else",
        "while",
    }
)
_CASELESS: Final = frozenset({"and", "or", "not"})
_UPPER_ALIASES: Final = {"IN": "in", "CONTAINS": "contains"}

# Longest operators first so that ``===`` is not read as ``==`` then ``=``.
_OPERATORS: Final = (
    "===",
    "!==",
    "==",
    "!=",
    ">=",
    "<=",
    "::",
    "&&",
    "||",
    ">",
    "<",
    "=",
    "!",
    "+",
    "-",
    "*",
    "/",
    "%",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    ";",
    ".",
)

_ESCAPES: Final = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "b": "\b",
    "f": "\f",
    "\\": "\\",
    '"': '"',
    "'": "'",
    "/": "/",
    "0": "\0",
}


@dataclass(frozen=True, slots=True)
class Token:
    """One token. ``value`` holds the decoded literal or the operator/word text."""

    kind: str
    value: object
    span: Span
    text: str


class LexFailure(Exception):  # noqa: N818 - internal control flow, never escapes the parser
    """Internal: carries a ParseError out of the lexer."""

    def __init__(self, error: ParseError) -> None:
        super().__init__(error.message)
        self.error = error


class _Cursor:
    """Tracks offset, line and column while scanning."""

    __slots__ = ("column", "line", "offset", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.offset = 0
        self.line = 1
        self.column = 1

    def advance(self, count: int) -> None:
        for char in self.source[self.offset : self.offset + count]:
            if char == "\n":
                self.line += 1
                self.column = 1
            else:
                self.column += 1
        self.offset += count


def _fail(message: str, line: int, column: int, cursor: _Cursor) -> LexFailure:
    return LexFailure(ParseError("syntax", message, Span(line, column, cursor.line, cursor.column)))


def tokenize(source: str) -> list[Token]:
    """Split ``source`` into tokens, ending with an ``eof`` token.

    Raises:
        LexFailure: an unexpected character, an unterminated string or date, or a
            malformed number, date or duration.
    """
    cursor = _Cursor(source)
    tokens: list[Token] = []
    length = len(source)
    while True:
        while cursor.offset < length and source[cursor.offset] in " \t\r\n":
            cursor.advance(1)
        line, column, start = cursor.line, cursor.column, cursor.offset
        if start >= length:
            tokens.append(Token(EOF, None, Span(line, column, line, column), ""))
            return tokens
        char = source[start]
        if char.isascii() and char.isdigit():
            kind, value = _number(source, cursor)
        elif char.isascii() and (char.isalpha() or char == "_"):
            kind, value = _word(source, cursor)
        elif char in "\"'":
            kind, value = STRING, _string(source, cursor, char)
        elif char == "#":
            kind, value = _date(source, cursor)
        else:
            for op in _OPERATORS:
                if source.startswith(op, start):
                    cursor.advance(len(op))
                    kind, value = OP, op
                    break
            else:
                cursor.advance(1)
                raise _fail(f"Unexpected character {char!r}", line, column, cursor)
        span = Span(line, column, cursor.line, cursor.column)
        tokens.append(Token(kind, value, span, source[start : cursor.offset]))


def _digits(source: str, offset: int) -> int:
    end = offset
    while end < len(source) and "0" <= source[end] <= "9":
        end += 1
    return end


def _number(source: str, cursor: _Cursor) -> tuple[str, object]:
    line, column, start = cursor.line, cursor.column, cursor.offset
    end = _digits(source, start)
    is_float = end + 1 < len(source) and source[end] == "." and "0" <= source[end + 1] <= "9"
    if is_float:
        end = _digits(source, end + 1)
    if end < len(source) and source[end].isascii() and source[end].isalpha():
        return DURATION, _duration(source, cursor)
    text = source[start:end]
    cursor.advance(end - start)
    try:
        return (FLOAT, float(text)) if is_float else (INT, int(text))
    except ValueError:
        raise _fail(f"Number literal too long: {text[:20]}...", line, column, cursor) from None


def _fraction_end(source: str, offset: int) -> int:
    """Where the number starting at ``offset`` ends, fraction included."""
    end = _digits(source, offset)
    if end + 1 < len(source) and source[end] == "." and "0" <= source[end + 1] <= "9":
        end = _digits(source, end + 1)
    return end


def _next_part(source: str, offset: int) -> int | None:
    """The start of the literal's next ``<number><unit>`` part, or ``None``.

    A digit right after a unit continues the literal (``2w3d``). So does a number
    directly followed by a letter after nothing but whitespace (``3d 8h``): anywhere
    else a number after a duration is an error, so nothing that parsed before changes.
    """
    if offset < len(source) and "0" <= source[offset] <= "9":
        return offset  # adjacent: ``2w3d``
    start = offset
    while start < len(source) and source[start] in " \t\r\n":
        start += 1
    if start == offset or start >= len(source) or not "0" <= source[start] <= "9":
        return None
    end = _fraction_end(source, start)
    if end < len(source) and source[end].isascii() and source[end].isalpha():
        return start
    return None


def _duration(source: str, cursor: _Cursor) -> Duration:
    """A run of ``<number><unit>`` parts such as ``2w3d``, ``1.5s`` or ``1d 12h``.

    A fraction expands into smaller units and must come out to whole milliseconds.
    Without fractions a unit written twice takes its last value; once the literal
    holds a fraction, no unit may appear twice anywhere in it after expansion.
    """
    line, column = cursor.line, cursor.column
    components: dict[str, int] = {}
    seen: set[str] = set()
    repeated: str | None = None
    has_fraction = False
    while True:
        offset = cursor.offset
        part_line, part_column = cursor.line, cursor.column
        number_end = _fraction_end(source, offset)
        unit_end = number_end
        while unit_end < len(source) and source[unit_end].isascii() and source[unit_end].isalpha():
            unit_end += 1
        number, unit = source[offset:number_end], source[number_end:unit_end]
        cursor.advance(unit_end - offset)
        field = durations.UNIT_FIELDS.get(unit)
        if field is None:
            raise _fail(f"Unknown duration unit {unit!r}", part_line, part_column, cursor)
        try:
            parts = durations.expand(number, field)
        except ValueError:
            raise _fail("Duration number too long", part_line, part_column, cursor) from None
        if parts is None:
            raise _fail(
                f"Duration {number}{unit} is not a whole number of milliseconds",
                part_line,
                part_column,
                cursor,
            )
        has_fraction = has_fraction or "." in number
        # An all-zero fraction (``0.0s``) still names its unit.
        for name in parts or (field,):
            if name in seen and repeated is None:
                repeated = name
            seen.add(name)
        components.update(parts)
        following = _next_part(source, cursor.offset)
        if following is None:
            break
        cursor.advance(following - cursor.offset)
    if has_fraction and repeated is not None:
        raise _fail(
            f"Duration unit {repeated} is given twice once fractions are expanded",
            line,
            column,
            cursor,
        )
    return durations.build(components)


def _word(source: str, cursor: _Cursor) -> tuple[str, object]:
    start = cursor.offset
    end = start
    while end < len(source) and (
        source[end].isascii() and (source[end].isalnum() or source[end] == "_")
    ):
        end += 1
    word = source[start:end]
    cursor.advance(end - start)
    lowered = word.lower()
    if lowered in _CASELESS:
        return KEYWORD, lowered
    if word in KEYWORDS:
        return KEYWORD, word
    if word in _UPPER_ALIASES:
        return KEYWORD, _UPPER_ALIASES[word]
    return IDENT, word


def _string(source: str, cursor: _Cursor, quote: str) -> str:
    line, column = cursor.line, cursor.column
    offset = cursor.offset + 1
    pieces: list[str] = []
    while True:
        end = offset
        while end < len(source) and source[end] != quote and source[end] != "\\":
            end += 1
        pieces.append(source[offset:end])
        if end >= len(source):
            cursor.advance(end - cursor.offset)
            raise _fail("Unterminated string literal", line, column, cursor)
        if source[end] == quote:
            cursor.advance(end + 1 - cursor.offset)
            return "".join(pieces)
        if end + 1 >= len(source):
            cursor.advance(end + 1 - cursor.offset)
            raise _fail("Unterminated string literal", line, column, cursor)
        escaped = source[end + 1]
        if escaped == "u":
            digits = source[end + 2 : end + 6]
            if len(digits) != 4 or not all(c in "0123456789abcdefABCDEF" for c in digits):
                cursor.advance(end + 2 - cursor.offset)
                raise _fail("Invalid \\u escape: four hex digits expected", line, column, cursor)
            pieces.append(chr(int(digits, 16)))
            offset = end + 6
        else:
            # An unknown escape stands for the character itself, as in the original.
            pieces.append(_ESCAPES.get(escaped, escaped))
            offset = end + 2


def _date(source: str, cursor: _Cursor) -> tuple[str, object]:
    line, column = cursor.line, cursor.column
    end = source.find("#", cursor.offset + 1)
    if end < 0:
        cursor.advance(len(source) - cursor.offset)
        raise _fail("Unterminated date literal", line, column, cursor)
    content = source[cursor.offset + 1 : end]
    cursor.advance(end + 1 - cursor.offset)
    if "T" in content:
        moment = parse_datetime(content)
        if moment is None:
            raise _fail(f"Invalid datetime literal: {content}", line, column, cursor)
        return DATETIME, moment
    day = parse_date(content)
    if day is None:
        raise _fail(f"Invalid date literal: {content}", line, column, cursor)
    return DATE, day


def parse_date(text: str) -> date | None:
    """An ISO 8601 calendar date ``YYYY-MM-DD``, or ``None``."""
    if len(text) != 10 or text[4] != "-" or text[7] != "-":
        return None
    if (
        not (text[:4] + text[5:7] + text[8:]).isascii()
        or not (text[:4] + text[5:7] + text[8:]).isdigit()
    ):
        return None
    try:
        return date(int(text[:4]), int(text[5:7]), int(text[8:]))
    except ValueError:
        return None


def parse_datetime(text: str) -> datetime | None:
    """An ISO 8601 datetime that states its UTC offset, normalised to UTC, or ``None``.

    Fractions beyond microseconds are truncated.
    """
    day = parse_date(text[:10])
    if day is None or len(text) < 20 or text[10] not in "Tt":
        return None
    rest = text[11:]
    if rest.endswith(("Z", "z")):
        clock, offset = rest[:-1], "+00:00"
    elif len(rest) > 6 and rest[-6] in "+-" and rest[-3] == ":":
        clock, offset = rest[:-6], rest[-6:]
    else:
        return None
    whole, _, fraction = clock.partition(".")
    if "." in clock and not (fraction.isascii() and fraction.isdigit()):
        return None
    fraction = fraction[:6].ljust(6, "0")
    candidate = f"{day.isoformat()}T{whole}.{fraction}{offset}"
    if len(whole) != 8 or whole[2] != ":" or whole[5] != ":":
        return None
    if not (whole[:2] + whole[3:5] + whole[6:] + offset[1:3] + offset[4:]).isdigit():
        return None
    try:
        return to_utc(datetime.fromisoformat(candidate))
    except ValueError:
        return None
