"""The tables of durable executions and of the event router, as SQLAlchemy Core
metadata.

- ``charts``: chart sources under their content hash (a retired chart keeps its row,
  without its source).
- ``positions``: positions a host saved under keys of its own.
- ``executions``: one row per durable execution: status, position, metadata, outcome.
- ``inputs``: the input log, one row per event, dense ``seq`` per execution.
- ``step_errors``: the error events steps raised, each with its step.
- ``addresses``: which execution a ``(scope, document, key)`` names.
- ``dedupe``: the messages each binding has claimed, until ``expires_at``.
- ``routing_ledger``: what happened to each routed event, per binding.
- ``timers``: delayed sends of durable executions waiting for their due time.
- ``outbox``: what routes handed off, waiting for (or done with) the drain.
- ``subscriptions``: which executions a source invoke subscribed to which binding.
- ``inbound_events``: events a host appended for the stream consumer, by partition and
  position.
- ``consumer_positions``: how far each consumer group has committed each partition.
- ``consumer_dead_letters``: messages a stream consumer gave up on, with the reason.
- ``partition_leases``: which member of a consumer group holds which partition.
- ``consumer_members``: the members of each consumer group, while they are alive.
- ``child_answers``: what each ended durable child owes its parent, and whether it
  was delivered.
- ``fan_out_ends``: the fan-outs that have answered their parent, one row each.
- ``console_audit``: the actions operators took in the console, who and when.
- ``held_events``: the events a paused execution was sent, in order, until it resumes.
- ``bulk_runs``: the bulk actions operators started: what, over which executions, how
  far each has come.
- ``schedules``: the schedules that route an event at the times they name: each one's
  definition, whether it is paused, its next fire and what its last fires did.
- ``flow_groups``: the addresses a debounce, batch or throttle binding holds events
  for (or whose throttle window is open): how many, and when they are due.
- ``flow_events``: the events those bindings hold, in order, until they are delivered.
- ``active_slots``: the executions of capped documents that count against their cap.
- ``held_creates``: the events whose create a cap holds, in order, until a slot frees.
- ``locks``: one row per lock key a transaction held, where ``TableOptions.locks`` is
  ``"rows"`` (:mod:`statifier.sql.locks`); empty otherwise.
- ``store_place``: which place the database holds in the list of stores a deployment
  runs on, and whether a reshard is moving its buckets (:mod:`statifier.sql.places`).
- ``store_identity``: the random name a store is known by, whatever URL reaches it
  (:func:`statifier.sql.places.store_identity`).

Every table starts with a surrogate primary key ``id`` of the configured type, then
the host's leading columns, then the package's own (each row's insert and update
times first, where ``timestamps_position="leading"`` asks for them there). Names
carry a prefix and the tables may live in a schema of their own, so several hosts
(or test runs) share a database without meeting.

>>> tables = TableOptions(prefix="shop_").define()
>>> for table in tables.metadata.sorted_tables:
...     print(table.name)
shop_active_slots
shop_addresses
shop_bulk_runs
shop_charts
shop_child_answers
shop_console_audit
shop_consumer_dead_letters
shop_consumer_members
shop_consumer_positions
shop_dedupe
shop_executions
shop_fan_out_ends
shop_flow_events
shop_flow_groups
shop_held_creates
shop_held_events
shop_inbound_events
shop_inputs
shop_locks
shop_outbox
shop_partition_leases
shop_positions
shop_routing_ledger
shop_schedules
shop_step_errors
shop_store_identity
shop_store_place
shop_subscriptions
shop_timers
>>> [column.name for column in tables.inputs.columns]
['id', 'execution_id', 'seq', 'via', 'input_blob', 'recorded_at']
>>> TableOptions(prefix="Shop-")
Traceback (most recent call last):
...
ValueError: a table prefix is lowercase letters, digits and underscores...
>>> collated = {"execution_id": "C"}
>>> laid_out = TableOptions(timestamps_position="leading", column_collations=collated)
>>> [column.name for column in laid_out.define().addresses.columns]
['id', 'inserted_at', 'scope', 'document', 'key', 'execution_id', 'terminal_seen_at', 'bucket']
>>> laid_out.define().inputs.c.execution_id.type.collation
'C'

The migrations in :mod:`statifier.sql.migrations` build exactly these tables.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import cache
from types import MappingProxyType
from typing import Any, Final, Literal

import sqlalchemy as sa

from statifier.sql.types import UtcDateTime, json_document

__all__ = [
    "DEFAULT_PREFIX",
    "PARENT_METADATA_KEY",
    "TableOptions",
    "Tables",
    "UtcDateTime",
    "autogenerate_filter",
    "json_document",
]

DEFAULT_PREFIX: Final = "statifier_"
MAX_PREFIX_LENGTH: Final = 32
"""Short enough that every derived name (indexes, constraints, the migration version
table) stays inside PostgreSQL's 63-character identifiers."""

_PREFIX = re.compile(r"[a-z_][a-z0-9_]*")
_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_INTEGER_KEYS = (sa.Integer, sa.BigInteger, sa.SmallInteger)


_ONLY_ON: Final = "statifier_only_on"

PARENT_METADATA_KEY: Final = "statifier.parent"
"""The metadata key a durable child names its parent under
(:data:`statifier.persistence.PARENT_KEY`, the same text). The executions' insert copies
its value into the column ``parent``, indexed, so that a parent's children are found
without reading every execution's metadata (decision 0132)."""


def autogenerate_filter(dialect_name: str) -> Callable[..., bool]:
    """An ``include_object`` hook for Alembic's autogenerate on ``dialect_name``: it
    leaves out what these tables create only on another database (the GIN index on
    ``metadata`` exists on PostgreSQL only, and Alembic does not read ``ddl_if``).

    >>> tables = TableOptions().define()
    >>> index = next(i for i in tables.executions.indexes if i.name.endswith("metadata_idx"))
    >>> autogenerate_filter("sqlite")(index, index.name, "index", False, None)
    False
    >>> autogenerate_filter("postgresql")(index, index.name, "index", False, None)
    True
    """

    def include_object(item: Any, name: str | None, kind: str, reflected: bool, other: Any) -> bool:
        only_on = getattr(item, "info", {}).get(_ONLY_ON)
        return only_on is None or only_on == dialect_name

    return include_object


