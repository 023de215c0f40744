"""Database URLs as the library opens them."""

from __future__ import annotations

import sqlalchemy as sa


def psycopg_url(url: str | sa.URL) -> sa.URL:
    """``url`` with its driver named: a bare ``postgresql://`` (or ``postgres://``)
    means psycopg 3, which serves synchronous and asyncio engines alike; any other URL
    is answered as given.

    >>> str(psycopg_url("postgresql://u@localhost/db"))
    'postgresql+psycopg://u@localhost/db'
    >>> str(psycopg_url("sqlite:///x.db"))
    'sqlite:///x.db'
    """
    parsed = sa.make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+psycopg")
    return parsed
