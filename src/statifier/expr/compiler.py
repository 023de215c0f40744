"""The compiler: a syntax tree to a tree of Python closures.

Each node becomes one closure ``f(data, run)`` that returns the node's value or
raises :class:`~statifier.expr.semantics.Fail`. ``data`` is the context mapping and
``run`` the :class:`Run` settings of this evaluation. Common shapes get closures of
their own (a property read on a root variable, a comparison against a constant) so
that the usual binding or guard costs a handful of calls.

An unbound root variable evaluates to an :class:`Undefined` that remembers its name;
it behaves like undefined everywhere, and the entry points report it as an
``UndefinedVariableError`` only if it reaches the result or an operator rejects it.
Values put into containers, passed to functions or stored are normalised to the
plain :data:`UNDEFINED`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final, TypeAlias

from statifier.expr import nodes as n
from statifier.expr import semantics as s
from statifier.expr.casts import CONVERTERS
from statifier.expr.errors import EvaluationError, Span, UndefinedVariableError
from statifier.expr.functions import CallContext, Function, FunctionError
from statifier.expr.location import LocationFailure, write
from statifier.expr.values import UNDEFINED, Undefined, Value

__all__ = ["Closure", "Run", "compile_node", "compile_statements"]

Data: TypeAlias = Mapping[str, Value]
Closure: TypeAlias = Callable[[Any, "Run"], Value]

_MISSING: Final = object()


class Run:
    """The settings of one evaluation, plus the mutable state a program needs.

    Expression evaluations share one ``Run`` per :class:`~statifier.expr.Options`
    (they never change it); each program execution gets a fresh one.
    """

    __slots__ = ("budget", "functions", "host", "last", "now", "protected", "unbound_error")

    def __init__(
        self,
        functions: Mapping[str, Function],
        now: Callable[[], datetime],
        host: object,
        unbound_error: bool,
        protected: frozenset[str],
        budget: int,
    ) -> None:
        self.functions = functions
        self.now = now
        self.host = host
        self.unbound_error = unbound_error
        self.protected = protected
        self.budget = budget
        self.last: Value = UNDEFINED

    def unbound(self, name: str, span: Span) -> Undefined:
        """The value of an unbound root variable, or the failure the policy asks for."""
        if self.unbound_error:
            raise s.Fail(
                UndefinedVariableError(
                    "unbound_variable", f"Undefined variable: {name}", span, variable=name
                )
            )
        return Undefined(name, span)


def _plain(value: Value) -> Value:
    return UNDEFINED if type(value) is Undefined else value


# -- expressions ------------------------------------------------------------------------


def compile_node(node: n.Expression) -> Closure:
    """Compile an expression tree to its closure."""
    if isinstance(node, n.Literal):
        return _constant(node.value)
    if isinstance(node, n.Identifier):
        return _load(node.name, node.span)
    if isinstance(node, n.Access):
        return _access(node)
    if isinstance(node, n.Index):
        return _index(node)
    if isinstance(node, n.Cast):
        return _cast(node)
    if isinstance(node, n.Unary):
        return _unary(node)
    if isinstance(node, n.Binary):
        return _binary(node)
    if isinstance(node, n.Compare):
        return _compare(node)
    if isinstance(node, n.Logical):
        return _logical(node)
    if isinstance(node, n.Call):
        return _call(node)
    if isinstance(node, n.ListLiteral):
        return _list(node)
    if isinstance(node, n.ObjectLiteral):
        return _object(node)
    return _relative_date(node)


def _constant(value: Value) -> Closure:
    def constant(data: Data, run: Run) -> Value:
        return value

    return constant


def _load(name: str, span: Span) -> Closure:
    def load(data: Data, run: Run) -> Value:
        value = data.get(name, _MISSING)
        if value is _MISSING:
            return run.unbound(name, span)
        return value

    return load


def _access(node: n.Access) -> Closure:
    name = node.name
    get_property = s.get_property
    if isinstance(node.target, n.Identifier):
        root, root_span = node.target.name, node.target.span

        def root_property(data: Data, run: Run) -> Value:
            target = data.get(root, _MISSING)
            if type(target) is dict:
                return target.get(name, UNDEFINED)
            if target is _MISSING:
                return run.unbound(root, root_span)
            return get_property(target, name)

        return root_property
    target_fn = compile_node(node.target)

    def property_(data: Data, run: Run) -> Value:
        target = target_fn(data, run)
        if type(target) is dict:
            return target.get(name, UNDEFINED)
        return get_property(target, name)

    return property_


def _index(node: n.Index) -> Closure:
    target_fn, key_fn, span = compile_node(node.target), compile_node(node.key), node.span
    get_index = s.get_index

    def index(data: Data, run: Run) -> Value:
        return get_index(target_fn(data, run), key_fn(data, run), span)

    return index


def _cast(node: n.Cast) -> Closure:
    operand, convert = compile_node(node.operand), CONVERTERS[node.type_name]

    def cast(data: Data, run: Run) -> Value:
        value = operand(data, run)
        if type(value) is Undefined:
            return value
        return convert(value)

    return cast


def _unary(node: n.Unary) -> Closure:
    span = node.span
    if node.op == "-":
        if isinstance(node.operand, n.Literal) and type(node.operand.value) in (int, float):
            return _constant(-node.operand.value)
        operand = compile_node(node.operand)
        negate = s.negate

        def minus(data: Data, run: Run) -> Value:
            return negate(operand(data, run), span)

        return minus
    operand = compile_node(node.operand)
    operation = "logical_not" if node.op == "not" else "unary_bang"
    shown = f"'{node.word or node.op}'"

    def logical_not(data: Data, run: Run) -> Value:
        value = operand(data, run)
        if value is True:
            return False
        if value is False:
            return True
        raise s.mismatch(operation, "boolean", value, span, shown)

    return logical_not


_ARITHMETIC: Final[dict[str, Callable[[Value, Value, Span | None], Value]]] = {
    "+": s.add,
    "-": s.subtract,
    "*": s.multiply,
    "/": s.divide,
    "%": s.modulo,
}


def _binary(node: n.Binary) -> Closure:
    operands = [compile_node(operand) for operand in node.operands]
    steps = [
        (_ARITHMETIC[op], operand, span)
        for op, operand, span in zip(node.ops, operands[1:], node.spans, strict=True)
    ]
    if len(steps) == 1:
        left, (apply, right, span) = operands[0], steps[0]
        if node.ops[0] == "+":

            def plus(data: Data, run: Run) -> Value:
                a, b = left(data, run), right(data, run)
                if type(a) is int and type(b) is int:
                    return a + b
                return apply(a, b, span)

            return plus

        def arithmetic(data: Data, run: Run) -> Value:
            return apply(left(data, run), right(data, run), span)

        return arithmetic
    first = operands[0]

    def chain(data: Data, run: Run) -> Value:
        value = first(data, run)
        for apply, operand, span in steps:
            value = apply(value, operand(data, run), span)
        return value

    return chain


_FAST_ORDER: Final[dict[str, Callable[[Any, Any], Any]]] = {
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}


def _root_property(node: n.Expression) -> tuple[str, str] | None:
    """``(root, name)`` when ``node`` reads ``root.name``, else ``None``."""
    if isinstance(node, n.Access) and isinstance(node.target, n.Identifier):
        return node.target.name, node.name
    return None


def _compare(node: n.Compare) -> Closure:
    op, span = node.op, node.span
    left, right = compile_node(node.left), compile_node(node.right)
    if op in ("===", "!=="):
        strict_equal, expect = s.strict_equal, op == "==="

        def strict(data: Data, run: Run) -> Value:
            return strict_equal(left(data, run), right(data, run)) is expect

        return strict
    if op in ("in", "contains"):
        membership = s.membership

        def member(data: Data, run: Run) -> Value:
            a, b = left(data, run), right(data, run)
            if op == "in":
                return membership(a, b, "in", span)
            return membership(b, a, "contains", span)

        return member
    compare = s.compare
    constant = node.right.value if isinstance(node.right, n.Literal) else _MISSING
    kind = type(constant)
    if kind is str or kind is int:
        # Against a constant of a type the operand usually has: compare directly.
        fast = _FAST_ORDER[op]
        property_path = _root_property(node.left)
        if property_path is not None:
            root, name = property_path

            def property_against_constant(data: Data, run: Run) -> Value:
                target = data.get(root, _MISSING)
                value = target.get(name, UNDEFINED) if type(target) is dict else left(data, run)
                if type(value) is kind:
                    return fast(value, constant)
                return compare(op, value, constant)

            return property_against_constant

        def against_constant(data: Data, run: Run) -> Value:
            value = left(data, run)
            if type(value) is kind:
                return fast(value, constant)
            return compare(op, value, constant)

        return against_constant

    def comparison(data: Data, run: Run) -> Value:
        return compare(op, left(data, run), right(data, run))

    return comparison


def _logical(node: n.Logical) -> Closure:
    operands = [compile_node(operand) for operand in node.operands]
    spans = node.spans
    mismatch = s.mismatch
    # Each operator as the source spelled it (``and``, ``&&``), for the message.
    shown = [f"'{word}'" for word in node.words] or [f"'{node.op}'"] * len(spans)
    if node.op == "and":
        operation = "jump_if_falsy_or_pop"
        if len(operands) == 2:
            first, second = operands
            span, word = spans[0], shown[0]

            def both(data: Data, run: Run) -> Value:
                value = first(data, run)
                if value is True:
                    return second(data, run)
                if value is False or value is None or type(value) is Undefined:
                    return value
                raise mismatch(operation, "boolean", value, span, word)

            return both

        def all_of(data: Data, run: Run) -> Value:
            for operand, span, word in zip(operands, spans, shown, strict=False):
                value = operand(data, run)
                if value is True:
                    continue
                if value is False or value is None or type(value) is Undefined:
                    return value
                raise mismatch(operation, "boolean", value, span, word)
            return operands[-1](data, run)

        return all_of

    operation = "jump_if_true_or_pop"

    def any_of(data: Data, run: Run) -> Value:
        for operand, span, word in zip(operands, spans, shown, strict=False):
            value = operand(data, run)
            if value is True:
                return value
            if value is False or value is None or type(value) is Undefined:
                continue
            raise mismatch(operation, "boolean", value, span, word)
        return operands[-1](data, run)

    return any_of


def _call(node: n.Call) -> Closure:
    name, span, count = node.name, node.span, len(node.args)
    args = [compile_node(arg) for arg in node.args]

    def invoke(data: Data, run: Run, values: tuple[Value, ...]) -> Value:
        function = run.functions.get(name)
        if function is None or not function.accepts(count):
            raise _uncallable(name, function, count, span)
        try:
            if function.pass_context:
                return function.call(values, CallContext(data, run.host, run.now))
            return function.call(values)
        except Exception as error:  # noqa: BLE001 - a host function's bug must not escape
            raise _function_failed(name, error, span) from None

    if count == 1:
        only = args[0]

        def call_one(data: Data, run: Run) -> Value:
            value = only(data, run)
            if type(value) is Undefined:
                value = UNDEFINED
            function = run.functions.get(name)
            # The common case, inline: a context-free function taking one argument.
            if function is not None and function.arity == 1 and not function.pass_context:
                try:
                    return function.call((value,))
                except Exception as error:  # noqa: BLE001 - see invoke
                    raise _function_failed(name, error, span) from None
            return invoke(data, run, (value,))

        return call_one

    def call(data: Data, run: Run) -> Value:
        return invoke(data, run, tuple(_plain(arg(data, run)) for arg in args))

    return call


def _uncallable(name: str, function: Function | None, count: int, span: Span) -> s.Fail:
    # The corpus spells a function's failure with its message as the reason; the code
    # is the stable token.
    if function is None:
        message = f"Unknown function: {name}"
        return s.failure(message, message, span, "unknown_function")
    message = f"{name} expects {_plural(function.arity)}, got {count}"
    return s.failure(message, message, span, "wrong_arity")


def _function_failed(name: str, error: Exception, span: Span) -> Exception:
    """What to raise for an exception that came out of a function call."""
    if isinstance(error, s.Fail | RecursionError):
        return error
    if isinstance(error, FunctionError):
        return s.failure(str(error), str(error), span, error.code)
    message = f"{name} raised {type(error).__name__}: {error}"
    return s.failure("function_raised", message, span)


def _plural(arity: int | tuple[int, ...]) -> str:
    if isinstance(arity, int):
        return f"{arity} argument{'s' if arity != 1 else ''}"
    return " or ".join(str(a) for a in arity) + " arguments"


def _list(node: n.ListLiteral) -> Closure:
    items = [compile_node(item) for item in node.items]

    def make_list(data: Data, run: Run) -> Value:
        return [_plain(item(data, run)) for item in items]

    return make_list


def _object(node: n.ObjectLiteral) -> Closure:
    entries = [(key, compile_node(value)) for key, value in node.entries]

    def make_object(data: Data, run: Run) -> Value:
        return {key: _plain(value(data, run)) for key, value in entries}

    return make_object


def _relative_date(node: n.RelativeDate) -> Closure:
    duration, direction, span = node.duration, node.direction, node.span
    shift = s.shift

    def relative(data: Data, run: Run) -> Value:
        try:
            now = run.now()
        except FunctionError as error:  # a host without a clock refuses relative dates
            raise s.failure(str(error), str(error), span, error.code) from None
        return shift(now, duration, direction, span)

    return relative


# -- statements -------------------------------------------------------------------------

Step: TypeAlias = Callable[[dict[str, Value], Run], None]


def compile_statements(statements: tuple[n.Statement, ...]) -> Step:
    """Compile a statement sequence to one step that runs them in order."""
    steps = [_statement(statement) for statement in statements]
    if len(steps) == 1:
        return steps[0]

    def sequence(data: dict[str, Value], run: Run) -> None:
        for step in steps:
            step(data, run)

    return sequence


def _statement(statement: n.Statement) -> Step:
    if isinstance(statement, n.ExprStatement):
        expression = compile_node(statement.expression)

        def evaluate(data: dict[str, Value], run: Run) -> None:
            run.last = expression(data, run)

        return evaluate
    if isinstance(statement, n.Assign):
        return _assign(statement)
    if isinstance(statement, n.If):
        return _if(statement)
    return _while(statement)


def _segments(target: n.Expression) -> tuple[str, list[Closure]]:
    steps: list[Closure] = []
    while isinstance(target, n.Access | n.Index):
        steps.append(
            _constant(target.name) if isinstance(target, n.Access) else compile_node(target.key)
        )
        target = target.target
    assert isinstance(target, n.Identifier)
    steps.reverse()
    return target.name, steps


def _assign(statement: n.Assign) -> Step:
    root, segment_fns = _segments(statement.target)
    value_fn, span = compile_node(statement.value), statement.span

    def assign(data: dict[str, Value], run: Run) -> None:
        path: list[str | int] = [root]
        for segment_fn in segment_fns:
            segment = segment_fn(data, run)
            if type(segment) is not str and type(segment) is not int:
                # The message names string because a location is usually a name path.
                raise s.mismatch("store", "string", segment, span)
            path.append(segment)
        value = _plain(value_fn(data, run))
        if root in run.protected:
            raise s.failure("protected_root", f"{root} is protected and cannot be assigned", span)
        try:
            write(data, path, value)
        except LocationFailure as failure:
            error = failure.error
            raise s.Fail(EvaluationError(error.reason, error.message, span)) from None

    return assign


def _condition(
    condition: Closure, span: Span, word: str
) -> Callable[[dict[str, Value], Run], bool]:
    def test(data: dict[str, Value], run: Run) -> bool:
        value = condition(data, run)
        if value is True:
            return True
        if value is False or value is None or type(value) is Undefined:
            return False
        raise s.mismatch("pop_jump_if_falsy", "boolean", value, span, word)

    return test


def _nothing(data: dict[str, Value], run: Run) -> None:
    return None


def _block(block: n.Block | None) -> Step:
    return compile_statements(block.statements) if block and block.statements else _nothing


def _if(statement: n.If) -> Step:
    # An ``else`` block holding just another ``if`` (what ``else if`` writes) joins
    # one flat chain, compiled and run in a loop however long the chain is.
    branches: list[tuple[Callable[[dict[str, Value], Run], bool], Step]] = []
    current = statement
    while True:
        test = _condition(compile_node(current.condition), current.span, "'if'")
        branches.append((test, _block(current.then)))
        otherwise = current.otherwise
        if (
            otherwise is not None
            and len(otherwise.statements) == 1
            and isinstance(otherwise.statements[0], n.If)
        ):
            current = otherwise.statements[0]
            continue
        last = _block(otherwise)
        break
    if len(branches) == 1:
        ((test, then),) = branches

        def branch(data: dict[str, Value], run: Run) -> None:
            if test(data, run):
                then(data, run)
            else:
                last(data, run)

        return branch

    def chain(data: dict[str, Value], run: Run) -> None:
        for test, then in branches:
            if test(data, run):
                then(data, run)
                return
        last(data, run)

    return chain


def _while(statement: n.While) -> Step:
    test = _condition(compile_node(statement.condition), statement.span, "'while'")
    body = compile_statements(statement.body.statements) if statement.body.statements else _nothing
    span = statement.span

    def loop(data: dict[str, Value], run: Run) -> None:
        while test(data, run):
            body(data, run)
            run.budget -= 1
            if run.budget < 0:
                raise s.failure(
                    "loop_budget_exceeded", "The loop budget of this execution is spent", span
                )

    return loop