@dataclass(frozen=True, slots=True)
class TableOptions:
    """How the tables are named, keyed and laid out; the migrations take the same options.

    Attributes:
        prefix: prepended to every table, index and constraint name: lowercase letters,
            digits and underscores, at most 32 long (may be empty).
        schema: the schema the tables live in (PostgreSQL); ``None`` for the default.
        leading_columns: a function that makes the host's columns placed right after
            ``id`` in every table, in order (``None``: none). It is called for every
            table and must make new :class:`sqlalchemy.Column` objects on every call,
            since a column belongs to one table. The package never reads or writes
            them, so give them a default or make them nullable. A name that a table
            the migrations create declares (``id`` included) is refused.
        key_type: the type of the surrogate key ``id``: an integer type
            (autoincrementing), :class:`sqlalchemy.Uuid` (a random UUID made on insert,
            or the database's ``key_default``), or a text type (:class:`sqlalchemy.Text`,
            :class:`sqlalchemy.String`), which needs ``key_default``.
        key_default: the SQL the database fills a new ``id`` in with, as
            :func:`sqlalchemy.text` (``sa.text("gen_random_uuid()::text")`` on
            PostgreSQL, ``sa.text("(lower(hex(randomblob(16))))")`` on SQLite): the
            column's server default. With it, inserts name no ``id`` and read the new
            key back from the database. For UUID and text keys; ``None``: integer keys
            autoincrement and UUID keys are made on the client.
        timestamps_position: ``"trailing"`` (the default, the layout the package has
            always built) leaves each row's insert and update times (:data:`TIMESTAMPS`)
            where the table declares them; ``"leading"`` puts them right after the
            leading columns (after ``id`` when there are none), in the order declared.
            A column a later revision adds to a table lands at the end either way.
        column_collations: ``{column: collation}`` for the package's text columns:
            every table that declares the column declares it with that collation
            (PostgreSQL: any collation the database knows, such as ``"C"``; SQLite:
            ``BINARY``, ``NOCASE`` or ``RTRIM``, others are refused when migrating). A
            column of the host's own takes its collation in its own type
            (``sa.Text(collation="C")``).
        locks: how a PostgreSQL transaction holds a lock key (an execution's, an
            address's, a dedupe claim's...) until it ends: ``"advisory"`` (the default:
            PostgreSQL's transaction-scoped advisory locks) or ``"rows"`` (a row of the
            ``locks`` table per key, locked with ``FOR UPDATE``, ``FOR SHARE`` and
            ``SKIP LOCKED``: for a database that does not honour advisory locks across
            its nodes). Every process on the same tables must use the same; SQLite
            needs neither (its single writer excludes the others).

    Every option but ``prefix``, ``schema`` and ``locks`` shapes a table when it is
    created: a table that already exists keeps the layout it has. Left out, the options build
    the tables the package has always built.

    Raises:
        ValueError: a prefix or schema that is not a plain identifier; a leading
            column named like a column a table of the migrations declares (the message
            names the column and those tables), named twice, or made again by the next
            call; an unsupported key type, a text key without ``key_default`` or an
            integer key with one; a ``timestamps_position`` other than the two; a
            ``column_collations`` name that is not a text column of the package's (the
            message lists them) or a collation that is not a non-empty string;
            ``locks`` other than the two.
        TypeError: a prefix that is not a string, ``leading_columns`` that is not
            callable, a ``key_default`` that is not :func:`sqlalchemy.text`, or
            ``column_collations`` that is not a mapping.
    """

    prefix: str = DEFAULT_PREFIX
    schema: str | None = None
    leading_columns: Callable[[], Sequence[sa.Column[Any]]] | None = None
    key_type: type[sa.types.TypeEngine[Any]] | sa.types.TypeEngine[Any] = sa.BigInteger
    key_default: sa.TextClause | None = None
    timestamps_position: Literal["trailing", "leading"] = "trailing"
    # Kept out of the hash (a mapping has none); compared like the other fields.
    column_collations: Mapping[str, str] = field(default_factory=dict, hash=False)
    locks: Literal["advisory", "rows"] = "advisory"

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str):
            raise TypeError(f"a table prefix is a str, not {self.prefix!r}")
        if self.prefix and (
            len(self.prefix) > MAX_PREFIX_LENGTH or not _PREFIX.fullmatch(self.prefix)
        ):
            raise ValueError(
                "a table prefix is lowercase letters, digits and underscores, starting "
                f"with a letter or underscore, at most {MAX_PREFIX_LENGTH} long; got "
                f"{self.prefix!r}"
            )
        if self.schema is not None and not _SCHEMA.fullmatch(self.schema):
            raise ValueError(
                "a schema name is lowercase letters, digits and underscores, starting with "
                f"a letter or underscore, at most 63 long; got {self.schema!r}"
            )
        if self.leading_columns is not None and not callable(self.leading_columns):
            raise TypeError(
                "leading_columns is a function that makes new columns, "
                f"not {self.leading_columns!r}"
            )
        self._check_leading()
        self._check_key()
        if self.timestamps_position not in ("trailing", "leading"):
            raise ValueError(
                f'timestamps_position is "trailing" or "leading", not {self.timestamps_position!r}'
            )
        self._check_collations()
        if self.locks not in ("advisory", "rows"):
            raise ValueError(f'locks is "advisory" or "rows", not {self.locks!r}')

    def _check_leading(self) -> None:
        given: tuple[object, ...] = tuple(self.leading())
        named: set[str] = set()
        for column in given:
            if not isinstance(column, sa.Column):
                raise ValueError(f"a leading column is a sqlalchemy.Column, not {column!r}")
            if column.name == "id":
                raise ValueError(
                    "a leading column needs a name of its own: 'id' is every table's key"
                )
            declared = _declared_by(column.name)
            if declared:
                tables = ", ".join(self.name(table) for table in declared)
                raise ValueError(
                    f"a leading column needs a name of its own: {column.name!r} is "
                    f"declared by {tables}"
                )
            if column.name in named:
                raise ValueError(f"a leading column needs a name of its own: {column.name!r} twice")
            named.add(column.name)
        # Two calls that hand back the same object would fail later, when the second
        # table is defined; say so here, where the options are made.
        if any(again is first for again, first in zip(self.leading(), given, strict=False)):
            raise ValueError("leading_columns must make new columns on every call")

    def _check_key(self) -> None:
        key = self._key_instance()
        if isinstance(key, sa.Uuid) and not key.native_uuid:
            raise ValueError(
                "a UUID key is stored natively: sqlalchemy.Uuid(), not native_uuid=False"
            )
        if not isinstance(key, (*_INTEGER_KEYS, sa.Uuid, sa.String)):
            raise ValueError(
                f"the key type is an integer type, sqlalchemy.Uuid or a text type, not {key!r}"
            )
        default = self.key_default
        if default is not None and not isinstance(default, sa.TextClause):
            raise TypeError(
                "key_default is the SQL the database fills the key in with, as "
                f"sqlalchemy.text(...), not {default!r}"
            )
        if isinstance(key, _INTEGER_KEYS) and default is not None:
            raise ValueError("an integer key autoincrements: key_default is for a UUID or text key")
        if isinstance(key, sa.String) and not isinstance(key, sa.Uuid) and default is None:
            raise ValueError(
                "a text key is made by the database: give key_default, e.g. "
                'sqlalchemy.text("gen_random_uuid()::text")'
            )

    def _check_collations(self) -> None:
        given: object = self.column_collations
        if not isinstance(given, Mapping):
            raise TypeError(f"column_collations is a mapping of column to collation, not {given!r}")
        for column, collation in given.items():
            allowed = _text_columns()
            if column not in allowed:
                raise ValueError(
                    f"column_collations: {column!r} is not a text column of the package's; "
                    f"the text columns are {', '.join(sorted(allowed))}"
                )
            if not isinstance(collation, str) or not collation:
                raise ValueError(
                    f"column_collations: the collation of {column!r} is a non-empty str, "
                    f"not {collation!r}"
                )
        # A copy no caller can change after the check.
        object.__setattr__(self, "column_collations", MappingProxyType(dict(given)))

    def __reduce__(self) -> tuple[Callable[[dict[str, Any]], TableOptions], tuple[Any, ...]]:
        """Pickled as the arguments that made it: its read-only copy of
        ``column_collations`` does not pickle as it is. (A ``leading_columns`` that is
        not a module-level function does not pickle at all.)"""
        given = {option.name: getattr(self, option.name) for option in fields(self)}
        given["column_collations"] = dict(self.column_collations)
        return _table_options, (given,)

    def _key_instance(self) -> sa.types.TypeEngine[Any]:
        key = self.key_type
        return key() if isinstance(key, type) else key

    @property
    def version_table(self) -> str:
        """The table Alembic records this package's migration revision in (apart from a
        host's own ``alembic_version``)."""
        return f"{self.prefix}alembic_version"

    @property
    def new_key(self) -> Callable[[], Any] | None:
        """What makes a new ``id`` on the client: :func:`uuid.uuid4` for a UUID key
        without ``key_default``; ``None`` where the database makes it (an
        autoincrementing integer, or ``key_default``)."""
        made_here = self.key_kind == "uuid" and self.key_default is None
        return uuid.uuid4 if made_here else None

    @property
    def key_kind(self) -> Literal["integer", "uuid", "text"]:
        """What the key type is: an integer, a UUID or text."""
        key = self._key_instance()
        if isinstance(key, _INTEGER_KEYS):
            return "integer"
        return "uuid" if isinstance(key, sa.Uuid) else "text"

    def key_from_text(self, text: str) -> int | uuid.UUID | str:
        """A key as text carries it (a URL, a cursor), back in the key type: an
        integer, a :class:`uuid.UUID`, or the text itself for a text key.

        >>> TableOptions().key_from_text("12")
        12

        Raises:
            ValueError: ``text`` is not a key of that type.
        """
        kind = self.key_kind
        if kind == "integer":
            return int(text)
        return uuid.UUID(text) if kind == "uuid" else text

    def name(self, suffix: str) -> str:
        """The prefixed name of a table, index or constraint."""
        return f"{self.prefix}{suffix}"

    def key_column(self) -> sa.Column[Any]:
        """A fresh ``id`` column of the key type (SQLite autoincrements only an
        ``INTEGER PRIMARY KEY``, so every integer key is ``INTEGER`` there), with
        ``key_default`` as its server default when given."""
        key = self._key_instance()
        if isinstance(key, _INTEGER_KEYS):
            kind = key.with_variant(sa.Integer(), "sqlite")
            return sa.Column("id", kind, primary_key=True, autoincrement=True, nullable=False)
        return sa.Column(
            "id",
            key,
            primary_key=True,
            autoincrement=False,
            nullable=False,
            server_default=self.key_default,
        )

    def leading(self) -> list[sa.Column[Any]]:
        """The host's leading columns, new from :attr:`leading_columns` (a column
        belongs to one table)."""
        return [] if self.leading_columns is None else list(self.leading_columns())

    def collated(self, column: sa.Column[Any], named: str | None = None) -> sa.Column[Any]:
        """``column`` (new, not yet in a table) with the collation
        ``column_collations`` gives its name, if any: for a column a revision adds to
        a table that exists. ``named``: the name to look up instead, the one a later
        revision renames the column to (the options name columns as the tables have
        them at the head revision)."""
        collation = self.column_collations.get(column.name if named is None else named)
        if collation is not None and isinstance(column.type, sa.String):
            # The declaration's type, with the collation: a new instance, so that no
            # other column sharing the declared one changes with it.
            column.type = type(column.type)(column.type.length, collation=collation)
        return column

    def laid_out(self, table: str, *declared: Any) -> list[Any]:
        """The columns and constraints of a new table ``table`` whose package columns
        (and constraints, indexes) are ``declared``, in order: ``id``, the leading
        columns, then ``declared`` with the timestamps first when
        ``timestamps_position`` is ``"leading"``, each text column collated as
        ``column_collations`` says. What every table the package creates is built
        from, by :meth:`define` and by the migrations alike.

        Raises:
            ValueError: a leading column is named like a column ``table`` declares.
        """
        leading = self.leading()
        names = {item.name for item in declared if isinstance(item, sa.Column)}
        for column in leading:
            if column.name in names:
                raise ValueError(
                    f"a leading column needs a name of its own: {column.name!r} is "
                    f"declared by {table}"
                )
        items = [self.collated(item) if isinstance(item, sa.Column) else item for item in declared]
        if self.timestamps_position == "leading":
            first = [i for i in items if isinstance(i, sa.Column) and i.name in TIMESTAMPS]
            items = first + [item for item in items if not any(item is f for f in first)]
        return [self.key_column(), *leading, *items]

    def table(
        self, name: str, metadata: sa.MetaData, *declared: Any, schema: str | None
    ) -> sa.Table:
        """The table ``name`` in ``metadata``, laid out as :meth:`laid_out` says."""
        return sa.Table(name, metadata, *self.laid_out(name, *declared), schema=schema)

    def define(self, metadata: sa.MetaData | None = None) -> Tables:
        """The twenty-nine tables under these options, in ``metadata`` (a new one if ``None``).

        Raises:
            sqlalchemy.exc.InvalidRequestError: ``metadata`` already holds a table of
                the same name.
        """
        return _define(self, sa.MetaData() if metadata is None else metadata)


