"""JSON Schemas of request bodies and query strings, laid out as Placement lays them out.

Clients match jsonschema's own wording (``Failed validating 'minimum' in
schema['properties']['total']``), so the structure and key names here are part of the
wire contract. Validation uses jsonschema's newest draft and ``best_match``, the same
selection ``jsonschema.validate`` makes, with a ``uuid`` format that accepts whatever
``uuid.UUID`` accepts once dashes, braces and ``urn:uuid:`` are stripped.

A body is first checked by the schema compiled with fastjsonschema (a few microseconds
where jsonschema walks a provider's 40 traits in ~300). Only a body it refuses goes
through jsonschema, which gives the error, or none: the two differ on a few corner
cases (fastjsonschema's ``$`` does not match before a final newline), and then
jsonschema decides. What the compiled check accepts, jsonschema accepts too
(``tests/placement/test_schemas_fast.py`` checks it on generated bodies).
"""

from __future__ import annotations

import copy
import uuid as uuid_mod
from collections.abc import Callable
from typing import Any

import fastjsonschema
import jsonschema
from jsonschema.exceptions import best_match

from berth.placement import errors
from berth.placement.bounds import MAX_FLOAT, MAX_INT

FORMAT_CHECKER = jsonschema.FormatChecker(formats=())


@FORMAT_CHECKER.checks("uuid")
def is_uuid_like(value: object) -> bool:
    """Whether ``value`` is a UUID in any spelling Python's uuid.UUID accepts."""
    if not isinstance(value, str):
        return True
    return normalize_uuid(value) is not None


def normalize_uuid(value: str) -> str | None:
    """Canonical lower-case dashed form of a uuid-like string, or None if it is not one."""
    text = value.lower()
    if text.startswith("urn:uuid:"):
        text = text[9:]
    text = text.replace("{", "").replace("}", "").replace("-", "")
    try:
        parsed = uuid_mod.UUID(text)
    except (ValueError, TypeError, AttributeError):
        return None
    if parsed.hex != text:
        return None
    return str(parsed)


_VALIDATOR_CLS: Any = jsonschema.validators.validator_for({})
_CACHE: dict[int, Any] = {}
_FAST: dict[int, Callable[[Any], Any]] = {}


def _validator(schema: dict[str, Any]) -> Any:
    key = id(schema)
    validator = _CACHE.get(key)
    if validator is None:
        validator = _VALIDATOR_CLS(schema, format_checker=FORMAT_CHECKER)
        _CACHE[key] = validator
    return validator


def _fast(schema: dict[str, Any]) -> Callable[[Any], Any]:
    """The schema compiled by fastjsonschema (raising on a body it refuses)."""
    key = id(schema)
    check = _FAST.get(key)
    if check is None:
        check = _FAST[key] = fastjsonschema.compile(
            schema, formats={"uuid": lambda value: normalize_uuid(value) is not None})
    return check


def first_error(schema: dict[str, Any], data: Any) -> jsonschema.ValidationError | None:
    """The error ``jsonschema.validate`` would raise, or None."""
    try:
        _fast(schema)(data)
    except fastjsonschema.JsonSchemaException:
        return best_match(_validator(schema).iter_errors(data))
    return None


def validate_body(schema: dict[str, Any], data: Any) -> None:
    """Raise Placement's ``JSON does not validate: ...`` 400 on a schema failure."""
    error = first_error(schema, data)
    if error is not None:
        raise errors.BadRequest(f"JSON does not validate: {error}")


def validate_query(schema: dict[str, Any], data: dict[str, str]) -> None:
    """Raise ``Invalid query string parameters: ...`` on a query-string schema failure."""
    error = first_error(schema, data)
    if error is not None:
        raise errors.BadRequest(f"Invalid query string parameters: {error}")


# --- resource providers --------------------------------------------------------------

