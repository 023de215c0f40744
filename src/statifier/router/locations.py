"""BasicHTTP locations of durable executions: a bearer token per execution, kept as its
hash.

With ``RouterConfig(basichttp=BasicHttpLocations(base_url=...))``, each execution the
router creates under a new address row gets a location, ``<base_url>/<token>``: the
token is 32 bytes from :mod:`secrets` (43 URL-safe characters), never derived from the
execution id. The location is written into the execution's ``_ioprocessors`` under
``basichttp`` (and the processor's type URI) when it starts, so the chart can hand it
on; the router's ``locations`` table keeps the SHA-256 of the token, so the table
alone answers which execution a posted token reaches and never which token reaches
an execution. An execution created under ``always_new`` has no address row and no
location.

:func:`rotate_location` replaces the token; the old one then reaches nothing
(:func:`rotate_location_in` does it inside a router transaction the caller holds). The
chart's own copy is written once, at the start, and is not rotated. :func:`location`
answers the location the chart holds while it is still the live one; after a rotation
the live location exists only in :func:`rotate_location`'s answer.

A location is a capability: whoever holds it can post events to the execution. The
position of an execution carries the first token in the clear (the chart reads it
there), so it is as secret as the positions are; rotate a location that may have
leaked. The table needs its opt-in migration,
:func:`statifier.sql.locations.upgrade_locations`.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import cache
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from statifier.core import StartOptions
from statifier.core.positions import NotAPosition
from statifier.persistence import ExecutionNotFound
from statifier.router.errors import ConfigError, RouterError
from statifier.router.sending import BASICHTTP_TYPES
from statifier.sql.dialect import utc_text, utc_time
from statifier.sql.names import TableNames
from statifier.sql.tables import Tables

if TYPE_CHECKING:
    from statifier.router.config import RouterConfig
    from statifier.router.transaction import Unit

__all__ = [
    "DEFAULT_SEND_KEY_HORIZON",
    "BasicHttpLocations",
    "Located",
    "NoLocation",
    "location",
    "mint_token",
    "rotate_location",
    "rotate_location_in",
    "token_digest",
    "token_shaped",
]

DEFAULT_SEND_KEY_HORIZON: Final = timedelta(hours=72)
"""How long a posted ``scxml-send-key`` is remembered per execution."""
TOKEN_BYTES: Final = 32
"""A token's entropy: 256 bits."""
PROCESSOR: Final = "basichttp"
"""The ``_ioprocessors`` entry the chart reads its location at."""

_TOKEN: Final = re.compile(r"[A-Za-z0-9_-]{43}")


@dataclass(frozen=True, slots=True)
class BasicHttpLocations:
    """The ``basichttp`` option of a router configuration: where its BasicHTTP front
    answers.

    Attributes:
        base_url: the ``http`` or ``https`` URL the front is mounted at (no query, no
            fragment; a trailing ``/`` is dropped). Serve it over TLS.
        horizon: how long a posted send key is remembered per execution.

    Raises:
        ConfigError: a base URL that is not an absolute http(s) URL, or a horizon that
            is not a positive timedelta.
    """

    base_url: str
    horizon: timedelta = DEFAULT_SEND_KEY_HORIZON

    def __post_init__(self) -> None:
        given: object = self.base_url
        parts = urlsplit(given) if isinstance(given, str) else None
        if (
            parts is None
            or parts.scheme not in ("http", "https")
            or not parts.netloc
            or parts.query
            or parts.fragment
        ):
            raise ConfigError(
                f"basichttp base_url must be an http(s) URL without query or fragment, "
                f"not {given!r}"
            )
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))
        horizon: object = self.horizon
        if not isinstance(horizon, timedelta) or horizon <= timedelta(0):
            raise ConfigError(f"basichttp horizon must be a positive timedelta, not {horizon!r}")

    def location(self, token: str) -> str:
        """The location of ``token``: the base URL, ``/``, the token."""
        return f"{self.base_url}/{token}"


@dataclass(frozen=True, slots=True)
class Located:
    """The execution a live token reaches, through its address row."""

    address_id: Any
    scope: str
    document: str
    key: str
    execution_id: str
    finished: bool