def _table_options(given: dict[str, Any]) -> TableOptions:
    """A :class:`TableOptions` made again from its pickled arguments."""
    return TableOptions(**given)


TIMESTAMPS: Final = ("inserted_at", "created_at", "updated_at")
"""The columns ``timestamps_position`` moves: each row's insert time (``inserted_at``;
``created_at`` in the executions and child answers tables) and its update time
(``updated_at``). The other times (``saved_at``, ``recorded_at``, ``due_at``, ...) say
when something happened to what the row holds, and stay where they are."""

SQLITE_COLLATIONS: Final = frozenset({"BINARY", "NOCASE", "RTRIM"})
"""The collations SQLite knows without an application's own."""


@cache
def _columns_declared() -> dict[str, tuple[str, ...]]:
    """Each column name the tables of :meth:`TableOptions.define` declare, with the
    tables (unprefixed) that declare it: what a leading column may not be named."""
    found: dict[str, list[str]] = {}
    for table in _define(TableOptions(prefix=""), sa.MetaData()).metadata.sorted_tables:
        for column in table.columns:
            found.setdefault(column.name, []).append(table.name)
    return {column: tuple(tables) for column, tables in found.items()}


_RENAMED_COLUMNS: Final = {"door": ("inputs", "step_errors"), "settled_at": ("settlements",)}
"""Columns the migrations create under an earlier name, which a later revision renames
(``statifier_0009``): a leading column may not take the earlier name either, or the
walk would fail at the revision that creates it."""


