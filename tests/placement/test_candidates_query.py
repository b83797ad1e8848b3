"""GET /allocation_candidates query validation: the reference's texts and codes (Appendix A)."""

from __future__ import annotations

from urllib.parse import parse_qsl

import pytest

from berth.placement.candidates import allocation_candidates
from berth.placement.candidates_builders import GraphBuilder, agg_uuid, inv
from berth.placement.candidates_graph import ProviderGraph
from berth.placement.errors import BadRequest

AGG = agg_uuid("a")


def params(qs: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, value in parse_qsl(qs, keep_blank_values=True):
        out.setdefault(key, []).append(value)
    return out


@pytest.fixture(scope="module")
def graph() -> ProviderGraph:
    b = GraphBuilder()
    b.provider("cn", VCPU=inv(8), MEMORY_MB=inv(1024), traits={"HW_CPU_X86_AVX"})
    return b.graph()


def error(graph: ProviderGraph, qs: str, mv: tuple[int, int]) -> BadRequest:
    with pytest.raises(BadRequest) as info:
        allocation_candidates(graph, params(qs), mv)
    return info.value


CASES = [
    # (id, query, microversion, expected substring, code or None)
    (
        "unknown parameter at 1.10",
        "resources=VCPU:1&x=1",
        (1, 10),
        "Invalid query string parameters: Additional properties are not allowed ('x' was unexpected)",
        None,
    ),
    (
        "resources is required at 1.10",
        "limit=1",
        (1, 10),
        "'resources' is a required property",
        None,
    ),
    ("limit before 1.16", "resources=VCPU:1&limit=1", (1, 15), "'limit' was unexpected", None),
    (
        "limit must be a positive integer",
        "resources=VCPU:1&limit=0",
        (1, 16),
        "Invalid query string parameters: '0' does not match '^[1-9][0-9]*$'",
        None,
    ),
    (
        "required before 1.17",
        "resources=VCPU:1&required=HW_CPU_X86_AVX",
        (1, 16),
        "'required' was unexpected",
        None,
    ),
    (
        "member_of before 1.21",
        f"resources=VCPU:1&member_of={AGG}",
        (1, 20),
        "'member_of' was unexpected",
        None,
    ),
    (
        "suffixed resources before 1.25",
        "resources=VCPU:1&resources1=VCPU:1",
        (1, 24),
        "'resources1' was unexpected",
        None,
    ),
    (
        "suffixed required before 1.25",
        "resources=VCPU:1&required2=HW_CPU_X86_AVX",
        (1, 24),
        "'required2' was unexpected",
        None,
    ),
    (
        "group_policy before 1.25",
        "resources=VCPU:1&group_policy=none",
        (1, 24),
        "'group_policy' was unexpected",
        None,
    ),
    (
        "a zero-led suffix at 1.25",
        "resources01=VCPU:1",
        (1, 25),
        "'resources01' does not match any of the regexes",
        None,
    ),
    (
        "a word suffix before 1.33",
        "resources_A=VCPU:1",
        (1, 32),
        "'resources_A' does not match any of the regexes",
        None,
    ),
    (
        "a bad character in a suffix at 1.33",
        "resources1@=VCPU:1",
        (1, 33),
        "'resources1@' does not match any of the regexes: '^in_tree([a-zA-Z0-9_-]{1,64})?$', "
        "'^member_of([a-zA-Z0-9_-]{1,64})?$'",
        None,
    ),
    (
        "a 65-character suffix at 1.33",
        "resources_" + "0123456789" * 6 + "1234=VCPU:1",
        (1, 33),
        "does not match any of the regexes",
        None,
    ),
    (
        "root_required before 1.35",
        "resources=VCPU:1&root_required=HW_CPU_X86_AVX",
        (1, 34),
        "'root_required' does not match any of the regexes",
        None,
    ),
    (
        "a bogus group_policy",
        "resources=VCPU:1&group_policy=bogus",
        (1, 25),
        "'bogus' is not one of ['none', 'isolate']",
        None,
    ),
    (
        "an empty resources value",
        "resources=",
        (1, 10),
        "Badly formed resources parameter. Expected resources query string parameter in form: "
        "?resources=VCPU:2,MEMORY_MB:1024. Got: empty string.",
        None,
    ),
    ("a resource without amount", "resources=VCPU", (1, 10), "Got: VCPU.", None),
    ("a trailing comma in resources", "resources=VCPU:1,", (1, 10), "Got: .", None),
    (
        "a non-integer amount",
        "resources=VCPU:fred",
        (1, 10),
        "Requested resource VCPU expected positive integer amount. Got: fred.",
        None,
    ),
    (
        "a negative amount",
        "resources=VCPU:-2",
        (1, 10),
        "Requested resource VCPU requires amount >= 1. Got: -2.",
        None,
    ),
    (
        "an unknown resource class",
        "resources=VCPU:1,NO_CLASS_14:1",
        (1, 10),
        "Invalid resource class in resources parameter: No such resource class NO_CLASS_14.",
        None,
    ),
    (
        "a forbidden trait before 1.22",
        "resources=VCPU:1&required=!STORAGE_DISK_SSD",
        (1, 21),
        "Invalid query string parameters: Expected 'required' parameter value of the form: "
        "HW_CPU_X86_VMX,CUSTOM_MAGIC. Got: !STORAGE_DISK_SSD",
        None,
    ),
    (
        "an empty trait",
        "resources=VCPU:1&required=HW_CPU_X86_AVX,",
        (1, 22),
        "Expected 'required' parameter value of the form: HW_CPU_X86_VMX,!CUSTOM_MAGIC. "
        "Got an empty trait in: HW_CPU_X86_AVX,",
        None,
    ),
    (
        "an empty trait before forbidden traits",
        "resources=VCPU:1&required=",
        (1, 17),
        "of the form: HW_CPU_X86_VMX,CUSTOM_MAGIC. Got an empty trait in: ",
        None,
    ),
    (
        "any-of traits before 1.39",
        "resources=VCPU:1&required=in:A,B",
        (1, 38),
        "Invalid query string parameters: The format 'in:HW_CPU_X86_VMX,CUSTOM_MAGIC' only "
        "supported since microversion 1.39. Got: in:A,B",
        None,
    ),
    (
        "an unknown trait",
        "resources=VCPU:1&required=BOGUS_TRAIT",
        (1, 17),
        "No such trait(s): BOGUS_TRAIT.",
        None,
    ),
    (
        "an unknown forbidden trait",
        "resources=VCPU:1&required=!CUSTOM_NO_EXIST",
        (1, 22),
        "No such trait(s): CUSTOM_NO_EXIST",
        None,
    ),
    (
        "several values in member_of without in:",
        f"resources=VCPU:1&member_of={AGG},{AGG}",
        (1, 21),
        "Multiple values for 'member_of' must be prefixed with the 'in:' or '!in:' keyword using "
        "the valid microversion. Got: ",
        None,
    ),
    (
        "repeated member_of before 1.24",
        f"resources=VCPU:1&member_of={AGG}&member_of={AGG}",
        (1, 23),
        "Multiple member_of parameters are not supported",
        None,
    ),
    (
        "forbidden member_of before 1.32",
        f"resources=VCPU:1&member_of=!{AGG}",
        (1, 31),
        "Forbidden member_of parameters are not supported in the specified microversion",
        None,
    ),
    (
        "a non-uuid member_of",
        "resources=VCPU:1&member_of=in:nope",
        (1, 21),
        "Invalid query string parameters: Expected 'member_of' parameter to contain valid "
        "UUID(s). Got: nope",
        None,
    ),
    (
        "a non-uuid in_tree",
        "resources=VCPU:1&in_tree=nope",
        (1, 31),
        "Invalid query string parameters: Expected 'in_tree' parameter to be a format of uuid. "
        "Got: nope",
        None,
    ),
    (
        "root_required twice",
        "resources=VCPU:1&root_required=HW_CPU_X86_AVX&root_required=HW_CPU_X86_SSE",
        (1, 35),
        "Query parameter 'root_required' may be specified only once.",
        "placement.query.duplicate_key",
    ),
    (
        "root_required both required and forbidden",
        "resources=VCPU:1&root_required=HW_CPU_X86_AVX2,!HW_CPU_X86_AVX2",
        (1, 35),
        "Conflicting required and forbidden traits found in root_required: HW_CPU_X86_AVX2",
        "placement.query.bad_value",
    ),
    (
        "an unknown root trait",
        "resources=VCPU:1&root_required=BOGUS_TRAIT",
        (1, 35),
        "No such trait(s): BOGUS_TRAIT.",
        None,
    ),
    (
        "an empty same_subtree element",
        "resources=VCPU:1&resources_A=VCPU:1&same_subtree=_A,",
        (1, 36),
        "Empty string (unsuffixed group) can not be specified in `same_subtree` ",
        "placement.query.bad_value",
    ),
    (
        "orphaned required keys before 1.36",
        "required=HW_CPU_X86_AVX&required1=HW_CPU_X86_AVX&resources2=VCPU:1",
        (1, 35),
        "All traits parameters must be associated with resources.  Found the following "
        "orphaned traits keys: required, required1",
        None,
    ),
    (
        "orphaned member_of keys before 1.36",
        f"member_of={AGG}&member_of3={AGG}&resources1=VCPU:1",
        (1, 35),
        "All member_of parameters must be associated with resources. Found the following "
        "orphaned member_of keys: member_of, member_of3",
        None,
    ),
    (
        "a group with only in_tree before 1.36",
        "resources=VCPU:1&in_tree1=6f1b5a56-3c3e-4c1e-9d57-6d5f2f2b9a11",
        (1, 35),
        "All request groups must specify resources.",
        None,
    ),
    (
        "no group at all",
        "limit=1",
        (1, 25),
        "At least one request group (`resources` or `resources{$S}`) is required.",
        None,
    ),
    (
        "only resourceless groups at 1.36",
        "required1=HW_CPU_X86_AVX&same_subtree=1",
        (1, 36),
        "There must be at least one resources or resources[$S] parameter.",
        "placement.query.missing_value",
    ),
    (
        "no group at all at 1.36",
        "limit=1",
        (1, 36),
        "There must be at least one resources or resources[$S] parameter.",
        "placement.query.missing_value",
    ),
    (
        "a resourceless group outside same_subtree",
        "resources=VCPU:1&required_X=HW_CPU_X86_AVX",
        (1, 36),
        "Resourceless suffixed group request should be specified in `same_subtree` query param: "
        "bad group(s) - ['_X'].",
        "placement.query.bad_value",
    ),
    (
        "a same_subtree suffix naming no group",
        "resources_A=VCPU:1&same_subtree=_A,_B&group_policy=none",
        (1, 36),
        "Real suffixes should be specified in `same_subtree`: ['_B'] not found in ['_A'].",
        "placement.query.bad_value",
    ),
    (
        "a trait both required and forbidden in a group",
        "resources=VCPU:1&required=HW_CPU_X86_AVX,!HW_CPU_X86_AVX",
        (1, 22),
        "Conflicting required and forbidden traits found in the following traits keys: "
        "required: (HW_CPU_X86_AVX)",
        None,
    ),
    (
        "two granular groups without group_policy",
        "resources1=VCPU:1&resources2=VCPU:1",
        (1, 25),
        'The "group_policy" parameter is required when specifying more than one "resources{N}" '
        "parameter.",
        None,
    ),
]


@pytest.mark.parametrize(
    ("qs", "mv", "text", "code"),
    [pytest.param(qs, mv, text, code, id=name) for name, qs, mv, text, code in CASES],
)
def test_invalid_query_is_rejected_with_the_reference_text(
    graph: ProviderGraph, qs: str, mv: tuple[int, int], text: str, code: str | None
) -> None:
    exc = error(graph, qs, mv)
    assert text in exc.message
    assert exc.code == (code or "placement.undefined_code")


def test_multiple_leading_bangs_collapse_to_one_forbidden_trait(graph: ProviderGraph) -> None:
    body = allocation_candidates(
        graph, params("resources=VCPU:1&required=!!!HW_CPU_X86_AVX"), (1, 22)
    )
    assert body["allocation_requests"] == []


def test_any_of_set_with_a_forbidden_member_is_rejected(graph: ProviderGraph) -> None:
    exc = error(graph, "resources=VCPU:1&required=in:HW_CPU_X86_AVX,!HW_CPU_X86_SSE", (1, 39))
    assert "does not support forbidden traits" in exc.message


def test_below_1_39_only_the_last_required_value_is_validated(graph: ProviderGraph) -> None:
    qs = "resources=VCPU:1&required=in:BAD&required=HW_CPU_X86_AVX"
    assert len(allocation_candidates(graph, params(qs), (1, 38))["allocation_requests"]) == 1


def test_a_later_groups_unknown_trait_is_not_reported_when_an_earlier_group_is_empty(
    graph: ProviderGraph,
) -> None:
    qs = "resources1=VCPU:100&resources2=VCPU:1&required2=BOGUS_TRAIT&group_policy=none"
    body = allocation_candidates(graph, params(qs), (1, 25))
    assert body == {"allocation_requests": [], "provider_summaries": {}}


def test_limit_and_group_policy_take_the_first_value(graph: ProviderGraph) -> None:
    b = GraphBuilder()
    for i in range(3):
        b.provider(f"cn{i}", VCPU=inv(8))
    body = allocation_candidates(b.graph(), params("resources=VCPU:1&limit=1&limit=2"), (1, 16))
    assert len(body["allocation_requests"]) == 1


def test_microversion_below_1_10_is_a_programming_error(graph: ProviderGraph) -> None:
    with pytest.raises(ValueError):
        allocation_candidates(graph, params("resources=VCPU:1"), (1, 9))


@pytest.mark.parametrize(
    "member_of",
    ["INVALID_UUID", "in:", f"in:{AGG},INVALID_UUID", f"in:{AGG},!{AGG}", "!(^o^)"],
    ids=[
        "a word",
        "an empty in: list",
        "one bad uuid in an in: list",
        "a forbidden uuid inside in:",
        "a forbidden non-uuid",
    ],
)
def test_member_of_values_must_be_uuids(graph: ProviderGraph, member_of: str) -> None:
    exc = error(graph, f"resources=VCPU:1&member_of={member_of}", (1, 32))
    assert exc.message.startswith(
        "Invalid query string parameters: Expected 'member_of' parameter to contain valid UUID(s)."
    )
