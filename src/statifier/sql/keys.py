"""Who makes a new row's key, said once for every insert of the storage layer.

Every table has an ``id`` key. By default the database makes it (an identity column),
and an insert names no ``id``; under ``TableOptions(key_default=...)`` the client makes
it (UUIDs, say), and every insert binds it as ``:id``. A :class:`RowKeys` writes the
inserts of one set of tables for either case (:meth:`RowKeys.insert`) and binds the
new key where the client makes it (:meth:`RowKeys.keyed`).

>>> from statifier.sql import TableOptions
>>> from statifier.sql.sqlite import SQLITE
>>> keys = RowKeys.of(TableOptions().define(), SQLITE)
>>> keys.insert("t", ("a", "b"), {"b": "0"})
'INSERT INTO t (a, b) VALUES (:a, 0)'
>>> keys.keyed({"a": 1})
{'a': 1}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from statifier.sql.dialect import Dialect
from statifier.sql.tables import Tables

__all__ = ["RowKeys"]


@dataclass(frozen=True, slots=True)
class RowKeys:
    """How the inserts of one set of tables on one database key a new row.

    Attributes:
        dialect: binds a key the client made as its driver stores it.
        new_key: makes a new key where the client makes them
            (``TableOptions.key_default``), else ``None``: the database does.
    """

    dialect: Dialect
    new_key: Callable[[], Any] | None

    @classmethod
    def of(cls, tables: Tables, dialect: Dialect) -> RowKeys:
        """The keys of ``tables`` (as their options say) on ``dialect``'s database."""
        return cls(dialect, tables.options.key_default)

    def insert(
        self,
        table: str,
        columns: Sequence[str],
        values: Mapping[str, str] | None = None,
        *,
        select: bool = False,
    ) -> str:
        """The text (parameters as ``:name``, before :meth:`Dialect.statement`) of an
        insert of one row into ``table``: each of ``columns`` takes ``:column``, or
        the SQL ``values`` gives it; led by ``id``, bound as ``:id``, where the client
        makes keys. The caller appends what follows (``ON CONFLICT``, ``RETURNING``).

        ``select``: the row is a ``SELECT`` of the values rather than ``VALUES``, so
        that the caller's ``FROM`` or ``WHERE`` completes or withholds it.
        """
        given = values or {}
        named = [*columns]
        listed = [given.get(column, f":{column}") for column in columns]
        if self.new_key is not None:
            named.insert(0, "id")
            listed.insert(0, ":id")
        row = f"SELECT {', '.join(listed)}" if select else f"VALUES ({', '.join(listed)})"
        return f"INSERT INTO {table} ({', '.join(named)}) {row}"

    def keyed(self, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` for an insert of :meth:`insert`, with a new key bound as ``id``
        where the client makes keys; ``values`` itself, changed in place."""
        if self.new_key is not None:
            values["id"] = self.dialect.key(self.new_key())
        return values
