"""Compile once, evaluate many times.

>>> from statifier.expr import compile_expression, compile_program
>>> rule = compile_expression("event.kind == 'impression' and len(event.id) > 0")
>>> rule.evaluate({"event": {"kind": "impression", "id": "e1"}})
True
>>> run = compile_program("total = 0; i = 1; while i <= 3 { total = total + i; i = i + 1 }")
>>> run.execute({}).context
{'total': 6, 'i': 4}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final, Literal

from statifier.expr import nodes as n
from statifier.expr.compiler import Closure, Run, Step, compile_node, compile_statements
from statifier.expr.errors import (
    EvaluationError,
    ExprError,
    ParseError,
    UndefinedVariableError,
)
from statifier.expr.functions import BUILTINS, Function
from statifier.expr.parser import DEFAULT_LIMITS, Limits, parse_expression, parse_program
from statifier.expr.semantics import Fail
from statifier.expr.values import UNDEFINED, Undefined, Value

__all__ = [
    "Expression",
    "Options",
    "Program",
    "ProgramResult",
    "compile_expression",
    "compile_program",
    "evaluate",
    "execute",
]

DEFAULT_LOOP_BUDGET: Final = 10_000


def system_clock() -> datetime:
    """The current time in UTC."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class Options:
    """How an evaluation runs. Build once and reuse: building resolves the functions.

    Attributes:
        on_unbound: ``"undefined"`` (default) lets an unbound root variable read as
            undefined, reporting it only if that undefined reaches the result or an
            operator rejects it; ``"error"`` fails on the first read of one.
        loop_budget: back edges a program's loops may take in one execution, shared
            by all its loops; ``0`` forbids looping.
        clock: the source of "now" for relative dates and ``Date.now()``.
        functions: host functions by name; they shadow builtins of the same name.
        builtins: whether the builtin functions are available.
        host: an opaque object passed to functions declared ``pass_context=True``.
        protected_roots: root variables a program may not assign.

    Raises:
        ValueError: an unknown ``on_unbound`` policy or a negative loop budget.
    """

    on_unbound: Literal["undefined", "error"] = "undefined"
    loop_budget: int = DEFAULT_LOOP_BUDGET
    clock: Callable[[], datetime] = system_clock
    functions: Mapping[str, Function] = field(default_factory=dict)
    builtins: bool = True
    host: object = None
    protected_roots: frozenset[str] = frozenset()
    _run: Run = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.on_unbound not in ("undefined", "error"):
            raise ValueError(f"on_unbound must be 'undefined' or 'error', not {self.on_unbound!r}")
        if type(self.loop_budget) is not int or self.loop_budget < 0:
            raise ValueError(
                f"loop_budget must be a non-negative integer, not {self.loop_budget!r}"
            )
        functions = {**BUILTINS, **self.functions} if self.builtins else dict(self.functions)
        run = Run(
            functions,
            self.clock,
            self.host,
            self.on_unbound == "error",
            frozenset(self.protected_roots),
            self.loop_budget,
        )
        object.__setattr__(self, "_run", run)

    def with_host(self, host: object) -> Options:
        """A copy carrying another ``host``; cheap, since functions are not merged again."""
        shared = self._run
        clone = object.__new__(Options)
        # A frozen dataclass refuses attribute writes; the copy is filled in directly.
        clone.__dict__.update(self.__dict__)
        clone.__dict__["host"] = host
        clone.__dict__["_run"] = Run(
            shared.functions,
            shared.now,
            host,
            shared.unbound_error,
            shared.protected,
            self.loop_budget,
        )
        return clone

    def fresh_run(self) -> Run:
        """A run with its own loop budget, for one program execution."""
        shared = self._run
        return Run(
            shared.functions,
            shared.now,
            shared.host,
            shared.unbound_error,
            shared.protected,
            self.loop_budget,
        )


DEFAULT_OPTIONS: Final = Options()
_EMPTY: Final[Mapping[str, Value]] = {}


def _settle(result: Value) -> Value | ExprError:
    if type(result) is Undefined:
        if result.root is not None:
            return UndefinedVariableError(
                "unbound_variable",
                f"Undefined variable: {result.root}",
                result.span,
                variable=result.root,
            )
        return UNDEFINED
    return result


def _unexpected(error: Exception) -> EvaluationError:
    if isinstance(error, RecursionError):
        return EvaluationError("too_deep", "Data nested too deeply to evaluate")
    return EvaluationError("internal_error", f"{type(error).__name__}: {error}")


