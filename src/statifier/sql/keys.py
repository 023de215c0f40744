"""Who makes a new row's key, said once for every insert of the storage layer.

Every table has an ``id`` key. By default the database makes it (an identity column,
or the ``TableOptions.key_default`` of a UUID or text key), and an insert names no
``id``; under ``TableOptions(key_type=sa.Uuid)`` without a ``key_default`` the client
makes it (:attr:`TableOptions.new_key`), and every insert binds it as ``:id``. A
:class:`RowKeys` writes the inserts of one set of tables for either case
(:meth:`RowKeys.insert`), binds the new key where the client makes it
(:meth:`RowKeys.keyed`) and reads a key the database gives back (:meth:`RowKeys.read`).

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
            (``TableOptions.new_key``), else ``None``: the database does.
        text_keys: the keys are text (``TableOptions(key_type=sa.Text, ...)``), read
            back as they are.
    """

    dialect: Dialect
    new_key: Callable[[], Any] | None
    text_keys: bool = False

    @classmethod
    def of(cls, tables: Tables, dialect: Dialect) -> RowKeys:
        """The keys of ``tables`` (as their options say) on ``dialect``'s database."""
        options = tables.options
        return cls(dialect, options.new_key, options.key_kind == "text")

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

    def read(self, value: Any) -> Any:
        """A key column's value as the driver read it, as the package hands keys on: a
        text key as it is, others as :meth:`Dialect.read_key` says."""
        return value if self.text_keys else self.dialect.read_key(value)
