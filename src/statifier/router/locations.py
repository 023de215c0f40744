"""BasicHTTP locations of durable executions: a bearer token per execution, kept as its
hash.

With ``RouterConfig(basichttp=BasicHttpLocations(base_url=...))``, each execution the
router creates under a new address row gets a location, ``<base_url>/<token>``: the
token is 32 bytes from :mod:`secrets` (43 URL-safe characters), never derived from the
execution id, then a dot and the execution's bucket in three hex digits
(:func:`statifier.buckets.bucket_of`), so that over several stores a post goes to the
one store that holds it (:func:`token_bucket`; a token minted before it carried its
bucket is 43 characters and still reaches its execution). The location is written
into the execution's ``_ioprocessors`` under ``basichttp`` (and the processor's type
URI) when it starts, so the chart can hand it on; the router's ``locations`` table
keeps the SHA-256 of the token, so the table alone tells which execution a posted
token reaches and never which token reaches an execution. An execution created
under ``always_new`` has no address row and no location.

:meth:`Router.rotate_location <statifier.router.Router.rotate_location>` replaces the
token; the old one then reaches nothing (:func:`rotate_location_in` does it inside a
router transaction the caller holds). The chart's own copy is written once, at the
start, and is not rotated. :meth:`~statifier.router.Router.location` returns the
location the chart holds while it is still the live one; after a rotation the live
location exists only in the rotation's answer.

A location is a capability: whoever holds it can post events to the execution. The
position of an execution carries the first token in the clear (the chart reads it
there), so it is as secret as the positions are; rotate a location that may have
leaked. The table needs its opt-in migration,
:func:`statifier.sql.locations.upgrade_locations`; its statements are
:class:`statifier.sql.locations.LocationTable`'s, and this module says what a row means.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from functools import cache
from typing import Any, Final

from statifier.buckets import bucket_of
from statifier.core import StartOptions
from statifier.core.positions import NotAPosition
from statifier.persistence import ExecutionNotFound
from statifier.router.config import BASICHTTP_TYPES, BasicHttpLocations
from statifier.router.errors import ConfigError, RouterError
from statifier.router.transaction import Unit
from statifier.sql.dialect import Dialect
from statifier.sql.locations import LocationTable
from statifier.sql.tables import Tables

__all__ = [
    "Located",
    "LocationRotated",
    "NoLocation",
    "location_in",
    "mint_token",
    "resolve",
    "rotate_location_in",
    "start_options",
    "token_bucket",
    "token_digest",
    "token_shaped",
]

TOKEN_BYTES: Final = 32
"""A token's entropy: 256 bits."""
PROCESSOR: Final = "basichttp"
"""The ``_ioprocessors`` entry the chart reads its location at."""

_TOKEN: Final = re.compile(r"[A-Za-z0-9_-]{43}(?:\.([0-3][0-9a-f]{2}))?")
"""43 URL-safe characters, then (since tokens carry their bucket) a dot and the
bucket in three hex digits, below 1,024."""


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


class LocationRotated(RouterError, LookupError):  # noqa: N818 - names the finding
    """The execution's location was rotated. The router keeps only the live token's
    hash, so the live location was in :func:`rotate_location_in`'s return value and is
    nowhere else; the chart's copy reaches nothing. Rotate again to get one to hand
    out."""

    def __init__(self, execution_id: str) -> None:
        super().__init__(
            f"execution {execution_id!r} has a rotated BasicHTTP location: only its hash "
            "is kept, so the live one is the location the rotation returned; rotate "
            "again for a new one"
        )
        self.execution_id = execution_id


def mint_token(execution_id: str) -> str:
    """A new token for ``execution_id``: 256 random bits, URL-safe base64 without
    padding (43 characters), a dot and the execution's bucket (three hex digits).

    >>> token = mint_token("order-17")
    >>> len(token), token_bucket(token) == bucket_of("order-17")
    (47, True)
    """
    return f"{secrets.token_urlsafe(TOKEN_BYTES)}.{bucket_of(execution_id):03x}"


def token_bucket(token: str) -> int | None:
    """The bucket ``token`` carries: its execution's, which says which store holds
    it; ``None`` for a token minted before tokens carried it, or not shaped as one.

    >>> token_bucket("A" * 43 + ".3ff"), token_bucket("A" * 43)
    (1023, None)
    """
    shaped = _TOKEN.fullmatch(token)
    return None if shaped is None or shaped[1] is None else int(shaped[1], 16)


