"""A Prometheus on a virtual clock: it scrapes text expositions, keeps the samples, and answers PromQL the way
Prometheus does, for benchmarks/decisions.py (no cluster, no sockets, no sleeping).

    prometheus = VirtualPrometheus()
    pod = prometheus.add_target({"namespace": "bench", "pod": "sd-abc", ...}, render=metrics.render)
    prometheus.scrape(pod, at=1_750_000_005.0)          # the exposition text, parsed and stored
    samples = await prometheus.query('sum by (pod) (rate(x_total{pod!=""}[5m]))', at=1_750_000_030.0)

`query` has the signature of `specdeploy.clients.prometheus.PrometheusClient.query`, so the operator's own
`query_all` runs against it. It returns `Sample`s (an instant vector; or, for a range-vector answer such as a
subquery, `points` with `value` the last point's) and raises the client's errors: PrometheusBadQuery for
PromQL it cannot parse or execute (HTTP 400/422 from a real Prometheus), PrometheusBadResponse for a scalar
or string answer (the client accepts vectors and matrices only).

Storage and scraping, as Prometheus (model/textparse, scrape/scrape.go): every sample line of the exposition
becomes a sample at the scrape's timestamp (or its own, when the line carries one), with the target's labels
added (an exposed label that collides with one is kept as `exported_<name>`); `up` is 1 for each scrape;
series that vanish from a target's exposition, or whose target is removed, get a stale marker and leave
instant vectors from then on.

PromQL: a recursive-descent parser over the grammar (promql/parser/generated_parser.y), not patterns per
query, and evaluation after promql/engine.go and promql/functions.go, in integer milliseconds as Prometheus
does:

- vector selectors with `=`, `!=`, `=~`, `!~` matchers (regexes anchored), `offset`; an instant selector is
  the newest sample within the lookback delta (5m), none once the series is stale;
- range selectors `v[d]` and subqueries `expr[range:step]` (and `[range:]` with the default step): the
  subquery evaluates `expr` at the absolute multiples of `step` inside the range, as Prometheus aligns them;
- rate, increase, delta with extrapolatedRate's rules (extrapolate to the range's edges when the first or
  last sample is within 1.1 × the average sample spacing, else by half a spacing; counter resets; a counter
  is not extrapolated below zero), irate, idelta, the *_over_time family, histogram_quantile over classic
  `le` buckets (bucketQuantile: the first bucket interpolates from 0, a rank in the +Inf bucket gives the
  upper bound of the last finite one, NaN with no observations), and a few arithmetic functions;
- aggregations (sum, avg, min, max, count, group, stddev, stdvar, topk, bottomk, quantile) with `by` or
  `without`, before or after the argument;
- binary operators with Prometheus' precedence, IEEE arithmetic (0/0 is NaN, x/0 ±Inf), vector matching on
  all labels but the name (or `on`/`ignoring`, `group_left`/`group_right`), comparisons with and without
  `bool`, and `and`/`or`/`unless`.

Range boundaries follow Prometheus 3 (left-open: a range at t covers (t − d, t], a subquery's first step is
after t − range); `left_open=False` gives Prometheus 2's closed ranges ([t − d, t]), which differ only for
samples exactly on the boundary.
"""

from __future__ import annotations

import bisect
import math
import random
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from specdeploy.clients.prometheus import PrometheusBadQuery, PrometheusBadResponse, Sample

DEFAULT_LOOKBACK = 300.0     # seconds: --query.lookback-delta
DEFAULT_SUBQUERY_STEP = 60.0  # seconds: the global evaluation_interval, the step of `expr[range:]`

LabelSet = tuple[tuple[str, str], ...]      # sorted (name, value) pairs, __name__ included
Labels = dict[str, str]

NAME = "__name__"


class PromQLError(Exception):
    """A query that does not parse or cannot be executed; `parse` says which (HTTP 400 or 422)."""

    def __init__(self, message: str, *, parse: bool = False) -> None:
        super().__init__(message)
        self.parse = parse


# --- storage ----------------------------------------------------------------------------------------------

class Series:
    """One time series: its labels and its samples in time order (value None: a stale marker)."""

    __slots__ = ("labels", "name", "times", "values")

    def __init__(self, labels: Labels) -> None:
        self.labels = labels
        self.name = labels.get(NAME, "")
        self.times: list[int] = []
        self.values: list[float | None] = []

    def append(self, t: int, value: float | None) -> None:
        if self.times and t <= self.times[-1]:
            return  # out of order or duplicate: Prometheus rejects it
        self.times.append(t)
        self.values.append(value)


@dataclass(eq=False)
class Target:
    """One scrape target: its labels, how to get its exposition, and when it is scraped."""

    labels: Labels
    render: Callable[[], str]
    offset: float                         # seconds into each scrape interval (Prometheus spreads targets)
    cache: dict[str, Series] = field(default_factory=dict)   # exposition key -> series
    seen: set[int] = field(default_factory=set)              # ids of the series of the last scrape
    removed: bool = False
    scrapes: int = 0


_PAIR = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def parse_sample_key(key: str) -> Labels:
    """`name{a="1",b="2"}` (the part of an exposition line before the value) as labels with __name__."""
    brace = key.find("{")
    if brace < 0:
        return {NAME: key.strip()}
    labels = {NAME: key[:brace].strip()}
    body = key[brace + 1:key.rindex("}")]
    position = 0
    while position < len(body):
        if body[position:].strip() == "":
            break
        match = _PAIR.match(body, position)
        if match is None:
            raise ValueError(f"bad labels in exposition sample {key!r}")
        labels[match.group(1)] = _unescape(match.group(2))
        position = match.end()
    return labels


