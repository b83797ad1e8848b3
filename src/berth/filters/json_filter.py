"""JsonFilter: pass hosts for which the JSON query in the ``query`` scheduler hint is true.

The hint is a JSON list ``[op, arg, ...]`` with ops ``= < > <= >= in not and or``; string
arguments starting with ``$`` name HostState attributes (``$free_ram_mb``,
``$stats.num_instances`` - a dotted path through dicts); no hint passes every host
(reference §6). It reads no option; the lever is the query.

Nova's grammar is kept exactly, quirks included: arguments that end up None (JSON null,
``""``, a ``$path`` that does not resolve) are dropped, shifting positions; comparisons
hold iff ``op(args[0], x)`` holds for every later ``x`` and are False with fewer than two
arguments; ``not`` returns a list (truthy when non-empty, so ``["and", ["not", true]]`` is
true); a top-level list result is reduced with ``any``; ``$stats.x`` is a string. A falsy
query (``[]``, ``{}``, ``0``, ``null``) passes every host, as Nova's ``if not query`` does.

``$host_ip`` is an IP address object, as in Nova (its host state's ``host_ip`` is a
``netaddr.IPAddress``), not a string: ``["=", "$host_ip", "10.0.0.1"]`` is false on every
host and ``in`` against strings likewise, ``<``/``>``/``<=``/``>=`` against a string raise
(a SchedulerHintError naming the host here, saying why), and two ``$host_ip`` compare as
addresses. An explanation of a host this rejects says why (``note``). Berth follows Nova
rather than compare strings: the same query must pick the same hosts in both; to select
hosts by address use SimpleCIDRAffinityFilter's hints.

Where Nova raises in the middle of a request, Berth raises a
:class:`~berth.errors.SchedulerHintError` naming the hint and value: up front (in
``validate_request``) for malformed JSON, several ``query`` values, a non-list query, an
unknown operator and nesting deeper than ``MAX_DEPTH`` (Berth's bound); per host, naming the query and the host, for errors that depend on the
host's values (``["<", "$free_ram_mb", "2000"]``: int < str; ``$free_ram_mb.x``).

The bulk path compiles the query once (cached by query text) and, when it uses only numeric
host columns and numeric literals under comparisons and ``and``/``or``, evaluates it as
NumPy expressions over the columns; hosts where a referenced column is unset (which Nova
would drop from the arguments) and every other query are evaluated host by host.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from berth.errors import SchedulerHintError
from berth.filters.base import BaseHostFilter, Reject
from berth.filters.simple_cidr import host_address
from berth.filters.utils import nova_updated
from berth.snapshot import FLOAT_COLUMNS, INT_COLUMNS

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState, WorkingSet
    from berth.model.request import RequestSpec

HINT = "query"

_COMPARISONS: dict[str, Callable[[Any, Any], Any]] = {
    "=": operator.eq,
    "<": operator.lt,
    ">": operator.gt,
    "<=": operator.le,
    ">=": operator.ge,
}
#: Every operator of the grammar.
OPERATORS: frozenset[str] = frozenset([*_COMPARISONS, "in", "not", "or", "and"])
#: HostState attributes backed by a numeric column the vectorized path may read.
NUMERIC_ATTRIBUTES: frozenset[str] = frozenset(INT_COLUMNS + FLOAT_COLUMNS) - {"updated"}
#: Berth's own HostState attributes, absent from Nova's: ``$now`` resolves to None there.
_BERTH_ONLY_ATTRIBUTES: frozenset[str] = frozenset({"row", "working_set", "now"})
#: Deepest nesting accepted (Berth's bound; Nova's is Python's recursion limit, which a
#: deeper query would hit mid-request).
MAX_DEPTH = 100
#: Integer literals beyond this magnitude do not survive float64; such queries go per host.
_EXACT_INT = 2**53


# ---------------------------------------------------------------------- Nova's evaluator
def _compare(args: list[Any], op: Callable[[Any, Any], Any]) -> bool:
    if len(args) < 2:
        return False
    # Every comparison runs (no short-circuit), so a TypeError anywhere surfaces, as in Nova.
    failed = [arg for arg in args[1:] if not op(args[0], arg)]
    return not failed


def _apply(cmd: str, args: list[Any]) -> Any:
    if cmd in _COMPARISONS:
        return _compare(args, _COMPARISONS[cmd])
    if cmd == "in":
        return len(args) >= 2 and args[0] in args[1:]
    if cmd == "not":
        return [not arg for arg in args]
    if cmd == "or":
        return any(args)
    return all(args)  # "and"


def _parse_string(string: str, host_state: HostState) -> Any:
    """``""`` -> None; a literal; or ``$a.b.c`` -> ``getattr(hs, 'a').get('b').get('c')``."""
    if not string:
        return None
    if not string.startswith("$"):
        return string
    path = string[1:].split(".")
    if path[0] in _BERTH_ONLY_ATTRIBUTES:
        return None
    obj = getattr(host_state, path[0], None)
    if obj is None and path[0] == "pci_stats":
        # Nova's host state always holds device stats (empty on a host without
        # devices), so the argument is never dropped as None there.
        from berth.hardware.pci import PciDeviceStats

        obj = PciDeviceStats()
    if obj is None:
        return None
    if path[0] == "host_ip":
        # Nova's host state holds an IP address object, not a string (see the module).
        obj = host_address(host_state.host, obj)
    elif path[0] == "updated":
        obj = nova_updated(obj)  # a datetime in Nova: compared with a number, it raises
    for item in path[1:]:
        obj = obj.get(item)  # AttributeError on a non-dict, as in Nova
        if obj is None:
            return None
    return obj


def _process(query: Any, host_state: HostState) -> Any:
    if not query:
        return True
    cmd = query[0]
    cooked = []
    for arg in query[1:]:
        if isinstance(arg, list):
            arg = _process(arg, host_state)
        elif isinstance(arg, str):
            arg = _parse_string(arg, host_state)
        if arg is not None:
            cooked.append(arg)
    return _apply(cmd, cooked)


def failing_clause(query: Any, host_state: HostState) -> Any:
    """The innermost clause that makes a false ``query`` false for this host: under
    ``and``, the first false clause (followed down); anything else is its own answer
    (a comparison, ``in``, an ``or`` none of whose clauses held, a ``not``)."""
    while isinstance(query, list) and query and query[0] == "and":
        for arg in query[1:]:
            if isinstance(arg, list) and not _process(arg, host_state):
                query = arg
                break
        else:
            return query  # false through a literal argument: the whole ``and``
    return query


def _shown(value: Any) -> str:
    """A host's value as the query compares it (None: unset, dropped by the query)."""
    if value is None:
        return "unset"
    return json.dumps(value) if isinstance(value, str) else str(value)


