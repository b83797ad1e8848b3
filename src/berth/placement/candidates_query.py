"""Parsing and validation of the GET /allocation_candidates query string, per microversion.

The checks run in the reference's order (section 4.12): the jsonschema of the
microversion (unknown keys, bad ``limit`` / ``group_policy``), then the request-wide
parameters (``limit``, ``group_policy``, ``root_required``, ``same_subtree``), then the
request groups keyed by suffix, then the orphan / resourceless checks, the
required-versus-forbidden conflict check and the ``group_policy`` requirement. Unknown
trait and class names are *not* checked here: the search reports them group by group,
as the reference does (a later group's bad name is never reported when an earlier group
already came out empty).

Every error is a ``BadRequest`` with the reference's verbatim text (Appendix A) and, where
the reference gives one, its ``placement.query.*`` code.
"""

from __future__ import annotations

import copy
import re
import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from jsonschema.exceptions import best_match

from berth.placement.errors import BadRequest

QUERY_DUPLICATE_KEY = "placement.query.duplicate_key"
QUERY_BAD_VALUE = "placement.query.bad_value"
QUERY_MISSING_VALUE = "placement.query.missing_value"

Microversion = tuple[int, int]

_GROUP_PAT = r"[1-9][0-9]*"
_GROUP_PAT_1_33 = r"[a-zA-Z0-9_-]{1,64}"
_PREFIXES = ("resources", "required", "member_of", "in_tree")
_KEY_PATTERN = re.compile(rf"^({'|'.join(_PREFIXES)})({_GROUP_PAT})?$")
_KEY_PATTERN_1_33 = re.compile(rf"^({'|'.join(_PREFIXES)})({_GROUP_PAT_1_33})?$")


def _build_schemas() -> list[tuple[Microversion, dict[str, Any]]]:
    """The query schemas by first microversion, laid out as the reference's section 4.12.

    The layout matters: jsonschema's error text (which clients match) names the schema
    keywords and, for unknown keys, lists the pattern properties.
    """
    s110: dict[str, Any] = {
        "type": "object",
        "properties": {"resources": {"type": "string"}},
        "required": ["resources"],
        "additionalProperties": False,
    }
    s116 = copy.deepcopy(s110)
    s116["properties"]["limit"] = {
        # A query value is always a string; integers are accepted for direct callers.
        "type": ["integer", "string"],
        "pattern": "^[1-9][0-9]*$",
        "minimum": 1,
        "minLength": 1,
    }
    s117 = copy.deepcopy(s116)
    s117["properties"]["required"] = {"type": ["string"]}
    s121 = copy.deepcopy(s117)
    s121["properties"]["member_of"] = {"type": ["string"]}
    s125 = copy.deepcopy(s121)
    del s125["properties"]["resources"]
    del s125["required"]
    del s125["properties"]["required"]
    del s125["properties"]["member_of"]
    group_fmt = "^%s(" + _GROUP_PAT + ")?$"
    s125["patternProperties"] = {
        group_fmt % "resources": {"type": "string"},
        group_fmt % "required": {"type": "string"},
        group_fmt % "member_of": {"type": "string"},
    }
    s125["properties"]["group_policy"] = {"type": "string", "enum": ["none", "isolate"]}
    s131 = copy.deepcopy(s125)
    s131["patternProperties"][group_fmt % "in_tree"] = {"type": "string"}
    s133 = copy.deepcopy(s131)
    group_fmt_133 = "^%s(" + _GROUP_PAT_1_33 + ")?$"
    s133["patternProperties"] = {group_fmt_133 % prefix: {"type": "string"} for prefix in _PREFIXES}
    s135 = copy.deepcopy(s133)
    s135["properties"]["root_required"] = {"type": ["string"]}
    s136 = copy.deepcopy(s135)
    s136["properties"]["same_subtree"] = {"type": ["string"]}
    return [
        ((1, 36), s136),
        ((1, 35), s135),
        ((1, 33), s133),
        ((1, 31), s131),
        ((1, 25), s125),
        ((1, 21), s121),
        ((1, 17), s117),
        ((1, 16), s116),
        ((1, 10), s110),
    ]


_FORMAT_CHECKER = jsonschema.FormatChecker()
_VALIDATORS: list[tuple[Microversion, Any]] = []
for _version, _schema in _build_schemas():
    _cls = jsonschema.validators.validator_for(_schema)
    _cls.check_schema(_schema)
    _VALIDATORS.append((_version, _cls(_schema, format_checker=_FORMAT_CHECKER)))


def query_schema(microversion: Microversion) -> dict[str, Any]:
    """The jsonschema the query string of ``microversion`` is validated against."""
    return dict(_validator_for(microversion).schema)


