"""The extra-spec operator grammar (reference §4), against a literal restatement of it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berth.errors import ExtraSpecError
from berth.extra_specs.ops import compile_requirement, match, validate_requirement


class _Raised(Exception):
    """The literal restatement would raise here (Nova: ValueError / IndexError)."""


def literal_match(value: str | None, req: str) -> bool:
    """Reference §4 restated rule by rule, as plainly as possible."""
    words = req.split()  # rule 1
    op = words[0] if words else None  # rule 2
    known = {"=", "==", "!=", ">=", "<=", "s==", "s!=", "s<", "s<=", "s>", "s>=",
             "<in>", "<all-in>"}
    if op != "<or>" and op not in known:  # rule 3
        return value == req
    if value is None:  # rule 4
        return False
    rest = words[1:]
    if op == "<or>":  # rule 5
        if not rest:
            raise _Raised("bare <or>")
        return any(value == rest[i] for i in range(0, len(rest), 2))
    if not rest:  # rule 6
        return False
    operand = rest[0]

    def num(text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise _Raised(text) from None

    if op == "=":
        return num(value) >= num(operand)
    if op == "==":
        return num(value) == num(operand)
    if op == "!=":
        return num(value) != num(operand)
    if op == ">=":
        return num(value) >= num(operand)
    if op == "<=":
        return num(value) <= num(operand)
    if op == "s==":
        return value == operand
    if op == "s!=":
        return value != operand
    if op == "s<":
        return value < operand
    if op == "s<=":
        return value <= operand
    if op == "s>":
        return value > operand
    if op == "s>=":
        return value >= operand
    if op == "<in>":
        return operand in value
    return all(w in value for w in rest)  # <all-in>


@pytest.mark.parametrize(
    ("value", "req", "expected"),
    [
        ("124", "= 123", True),
        ("2.0", "== 2", True),
        ("10", "s< 9", True),
        ("['aes', 'mmx', 'aux']", "<all-in> aes mmx", True),
        ("12311321", "<in> 11", True),
        ("3", ">=   2", True),
        ("123", "= 123", True),
        ("122", "= 123", False),
        ("4", "> 2", False),
        ("> 2", "> 2", True),
        ("1", " 1", False),
        ("a", "<or> a <or> b", True),
        ("b", "<or> a <or> b", True),
        ("b", "<or> a c b", True),
        ("c", "<or> a c b", False),
        ("b", "<or> a b", False),
        ("a", "<or> a <or>", True),
        ("x", "=", False),
        ("x", "s==", False),
        ("", "", True),
        ("x", "", False),
        (None, "", False),
        (None, "= 1", False),
        (None, "<or>", False),
        ("QEMU", "s== QEMU", True),
        ("qemu", "s== QEMU", False),
        ("aes", "<all-in>", False),
        ("3", "!= 3.0", False),
        ("3", "<= 3", True),
        ("x", "foo x", False),
        ("foo x", "foo x", True),
    ],
    ids=lambda v: repr(v),
)
def test_the_reference_cases_hold(value: str | None, req: str, expected: bool) -> None:
    assert match(value, req) is expected
    assert literal_match(value, req) is expected


def test_a_bare_or_is_an_extra_spec_error_naming_the_problem() -> None:
    with pytest.raises(ExtraSpecError, match="needs at least one candidate"):
        match("a", "<or>")
    with pytest.raises(ExtraSpecError, match="'trait'"):
        validate_requirement("trait", "<or>")


def test_a_non_numeric_operand_is_rejected_up_front_with_the_key_and_value() -> None:
    with pytest.raises(ExtraSpecError) as err:
        validate_requirement("capabilities:foo", "= three")
    assert "capabilities:foo" in str(err.value)
    assert "'three' is not a number" in str(err.value)


def test_a_non_numeric_host_value_names_the_key_the_host_and_the_value() -> None:
    req = compile_requirement(">= 1")
    with pytest.raises(ExtraSpecError) as err:
        req.match("true", key="ssd", host="node1")
    message = str(err.value)
    assert "'ssd'" in message and "'node1'" in message and "'true'" in message


def test_a_non_string_requirement_is_rejected() -> None:
    with pytest.raises(ExtraSpecError, match="not a string"):
        compile_requirement(3)  # type: ignore[arg-type]


def test_vectorized_numeric_match_agrees_with_the_scalar_form() -> None:
    values = np.array([1.0, 2.0, 3.0, np.nan])
    for req in ("= 2", "== 2", "!= 2", ">= 2", "<= 2"):
        compiled = compile_requirement(req)
        scalar = [compiled.match(str(v)) for v in values[:3]]
        assert compiled.match_numbers(values)[:3].tolist() == scalar
    with pytest.raises(ValueError, match="not a numeric"):
        compile_requirement("s== 2").match_numbers(values)


_tokens = st.sampled_from(
    ["=", "==", "!=", ">=", "<=", ">", "<", "s==", "s!=", "s<", "s<=", "s>", "s>=",
     "<in>", "<all-in>", "<or>", "1", "2.5", "10", "-3", "nan", "a", "b", "ab", "aes",
     "x y", " ", ""]
)
_reqs = st.one_of(
    st.lists(_tokens, max_size=5).map(" ".join),
    st.text(alphabet="=<>!s 0123456789.abin-", max_size=12),
)
_values = st.one_of(
    st.none(),
    st.sampled_from(["1", "2.5", "10", "-3", "a", "b", "ab", "aes mmx", "", " 1", "nan"]),
    st.text(alphabet="0123456789.ab <>", max_size=6),
)


@settings(max_examples=300, deadline=None)
@given(value=_values, req=_reqs)
def test_the_grammar_agrees_with_its_literal_restatement(value: str | None, req: str) -> None:
    try:
        expected: bool | None = literal_match(value, req)
    except _Raised:
        expected = None
    if expected is None:
        with pytest.raises(ExtraSpecError):
            match(value, req)
    else:
        assert match(value, req) is expected


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.one_of(st.integers(-10**6, 10**6).map(float), st.floats(allow_nan=True)), max_size=8),
    op=st.sampled_from(["=", "==", "!=", ">=", "<="]),
    operand=st.sampled_from(["0", "1.5", "-3", "1e3", "nan", "inf"]),
)
def test_the_vectorized_numeric_match_agrees_with_matching_each_value(
    values: list[float], op: str, operand: str
) -> None:
    req = compile_requirement(f"{op} {operand}")
    expected = [req.match(repr(v)) for v in values]
    assert req.match_numbers(np.array(values, dtype=float)).tolist() == expected


def test_an_operator_glued_to_its_operand_is_a_plain_string_as_in_nova() -> None:
    from berth.extra_specs.ops import operator_lookalike

    assert not match("24", ">=24") and not match("30", "> 30")
    assert match(">=24", ">=24")  # exact equality with the whole value
    assert operator_lookalike(">=24") is not None and operator_lookalike(">= 24") is None
    assert operator_lookalike("> 30") is not None and operator_lookalike("s>= 2") is None