def split_sample_line(line: str) -> tuple[str, float, int | None]:
    """An exposition sample line as (key, value, timestamp in ms or None)."""
    if "{" in line:
        close = line.rindex("}")
        key, rest = line[:close + 1], line[close + 1:].split()
    else:
        parts = line.split()
        key, rest = parts[0], parts[1:]
    if not rest:
        raise ValueError(f"exposition line without a value: {line!r}")
    return key, float(rest[0]), int(rest[1]) if len(rest) > 1 else None


class Storage:
    """Every series, by label set and by metric name."""

    def __init__(self) -> None:
        self.series: dict[LabelSet, Series] = {}
        self.by_name: dict[str, list[Series]] = {}

    def get(self, labels: Labels) -> Series:
        key = tuple(sorted(labels.items()))
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = Series(dict(labels))
            self.by_name.setdefault(series.name, []).append(series)
        return series

    def add(self, labels: Mapping[str, str], t: float, value: float | None) -> None:
        """One sample at Unix time `t` (seconds); for tests and hand-made series."""
        self.get(dict(labels)).append(_ms(t), value)

    def candidates(self, name: str | None) -> Iterable[Series]:
        if name is not None:
            return self.by_name.get(name, ())
        return self.series.values()


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


# --- the PromQL AST ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Matcher:
    name: str
    op: str            # = != =~ !~
    value: str
    regex: re.Pattern[str] | None = None

    def matches(self, labels: Mapping[str, str]) -> bool:
        actual = labels.get(self.name, "")
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        assert self.regex is not None
        found = self.regex.fullmatch(actual) is not None
        return found if self.op == "=~" else not found


@dataclass(frozen=True)
class NumberLiteral:
    value: float


@dataclass(frozen=True)
class StringLiteral:
    value: str


@dataclass(frozen=True)
class VectorSelector:
    name: str | None
    matchers: tuple[Matcher, ...]
    offset_ms: int = 0


@dataclass(frozen=True)
class MatrixSelector:
    selector: VectorSelector
    range_ms: int


@dataclass(frozen=True)
class Subquery:
    expr: Any
    range_ms: int
    step_ms: int | None           # None: the default evaluation interval
    offset_ms: int = 0


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Aggregate:
    op: str
    expr: Any
    grouping: tuple[str, ...]
    without: bool
    param: Any = None


@dataclass(frozen=True)
class Binary:
    op: str
    lhs: Any
    rhs: Any
    return_bool: bool = False
    on: bool = False
    matching: tuple[str, ...] = ()
    card: str = "one-to-one"              # one-to-one, many-to-one (group_left), one-to-many (group_right)
    include: tuple[str, ...] = ()


@dataclass(frozen=True)
class Unary:
    op: str
    expr: Any


# --- the parser -------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<duration>(?:\d+(?:ms|s|m|h|d|w|y))+(?![a-zA-Z0-9_]))
  | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<ident>[a-zA-Z_][a-zA-Z0-9_:]*)
  | (?P<op>==|!=|=~|!~|<=|>=|[-+*/%^<>=])
  | (?P<punct>[(){}\[\],:@])