def _declared_by(column: str) -> tuple[str, ...]:
    return _columns_declared().get(column, ()) + _RENAMED_COLUMNS.get(column, ())


@cache
def _text_columns() -> frozenset[str]:
    """The package's text columns (``id`` aside): what ``column_collations`` takes."""
    tables = _define(TableOptions(prefix=""), sa.MetaData())
    return frozenset(
        column.name
        for table in tables.metadata.sorted_tables
        for column in table.columns
        if isinstance(column.type, sa.String) and column.name != "id"
    )


@dataclass(frozen=True, slots=True)
class Tables:
    """The twenty-nine tables of durable executions, of the event router, of its fronts and
    of the console, defined under one :class:`TableOptions`.

    Attributes:
        metadata: holds the tables.
        charts, positions, executions, inputs, step_errors: the tables of durable
            executions (see the module docstring).
        addresses, dedupe, routing_ledger, timers, outbox, subscriptions: the event
            router's tables (see the module docstring).
        inbound_events, consumer_positions, consumer_dead_letters, partition_leases,
            consumer_members: the stream consumer's tables (see the module docstring).
        child_answers, fan_out_ends: durable children's answers and the fan-outs
            closed (see the module docstring).
        console_audit: the console's audit trail.
        held_events: the events paused executions wait to take.
        bulk_runs: the bulk actions started, with their progress.
        schedules: the schedules, their next fires and their last.
        flow_groups, flow_events: what debounce, batch and throttle bindings hold.
        active_slots, held_creates: what caps count, and the creates they hold.
        options: what they were defined with.
    """

    metadata: sa.MetaData
    charts: sa.Table
    positions: sa.Table
    executions: sa.Table
    inputs: sa.Table
    addresses: sa.Table
    dedupe: sa.Table
    routing_ledger: sa.Table
    timers: sa.Table
    outbox: sa.Table
    subscriptions: sa.Table
    inbound_events: sa.Table
    consumer_positions: sa.Table
    consumer_dead_letters: sa.Table
    partition_leases: sa.Table
    consumer_members: sa.Table
    child_answers: sa.Table
    fan_out_ends: sa.Table
    console_audit: sa.Table
    step_errors: sa.Table
    held_events: sa.Table
    bulk_runs: sa.Table
    schedules: sa.Table
    flow_groups: sa.Table
    flow_events: sa.Table
    active_slots: sa.Table
    held_creates: sa.Table
    locks: sa.Table
    store_place: sa.Table
    store_identity: sa.Table
    options: TableOptions

    @classmethod
    def define(
        cls,
        prefix: str = DEFAULT_PREFIX,
        schema: str | None = None,
        leading_columns: Callable[[], Sequence[sa.Column[Any]]] | None = None,
        key_type: type[sa.types.TypeEngine[Any]] | sa.types.TypeEngine[Any] = sa.BigInteger,
        key_default: sa.TextClause | None = None,
        timestamps_position: Literal["trailing", "leading"] = "trailing",
        column_collations: Mapping[str, str] | None = None,
    ) -> Tables:
        """Shorthand for ``TableOptions(...).define()``.

        >>> Tables.define(prefix="app_").executions.name
        'app_executions'
        """
        return TableOptions(
            prefix,
            schema,
            leading_columns,
            key_type,
            key_default,
            timestamps_position,
            {} if column_collations is None else column_collations,
        ).define()