class Expression:
    """A compiled expression. Immutable and safe to share between threads.

    Attributes:
        source: the text it was compiled from.
        tree: its syntax tree.
    """

    __slots__ = ("_closure", "source", "tree")

    def __init__(self, source: str, tree: n.Expression) -> None:
        self.source = source
        self.tree = tree
        self._closure: Closure = compile_node(tree)

    def __repr__(self) -> str:
        return f"Expression({self.source!r})"

    def evaluate(
        self, context: Mapping[str, Value] = _EMPTY, options: Options = DEFAULT_OPTIONS
    ) -> Value | ExprError:
        """Evaluate against ``context`` (a mapping of root variable names to values).

        Returns the value, or an error value; never raises.
        """
        try:
            result = self._closure(context, options._run)
        except Fail as failure:
            return failure.error
        except Exception as error:  # noqa: BLE001 - defensive: nothing escapes evaluation
            return _unexpected(error)
        if type(result) is Undefined:
            return _settle(result)
        return result


@dataclass(frozen=True, slots=True)
class ProgramResult:
    """What running a program produced.

    Attributes:
        context: the context after the last statement that completed. On an error it
            holds the writes made before the failing statement: keep it, or keep the
            context you started from, as your policy requires.
        value: the value of the last expression statement that ran (undefined if none).
        error: why execution stopped early, or ``None``.
        loops: the back edges its loops took (each ``while`` iteration counts one),
            for a host that bounds the work of many programs together.
    """

    context: dict[str, Value]
    value: Value
    error: ExprError | None
    loops: int = 0


class Program:
    """A compiled statement program. Immutable and safe to share between threads."""

    __slots__ = ("_step", "source", "tree")

    def __init__(self, source: str, tree: n.Program) -> None:
        self.source = source
        self.tree = tree
        self._step: Step = compile_statements(tree.statements)

    def __repr__(self) -> str:
        return f"Program({self.source!r})"

    def execute(
        self, context: Mapping[str, Value] = _EMPTY, options: Options = DEFAULT_OPTIONS
    ) -> ProgramResult:
        """Run the statements against a copy of ``context``; never raises.

        The caller's mapping and everything nested in it are left unchanged.
        """
        data = dict(context)
        run = options.fresh_run()
        error: ExprError | None = None
        try:
            self._step(data, run)
        except Fail as failure:
            error = failure.error
        except Exception as unexpected:  # noqa: BLE001 - nothing escapes execution
            error = _unexpected(unexpected)
        value = UNDEFINED if type(run.last) is Undefined else run.last
        return ProgramResult(data, value, error, options.loop_budget - run.budget)


def compile_expression(source: str, limits: Limits = DEFAULT_LIMITS) -> Expression | ParseError:
    """Compile ``source`` as an expression, or return the ParseError.

    >>> compile_expression("score >> 85").span.column
    8
    """
    tree = parse_expression(source, limits)
    if isinstance(tree, ParseError):
        return tree
    return Expression(source, tree)


def compile_program(source: str, limits: Limits = DEFAULT_LIMITS) -> Program | ParseError:
    """Compile ``source`` as a statement program, or return the ParseError."""
    tree = parse_program(source, limits)
    if isinstance(tree, ParseError):
        return tree
    return Program(source, tree)


def evaluate(
    source: str, context: Mapping[str, Value] = _EMPTY, options: Options = DEFAULT_OPTIONS
) -> Value | ExprError:
    """Compile and evaluate in one step (compile once instead when repeating).

    >>> evaluate("role in ['admin', 'manager']", {"role": "admin"})
    True
    >>> evaluate("missing == 5").kind
    'UndefinedVariableError'
    """
    compiled = compile_expression(source)
    if isinstance(compiled, ParseError):
        return compiled
    return compiled.evaluate(context, options)


def execute(
    source: str, context: Mapping[str, Value] = _EMPTY, options: Options = DEFAULT_OPTIONS
) -> ProgramResult | ParseError:
    """Compile and run a program in one step.

    >>> execute("x = 1; if x > 0 { y = 2 } else { y = 3 }").context
    {'x': 1, 'y': 2}
    """
    compiled = compile_program(source)
    if isinstance(compiled, ParseError):
        return compiled
    return compiled.execute(context, options)
