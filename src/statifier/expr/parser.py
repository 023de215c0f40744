"""Recursive-descent parser: tokens to a syntax tree, in expression or program mode.

Grammar, loosest binding first::

    program     := statement (";" statement)* ";"?
    statement   := "if" expr block ("else" (block | if))? | "while" expr block
                 | location "=" expr | expr
    block       := "{" (statement (";" statement)* ";"?)? "}"
    expr        := and (("or" | "||") and)*
    and         := not (("and" | "&&") not)*
    not         := ("not" | "!") not | comparison
    comparison  := additive (("==" | "!=" | "===" | "!==" | ">" | ">=" | "<" | "<="
                              | "in" | "contains") additive)?
    additive    := multiplicative (("+" | "-") multiplicative)*
    multiplicative := unary (("*" | "/" | "%") unary)*
    unary       := ("-" | "!") unary | postfix
    postfix     := primary ("." NAME | "[" expr "]" | "::" TYPE)*
    primary     := literal | NAME | call | list | object | duration | relative | "(" expr ")"

A statement ending in ``}`` needs no ``;`` after it. Every node's span is the token an
error is blamed on: the operator for an operation, the name for a variable or call.

``&&`` and ``||`` are other spellings of ``and`` and ``or``. ``!`` is two operators,
as in the original: where ``not`` could begin a term it *is* ``not`` (loose, so
``!x > 3`` is ``!(x > 3)``, and a ``Unary("not")`` node); after an arithmetic or
comparison operator or another unary operator it is the tight unary ``!``.

``else if`` is sugar for an else block holding one ``if``; a chain of them is one
level of nesting however long it is (``Limits.max_branches`` bounds its length).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from statifier.expr import nodes as n
from statifier.expr.errors import ParseError, Span
from statifier.expr.lexer import (
    DATE,
    DATETIME,
    DURATION,
    EOF,
    FLOAT,
    IDENT,
    INT,
    KEYWORD,
    OP,
    STRING,
    LexFailure,
    Token,
    tokenize,
)
from statifier.expr.values import UNDEFINED, Duration

__all__ = ["CAST_TYPES", "Limits", "parse_expression", "parse_program"]

CAST_TYPES: Final = ("integer", "float", "string", "boolean", "date", "datetime", "duration")

_COMPARISONS: Final = frozenset({"==", "!=", "===", "!==", ">", ">=", "<", "<="})
_MEMBERSHIP: Final = frozenset({"in", "contains"})
_LITERAL_WORDS: Final = {"true": True, "false": False, "null": None, "undefined": UNDEFINED}
_ASSIGNMENT_HERE: Final = (
    "'=' is assignment, allowed only at the start of a program statement; use '==' to compare"
)
# Keywords that stay usable as property names and bare object keys.
_SOFT_KEYWORDS: Final = frozenset({"and", "or", "not", "in", "contains"})


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on untrusted source.

    Attributes:
        max_source_length: longest accepted source, in characters.
        max_depth: deepest accepted nesting, counted in syntax-tree levels (an
            ``else if`` chain counts as one level).
        max_branches: most ``if`` branches in one ``if``/``else if`` chain.
    """

    max_source_length: int = 65_536
    max_depth: int = 64
    max_branches: int = 256


DEFAULT_LIMITS: Final = Limits()


class _Abort(Exception):  # noqa: N818 - internal control flow, never escapes this module
    def __init__(self, error: ParseError) -> None:
        super().__init__(error.message)
        self.error = error


def parse_expression(source: str, limits: Limits = DEFAULT_LIMITS) -> n.Expression | ParseError:
    """Parse ``source`` as a single expression.

    Returns the tree, or a ParseError (``=``, ``if`` and ``while`` are refused here:
    they belong to programs).
    """
    return _run(source, limits, program=False)  # type: ignore[return-value]


def parse_program(source: str, limits: Limits = DEFAULT_LIMITS) -> n.Program | ParseError:
    """Parse ``source`` as a statement program."""
    return _run(source, limits, program=True)  # type: ignore[return-value]


