"""The runs table's small expression language: ``--where``, ``?where=``, the dashboard's filter.

    metrics.val_loss.min < 0.1 and hparams.lr >= 1e-3 and state = COMPLETED
    (tag = baseline or project = vision) and not name ~ smoke

A real parser (a tokenizer and a recursive descent, nothing evaluated): an expression becomes a
tree of :class:`Compare`, :class:`In`, :class:`And`, :class:`Or` and :class:`Not` nodes that the
store turns into SQL (:mod:`trainhouse.store.runs`). An error (:class:`QueryError`) names the
bad token and its column, with a caret under it.

Fields (:func:`parse_field`, also what ``columns`` and ``sort`` name):

- the job's own: ``id``, ``name``, ``owner``, ``state``, ``priority``, ``project``, ``tag``
  (a job matches ``tag = x`` when x is one of its tags), ``created_at``, ``started_at``,
  ``ended_at``, ``restarts``, ``last_step``; ``note`` (the user's note, ``trainhouse note``: a
  filter with ``=``, ``!=`` or ``~``, not a sort key) and ``reason`` (the scheduler's words on
  why a job waits or how it ended: a column only);
- ``hparams.KEY``: the hyperparameter the run used (nested keys joined with dots);
- ``metrics.NAME.last``, ``.min``, ``.max``: a summary of the job's own series NAME (which may
  itself hold dots: the last part is the summary);
- ``datasets.KEY``: the dataset version the job pinned under KEY, as ``NAME@VERSION``
  (``datasets.train = "digits@2"``; ``= digits`` matches any version of digits, ``~`` a part).

Operators: ``=`` (or ``==``), ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``~`` (contains, any case),
``in (a, b, ...)``; ``and``, ``or``, ``not`` and parentheses. Values: numbers, quoted strings
(``'...'`` or ``"..."``), and bare words (``COMPLETED``, ``true``). A number compares with a
number; anything else with text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from trainhouse.core.errors import QueryError

__all__ = [
    "AGGREGATES",
    "DISPLAY_ONLY_FIELDS",
    "JOB_FIELDS",
    "MAX_QUERY",
    "TEXT_JOB_FIELDS",
    "And",
    "Compare",
    "Field",
    "In",
    "Node",
    "Not",
    "Or",
    "QueryError",
    "parse",
    "parse_field",
    "parse_fields",
]

MAX_QUERY = 2000  # characters in one expression
MAX_DEPTH = 32  # nesting of parentheses and ``not``
MAX_TERMS = 64  # comparisons in one expression
AGGREGATES = ("last", "min", "max")
# the job's own columns a query may name; "tag" is a membership test
JOB_FIELDS = (
    "id",
    "name",
    "owner",
    "state",
    "priority",
    "project",
    "tag",
    "created_at",
    "started_at",
    "ended_at",
    "restarts",
    "last_step",
    "note",
    "reason",
)
# what a column may show but a filter or a sort may not name: the scheduler's reason changes
# with every tick (what is shown is the live one, not a stored one)
DISPLAY_ONLY_FIELDS = frozenset({"reason"})
# long prose: a filter (``note ~ baseline``), never a sort key
TEXT_JOB_FIELDS = frozenset({"note", "reason"})
NUMERIC_JOB_FIELDS = frozenset(
    {"id", "created_at", "started_at", "ended_at", "restarts", "last_step"}
)

Op = Literal["=", "!=", "<", "<=", ">", ">=", "~"]
Value = float | str


@dataclass(frozen=True)
class Field:
    """What a column, sort key or comparison names: ``kind`` "job" (``key`` a job field),
    "hparams" (``key`` the hparam) or "metrics" (``key`` the series, ``aggregate`` its
    summary)."""

    kind: Literal["job", "hparams", "metrics", "datasets"]
    key: str
    aggregate: Literal["last", "min", "max"] | None = None

    def __str__(self) -> str:
        if self.kind == "job":
            return self.key
        if self.kind == "hparams":
            return f"hparams.{self.key}"
        if self.kind == "datasets":
            return f"datasets.{self.key}"
        return f"metrics.{self.key}.{self.aggregate}"


@dataclass(frozen=True)
class Compare:
    field: Field
    op: Op
    value: Value


@dataclass(frozen=True)
class In:
    field: Field
    values: tuple[Value, ...]


@dataclass(frozen=True)
class And:
    parts: tuple[Node, ...]


@dataclass(frozen=True)
class Or:
    parts: tuple[Node, ...]


@dataclass(frozen=True)
class Not:
    part: Node


Node = Compare | In | And | Or | Not


def parse_field(name: str) -> Field:
    """A field's name (``hparams.lr``, ``metrics.val_loss.min``, ``state``) as a Field; raises
    ValueError naming what is wrong."""
    name = name.strip()
    if not name:
        raise ValueError("an empty field name")
    if len(name) > 300:
        raise ValueError(f"field name {name[:40]!r}... is longer than 300 characters")
    head, _, rest = name.partition(".")
    if head == "hparams":
        if not rest:
            raise ValueError("'hparams' needs a key: hparams.lr")
        return Field("hparams", rest)
    if head == "datasets":
        if not rest or "." in rest:
            raise ValueError("'datasets' needs a key: datasets.train")
        return Field("datasets", rest)
    if head == "metrics":
        series, dot, aggregate = rest.rpartition(".")
        if not dot or not series or aggregate not in AGGREGATES:
            raise ValueError(
                f"{name!r}: a metric field is metrics.<series>.<{'|'.join(AGGREGATES)}>, "
                "such as metrics.val_loss.min"
            )
        return Field("metrics", series, aggregate)  # type: ignore[arg-type]
    if name in JOB_FIELDS:
        return Field("job", name)
    raise ValueError(
        f"unknown field {name!r}{_suggest(name, JOB_FIELDS)}: fields are "
        f"{', '.join(JOB_FIELDS)}, hparams.<key>, metrics.<series>.<last|min|max> and "
        "datasets.<key>"
    )


def parse_fields(names: str) -> list[Field]:
    """A comma-separated list of fields (``--columns``), each at most once, in order."""
    out: list[Field] = []
    for part in names.split(","):
        if part.strip():
            f = parse_field(part)
            if f not in out:
                out.append(f)
    return out


def _suggest(word: str, choices: tuple[str, ...] | list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


# -- tokens ----------------------------------------------------------------------------------
_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.]))
  | (?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<op>==|!=|<=|>=|=|<|>|~)
  | (?P<paren>[(),])
  | (?P<word>[A-Za-z_][\w\-/.:]*)
    """,
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "not", "in"}