#: Query strings (flattened, with their validator) known to pass the schema. A scheduler
#: sends few distinct queries; this skips jsonschema for the repeats. Bounded.
_VALID_QUERIES: set[tuple[int, tuple[tuple[str, str], ...]]] = set()
_VALID_QUERIES_MAX = 4096


def _schema_error(validator: Any, flat: dict[str, str]) -> Any:
    """The best schema error of ``flat``, or None; passes are remembered."""
    key = (id(validator), tuple(sorted(flat.items())))
    if key in _VALID_QUERIES:
        return None
    error = best_match(validator.iter_errors(flat))
    if error is None:
        if len(_VALID_QUERIES) >= _VALID_QUERIES_MAX:
            _VALID_QUERIES.clear()
        _VALID_QUERIES.add(key)
    return error


def _validator_for(microversion: Microversion) -> Any:
    for version, validator in _VALIDATORS:
        if microversion >= version:
            return validator
    raise ValueError(f"GET /allocation_candidates does not exist at {microversion}")


@dataclass(slots=True)
class RequestGroup:
    """One request group: ``""`` is the unsuffixed group, any other suffix is granular.

    ``required`` is a list of any-of sets (``[{A}, {B, C}]`` means A and (B or C));
    ``member_of`` is a list of any-of aggregate sets, ANDed.
    """

    suffix: str
    resources: dict[str, int] = field(default_factory=dict)
    required: list[frozenset[str]] = field(default_factory=list)
    forbidden: frozenset[str] = frozenset()
    member_of: list[frozenset[str]] = field(default_factory=list)
    forbidden_aggs: frozenset[str] = frozenset()
    in_tree: str | None = None

    @property
    def use_same_provider(self) -> bool:
        """Granular groups must be satisfied by one provider; the unsuffixed one need not."""
        return bool(self.suffix)


@dataclass(slots=True)
class CandidateQuery:
    """A validated GET /allocation_candidates request."""

    groups: dict[str, RequestGroup]
    limit: int | None = None
    group_policy: str | None = None
    root_required: frozenset[str] | None = None
    root_forbidden: frozenset[str] | None = None
    same_subtrees: list[frozenset[str]] = field(default_factory=list)


def is_uuid_like(value: str) -> bool:
    """oslo's ``is_uuid_like``: what ``uuid.UUID`` accepts once dashes, braces and urn go."""
    try:
        formatted = (
            value.replace("urn:", "").replace("uuid:", "").strip("{}").replace("-", "").lower()
        )
        return str(uuidlib.UUID(value)).replace("-", "") == formatted
    except (TypeError, ValueError, AttributeError):
        return False


def parse_query(params: Mapping[str, list[str]], microversion: Microversion) -> CandidateQuery:
    """Validate ``params`` (name -> values in order received) and build the request.

    Raises ``BadRequest`` with the reference's texts and codes.
    """
    validator = _validator_for(microversion)
    # The schema sees a plain dict in which the last value of a repeated key wins.
    flat = {key: values[-1] for key, values in params.items() if values}
    error = _schema_error(validator, flat)
    if error is not None:
        raise BadRequest(f"Invalid query string parameters: {error}")

    query = CandidateQuery(groups={})
    _parse_request_wide(params, query)
    query.groups = _parse_groups(params, microversion)
    groups = query.groups

    if microversion >= (1, 36):
        resourceless = {suffix for suffix, g in groups.items() if not g.resources}
        subtree_suffixes: set[str] = set().union(*query.same_subtrees)
        if len(resourceless) == len(groups):
            raise BadRequest(
                "There must be at least one resources or resources[$S] parameter.",
                code=QUERY_MISSING_VALUE,
            )
        bad = sorted(s for s in resourceless if s not in subtree_suffixes)
        if bad:
            raise BadRequest(
                "Resourceless suffixed group request should be specified in `same_subtree` "
                f"query param: bad group(s) - {bad}.",
                code=QUERY_BAD_VALUE,
            )
        bad = sorted(s for s in subtree_suffixes if s not in groups)
        if bad:
            raise BadRequest(
                f"Real suffixes should be specified in `same_subtree`: {bad} not found in "
                f"{list(groups)}.",
                code=QUERY_BAD_VALUE,
            )
    else:
        _check_orphans(groups)

    if microversion >= (1, 22):
        conflicts = sorted(
            f"required{suffix}: ({', '.join(sorted(any_of))})"
            for suffix, g in groups.items()
            for any_of in g.required
            if any_of <= g.forbidden
        )
        if conflicts:
            raise BadRequest(
                "Conflicting required and forbidden traits found in the following traits "
                "keys: " + ", ".join(conflicts)
            )

    if not query.group_policy and sum(1 for g in groups.values() if g.use_same_provider) > 1:
        raise BadRequest(
            'The "group_policy" parameter is required when specifying more than one '
            '"resources{N}" parameter.'
        )
    return query