class NoLocation(RouterError, LookupError):  # noqa: N818 - names the finding
    """The execution has no location: it has no address row, it was created before
    ``basichttp`` was set, or the configuration has no ``basichttp``."""

    def __init__(self, execution_id: str) -> None:
        super().__init__(f"execution {execution_id!r} has no BasicHTTP location")
        self.execution_id = execution_id


def mint_token() -> str:
    """A new token: 256 random bits, URL-safe base64 without padding (43 characters)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def token_digest(token: str) -> str:
    """What the table keeps of ``token``: its SHA-256, lowercase hex."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def token_shaped(token: str) -> bool:
    """Whether ``token`` could be one :func:`mint_token` made (the front answers 404 to
    anything else without reading the table).

    >>> token_shaped(mint_token()), token_shaped("ex_01J"), token_shaped("a/" * 21 + "b")
    (True, False, False)
    """
    return _TOKEN.fullmatch(token) is not None


async def location(config: RouterConfig, execution_id: str) -> str | None:
    """The location of ``execution_id`` as its chart holds it, while that is the live
    one (on the configuration's current base URL).

    Answers ``None`` when the execution has no location, when it was rotated (the
    router keeps only the token's hash, so the live location is the answer
    :func:`rotate_location` gave, and nowhere else), and when its position is gone
    (pruned after it ended, or deleted; its location answers 404 then anyway).
    """
    settings = _settings(config)
    async with config.transaction() as unit:
        live = await _Session(unit).live_digest(execution_id)
        if live is None:
            return None
        storage = unit.executions.storage
        try:
            record = await storage.fetch_execution(execution_id)
            state = storage.load(record, await storage.machine(record.content_hash))
        except (ExecutionNotFound, NotAPosition):
            return None
    token = _chart_token(state.datamodel.get("_ioprocessors"))
    if token is None or not secrets.compare_digest(token_digest(token), live):
        return None
    return settings.location(token)


async def rotate_location(config: RouterConfig, execution_id: str) -> str:
    """Give ``execution_id`` a new location and answer it; the old one reaches nothing
    from the commit on. The chart's ``_ioprocessors`` still holds the first one.

    Raises:
        ConfigError: the configuration has no ``basichttp``.
        NoLocation: the execution has no location to replace.
    """
    _settings(config)  # refused before any transaction opens
    async with config.transaction() as unit:
        return await rotate_location_in(unit, config, execution_id)


async def rotate_location_in(unit: Unit, config: RouterConfig, execution_id: str) -> str:
    """:func:`rotate_location` inside ``unit``, a router transaction the caller opened
    on ``config`` (``config.transaction()``), so that what the caller writes beside it
    commits or rolls back with the rotation. The old location reaches nothing from
    ``unit``'s commit on; if ``unit`` rolls back, the old one stays live and the
    location answered reaches nothing.

    Raises:
        ConfigError: the configuration has no ``basichttp``.
        NoLocation: the execution has no location to replace (nothing was written).
    """
    settings = _settings(config)
    token = mint_token()
    if not await _Session(unit).rotate(execution_id, token_digest(token)):
        raise NoLocation(execution_id)
    return settings.location(token)


# Inside a router transaction: the create path and the front.


async def start_options(
    unit: Unit, config: RouterConfig, address_id: Any, execution_id: str, now: datetime
) -> StartOptions:
    """The start options of a new execution: the configuration's, and, when it has
    ``basichttp`` and the execution an address row (``address_id``), a location of its
    own, recorded in ``unit`` and written into ``_ioprocessors``."""
    options = config.start_options
    settings = config.basichttp
    if settings is None or address_id is None:
        return options
    token = mint_token()
    await _Session(unit).insert(address_id, execution_id, token_digest(token), now)
    entry = {"location": settings.location(token)}
    hosted = options.datamodel.get("_ioprocessors")
    processors: dict[str, Any] = dict(hosted) if isinstance(hosted, Mapping) else {}
    processors.update(dict.fromkeys(BASICHTTP_TYPES, entry))
    return replace(options, datamodel={**options.datamodel, "_ioprocessors": processors})


async def resolve(unit: Unit, token: str) -> Located | None:
    """The execution ``token`` reaches, read in ``unit`` (on PostgreSQL the location row
    is held against a rotation until the commit), or ``None``."""
    return await _Session(unit).resolve(token_digest(token))