POST_PROVIDER_V1_0: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 200},
        "uuid": {"type": "string", "format": "uuid"},
    },
    "required": ["name"],
    "additionalProperties": False,
}
POST_PROVIDER_V1_14 = copy.deepcopy(POST_PROVIDER_V1_0)
POST_PROVIDER_V1_14["properties"]["parent_provider_uuid"] = {
    "anyOf": [{"type": "string", "format": "uuid"}, {"type": "null"}]
}
PUT_PROVIDER_V1_0 = copy.deepcopy(POST_PROVIDER_V1_0)
del PUT_PROVIDER_V1_0["properties"]["uuid"]
PUT_PROVIDER_V1_14 = copy.deepcopy(POST_PROVIDER_V1_14)
del PUT_PROVIDER_V1_14["properties"]["uuid"]

LIST_PROVIDERS_V1_0: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "uuid": {"type": "string", "format": "uuid"},
    },
    "additionalProperties": False,
}
LIST_PROVIDERS_V1_3 = copy.deepcopy(LIST_PROVIDERS_V1_0)
LIST_PROVIDERS_V1_3["properties"]["member_of"] = {"type": "string"}
LIST_PROVIDERS_V1_4 = copy.deepcopy(LIST_PROVIDERS_V1_3)
LIST_PROVIDERS_V1_4["properties"]["resources"] = {"type": "string"}
LIST_PROVIDERS_V1_14 = copy.deepcopy(LIST_PROVIDERS_V1_4)
LIST_PROVIDERS_V1_14["properties"]["in_tree"] = {"type": "string", "format": "uuid"}
LIST_PROVIDERS_V1_18 = copy.deepcopy(LIST_PROVIDERS_V1_14)
LIST_PROVIDERS_V1_18["properties"]["required"] = {"type": "string"}


def list_providers_schema(version: tuple[int, int]) -> dict[str, Any]:
    """The GET /resource_providers query schema for a microversion."""
    if version >= (1, 18):
        return LIST_PROVIDERS_V1_18
    if version >= (1, 14):
        return LIST_PROVIDERS_V1_14
    if version >= (1, 4):
        return LIST_PROVIDERS_V1_4
    if version >= (1, 3):
        return LIST_PROVIDERS_V1_3
    return LIST_PROVIDERS_V1_0


# --- inventories ---------------------------------------------------------------------

BASE_INVENTORY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "resource_provider_generation": {"type": "integer"},
        "total": {"type": "integer", "maximum": MAX_INT, "minimum": 1},
        "reserved": {"type": "integer", "maximum": MAX_INT, "minimum": 0},
        "min_unit": {"type": "integer", "maximum": MAX_INT, "minimum": 1},
        "max_unit": {"type": "integer", "maximum": MAX_INT, "minimum": 1},
        "step_size": {"type": "integer", "maximum": MAX_INT, "minimum": 1},
        # Placement sets no minimum; a ratio below -MAX_FLOAT times a large total is an
        # infinite capacity, which Placement cannot turn into an integer (a 500).
        "allocation_ratio": {"type": "number", "maximum": MAX_FLOAT, "minimum": -MAX_FLOAT},
    },
    "required": ["total", "resource_provider_generation"],
    "additionalProperties": False,
}
POST_INVENTORY = copy.deepcopy(BASE_INVENTORY)
POST_INVENTORY["properties"]["resource_class"] = {"type": "string", "pattern": "^[A-Z0-9_]+$"}
POST_INVENTORY["required"] = ["total", "resource_class"]
PUT_INVENTORY_RECORD = copy.deepcopy(BASE_INVENTORY)
PUT_INVENTORY_RECORD["required"] = ["total"]
del PUT_INVENTORY_RECORD["properties"]["resource_provider_generation"]
PUT_INVENTORIES: dict[str, Any] = {
    "type": "object",
    "properties": {
        "resource_provider_generation": {"type": "integer"},
        "inventories": {
            "type": "object",
            "patternProperties": {"^[A-Z0-9_]+$": PUT_INVENTORY_RECORD},
            # Placement's schema lets any other key through (it is then an unknown class,
            # after the generation and capacity checks); its record is still checked here,
            # where Placement would fail on a malformed one with a 500.
            "additionalProperties": PUT_INVENTORY_RECORD,
        },
    },
    "required": ["resource_provider_generation", "inventories"],
    "additionalProperties": False,
}
PUT_INVENTORY = BASE_INVENTORY

