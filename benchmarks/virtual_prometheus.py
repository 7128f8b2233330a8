"""A Prometheus on a virtual clock: it scrapes text expositions, keeps the samples, and answers the operator's
PromQL the way Prometheus does, for benchmarks/decisions.py and benchmarks/day.py (no cluster, no sockets, no
sleeping).

    prometheus = VirtualPrometheus()
    pod = prometheus.add_target({"namespace": "bench", "pod": "sd-abc", ...}, render=metrics.render)
    prometheus.scrape(pod, at=1_750_000_005.0)          # the exposition text, parsed and stored
    samples = await prometheus.query('sum by (pod) (rate(x_total{pod!=""}[5m]))', at=1_750_000_030.0)

`query` has the signature of `specdeploy.clients.prometheus.PrometheusClient.query`, so the operator's own
`query_all` runs against it. It returns `Sample`s (an instant vector; or, for a subquery, `points` with `value`
the last point's) and raises the client's errors: PrometheusBadQuery for PromQL it cannot parse or execute (HTTP
400/422 from a real Prometheus), PrometheusBadResponse for a scalar answer.

Only the PromQL the operator sends (judgment/queries.py: its templates for every engine, the pinned selector, the
"group by" of the pods whose series a query reads) is implemented, and
tests/e2e/test_virtual_prometheus_matches_real.py checks it against the real Prometheus on the same scrapes:

- vector selectors with `=`, `!=` and `=~` matchers (regexes anchored); an instant selector is the newest sample
  within the lookback delta (5m), none once the series is stale;
- range selectors `v[d]` and subqueries `expr[range:step]`: the subquery evaluates `expr` at the absolute
  multiples of `step` inside the range, as Prometheus aligns them; durations in one unit (ms, s, m, h);
- rate and increase with extrapolatedRate's rules (promql/functions.go: extrapolate to the range's edges when the
  first or last sample is within 1.1 × the average sample spacing, else by half a spacing; counter resets; a
  counter is not extrapolated below zero), avg_over_time, histogram_quantile over classic `le` buckets
  (bucketQuantile: the first bucket interpolates from 0, a rank in the +Inf bucket gives the upper bound of the
  last finite one, NaN with no observations);
- the aggregations sum, avg, count and group with `by` before the argument;
- `+` and `/` with Prometheus' precedence, IEEE arithmetic (0/0 is NaN, x/0 ±Inf), between a number and a vector
  or between two vectors matched on all labels but the name.

Storage and scraping, as Prometheus (model/textparse, scrape/scrape.go): every sample line of the exposition
becomes a sample at the scrape's timestamp (or its own, when the line carries one), with the target's labels
added (an exposed label that collides with one is kept as `exported_<name>`); `up` is 1 for each scrape;
series that vanish from a target's exposition, or whose target is removed, get a stale marker and leave
instant vectors from then on.

`version` picks the semantics of a Prometheus major version, in integer milliseconds as Prometheus evaluates:
3 (the default) has left-open ranges (a range at t covers (t − d, t], a subquery's first step is after
t − range) and cuts the extrapolation to a counter's zero point after the threshold test; 2 has closed ranges
([t − d, t]) and cuts it before (functions.go of v2.42, the Prometheus the dev cluster runs).
"""

from __future__ import annotations

import bisect
import math
import random
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from specdeploy.clients.prometheus import PrometheusBadQuery, PrometheusBadResponse
from specdeploy.judgment.assembly import Sample

LOOKBACK_MS = 300_000     # --query.lookback-delta: 5m

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
    op: str            # = != =~
    value: str
    regex: re.Pattern[str] | None = None

    def matches(self, labels: Mapping[str, str]) -> bool:
        actual = labels.get(self.name, "")
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        assert self.regex is not None
        return self.regex.fullmatch(actual) is not None


@dataclass(frozen=True)
class NumberLiteral:
    value: float