""", re.VERBOSE)

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000,
             "y": 31_536_000_000}
_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")

AGGREGATIONS = {"sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "topk", "bottomk", "quantile"}
_PARAM_AGGREGATIONS = {"topk", "bottomk", "quantile"}

# (precedence, right-associative)
_BINARY = {
    "or": (1, False), "and": (2, False), "unless": (2, False),
    "==": (3, False), "!=": (3, False), "<=": (3, False), "<": (3, False), ">=": (3, False), ">": (3, False),
    "+": (4, False), "-": (4, False),
    "*": (5, False), "/": (5, False), "%": (5, False), "atan2": (5, False),
    "^": (6, True),
}
_COMPARISONS = {"==", "!=", "<=", "<", ">=", ">"}
_SET_OPS = {"and", "or", "unless"}


def parse_duration_ms(text: str) -> int:
    """A PromQL duration ("5m", "1h30m", "1500ms") in milliseconds."""
    position, total = 0, 0
    for match in _DURATION_PART.finditer(text):
        if match.start() != position:
            raise PromQLError(f"bad duration {text!r}", parse=True)
        total += int(match.group(1)) * _UNITS_MS[match.group(2)]
        position = match.end()
    if position != len(text) or not text:
        raise PromQLError(f"bad duration {text!r}", parse=True)
    return total


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    position: int


def _tokens(text: str) -> list[_Token]:
    tokens, position = [], 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            raise PromQLError(f"1:{position + 1}: unexpected character {text[position]!r}", parse=True)
        kind = match.lastgroup
        assert kind is not None
        if kind != "space":
            tokens.append(_Token(kind, match.group(), position))
        position = match.end()
    tokens.append(_Token("eof", "", len(text)))
    return tokens


def _string_value(token: str) -> str:
    if token[0] == "`":
        return token[1:-1]
    body = token[1:-1]
    escapes = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'"}
    return re.sub(r"\\(.)", lambda m: escapes.get(m.group(1), "\\" + m.group(1)), body)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.index = 0

    # helpers
    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.index + ahead, len(self.tokens) - 1)]

    def next(self) -> _Token:
        token = self.tokens[self.index]
        self.index = min(self.index + 1, len(self.tokens) - 1)
        return token

    def error(self, message: str, token: _Token | None = None) -> PromQLError:
        token = token or self.peek()
        return PromQLError(f"1:{token.position + 1}: parse error: {message}", parse=True)

    def expect(self, text: str) -> _Token:
        token = self.next()
        if token.text != text:
            shown = token.text or "end of input"
            raise self.error(f"unexpected {shown!r}, expected {text!r}", token)
        return token

    def accept(self, text: str) -> bool:
        if self.peek().text == text and self.peek().kind != "string":
            self.next()
            return True
        return False

    # grammar
    def parse(self) -> Any:
        expr = self.expression(0)
        if self.peek().kind != "eof":
            raise self.error(f"unexpected {self.peek().text!r}")
        return expr

    def _binary_op(self) -> str | None:
        token = self.peek()
        if token.kind == "op" and token.text in _BINARY:
            return token.text
        if token.kind == "ident" and token.text in ("and", "or", "unless", "atan2"):
            return token.text
        return None

    def expression(self, min_precedence: int) -> Any:
        lhs = self.unary()
        while True:
            op = self._binary_op()
            if op is None:
                return lhs
            precedence, right = _BINARY[op]
            if precedence < min_precedence:
                return lhs
            self.next()
            return_bool = False
            if self.peek().text == "bool":
                if op not in _COMPARISONS:
                    raise self.error("bool modifier can only be used on comparison operators")
                self.next()
                return_bool = True
            on, matching, card, include = False, (), "one-to-one", ()
            if self.peek().text in ("on", "ignoring") and self.peek(1).text == "(":
                on = self.next().text == "on"
                matching = self.label_list()
                if self.peek().text in ("group_left", "group_right"):
                    card = "many-to-one" if self.next().text == "group_left" else "one-to-many"
                    include = self.label_list() if self.peek().text == "(" else ()
            rhs = self.expression(precedence if right else precedence + 1)
            lhs = Binary(op, lhs, rhs, return_bool, on, matching, card, include)

    def unary(self) -> Any:
        token = self.peek()
        if token.kind == "op" and token.text in ("-", "+"):
            self.next()
            operand = self.unary()
            if isinstance(operand, NumberLiteral):
                return NumberLiteral(-operand.value if token.text == "-" else operand.value)
            return Unary(token.text, operand) if token.text == "-" else operand
        return self.postfix(self.primary())

    def postfix(self, expr: Any) -> Any:
        while True:
            token = self.peek()
            if token.text == "[" and token.kind == "punct":
                self.next()
                range_ms = self.duration()
                if self.accept(":"):
                    step = None if self.peek().text == "]" else self.duration()
                    self.expect("]")
                    expr = Subquery(expr, range_ms, step)
                    continue
                self.expect("]")
                if not isinstance(expr, VectorSelector):
                    raise self.error("ranges only allowed for vector selectors", token)
                expr = MatrixSelector(expr, range_ms)
            elif token.kind == "ident" and token.text == "offset":
                self.next()
                sign = -1 if self.accept("-") else 1
                offset = sign * self.duration()
                expr = _with_offset(expr, offset, self)
            else:
                return expr

    def duration(self) -> int:
        token = self.next()
        if token.kind == "duration":
            return parse_duration_ms(token.text)
        if token.kind == "number":  # Prometheus 3: a plain number of seconds
            return _ms(float(token.text))
        raise self.error(f"expected a duration, got {token.text or 'end of input'!r}", token)

    def label_list(self) -> tuple[str, ...]:
        self.expect("(")
        names: list[str] = []
        while not self.accept(")"):
            token = self.next()
            if token.kind not in ("ident", "string"):
                raise self.error(f"unexpected {token.text!r} in grouping opts", token)
            names.append(_string_value(token.text) if token.kind == "string" else token.text)
            if not self.accept(","):
                self.expect(")")
                break
        return tuple(names)

    def primary(self) -> Any:
        token = self.peek()
        if token.kind == "number":
            self.next()
            return NumberLiteral(float(int(token.text, 16)) if token.text[:2].lower() == "0x" else float(token.text))
        if token.kind == "string":
            self.next()
            return StringLiteral(_string_value(token.text))
        if token.text == "(" and token.kind == "punct":
            self.next()
            expr = self.expression(0)
            self.expect(")")
            return expr
        if token.text == "{" and token.kind == "punct":
            return self.selector(None)
        if token.kind == "ident":
            word = token.text
            following = self.peek(1).text
            if word in AGGREGATIONS and following in ("(", "by", "without"):
                return self.aggregation()
            if following == "(" and word in FUNCTIONS:
                return self.call()
            if word.lower() in ("inf", "nan") and following != "{":
                self.next()
                return NumberLiteral(math.inf if word.lower() == "inf" else math.nan)
            self.next()
            return self.selector(word)
        raise self.error(f"unexpected {token.text or 'end of input'!r}", token)

    def selector(self, name: str | None) -> VectorSelector:
        matchers: list[Matcher] = []
        if self.accept("{"):
            while not self.accept("}"):
                label = self.next()
                if label.kind not in ("ident", "string"):
                    raise self.error(f"unexpected {label.text!r} in label matching", label)
                op = self.next()
                if op.text not in ("=", "!=", "=~", "!~"):
                    raise self.error(f"unexpected {op.text!r} in label matching, expected one of = != =~ !~", op)
                value = self.next()
                if value.kind != "string":
                    raise self.error(f"unexpected {value.text!r} in label matching, expected string", value)
                matchers.append(_matcher(label.text, op.text, _string_value(value.text), self))
                if not self.accept(","):
                    self.expect("}")
                    break
        for matcher in matchers:
            if matcher.name == NAME and matcher.op == "=":
                name = name or matcher.value
        if name is None and all(m.matches({}) for m in matchers):
            raise self.error("vector selector must contain at least one non-empty matcher")
        return VectorSelector(name, tuple(m for m in matchers if not (m.name == NAME and m.op == "=")))

    def aggregation(self) -> Aggregate:
        op = self.next().text
        grouping: tuple[str, ...] = ()
        without = False
        if self.peek().text in ("by", "without"):
            without = self.next().text == "without"
            grouping = self.label_list()
        self.expect("(")
        param = None
        if op in _PARAM_AGGREGATIONS:
            param = self.expression(0)
            self.expect(",")
        expr = self.expression(0)
        self.expect(")")
        if self.peek().text in ("by", "without") and self.peek(1).text == "(":
            without = self.next().text == "without"
            grouping = self.label_list()
        return Aggregate(op, expr, grouping, without, param)

    def call(self) -> Call:
        name = self.next().text
        self.expect("(")
        args: list[Any] = []
        while not self.accept(")"):
            args.append(self.expression(0))
            if not self.accept(","):
                self.expect(")")
                break
        low, high = FUNCTIONS[name][0]
        if not low <= len(args) <= high:
            raise self.error(f"expected {low}{'' if low == high else f' to {high}'} argument(s) in call to "
                             f"{name!r}, got {len(args)}")
        return Call(name, tuple(args))


def _matcher(name: str, op: str, value: str, parser: _Parser) -> Matcher:
    if op in ("=~", "!~"):
        try:
            return Matcher(name, op, value, re.compile(value))
        except re.error as error:
            raise parser.error(f"invalid regular expression {value!r}: {error}") from None
    return Matcher(name, op, value)


def _with_offset(expr: Any, offset: int, parser: _Parser) -> Any:
    if isinstance(expr, VectorSelector):
        return VectorSelector(expr.name, expr.matchers, expr.offset_ms + offset)
    if isinstance(expr, MatrixSelector):
        inner = expr.selector
        return MatrixSelector(VectorSelector(inner.name, inner.matchers, inner.offset_ms + offset), expr.range_ms)
    if isinstance(expr, Subquery):
        return Subquery(expr.expr, expr.range_ms, expr.step_ms, expr.offset_ms + offset)
    raise parser.error("offset modifier must be preceded by a vector selector, a range or a subquery")


def parse_promql(text: str) -> Any:
    """The AST of a PromQL expression; raises PromQLError (parse=True)."""
    return _Parser(text).parse()


# --- values -----------------------------------------------------------------------------------------------

@dataclass
class Vector:
    """An instant vector: (labels, value) per series."""

    items: list[tuple[Labels, float]]


@dataclass
class Matrix:
    """A range vector: (labels, times in ms, values) per series, over (start, end] (ms)."""

    items: list[tuple[Labels, list[int], list[float]]]
    start: int
    end: int
    range_ms: int


Value = float | str | Vector | Matrix


def _without_name(labels: Labels) -> Labels:
    if NAME not in labels:
        return labels
    return {k: v for k, v in labels.items() if k != NAME}


def _key(labels: Labels) -> LabelSet:
    return tuple(sorted(labels.items()))


# --- arithmetic -------------------------------------------------------------------------------------------

def _divide(a: float, b: float) -> float:
    try:
        return a / b
    except ZeroDivisionError:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _modulo(a: float, b: float) -> float:
    try:
        return math.fmod(a, b)
    except ValueError:
        return math.nan


def _power(a: float, b: float) -> float:
    try:
        return math.pow(a, b)
    except OverflowError:
        return math.inf
    except ValueError:
        return math.nan


_ARITHMETIC: dict[str, Callable[[float, float], float]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": _divide, "%": _modulo,
    "^": _power, "atan2": math.atan2,
}
_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}


# --- functions --------------------------------------------------------------------------------------------

def _extrapolated_rate(matrix: Matrix, is_counter: bool, is_rate: bool) -> Vector:
    """promql/functions.go extrapolatedRate, for float samples."""
    out: list[tuple[Labels, float]] = []
    range_start, range_end = matrix.start, matrix.end
    for labels, times, values in matrix.items:
        if len(values) < 2:
            continue
        result = values[-1] - values[0]
        if is_counter:
            previous = values[0]
            for value in values[1:]:
                if value < previous:
                    result += previous
                previous = value
        first_t, last_t = times[0], times[-1]
        duration_to_start = (first_t - range_start) / 1000
        duration_to_end = (range_end - last_t) / 1000
        sampled = (last_t - first_t) / 1000
        average = sampled / (len(values) - 1)
        threshold = average * 1.1
        if duration_to_start >= threshold:
            duration_to_start = average / 2
        if is_counter and result > 0 and values[0] >= 0:
            duration_to_zero = sampled * (values[0] / result)
            if duration_to_zero < duration_to_start:
                duration_to_start = duration_to_zero
        if duration_to_end >= threshold:
            duration_to_end = average / 2
        factor = (sampled + duration_to_start + duration_to_end) / sampled
        if is_rate:
            factor /= matrix.range_ms / 1000
        out.append((_without_name(labels), result * factor))
    return Vector(out)


def _instant_rate(matrix: Matrix, is_rate: bool) -> Vector:
    """irate / idelta: the last two samples."""
    out = []
    for labels, times, values in matrix.items:
        if len(values) < 2:
            continue
        last, previous = values[-1], values[-2]
        change = last - previous
        if is_rate and last < previous:
            change = last   # counter reset
        interval = (times[-1] - times[-2]) / 1000
        if interval == 0:
            continue
        out.append((_without_name(labels), change / interval if is_rate else change))
    return Vector(out)


def _over_time(matrix: Matrix, reduce: Callable[[list[float]], float], keep_name: bool = False) -> Vector:
    return Vector([(labels if keep_name else _without_name(labels), reduce(values))
                   for labels, _, values in matrix.items if values])


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


def _variance(values: list[float]) -> float:
    mean = _mean(values)
    return math.fsum((v - mean) ** 2 for v in values) / len(values)


def _quantile(q: float, values: list[float]) -> float:
    """promql's quantile(): linear interpolation between closest ranks (as aggregation and _over_time)."""
    if not values:
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    lower = max(0, math.floor(rank))
    upper = min(len(ordered) - 1, lower + 1)
    weight = rank - math.floor(rank)
    return ordered[lower] * (1 - weight) + ordered[upper] * weight