def _run(source: str, limits: Limits, *, program: bool) -> n.Program | n.Expression | ParseError:
    if len(source) > limits.max_source_length:
        return ParseError(
            "too_long",
            f"Source is {len(source)} characters; the limit is {limits.max_source_length}",
            Span(1, 1, 1, 1),
        )
    try:
        parser = _Parser(tokenize(source), limits)
        tree: n.Program | n.Expression = parser.program() if program else parser.whole_expression()
        _check_depth(tree, limits.max_depth)
    except LexFailure as failure:
        return failure.error
    except _Abort as abort:
        return abort.error
    except RecursionError:  # the caller's own stack was already deep
        return ParseError("too_deep", "Nesting too deep for the available stack", Span(1, 1, 1, 1))
    return tree


def _children(node: object) -> list[object]:
    if isinstance(node, n.Program | n.Block):
        return list(node.statements)
    if isinstance(node, n.ExprStatement):
        return [node.expression]
    if isinstance(node, n.Assign):
        return [node.target, node.value]
    if isinstance(node, n.If):
        return [node.condition, node.then, *([node.otherwise] if node.otherwise else [])]
    if isinstance(node, n.While):
        return [node.condition, node.body]
    if isinstance(node, n.Access | n.Cast):
        return [node.target if isinstance(node, n.Access) else node.operand]
    if isinstance(node, n.Index):
        return [node.target, node.key]
    if isinstance(node, n.Unary):
        return [node.operand]
    if isinstance(node, n.Compare):
        return [node.left, node.right]
    if isinstance(node, n.Logical | n.Binary):
        return list(node.operands)
    if isinstance(node, n.Call):
        return list(node.args)
    if isinstance(node, n.ListLiteral):
        return list(node.items)
    if isinstance(node, n.ObjectLiteral):
        return [value for _, value in node.entries]
    return []