def _define(options: TableOptions, metadata: sa.MetaData) -> Tables:
    name = options.name
    schema = options.schema
    charts = options.table(
        name("charts"),
        metadata,
        sa.Column("content_hash", sa.Text(), nullable=False),
        sa.Column("chart_blob", sa.LargeBinary(), nullable=True),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column("version", sa.Text(), nullable=True),
        sa.Column("saved_at", UtcDateTime(), nullable=False),
        sa.Column("retired_at", UtcDateTime(), nullable=True),
        sa.Column("retired_by", sa.Text(), nullable=True),
        sa.UniqueConstraint("content_hash", name=name("charts_content_hash_key")),
        sa.Index(name("charts_name_idx"), "name"),
        schema=schema,
    )
    positions = options.table(
        name("positions"),
        metadata,
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("content_hash", sa.Text(), nullable=False),
        sa.Column("position_blob", sa.LargeBinary(), nullable=False),
        sa.Column("saved_at", UtcDateTime(), nullable=False),
        # The key's bucket (statifier.buckets.bucket_of): a move of a range of buckets
        # reads its range's positions by the index below. Last, where statifier_0024
        # added it.
        sa.Column("bucket", sa.SmallInteger(), nullable=False),
        sa.UniqueConstraint("key", name=name("positions_key_key")),
        sa.Index(name("positions_content_hash_idx"), "content_hash"),
        sa.Index(name("positions_bucket_key_idx"), "bucket", "key"),
        schema=schema,
    )
    executions = options.table(
        name("executions"),
        metadata,
        sa.Column("execution_id", sa.Text(), nullable=False),
        sa.Column("content_hash", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("position_blob", sa.LargeBinary(), nullable=True),
        sa.Column("metadata", json_document(), nullable=False),
        sa.Column("outcome_blob", sa.LargeBinary(), nullable=True),
        sa.Column("failure", sa.Text(), nullable=True),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.Column("ended_at", UtcDateTime(), nullable=True),
        sa.Column("error_count", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("last_error_at", UtcDateTime(), nullable=True),
        sa.Column("final_state", sa.Text(), nullable=True),
        # The execution's bucket (statifier.buckets.bucket_of: its root's), written at
        # the insert: the rows of a range of buckets are read by the index below, as
        # moving a range reads them (decision 0116). Last, where statifier_0022 added it.
        sa.Column("bucket", sa.SmallInteger(), nullable=False),
        # The parent its metadata names (PARENT_METADATA_KEY), written by the insert
        # from the metadata and never changed: cancelling an execution finds its
        # durable children by the index below. Last, where statifier_0029 added it.
        sa.Column("parent", sa.Text(), nullable=True),
        sa.UniqueConstraint("execution_id", name=name("executions_execution_id_key")),
        sa.Index(name("executions_bucket_execution_id_idx"), "bucket", "execution_id"),
        sa.Index(name("executions_content_hash_status_idx"), "content_hash", "status"),
        sa.Index(name("executions_ended_at_idx"), "ended_at"),
        *_console_execution_indexes(options),
        # The console's "errors" filter: executions whose steps raised, newest first.
        sa.Index(name("executions_last_error_at_idx"), "last_error_at", "execution_id"),
        sa.Index(name("executions_parent_idx"), "parent"),
        schema=schema,
    )
    sa.Index(
        name("executions_metadata_idx"),
        executions.c["metadata"],
        postgresql_using="gin",
        postgresql_ops={"metadata": "jsonb_path_ops"},
        info={_ONLY_ON: "postgresql"},
    ).ddl_if(dialect="postgresql")
    inputs = options.table(
        name("inputs"),
        metadata,
        sa.Column("execution_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("via", sa.Text(), nullable=False),
        sa.Column("input_blob", sa.LargeBinary(), nullable=True),
        sa.Column("recorded_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint("execution_id", "seq", name=name("inputs_execution_id_seq_key")),
        # The console's live probe: the newest input of any execution.
        sa.Index(name("inputs_recorded_at_idx"), "recorded_at"),
        schema=schema,
    )
    addresses = options.table(
        name("addresses"),
        metadata,
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("execution_id", sa.Text(), nullable=False),
        sa.Column("inserted_at", UtcDateTime(), nullable=False),
        sa.Column("terminal_seen_at", UtcDateTime(), nullable=True),
        # The address's bucket (statifier.buckets.address_bucket): the address reaper
        # given a range of buckets pages through its range by the index below. Last,
        # where statifier_0020 added it.
        sa.Column("bucket", sa.SmallInteger(), nullable=False),
        sa.UniqueConstraint(
            "scope", "document", "key", name=name("addresses_scope_document_key_key")
        ),
        sa.Index(name("addresses_execution_id_idx"), "execution_id"),
        sa.Index(name("addresses_key_idx"), "key"),
        sa.Index(name("addresses_bucket_id_idx"), "bucket", "id"),
        schema=schema,
    )
    dedupe = options.table(
        name("dedupe"),
        metadata,
        sa.Column("binding_id", sa.Text(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
        # The bucket of the address the claim was made for (decision 0122): a dedupe
        # reaper given a range of buckets deletes its range's expired claims by the
        # index below. Last, where statifier_0021 added it.
        sa.Column("bucket", sa.SmallInteger(), nullable=False),
        sa.UniqueConstraint(
            "binding_id", "message_id", name=name("dedupe_binding_id_message_id_key")
        ),
        sa.Index(name("dedupe_expires_at_idx"), "expires_at"),
        sa.Index(name("dedupe_bucket_expires_at_idx"), "bucket", "expires_at"),
        schema=schema,
    )
    routing_ledger = options.table(
        name("routing_ledger"),
        metadata,
        sa.Column("binding_id", sa.Text(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=True),
        sa.Column("scope", sa.Text(), nullable=True),
        sa.Column("source", sa.Text(), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("document", sa.Text(), nullable=True),
        sa.Column("key", sa.Text(), nullable=True),
        sa.Column("execution_id", sa.Text(), nullable=True),
        sa.Column("inserted_at", UtcDateTime(), nullable=False),
        # The row's bucket (statifier.buckets.ledger_bucket, decision 0125): a ledger
        # reaper given a range of buckets deletes its range's old rows by the index
        # below. Last, where statifier_0023 added it.
        sa.Column("bucket", sa.SmallInteger(), nullable=False),
        sa.Index(name("routing_ledger_execution_id_idx"), "execution_id"),
        sa.Index(name("routing_ledger_binding_id_inserted_at_idx"), "binding_id", "inserted_at"),
        # Newest first for the console's ledger page; binding and outcome ride along
        # so its counts per binding over a window are read from the index alone.
        sa.Index(
            name("routing_ledger_inserted_at_idx"), "inserted_at", "id", "binding_id", "outcome"
        ),
        sa.Index(name("routing_ledger_outcome_inserted_at_idx"), "outcome", "inserted_at", "id"),
        sa.Index(name("routing_ledger_bucket_inserted_at_idx"), "bucket", "inserted_at"),
        schema=schema,
    )
    timers = options.table(
        name("timers"),
        metadata,
        sa.Column("execution_id", sa.Text(), nullable=False),
        sa.Column("send_id", sa.Text(), nullable=False),
        sa.Column("dedup_key", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("due_at", UtcDateTime(), nullable=False),
        sa.Column("step_position", sa.Integer(), nullable=False),
        sa.Column("payload", json_document(), nullable=False),
        sa.Column("inserted_at", UtcDateTime(), nullable=False),
        # The execution's lock key (sql.dialect.execution_lock_key), which the claim
        # tries: hashed in Python, never by the database. Last, where statifier_0015
        # added it.
        sa.Column("lock_key", sa.BigInteger(), nullable=False),
        # The execution's bucket (statifier.buckets.bucket_of): a timer worker given a
        # range of buckets claims its range's due rows by the index below. Last, where
        # statifier_0017 added it.
        sa.Column("bucket", sa.SmallInteger(), nullable=False),
        sa.UniqueConstraint("dedup_key", name=name("timers_dedup_key_key")),
        sa.Index(name("timers_due_at_idx"), "due_at"),
        sa.Index(name("timers_bucket_due_at_idx"), "bucket", "due_at"),
        sa.Index(name("timers_execution_id_send_id_idx"), "execution_id", "send_id"),
        # The lock reaper keeps the lock rows of executions with pending timers.
        sa.Index(name("timers_lock_key_idx"), "lock_key"),
        schema=schema,
    )
    outbox = options.table(
        name("outbox"),
        metadata,
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("payload", json_document(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", UtcDateTime(), nullable=False),
        sa.Column("lease", sa.Text(), nullable=True),
        sa.Column("leased_until", UtcDateTime(), nullable=True),
        sa.Column("sent_at", UtcDateTime(), nullable=True),
        sa.Column("dead_at", UtcDateTime(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("inserted_at", UtcDateTime(), nullable=False),
        # The sending execution (``None`` for a hand-off outside one), also in the
        # payload: a column, so that an execution's rows are found by an index.
        sa.Column("execution_id", sa.Text(), nullable=True),
        # The bucket of the key whose transaction wrote the row (statifier.router.outbox
        # says which): a drain given a range of buckets leases its range's rows by the
        # index below. Last, where statifier_0019 added it.
        sa.Column("bucket", sa.SmallInteger(), nullable=False),
        sa.UniqueConstraint("queue", "key", name=name("outbox_queue_key_key")),
        sa.Index(name("outbox_next_attempt_at_idx"), "next_attempt_at"),
        sa.Index(name("outbox_bucket_next_attempt_at_idx"), "bucket", "next_attempt_at"),
        sa.Index(name("outbox_dead_at_idx"), "dead_at"),
        sa.Index(name("outbox_execution_id_inserted_at_idx"), "execution_id", "inserted_at", "id"),
        schema=schema,
    )
    subscriptions = options.table(
        name("subscriptions"),
        metadata,
        sa.Column("binding_id", sa.Text(), nullable=False),
        sa.Column("execution_id", sa.Text(), nullable=False),
        sa.Column("invoke_id", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("inserted_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint(
            "execution_id", "invoke_id", name=name("subscriptions_execution_id_invoke_id_key")
        ),
        sa.Index(name("subscriptions_binding_id_scope_key_idx"), "binding_id", "scope", "key"),
        schema=schema,
    )
    inbound, positions_, dead_letters, leases, members = _fronts(options, metadata)
    child_answers, fan_out_ends = _children(options, metadata)
    console_audit = _console_audit(options, metadata)
    step_errors = _step_errors(options, metadata)
    held_events = _held_events(options, metadata)
    bulk_runs = _bulk_runs(options, metadata)
    schedules = _schedules(options, metadata)
    flow_groups, flow_events = _flow(options, metadata)
    active_slots, held_creates = _caps(options, metadata)
    locks = _locks(options, metadata)
    store_place = _store_place(options, metadata)
    store_identity = _store_identity(options, metadata)
    return Tables(
        metadata,
        charts,
        positions,
        executions,
        inputs,
        addresses,
        dedupe,
        routing_ledger,
        timers,
        outbox,
        subscriptions,
        inbound,
        positions_,
        dead_letters,
        leases,
        members,
        child_answers,
        fan_out_ends,
        console_audit,
        step_errors,
        held_events,
        bulk_runs,
        schedules,
        flow_groups,
        flow_events,
        active_slots,
        held_creates,
        locks,
        store_place,
        store_identity,
        options,
    )


def _fronts(
    options: TableOptions, metadata: sa.MetaData
) -> tuple[sa.Table, sa.Table, sa.Table, sa.Table, sa.Table]:
    """The stream consumer's tables: inbound events, committed positions, dead letters,
    partition leases and group members (in that order)."""
    name = options.name
    schema = options.schema
    inbound_events = options.table(
        name("inbound_events"),
        metadata,
        sa.Column("partition", sa.Text(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("data", json_document(), nullable=False),
        sa.Column("appended_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint(
            "partition", "position", name=name("inbound_events_partition_position_key")
        ),
        schema=schema,
    )
    consumer_positions = options.table(
        name("consumer_positions"),
        metadata,
        sa.Column("consumer_group", sa.Text(), nullable=False),
        sa.Column("partition", sa.Text(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint(
            "consumer_group", "partition", name=name("consumer_positions_group_partition_key")
        ),
        schema=schema,
    )
    consumer_dead_letters = options.table(
        name("consumer_dead_letters"),
        metadata,
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("partition", sa.Text(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("raw", sa.LargeBinary(), nullable=False),
        sa.Column("dead_at", UtcDateTime(), nullable=False),
        sa.Index(name("consumer_dead_letters_source_dead_at_idx"), "source", "dead_at"),
        sa.Index(name("consumer_dead_letters_dead_at_idx"), "dead_at"),
        schema=schema,
    )
    partition_leases = options.table(
        name("partition_leases"),
        metadata,
        sa.Column("consumer_group", sa.Text(), nullable=False),
        sa.Column("partition", sa.Text(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=True),
        sa.Column("leased_until", UtcDateTime(), nullable=True),
        sa.UniqueConstraint(
            "consumer_group", "partition", name=name("partition_leases_group_partition_key")
        ),
        schema=schema,
    )
    consumer_members = options.table(
        name("consumer_members"),
        metadata,
        sa.Column("consumer_group", sa.Text(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("seen_until", UtcDateTime(), nullable=False),
        sa.UniqueConstraint(
            "consumer_group", "owner", name=name("consumer_members_group_owner_key")
        ),
        schema=schema,
    )
    return (
        inbound_events,
        consumer_positions,
        consumer_dead_letters,
        partition_leases,
        consumer_members,
    )


def _children(options: TableOptions, metadata: sa.MetaData) -> tuple[sa.Table, sa.Table]:
    """Durable children's answers and fan-out ends (in that order)."""
    name = options.name
    schema = options.schema
    child_answers = options.table(
        name("child_answers"),
        metadata,
        sa.Column("child_id", sa.Text(), nullable=False),
        sa.Column("parent_id", sa.Text(), nullable=False),
        sa.Column("invoke_id", sa.Text(), nullable=False),
        sa.Column("content_hash", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("failure", sa.Text(), nullable=True),
        sa.Column("answer_blob", sa.LargeBinary(), nullable=True),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("delivered_at", UtcDateTime(), nullable=True),
        sa.UniqueConstraint("child_id", name=name("child_answers_child_id_key")),
        sa.Index(name("child_answers_delivered_at_created_at_idx"), "delivered_at", "created_at"),
        sa.Index(name("child_answers_content_hash_idx"), "content_hash"),
        schema=schema,
    )
    fan_out_ends = options.table(
        name("fan_out_ends"),
        metadata,
        sa.Column("parent_id", sa.Text(), nullable=False),
        sa.Column("invoke_id", sa.Text(), nullable=False),
        sa.Column("ended_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint(
            "parent_id", "invoke_id", name=name("fan_out_ends_parent_id_invoke_id_key")
        ),
        schema=schema,
    )
    return child_answers, fan_out_ends


def _step_errors(options: TableOptions, metadata: sa.MetaData) -> sa.Table:
    """The error events steps raised: one row each, the step's input-log ``seq`` when it
    has one; ``error_blob`` (what the event said) goes through the storage's codec."""
    name = options.name
    return options.table(
        name("step_errors"),
        metadata,
        sa.Column("execution_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=True),
        sa.Column("via", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("taken", sa.Boolean(), nullable=False),
        sa.Column("error_blob", sa.LargeBinary(), nullable=False),
        sa.Column("recorded_at", UtcDateTime(), nullable=False),
        sa.Index(name("step_errors_execution_id_idx"), "execution_id", "id"),
        # The console's failures page: the newest errors of every execution.
        sa.Index(name("step_errors_recorded_at_idx"), "recorded_at", "id"),
        schema=options.schema,
    )


def _held_events(options: TableOptions, metadata: sa.MetaData) -> sa.Table:
    """The events sent to paused executions, each taken in ``seq`` order on resume
    (dense per execution, from 1: a key of any type says nothing of order): the event
    as the input log stores it (``event_blob``, through the storage's codec), how it
    came (``via``, ``internal`` for a timer's internal event), the scope its step's
    sends resolve in, the message it came as (``message_id``, ``None`` for a
    timer's), and the error policy of the binding that delivered it (``on_error``,
    ``None``: the router's)."""
    name = options.name
    return options.table(
        name("held_events"),
        metadata,
        sa.Column("execution_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("via", sa.Text(), nullable=False),
        sa.Column("internal", sa.Boolean(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=True),
        sa.Column("message_id", sa.Text(), nullable=True),
        sa.Column("event_blob", sa.LargeBinary(), nullable=False),
        sa.Column("held_at", UtcDateTime(), nullable=False),
        sa.Column("on_error", sa.Text(), nullable=True),
        sa.UniqueConstraint("execution_id", "seq", name=name("held_events_execution_id_seq_key")),
        schema=options.schema,
    )


def _bulk_runs(options: TableOptions, metadata: sa.MetaData) -> sa.Table:
    """The bulk actions operators started (:mod:`statifier.console.bulk`): ``run_id``
    names one in URLs; its action (``revision`` and ``plan``, the state map and data,
    for a migration), the executions list's filter it walks (``selection``, as the
    list's query fields), who started it and what its preview counted; its counts as
    of ``updated_at``; ``finished_at`` once it ended, ``error`` if it stopped early."""
    name = options.name
    return options.table(
        name("bulk_runs"),
        metadata,
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("revision", sa.Text(), nullable=True),
        sa.Column("plan", json_document(), nullable=True),
        sa.Column("selection", json_document(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("selected", sa.Integer(), nullable=False),
        sa.Column("done", sa.Integer(), nullable=False),
        sa.Column("skipped", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("parked", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", UtcDateTime(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.Column("finished_at", UtcDateTime(), nullable=True),
        sa.UniqueConstraint("run_id", name=name("bulk_runs_run_id_key")),
        sa.Index(name("bulk_runs_started_at_idx"), "started_at", "id"),
        schema=options.schema,
    )


def _schedules(options: TableOptions, metadata: sa.MetaData) -> sa.Table:
    """The schedules (:mod:`statifier.router.schedules`): ``name`` names one; its
    ``scope``; its ``definition`` (times, time zone, source, data, catch-up policy) as
    :meth:`~statifier.router.schedules.Schedule.as_json` writes it; whether it is
    ``paused``; ``next_fire_at``, the time of its next fire (the fire's identity), and
    ``due_at``, when a worker next takes it (later than ``next_fire_at`` after a fire
    failed); the time of its last fire made (``last_fire_at``) and when it was made
    (``last_made_at``); how many fires it made (``fired``) and let pass unmade
    (``skipped``); the last failure (``last_error``) and how many came in a row
    (``failures``)."""
    name = options.name
    return options.table(
        name("schedules"),
        metadata,
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("definition", json_document(), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("next_fire_at", UtcDateTime(), nullable=False),
        sa.Column("due_at", UtcDateTime(), nullable=False),
        sa.Column("last_fire_at", UtcDateTime(), nullable=True),
        sa.Column("last_made_at", UtcDateTime(), nullable=True),
        sa.Column("fired", sa.BigInteger(), nullable=False),
        sa.Column("skipped", sa.BigInteger(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint("name", name=name("schedules_name_key")),
        # What a worker's claim walks: the schedules due first.
        sa.Index(name("schedules_due_at_idx"), "due_at"),
        schema=options.schema,
    )


def _flow(options: TableOptions, metadata: sa.MetaData) -> tuple[sa.Table, sa.Table]:
    """What debounce, batch and throttle bindings hold (:mod:`statifier.router.flow`),
    by address under a binding (``binding_id``, ``scope``, ``key``; ``document`` said
    once, on the group).

    ``flow_groups``: one row an address with events held or a throttle window open:
    how many events are held (``held``), the last ``seq`` given, when the first held
    one came (``first_at``), the throttle's window (``window_start``, and
    ``window_count`` deliveries in it), when a worker next takes the row (``due_at``),
    and the failures of its last deliveries (``failures``, ``last_error``).

    ``flow_events``: the events held, delivered in ``seq`` order: the message they came
    as, their projected data (``data_blob``, JSON through the storage's codec) and when
    they came."""
    name = options.name
    schema = options.schema
    groups = options.table(
        name("flow_groups"),
        metadata,
        sa.Column("binding_id", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("held", sa.Integer(), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("first_at", UtcDateTime(), nullable=True),
        sa.Column("window_start", UtcDateTime(), nullable=True),
        sa.Column("window_count", sa.Integer(), nullable=False),
        sa.Column("due_at", UtcDateTime(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        # The address's bucket (statifier.buckets.address_bucket): a flow worker given a
        # range of buckets walks its range's groups by the index below. Last, where
        # statifier_0018 added it.
        sa.Column("bucket", sa.SmallInteger(), nullable=False),
        sa.UniqueConstraint(
            "binding_id", "scope", "key", name=name("flow_groups_binding_id_scope_key_key")
        ),
        # What a worker's pass walks: the groups due first.
        sa.Index(name("flow_groups_due_at_idx"), "due_at"),
        sa.Index(name("flow_groups_bucket_due_at_idx"), "bucket", "due_at"),
        schema=schema,
    )
    events = options.table(
        name("flow_events"),
        metadata,
        sa.Column("binding_id", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=True),
        sa.Column("data_blob", sa.LargeBinary(), nullable=False),
        sa.Column("arrived_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint(
            "binding_id",
            "scope",
            "key",
            "seq",
            name=name("flow_events_binding_id_scope_key_seq_key"),
        ),
        schema=schema,
    )
    return groups, events


def _locks(options: TableOptions, metadata: sa.MetaData) -> sa.Table:
    """The lock keys a transaction holds as rows (:mod:`statifier.sql.locks`), one row
    per key (a ``lock_key`` of :mod:`statifier.sql.dialect`); a row is locked, never
    changed, and the reaper deletes rows no one holds."""
    name = options.name
    return options.table(
        name("locks"),
        metadata,
        sa.Column("key", sa.BigInteger(), nullable=False),
        sa.UniqueConstraint("key", name=name("locks_key_key")),
        schema=options.schema,
    )


def _store_place(options: TableOptions, metadata: sa.MetaData) -> sa.Table:
    """Which place of how many stores the database holds (``place``, ``stores``), its
    ``state``: ``serving``, ``moving`` (a reshard moves its buckets) or ``retired`` (a
    reshard moved them all away), when a running service last said it serves it
    (``seen_at``), and, while ``moving``, which reshard moves it (``reshard``: a
    digest of its lists of stores). One row, or none before a process claimed a place
    (:mod:`statifier.sql.places`)."""
    return options.table(
        options.name("store_place"),
        metadata,
        sa.Column("place", sa.SmallInteger(), nullable=True),
        sa.Column("stores", sa.SmallInteger(), nullable=True),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("changed_at", UtcDateTime(), nullable=False),
        sa.Column("seen_at", UtcDateTime(), nullable=True),
        sa.Column("reshard", sa.Text(), nullable=True),
        schema=options.schema,
    )


def _store_identity(options: TableOptions, metadata: sa.MetaData) -> sa.Table:
    """The random name the store is known by (``identity``), whatever URL reaches it: one
    row, made by the revision that makes the table (:mod:`statifier.sql.places`)."""
    return options.table(
        options.name("store_identity"),
        metadata,
        sa.Column("identity", sa.Text(), nullable=False),
        schema=options.schema,
    )


def _caps(options: TableOptions, metadata: sa.MetaData) -> tuple[sa.Table, sa.Table]:
    """What caps on active executions keep (:mod:`statifier.router.caps`).

    ``active_slots``: one row an execution of a capped document the router created, by
    ``document`` and ``scope``, until a cap's check finds it ended and deletes it.

    ``held_creates``: the events whose create a cap holds, by address (``document``,
    ``scope``, ``key``) in ``seq`` order: the delivering binding (``binding_id``), its
    create mode and error policy, the message, the chart event as the input log stores
    it (``event_blob``, through the storage's codec) and when it came."""
    name = options.name
    schema = options.schema
    slots = options.table(
        name("active_slots"),
        metadata,
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("execution_id", sa.Text(), nullable=False),
        sa.Column("inserted_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint("execution_id", name=name("active_slots_execution_id_key")),
        sa.Index(name("active_slots_document_scope_idx"), "document", "scope"),
        schema=schema,
    )
    held = options.table(
        name("held_creates"),
        metadata,
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("binding_id", sa.Text(), nullable=False),
        sa.Column("create_mode", sa.Text(), nullable=False),
        sa.Column("on_error", sa.Text(), nullable=True),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=True),
        sa.Column("event_blob", sa.LargeBinary(), nullable=False),
        sa.Column("arrived_at", UtcDateTime(), nullable=False),
        # The address's bucket (statifier.buckets.address_bucket): a move of a range
        # of buckets reads its range's held creates by the index below. Last, where
        # statifier_0025 added it.
        sa.Column("bucket", sa.SmallInteger(), nullable=False),
        sa.UniqueConstraint(
            "document", "scope", "key", "seq", name=name("held_creates_document_scope_key_seq_key")
        ),
        # What the worker's fair pick walks: each scope's oldest first.
        sa.Index(name("held_creates_document_arrived_at_idx"), "document", "arrived_at"),
        sa.Index(name("held_creates_bucket_seq_idx"), "bucket", "seq"),
        schema=schema,
    )
    return slots, held


def _console_execution_indexes(options: TableOptions) -> list[sa.Index]:
    """The indexes the console's executions list walks: newest first (``created_at``
    then ``execution_id``), within a status or a chart. None of them holds a column a
    step changes (``updated_at``, the position), so a step's update of the row can
    stay a heap-only update on PostgreSQL."""
    name = options.name
    return [
        sa.Index(name("executions_created_at_idx"), "created_at", "execution_id"),
        sa.Index(name("executions_status_created_at_idx"), "status", "created_at", "execution_id"),
        sa.Index(
            name("executions_content_hash_created_at_idx"),
            "content_hash",
            "created_at",
            "execution_id",
        ),
    ]


def _console_audit(options: TableOptions, metadata: sa.MetaData) -> sa.Table:
    """The console's audit trail: one row per operator action."""
    name = options.name
    return options.table(
        name("console_audit"),
        metadata,
        sa.Column("at", UtcDateTime(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Index(name("console_audit_at_idx"), "at", "id"),
        sa.Index(name("console_audit_target_at_idx"), "target", "at"),
        schema=options.schema,
    )


def define_locations(tables: Tables) -> sa.Table:
    """The opt-in ``locations`` table, beside ``tables`` and under their options: the
    BasicHTTP location of each execution an address row names, as the SHA-256 of its
    token (lowercase hex), never the token itself.

    It is defined in a metadata of its own, so :meth:`TableOptions.define` and the
    version walk of :mod:`statifier.sql.migrations` never meet it; it is built by
    :func:`statifier.sql.locations.upgrade_locations`. ``address_id`` references the
    address table (deleting an address deletes its location where the database
    enforces the reference); ``execution_id`` is kept beside it, so a location whose
    address row is gone never reaches a later execution under a reused id.

    >>> table = define_locations(TableOptions(prefix="shop_").define())
    >>> table.name, [column.name for column in table.columns]
    ('shop_locations', ['id', 'address_id', 'execution_id', 'token_hash', 'inserted_at'])
    """
    options = tables.options
    name = options.name
    address_key = tables.addresses.c["id"].type
    return options.table(
        name("locations"),
        sa.MetaData(),
        sa.Column(
            "address_id",
            address_key,
            sa.ForeignKey(tables.addresses.c["id"], ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("execution_id", sa.Text(), nullable=False),
        sa.Column("token_hash", sa.Text(), nullable=False),
        sa.Column("inserted_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint("address_id", name=name("locations_address_id_key")),
        sa.UniqueConstraint("token_hash", name=name("locations_token_hash_key")),
        sa.Index(name("locations_execution_id_idx"), "execution_id"),
        schema=options.schema,
    )