@dataclass(frozen=True)
class _Token:
    kind: str  # number | string | op | paren | word | keyword | end
    text: str
    column: int  # 1-based


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    i = 0
    while i < len(text):
        m = _TOKEN.match(text, i)
        if m is None:
            raise QueryError(f"unexpected character {text[i]!r}", text, i + 1, text[i])
        kind = m.lastgroup or ""
        if kind == "string" and m.group().count("\n"):
            raise QueryError("a string may not span lines", text, i + 1, m.group())
        if kind != "space":
            word = m.group()
            if kind == "word" and word.lower() in _KEYWORDS:
                kind, word = "keyword", word.lower()
            out.append(_Token(kind, word, i + 1))
        i = m.end()
    out.append(_Token("end", "", len(text) + 1))
    return out


def _unquote(token: str) -> str:
    return re.sub(r"\\(.)", r"\1", token[1:-1])


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.i = 0
        self.terms = 0

    def error(self, message: str, token: _Token) -> QueryError:
        shown = token.text or "the end"
        return QueryError(
            f"{message}, found {shown!r}" if token.text else f"{message}, found {shown}",
            self.text,
            token.column,
            token.text,
        )

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def expression(self, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise self.error(f"nested deeper than {MAX_DEPTH} levels", self.peek())
        parts = [self.conjunction(depth)]
        while self.peek().text == "or" and self.peek().kind == "keyword":
            self.take()
            parts.append(self.conjunction(depth))
        return parts[0] if len(parts) == 1 else Or(tuple(parts))

    def conjunction(self, depth: int) -> Node:
        parts = [self.negation(depth)]
        while self.peek().text == "and" and self.peek().kind == "keyword":
            self.take()
            parts.append(self.negation(depth))
        return parts[0] if len(parts) == 1 else And(tuple(parts))

    def negation(self, depth: int) -> Node:
        token = self.peek()
        if token.kind == "keyword" and token.text == "not":
            self.take()
            if depth + 1 > MAX_DEPTH:
                raise self.error(f"nested deeper than {MAX_DEPTH} levels", token)
            return Not(self.negation(depth + 1))
        return self.atom(depth)

    def atom(self, depth: int) -> Node:
        token = self.take()
        if token.kind == "paren" and token.text == "(":
            node = self.expression(depth + 1)
            close = self.take()
            if close.text != ")":
                raise self.error(f"expected ')' to close the '(' at column {token.column}", close)
            return node
        if token.kind != "word":
            raise self.error(
                "expected a field (such as state, hparams.lr, metrics.loss.min)", token
            )
        try:
            field = parse_field(token.text)
        except ValueError as e:
            raise QueryError(str(e), self.text, token.column, token.text) from None
        if field.kind == "job" and field.key in DISPLAY_ONLY_FIELDS:
            raise QueryError(
                f"{field.key!r} is a column, not a filter: it is the scheduler's word of the "
                "moment (the user's note is 'note')",
                self.text,
                token.column,
                token.text,
            )
        self.terms += 1
        if self.terms > MAX_TERMS:
            raise self.error(f"more than {MAX_TERMS} comparisons", token)
        op = self.take()
        if op.kind == "keyword" and op.text == "in":
            return In(field, self.value_list(field))
        if op.kind != "op":
            raise self.error(
                f"expected an operator (=, !=, <, <=, >, >=, ~, in) after {token.text!r}", op
            )
        value = self.value(field)
        compare_op: Op = "=" if op.text == "==" else op.text  # type: ignore[assignment]
        if compare_op == "~" and isinstance(value, float):
            value = _number_text(value)
        if field.kind == "metrics" and not isinstance(value, float):
            raise self.error(
                f"{field} is a number; compare it with a number", self.tokens[self.i - 1]
            )
        return Compare(field, compare_op, value)

    def value_list(self, field: Field) -> tuple[Value, ...]:
        open_ = self.take()
        if open_.text != "(":
            raise self.error("expected '(' after 'in'", open_)
        values = [self.value(field)]
        while self.peek().text == ",":
            self.take()
            values.append(self.value(field))
        close = self.take()
        if close.text != ")":
            raise self.error("expected ',' or ')' in the list", close)
        if len(values) > 100:
            raise self.error("more than 100 values in one list", close)
        return tuple(values)

    def value(self, field: Field) -> Value:
        token = self.take()
        if token.kind == "number":
            number = float(token.text)
            if number != number or number in (float("inf"), float("-inf")):
                raise self.error("expected a finite number", token)
            return number
        if token.kind == "string":
            return _unquote(token.text)
        if token.kind == "word":
            return token.text
        raise self.error(f"expected a value to compare {field} with", token)


def _number_text(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)


def parse(text: str) -> Node | None:
    """The expression's tree; None for an empty one. Raises :class:`QueryError`."""
    if len(text) > MAX_QUERY:
        raise QueryError(f"the expression is longer than {MAX_QUERY} characters", text[:60], 1, "")
    if not text.strip():
        return None
    parser = _Parser(text)
    node = parser.expression(0)
    rest = parser.peek()
    if rest.kind != "end":
        raise parser.error("expected 'and', 'or' or the end", rest)
    return node


def fields_of(node: Node | None) -> set[Field]:
    """Every field ``node`` names."""
    if node is None:
        return set()
    if isinstance(node, Compare | In):
        return {node.field}
    if isinstance(node, Not):
        return fields_of(node.part)
    out: set[Field] = set()
    for part in node.parts:
        out |= fields_of(part)
    return out


def suggest(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or nothing."""
    return _suggest(word, choices)