def _settings(config: RouterConfig) -> BasicHttpLocations:
    if config.basichttp is None:
        raise ConfigError("the configuration has no basichttp: executions have no location")
    return config.basichttp


def _chart_token(processors: object) -> str | None:
    """The token of the location a chart's ``_ioprocessors`` names, if any."""
    entry = processors.get(PROCESSOR) if isinstance(processors, Mapping) else None
    named = entry.get("location") if isinstance(entry, Mapping) else None
    if not isinstance(named, str):
        return None
    token = named.rpartition("/")[2]
    return token if token_shaped(token) else None


# The SQL, per database.


@dataclass(frozen=True, slots=True)
class _Statements:
    insert: str
    resolve: str
    live_digest: str
    rotate: str


@cache
def _statements(names: TableNames, locations: str, postgres: bool, keyed: bool) -> _Statements:
    def mark(name: str) -> str:
        return f"%({name})s" if postgres else f":{name}"

    columns: tuple[str, ...] = ("address_id", "execution_id", "token_hash", "inserted_at")
    if keyed:
        columns = ("id", *columns)
    return _Statements(
        insert=(
            f"INSERT INTO {locations} ({', '.join(columns)}) VALUES "
            f"({', '.join(mark(c) for c in columns)})"
        ),
        # The execution id must match too: where the reference is not enforced
        # (SQLite), a reaped address's id may come back naming another execution.
        resolve=(
            "SELECT a.id, a.scope, a.document, a.key, a.execution_id, a.terminal_seen_at "
            f"FROM {locations} AS l JOIN {names.addresses} AS a ON a.id = l.address_id "
            f"AND a.execution_id = l.execution_id WHERE l.token_hash = {mark('digest')}"
            + (" FOR SHARE OF l" if postgres else "")
        ),
        live_digest=(
            f"SELECT token_hash FROM {locations} WHERE execution_id = {mark('execution_id')}"
        ),
        rotate=(
            f"UPDATE {locations} SET token_hash = {mark('digest')} "
            f"WHERE execution_id = {mark('execution_id')}"
        ),
    )


class _Session:
    """The statements on one router transaction's driver connection."""

    __slots__ = ("_driver", "_key", "_s", "postgres")

    def __init__(self, unit: Unit) -> None:
        tables: Tables = unit.tx.adapter.tables
        options = tables.options
        schema = f"{options.schema}." if options.schema else ""
        self.postgres = unit.tx.adapter.dialect.name == "postgresql"
        self._driver = unit.tx.driver
        self._key = options.key_default
        self._s = _statements(
            TableNames.of(tables),
            f"{schema}{options.name('locations')}",
            self.postgres,
            self._key is not None,
        )

    async def _run(self, sql: str, values: Mapping[str, Any]) -> tuple[list[Any], int]:
        if self.postgres:
            cursor = await self._driver.execute(sql, values)
            rows = await cursor.fetchall() if cursor.description is not None else []
            return rows, int(cursor.rowcount)
        cursor = self._driver.execute(sql, values)
        return cursor.fetchall(), int(cursor.rowcount)

    async def insert(self, address_id: Any, execution_id: str, digest: str, now: datetime) -> None:
        values: dict[str, Any] = {
            "address_id": address_id,
            "execution_id": execution_id,
            "token_hash": digest,
            "inserted_at": now if self.postgres else utc_text(now),
        }
        if self._key is not None:
            values["id"] = self._key() if self.postgres else self._key().hex
        await self._run(self._s.insert, values)

    async def resolve(self, digest: str) -> Located | None:
        rows, _ = await self._run(self._s.resolve, {"digest": digest})
        if not rows:
            return None
        address_id, scope, document, key, execution_id, seen = rows[0]
        ended = seen if self.postgres else utc_time(seen)
        return Located(address_id, scope, document, key, execution_id, ended is not None)

    async def live_digest(self, execution_id: str) -> str | None:
        rows, _ = await self._run(self._s.live_digest, {"execution_id": execution_id})
        return str(rows[0][0]) if rows else None

    async def rotate(self, execution_id: str, digest: str) -> bool:
        values = {"execution_id": execution_id, "digest": digest}
        _, count = await self._run(self._s.rotate, values)
        return count > 0