# --- aggregates ----------------------------------------------------------------------

AGGREGATES_LIST: dict[str, Any] = {
    "type": "array",
    "items": {"type": "string", "format": "uuid"},
    "uniqueItems": True,
}
PUT_AGGREGATES_V1_1 = AGGREGATES_LIST
PUT_AGGREGATES_V1_19: dict[str, Any] = {
    "type": "object",
    "properties": {
        "aggregates": AGGREGATES_LIST,
        "resource_provider_generation": {"type": "integer"},
    },
    "required": ["aggregates", "resource_provider_generation"],
    "additionalProperties": False,
}

# --- traits --------------------------------------------------------------------------

CUSTOM_NAME_PATTERN = "^CUSTOM_[A-Z0-9_]+$"
CUSTOM_TRAIT: dict[str, Any] = {
    "type": "string",
    "pattern": CUSTOM_NAME_PATTERN,
    "minLength": 1,
    "maxLength": 255,
}
PUT_PROVIDER_TRAITS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "traits": {
            "type": "array",
            "items": {"type": "string", "minLength": 1, "maxLength": 255},
        },
        "resource_provider_generation": {"type": "integer"},
    },
    "required": ["traits", "resource_provider_generation"],
    "additionalProperties": False,
}
LIST_TRAITS: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "associated": {"type": "string"}},
    "additionalProperties": False,
}

# --- resource classes ----------------------------------------------------------------

RESOURCE_CLASS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": CUSTOM_NAME_PATTERN, "maxLength": 255},
    },
    "required": ["name"],
    "additionalProperties": False,
}

# --- allocations ---------------------------------------------------------------------

_RESOURCES: dict[str, Any] = {
    "type": "object",
    "minProperties": 1,
    "patternProperties": {"^[0-9A-Z_]+$": {"type": "integer", "minimum": 1}},
    "additionalProperties": False,
}
_PROJECT_USER = {"type": "string", "minLength": 1, "maxLength": 255}
_CONSUMER_TYPE = {"type": "string", "pattern": "^[A-Z0-9_]+$", "minLength": 1, "maxLength": 255}
_UUID_KEY = "^[0-9a-fA-F-]{36}$"

