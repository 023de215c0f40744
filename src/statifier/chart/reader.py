"""Safe reading of XML into a small element tree with source locations.

The reader is built on expat and refuses what an untrusted document could use against
its reader: a DOCTYPE (and with it every entity declaration), documents over a size
bound, nesting over a depth bound, and more elements than an element-count bound.
Every element records the line and column where it starts and the byte range of its
source, so an inline child document can be cut out verbatim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final
from xml.parsers import expat

__all__ = ["Element", "ReadLimits", "XMLProblem", "read", "start_tag_end", "utf8"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadLimits:
    """Bounds on an untrusted document."""

    max_bytes: int = 4 * 1024 * 1024
    max_depth: int = 128
    max_elements: int = 100_000


DEFAULT_READ_LIMITS: Final = ReadLimits()

_SEPARATOR: Final = "|"


@dataclass(slots=True)
class Element:
    """One element: ``{namespace}local`` name, attributes, children, text, location.

    ``text`` is the concatenated character data directly inside the element.
    ``start`` and ``end`` are byte offsets of the element's source in the document.
    """

    tag: str
    attributes: dict[str, str]
    line: int
    column: int
    start: int
    children: list[Element] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)
    end: int = 0
    attribute_order: tuple[str, ...] = ()

    @property
    def namespace(self) -> str:
        return self.tag[1:].partition("}")[0] if self.tag.startswith("{") else ""

    @property
    def local(self) -> str:
        return self.tag.rpartition("}")[2]

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


@dataclass(frozen=True, slots=True)
class XMLProblem(Exception):  # noqa: N818 - carried as a value by callers
    """The document cannot be read: malformed, unsafe or over a limit."""

    message: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.line}:{self.column}: {self.message}"


def read(source: bytes | str, limits: ReadLimits = DEFAULT_READ_LIMITS) -> Element:
    """Parse ``source`` into its root element.

    Raises:
        XMLProblem: malformed XML, a DOCTYPE, a processing of external entities, a
            document over one of ``limits``, or one that is not UTF-8 (text with a lone
            surrogate, which no encoding writes).
    """
    data = utf8(source)
    if len(data) > limits.max_bytes:
        raise XMLProblem(f"document is {len(data)} bytes; the limit is {limits.max_bytes}", 1, 1)
    # Only UTF-8 is read (source locations and inline markup are UTF-8 byte ranges).
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise XMLProblem("the document is not UTF-8", line, 1) from None
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise XMLProblem("the document is not UTF-8", 1, 1)
    return _Builder(data, limits).run()


def utf8(source: bytes | str) -> bytes:
    """``source`` as the UTF-8 bytes the reader reads: text is encoded, bytes are as
    given (:func:`read` checks they are UTF-8).

    >>> utf8("<a>\\u00e9</a>")
    b'<a>\\xc3\\xa9</a>'
    >>> utf8("<a>\\n\\ud800</a>")
    Traceback (most recent call last):
    ...
    statifier.chart.reader.XMLProblem: 2:1: the document is not UTF-8: a lone surrogate U+D800

    Raises:
        XMLProblem: text UTF-8 cannot encode (a lone surrogate), at its line and column.
    """
    if not isinstance(source, str):
        return source
    try:
        return source.encode("utf-8")
    except UnicodeEncodeError as error:
        at = error.start
        line = source.count("\n", 0, at) + 1
        column = at - source.rfind("\n", 0, at)
        surrogate = f"U+{ord(source[at]):04X}"
        raise XMLProblem(
            f"the document is not UTF-8: a lone surrogate {surrogate}", line, column
        ) from None


class _Builder:
    def __init__(self, data: bytes, limits: ReadLimits) -> None:
        self.data = data
        self.limits = limits
        self.stack: list[Element] = []
        self.root: Element | None = None
        self.count = 0
        parser = expat.ParserCreate("utf-8", namespace_separator=_SEPARATOR)
        parser.ordered_attributes = True
        parser.buffer_text = True
        parser.StartElementHandler = self.start
        parser.EndElementHandler = self.end
        parser.CharacterDataHandler = self.characters
        parser.StartDoctypeDeclHandler = self.doctype
        parser.EntityDeclHandler = self.entity
        parser.ExternalEntityRefHandler = self.external
        parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
        self.parser = parser

    def problem(self, message: str) -> XMLProblem:
        return XMLProblem(
            message, self.parser.CurrentLineNumber, self.parser.CurrentColumnNumber + 1
        )

    def run(self) -> Element:
        try:
            self.parser.Parse(self.data, True)
        except expat.ExpatError as error:
            raise XMLProblem(
                expat.ErrorString(error.code), error.lineno, error.offset + 1
            ) from None
        assert self.root is not None
        return self.root

    def doctype(self, *args: object) -> None:
        raise self.problem("DOCTYPE declarations are not accepted")

    def entity(self, *args: object) -> None:
        raise self.problem("entity declarations are not accepted")

    def external(self, *args: object) -> int:
        raise self.problem("external entities are not accepted")

    def start(self, name: str, attributes: list[str]) -> None:
        self.count += 1
        if self.count > self.limits.max_elements:
            raise self.problem(f"more than {self.limits.max_elements} elements")
        if len(self.stack) >= self.limits.max_depth:
            raise self.problem(f"elements nested deeper than {self.limits.max_depth}")
        pairs = {_qualified(attributes[i]): attributes[i + 1] for i in range(0, len(attributes), 2)}
        element = Element(
            _qualified(name),
            pairs,
            self.parser.CurrentLineNumber,
            self.parser.CurrentColumnNumber + 1,
            self.parser.CurrentByteIndex,
            attribute_order=tuple(pairs),
        )
        tag_end = start_tag_end(self.data, element.start)
        if self.data[tag_end - 2 : tag_end] == b"/>":
            element.end = tag_end
        if self.stack:
            self.stack[-1].children.append(element)
        else:
            self.root = element
        self.stack.append(element)

    def end(self, name: str) -> None:
        element = self.stack.pop()
        if not element.end:  # not an empty-element tag: expat points at its "</name>"
            index = self.parser.CurrentByteIndex
            element.end = self.data.index(b">", index) + 1

    def characters(self, text: str) -> None:
        if self.stack:
            self.stack[-1].text_parts.append(text)


def start_tag_end(data: bytes, start: int) -> int:
    """The offset just past the ``>`` closing the start tag at ``start``."""
    quote = 0
    for offset in range(start + 1, len(data)):
        byte = data[offset]
        if quote:
            if byte == quote:
                quote = 0
        elif byte in b"\"'":
            quote = byte
        elif byte == ord(">"):
            return offset + 1
    return len(data)


def _qualified(name: str) -> str:
    namespace, separator, local = name.rpartition(_SEPARATOR)
    return f"{{{namespace}}}{local}" if separator else name