#: Resolves a ``$path`` string for one host.
Resolver = Callable[[str], Any]
#: A compiled (sub)query: evaluates it for the host a resolver stands for.
Program = Callable[[Resolver], Any]
_CONSTANT, _PATH, _SUBQUERY = 0, 1, 2


def _program(query: Any) -> Program:
    """:func:`_process` with the argument kinds decided once per query instead of per host.

    Arguments that are None on every host (JSON null, ``""``) are dropped here already;
    the order of evaluation (and so which error surfaces first) is Nova's.
    """
    if not query:
        return lambda resolve: True
    cmd = query[0]
    parts: list[tuple[int, Any]] = []
    for arg in query[1:]:
        if isinstance(arg, list):
            parts.append((_SUBQUERY, _program(arg)))
        elif isinstance(arg, str) and arg.startswith("$"):
            parts.append((_PATH, arg))
        elif arg is not None and arg != "":
            parts.append((_CONSTANT, arg))

    def run(resolve: Resolver) -> Any:
        cooked = []
        for kind, payload in parts:
            if kind == _CONSTANT:
                value = payload
            elif kind == _PATH:
                value = resolve(payload)
            else:
                value = payload(resolve)
            if value is not None:
                cooked.append(value)
        return _apply(cmd, cooked)

    return run


def _paths(query: Any, found: set[str]) -> set[str]:
    """Every ``$path`` string of a query."""
    for arg in query[1:] if query else ():
        if isinstance(arg, list):
            _paths(arg, found)
        elif isinstance(arg, str) and arg.startswith("$"):
            found.add(arg)
    return found


class _RowResolver:
    """Resolves ``$path`` for one row at a time: plain numeric attributes from columns
    fetched once per request (as HostState would answer: int, float or None), anything
    else through the row's HostState, created only when needed."""

    __slots__ = ("columns", "ws", "rows", "position", "_host_state")

    def __init__(self, columns: dict[str, list[Any]], ws: WorkingSet, rows: np.ndarray) -> None:
        self.columns = columns
        self.ws = ws
        self.rows = rows
        self.position = 0
        self._host_state: HostState | None = None

    def at(self, position: int) -> None:
        """Move to the host at ``position``."""
        self.position = position
        self._host_state = None

    @property
    def host_state(self) -> HostState:
        """The HostState of the current row."""
        if self._host_state is None:
            self._host_state = self.ws.host_state(int(self.rows[self.position]))
        return self._host_state

    def __call__(self, string: str) -> Any:
        values = self.columns.get(string)
        if values is not None:
            return values[self.position]
        return _parse_string(string, self.host_state)