ALLOCATIONS_V1_0: dict[str, Any] = {
    "type": "object",
    "properties": {
        "allocations": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "resource_provider": {
                        "type": "object",
                        "properties": {"uuid": {"type": "string", "format": "uuid"}},
                        "additionalProperties": False,
                        "required": ["uuid"],
                    },
                    "resources": _RESOURCES,
                },
                "required": ["resource_provider", "resources"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["allocations"],
    "additionalProperties": False,
}
ALLOCATIONS_V1_8 = copy.deepcopy(ALLOCATIONS_V1_0)
ALLOCATIONS_V1_8["properties"]["project_id"] = _PROJECT_USER
ALLOCATIONS_V1_8["properties"]["user_id"] = _PROJECT_USER
ALLOCATIONS_V1_8["required"] = ["allocations", "project_id", "user_id"]

ALLOCATIONS_V1_12: dict[str, Any] = {
    "type": "object",
    "properties": {
        "allocations": {
            "type": "object",
            "minProperties": 1,
            "patternProperties": {
                _UUID_KEY: {
                    "type": "object",
                    "properties": {
                        "generation": {"type": "integer"},
                        "resources": _RESOURCES,
                    },
                    "required": ["resources"],
                    "additionalProperties": False,
                }
            },
            "additionalProperties": False,
        },
        "project_id": _PROJECT_USER,
        "user_id": _PROJECT_USER,
    },
    "required": ["allocations", "project_id", "user_id"],
    "additionalProperties": False,
}
ALLOCATIONS_V1_28 = copy.deepcopy(ALLOCATIONS_V1_12)
del ALLOCATIONS_V1_28["properties"]["allocations"]["minProperties"]
ALLOCATIONS_V1_28["properties"]["consumer_generation"] = {"type": ["integer", "null"]}
ALLOCATIONS_V1_28["required"].append("consumer_generation")
ALLOCATIONS_V1_34 = copy.deepcopy(ALLOCATIONS_V1_28)
ALLOCATIONS_V1_34["properties"]["mappings"] = {
    "type": "object",
    # Placement refuses an empty mappings object ("{} should be non-empty").
    "minProperties": 1,
    "additionalProperties": {
        "type": "array",
        "items": {"type": "string", "format": "uuid"},
    },
}
ALLOCATIONS_V1_38 = copy.deepcopy(ALLOCATIONS_V1_34)
ALLOCATIONS_V1_38["properties"]["consumer_type"] = _CONSUMER_TYPE
ALLOCATIONS_V1_38["required"].append("consumer_type")


def put_allocations_schema(version: tuple[int, int]) -> dict[str, Any]:
    """PUT /allocations/{consumer} body schema for a microversion."""
    if version >= (1, 38):
        return ALLOCATIONS_V1_38
    if version >= (1, 34):
        return ALLOCATIONS_V1_34
    if version >= (1, 28):
        return ALLOCATIONS_V1_28
    if version >= (1, 12):
        return ALLOCATIONS_V1_12
    if version >= (1, 8):
        return ALLOCATIONS_V1_8
    return ALLOCATIONS_V1_0


# POST /allocations: per consumer the 1.12 shape, but ``allocations`` may be empty.
_POST_CONSUMER_V1_13 = copy.deepcopy(ALLOCATIONS_V1_12)
del _POST_CONSUMER_V1_13["properties"]["allocations"]["minProperties"]


def _post_allocations(consumer_schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "minProperties": 1,
        "patternProperties": {_UUID_KEY: consumer_schema},
        "additionalProperties": False,
    }


POST_ALLOCATIONS_V1_13 = _post_allocations(_POST_CONSUMER_V1_13)
POST_ALLOCATIONS_V1_28 = _post_allocations(ALLOCATIONS_V1_28)
POST_ALLOCATIONS_V1_34 = _post_allocations(ALLOCATIONS_V1_34)
POST_ALLOCATIONS_V1_38 = _post_allocations(ALLOCATIONS_V1_38)


def post_allocations_schema(version: tuple[int, int]) -> dict[str, Any]:
    """POST /allocations body schema for a microversion."""
    if version >= (1, 38):
        return POST_ALLOCATIONS_V1_38
    if version >= (1, 34):
        return POST_ALLOCATIONS_V1_34
    if version >= (1, 28):
        return POST_ALLOCATIONS_V1_28
    return POST_ALLOCATIONS_V1_13


# --- usages --------------------------------------------------------------------------

GET_USAGES_V1_9: dict[str, Any] = {
    "type": "object",
    "properties": {"project_id": _PROJECT_USER, "user_id": _PROJECT_USER},
    "required": ["project_id"],
    "additionalProperties": False,
}
GET_USAGES_V1_38 = copy.deepcopy(GET_USAGES_V1_9)
GET_USAGES_V1_38["properties"]["consumer_type"] = {
    "type": "string",
    "pattern": "^[A-Z0-9_]+$|^all|^unknown$",
}

# --- reshaper ------------------------------------------------------------------------


def _reshaper(allocations_schema: dict[str, Any]) -> dict[str, Any]:
    allocs = copy.deepcopy(allocations_schema)
    allocs.pop("minProperties", None)
    return {
        "type": "object",
        "properties": {
            "inventories": {
                "type": "object",
                "minProperties": 1,
                "patternProperties": {_UUID_KEY: PUT_INVENTORIES},
                "additionalProperties": False,
            },
            "allocations": allocs,
        },
        "required": ["inventories", "allocations"],
        "additionalProperties": False,
    }


RESHAPER_V1_30 = _reshaper(POST_ALLOCATIONS_V1_28)
RESHAPER_V1_34 = _reshaper(POST_ALLOCATIONS_V1_34)
RESHAPER_V1_38 = _reshaper(POST_ALLOCATIONS_V1_38)


def reshaper_schema(version: tuple[int, int]) -> dict[str, Any]:
    """POST /reshaper body schema for a microversion."""
    if version >= (1, 38):
        return RESHAPER_V1_38
    if version >= (1, 34):
        return RESHAPER_V1_34
    return RESHAPER_V1_30