def _check_depth(tree: object, max_depth: int) -> None:
    """Refuse trees deeper than ``max_depth``, walking without recursion."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            span = getattr(node, "span", Span(1, 1, 1, 1))
            raise _Abort(ParseError("too_deep", f"Nesting deeper than {max_depth} levels", span))
        if isinstance(node, n.If) and _is_else_if(node.otherwise):
            # ``else if`` sugar: the nested if stands at its parent's level.
            assert node.otherwise is not None
            stack.append((node.otherwise.statements[0], depth))
            stack.extend((child, depth + 1) for child in (node.condition, node.then))
            continue
        stack.extend((child, depth + 1) for child in _children(node))


def _is_else_if(block: n.Block | None) -> bool:
    """Whether ``block`` is what ``else if`` desugars to.

    The parser gives that block the span of its ``if`` keyword; a block written with
    braces has the span of its ``{``, so the two cannot be confused.
    """
    return (
        block is not None
        and len(block.statements) == 1
        and isinstance(block.statements[0], n.If)
        and block.span == block.statements[0].span
    )


class _Parser:
    def __init__(self, tokens: list[Token], limits: Limits) -> None:
        self.tokens = tokens
        self.position = 0
        self.limits = limits
        self.depth = 0

    # -- token helpers -------------------------------------------------------------

    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.position + ahead, len(self.tokens) - 1)]

    def advance(self) -> Token:
        token = self.tokens[self.position]
        if token.kind != EOF:
            self.position += 1
        return token

    def at(self, kind: str, value: object = None, ahead: int = 0) -> bool:
        token = self.peek(ahead)
        return token.kind == kind and (value is None or token.value == value)

    def fail(self, message: str, token: Token | None = None) -> _Abort:
        return _Abort(ParseError("syntax", message, (token or self.peek()).span))

    def expect_op(self, op: str, what: str) -> Token:
        if self.at(OP, "=") and op != "=":
            raise self.fail(_ASSIGNMENT_HERE)
        if not self.at(OP, op):
            raise self.fail(f"Expected '{op}' {what} but found {_describe(self.peek())}")
        return self.advance()

    def enter(self) -> None:
        self.depth += 1
        if self.depth > self.limits.max_depth:
            raise _Abort(
                ParseError(
                    "too_deep",
                    f"Nesting deeper than {self.limits.max_depth} levels",
                    self.peek().span,
                )
            )

    def leave(self) -> None:
        self.depth -= 1

    # -- programs ------------------------------------------------------------------

    def whole_expression(self) -> n.Expression:
        expression = self.expression()
        token = self.peek()
        if token.kind == OP and token.value == "=":
            raise self.fail(_ASSIGNMENT_HERE, token)
        if token.kind != EOF:
            raise self.fail(f"Unexpected {_describe(token)} after the expression", token)
        return expression

    def program(self) -> n.Program:
        start = self.peek().span
        statements = self.statements(closing=None)
        return n.Program(tuple(statements), start)

    def statements(self, closing: str | None) -> list[n.Statement]:
        statements: list[n.Statement] = []
        while not (self.at(EOF) or (closing is not None and self.at(OP, closing))):
            statement = self.statement()
            statements.append(statement)
            if self.at(OP, ";"):
                self.advance()
            elif not (
                self.at(EOF)
                or (closing is not None and self.at(OP, closing))
                or isinstance(statement, n.If | n.While)
            ):
                raise self.fail(
                    f"Expected ';' between statements but found {_describe(self.peek())}"
                )
        if closing is None and not self.at(EOF):
            raise self.fail(f"Unexpected {_describe(self.peek())}")
        return statements

    def statement(self) -> n.Statement:
        token = self.peek()
        if token.kind == KEYWORD and token.value == "if":
            return self.if_statement()
        if token.kind == KEYWORD and token.value == "while":
            self.advance()
            condition = self.expression()
            return n.While(condition, self.block(), token.span)
        if token.kind == KEYWORD and token.value == "else":
            raise self.fail("'else' without a matching 'if'", token)
        expression = self.expression()
        if self.at(OP, "="):
            equals = self.advance()
            if not _is_location(expression):
                raise self.fail("Only a variable, property or index can be assigned to", equals)
            value = self.expression()
            return n.Assign(expression, value, equals.span)  # type: ignore[arg-type]
        return n.ExprStatement(expression, token.span)

    def if_statement(self) -> n.If:
        """An ``if`` and its whole ``else if`` chain, read in a loop: the chain is one
        level of nesting, not one per branch."""
        self.enter()
        branches: list[tuple[Token, n.Expression, n.Block]] = []
        otherwise: n.Block | None = None
        while True:
            token = self.advance()  # the ``if``
            if len(branches) == self.limits.max_branches:
                raise _Abort(
                    ParseError(
                        "too_deep",
                        f"More than {self.limits.max_branches} branches in one if/else-if chain",
                        token.span,
                    )
                )
            condition = self.expression()
            branches.append((token, condition, self.block()))
            if not self.at(KEYWORD, "else"):
                break
            self.advance()
            if not self.at(KEYWORD, "if"):
                otherwise = self.block()
                break
        self.leave()
        token, condition, then = branches.pop()
        node = n.If(condition, then, otherwise, token.span)
        for token, condition, then in reversed(branches):
            # ``else if`` desugars to an else block holding the next if (see _is_else_if).
            node = n.If(condition, then, n.Block((node,), node.span), token.span)
        return node

    def block(self) -> n.Block:
        opening = self.expect_op("{", "to open a block (braces are required)")
        self.enter()
        statements = self.statements(closing="}")
        self.expect_op("}", "to close the block")
        self.leave()
        return n.Block(tuple(statements), opening.span)

    # -- expressions -----------------------------------------------------------------

    def expression(self) -> n.Expression:
        self.enter()
        node = self.operation(_OR)
        self.leave()
        return node

    def operation(self, level: int) -> n.Expression:
        """Operators binding at ``level`` or tighter (precedence climbing: one Python
        frame per level of nesting rather than one per precedence level).

        ``and``/``or`` chains and arithmetic chains of one precedence become single
        n-ary nodes, so a long chain does not make the tree deep.
        """
        if level <= _NOT and (self.at(KEYWORD, "not") or self.at(OP, "!")):
            # Where ``not`` may begin a term, ``!`` is ``not`` (as in the original).
            token = self.advance()
            self.enter()
            operand = self.operation(_NOT)
            self.leave()
            left: n.Expression = n.Unary("not", operand, token.span, token.text)
        else:
            left = self.unary()
        while True:
            token = self.peek()
            found = _level(token)
            if found is None or found < level:
                return left
            if found in (_OR, _AND):
                word = "or" if found == _OR else "and"
                operands, spans, words = [left], [], []
                while _level(self.peek()) == found:  # either spelling: ``and``/``&&``
                    operator_token = self.advance()
                    spans.append(operator_token.span)
                    words.append(operator_token.text)
                    operands.append(self.operation(found + 1))
                left = n.Logical(word, tuple(operands), tuple(spans), spans[0], tuple(words))
            elif found == _COMPARISON:
                self.advance()
                left = n.Compare(str(token.value), left, self.operation(found + 1), token.span)
                if _level(self.peek()) == _COMPARISON:
                    raise self.fail("Comparisons do not chain; join them with 'and'")
            else:
                ops, operands, spans = [], [left], []
                while _level(self.peek()) == found:
                    operator = self.advance()
                    ops.append(str(operator.value))
                    spans.append(operator.span)
                    operands.append(self.operation(found + 1))
                left = n.Binary(tuple(ops), tuple(operands), tuple(spans), spans[0])

    def unary(self) -> n.Expression:
        if self.at(OP, "-") or self.at(OP, "!"):
            token = self.advance()
            self.enter()
            operand = self.unary()
            self.leave()
            return n.Unary(str(token.value), operand, token.span, token.text)
        return self.postfix()

    def postfix(self) -> n.Expression:
        node = self.primary()
        while True:
            if self.at(OP, "."):
                self.advance()
                name = self.property_name()
                if self.at(OP, "(") and _dotted_name(node) is not None:
                    node = self.call(f"{_dotted_name(node)}.{name.value}", node.span, name)
                else:
                    node = n.Access(node, str(name.value), name.span)
            elif self.at(OP, "["):
                bracket = self.advance()
                key = self.expression()
                self.expect_op("]", "to close the index")
                node = n.Index(node, key, bracket.span)
            elif self.at(OP, "::"):
                colons = self.advance()
                type_token = self.peek()
                if type_token.kind != IDENT or type_token.value not in CAST_TYPES:
                    raise self.fail(
                        f"Unknown cast type {_describe(type_token)}; expected one of "
                        + ", ".join(CAST_TYPES),
                        type_token,
                    )
                self.advance()
                node = n.Cast(node, str(type_token.value), colons.span)
            else:
                return node

    def property_name(self) -> Token:
        token = self.peek()
        if token.kind == IDENT or (token.kind == KEYWORD and token.value in _SOFT_KEYWORDS):
            return self.advance()
        raise self.fail(f"Expected a property name after '.' but found {_describe(token)}")

    def call(self, name: str, start: Span, last: Token) -> n.Call:
        self.expect_op("(", "to start the arguments")
        args = self.sequence(")", "the argument list")
        span = Span(start.line, start.column, last.span.end_line, last.span.end_column)
        return n.Call(name, tuple(args), span)

    def sequence(self, closing: str, what: str) -> list[n.Expression]:
        items: list[n.Expression] = []
        if self.at(OP, closing):
            self.advance()
            return items
        while True:
            items.append(self.expression())
            if self.at(OP, ","):
                self.advance()
                continue
            self.expect_op(closing, f"to close {what}")
            return items

    def primary(self) -> n.Expression:
        token = self.peek()
        kind = token.kind
        if kind in (INT, FLOAT, STRING, DATE, DATETIME):
            self.advance()
            return n.Literal(token.value, token.span)
        if kind == DURATION:
            return self.duration()
        if kind == KEYWORD:
            if token.value in _LITERAL_WORDS:
                self.advance()
                return n.Literal(_LITERAL_WORDS[str(token.value)], token.span)
            if token.value in ("if", "while", "else"):
                raise self.fail(
                    f"'{token.value}' is a statement keyword, not an expression: control "
                    "flow is only valid in a program",
                    token,
                )
        if kind == IDENT:
            if token.value in ("next", "last") and self.at(DURATION, ahead=1):
                self.advance()
                duration = self.advance()
                sign = 1 if token.value == "next" else -1
                return n.RelativeDate(_duration_value(duration), sign, token.span)
            self.advance()
            if self.at(OP, "("):
                return self.call(str(token.value), token.span, token)
            return n.Identifier(str(token.value), token.span)
        if kind == OP:
            if token.value == "(":
                self.advance()
                node = self.expression()
                self.expect_op(")", "to close the parenthesis")
                return node
            if token.value == "[":
                self.advance()
                self.enter()
                items = self.sequence("]", "the list")
                self.leave()
                return n.ListLiteral(tuple(items), token.span)
            if token.value == "{":
                return self.object_literal()
        raise self.fail(f"Expected an expression but found {_describe(token)}", token)

    def duration(self) -> n.Expression:
        token = self.advance()
        value = _duration_value(token)
        if self.at(IDENT, "ago"):
            self.advance()
            return n.RelativeDate(value, -1, token.span)
        if self.at(IDENT, "from") and self.at(IDENT, "now", ahead=1):
            self.advance()
            self.advance()
            return n.RelativeDate(value, 1, token.span)
        return n.Literal(value, token.span)

    def object_literal(self) -> n.ObjectLiteral:
        opening = self.advance()
        self.enter()
        entries: list[tuple[str, n.Expression]] = []
        while not (self.at(OP, "}") and not entries):
            key = self.peek()
            if (
                key.kind == STRING
                or key.kind == IDENT
                or (key.kind == KEYWORD and key.value in _SOFT_KEYWORDS)
            ):
                self.advance()
            else:
                raise self.fail(
                    f"Expected an object key (a name or a quoted string) but found "
                    f"{_describe(key)}",
                    key,
                )
            self.expect_op(":", "after the object key")
            entries.append((str(key.value), self.expression()))
            if not self.at(OP, ","):
                break
            self.advance()  # a key must follow: no trailing comma
        self.expect_op("}", "to close the object")
        self.leave()
        return n.ObjectLiteral(tuple(entries), opening.span)


def _duration_value(token: Token) -> Duration:
    assert isinstance(token.value, Duration)
    return token.value


# Binding levels, loosest first.
_OR, _AND, _NOT, _COMPARISON, _ADDITIVE, _MULTIPLICATIVE = range(1, 7)
_OPERATOR_LEVELS: Final = {
    **dict.fromkeys(_COMPARISONS, _COMPARISON),
    "+": _ADDITIVE,
    "-": _ADDITIVE,
    "*": _MULTIPLICATIVE,
    "/": _MULTIPLICATIVE,
    "%": _MULTIPLICATIVE,
    "||": _OR,
    "&&": _AND,
}
_KEYWORD_LEVELS: Final = {"or": _OR, "and": _AND, "in": _COMPARISON, "contains": _COMPARISON}


def _level(token: Token) -> int | None:
    if token.kind == OP:
        return _OPERATOR_LEVELS.get(str(token.value))
    if token.kind == KEYWORD:
        return _KEYWORD_LEVELS.get(str(token.value))
    return None


def _is_location(node: n.Expression) -> bool:
    while isinstance(node, n.Access | n.Index):
        node = node.target
    return isinstance(node, n.Identifier)


def _dotted_name(node: n.Expression) -> str | None:
    if isinstance(node, n.Identifier):
        return node.name
    if isinstance(node, n.Access):
        base = _dotted_name(node.target)
        return None if base is None else f"{base}.{node.name}"
    return None


def _describe(token: Token) -> str:
    if token.kind == EOF:
        return "the end of the input"
    return f"'{token.text}'"