def _parse_request_wide(params: Mapping[str, list[str]], query: CandidateQuery) -> None:
    """``limit`` and ``group_policy`` (first value), ``root_required``, ``same_subtree``."""
    limits = params.get("limit") or []
    if limits:
        try:
            query.limit = int(limits[0])
        except ValueError:  # past Python's 4,300 digits (Placement: a 500)
            raise BadRequest(f"Invalid query string parameters: limit has {len(limits[0])} "
                             "digits; at most 4300 are read") from None
    policies = params.get("group_policy") or []
    if policies:
        query.group_policy = policies[0]
    roots = params.get("root_required") or []
    if roots:
        if len(roots) > 1:
            raise BadRequest(
                "Query parameter 'root_required' may be specified only once.",
                code=QUERY_DUPLICATE_KEY,
            )
        # root_required has no any-of form: the 1.38 parser, forbidden traits allowed.
        required_sets, forbidden = parse_traits_value(
            roots[0], allow_forbidden=True, allow_any_traits=False
        )
        required = frozenset(t for any_of in required_sets for t in any_of)
        conflicts = sorted(required & forbidden)
        if conflicts:
            raise BadRequest(
                "Conflicting required and forbidden traits found in root_required: "
                + ", ".join(conflicts),
                code=QUERY_BAD_VALUE,
            )
        query.root_required = required
        query.root_forbidden = frozenset(forbidden)
    for value in params.get("same_subtree") or []:
        # Placement strips each suffix, so "_A, _B" names _A and _B.
        suffixes = [suffix.strip() for suffix in value.split(",")]
        if "" in suffixes:
            raise BadRequest(
                "Empty string (unsuffixed group) can not be specified in `same_subtree` ",
                code=QUERY_BAD_VALUE,
            )
        query.same_subtrees.append(frozenset(suffixes))


def _parse_groups(
    params: Mapping[str, list[str]], microversion: Microversion
) -> dict[str, RequestGroup]:
    pattern = _KEY_PATTERN_1_33 if microversion >= (1, 33) else _KEY_PATTERN
    groups: dict[str, RequestGroup] = {}
    for key, values in params.items():
        match = pattern.match(key)
        if not match or not values:
            continue
        prefix, suffix = match.group(1), match.group(2) or ""
        group = groups.get(suffix)
        if group is None:
            group = groups[suffix] = RequestGroup(suffix=suffix)
        if prefix == "resources":
            # Each occurrence is validated; the last one wins.
            for value in values:
                group.resources = parse_resources_value(value)
        elif prefix == "required":
            group.required, group.forbidden = parse_required_values(values, microversion)
        elif prefix == "member_of":
            group.member_of, group.forbidden_aggs = parse_member_of_values(
                values, suffix, microversion
            )
        else:
            for value in values:
                if not is_uuid_like(value):
                    raise BadRequest(
                        "Invalid query string parameters: Expected 'in_tree' parameter to "
                        f"be a format of uuid. Got: {value}"
                    )
                group.in_tree = value
    return groups


def _check_orphans(groups: dict[str, RequestGroup]) -> None:
    """Below 1.36 every group needs resources, and at least one group must exist."""
    orphans = [f"required{s}" for s, g in groups.items() if g.required and not g.resources]
    if orphans:
        raise BadRequest(
            "All traits parameters must be associated with resources.  Found the following "
            "orphaned traits keys: " + ", ".join(orphans)
        )
    orphans = [
        f"member_of{s}"
        for s, g in groups.items()
        if not g.resources and (g.member_of or g.forbidden_aggs)
    ]
    if orphans:
        raise BadRequest(
            "All member_of parameters must be associated with resources. Found the "
            "following orphaned member_of keys: " + ", ".join(orphans)
        )
    if not all(g.resources for g in groups.values()):
        raise BadRequest("All request groups must specify resources.")
    if not groups:
        raise BadRequest("At least one request group (`resources` or `resources{$S}`) is required.")


_RESOURCES_FORM = (
    "Badly formed resources parameter. Expected resources query string parameter in form: "
    "?resources=VCPU:2,MEMORY_MB:1024. Got: "
)


