"""Which extra to install when an optional library is missing.

The core needs no third-party library; each integration comes with an extra of the
distribution (``pip install 'statifier[postgres]'``). Where a layer imports one, a
missing library becomes :class:`MissingExtra`, whose message names the extra:

>>> error = MissingExtra.of(ModuleNotFoundError("No module named 'psycopg'", name="psycopg"))
>>> str(error)
"PostgreSQL needs the postgres extra: pip install 'statifier[postgres]'"
>>> error.extra, isinstance(error, ModuleNotFoundError)
('postgres', True)

A module whose feature has an extra of its own that installs every library it imports
(scriba) names that extra instead of the library's:

>>> missing = ModuleNotFoundError("No module named 'psycopg'", name="psycopg")
>>> str(MissingExtra.of(missing, extra="scriba", what="scriba.sources"))
"scriba.sources needs the scriba extra: pip install 'statifier[scriba]'"

Every module of the project that imports an optional library when it is imported turns
the :class:`ModuleNotFoundError` into this one, so that importing any module without its
extra names the extra to install (``docs/decisions/0086-fresh-installs-that-run.md``).

A leaf: it imports nothing of the project.
"""

from __future__ import annotations

from typing import Final

__all__ = ["EXTRAS", "MissingExtra", "extra_for"]

EXTRAS: Final[dict[str, tuple[str, str]]] = {
    "psycopg": ("postgres", "PostgreSQL"),
    "psycopg_pool": ("postgres", "PostgreSQL"),
    "psycopg_binary": ("postgres", "PostgreSQL"),
    "sqlalchemy": ("sqlite", "the SQL layer (durable executions, migrations, the router)"),
    "alembic": ("sqlite", "the SQL layer (durable executions, migrations, the router)"),
    "greenlet": ("sqlite", "the SQL layer (durable executions, migrations, the router)"),
    "httpx": ("http", "BasicHTTP"),
    "starlette": ("http", "HTTP serving (Starlette, uvicorn)"),
    "uvicorn": ("http", "HTTP serving (Starlette, uvicorn)"),
    "confluent_kafka": ("kafka", "Kafka"),
    "nats": ("nats", "NATS"),
    "eventsourcing": ("scriba", "scriba's sources"),
    "opentelemetry": ("otel", "OpenTelemetry"),
    "jinja2": ("console", "the operator console"),
    "markupsafe": ("console", "the operator console"),
    "cryptography": ("crypto", "The Fernet blob codec"),
}
"""A top-level module name: the extra that installs it, and what needs it."""


def extra_for(error: BaseException) -> tuple[str, str] | None:
    """``(extra, what needs it)`` when ``error`` is a missing module an extra installs,
    else ``None``."""
    if not isinstance(error, ModuleNotFoundError) or not error.name:
        return None
    return EXTRAS.get(error.name.partition(".")[0])


class MissingExtra(ModuleNotFoundError):  # noqa: N818 - names the finding
    """An optional library is not installed; ``extra`` names the extra that brings it.

    A :class:`ModuleNotFoundError` (so ``except ImportError`` still catches it) whose
    message says what to install.
    """

    def __init__(self, extra: str, what: str, module: str) -> None:
        super().__init__(f"{what} needs the {extra} extra: pip install 'statifier[{extra}]'")
        self.name = module
        self.extra = extra

    @classmethod
    def of(
        cls, error: ModuleNotFoundError, *, extra: str | None = None, what: str | None = None
    ) -> ModuleNotFoundError:
        """The :class:`MissingExtra` for ``error``, or ``error`` itself when no extra
        installs the missing module (or it already is one).

        ``extra`` and ``what``, given together, name the extra of the feature being
        imported instead of the missing library's own: only for a feature whose extra
        installs every optional library it imports.
        """
        if isinstance(error, MissingExtra):
            return error
        found = extra_for(error)
        if found is None:
            return error
        if extra is not None and what is not None:
            found = (extra, what)
        return cls(found[0], found[1], error.name or "")
