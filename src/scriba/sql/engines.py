"""Which SQLAlchemy driver scriba uses for a database URL.

PostgreSQL goes through psycopg 3 (``postgresql+psycopg``), whichever spelling the URL
uses; SQLite through the standard library's ``sqlite3``.

>>> database_url("postgresql://postgres@localhost/app").drivername
'postgresql+psycopg'
>>> database_url("sqlite:///state.db").drivername
'sqlite'
>>> database_url("mysql://localhost/app")
Traceback (most recent call last):
...
ValueError: scriba works with PostgreSQL (psycopg 3) and SQLite (sqlite3), not 'mysql'
"""

from __future__ import annotations

import sqlalchemy as sa

__all__ = ["database_url"]

_DRIVERS = {
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "postgresql+psycopg": "postgresql+psycopg",
    "sqlite": "sqlite",
    "sqlite+pysqlite": "sqlite",
}


def database_url(url: str | sa.URL) -> sa.URL:
    """Parse ``url`` and name the driver scriba uses for its database.

    Raises:
        ValueError: the URL is not a PostgreSQL or SQLite one, or names another driver
            (``sqlite+aiosqlite``, ``postgresql+asyncpg``...).
        sqlalchemy.exc.ArgumentError: the URL cannot be parsed.
    """
    parsed = sa.make_url(url)
    driver = _DRIVERS.get(parsed.drivername)
    if driver is None:
        raise ValueError(
            "scriba works with PostgreSQL (psycopg 3) and SQLite (sqlite3), "
            f"not {parsed.drivername!r}"
        )
    return parsed.set(drivername=driver)
