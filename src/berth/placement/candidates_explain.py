"""Why a provider is not among the allocation candidates: the engine's own reasons.

Placement's API never says why a provider is missing from an answer; an explanation
needs to. For a query the engine answers on its flat path (one unsuffixed request group,
no provider trees, no sharing providers), :func:`explain_flat` replays the search's
conditions column by column and gives every left-out provider the first one it fails,
with the numbers, in this order:

1. ``in_tree`` first: a request that names one tree (a move to a named host) leaves every
   other provider out for that reason, whatever else it lacks;
2. ``root_required`` traits (required present, forbidden absent);
3. ``required`` traits (each any-of set needs one), then ``!forbidden`` traits;
4. ``member_of`` aggregates (each any-of set needs one), then ``!member_of``;
5. per requested class: an inventory of the class, room (``used + amount <= capacity``,
   capacity being ``(total - reserved) * allocation_ratio``), ``min_unit <= amount <=
   max_unit``, ``amount % step_size == 0``;
6. it qualified but the answer stopped at ``limit`` (or ``max_allocation_candidates``).

Other queries (granular groups, nested or shared providers) get None: their answer is a
search over combinations that no single condition explains. Explanations only: this
costs a few passes over the provider columns and is never on the scheduling path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from berth.placement.candidates_graph import MAX_UNIT, ProviderGraph
from berth.placement.candidates_query import CandidateQuery
from berth.placement.candidates_search import FlatResult, SearchResult


@dataclass(frozen=True)
class Exclusion:
    """Why one provider got no candidate: a short constant reason and its numbers."""

    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)


def explain_flat(
    graph: ProviderGraph, query: CandidateQuery, result: SearchResult
) -> dict[int, Exclusion] | None:
    """Graph index -> why that provider is not in ``result`` (None: not a flat query)."""
    groups = list(query.groups.values())
    if (
        not isinstance(result, FlatResult)
        or len(groups) != 1
        or groups[0].suffix != ""
        or graph.has_trees
        or graph.sharing
    ):
        return None
    group = groups[0]
    out: dict[int, Exclusion] = {}
    open_ = np.ones(graph.size, dtype=np.bool_)  # not yet explained

    def fail(mask: np.ndarray, why: Exclusion | Callable[[int], Exclusion]) -> None:
        """Explain every still-open provider failing ``mask`` with ``why`` (or
        ``why(index)`` when the numbers are the provider's own)."""
        hit = ~mask & open_
        for p in np.flatnonzero(hit).tolist():
            out[p] = why if isinstance(why, Exclusion) else why(p)
        open_[hit] = False

    if group.in_tree is not None and group.resources:
        tree = graph.index.get(group.in_tree)
        in_tree = (np.zeros(graph.size, dtype=np.bool_) if tree is None
                   else graph.root_array == graph.root[tree])
        fail(in_tree, Exclusion("not in the requested tree", {"in_tree": group.in_tree}))
    if query.root_required is not None:
        required = sorted(query.root_required)
        forbidden = sorted(query.root_forbidden or ())
        ok = np.ones(graph.size, dtype=np.bool_)
        for t in required:
            ok &= graph.trait_mask(t)
        for t in forbidden:
            ok &= ~graph.trait_mask(t)
        fail(ok, lambda p: _root_traits_exclusion(graph, p, required, forbidden))
    for any_of in group.required:
        names = sorted(any_of)
        fail(_any_of(graph.size, names, graph.trait_mask),
             Exclusion("missing required trait", {"required": " or ".join(names)}))
    for t in sorted(group.forbidden):
        fail(~graph.trait_mask(t), Exclusion("has a forbidden trait", {"trait": t}))
    for any_of in group.member_of:
        aggs = sorted(any_of)
        fail(_any_of(graph.size, aggs, graph.agg_mask),
             Exclusion("not in a required aggregate", {"one_of": " or ".join(aggs)}))
    for a in sorted(group.forbidden_aggs):
        fail(~graph.agg_mask(a), Exclusion("in a forbidden aggregate", {"aggregate": a}))
    for rc, amount in group.resources.items():
        for mask, make in _class_conditions(graph, rc, amount):
            fail(mask, make)
    answered = np.zeros(graph.size, dtype=np.bool_)
    answered[result.providers] = True
    fail(answered, Exclusion("beyond the candidate limit", {"returned": len(result.providers)}))
    return out


Condition = tuple[np.ndarray, Exclusion | Callable[[int], Exclusion]]


def _any_of(size: int, names: list[str], mask_of: Callable[[str], np.ndarray]) -> np.ndarray:
    """Providers with at least one of ``names`` (traits or aggregates)."""
    hit = np.zeros(size, dtype=np.bool_)
    for name in names:
        hit |= mask_of(name)
    return hit


def _class_conditions(graph: ProviderGraph, rc: str, amount: int) -> list[Condition]:
    """The search's tests of one requested class, in order, each with its explanation."""
    cols = graph.columns.get(rc)
    no_inventory = Exclusion(f"no {rc} inventory", {"requested": amount})
    if cols is None:
        return [(np.zeros(graph.size, dtype=np.bool_), no_inventory)]
    outside_units = lambda p: Exclusion(  # noqa: E731 - one of several like it below
        f"{rc} amount outside min_unit..max_unit",
        {"requested": amount, "min_unit": int(cols.min_unit[p]),
         "max_unit": int(cols.max_unit[p])})
    if amount > MAX_UNIT:  # above every max_unit, as the search says (and past int64)
        return [(np.isfinite(cols.cap), no_inventory),
                (np.zeros(graph.size, dtype=np.bool_), outside_units)]
    return [
        (np.isfinite(cols.cap), no_inventory),
        (cols.used + amount <= cols.cap, lambda p: Exclusion(
            f"insufficient {rc} in placement",
            {"requested": amount, "free": max(int(cols.cap[p]) - int(cols.used[p]), 0),
             "capacity": int(cols.cap[p])})),
        ((cols.min_unit <= amount) & (cols.max_unit >= amount), outside_units),
        (amount % cols.step == 0, lambda p: Exclusion(
            f"{rc} amount not a multiple of step_size",
            {"requested": amount, "step_size": int(cols.step[p])})),
    ]


#: The trait a compute's provider carries while its service is disabled; every boot
#: forbids it (Nova's compute_status_filter).
STATUS_DISABLED = "COMPUTE_STATUS_DISABLED"


def _root_traits_exclusion(graph: ProviderGraph, p: int, required: list[str],
                           forbidden: list[str]) -> Exclusion:
    numbers = _traits_numbers(graph, p, required=required, forbidden=forbidden)
    if numbers == {"forbidden": STATUS_DISABLED}:
        return Exclusion("compute service disabled", {"trait": STATUS_DISABLED})
    return Exclusion("root traits not met", numbers)


def _traits_numbers(
    graph: ProviderGraph, p: int, *, required: list[str], forbidden: list[str]
) -> dict[str, Any]:
    traits = graph.providers[p].traits
    numbers: dict[str, Any] = {}
    missing = [t for t in required if t not in traits]
    present = [t for t in forbidden if t in traits]
    if missing:
        numbers["missing"] = ", ".join(missing)
    if present:
        numbers["forbidden"] = ", ".join(present)
    return numbers