def parse_resources_value(value: str) -> dict[str, int]:
    """``VCPU:2,MEMORY_MB:1024`` -> ``{"VCPU": 2, "MEMORY_MB": 1024}`` (later keys win)."""
    if value.strip() == "":
        raise BadRequest(_RESOURCES_FORM + "empty string.")
    result: dict[str, int] = {}
    for item in value.split(","):
        parts = item.split(":")
        if len(parts) != 2:
            raise BadRequest(f"{_RESOURCES_FORM}{item}.")
        name, raw = parts
        try:
            amount = int(raw)
        except ValueError:
            raise BadRequest(
                f"Requested resource {name} expected positive integer amount. Got: {raw}."
            ) from None
        if amount < 1:
            raise BadRequest(f"Requested resource {name} requires amount >= 1. Got: {amount}.")
        result[name] = amount
    return result


def parse_traits_value(
    value: str, *, allow_forbidden: bool, allow_any_traits: bool
) -> tuple[list[frozenset[str]], frozenset[str]]:
    """One ``required`` value -> (any-of sets, forbidden traits), per the microversion."""
    if value.startswith("in:"):
        if not allow_any_traits:
            raise BadRequest(
                "Invalid query string parameters: The format 'in:HW_CPU_X86_VMX,CUSTOM_MAGIC' "
                f"only supported since microversion 1.39. Got: {value}"
            )
        any_of = frozenset(part.strip() for part in value[3:].split(","))
        if not all(any_of):
            raise BadRequest(
                "Invalid query string parameters: Expected 'required' parameter value of the "
                f"form: in:HW_CPU_X86_VMX,CUSTOM_MAGIC. Got an empty trait in: {value}"
            )
        if any(t.startswith("!") for t in any_of):
            raise BadRequest(
                "Invalid query string parameters: The format 'in:HW_CPU_X86_VMX,CUSTOM_MAGIC' "
                f"does not support forbidden traits. Got: {value}"
            )
        return [any_of], frozenset()
    names = [part.strip() for part in value.split(",")]
    # Quirk kept from the reference: any number of leading '!' means forbidden once.
    forbidden = frozenset(t.lstrip("!") for t in names if t.startswith("!"))
    if not all(names) or not all(forbidden):
        form = "HW_CPU_X86_VMX,!CUSTOM_MAGIC" if allow_forbidden else "HW_CPU_X86_VMX,CUSTOM_MAGIC"
        raise BadRequest(
            "Invalid query string parameters: Expected 'required' parameter value of the "
            f"form: {form}. Got an empty trait in: {value}"
        )
    if forbidden and not allow_forbidden:
        raise BadRequest(
            "Invalid query string parameters: Expected 'required' parameter value of the "
            f"form: HW_CPU_X86_VMX,CUSTOM_MAGIC. Got: {value}"
        )
    required = [frozenset([t]) for t in names if not t.startswith("!")]
    return required, forbidden


def parse_required_values(
    values: list[str], microversion: Microversion
) -> tuple[list[frozenset[str]], frozenset[str]]:
    """All ``requiredS`` values: ANDed from 1.39, only the last one counts below."""
    allow_any = microversion >= (1, 39)
    if not allow_any:
        values = values[-1:]
    required: list[frozenset[str]] = []
    forbidden: frozenset[str] = frozenset()
    for value in values:
        req, forb = parse_traits_value(
            value, allow_forbidden=microversion >= (1, 22), allow_any_traits=allow_any
        )
        required += req
        forbidden |= forb
    return required, forbidden


def parse_member_of_values(
    values: list[str], suffix: str, microversion: Microversion
) -> tuple[list[frozenset[str]], frozenset[str]]:
    """All ``member_ofS`` values -> (ANDed any-of aggregate sets, forbidden aggregates)."""
    if microversion < (1, 24) and len(values) > 1:
        raise BadRequest(f"Multiple member_of{suffix} parameters are not supported")
    required: list[frozenset[str]] = []
    forbidden: set[str] = set()
    for value in values:
        if "," in value and not (value.startswith("in:") or value.startswith("!in:")):
            raise BadRequest(
                "Multiple values for 'member_of' must be prefixed with the 'in:' or '!in:' "
                f"keyword using the valid microversion. Got: {value}"
            )
        req: list[str] = []
        forb: list[str] = []
        if value.startswith("!in:"):
            forb = value[4:].split(",")
        elif value.startswith("!"):
            forb = [value[1:]]
        elif value.startswith("in:"):
            req = value[3:].split(",")
        else:
            req = [value]
        for agg in [*req, *forb]:
            if not is_uuid_like(agg):
                raise BadRequest(
                    "Invalid query string parameters: Expected 'member_of' parameter to "
                    f"contain valid UUID(s). Got: {agg}"
                )
        if req:
            required.append(frozenset(req))
        if forb:
            if microversion < (1, 32):
                raise BadRequest(
                    f"Forbidden member_of{suffix} parameters are not supported in the "
                    "specified microversion"
                )
            forbidden.update(forb)
    return required, frozenset(forbidden)