@dataclass(frozen=True)
class VectorSelector:
    name: str | None
    matchers: tuple[Matcher, ...]


@dataclass(frozen=True)
class MatrixSelector:
    selector: VectorSelector
    range_ms: int


@dataclass(frozen=True)
class Subquery:
    expr: Any
    range_ms: int
    step_ms: int


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Aggregate:
    op: str
    expr: Any
    grouping: tuple[str, ...]


@dataclass(frozen=True)
class Binary:
    op: str
    lhs: Any
    rhs: Any


# --- the parser -------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<duration>\d+(?:ms|s|m|h)(?![a-zA-Z0-9_]))
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<ident>[a-zA-Z_][a-zA-Z0-9_:]*)
  | (?P<op>=~|!=|[+/=])
  | (?P<punct>[(){}\[\],:])
""", re.VERBOSE)

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
_DURATION = re.compile(r"(\d+)(ms|s|m|h)")

AGGREGATIONS = {"sum", "avg", "count", "group"}
FUNCTIONS = {"rate": 1, "increase": 1, "avg_over_time": 1, "histogram_quantile": 2}   # name -> arguments
_PRECEDENCE = {"+": 4, "/": 5}     # promql/parser: ADD < MUL, both left-associative


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
    escapes = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"'}
    return re.sub(r"\\(.)", lambda m: escapes.get(m.group(1), "\\" + m.group(1)), token[1:-1])


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.index = 0

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
            raise self.error(f"unexpected {token.text or 'end of input'!r}, expected {text!r}", token)
        return token

    def accept(self, text: str) -> bool:
        if self.peek().text == text and self.peek().kind != "string":
            self.next()
            return True
        return False

    def parse(self) -> Any:
        expr = self.expression(0)
        if self.peek().kind != "eof":
            raise self.error(f"unexpected {self.peek().text!r}")
        return expr

    def expression(self, min_precedence: int) -> Any:
        lhs = self.postfix(self.primary())
        while True:
            token = self.peek()
            precedence = _PRECEDENCE.get(token.text) if token.kind == "op" else None
            if precedence is None or precedence < min_precedence:
                return lhs
            self.next()
            lhs = Binary(token.text, lhs, self.expression(precedence + 1))

    def postfix(self, expr: Any) -> Any:
        token = self.peek()
        if token.text != "[" or token.kind != "punct":
            return expr
        self.next()
        range_ms = self.duration()
        if self.accept(":"):
            step = self.duration()
            self.expect("]")
            return Subquery(expr, range_ms, step)
        self.expect("]")
        if not isinstance(expr, VectorSelector):
            raise self.error("ranges only allowed for vector selectors", token)
        return MatrixSelector(expr, range_ms)

    def duration(self) -> int:
        token = self.next()
        if token.kind != "duration":
            raise self.error(f"expected a duration, got {token.text or 'end of input'!r}", token)
        match = _DURATION.fullmatch(token.text)
        assert match is not None
        return int(match.group(1)) * _UNITS_MS[match.group(2)]

    def label_list(self) -> tuple[str, ...]:
        self.expect("(")
        names: list[str] = []
        while not self.accept(")"):
            token = self.next()
            if token.kind != "ident":
                raise self.error(f"unexpected {token.text!r} in grouping opts", token)
            names.append(token.text)
            if not self.accept(","):
                self.expect(")")
                break
        return tuple(names)

    def primary(self) -> Any:
        token = self.peek()
        if token.kind == "number":
            self.next()
            return NumberLiteral(float(token.text))
        if token.text == "(" and token.kind == "punct":
            self.next()
            expr = self.expression(0)
            self.expect(")")
            return expr
        if token.text == "{" and token.kind == "punct":
            return self.selector(None)
        if token.kind == "ident":
            word, following = token.text, self.peek(1).text
            if word in AGGREGATIONS and following in ("(", "by"):
                return self.aggregation()
            if word in FUNCTIONS and following == "(":
                return self.call()
            self.next()
            return self.selector(word)
        raise self.error(f"unexpected {token.text or 'end of input'!r}", token)

    def selector(self, name: str | None) -> VectorSelector:
        matchers: list[Matcher] = []
        if self.accept("{"):
            while not self.accept("}"):
                label, op, value = self.next(), self.next(), self.next()
                if label.kind != "ident":
                    raise self.error(f"unexpected {label.text!r} in label matching", label)
                if op.text not in ("=", "!=", "=~"):
                    raise self.error(f"unexpected {op.text!r} in label matching, expected one of = != =~", op)
                if value.kind != "string":
                    raise self.error(f"unexpected {value.text!r} in label matching, expected string", value)
                matchers.append(self._matcher(label.text, op.text, _string_value(value.text)))
                if not self.accept(","):
                    self.expect("}")
                    break
        for matcher in matchers:
            if matcher.name == NAME and matcher.op == "=":
                name = name or matcher.value
        return VectorSelector(name, tuple(m for m in matchers if not (m.name == NAME and m.op == "=")))

    def _matcher(self, name: str, op: str, value: str) -> Matcher:
        if op != "=~":
            return Matcher(name, op, value)
        try:
            return Matcher(name, op, value, re.compile(value))
        except re.error as error:
            raise self.error(f"invalid regular expression {value!r}: {error}") from None

    def aggregation(self) -> Aggregate:
        op = self.next().text
        grouping = self.label_list() if self.accept("by") else ()
        self.expect("(")
        expr = self.expression(0)
        self.expect(")")
        return Aggregate(op, expr, grouping)

    def call(self) -> Call:
        name = self.next().text
        self.expect("(")
        args: list[Any] = []
        while not self.accept(")"):
            args.append(self.expression(0))
            if not self.accept(","):
                self.expect(")")
                break
        if len(args) != FUNCTIONS[name]:
            raise self.error(f"expected {FUNCTIONS[name]} argument(s) in call to {name!r}, got {len(args)}")
        return Call(name, tuple(args))


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
    """A range vector: (labels, times in ms, values) per series, over the range ending at `end` (ms)."""

    items: list[tuple[Labels, list[int], list[float]]]
    start: int
    end: int
    range_ms: int


Value = float | Vector | Matrix


def _without_name(labels: Labels) -> Labels:
    if NAME not in labels:
        return labels
    return {k: v for k, v in labels.items() if k != NAME}


def _key(labels: Labels) -> LabelSet:
    return tuple(sorted(labels.items()))


def _divide(a: float, b: float) -> float:
    try:
        return a / b
    except ZeroDivisionError:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)


_ARITHMETIC: dict[str, Callable[[float, float], float]] = {"+": lambda a, b: a + b, "/": _divide}


# --- functions --------------------------------------------------------------------------------------------

def _extrapolated_rate(matrix: Matrix, is_rate: bool, version: int) -> Vector:
    """promql/functions.go extrapolatedRate for counters of float samples (rate, increase)."""
    out: list[tuple[Labels, float]] = []
    for labels, times, values in matrix.items:
        if len(values) < 2:
            continue
        result = values[-1] - values[0]
        previous = values[0]
        for value in values[1:]:
            if value < previous:
                result += previous
            previous = value
        duration_to_start = (times[0] - matrix.start) / 1000
        duration_to_end = (matrix.end - times[-1]) / 1000
        sampled = (times[-1] - times[0]) / 1000
        average = sampled / (len(values) - 1)
        threshold = average * 1.1
        duration_to_zero = sampled * (values[0] / result) if result > 0 and values[0] >= 0 else math.inf
        if version == 2:      # the zero point first, then the threshold (v2.42)
            duration_to_start = min(duration_to_start, duration_to_zero)
            if duration_to_start >= threshold:
                duration_to_start = average / 2
        else:
            if duration_to_start >= threshold:
                duration_to_start = average / 2
            duration_to_start = min(duration_to_start, duration_to_zero)
        if duration_to_end >= threshold:
            duration_to_end = average / 2
        factor = (sampled + duration_to_start + duration_to_end) / sampled
        if is_rate:
            factor /= matrix.range_ms / 1000
        out.append((_without_name(labels), result * factor))
    return Vector(out)


def _avg_over_time(matrix: Matrix) -> Vector:
    return Vector([(_without_name(labels), math.fsum(values) / len(values))
                   for labels, _, values in matrix.items if values])


SMALL_DELTA_TOLERANCE = 1e-12


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """promql/quantile.go BucketQuantile over (upper bound, cumulative count) pairs."""
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


# --- evaluation -------------------------------------------------------------------------------------------

class _Evaluator:
    def __init__(self, storage: Storage, version: int) -> None:
        self.storage = storage
        self.version = version
        self.left_open = version >= 3
        self.selected: dict[VectorSelector, list[Series]] = {}

    def series_for(self, selector: VectorSelector) -> list[Series]:
        found = self.selected.get(selector)
        if found is None:
            found = [s for s in self.storage.candidates(selector.name)
                     if all(m.matches(s.labels) for m in selector.matchers)]
            self.selected[selector] = found
        return found

    def eval(self, node: Any, t: int) -> Value:
        method = getattr(self, "eval_" + type(node).__name__)
        result: Value = method(node, t)
        return result

    def eval_NumberLiteral(self, node: NumberLiteral, t: int) -> float:
        return node.value

    def eval_VectorSelector(self, node: VectorSelector, t: int) -> Vector:
        out = []
        for series in self.series_for(node):
            index = bisect.bisect_right(series.times, t) - 1
            if index < 0:
                continue
            age = t - series.times[index]
            if age > LOOKBACK_MS or (self.left_open and age == LOOKBACK_MS):
                continue
            value = series.values[index]
            if value is None:   # stale
                continue
            out.append((series.labels, value))
        return Vector(out)

    def eval_MatrixSelector(self, node: MatrixSelector, t: int) -> Matrix:
        start = t - node.range_ms
        items = []
        for series in self.series_for(node.selector):
            times = series.times
            low = bisect.bisect_right(times, start) if self.left_open else bisect.bisect_left(times, start)
            high = bisect.bisect_right(times, t)
            pairs = [(tt, v) for tt, v in zip(times[low:high], series.values[low:high], strict=True) if v is not None]
            if pairs:
                items.append((series.labels, [p[0] for p in pairs], [p[1] for p in pairs]))
        return Matrix(items, start, t, node.range_ms)

    def eval_Subquery(self, node: Subquery, t: int) -> Matrix:
        step = node.step_ms
        start = t - node.range_ms
        at = step * (start // step)
        if at < start or (self.left_open and at == start):
            at += step
        points: dict[LabelSet, tuple[Labels, list[int], list[float]]] = {}
        while at <= t:
            value = self.eval(node.expr, at)
            if not isinstance(value, Vector):
                raise PromQLError(f"subquery is only allowed on an instant vector, got {_type(value)}")
            for labels, v in value.items:
                entry = points.setdefault(_key(labels), (labels, [], []))
                entry[1].append(at)
                entry[2].append(v)
            at += step
        return Matrix(list(points.values()), start, t, node.range_ms)

    def eval_Call(self, node: Call, t: int) -> Vector:
        name = node.func
        args = [self.eval(arg, t) for arg in node.args]
        if name == "histogram_quantile":
            return _histogram_quantile(_expect(args[0], float, name), _expect(args[1], Vector, name))
        matrix = _expect(args[0], Matrix, name)
        if name == "avg_over_time":
            return _avg_over_time(matrix)
        return _extrapolated_rate(matrix, name == "rate", self.version)

    def eval_Aggregate(self, node: Aggregate, t: int) -> Vector:
        vector = _expect(self.eval(node.expr, t), Vector, node.op)
        groups: dict[LabelSet, tuple[Labels, list[float]]] = {}
        for labels, value in vector.items:
            kept = {k: labels[k] for k in node.grouping if labels.get(k)}
            groups.setdefault(_key(kept), (kept, []))[1].append(value)
        out: list[tuple[Labels, float]] = []
        for kept, values in groups.values():
            finite = all(math.isfinite(v) for v in values)
            if node.op == "sum":
                result = math.fsum(values) if finite else sum(values)
            elif node.op == "avg":
                result = (math.fsum(values) if finite else sum(values)) / len(values)
            elif node.op == "count":
                result = float(len(values))
            else:   # group
                result = 1.0
            out.append((kept, result))
        return Vector(out)

    def eval_Binary(self, node: Binary, t: int) -> Value:
        lhs, rhs = self.eval(node.lhs, t), self.eval(node.rhs, t)
        apply = _ARITHMETIC[node.op]
        if isinstance(lhs, Vector) and isinstance(rhs, Vector):
            right = {_key(_without_name(labels)): value for labels, value in rhs.items}
            out = []
            for labels, value in lhs.items:
                own = _without_name(labels)
                match = right.get(_key(own))
                if match is not None:
                    out.append((own, apply(value, match)))
            return Vector(out)
        if isinstance(lhs, float) and isinstance(rhs, Vector):
            return Vector([(_without_name(labels), apply(lhs, value)) for labels, value in rhs.items])
        if isinstance(lhs, Vector) and isinstance(rhs, float):
            return Vector([(_without_name(labels), apply(value, rhs)) for labels, value in lhs.items])
        if isinstance(lhs, float) and isinstance(rhs, float):
            return apply(lhs, rhs)
        raise PromQLError(f"binary expression must contain only scalar and instant vector types, got "
                          f"{_type(lhs)} {node.op} {_type(rhs)}")


def _type(value: Value) -> str:
    if isinstance(value, float):
        return "scalar"
    return "instant vector" if isinstance(value, Vector) else "range vector"


def _expect(value: Any, kind: type, where: str) -> Any:
    if not isinstance(value, kind):
        wanted = {float: "scalar", Vector: "instant vector", Matrix: "range vector"}[kind]
        raise PromQLError(f"expected type {wanted} in {where}, got {_type(value)}")
    return value


# --- the server -------------------------------------------------------------------------------------------

class VirtualPrometheus:
    """Scrapes targets when told (virtual time), stores what they expose, answers PromQL.

    version: the Prometheus major version whose semantics it follows, 3 (default) or 2 (see the module).
    base_url: only for error messages, as the real client puts it there.
    """

    def __init__(self, *, version: int = 3, base_url: str = "virtual-prometheus") -> None:
        if version not in (2, 3):
            raise ValueError(f"version must be 2 or 3, got {version!r}")
        self.storage = Storage()
        self.version = version
        self.base_url = base_url
        self.targets: list[Target] = []
        self.now: float = 0.0        # the latest virtual time seen; `query(at=None)` evaluates there
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
        if not target.removed:
            self.ingest(target, target.render(), at)

    def ingest(self, target: Target, text: str, at: float) -> None:
        """Store exposition `text` as `target`'s scrape at Unix time `at`."""
        self.now = max(self.now, at)
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
        return _Evaluator(self.storage, self.version).eval(tree, _ms(at))

    async def query(self, promql: str, at: float | None = None) -> list[Sample]:
        """What PrometheusClient.query answers for `promql` at `at` (default: the latest virtual time)."""
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
        raise PrometheusBadResponse(f"expected an instant or range vector from {self.base_url}, got resultType 'scalar'")


def spread_offset(labels: Mapping[str, str], interval: float) -> float:
    """A target's offset within the scrape interval, fixed by its labels (Prometheus hashes them too)."""
    return random.Random(repr(sorted(labels.items()))).uniform(0.0, interval)