# ---------------------------------------------------------------------- compilation
@dataclass(frozen=True)
class Column:
    """A numeric host column (``$free_ram_mb``)."""

    name: str


@dataclass(frozen=True)
class Const:
    """A numeric or boolean literal."""

    value: Any


@dataclass(frozen=True)
class Op:
    """A comparison, ``and`` or ``or`` over vectorizable arguments (None literals dropped)."""

    cmd: str
    args: tuple[Column | Const | Op, ...]


Node = Column | Const | Op


@dataclass(frozen=True)
class CompiledQuery:
    """A validated query: the parsed JSON, and its NumPy form when it has one."""

    text: str
    parsed: Any
    vector: Node | None
    columns: frozenset[str]
    program: Program
    paths: frozenset[str]

    @property
    def host_ip_note(self) -> str | None:
        """Why ``$host_ip`` never equals a string literal of this query, if it has one."""
        if "$host_ip" not in self.paths or not _string_literals(self.parsed):
            return None
        return HOST_IP_NOTE

    def _host_error(self, exc: Exception, host_state: HostState) -> SchedulerHintError:
        why = f" ({HOST_IP_NOTE})" if "IPAddress" in str(exc) else ""
        return SchedulerHintError(
            f"scheduler hint {HINT}={self.text!r} cannot be evaluated on host "
            f"{host_state.host} (node {host_state.nodename}): {exc}{why}",
            hint=HINT, value=self.text, host=host_state.host, nodename=host_state.nodename,
        )

    def evaluate(self, host_state: HostState) -> bool:
        """Nova's evaluation on one host (its algorithm verbatim, the reference the faster
        paths are tested against); host-dependent errors become SchedulerHintError."""
        try:
            result = _process(self.parsed, host_state)
        except (TypeError, AttributeError) as exc:
            raise self._host_error(exc, host_state) from exc
        return bool(any(result) if isinstance(result, list) else result)

    def evaluate_rows(self, hosts: Hosts, positions: Sequence[int]) -> np.ndarray:
        """The compiled program over ``hosts`` at ``positions``, one host at a time."""
        columns: dict[str, list[Any]] = {}
        for path in self.paths:
            name = path[1:]
            if name in NUMERIC_ATTRIBUTES:
                as_int = name in INT_COLUMNS
                columns[path] = [
                    None if math.isnan(v) else (int(v) if as_int else v)
                    for v in hosts.col(name).tolist()
                ]
        resolve = _RowResolver(columns, hosts.ws, hosts.rows)
        out = np.empty(len(positions), dtype=bool)
        for k, position in enumerate(positions):
            resolve.at(position)
            try:
                result = self.program(resolve)
            except (TypeError, AttributeError) as exc:
                raise self._host_error(exc, resolve.host_state) from exc
            out[k] = bool(any(result) if isinstance(result, list) else result)
        return out


#: Why a query comparing ``$host_ip`` with a string matches nothing, or raises.
HOST_IP_NOTE = ("$host_ip is an IP address, as in Nova: it never equals a string and "
                "cannot be ordered against one")


def _string_literals(query: Any) -> bool:
    """Whether a query has a string argument that is not a ``$path``."""
    for arg in query[1:] if query else ():
        if isinstance(arg, list):
            if _string_literals(arg):
                return True
        elif isinstance(arg, str) and arg and not arg.startswith("$"):
            return True
    return False


def _bad(text: str, problem: str) -> SchedulerHintError:
    return SchedulerHintError(f"scheduler hint {HINT}={text!r}: {problem}", hint=HINT, value=text)


def _check_structure(query: list[Any], text: str, depth: int = 1) -> None:
    if not query:
        return
    if depth > MAX_DEPTH:
        raise _bad(text, f"nested more than {MAX_DEPTH} levels deep")
    cmd = query[0]
    if not isinstance(cmd, str) or cmd not in OPERATORS:
        raise _bad(text, f"unknown operator {cmd!r} in {json.dumps(query)}; "
                         f"operators are {', '.join(sorted(OPERATORS))}")
    for arg in query[1:]:
        if isinstance(arg, list):
            _check_structure(arg, text, depth + 1)


