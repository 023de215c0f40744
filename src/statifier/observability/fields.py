"""What of a telemetry event the bridges show: which metadata keys pass, and every
value bounded.

Both bridges (:mod:`statifier.observability.otel` and
:mod:`statifier.observability.logs`) read an event's metadata through one
:class:`FieldPolicy`, so a span, a metric and a log line never show what the other
two hide. A key is dropped when its name contains one of the policy's ``denied``
words (case-insensitive), whatever its value: the words name what carries secrets
or a payload (``token``, ``secret``, ``password``, ``key``, ``body``, ``data`` and
the rest of :data:`DENIED_WORDS`). A value passes as a scalar, a string cut to
``max_text`` characters, or a short sequence of those; a mapping (a payload, by its
shape) never passes as an attribute. Text is scrubbed of the credentials a URL or an
``Authorization`` value can carry before it is cut.

>>> policy = FieldPolicy()
>>> policy.attributes({"execution_id": "ex_1", "api_token": "t0k", "data": {"card": "4242"},
...                    "error": "GET https://bob:hunter2@api.example/x?token=abc failed"})
{'execution_id': 'ex_1', 'error': 'GET https://***@api.example/x?token=*** failed'}
>>> policy.allows("binding_id"), policy.allows("Authorization")
(True, False)
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["DENIED_WORDS", "FAILURES", "FieldPolicy", "failed"]

Attribute = str | bool | int | float | tuple[str, ...] | tuple[int, ...] | tuple[float, ...]
"""A value an OpenTelemetry attribute (and a flat log field) can hold."""

DENIED_WORDS: Final[tuple[str, ...]] = (
    "token",
    "secret",
    "password",
    "passwd",
    "credential",
    "auth",
    "cookie",
    "key",
    "signature",
    "private",
    "body",
    "data",
    "payload",
    "header",
    "stacktrace",
)
"""Words that drop a metadata key whose name contains one. ``stacktrace`` is here for
its size and because it quotes source lines; the exception's ``kind`` and ``reason``
still pass."""

FAILURES: Final[frozenset[str]] = frozenset(
    {
        "statifier.session.error",
        "statifier.persistence.effect_failed",
        "statifier.api.watch_failed",
        "scriba.projection.event.exception",
        "scriba.projection.halted",
        "scriba.projection.dead_letter",
        "scriba.source.batch.failed",
    }
)
"""The events that report a failure by their name alone."""

_URL_CREDENTIALS: Final = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/@]+@")
_SECRET_PARAMETER: Final = re.compile(
    r"(?i)([?&;][^=&\s#]*(?:token|secret|password|key|sig|auth)[^=&\s#]*=)[^&;\s#'\"()\[\]]+"
)
_AUTHORIZATION: Final = re.compile(r"(?i)\b(bearer|basic)\s+[a-z0-9._~+/=-]+")
_MAX_DEPTH: Final = 4


def failed(event_name: str, metadata: Mapping[str, Any]) -> bool:
    """Whether an event reports a failure: it is one of :data:`FAILURES`, or its
    metadata carries a non-empty ``error`` (a timer that failed, an executor that
    raised, a chart's error event) or ``refusal`` (a front that refused a request)."""
    return event_name in FAILURES or bool(metadata.get("error")) or bool(metadata.get("refusal"))


@dataclass(frozen=True)
class FieldPolicy:
    """Which metadata keys pass and how long a value may be.

    Attributes:
        denied: a key whose lower-cased name contains one of these words is dropped.
        max_text: strings are cut to this many characters (an ellipsis marks a cut).
        max_items: sequences are cut to this many items, mappings (in log fields) to
            this many keys.

    Raises:
        ValueError: ``max_text`` or ``max_items`` is below 1.
    """

    denied: tuple[str, ...] = DENIED_WORDS
    max_text: int = 256
    max_items: int = 16

    def __post_init__(self) -> None:
        if self.max_text < 1 or self.max_items < 1:
            raise ValueError("max_text and max_items must be at least 1")

    def allows(self, key: str) -> bool:
        """Whether a metadata key of this name may be shown."""
        folded = key.lower()
        return not any(word in folded for word in self.denied)

    def scrub(self, value: str) -> str:
        """``value`` with the user and password of URLs, the values of query
        parameters whose names say secret (``token``, ``key``, ``sig``, ...) and
        ``Bearer``/``Basic`` credentials masked as ``***``; not cut."""
        scrubbed = _URL_CREDENTIALS.sub(r"\1***@", value)
        scrubbed = _SECRET_PARAMETER.sub(r"\1***", scrubbed)
        return _AUTHORIZATION.sub(r"\1 ***", scrubbed)

    def text(self, value: str) -> str:
        """``value`` scrubbed (see :meth:`scrub`) and cut to ``max_text`` characters."""
        scrubbed = self.scrub(value)
        if len(scrubbed) <= self.max_text:
            return scrubbed
        return scrubbed[: self.max_text - 1] + "…"

    def attributes(self, metadata: Mapping[str, Any]) -> dict[str, Attribute]:
        """The flat attributes of ``metadata``: allowed keys only; ``None``, bytes and
        mappings dropped; strings scrubbed and cut; sequences cut to ``max_items`` and
        made homogeneous (text unless every item is an int, or every item a float);
        any other value shown as its cut ``str``."""
        shown: dict[str, Attribute] = {}
        for key, value in metadata.items():
            if not self.allows(key):
                continue
            attribute = self._attribute(value)
            if attribute is not None:
                shown[key] = attribute
        return shown

    def jsonable(self, value: object, depth: int = 0) -> object:
        """``value`` as something :func:`json.dumps` writes, bounded like an attribute
        but keeping mappings (their denied keys dropped) to ``max_items`` keys and a
        depth of four; what is deeper, and bytes, becomes a placeholder."""
        if value is None or isinstance(value, bool | int):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else str(value)
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, bytes | bytearray):
            return f"<{len(value)} bytes>"
        if depth >= _MAX_DEPTH:
            return "<nested too deep>"
        if isinstance(value, Mapping):
            items = [(str(k), v) for k, v in value.items() if self.allows(str(k))]
            return {k: self.jsonable(v, depth + 1) for k, v in items[: self.max_items]}
        if isinstance(value, Sequence | set | frozenset):
            return [self.jsonable(item, depth + 1) for item in list(value)[: self.max_items]]
        return self.text(str(value))

    def _attribute(self, value: object) -> Attribute | None:
        if value is None or isinstance(value, bytes | bytearray | Mapping):
            return None
        if isinstance(value, bool | int | float):
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Sequence | set | frozenset):
            return self._sequence(list(value)[: self.max_items])
        return self.text(str(value))

    def _sequence(self, items: list[object]) -> Attribute:
        if items and all(isinstance(i, int) and not isinstance(i, bool) for i in items):
            return tuple(i for i in items if isinstance(i, int))
        if items and all(isinstance(i, float) for i in items):
            return tuple(i for i in items if isinstance(i, float))
        return tuple(self.text(str(item)) for item in items)
