"""Fixtures shared by the whole test suite."""

import os
import re

import pytest

_HOW_TO_RUN = (
    "Run the suite with ./dev test: it finds PostgreSQL through DATABASE_URL or "
    "127.0.0.1:5432, or starts a throwaway server, and exports DATABASE_URL."
)


def _redact(url: str) -> str:
    """Hide the password of a ``scheme://user:password@host`` URL."""
    return re.sub(r"^([a-z][a-z0-9+.-]*://[^:/@]*):[^@]*@", r"\1:***@", url)


@pytest.fixture(scope="session")
def database_url() -> str:
    """The URL of a PostgreSQL server that answers.

    Tests that need PostgreSQL fail, never skip, when there is none.
    """
    url = os.environ.get("DATABASE_URL", "")
    if not url:
        pytest.fail(f"DATABASE_URL is not set. {_HOW_TO_RUN}", pytrace=False)
    try:
        # Imported here so that a missing driver fails only the tests that need it.
        import psycopg
    except ImportError:
        pytest.fail(f"psycopg is not installed. {_HOW_TO_RUN}", pytrace=False)
    try:
        with psycopg.connect(url, connect_timeout=5) as conn:
            conn.execute("select 1")
    except psycopg.Error as exc:
        error = " ".join(str(exc).split())
    else:
        return url
    pytest.fail(
        f"PostgreSQL does not answer at DATABASE_URL={_redact(url)}: {error}\n{_HOW_TO_RUN}",
        pytrace=False,
    )
