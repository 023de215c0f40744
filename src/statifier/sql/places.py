"""Which place a database holds in the list of stores a deployment runs on
(decision 0127).

Over K stores (``[database] shards``) the i-th store listed holds the i-th even range
of the buckets, and every row of a key lies where that list put it. A process started
with the list reordered, a store left out, or one added without ``statifier reshard``
would look for keys in stores that do not hold them: an execution would seem missing
and be created a second time elsewhere. So each store records, in its ``store_place``
table, the place it holds, of how many stores, and its state:

- ``serving``: a process claimed the place (:func:`claim_place`, which ``statifier
  serve`` calls for each store as it prepares it: one database on its own is place 0
  of 1). A store without a record takes the place it is given; a store whose record
  says another place, or another state, is refused with :class:`PlaceMismatch`.
- ``moving``: ``statifier reshard`` is moving buckets to or from it (or a reshard was
  cut short: running it again, with the same lists of stores, finishes it). The record
  names the reshard (:func:`reshard_name`), and a reshard with other lists is refused
  until that one is finished.
- ``retired``: a reshard moved every bucket of it to the other stores.

A store is known by a random name it holds (:func:`store_identity`), not by the URL
that reaches it: two URLs that reach one database (``localhost`` and ``127.0.0.1``, a
path written two ways) are one store.

``statifier reshard`` checks that the ``--from`` stores hold the places it is told
(:func:`reshard_refusal`; a store without a record is taken at its word), marks every
store it touches ``moving`` before it moves a row (:func:`resharding`), and once every
range moved marks the ``--to`` stores ``serving`` in their new places and the stores
left out ``retired`` (:func:`resharded`).

A running service checks its stores' records every :data:`SEEN_EVERY` seconds
(:func:`check_and_say_seen`): while each holds its place it says so (``seen_at``), and
once one does not (a reshard marked it ``moving``) the service stops. ``statifier
reshard`` refuses stores a service said it serves within :data:`RUNNING_FOR` seconds
(:func:`serving_since`). Its readiness probe reads the records too
(:func:`read_place_async`, :func:`trouble`).

>>> import sqlalchemy as sa, os, tempfile
>>> from datetime import UTC, datetime
>>> from statifier.sql import TableOptions, migrations
>>> url = f"sqlite:///{os.path.join(tempfile.mkdtemp(), 'places.db')}"
>>> options = TableOptions()
>>> migrations.upgrade(url, options)
>>> engine = sa.create_engine(url)
>>> now = datetime(2026, 12, 6, tzinfo=UTC)
>>> with engine.begin() as connection:
...     claim_place(connection, options, Place.serving(1, 3), now)
...     read_place(connection, options)
Place(place=1, stores=3, state='serving', reshard=None)
>>> with engine.begin() as connection:
...     claim_place(connection, options, Place.serving(0, 3), now)
Traceback (most recent call last):
...
statifier.sql.places.PlaceMismatch: store 0 of 3 holds place 1 of 3: ...
>>> engine.dispose()
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

import sqlalchemy as sa

from statifier.sql.dialect import Dialect
from statifier.sql.tables import TableOptions

__all__ = [
    "RUNNING_FOR",
    "SEEN_EVERY",
    "Place",
    "PlaceMismatch",
    "check_and_say_seen",
    "claim_place",
    "read_place",
    "read_place_async",
    "refusal",
    "reshard_name",
    "reshard_refusal",
    "resharded",
    "resharding",
    "serving_since",
    "store_identity",
    "trouble",
    "write_place",
]

State = Literal["serving", "moving", "retired"]


@dataclass(frozen=True, slots=True)
class Place:
    """A store's record: its ``place`` (0 for the first) among ``stores`` stores, and
    its ``state``. A store ``moving`` keeps the place it had, and names the reshard
    that moves it (``reshard``, :func:`reshard_name`; ``None`` in a record written
    before records named it); a ``retired`` one has no place (``None``)."""

    place: int | None
    stores: int | None
    state: State
    reshard: str | None = None

    @classmethod
    def serving(cls, place: int, stores: int) -> Place:
        """Place ``place`` of ``stores``, serving.

        Raises:
            ValueError: ``place`` is not one of ``stores`` places.
        """
        if not 0 <= place < stores:
            raise ValueError(f"place {place} is not one of {stores} stores")
        return cls(place, stores, "serving")


class PlaceMismatch(ValueError):  # noqa: N818 - names the refusal
    """A store's record says another place, or that a reshard is moving or moved its
    buckets. The message says which store, what it holds and what to do."""


def _table(options: TableOptions) -> str:
    name = options.name("store_place")
    return f"{options.schema}.{name}" if options.schema else name


def read_place(connection: sa.Connection, options: TableOptions) -> Place | None:
    """The store's record, ``None`` when it has none.

    Raises:
        PlaceMismatch: the store holds two different records (two processes that
            claimed different places at the same moment).
    """
    rows = connection.execute(sa.text(_reading(options))).all()
    return _only([tuple(row) for row in rows])


def _reading(options: TableOptions) -> str:
    return f"SELECT DISTINCT place, stores, state, reshard FROM {_table(options)}"


def _only(rows: list[tuple[Any, ...]]) -> Place | None:
    """The record the rows of :func:`_reading` hold.

    Raises:
        PlaceMismatch: they hold two different records.
    """
    if not rows:
        return None
    if len(rows) > 1:
        found = ", ".join(str(Place(*row)) for row in rows)
        raise PlaceMismatch(f"the store holds several records of its place: {found}")
    place, stores, state, reshard = rows[0]
    return Place(place, stores, state, reshard)


def write_place(
    connection: sa.Connection, options: TableOptions, place: Place, now: datetime
) -> None:
    """Make ``place`` the store's record, in ``connection``'s transaction."""
    # The table as the package defines it, so the time is stored as every time is.
    table = options.define().store_place
    values: dict[str, Any] = {
        "place": place.place,
        "stores": place.stores,
        "state": place.state,
        "reshard": place.reshard,
        "changed_at": now,
    }
    if options.new_key is not None:  # a UUID key made on the client
        values["id"] = options.new_key()
    connection.execute(table.delete())
    connection.execute(table.insert().values(values))


def refusal(found: Place | None, given: Place) -> str | None:
    """Why a store whose record is ``found`` may not be used as ``given`` (a serving
    place), or ``None`` when it may: it has no record, or the same one."""
    if found is None or found == given:
        return None
    where = f"store {given.place} of {given.stores}"
    if found.state == "moving":
        return (
            f"{where}: statifier reshard is moving its buckets, or a reshard was cut "
            "short: run the same statifier reshard again to the end, then start the "
            "processes on its --to stores"
        )
    if found.state == "retired":
        return (
            f"{where}: statifier reshard moved every bucket of it to the other stores: "
            "leave it out of the list"
        )
    return (
        f"{where} holds place {found.place} of {found.stores}: the list of stores "
        "changed without statifier reshard. List the stores as before, or move the "
        "buckets to the new list with statifier reshard --from ... --to ..."
    )


def trouble(found: Place | None, given: Place) -> str | None:
    """:func:`refusal` as a short phrase, for a readiness reason: why a store whose
    record is ``found`` is not the store ``given`` (``None``: it is, or has no
    record)."""
    if found is None or found == given:
        return None
    if found.state == "moving":
        return "statifier reshard is moving its buckets"
    if found.state == "retired":
        return "statifier reshard moved its buckets away"
    return f"it holds place {found.place} of {found.stores}, not {given.place} of {given.stores}"


async def read_place_async(dialect: Dialect, driver: Any, options: TableOptions) -> Place | None:
    """:func:`read_place` in the transaction ``driver`` runs (a storage transaction's
    driver, on ``dialect``'s database): the readiness probe's read.

    Raises:
        PlaceMismatch: the store holds two different records.
    """
    return _only(await dialect.rows(driver, dialect.statement(_reading(options))))


def store_identity(connection: sa.Connection, options: TableOptions) -> str:
    """The random name the store is known by, whatever URL reaches it: made by the
    revision that makes its table (``statifier_0028``), or here, in ``connection``'s
    transaction, for tables built by hand and stamped without it."""
    table = options.define().store_identity
    found = connection.execute(sa.select(sa.func.min(table.c.identity))).scalar()
    if found is not None:
        return str(found)
    values: dict[str, Any] = {"identity": uuid.uuid4().hex}
    if options.new_key is not None:  # a UUID key made on the client
        values["id"] = options.new_key()
    connection.execute(table.insert().values(values))
    return str(values["identity"])


def reshard_name(sources: Sequence[str], targets: Sequence[str]) -> str:
    """The name of a reshard from the stores ``sources`` to ``targets`` (each store's
    :func:`store_identity`, in list order): the same lists, the same name.

    >>> reshard_name(["a"], ["a", "b"]) == reshard_name(["a"], ["a", "b"])
    True
    >>> reshard_name(["a"], ["a", "b"]) == reshard_name(["a"], ["a", "c"])
    False
    """
    said = "\n".join(["from", *sources, "to", *targets])
    return hashlib.blake2b(said.encode(), digest_size=16).hexdigest()


def resharding(before: int | None, sources: int, reshard: str | None = None) -> Place:
    """A store's record while the reshard named ``reshard`` moves buckets: ``moving``,
    keeping its place ``before`` among the ``sources`` stores (``None``: a store the
    reshard adds)."""
    return Place(before, None if before is None else sources, "moving", reshard)


def resharded(after: int | None, targets: int) -> Place:
    """A store's record once a reshard is done: serving at ``after`` of ``targets``,
    or retired when the reshard left it out (``None``)."""
    return Place(None, None, "retired") if after is None else Place.serving(after, targets)


def reshard_refusal(
    stores: Sequence[tuple[int | None, int | None, Place | None]],
    sources: int,
    targets: int,
    *,
    reshard: str,
) -> str | None:
    """Why the reshard named ``reshard`` (:func:`reshard_name`) from ``sources`` stores
    to ``targets`` may not begin, given each store it names once as ``(place before,
    place after, record)`` (a place ``None`` where the store is not in that list);
    ``None`` when it may.

    It may not when a store is ``moving`` for another reshard (one cut short, with
    other lists of stores: rows it moved may lie in a store this one does not name),
    when a store of the list before records another place than its place there, or
    that a reshard retired it, nor when a store it adds serves another list already. A
    store without a record is taken at its word. A reshard cut short may begin again:
    each of its stores is ``moving`` or records what the reshard leaves it (all of
    them may: only the last line was missing).

    >>> reshard_refusal([(0, 0, Place.serving(0, 2)), (None, 1, None)], 1, 2, reshard="r")
    '--from store 0 of 1 holds place 0 of 2: the list of stores changed ...'
    >>> reshard_refusal([(0, 0, Place.serving(0, 1)), (None, 1, None)], 1, 2, reshard="r")
    >>> reshard_refusal([(0, 0, resharding(0, 1, "q")), (None, 1, None)], 1, 2, reshard="r")
    '--from store 0 is moving for another reshard, with other lists of stores, ...'
    """
    for before, after, found in stores:
        if found is not None and found.state == "moving" and found.reshard not in (None, reshard):
            where = f"--from store {before}" if before is not None else f"--to store {after}"
            return (
                f"{where} is moving for another reshard, with other lists of stores, that "
                "was cut short: run that one again with its --from and --to to its end "
                "(rows it moved may lie in stores this one does not name), then this one"
            )
    done = [found == resharded(after, targets) for _, after, found in stores]
    moving = [found is not None and found.state == "moving" for _, _, found in stores]
    resumed = all(a or b for a, b in zip(done, moving, strict=True))
    for (before, after, found), left in zip(stores, done, strict=True):
        if found is None or found.state == "moving" or (left and resumed):
            continue
        if before is not None:
            said = refusal(found, Place.serving(before, sources))
            if said is not None:
                return f"--from {said}"
        elif found.state == "serving":
            return (
                f"--to store {after} serves already, as place {found.place} of "
                f"{found.stores} of another list of stores: name a store of no deployment"
            )
    return None


SEEN_EVERY: Final = 2.0
"""Seconds between a running service's checks of its stores' records
(:func:`check_and_say_seen`); each check that finds its place says it serves the
store (``seen_at``)."""

RUNNING_FOR: Final = 3 * SEEN_EVERY
"""A store whose record a service said it serves within this many seconds has a
service running on it: :func:`serving_since` and ``statifier reshard`` go by it."""


async def check_and_say_seen(
    dialect: Dialect, driver: Any, options: TableOptions, place: Place, now: datetime
) -> str | None:
    """A running service's check of one store, in the transaction ``driver`` runs: why
    the store is not ``place`` any more (:func:`trouble`), or ``None`` and the record's
    ``seen_at`` set to ``now``.

    Raises:
        PlaceMismatch: the store holds two different records.
    """
    said = trouble(await read_place_async(dialect, driver, options), place)
    if said is None:
        statement = dialect.statement(f"UPDATE {_table(options)} SET seen_at = :now")
        await dialect.execute(driver, statement, {"now": dialect.time(now)})
    return said


def serving_since(connection: sa.Connection, options: TableOptions, now: datetime) -> float | None:
    """How many seconds ago a service last said it serves the store, when that is
    within :data:`RUNNING_FOR` (``None``: no service runs on it, as far as its record
    tells). Clocks a few seconds apart shift the answer by as much."""
    table = options.define().store_place
    seen = connection.execute(sa.select(sa.func.max(table.c.seen_at))).scalar()
    if seen is None:
        return None
    ago = (now - seen).total_seconds()
    return ago if ago < RUNNING_FOR else None


def claim_place(
    connection: sa.Connection, options: TableOptions, place: Place, now: datetime
) -> None:
    """Record ``place`` (a serving place) in a store without a record; accept a store
    whose record is the same; refuse any other, in ``connection``'s transaction.

    Raises:
        PlaceMismatch: the store's record says another place, or a reshard is moving
            its buckets, or moved them all away (:func:`refusal` says it).
    """
    found = read_place(connection, options)
    said = refusal(found, place)
    if said is not None:
        raise PlaceMismatch(said)
    if found is None:
        write_place(connection, options, place, now)