SMALL_DELTA_TOLERANCE = 1e-12


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """promql/quantile.go BucketQuantile over (upper bound, cumulative count) pairs."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    if not buckets:
        return math.nan
    ordered = sorted(buckets, key=lambda b: b[0])
    if not math.isinf(ordered[-1][0]) or ordered[-1][0] < 0:
        return math.nan
    merged: list[list[float]] = []
    for upper, count in ordered:      # coalesceBuckets: the same upper bound counts once, summed
        if merged and merged[-1][0] == upper:
            merged[-1][1] += count
        else:
            merged.append([upper, count])
    previous = merged[0][1]
    for bucket in merged[1:]:         # ensureMonotonicAndIgnoreSmallDeltas
        current = bucket[1]
        if current == previous:
            continue
        if abs(current - previous) <= SMALL_DELTA_TOLERANCE * max(abs(current), abs(previous)) or current < previous:
            bucket[1] = previous
        else:
            previous = current
    if len(merged) < 2:
        return math.nan
    observations = merged[-1][1]
    if observations == 0 or math.isnan(observations):
        return math.nan
    rank = q * observations
    b = next((i for i in range(len(merged) - 1) if merged[i][1] >= rank), len(merged) - 1)
    if b == len(merged) - 1:
        return merged[-2][0]
    if b == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start, end, count = 0.0, merged[b][0], merged[b][1]
    if b > 0:
        start = merged[b - 1][0]
        count -= merged[b - 1][1]
        rank -= merged[b - 1][1]
    return start + (end - start) * (rank / count)


def _histogram_quantile(q: float, vector: Vector) -> Vector:
    groups: dict[LabelSet, tuple[Labels, list[tuple[float, float]]]] = {}
    for labels, value in vector.items:
        le = labels.get("le")
        if le is None:
            continue
        try:
            upper = float(le)
        except ValueError:
            continue
        rest = {k: v for k, v in labels.items() if k not in ("le", NAME)}
        groups.setdefault(_key(rest), (rest, []))[1].append((upper, value))
    return Vector([(labels, bucket_quantile(q, buckets)) for labels, buckets in groups.values()])


def _map(vector: Vector, fn: Callable[[float], float]) -> Vector:
    return Vector([(_without_name(labels), fn(value)) for labels, value in vector.items])


def _round(value: float, to_nearest: float = 1.0) -> float:
    if math.isnan(value) or math.isinf(value):
        return value
    return math.floor(value / to_nearest + 0.5) * to_nearest


# name -> ((min args, max args), kind); the implementation is in _Evaluator.call
FUNCTIONS: dict[str, tuple[tuple[int, int], str]] = {
    "rate": ((1, 1), "matrix"), "increase": ((1, 1), "matrix"), "delta": ((1, 1), "matrix"),
    "irate": ((1, 1), "matrix"), "idelta": ((1, 1), "matrix"),
    "avg_over_time": ((1, 1), "matrix"), "sum_over_time": ((1, 1), "matrix"),
    "min_over_time": ((1, 1), "matrix"), "max_over_time": ((1, 1), "matrix"),
    "count_over_time": ((1, 1), "matrix"), "last_over_time": ((1, 1), "matrix"),
    "stddev_over_time": ((1, 1), "matrix"), "stdvar_over_time": ((1, 1), "matrix"),
    "present_over_time": ((1, 1), "matrix"), "quantile_over_time": ((2, 2), "matrix"),
    "histogram_quantile": ((2, 2), "vector"),
    "abs": ((1, 1), "vector"), "ceil": ((1, 1), "vector"), "floor": ((1, 1), "vector"),
    "exp": ((1, 1), "vector"), "ln": ((1, 1), "vector"), "log2": ((1, 1), "vector"),
    "log10": ((1, 1), "vector"), "sqrt": ((1, 1), "vector"), "round": ((1, 2), "vector"),
    "clamp": ((3, 3), "vector"), "clamp_min": ((2, 2), "vector"), "clamp_max": ((2, 2), "vector"),
    "scalar": ((1, 1), "vector"), "vector": ((1, 1), "scalar"), "time": ((0, 0), "none"),
    "timestamp": ((1, 1), "vector"),
}

_OVER_TIME: dict[str, Callable[[list[float]], float]] = {
    "avg_over_time": _mean, "sum_over_time": math.fsum, "min_over_time": min, "max_over_time": max,
    "count_over_time": lambda v: float(len(v)), "last_over_time": lambda v: v[-1],
    "stddev_over_time": lambda v: math.sqrt(_variance(v)), "stdvar_over_time": _variance,
    "present_over_time": lambda v: 1.0,
}
_MATH: dict[str, Callable[[float], float]] = {
    "abs": abs, "ceil": lambda v: float(math.ceil(v)) if math.isfinite(v) else v,
    "floor": lambda v: float(math.floor(v)) if math.isfinite(v) else v,
    "exp": lambda v: math.exp(v) if v < 709.0 or math.isnan(v) else math.inf,
    "ln": lambda v: _log(math.log, v), "log2": lambda v: _log(math.log2, v), "log10": lambda v: _log(math.log10, v),
    "sqrt": lambda v: math.sqrt(v) if v >= 0 else math.nan,
}


def _log(fn: Callable[[float], float], value: float) -> float:
    if math.isnan(value) or value < 0:
        return math.nan
    if value == 0:
        return -math.inf
    return fn(value)


# --- evaluation -------------------------------------------------------------------------------------------

class _Evaluator:
    def __init__(self, storage: Storage, lookback_ms: int, left_open: bool, default_step_ms: int) -> None:
        self.storage = storage
        self.lookback_ms = lookback_ms
        self.left_open = left_open
        self.default_step_ms = default_step_ms
        self.selected: dict[VectorSelector, list[Series]] = {}

    def series_for(self, selector: VectorSelector) -> list[Series]:
        found = self.selected.get(selector)
        if found is None:
            found = [s for s in self.storage.candidates(selector.name)
                     if all(m.matches(s.labels) for m in selector.matchers)]
            self.selected[selector] = found
        return found

    def _start_index(self, times: list[int], start: int) -> int:
        return bisect.bisect_right(times, start) if self.left_open else bisect.bisect_left(times, start)

    def eval(self, node: Any, t: int) -> Value:
        method = getattr(self, "eval_" + type(node).__name__)
        result: Value = method(node, t)
        return result

    def eval_NumberLiteral(self, node: NumberLiteral, t: int) -> float:
        return node.value

    def eval_StringLiteral(self, node: StringLiteral, t: int) -> str:
        return node.value

    def eval_VectorSelector(self, node: VectorSelector, t: int) -> Vector:
        at = t - node.offset_ms
        out = []
        for series in self.series_for(node):
            times = series.times
            index = bisect.bisect_right(times, at) - 1
            if index < 0:
                continue
            age = at - times[index]
            if age > self.lookback_ms or (self.left_open and age == self.lookback_ms):
                continue
            value = series.values[index]
            if value is None:   # stale
                continue
            out.append((series.labels, value))
        return Vector(out)

    def eval_MatrixSelector(self, node: MatrixSelector, t: int) -> Matrix:
        end = t - node.selector.offset_ms
        start = end - node.range_ms
        items = []
        for series in self.series_for(node.selector):
            times = series.times
            low = self._start_index(times, start)
            high = bisect.bisect_right(times, end)
            if low >= high:
                continue
            values = series.values[low:high]
            if None in values:
                pairs = [(tt, v) for tt, v in zip(times[low:high], values, strict=True) if v is not None]
                if not pairs:
                    continue
                items.append((series.labels, [p[0] for p in pairs], [p[1] for p in pairs]))
            else:
                items.append((series.labels, times[low:high], values))  # type: ignore[arg-type]
        return Matrix(items, start, end, node.range_ms)

    def eval_Subquery(self, node: Subquery, t: int) -> Matrix:
        step = node.step_ms or self.default_step_ms
        end = t - node.offset_ms
        start = end - node.range_ms
        first = step * (start // step)
        if first < start or (self.left_open and first == start):
            first += step
        points: dict[LabelSet, tuple[Labels, list[int], list[float]]] = {}
        at = first
        while at <= end:
            value = self.eval(node.expr, at)
            if not isinstance(value, Vector):
                raise PromQLError(f"subquery is only allowed on an instant vector, got {_type(value)}")
            for labels, v in value.items:
                entry = points.setdefault(_key(labels), (labels, [], []))
                entry[1].append(at)
                entry[2].append(v)
            at += step
        return Matrix(list(points.values()), start, end, node.range_ms)

    def eval_Unary(self, node: Unary, t: int) -> Value:
        value = self.eval(node.expr, t)
        if isinstance(value, float):
            return -value
        if isinstance(value, Vector):
            return Vector([(_without_name(labels), -v) for labels, v in value.items])
        raise PromQLError(f"unary expression only allowed on expressions of type scalar or instant vector, got {_type(value)}")

    def eval_Call(self, node: Call, t: int) -> Value:
        name = node.func
        args = [self.eval(arg, t) for arg in node.args]
        if name in ("rate", "increase", "delta", "irate", "idelta") or name in _OVER_TIME:
            matrix = _expect(args[0], Matrix, name)
            if name == "rate":
                return _extrapolated_rate(matrix, True, True)
            if name == "increase":
                return _extrapolated_rate(matrix, True, False)
            if name == "delta":
                return _extrapolated_rate(matrix, False, False)
            if name in ("irate", "idelta"):
                return _instant_rate(matrix, name == "irate")
            return _over_time(matrix, _OVER_TIME[name])
        if name == "quantile_over_time":
            q = _expect(args[0], float, name)
            return _over_time(_expect(args[1], Matrix, name), lambda values: _quantile(q, values))
        if name == "histogram_quantile":
            return _histogram_quantile(_expect(args[0], float, name), _expect(args[1], Vector, name))
        if name in _MATH:
            return _map(_expect(args[0], Vector, name), _MATH[name])
        if name == "round":
            nearest = _expect(args[1], float, name) if len(args) > 1 else 1.0
            return _map(_expect(args[0], Vector, name), lambda v: _round(v, nearest))
        if name == "clamp_min":
            low = _expect(args[1], float, name)
            return _map(_expect(args[0], Vector, name), lambda v: max(v, low) if not math.isnan(v) else v)
        if name == "clamp_max":
            high = _expect(args[1], float, name)
            return _map(_expect(args[0], Vector, name), lambda v: min(v, high) if not math.isnan(v) else v)
        if name == "clamp":
            low, high = _expect(args[1], float, name), _expect(args[2], float, name)
            if low > high:
                return Vector([])
            return _map(_expect(args[0], Vector, name), lambda v: max(low, min(high, v)) if not math.isnan(v) else v)
        if name == "scalar":
            vector = _expect(args[0], Vector, name)
            return vector.items[0][1] if len(vector.items) == 1 else math.nan
        if name == "vector":
            return Vector([({}, _expect(args[0], float, name))])
        if name == "time":
            return t / 1000
        if name == "timestamp":
            return _map(_expect(args[0], Vector, name), lambda v: t / 1000)
        raise PromQLError(f"unknown function {name!r}")

    def eval_Aggregate(self, node: Aggregate, t: int) -> Vector:
        vector = _expect(self.eval(node.expr, t), Vector, node.op)
        param = self.eval(node.param, t) if node.param is not None else None
        groups: dict[LabelSet, tuple[Labels, list[tuple[Labels, float]]]] = {}
        grouping = set(node.grouping)
        for labels, value in vector.items:
            if node.without:
                kept = {k: v for k, v in labels.items() if k not in grouping and k != NAME}
            else:
                kept = {k: labels[k] for k in node.grouping if labels.get(k)}
            groups.setdefault(_key(kept), (kept, []))[1].append((labels, value))
        op = node.op
        out: list[tuple[Labels, float]] = []
        for kept, members in groups.values():
            values = [v for _, v in members]
            if op in ("topk", "bottomk"):
                k = int(_expect(param, float, op))
                chosen = sorted(members, key=lambda m: (math.isnan(m[1]), -m[1] if op == "topk" else m[1]))[:max(0, k)]
                out.extend(chosen)
                continue
            if op == "sum":
                result = math.fsum(values) if all(math.isfinite(v) for v in values) else sum(values)
            elif op == "avg":
                result = _mean(values) if all(math.isfinite(v) for v in values) else sum(values) / len(values)
            elif op == "min":
                finite = [v for v in values if not math.isnan(v)]
                result = min(finite) if finite else math.nan
            elif op == "max":
                finite = [v for v in values if not math.isnan(v)]
                result = max(finite) if finite else math.nan
            elif op == "count":
                result = float(len(values))
            elif op == "group":
                result = 1.0
            elif op == "stddev":
                result = math.sqrt(_variance(values))
            elif op == "stdvar":
                result = _variance(values)
            elif op == "quantile":
                result = _quantile(_expect(param, float, op), values)
            else:
                raise PromQLError(f"unknown aggregation {op!r}")
            out.append((kept, result))
        return Vector(out)

    def eval_Binary(self, node: Binary, t: int) -> Value:
        lhs, rhs = self.eval(node.lhs, t), self.eval(node.rhs, t)
        op = node.op
        if op in _SET_OPS:
            return self._set_op(node, _expect(lhs, Vector, op), _expect(rhs, Vector, op))
        comparison = op in _COMPARISONS
        if isinstance(lhs, float) and isinstance(rhs, float):
            if comparison:
                if not node.return_bool:
                    raise PromQLError("comparisons between scalars must use BOOL modifier")
                return 1.0 if _COMPARE[op](lhs, rhs) else 0.0
            return _ARITHMETIC[op](lhs, rhs)
        if isinstance(lhs, Vector) and isinstance(rhs, Vector):
            return self._vector_op(node, lhs, rhs)
        if isinstance(lhs, Vector) and isinstance(rhs, float):
            return _scalar_op(node, lhs, rhs, scalar_on_left=False)
        if isinstance(lhs, float) and isinstance(rhs, Vector):
            return _scalar_op(node, rhs, lhs, scalar_on_left=True)
        raise PromQLError(f"binary expression must contain only scalar and instant vector types, got "
                          f"{_type(lhs)} {op} {_type(rhs)}")

    def _signature(self, node: Binary, labels: Labels) -> LabelSet:
        if node.on:
            return tuple((name, labels.get(name, "")) for name in sorted(node.matching))
        ignored = set(node.matching)
        return tuple(sorted((k, v) for k, v in labels.items() if k != NAME and k not in ignored))

    def _set_op(self, node: Binary, lhs: Vector, rhs: Vector) -> Vector:
        right = {self._signature(node, labels) for labels, _ in rhs.items}
        if node.op == "and":
            return Vector([item for item in lhs.items if self._signature(node, item[0]) in right])
        if node.op == "unless":
            return Vector([item for item in lhs.items if self._signature(node, item[0]) not in right])
        left = {self._signature(node, labels) for labels, _ in lhs.items}
        return Vector(lhs.items + [item for item in rhs.items if self._signature(node, item[0]) not in left])

    def _vector_op(self, node: Binary, lhs: Vector, rhs: Vector) -> Vector:
        op, comparison = node.op, node.op in _COMPARISONS
        drop_name = not comparison or node.return_bool
        many, one = (lhs, rhs) if node.card != "one-to-many" else (rhs, lhs)
        ones: dict[LabelSet, tuple[Labels, float]] = {}
        for labels, value in one.items:
            signature = self._signature(node, labels)
            if signature in ones:
                side = "right" if node.card != "one-to-many" else "left"
                raise PromQLError(f"found duplicate series for the match group {dict(signature)} on the {side} "
                                  "hand-side of the operation; many-to-many matching not allowed: matching labels "
                                  "must be unique on one side")
            ones[signature] = (labels, value)
        seen: set[LabelSet] = set()
        out: list[tuple[Labels, float]] = []
        for labels, value in many.items:
            signature = self._signature(node, labels)
            match = ones.get(signature)
            if match is None:
                continue
            if node.card == "one-to-one":
                if signature in seen:
                    raise PromQLError(f"found duplicate series for the match group {dict(signature)} on the left "
                                      "hand-side of the operation; many-to-many matching not allowed: matching "
                                      "labels must be unique on one side")
                seen.add(signature)
            left_value, right_value = (value, match[1]) if node.card != "one-to-many" else (match[1], value)
            if comparison:
                holds = _COMPARE[op](left_value, right_value)
                if not node.return_bool and not holds:
                    continue
                result = (1.0 if holds else 0.0) if node.return_bool else left_value
            else:
                result = _ARITHMETIC[op](left_value, right_value)
            out.append((self._result_labels(node, labels, match[0], drop_name), result))
        return Vector(out)

    def _result_labels(self, node: Binary, many: Labels, one: Labels, drop_name: bool) -> Labels:
        result = dict(many)
        if drop_name:
            result.pop(NAME, None)
        if node.card == "one-to-one":
            if node.on:
                keep = set(node.matching)
                result = {k: v for k, v in result.items() if k in keep}
            else:
                for name in node.matching:
                    result.pop(name, None)
        else:
            for name in node.include:
                value = one.get(name, "")
                if value:
                    result[name] = value
                else:
                    result.pop(name, None)
        return result


def _scalar_op(node: Binary, vector: Vector, scalar: float, *, scalar_on_left: bool) -> Vector:
    op = node.op
    out = []
    for labels, value in vector.items:
        left, right = (scalar, value) if scalar_on_left else (value, scalar)
        if op in _COMPARISONS:
            holds = _COMPARE[op](left, right)
            if node.return_bool:
                out.append((_without_name(labels), 1.0 if holds else 0.0))
            elif holds:
                out.append((labels, value))
        else:
            out.append((_without_name(labels), _ARITHMETIC[op](left, right)))
    return Vector(out)


def _type(value: Value) -> str:
    if isinstance(value, float):
        return "scalar"
    if isinstance(value, str):
        return "string"
    return "instant vector" if isinstance(value, Vector) else "range vector"


def _expect(value: Any, kind: type, where: str) -> Any:
    if isinstance(value, int) and kind is float:
        return float(value)
    if not isinstance(value, kind):
        wanted = {float: "scalar", Vector: "instant vector", Matrix: "range vector"}.get(kind, kind.__name__)
        raise PromQLError(f"expected type {wanted} in {where}, got {_type(value)}")
    return value


# --- the server -------------------------------------------------------------------------------------------

class VirtualPrometheus:
    """Scrapes targets when told (virtual time), stores what they expose, answers PromQL.

    lookback: the instant-vector lookback delta in seconds (Prometheus' default 5m).
    left_open: Prometheus 3's left-open ranges (default); False for Prometheus 2's closed ones.
    base_url: only for error messages, as the real client puts it there.
    """

    def __init__(self, *, lookback: float = DEFAULT_LOOKBACK, left_open: bool = True,
                 default_subquery_step: float = DEFAULT_SUBQUERY_STEP,
                 base_url: str = "virtual-prometheus") -> None:
        self.storage = Storage()
        self.lookback_ms = _ms(lookback)
        self.left_open = left_open
        self.default_step_ms = _ms(default_subquery_step)
        self.base_url = base_url
        self.targets: list[Target] = []
        self.now: float = 0.0        # the latest virtual time seen; `query(at=None)` evaluates there
        self.queries = 0
        self._parsed: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"VirtualPrometheus({len(self.storage.series)} series, {len(self.targets)} targets)"

    # scraping
    def add_target(self, labels: Mapping[str, str], render: Callable[[], str], *, offset: float = 0.0) -> Target:
        target = Target(dict(labels), render, offset)
        self.targets.append(target)
        return target

    def scrape(self, target: Target, at: float) -> None:
        """Render the target's exposition at virtual time `at` and store every sample in it."""
        self.now = max(self.now, at)
        if target.removed:
            return
        self.ingest(target, target.render(), at)

    def ingest(self, target: Target, text: str, at: float) -> None:
        t = _ms(at)
        cache, storage, seen = target.cache, self.storage, set()
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line[0] == "#":
                continue
            key, value, stamp = split_sample_line(line)
            series = cache.get(key)
            if series is None:
                series = cache[key] = storage.get(self._with_target_labels(target, parse_sample_key(key)))
            series.append(stamp if stamp is not None else t, value)
            seen.add(id(series))
        up = cache.get("\0up")
        if up is None:
            up = cache["\0up"] = storage.get({NAME: "up", **target.labels})
        up.append(t, 1.0)
        seen.add(id(up))
        for series in cache.values():    # series gone from the exposition: stale from this scrape on
            if id(series) in target.seen and id(series) not in seen:
                series.append(t, None)
        target.seen = seen
        target.scrapes += 1

    @staticmethod
    def _with_target_labels(target: Target, exposed: Labels) -> Labels:
        labels = dict(exposed)
        for name, value in target.labels.items():
            if name in labels and name != NAME:   # honor_labels: false keeps the exposed one as exported_*
                labels["exported_" + name] = labels.pop(name)
            labels[name] = value
        return labels

    def remove_target(self, target: Target, at: float) -> None:
        """The target went away (its pod was deleted): every series of it is stale from `at` on."""
        self.now = max(self.now, at)
        target.removed = True
        t = _ms(at)
        for series in target.cache.values():
            if series.values and series.values[-1] is not None:
                series.append(t, None)
        target.seen = set()

    def scrape_times(self, target: Target, interval: float, start: float, end: float) -> list[float]:
        """The instants in (start, end] at which `target` is scraped every `interval` seconds."""
        first = math.floor((start - target.offset) / interval) * interval + target.offset
        times = []
        at = first
        while at <= end:
            if at > start:
                times.append(at)
            at += interval
        return times

    # querying
    def evaluate(self, promql: str, at: float) -> Value:
        """The raw value of `promql` at Unix time `at` (a float for a scalar); raises PromQLError."""
        tree = self._parsed.get(promql)
        if tree is None:
            tree = self._parsed[promql] = parse_promql(promql)
        evaluator = _Evaluator(self.storage, self.lookback_ms, self.left_open, self.default_step_ms)
        return evaluator.eval(tree, _ms(at))

    async def query(self, promql: str, at: float | None = None) -> list[Sample]:
        """What PrometheusClient.query answers for `promql` at `at` (default: the latest virtual time)."""
        self.queries += 1
        instant = self.now if at is None else at
        try:
            value = self.evaluate(promql, instant)
        except PromQLError as error:
            code = 400 if error.parse else 422
            kind = "bad_data" if error.parse else "execution"
            raise PrometheusBadQuery(f"Prometheus at {self.base_url} rejected the query (HTTP {code}): "
                                     f"{kind}: {error}") from error
        if isinstance(value, Vector):
            return [Sample(dict(labels), v) for labels, v in value.items]
        if isinstance(value, Matrix):
            return [Sample(dict(labels), values[-1], tuple((tt / 1000, v) for tt, v in zip(times, values, strict=True)))
                    for labels, times, values in value.items if values]
        kind = "scalar" if isinstance(value, float) else "string"
        raise PrometheusBadResponse(f"expected an instant or range vector from {self.base_url}, got resultType {kind!r}")


def spread_offset(labels: Mapping[str, str], interval: float) -> float:
    """A target's offset within the scrape interval, fixed by its labels (Prometheus hashes them too)."""
    return random.Random(repr(sorted(labels.items()))).uniform(0.0, interval)