def _vectorize(query: list[Any], columns: set[str]) -> Node | None:
    """The NumPy form of a (sub)query, or None when it needs per-host evaluation."""
    if not query:
        return Const(True)
    cmd = query[0]
    if cmd not in _COMPARISONS and cmd not in ("and", "or"):
        return None
    args: list[Node] = []
    for arg in query[1:]:
        node: Node | None
        if arg is None or arg == "":
            continue  # dropped on every host alike
        if isinstance(arg, list):
            node = _vectorize(arg, columns)
        elif isinstance(arg, str):
            name = arg[1:]
            if not arg.startswith("$") or name not in NUMERIC_ATTRIBUTES:
                return None
            columns.add(name)
            node = Column(name)
        elif isinstance(arg, bool) or (isinstance(arg, int) and abs(arg) < _EXACT_INT) or isinstance(arg, float) and not math.isnan(arg):
            node = Const(arg)
        else:
            return None
        if node is None:
            return None
        args.append(node)
    return Op(cmd, tuple(args))


@lru_cache(maxsize=256)
def compile_query(text: str) -> CompiledQuery:
    """Parse and check a ``query`` hint once; raise SchedulerHintError naming the value."""
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _bad(text, f"not valid JSON ({exc})") from exc
    if parsed and not isinstance(parsed, list):
        raise _bad(text, f"a query is a JSON list [operator, argument, ...], not "
                         f"{type(parsed).__name__}")
    columns: set[str] = set()
    vector: Node | None = None
    if parsed:
        _check_structure(parsed, text)
        vector = _vectorize(parsed, columns)
    return CompiledQuery(
        text, parsed, vector, frozenset(columns) if vector is not None else frozenset(),
        _program(parsed), frozenset(_paths(parsed, set()) if parsed else ()),
    )


def _truth(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value if value.dtype == bool else value != 0
    return bool(value)


def _evaluate_vector(node: Node, cols: dict[str, np.ndarray]) -> Any:
    if isinstance(node, Column):
        return cols[node.name]
    if isinstance(node, Const):
        return node.value
    args = [_evaluate_vector(a, cols) for a in node.args]
    if node.cmd in ("and", "or"):
        combine = np.logical_and if node.cmd == "and" else np.logical_or
        result: Any = node.cmd == "and"  # all([]) is True, any([]) is False
        for arg in args:
            result = combine(result, _truth(arg))
        return result
    if len(args) < 2:
        return False
    op = _COMPARISONS[node.cmd]
    result = True
    for arg in args[1:]:
        result = np.logical_and(result, op(args[0], arg))
    return result


class JsonFilter(BaseHostFilter):
    """Pass hosts for which the JSON query hint evaluates true (no hint: all pass)."""

    RUN_ON_REBUILD: ClassVar[bool] = False

    @staticmethod
    def _query(spec_obj: RequestSpec) -> CompiledQuery | None:
        value = spec_obj.get_scheduler_hint(HINT)
        if not value:
            return None
        if not isinstance(value, str):
            raise SchedulerHintError(
                f"scheduler hint {HINT}={value!r}: expected one JSON string, got "
                f"{len(value)} values", hint=HINT, value=value,
            )
        compiled = compile_query(value)
        return compiled if compiled.parsed else None

    def validate_request(self, spec_obj: RequestSpec) -> None:
        """Reject malformed JSON, several values, a non-list query or an unknown operator."""
        self._query(spec_obj)

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """Reject a host for which the query is false, naming the clause that made it
        false (when the query has several) and the host's values of that clause's
        ``$`` attributes."""
        compiled = self._query(spec_obj)
        if compiled is None or compiled.evaluate(host_state):
            return None
        numbers: dict[str, Any] = {"query": compiled.text}
        clause = failing_clause(compiled.parsed, host_state)
        if clause is not compiled.parsed:
            numbers["clause"] = json.dumps(clause)
        values = {path[1:]: _parse_string(path, host_state)
                  for path in sorted(_paths(clause, set()))}
        if values:
            numbers["host"] = ", ".join(f"{name}={_shown(value)}"
                                        for name, value in values.items())
        note = compiled.host_ip_note
        if note is not None:
            numbers["note"] = note
        return Reject("JSON query false", numbers)

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """NumPy evaluation of numeric queries; per-host evaluation otherwise (see module)."""
        compiled = self._query(spec_obj)
        n = len(hosts)
        if compiled is None:
            return np.ones(n, dtype=bool)
        if compiled.vector is None:
            return compiled.evaluate_rows(hosts, range(n))
        cols = {name: hosts.col(name) for name in compiled.columns}
        result = _evaluate_vector(compiled.vector, cols)
        mask = np.array(np.broadcast_to(_truth(result), (n,)), dtype=bool)
        unset = np.zeros(n, dtype=bool)
        for col in cols.values():
            unset |= np.isnan(col)
        # Nova drops an unset attribute from the arguments; those hosts go one by one.
        positions = np.flatnonzero(unset).tolist()
        if positions:
            mask[positions] = compiled.evaluate_rows(hosts, positions)
        return mask