def token_digest(token: str) -> str:
    """What the table keeps of ``token``: its SHA-256, lowercase hex."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def token_shaped(token: str) -> bool:
    """Whether ``token`` could be one :func:`mint_token` made (the front answers 404 to
    anything else without reading the table).

    >>> token_shaped(mint_token("ex_1")), token_shaped("A" * 43), token_shaped("ex_01J")
    (True, True, False)
    """
    return _TOKEN.fullmatch(token) is not None


async def location_in(unit: Unit, execution_id: str) -> str | None:
    """The live location of ``execution_id`` (on the configuration's current base
    URL), read in ``unit``: the one its chart holds, unless it was rotated.

    Returns ``None`` when the execution has no location, and when its position is gone
    (pruned after it ended, or deleted; its location answers 404 then anyway).

    Raises:
        ConfigError: the configuration has no ``basichttp``.
        LocationRotated: the location was rotated: the router keeps only the token's
            hash, so the live location is the one :func:`rotate_location_in` returned,
            and nowhere else.
    """
    settings = _settings(unit.config.basichttp)
    live = await _table(unit).token_hash(unit.tx.driver, execution_id)
    if live is None:
        return None
    storage = unit.storage
    try:
        record = await storage.fetch_execution(execution_id)
        state = storage.load(record, await storage.machine(record.content_hash))
    except (ExecutionNotFound, NotAPosition):
        return None
    token = _chart_token(state.datamodel.get("_ioprocessors"))
    if token is None or not secrets.compare_digest(token_digest(token), live):
        # A location row whose hash is not the chart's token was rotated: the chart's
        # copy is the only token the router ever held in the clear.
        raise LocationRotated(execution_id)
    return settings.location(token)


async def rotate_location_in(unit: Unit, execution_id: str) -> str:
    """Give ``execution_id`` a new location in ``unit`` and answer it, so that what
    the caller writes beside it commits or rolls back with the rotation. The old
    location reaches nothing from ``unit``'s commit on; if ``unit`` rolls back, the old
    one stays live and the location returned reaches nothing. The chart's
    ``_ioprocessors`` still holds the first one.

    Raises:
        ConfigError: the configuration has no ``basichttp``.
        NoLocation: the execution has no location to replace (nothing was written).
    """
    settings = _settings(unit.config.basichttp)
    token = mint_token(execution_id)
    if not await _table(unit).rotate(unit.tx.driver, execution_id, token_digest(token)):
        raise NoLocation(execution_id)
    return settings.location(token)


# Inside a router transaction: the create path and the front.


async def start_options(
    unit: Unit, address_id: Any, execution_id: str, now: datetime
) -> StartOptions:
    """The start options of a new execution: the unit's, and, when the configuration
    has ``basichttp`` and the execution an address row (``address_id``), a location of
    its own, recorded in ``unit`` and written into ``_ioprocessors``."""
    options = unit.start_options
    settings = unit.config.basichttp
    if settings is None or address_id is None:
        return options
    token = mint_token(execution_id)
    await _table(unit).insert(
        unit.tx.driver,
        address_id=address_id,
        execution_id=execution_id,
        token_hash=token_digest(token),
        inserted_at=now,
    )
    entry = {"location": settings.location(token)}
    hosted = options.datamodel.get("_ioprocessors")
    processors: dict[str, Any] = dict(hosted) if isinstance(hosted, Mapping) else {}
    processors.update(dict.fromkeys(BASICHTTP_TYPES, entry))
    return replace(options, datamodel={**options.datamodel, "_ioprocessors": processors})


async def resolve(unit: Unit, token: str) -> Located | None:
    """The execution ``token`` reaches, read in ``unit`` (where the database locks rows,
    PostgreSQL, the location row is held against a rotation until the commit), or
    ``None``."""
    row = await _table(unit).resolve(unit.tx.driver, token_digest(token))
    if row is None:
        return None
    return Located(
        row.address_id,
        row.scope,
        row.document,
        row.key,
        row.execution_id,
        row.terminal_seen_at is not None,
    )


def _settings(settings: BasicHttpLocations | None) -> BasicHttpLocations:
    if settings is None:
        raise ConfigError("the configuration has no basichttp: executions have no location")
    return settings


def _chart_token(processors: object) -> str | None:
    """The token of the location a chart's ``_ioprocessors`` names, if any."""
    entry = processors.get(PROCESSOR) if isinstance(processors, Mapping) else None
    named = entry.get("location") if isinstance(entry, Mapping) else None
    if not isinstance(named, str):
        return None
    token = named.rpartition("/")[2]
    return token if token_shaped(token) else None


# The table, made once per set of tables and database.


@cache
def _made(tables: Tables, dialect: Dialect) -> LocationTable:
    return LocationTable(tables, dialect)


def _table(unit: Unit) -> LocationTable:
    adapter = unit.tx.adapter
    return _made(adapter.tables, adapter.dialect)
