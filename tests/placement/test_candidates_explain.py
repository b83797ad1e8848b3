"""explain_flat: each left-out provider's first failing condition, with its numbers."""

from __future__ import annotations

from urllib.parse import parse_qsl

from berth.placement.candidates import search_candidates
from berth.placement.candidates_builders import GraphBuilder, agg_uuid, inv
from berth.placement.candidates_explain import Exclusion, explain_flat
from berth.placement.candidates_graph import ProviderGraph

MV = (1, 36)


def _params(qs: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, value in parse_qsl(qs):
        out.setdefault(key, []).append(value)
    return out


def _why(graph: ProviderGraph, qs: str) -> dict[str, Exclusion] | None:
    query, result = search_candidates(graph, _params(qs), MV)
    found = explain_flat(graph, query, result)
    if found is None:
        return None
    answered = {graph.uuids[p] for p in result.providers.tolist()}  # type: ignore[union-attr]
    named = {graph.providers[p].name: e for p, e in found.items()}
    # Every provider is either answered or explained, never both.
    assert answered.isdisjoint(graph.uuids[p] for p in found)
    assert len(answered) + len(found) == graph.size
    return named


def _cloud() -> ProviderGraph:
    b = GraphBuilder()
    base = {"VCPU": inv(8), "MEMORY_MB": inv(4096)}
    b.provider("ok", **base, aggregates=[agg_uuid("a")], traits=["HW_CPU_X86_AVX2"])
    b.provider("full", **base, used={"VCPU": 7}, aggregates=[agg_uuid("a")],
               traits=["HW_CPU_X86_AVX2"])
    b.provider("no-trait", **base, aggregates=[agg_uuid("a")])
    b.provider("elsewhere", **base, traits=["HW_CPU_X86_AVX2"])
    b.provider("bad-trait", **base, aggregates=[agg_uuid("a")],
               traits=["HW_CPU_X86_AVX2", "COMPUTE_STATUS_DISABLED"])
    b.provider("no-memory", VCPU=inv(8), aggregates=[agg_uuid("a")], traits=["HW_CPU_X86_AVX2"])
    b.provider("small-max", VCPU=inv(8, max_unit=1), MEMORY_MB=inv(4096),
               aggregates=[agg_uuid("a")], traits=["HW_CPU_X86_AVX2"])
    b.provider("odd-step", VCPU=inv(8, step_size=4), MEMORY_MB=inv(4096),
               aggregates=[agg_uuid("a")], traits=["HW_CPU_X86_AVX2"])
    return b.graph()


def test_each_provider_gets_its_first_failing_condition() -> None:
    graph = _cloud()
    why = _why(graph, "resources=VCPU:2,MEMORY_MB:512&required=HW_CPU_X86_AVX2,"
                      f"!COMPUTE_STATUS_DISABLED&member_of={agg_uuid('a')}")
    assert why is not None
    assert set(why) == {"full", "no-trait", "elsewhere", "bad-trait", "no-memory",
                        "small-max", "odd-step"}
    assert why["full"] == Exclusion("insufficient VCPU in placement",
                                    {"requested": 2, "free": 1, "capacity": 8})
    assert why["no-trait"] == Exclusion("missing required trait", {"required": "HW_CPU_X86_AVX2"})
    assert why["bad-trait"] == Exclusion("has a forbidden trait",
                                         {"trait": "COMPUTE_STATUS_DISABLED"})
    assert why["elsewhere"].reason == "not in a required aggregate"
    assert why["no-memory"] == Exclusion("no MEMORY_MB inventory", {"requested": 512})
    assert why["small-max"].reason == "VCPU amount outside min_unit..max_unit"
    assert why["small-max"].numbers["max_unit"] == 1
    assert why["odd-step"] == Exclusion("VCPU amount not a multiple of step_size",
                                        {"requested": 2, "step_size": 4})


def test_qualified_providers_cut_by_the_limit_say_so() -> None:
    b = GraphBuilder()
    for i in range(4):
        b.provider(f"cn{i}", VCPU=inv(8))
    why = _why(b.graph(), "resources=VCPU:1&limit=3")
    # One of the four, whichever Placement's order puts last, is cut.
    assert len(why) == 1
    assert next(iter(why.values())) == Exclusion("beyond the candidate limit", {"returned": 3})


def test_root_traits_and_forbidden_aggregates() -> None:
    b = GraphBuilder()
    b.provider("plain", VCPU=inv(8))
    b.provider("gpu", VCPU=inv(8), traits=["CUSTOM_GPU"])
    b.provider("quarantined", VCPU=inv(8), traits=["CUSTOM_GPU"], aggregates=[agg_uuid("q")])
    why = _why(b.graph(), f"resources=VCPU:1&root_required=CUSTOM_GPU&member_of=!{agg_uuid('q')}")
    assert why == {
        "plain": Exclusion("root traits not met", {"missing": "CUSTOM_GPU"}),
        "quarantined": Exclusion("in a forbidden aggregate", {"aggregate": agg_uuid("q")}),
    }


def test_a_request_for_one_tree_leaves_the_others_out_for_that_first() -> None:
    """A move to a named host asks in that host's tree: the other hosts are out because
    they are not that host, even when full (they said "insufficient VCPU")."""
    graph = _cloud()
    ok = next(graph.uuids[i] for i, p in enumerate(graph.providers) if p.name == "ok")
    why = _why(graph, f"resources=VCPU:2&in_tree={ok}")
    assert why is not None
    assert set(why) == {"full", "no-trait", "elsewhere", "bad-trait", "no-memory",
                        "small-max", "odd-step"}
    assert why["full"] == Exclusion("not in the requested tree", {"in_tree": ok})


def test_queries_off_the_flat_path_are_not_explained() -> None:
    b = GraphBuilder()
    cn = b.provider("cn", VCPU=inv(8))
    b.provider("numa0", parent=cn, MEMORY_MB=inv(1024))
    assert _why(b.graph(), "resources=VCPU:1") is None
    flat = GraphBuilder()
    flat.provider("cn", VCPU=inv(8), MEMORY_MB=inv(1024))
    assert _why(flat.graph(), "resources1=VCPU:1&resources2=MEMORY_MB:1&group_policy=none") is None
