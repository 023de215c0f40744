"""How a dead letter becomes a row, and a row a stored dead letter.

A dead letter is written in the same transaction as the batch around it, so writing it
must not fail: whatever the event or the error holds, the row is storable on both
databases and bounded in size.

- ``event_data`` is stored as JSON when it encodes as strict JSON (no NaN, no NUL
  characters, no lone surrogates, which PostgreSQL's ``jsonb`` refuses); otherwise its
  ``repr`` is stored, as a JSON string, cut to :data:`MAX_TEXT` characters.
- Texts lose what PostgreSQL cannot store (NUL characters and lone surrogates are
  written as escapes) and are cut to their column's size: messages keep their start,
  stack traces their end (where the failing frame is).

>>> storable_data({"id": 7, "tags": ("a", "b")})
{'id': 7, 'tags': ['a', 'b']}
>>> storable_data(float("nan"))
'nan'
>>> storable_data({1, 2})
'{1, 2}'
>>> storable_text("a\\x00b", limit=10)
'a\\\\x00b'
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Final

import sqlalchemy as sa

from scriba.event import ProjectionKey
from scriba.sql.tables import ERROR_KIND_LENGTH, NAME_LENGTH
from scriba.target import DeadLetter, StoredDeadLetter

__all__ = ["MAX_TEXT", "dead_letter_row", "storable_data", "storable_text", "stored_dead_letter"]

MAX_TEXT: Final = 65_536
"""The most characters kept of a message, a stack trace or an event's ``repr``."""

_TRUNCATED: Final = "..."


def storable_data(data: Any) -> Any:
    """``data`` as a JSON value both databases store, else its (bounded) ``repr``."""
    try:
        text = json.dumps(data, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")  # lone surrogates do not encode
    except (TypeError, ValueError, RecursionError):
        return _bounded_repr(data)
    if "\\u0000" in text:
        return _bounded_repr(data)
    return json.loads(text)


def storable_text(text: str, *, limit: int, keep_end: bool = False) -> str:
    """``text`` without NUL characters or lone surrogates, at most ``limit`` long."""
    clean = text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    if len(clean) <= limit:
        return clean
    room = max(limit - len(_TRUNCATED), 0)
    return _TRUNCATED + clean[len(clean) - room :] if keep_end else clean[:room] + _TRUNCATED


def dead_letter_row(projection: ProjectionKey, letter: DeadLetter, now: datetime) -> dict[str, Any]:
    """The values of the dead-letter row for ``letter``, recorded at ``now``."""
    event = letter.event
    return {
        "projection_name": projection.name,
        "projection_version": projection.version,
        "position": event.position,
        "stream_id": storable_text(str(event.stream_id), limit=MAX_TEXT),
        "event_type": storable_text(str(event.type), limit=NAME_LENGTH),
        "event_data": storable_data(event.data),
        "error_kind": storable_text(str(letter.error_kind), limit=ERROR_KIND_LENGTH),
        "error_message": storable_text(str(letter.error_message), limit=MAX_TEXT),
        "error_stacktrace": (
            None
            if letter.error_stacktrace is None
            else storable_text(str(letter.error_stacktrace), limit=MAX_TEXT, keep_end=True)
        ),
        "occurred_at": now,
    }


def stored_dead_letter(row: sa.Row[Any]) -> StoredDeadLetter:
    """A dead-letter row read back."""
    return StoredDeadLetter(
        id=row.id,
        projection=ProjectionKey(row.projection_name, row.projection_version),
        position=row.position,
        stream_id=row.stream_id,
        event_type=row.event_type,
        event_data=row.event_data,
        error_kind=row.error_kind,
        error_message=row.error_message,
        error_stacktrace=row.error_stacktrace,
        occurred_at=row.occurred_at,
    )


def _bounded_repr(data: Any) -> str:
    try:
        text = repr(data)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not lose the dead letter
        text = f"<{type(data).__qualname__} whose repr failed>"
    return storable_text(text, limit=MAX_TEXT)
