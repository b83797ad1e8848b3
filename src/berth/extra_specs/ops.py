"""The extra-spec operator grammar (Nova's ``extra_specs_ops.match``, reference §4).

A flavor extra-spec value such as ``">= 4096"`` or ``"<or> fpu <or> gpu"`` is a
*requirement* on a host-side string. :func:`compile_requirement` parses it once into a
:class:`Requirement` whose :meth:`Requirement.match` answers for one host value;
:func:`match` is Nova's one-shot form. The semantics are Nova 34's, quirks included:

* ``=`` means "at least" numerically (``float(value) >= float(operand)``), not equality;
* ``==``, ``!=``, ``>=``, ``<=`` compare as floats; ``s==`` ``s!=`` ``s<`` ``s<=`` ``s>``
  ``s>=`` compare as Python strings;
* ``<in>`` is a substring test, ``<all-in>`` tests every following word as a substring;
* ``<or>`` matches the candidates at even positions and ignores the separator tokens;
* anything else (no operator, an unknown one, ``>`` or ``<``) is exact equality with the
  *whole* requirement string, whitespace included;
* an operator with no operand matches nothing; a None host value matches nothing.

Deliberate deviations, where Nova lets a Python exception escape mid-request: a bare
``<or>`` and a numeric operator whose operand is not a number are recorded on the
compiled requirement (:attr:`Requirement.error`) so a filter can reject the request up
front (:func:`validate_requirement`), and a host value that is not a number under a
numeric operator raises :class:`~berth.errors.ExtraSpecError` naming the key, the host
and the value instead of a bare ``ValueError``.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from berth.errors import ExtraSpecError

#: Operators comparing ``float(value)`` with ``float(operand)``. ``=`` is "at least".
NUMERIC_OPS: dict[str, Callable[[float, float], bool]] = {
    "=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    ">=": operator.ge,
    "<=": operator.le,
}
#: The same comparisons on NumPy arrays (bulk paths over numeric host columns).
_NUMERIC_UFUNCS: dict[str, Callable[[np.ndarray, float], np.ndarray]] = {
    "=": np.greater_equal,
    "==": np.equal,
    "!=": np.not_equal,
    ">=": np.greater_equal,
    "<=": np.less_equal,
}
#: Operators comparing the host string with the operand as Python strings.
STRING_OPS: dict[str, Callable[[str, str], bool]] = {
    "s==": operator.eq,
    "s!=": operator.ne,
    "s<": operator.lt,
    "s<=": operator.le,
    "s>": operator.gt,
    "s>=": operator.ge,
}
#: Every operator word the grammar knows (``<or>`` is handled on its own).
OPERATORS: frozenset[str] = frozenset(
    [*NUMERIC_OPS, *STRING_OPS, "<in>", "<all-in>", "<or>"]
)

#: Kinds of compiled requirement.
EXACT, NUMERIC, STRING, IN, ALL_IN, OR, NEVER = (
    "exact", "numeric", "string", "in", "all-in", "or", "never",
)  # fmt: skip


def parse_float(text: str) -> float | None:
    """``float(text)`` as Python parses it (``' 2 '``, ``'1e3'``, ``'nan'``), or None."""
    try:
        return float(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class Requirement:
    """A parsed extra-spec requirement; :meth:`match` tests one host-side value.

    ``kind`` is one of ``exact``, ``numeric``, ``string``, ``in``, ``all-in``, ``or`` or
    ``never`` (an operator without operand). ``error`` is set when Nova would raise while
    matching a non-None value (bare ``<or>``, a non-numeric operand of a numeric operator).
    """

    req: str
    kind: str
    op: str | None = None
    operand: str | None = None
    number: float | None = None
    words: tuple[str, ...] = ()
    error: str | None = None
    _fn: Callable[[str], bool] | None = field(default=None, repr=False, compare=False)

    @property
    def is_numeric(self) -> bool:
        """True for ``=``, ``==``, ``!=``, ``>=`` and ``<=`` with an operand."""
        return self.kind == NUMERIC

    def match(self, value: str | None, *, key: str | None = None, host: str | None = None) -> bool:
        """True if the host value satisfies the requirement.

        ``key`` and ``host`` only name the culprit in the :class:`ExtraSpecError` raised
        when the requirement is malformed or, under a numeric operator, the host value is
        not a number.
        """
        if self.kind == EXACT:
            return value == self.req
        if value is None:
            return False
        if self.error is not None:
            raise ExtraSpecError(f"{_where(key, host)}{self.req!r}: {self.error}",
                                 key=key, value=self.req)
        if self.kind == NUMERIC:
            number = parse_float(value)
            if number is None:
                raise ExtraSpecError(
                    f"{_where(key, host)}host value {value!r} is not a number, but the "
                    f"requirement {self.req!r} compares numbers",
                    key=key, host=host, value=value,
                )
            return NUMERIC_OPS[self.op or "="](number, self.number)  # type: ignore[arg-type]
        assert self._fn is not None
        return self._fn(value)

    def match_numbers(self, values: np.ndarray) -> np.ndarray:
        """Vectorized numeric match over host values already parsed as floats.

        Only for numeric requirements without error; NaN compares as Python's float does
        (False, except True for ``!=``). Callers handle missing values themselves.
        """
        if self.kind != NUMERIC or self.number is None:
            raise ValueError(f"requirement {self.req!r} is not a numeric comparison")
        result: np.ndarray = _NUMERIC_UFUNCS[self.op or "="](values, self.number)
        return result


def _where(key: str | None, host: str | None) -> str:
    if key and host:
        return f"extra spec {key!r} on host {host!r}: "
    if key:
        return f"extra spec {key!r}: "
    if host:
        return f"host {host!r}: "
    return ""


def compile_requirement(req: str) -> Requirement:
    """Parse an extra-spec value once (see the module docstring for the grammar).

    Compiled forms are cached, so compiling the same flavor value per request is cheap.
    """
    if not isinstance(req, str):
        raise ExtraSpecError(f"extra spec value {req!r} is not a string", value=req)
    return _compile(req)


@functools.lru_cache(maxsize=4096)
def _compile(req: str) -> Requirement:
    words = req.split()
    if not words:
        return Requirement(req, EXACT)
    op, rest = words[0], words[1:]
    if op == "<or>":
        if not rest:
            return Requirement(
                req, OR, op=op,
                error="'<or>' needs at least one candidate value (e.g. '<or> a <or> b')",
            )
        candidates = frozenset(rest[0::2])
        return Requirement(req, OR, op=op, words=tuple(rest), _fn=candidates.__contains__)
    if op not in OPERATORS:
        return Requirement(req, EXACT)
    if not rest:
        return Requirement(req, NEVER, op=op, _fn=_never)
    operand = rest[0]
    if op in NUMERIC_OPS:
        number = parse_float(operand)
        if number is None:
            return Requirement(
                req, NUMERIC, op=op, operand=operand,
                error=f"operator {op!r} compares numbers, but {operand!r} is not a number",
            )
        return Requirement(req, NUMERIC, op=op, operand=operand, number=number)
    if op in STRING_OPS:
        compare = STRING_OPS[op]
        return Requirement(req, STRING, op=op, operand=operand,
                           _fn=lambda value: compare(value, operand))
    if op == "<in>":
        return Requirement(req, IN, op=op, operand=operand,
                           _fn=lambda value: operand in value)
    all_words = tuple(rest)
    return Requirement(req, ALL_IN, op=op, words=all_words,
                       _fn=lambda value: all(w in value for w in all_words))


#: Operator words longest first, for finding one glued to its operand (``>=24``).
_BY_LENGTH = sorted(OPERATORS, key=len, reverse=True)


def operator_lookalike(req: str) -> str | None:
    """Why ``req`` reads like an operator expression that Nova's grammar does not see,
    or None. Such a value is compared as a plain string (exact equality with the whole
    value), as Nova does; tools warn about it (``berth flavor check``, ``--explain``).

    Three shapes: an operator glued to its operand (``>=24``, ``s==2.1.0``,
    ``<in>gcc``), ``<`` or ``>`` (not operators of the grammar: ``> 30``), and an
    ``<or>`` glued to a candidate (``<or> a<or> b``).
    """
    words = req.split()
    if not words:
        return None
    first = words[0]
    if first == "<or>":
        glued = next((w for w in words[1:] if "<or>" in w and w != "<or>"), None)
        if glued is not None:
            return (f"{glued!r} has '<or>' without a space, so it is one candidate word "
                    "and the words after it shift; separate every '<or>' with spaces")
        return None
    if first in OPERATORS:
        return None
    glued_op = next((op for op in _BY_LENGTH if first.startswith(op)), None)
    if glued_op is not None:
        spaced = f"{glued_op} {req.strip()[len(glued_op):].strip()}"
        return (f"looks like the operator {glued_op!r} without a space after it: it is "
                f"compared as the string {req!r}, as Nova does; write {spaced!r} to compare "
                "with the operator")
    if first[0] in "<>":
        return (f"{first[0]!r} is not an operator of the grammar (use '{first[0]}=' for "
                f"numbers, 's{first[0]}' for strings): {req!r} is compared as a string, as "
                "Nova does")
    return None


def _never(value: str) -> bool:
    return False


def validate_requirement(key: str, req: str) -> Requirement:
    """Compile ``req`` and raise :class:`ExtraSpecError` naming ``key`` if it is malformed."""
    compiled = compile_requirement(req)
    if compiled.error is not None:
        raise ExtraSpecError(f"extra spec {key!r}={req!r}: {compiled.error}", key=key, value=req)
    return compiled


def match(value: str | None, req: str) -> bool:
    """Nova's ``extra_specs_ops.match(value, req)``: does the host value satisfy ``req``?

    Raises :class:`ExtraSpecError` where Nova raises (bare ``<or>`` or a non-numeric value
    or operand under a numeric operator, for a non-None value).
    """
    return compile_requirement(req).match(value)
