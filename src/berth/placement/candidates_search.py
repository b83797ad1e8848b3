"""The allocation-candidate search (reference section 5), over a ``ProviderGraph``.

Pipeline, top to bottom (``search``):

1. ``root_required`` -> the allowed anchors (roots with / without the root traits).
2. Per group, in query order (a group with no result ends the search, so later groups'
   names are never checked, as in the reference):
   * names are checked (unknown class / trait -> 400);
   * suffixed groups, and the unsuffixed group when the snapshot has no trees and no
     sharing providers, take the *single-provider path*: one vectorized mask over all
     providers (capacity fits, traits, aggregates, in_tree);
   * otherwise the unsuffixed group takes the *multi-provider path*: per class the
     (provider, anchor) pairs, then per anchor every combination of one provider per
     class that meets the trait rules (a combination of sharing providers alone is one
     request, kept at the first tree Placement's walk forms it at:
     :func:`_first_anchor_only`).
3. Merge: per anchor the product of one request per group, filtered by group_policy
   ``isolate`` and ``same_subtree``, amounts summed, capacity re-checked, deduplicated.
4. Below 1.29 with trees in the snapshot, requests spanning two providers of one tree go.

The common case (one unsuffixed group, flat snapshot, no sharing providers) never leaves
NumPy: the result is the array of qualifying provider indexes (``FlatResult``). Any other
query whose groups all ask for resources, without sharing providers or ``same_subtree``
(trees, numbered groups, ``group_policy``), runs steps 2-4 as arrays (``ArrayResult``,
:func:`_array_search`): the same requests in the same order as the Python path, which
stays for sharing providers, ``same_subtree`` and resourceless groups.

Glossary: *anchor* - the root of the tree a request is for (a sharing provider serves
the anchors of every tree it shares an aggregate with); *pair* - (provider, anchor).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple

import numpy as np

from berth.placement.candidates_gather import any_mask, gather, member_of_mask, tree_sequence
from berth.placement.candidates_graph import BoolArray, IntArray, ProviderGraph
from berth.placement.candidates_query import CandidateQuery, RequestGroup
from berth.placement.errors import BadRequest

Microversion = tuple[int, int]


class GroupRequest(NamedTuple):
    """One way to satisfy one group: ``(provider, class, amount)`` rows for an anchor
    (a named tuple: thousands are made per query, and a frozen dataclass costs several
    times as much to create)."""

    anchor: int
    rows: tuple[tuple[int, str, int], ...]
    providers: tuple[int, ...]


@dataclass(slots=True)
class Candidate:
    """One allocation request: amounts per provider and class, and suffix mappings.

    ``by_class``: for a request of one group, its provider per class in class id order
    (what Placement's walk forms; None otherwise)."""

    amounts: dict[int, dict[str, int]]
    mappings: dict[str, list[int]]
    by_class: tuple[int, ...] | None = None


@dataclass(slots=True)
class FlatResult:
    """Fast-path result: each provider in ``providers`` alone satisfies ``resources``."""

    providers: IntArray
    resources: dict[str, int]


class MergeTrace(NamedTuple):
    """How the general path's merge formed its candidates (Placement's order is formed
    from it): each group's own requests as ``(anchors, combos)`` (a request's providers
    per class column; one column naming the provider for a resourceless group); every
    combination the merge kept (``picks``: the request it takes of each group, rows x
    groups; ``anchors``; ``candidate``: the candidate it is, several when sharing providers
    make one request at several anchors); and the request's sharing providers as each
    group found them (``member_of`` narrows them for the groups that follow)."""

    parts: tuple[tuple[IntArray, IntArray], ...]
    picks: IntArray
    anchors: IntArray
    candidate: IntArray
    sharing: tuple[frozenset[int], ...]


@dataclass(slots=True)
class GeneralResult:
    """Result of the general path, in output order; ``merge`` when Placement's order is
    formed from the merge (several groups, or sharing providers)."""

    candidates: list[Candidate]
    merge: MergeTrace | None = None
    #: The providers the summaries list when Placement's rule is not the usual one
    #: (below 1.29 over trees, after a ``limit``); ascending.
    summary: list[int] | None = None

    def __len__(self) -> int:
        return len(self.candidates)


@dataclass(slots=True)
class ArrayResult:
    """Result of groups without sharing providers, kept as arrays (the general path's
    requests, in its order): request ``i`` takes ``amounts[c]`` of ``classes[c]`` from
    provider ``combos[i, c]`` for every column ``c``, at the tree rooted at
    ``anchors[i]``. ``groups`` names each request group's columns: ``(suffix, start,
    stop)``, in the query's group order; a group's columns are its classes in the order
    the general path lists its rows (class id order for the unsuffixed group over trees,
    one provider per class; the query's order for a group of one provider, such as
    every numbered group: its columns all name that provider). Amounts of
    one provider and class in several groups add up.

    :attr:`candidates` builds the :class:`Candidate` objects when someone reads them:
    a ``limit`` keeps a few of thousands (:meth:`take`), and only those are built."""

    anchors: IntArray
    combos: IntArray
    classes: tuple[str, ...]
    amounts: tuple[int, ...]
    groups: tuple[tuple[str, int, int], ...]
    #: With several groups: each group's own requests, ``(anchors, combos)`` (what its
    #: search found, before the merge), and per request the one it takes of each
    #: (``picks[i, g]``); Placement's order is formed from them.
    parts: tuple[tuple[IntArray, IntArray], ...] | None = None
    picks: IntArray | None = None
    #: As :attr:`GeneralResult.summary`.
    summary: list[int] | None = None
    _built: list[Candidate] | None = None

    def __len__(self) -> int:
        return len(self.combos)

    def take(self, order: list[int] | IntArray) -> ArrayResult:
        """The requests at positions ``order``, in that order."""
        at = np.asarray(order, dtype=np.int64)
        return ArrayResult(self.anchors[at], self.combos[at], self.classes, self.amounts,
                           self.groups, self.parts,
                           self.picks[at] if self.picks is not None else None)

    def summary_providers(self, graph: ProviderGraph, whole_trees: bool) -> list[int]:
        """The providers the summaries list: every member of the requests' trees, or
        (``whole_trees`` false) only the providers the requests use; ascending."""
        if self.summary is not None:
            return self.summary
        if not whole_trees:
            return np.unique(self.combos).tolist()  # type: ignore[no-any-return]
        members = graph.tree_members
        return sorted(p for root in np.unique(self.anchors).tolist() for p in members[root])

    @property
    def candidates(self) -> list[Candidate]:
        """The requests as :class:`Candidate` objects (what the general path makes)."""
        if self._built is None:
            out: list[Candidate] = []
            pairs = tuple(zip(self.classes, self.amounts, strict=True))
            groups = self.groups
            one = len(groups) == 1
            for combo in self.combos.tolist():
                amounts: dict[int, dict[str, int]] = {}
                for p, (rc, amount) in zip(combo, pairs):
                    per_rc = amounts.get(p)
                    if per_rc is None:
                        amounts[p] = {rc: amount}
                    else:
                        per_rc[rc] = per_rc.get(rc, 0) + amount
                if one:
                    out.append(Candidate(amounts, {groups[0][0]: list(amounts)}, tuple(combo)))
                else:
                    out.append(Candidate(amounts, {
                        suffix: [combo[start]] if suffix else list(dict.fromkeys(combo[start:stop]))
                        for suffix, start, stop in groups}))
            self._built = out
        return self._built


SearchResult = FlatResult | GeneralResult | ArrayResult


def check_group_names(graph: ProviderGraph, group: RequestGroup) -> bool:
    """Unknown resource class or trait names in ``group`` -> the reference's 400s; False
    when the group can have no candidate before its traits are looked at.

    Placement's order: the classes, then ``member_of`` (no provider in its aggregates
    ends the search with an empty answer), then the traits."""
    for rc in group.resources:
        if rc not in graph.known_classes:
            raise BadRequest(
                f"Invalid resource class in resources parameter: No such resource class {rc}."
            )
    if group.member_of and not member_of_mask(graph, group).any():
        return False
    for any_of in group.required:
        check_trait_names(graph, any_of)
    check_trait_names(graph, group.forbidden)
    return True


def check_trait_names(graph: ProviderGraph, names: Iterable[str]) -> None:
    """Unknown trait names -> 400 ``No such trait(s): A, B.``."""
    missing = sorted(set(names) - graph.known_traits)
    if missing:
        raise BadRequest(f"No such trait(s): {', '.join(missing)}.")


def search(graph: ProviderGraph, query: CandidateQuery, microversion: Microversion) -> SearchResult:
    """Run the whole search for a validated query; see the module docstring."""
    allowed = allowed_anchors(graph, query)

    groups = list(query.groups.values())
    if len(groups) == 1 and groups[0].suffix == "" and not graph.has_trees and not graph.sharing:
        group = groups[0]
        # root_required matching no root ends the search before any group is looked at.
        if (allowed is not None and not allowed.any()) or not check_group_names(graph, group):
            return FlatResult(np.empty(0, dtype=np.int64), dict(group.resources))
        mask = _single_provider_mask(graph, group, apply_in_tree=True)
        if allowed is not None:
            # Flat snapshot: every provider is its own root, so its own anchor.
            mask &= allowed
        return FlatResult(np.flatnonzero(mask), dict(group.resources))

    if groups and not graph.sharing and not query.same_subtrees and all(g.resources for g in groups):
        return _array_search(graph, query, groups, allowed, microversion)

    # The request-wide sharing set; the multi-provider path may narrow it (a quirk kept
    # from the reference: the narrowing carries over to the groups that follow).
    sharing = set(graph.sharing)
    per_group: list[list[GroupRequest]] = []
    before: list[frozenset[int]] = []
    if allowed is not None and not allowed.any():
        return GeneralResult([])
    for group in groups:
        if not check_group_names(graph, group):
            return GeneralResult([])
        before.append(frozenset(sharing))
        if group.use_same_provider or (not graph.has_trees and not sharing):
            found = _single_provider_path(graph, group, allowed)
        else:
            found = _multi_provider_path(graph, group, allowed, sharing)
        if not found:
            return GeneralResult([])
        per_group.append(found)

    candidates, occurrences = _merge(graph, query, per_group)
    if microversion < (1, 29) and graph.has_trees:
        # Not nested-aware: one provider per tree and request.
        root = graph.root
        kept = [i for i, c in enumerate(candidates)
                if len({root[p] for p in c.amounts}) == len(c.amounts)]
        renumber = {old: new for new, old in enumerate(kept)}
        candidates = [candidates[i] for i in kept]
        occurrences = [(pick, anchor, renumber[i]) for pick, anchor, i in occurrences
                       if i in renumber]
    if not candidates or not occurrences:  # one group without sharing providers
        return GeneralResult(candidates)
    parts = tuple((np.fromiter((r.anchor for r in found), dtype=np.int64, count=len(found)),
                   np.asarray([[p for p, _, _ in r.rows] or [r.providers[0]] for r in found],
                              dtype=np.int64))
                  for found in per_group)
    picks, anchors, index = zip(*occurrences, strict=True)
    return GeneralResult(candidates, MergeTrace(
        parts, np.asarray(picks, dtype=np.int64), np.asarray(anchors, dtype=np.int64),
        np.asarray(index, dtype=np.int64), tuple(before)))


def allowed_anchors(graph: ProviderGraph, query: CandidateQuery) -> BoolArray | None:
    """Mask of the roots ``root_required`` allows, or None when it is not given."""
    if query.root_required is None:
        return None
    forbidden = query.root_forbidden or frozenset()
    check_trait_names(graph, [*sorted(query.root_required), *sorted(forbidden)])
    mask = graph.is_root_mask.copy()
    for t in query.root_required:
        mask &= graph.trait_mask(t)
    for t in forbidden:
        mask &= ~graph.trait_mask(t)
    return mask


def group_mask(graph: ProviderGraph, group: RequestGroup) -> BoolArray:
    """Providers that alone satisfy ``group`` (what a numbered group's requests are
    made of; for a resourceless group, its trait and aggregate filters)."""
    return _single_provider_mask(graph, group, apply_in_tree=True)


def _filter_mask(graph: ProviderGraph, group: RequestGroup) -> BoolArray:
    """Providers that themselves meet the group's trait and aggregate filters."""
    mask = np.ones(graph.size, dtype=np.bool_)
    for any_of in group.required:
        mask &= any_mask(graph, graph.trait_mask, any_of)
    for t in group.forbidden:
        mask &= ~graph.trait_mask(t)
    mask &= member_of_mask(graph, group)
    for a in group.forbidden_aggs:
        mask &= ~graph.agg_mask(a)
    return mask


def _single_provider_mask(
    graph: ProviderGraph, group: RequestGroup, *, apply_in_tree: bool
) -> BoolArray:
    """Providers that alone satisfy the group (resources, traits, aggregates, in_tree)."""
    if not group.resources and not group.required and not group.member_of:
        # Resourceless with only forbidden traits or aggregates: Placement's filter of
        # the providers to keep is then an empty set, and keeps none (quirk).
        return np.zeros(graph.size, dtype=np.bool_)
    mask = _filter_mask(graph, group)
    if not group.resources:
        # Resourceless group: trait/aggregate filters only, in_tree ignored (quirk).
        return mask
    for rc, amount in group.resources.items():
        mask &= graph.fit_mask(rc, amount)
    if group.in_tree is not None and apply_in_tree:
        tree = graph.index.get(group.in_tree)
        if tree is None:
            return np.zeros(graph.size, dtype=np.bool_)
        mask &= graph.root_array == graph.root[tree]
    return mask


def _single_provider_path(
    graph: ProviderGraph, group: RequestGroup, allowed: BoolArray | None
) -> list[GroupRequest]:
    """Each qualifying provider is one request at its root, plus a copy at each other
    anchor of a provider with the sharing trait (whatever ``member_of`` narrowed)."""
    sharing = graph.sharing
    mask = _single_provider_mask(graph, group, apply_in_tree=True)
    found: list[GroupRequest] = []
    resources = list(group.resources.items())
    for p in np.flatnonzero(mask).tolist():
        rows = tuple((p, rc, amount) for rc, amount in resources)
        own = graph.root[p]
        if allowed is None or allowed[own]:
            found.append(GroupRequest(own, rows, (p,)))
        if p in sharing:
            for anchor in graph.sharing_anchors[p]:
                if anchor != own and (allowed is None or allowed[anchor]):
                    found.append(GroupRequest(anchor, rows, (p,)))
    return found


class _TreeFilters(NamedTuple):
    """A group's filters as masks, for the paths that combine providers of a tree."""

    member: BoolArray | None
    forbidden_aggs: BoolArray | None
    tree_root: int | None
    bad_trait: BoolArray


def _tree_filters(graph: ProviderGraph, group: RequestGroup) -> _TreeFilters | None:
    """``member_of`` and forbidden aggregates (a provider or its tree's root must meet
    them), ``in_tree``'s root, and the providers with a forbidden trait (never part of a
    surviving combination); None when ``in_tree`` names no provider."""
    member: BoolArray | None = member_of_mask(graph, group) if group.member_of else None
    forbidden_aggs = any_mask(graph, graph.agg_mask, group.forbidden_aggs) \
        if group.forbidden_aggs else None
    tree_root: int | None = None
    if group.in_tree is not None:
        tree = graph.index.get(group.in_tree)
        if tree is None:
            return None
        tree_root = graph.root[tree]
    bad_trait = any_mask(graph, graph.trait_mask, group.forbidden)
    return _TreeFilters(member, forbidden_aggs, tree_root, bad_trait)


def _own_providers(graph: ProviderGraph, group: RequestGroup, rc: str, filters: _TreeFilters,
                   allowed: BoolArray | None) -> BoolArray:
    """The providers that can serve ``rc`` for ``group`` in their own tree."""
    anchors = graph.root_array
    keep = graph.fit_mask(rc, group.resources[rc]) & ~filters.bad_trait
    if filters.tree_root is not None:
        keep &= anchors == filters.tree_root
    if allowed is not None:
        keep &= allowed[anchors]
    if filters.member is not None:
        keep &= filters.member | filters.member[anchors]
    if filters.forbidden_aggs is not None:
        keep &= ~(filters.forbidden_aggs | filters.forbidden_aggs[anchors])
    return keep


def _multi_provider_path(
    graph: ProviderGraph, group: RequestGroup, allowed: BoolArray | None, sharing: set[int]
) -> list[GroupRequest]:
    """The unsuffixed group over trees and sharing providers (reference 5, step 3)."""
    filters = _tree_filters(graph, group)
    if filters is None:
        return []
    member, forbidden_aggs, tree_root, bad_trait = filters
    gathered_with = frozenset(sharing)
    if member is not None and sharing:
        # Quirk: the request-wide sharing set is narrowed in place to member_of (with
        # in_tree too, though the sharing providers are not used then).
        sharing.intersection_update(np.flatnonzero(member).tolist())

    classes = sorted(group.resources, key=lambda rc: graph.class_id.get(rc, 1 << 30))
    root = graph.root
    # anchor -> per class (in ``classes`` order) the providers that can serve it there
    by_anchor: dict[int, list[list[int]]] | None = None
    for rc in classes:
        fit = graph.fit_mask(rc, group.resources[rc])
        pairs: dict[int, list[int]] = {}
        for p in np.flatnonzero(_own_providers(graph, group, rc, filters, allowed)).tolist():
            pairs.setdefault(root[p], []).append(p)
        if tree_root is None:
            for s in sorted(sharing):
                if not fit[s] or bad_trait[s]:
                    continue
                for anchor in graph.sharing_anchors[s]:
                    if anchor == root[s]:
                        continue  # already paired with its own root above
                    if allowed is not None and not allowed[anchor]:
                        continue
                    if member is not None and not (member[s] or member[anchor]):
                        continue
                    if forbidden_aggs is not None and (forbidden_aggs[s] or forbidden_aggs[anchor]):
                        continue
                    pairs.setdefault(anchor, []).append(s)
        if by_anchor is None:
            by_anchor = {a: [ps] for a, ps in pairs.items()}
        else:
            by_anchor = {a: [*lists, pairs[a]] for a, lists in by_anchor.items() if a in pairs}
        if not by_anchor:
            return []
    if by_anchor is None:
        return []

    required = group.required
    amounts = [group.resources[rc] for rc in classes]
    traits = [p.traits for p in graph.providers] if required else []
    found: list[GroupRequest] = []
    for anchor in sorted(by_anchor):
        for combo in itertools.product(*by_anchor[anchor]):
            if required:
                have: set[str] = set()
                for p in combo:
                    have |= traits[p]
                if not all(not any_of.isdisjoint(have) for any_of in required):
                    continue
            rows = tuple(zip(combo, classes, amounts, strict=True))
            found.append(GroupRequest(anchor, rows, tuple(dict.fromkeys(combo))))
    if sharing and tree_root is None:
        found = _first_anchor_only(graph, group, allowed, gathered_with, found)
    return found


def _first_anchor_only(graph: ProviderGraph, group: RequestGroup, allowed: BoolArray | None,
                       sharing: frozenset[int], found: list[GroupRequest]) -> list[GroupRequest]:
    """``found`` with each request made of sharing providers alone kept at one anchor.

    Such a request is the same at every anchor it serves, and Placement collects one
    group's requests in a set: the request stays with the first tree of its walk that
    formed it (:func:`~berth.placement.candidates_gather.gather`, with ``sharing`` as
    the group found it), and the merge pairs it only with that anchor's requests of the
    other groups."""
    at: dict[tuple[tuple[int, str, int], ...], list[int]] = {}
    for i, req in enumerate(found):
        if all(p in sharing for p in req.providers):
            at.setdefault(req.rows, []).append(i)
    repeated = [places for places in at.values() if len(places) > 1]
    if not repeated:
        return found
    gathered = gather(graph, group, allowed, sharing) or set()
    rank = {anchor: k for k, anchor in enumerate(tree_sequence(graph, gathered))}
    drop: set[int] = set()
    for places in repeated:
        first = min(places, key=lambda i: (rank.get(found[i].anchor, len(rank)), i))
        drop.update(i for i in places if i != first)
    return [req for i, req in enumerate(found) if i not in drop]


def _array_search(graph: ProviderGraph, query: CandidateQuery, groups: list[RequestGroup],
                  allowed: BoolArray | None, microversion: Microversion) -> SearchResult:
    """The search of groups that all ask for resources, without sharing providers or
    ``same_subtree``, as arrays: what the per-group paths and :func:`_merge` give (the
    same requests in the same order), as an :class:`ArrayResult`."""
    parts: list[tuple[IntArray, IntArray, tuple[str, ...]]] = []
    if allowed is not None and not allowed.any():
        return GeneralResult([])
    for group in groups:
        if not check_group_names(graph, group):
            return GeneralResult([])
        if group.use_same_provider or not graph.has_trees:
            found = _single_provider_arrays(graph, group, allowed)
        else:
            found = _tree_group_arrays(graph, group, allowed)
        if found is None:
            return GeneralResult([])
        parts.append(found)
    picked: IntArray | None = None
    if len(parts) == 1:
        # The general path lists one group's requests by anchor (a stable sort).
        anchors, combos, classes = parts[0]
        by_anchor = np.argsort(anchors, kind="stable")
        anchors, combos = anchors[by_anchor], combos[by_anchor]
    else:
        rows, picks = _products_by_anchor([a for a, _, _ in parts], graph.size)
        if not len(rows):
            return GeneralResult([])
        anchors = rows
        combos = np.concatenate([c[pick] for (_, c, _), pick in zip(parts, picks)], axis=1)
        classes = tuple(rc for _, _, cls in parts for rc in cls)
        picked = np.stack(picks, axis=1)
    amounts = tuple(group.resources[rc] for group, (_, _, cls) in zip(groups, parts)
                    for rc in cls)
    layout: list[tuple[str, int, int]] = []
    start = 0
    for group, (_, _, cls) in zip(groups, parts):
        layout.append((group.suffix, start, start + len(cls)))
        start += len(cls)
    keep = np.ones(len(combos), dtype=np.bool_)
    firsts = [combos[:, start] for (suffix, start, _) in layout if suffix]
    if query.group_policy == "isolate" and len(firsts) > 1:
        for i, first in enumerate(firsts):
            for other in firsts[i + 1:]:
                keep &= first != other
    if len(parts) > 1:
        keep &= _fits_summed_arrays(graph, combos, classes, amounts)
    if microversion < (1, 29) and graph.has_trees:
        # Not nested-aware: one provider per tree and request.
        keep &= np.all(combos == combos[:, :1], axis=1)
    if not keep.all():
        anchors, combos = anchors[keep], combos[keep]
        if picked is not None:
            picked = picked[keep]
    if not len(combos):
        return GeneralResult([])
    if picked is None:
        return ArrayResult(anchors, combos, classes, amounts, tuple(layout))
    return ArrayResult(anchors, combos, classes, amounts, tuple(layout),
                       tuple((a, c) for a, c, _ in parts), picked)


def _single_provider_arrays(graph: ProviderGraph, group: RequestGroup, allowed: BoolArray | None
                            ) -> tuple[IntArray, IntArray, tuple[str, ...]] | None:
    """:func:`_single_provider_path` without sharing providers, as arrays: (anchors,
    providers per class column, classes in the query's order)."""
    mask = _single_provider_mask(graph, group, apply_in_tree=True)
    providers = np.flatnonzero(mask)
    anchors = graph.root_array[providers]
    if allowed is not None:
        ok = allowed[anchors]
        providers, anchors = providers[ok], anchors[ok]
    if not len(providers):
        return None
    classes = tuple(group.resources)
    return anchors, np.repeat(providers[:, None], len(classes), axis=1), classes


def _products_by_anchor(lists: list[IntArray], size: int) -> tuple[IntArray, list[IntArray]]:
    """Per anchor present in every list (ascending), the product of the lists' items at
    that anchor (the first list varies slowest, as ``itertools.product``; items of one
    anchor in list order). ``lists[k][i]`` is the anchor of item ``i`` of list ``k``.
    Returns each product row's anchor and, per list, the item each row takes."""
    grouped = [np.argsort(anchors, kind="stable") for anchors in lists]
    counts = [np.bincount(anchors, minlength=size) for anchors in lists]
    present = np.ones(size, dtype=np.bool_)
    for count in counts:
        present &= count > 0
    anchors = np.flatnonzero(present)
    per_anchor = [count[anchors] for count in counts]
    sizes = np.ones(len(anchors), dtype=np.int64)
    for count in per_anchor:
        sizes *= count
    total = int(sizes.sum())
    row_anchor = np.repeat(np.arange(len(anchors)), sizes)
    within = np.arange(total, dtype=np.int64) - (np.cumsum(sizes) - sizes)[row_anchor]
    picks: list[IntArray] = [np.empty(0, dtype=np.int64)] * len(lists)
    stride = np.ones(len(anchors), dtype=np.int64)
    for k in range(len(lists) - 1, -1, -1):
        offset = np.cumsum(counts[k]) - counts[k]  # where each anchor's block starts
        index = (within // stride[row_anchor]) % per_anchor[k][row_anchor]
        picks[k] = grouped[k][offset[anchors][row_anchor] + index]
        stride = stride * per_anchor[k]
    return anchors[row_anchor], picks


def _tree_group_arrays(graph: ProviderGraph, group: RequestGroup, allowed: BoolArray | None
                       ) -> tuple[IntArray, IntArray, tuple[str, ...]] | None:
    """:func:`_multi_provider_path` of a group over provider trees without sharing
    providers, as arrays: per tree, the product of each class's providers there (class
    id order; ascending provider order within a tree, as the general path appends
    them), trees in ascending order; then the required traits over each combination."""
    filters = _tree_filters(graph, group)
    if filters is None:
        return None
    classes = sorted(group.resources, key=lambda rc: graph.class_id.get(rc, 1 << 30))
    anchors_of = graph.root_array
    providers = [np.flatnonzero(_own_providers(graph, group, rc, filters, allowed))
                 for rc in classes]
    anchors, picks = _products_by_anchor([anchors_of[p] for p in providers], graph.size)
    if not len(anchors):
        return None
    combos = np.stack([p[pick] for p, pick in zip(providers, picks)], axis=1)
    if group.required:
        ok = np.ones(len(combos), dtype=np.bool_)
        for any_of in group.required:
            ok &= any_mask(graph, graph.trait_mask, any_of)[combos].any(axis=1)
        if not ok.all():
            anchors, combos = anchors[ok], combos[ok]
            if not len(combos):
                return None
    return anchors, combos, tuple(classes)


def _fits_summed_arrays(graph: ProviderGraph, combos: IntArray, classes: tuple[str, ...],
                        amounts: tuple[int, ...]) -> BoolArray:
    """:func:`_fits_summed` of every request: each provider's summed amount of a class
    within max_unit and capacity."""
    ok = np.ones(len(combos), dtype=np.bool_)
    for rc in dict.fromkeys(classes):
        cols = [c for c, name in enumerate(classes) if name == rc]
        columns = graph.columns[rc]
        for c in cols:
            total = np.zeros(len(combos), dtype=np.int64)
            for other in cols:
                total += np.where(combos[:, other] == combos[:, c], amounts[other], 0)
            p = combos[:, c]
            ok &= (total <= columns.max_unit[p]) & (columns.used[p] + total <= columns.cap[p])
    return ok


def _merge(
    graph: ProviderGraph, query: CandidateQuery, per_group: list[list[GroupRequest]]
) -> tuple[list[Candidate], list[tuple[tuple[int, ...], int, int]]]:
    """Combine one request per group per anchor, check policies and capacity, dedupe.
    Returns the candidates and every combination kept: the request it takes of each
    group (positions into ``per_group``'s lists), its anchor and the candidate it is
    (none for one group without sharing providers, whose order needs no merge)."""
    suffixes = list(query.groups)
    isolate = query.group_policy == "isolate"
    n_suffixed = sum(1 for s in suffixes if s)
    subtrees = [
        [suffixes.index(s) for s in subtree if s in query.groups] for subtree in query.same_subtrees
    ]
    single = len(per_group) == 1
    if single and not graph.sharing:
        # One group and no sharing provider: no sums to re-check, and no duplicates
        # (those only come from a sharing provider serving several anchors).
        suffix = suffixes[0]
        out: list[Candidate] = []
        for req in sorted(per_group[0], key=itemgetter(0)):  # by anchor
            amounts: dict[int, dict[str, int]] = {}
            for p, rc, amount in req.rows:
                amounts.setdefault(p, {})[rc] = amount
            out.append(Candidate(amounts, {suffix: list(req.providers)},
                                 tuple(p for p, _, _ in req.rows)))
        return out, []

    bucketed: list[dict[int, list[int]]] = []
    for found in per_group:
        buckets: dict[int, list[int]] = {}
        for i, req in enumerate(found):
            buckets.setdefault(req.anchor, []).append(i)
        bucketed.append(buckets)
    anchors = set(bucketed[0])
    for buckets in bucketed[1:]:
        anchors &= buckets.keys()

    seen: dict[tuple[object, ...], int] = {}
    out = []
    occurrences: list[tuple[tuple[int, ...], int, int]] = []
    for anchor in sorted(anchors):
        for pick in itertools.product(*(b[anchor] for b in bucketed)):
            combo = tuple(found[i] for found, i in zip(per_group, pick, strict=True))
            if isolate and n_suffixed > 1:
                used = {req.providers[0] for s, req in zip(suffixes, combo, strict=True) if s}
                if len(used) != n_suffixed:
                    continue
            if subtrees and not all(_same_subtree(graph, combo, idx) for idx in subtrees):
                continue
            amounts = {}
            for req in combo:
                for p, rc, amount in req.rows:
                    per_rc = amounts.setdefault(p, {})
                    per_rc[rc] = per_rc.get(rc, 0) + amount
            if not single and not _fits_summed(graph, amounts):
                continue
            mappings: dict[str, list[int]] = {}
            for s, req in zip(suffixes, combo, strict=True):
                mapped = mappings.setdefault(s, [])
                mapped.extend(p for p in req.providers if p not in mapped)
            key = (
                frozenset((p, rc, n) for p, per_rc in amounts.items() for rc, n in per_rc.items()),
                frozenset((s, frozenset(ps)) for s, ps in mappings.items()),
            )
            index = seen.get(key)
            if index is None:
                index = seen[key] = len(out)
                out.append(Candidate(amounts, mappings))
            occurrences.append((pick, anchor, index))
    return out, occurrences


def _same_subtree(graph: ProviderGraph, combo: tuple[GroupRequest, ...], idx: list[int]) -> bool:
    """One provider mapped to the listed groups is an ancestor of (or is) all the others."""
    providers = {p for i in idx for p in combo[i].providers}
    if len(providers) <= 1:
        return True
    return any(all(graph.is_ancestor_or_self(top, p) for p in providers) for top in providers)


def _fits_summed(graph: ProviderGraph, amounts: dict[int, dict[str, int]]) -> bool:
    """Final check on summed amounts: capacity and max_unit (min_unit/step not rechecked)."""
    for p, per_rc in amounts.items():
        prov = graph.providers[p]
        for rc, total in per_rc.items():
            inv = prov.inventories[rc]
            if total > inv.max_unit:
                return False
            if prov.usages.get(rc, 0) + total > (inv.total - inv.reserved) * inv.allocation_ratio:
                return False
    return True
