"""What a handler returns: operations on the read model, or why there is none.

Operations name SQLAlchemy Core tables and plain values, so they are data: a target
applies them inside the transaction that also moves the cursors, and a test can compare
them. ``where`` mappings are equality filters on columns (``{"id": 7}``).

>>> import sqlalchemy as sa
>>> orders = sa.Table("orders", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True),
...                   sa.Column("status", sa.Text))
>>> Update(orders, where={"id": 7}, values={"status": "shipped"}).where
{'id': 7}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

import sqlalchemy as sa

__all__ = [
    "Delete",
    "Error",
    "Execute",
    "Insert",
    "Multi",
    "Operation",
    "Result",
    "Skip",
    "Update",
]


@dataclass(frozen=True, slots=True)
class Insert:
    """Insert one row into ``table``."""

    table: sa.Table
    values: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Update:
    """Set ``values`` on the rows of ``table`` matching every pair of ``where``."""

    table: sa.Table
    where: Mapping[str, Any]
    values: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete the rows of ``table`` matching every pair of ``where``."""

    table: sa.Table
    where: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Execute:
    """Run one SQLAlchemy Core statement (arbitrary work). Only SQL targets accept it."""

    statement: sa.Executable


@dataclass(frozen=True, slots=True)
class Multi:
    """Several operations for one event, applied in order and atomically with it."""

    operations: tuple[Operation, ...]


@dataclass(frozen=True, slots=True)
class Skip:
    """Nothing to do for this event; it still counts as accounted for."""

    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Error:
    """The handler could not handle the event: retried, then dead-lettered."""

    reason: object


Operation: TypeAlias = Insert | Update | Delete | Execute | Multi
Result: TypeAlias = Operation | Skip | Error


def not_a_result(value: object) -> str:
    """What is wrong with a ``handle`` that returned ``value``, not a :data:`Result`."""
    return f"handle returned {value!r}: not an operation, Skip or Error"
