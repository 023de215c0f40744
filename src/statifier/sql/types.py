"""Column types every SQL table here shares, in ``statifier``'s tables and in
scriba's: they depend on SQLAlchemy alone.

>>> import sqlalchemy as sa
>>> from datetime import datetime
>>> UtcDateTime().process_bind_param(datetime(2026, 1, 1), sa.create_engine("sqlite://").dialect)
Traceback (most recent call last):
...
ValueError: stored times must be timezone-aware, not datetime.datetime(2026, 1, 1, 0, 0)
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

__all__ = ["UtcDateTime", "json_document"]


class UtcDateTime(sa.types.TypeDecorator[datetime]):
    """A timezone-aware datetime, stored as UTC and read back as aware UTC everywhere.

    SQLite has no time zone type, so the value is converted to UTC and stored without
    its offset, and labelled UTC when read. A naive datetime is refused (``ValueError``):
    stored state never guesses which clock a time came from.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"stored times must be timezone-aware, not {value!r}")
        utc = value.astimezone(UTC)
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def json_document() -> sa.types.TypeEngine[Any]:
    """JSON everywhere, ``jsonb`` on PostgreSQL (compact, indexable for containment)."""
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
