"""Locations: where an assignment writes, and the write itself.

A location is a root variable followed by property and index steps, resolved to a
path such as ``("user", "items", 0)``. Writing creates missing containers on the way
(a string step makes a map, an integer step a list), pads a list with undefined up
to an index past its end, and always overwrites the leaf. Containers on the path
are copied, never changed in place, so a caller's nested data is left untouched.

>>> assign({}, "data['users'][0].name", "Ada")
{'data': {'users': [{'name': 'Ada'}]}}
>>> resolve("items[i]", {"i": 2})
('items', 2)
>>> resolve("len(name)", {}).reason
'not_assignable'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from statifier.expr import nodes as n
from statifier.expr.errors import LocationError, ParseError, Span
from statifier.expr.parser import parse_expression
from statifier.expr.values import UNDEFINED, Undefined, Value

__all__ = [
    "Location",
    "LocationFailure",
    "Path",
    "assign",
    "compile_location",
    "put",
    "resolve",
    "write",
]

Path = tuple[str | int, ...]

_MISSING: Final = object()


class LocationFailure(Exception):  # noqa: N818 - internal control flow
    """Internal: carries a LocationError out of a nested write."""

    def __init__(self, error: LocationError) -> None:
        super().__init__(error.message)
        self.error = error


def _refuse(reason: str, message: str, span: Span | None = None) -> LocationFailure:
    return LocationFailure(LocationError(reason, message, span))


def write(data: dict[str, Value], path: Sequence[str | int], value: Value) -> None:
    """Write ``value`` at ``path`` into ``data``, changing ``data`` itself but copying
    every nested container on the way.

    Raises:
        LocationFailure: ``not_assignable`` (empty path), ``not_a_container`` (a step
            passes through a scalar), ``invalid_index`` (a negative list index) or
            ``invalid_key`` (an integer step into a map, a non-string root).
    """
    if not path:
        raise _refuse("not_assignable", "An empty path names no location")
    root = path[0]
    if type(root) is not str:
        raise _refuse("invalid_key", "A location starts with a variable name")
    if len(path) == 1:
        data[root] = value
    else:
        data[root] = _with(data.get(root, _MISSING), path, 1, value)


def _with(node: object, path: Sequence[str | int], position: int, value: Value) -> Value:
    step = path[position]
    last = position == len(path) - 1
    if node is _MISSING or node is None or type(node) is Undefined:
        node = {} if type(step) is str else []
    if type(step) is str:
        if not isinstance(node, Mapping):
            raise _refuse("not_a_container", f"Cannot set {step!r} inside a non-map value")
        copy = dict(node)
        copy[step] = value if last else _with(copy.get(step, _MISSING), path, position + 1, value)
        return copy
    if type(step) is not int:
        raise _refuse(
            "invalid_key", f"A location step must be a string or an integer, not {step!r}"
        )
    if step < 0:
        raise _refuse("invalid_index", f"Negative list index {step}")
    if isinstance(node, Mapping):
        raise _refuse("invalid_key", f"A map takes string keys, not the integer {step}")
    if type(node) is not list:
        raise _refuse("not_a_container", f"Cannot set index {step} inside a non-list value")
    items = list(node)
    if step >= len(items):
        items.extend([UNDEFINED] * (step + 1 - len(items)))
        current: object = _MISSING
    else:
        current = items[step]
    items[step] = value if last else _with(current, path, position + 1, value)
    return items


def put(
    data: Mapping[str, Value], path: Sequence[str | int], value: Value
) -> dict[str, Value] | LocationError:
    """A copy of ``data`` with ``value`` written at ``path``, or the LocationError.

    >>> put({"items": [1]}, ["items", 2], "x")
    {'items': [1, UNDEFINED, 'x']}
    >>> put({"user": 5}, ["user", "name"], "Ada").reason
    'not_a_container'
    """
    result = dict(data)
    try:
        write(result, path, value)
    except LocationFailure as failure:
        return failure.error
    return result


class Location:
    """A compiled location expression, resolved against a context when written to.

    >>> target = compile_location("rows[i].name")
    >>> target.resolve({"i": 1}), target.root
    (('rows', 1, 'name'), 'rows')
    """

    __slots__ = ("root", "source", "tree")

    def __init__(self, source: str, tree: n.Identifier | n.Access | n.Index) -> None:
        self.source = source
        self.tree = tree
        node: n.Expression = tree
        while isinstance(node, n.Access | n.Index):
            node = node.target
        assert isinstance(node, n.Identifier)
        self.root = node.name

    def __repr__(self) -> str:
        return f"Location({self.source!r})"

    def resolve(self, data: Mapping[str, Value]) -> Path | LocationError:
        """The path this location names in ``data``, or why it names none."""
        try:
            return tuple(_path(self.tree, data))
        except LocationFailure as failure:
            return failure.error


def compile_location(source: str) -> Location | ParseError | LocationError:
    """Compile a location expression; refuses anything but a variable, property or index.

    >>> compile_location("len(x)").reason
    'not_assignable'
    """
    tree = parse_expression(source)
    if isinstance(tree, ParseError):
        return tree
    if not isinstance(tree, n.Identifier | n.Access | n.Index):
        return LocationError(
            "not_assignable", "Only a variable, property or index can be assigned to", tree.span
        )
    try:
        _shape(tree)
    except LocationFailure as failure:
        return failure.error
    return Location(source, tree)


def _shape(node: n.Expression) -> None:
    while isinstance(node, n.Access | n.Index):
        node = node.target
    if not isinstance(node, n.Identifier):
        raise _refuse(
            "not_assignable", "Only a variable, property or index can be assigned to", node.span
        )


def resolve(source: str, data: Mapping[str, Value]) -> Path | LocationError | ParseError:
    """Resolve a location expression against ``data`` to its path.

    Bracket keys may be literals or variable references (``items[i]``,
    ``rows[cursor.row]``); a computed key such as ``items[i + 1]`` is refused with
    ``computed_key``, an unbound variable key with ``undefined_variable``.
    """
    location = compile_location(source)
    if isinstance(location, ParseError | LocationError):
        return location
    return location.resolve(data)


def assign(
    data: Mapping[str, Value], source: str, value: Value
) -> dict[str, Value] | LocationError | ParseError:
    """A copy of ``data`` with ``value`` written at the location ``source`` names."""
    path = resolve(source, data)
    if isinstance(path, LocationError | ParseError):
        return path
    return put(data, path, value)


def _path(node: n.Expression, data: Mapping[str, Value]) -> list[str | int]:
    if isinstance(node, n.Identifier):
        return [node.name]
    if isinstance(node, n.Access):
        return [*_path(node.target, data), node.name]
    if isinstance(node, n.Index):
        return [*_path(node.target, data), _key(node.key, data)]
    if isinstance(
        node,
        n.Literal
        | n.Call
        | n.Binary
        | n.Compare
        | n.Logical
        | n.Unary
        | n.ListLiteral
        | n.ObjectLiteral
        | n.Cast
        | n.RelativeDate,
    ):
        raise _refuse(
            "not_assignable", "Only a variable, property or index can be assigned to", node.span
        )
    raise _refuse("invalid_node", "This expression cannot be assigned to")


def _key(node: n.Expression, data: Mapping[str, Value]) -> str | int:
    if isinstance(node, n.Literal):
        value: object = node.value
    elif (
        isinstance(node, n.Unary)
        and node.op == "-"
        and isinstance(node.operand, n.Literal)
        and type(node.operand.value) is int
    ):
        value = -node.operand.value  # a negative literal index, refused when written
    elif isinstance(node, n.Identifier | n.Access | n.Index):
        value = _lookup(node, data)
    else:
        raise _refuse("computed_key", "A bracket key must be a literal or a variable", node.span)
    if type(value) is str or type(value) is int:
        return value
    raise _refuse(
        "invalid_key", f"A bracket key must be a string or an integer, not {value!r}", node.span
    )


def _lookup(node: n.Identifier | n.Access | n.Index, data: Mapping[str, Value]) -> object:
    path = _path(node, data)
    root = path[0]
    if root not in data:
        raise _refuse("undefined_variable", f"Undefined variable: {root}", node.span)
    value: object = data[str(root)]
    for step in path[1:]:
        if isinstance(value, Mapping):
            value = value.get(step, UNDEFINED)
        elif type(value) is list and type(step) is int and 0 <= step < len(value):
            value = value[step]
        else:
            return UNDEFINED
    return value
