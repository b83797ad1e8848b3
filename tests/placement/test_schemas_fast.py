"""The compiled check in front of jsonschema never accepts what jsonschema refuses.

``schemas.first_error`` answers None at once when the fastjsonschema-compiled schema
accepts a body; only a refused body goes through jsonschema for its error text. So the
one thing that must hold is: whatever the compiled check accepts, jsonschema accepts
too. Checked on every schema of the module, with bodies generated from the schema
itself (mostly valid ones, then one value of them replaced by any JSON) and with any
JSON.
"""

from __future__ import annotations

from typing import Any

import fastjsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema.exceptions import best_match

from berth.placement import schemas

SCHEMAS = {name: value for name, value in vars(schemas).items()
           if name.isupper() and isinstance(value, dict) and "type" in value}

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)



def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Bodies shaped by ``schema`` (the keywords this module's schemas use); most are
    valid, some not (a pattern property's key, a unique item): the checks hold for any."""
    if "anyOf" in schema:
        return st.one_of([from_schema(alt) for alt in schema["anyOf"]])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([from_schema({**schema, "type": k}) for k in kind])
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind in ("integer", "number"):
        low = schema.get("minimum", -(2**33))
        high = schema.get("maximum", 2**33)
        ints = st.integers(int(low), int(min(high, 2**62)))
        return ints if kind == "integer" else ints | st.floats(low, min(high, 1e12))
    if kind == "string":
        if schema.get("format") == "uuid":
            return st.uuids().map(str)
        if "pattern" in schema:
            text = st.from_regex(schema["pattern"], fullmatch=True)
        else:
            text = st.text(min_size=schema.get("minLength", 0), max_size=20)
        return text
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {"type": "string"})),
                        min_size=schema.get("minItems", 0), max_size=5,
                        unique_by=(lambda x: repr(x)) if schema.get("uniqueItems") else None)
    if kind == "object":
        props = schema.get("properties", {})
        required = [k for k in schema.get("required", []) if k in props]
        optional = {k: from_schema(v) for k, v in props.items() if k not in required}
        fixed = st.fixed_dictionaries({k: from_schema(props[k]) for k in required},
                                      optional=optional)
        patterned = [st.dictionaries(st.from_regex(pattern, fullmatch=True),
                                     from_schema(sub), min_size=schema.get("minProperties", 0),
                                     max_size=3)
                     for pattern, sub in schema.get("patternProperties", {}).items()]
        if patterned:
            return st.tuples(fixed, *patterned).map(
                lambda parts: {k: v for part in parts for k, v in part.items()})
        return fixed
    return JSON


SHAPED = {name: from_schema(schema) for name, schema in SCHEMAS.items()}


def _mutate(data: Any, draw: Any) -> Any:
    """``data`` with one value somewhere in it replaced by any JSON, or a key added."""
    if isinstance(data, dict) and data and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(data)))
        return {**data, key: _mutate(data[key], draw)}
    if isinstance(data, list) and data and draw(st.booleans()):
        at = draw(st.integers(0, len(data) - 1))
        return [*data[:at], _mutate(data[at], draw), *data[at + 1:]]
    if isinstance(data, dict) and draw(st.booleans()):
        return {**data, draw(st.text(max_size=8)): draw(JSON)}
    return draw(JSON)


def _jsonschema_error(schema: dict[str, Any], data: Any) -> str | None:
    error = best_match(schemas._validator(schema).iter_errors(data))
    return None if error is None else str(error)


def _fast_accepts(schema: dict[str, Any], data: Any) -> bool:
    try:
        schemas._fast(schema)(data)
    except fastjsonschema.JsonSchemaException:
        return False
    return True


def test_every_schema_of_the_module_compiles() -> None:
    assert len(SCHEMAS) > 30
    for schema in SCHEMAS.values():
        assert callable(schemas._fast(schema))


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_what_the_compiled_check_accepts_jsonschema_accepts(name: str, data: Any) -> None:
    schema = SCHEMAS[name]
    body = data.draw(SHAPED[name], label="shaped")
    for candidate in (body, _mutate(body, data.draw), data.draw(JSON, label="any")):
        expected = _jsonschema_error(schema, candidate)
        if _fast_accepts(schema, candidate):
            assert expected is None, (name, candidate, expected)
        found = schemas.first_error(schema, candidate)
        assert (None if found is None else str(found)) == expected


def test_the_usual_bodies_take_the_fast_path() -> None:
    inventory = {"total": 32, "reserved": 0, "min_unit": 1, "max_unit": 32, "step_size": 1,
                 "allocation_ratio": 16.0}
    bodies = [
        (schemas.PUT_INVENTORIES, {"resource_provider_generation": 1,
                                   "inventories": {"VCPU": inventory, "CUSTOM_X": inventory}}),
        (schemas.PUT_PROVIDER_TRAITS, {"resource_provider_generation": 2,
                                       "traits": ["HW_CPU_X86_AVX2", "CUSTOM_GOLD"]}),
        (schemas.POST_PROVIDER_V1_14, {"name": "c1", "uuid": "6f1c7a7e-3f1e-4d3e-9a53-0d1f4b8a2c11"}),
        (schemas.ALLOCATIONS_V1_38, {
            "allocations": {"6f1c7a7e-3f1e-4d3e-9a53-0d1f4b8a2c11": {"resources": {"VCPU": 1}}},
            "project_id": "p", "user_id": "u", "consumer_generation": None,
            "consumer_type": "INSTANCE"}),
    ]
    for schema, body in bodies:
        assert _jsonschema_error(schema, body) is None
        assert _fast_accepts(schema, body)


def test_a_refused_body_gets_jsonschemas_words() -> None:
    error = schemas.first_error(schemas.PUT_PROVIDER_TRAITS,
                                {"resource_provider_generation": 1, "traits": "A"})
    assert error is not None
    assert str(error).startswith("'A' is not of type 'array'")
    assert "schema['properties']['traits']" in str(error)


def test_a_final_newline_is_decided_by_jsonschema() -> None:
    """fastjsonschema's ``$`` refuses a final newline that jsonschema's re.search takes:
    the body then goes through jsonschema, which decides as before."""
    schema = schemas.CUSTOM_TRAIT
    assert not _fast_accepts(schema, "CUSTOM_A\n")
    assert _jsonschema_error(schema, "CUSTOM_A\n") is None  # jsonschema takes it
    assert schemas.first_error(schema, "CUSTOM_A\n") is None  # and so the answer does
