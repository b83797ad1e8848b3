"""GET /allocation_candidates: Berth's Placement-compatible candidate engine.

``allocation_candidates(graph, params, microversion)`` turns the query string (a
multi-dict) into the JSON-ready response body of that microversion, or raises
``BadRequest`` with the reference's text and code. It is pure: it reads only the
``ProviderGraph`` snapshot (built once by the store, see ``candidates_graph``) and the
options passed in.

Modules: ``candidates_query`` (parsing and validation), ``candidates_search`` (the
algorithm of the reference's section 5), ``candidates_graph`` (snapshot and indexes);
this module renders the response (section 4.12).

``allocation_candidates_json`` returns the same body already encoded (the HTTP layer's
hot path). After a change, the store can call ``graph.with_updates(changed_providers)``
instead of building a new ``ProviderGraph``: usages and inventory numbers are patched in
O(changed) and every index is shared.

The returned body shares provider-summary dicts with the graph's cache: treat it as
read-only (encode it, do not mutate it).
"""

from __future__ import annotations

import gc
import json
import random
import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from berth.placement.candidates_graph import (
    SHARING_TRAIT,
    Inventory,
    Provider,
    ProviderGraph,
    capacity_of,
    ordered_traits,
)
from berth.placement.candidates_order import (
    flat_order,
    general_merged_order,
    general_order,
    merged_order,
    tree_order,
)
from berth.placement.candidates_query import CandidateQuery, parse_query
from berth.placement.candidates_search import (
    ArrayResult,
    Candidate,
    FlatResult,
    GeneralResult,
    SearchResult,
    allowed_anchors,
    search,
)

__all__ = [
    "SHARING_TRAIT",
    "CandidateOptions",
    "Inventory",
    "Provider",
    "ProviderGraph",
    "allocation_candidates",
    "allocation_candidates_json",
    "render_result",
    "search_candidates",
]

Microversion = tuple[int, int]
ObjectArray = npt.NDArray[np.object_]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class CandidateOptions:
    """Placement's ``[placement]`` knobs that shape the candidate list.

    * ``max_allocation_candidates`` (default -1, unlimited): cap on generated requests.
    * ``randomize_allocation_candidates`` (default False): ``limit`` takes a random
      sample instead of the first N, and without ``limit`` the list is shuffled.
    * ``seed``: seeds that randomness so a response can be replayed (None: unseeded).
    """

    max_allocation_candidates: int = -1
    randomize_allocation_candidates: bool = False
    seed: int | None = None


DEFAULT_OPTIONS = CandidateOptions()


def allocation_candidates(
    graph: ProviderGraph,
    params: Mapping[str, list[str]],
    microversion: tuple[int, int],
    options: CandidateOptions = DEFAULT_OPTIONS,
) -> dict[str, Any]:
    """The GET /allocation_candidates response body for ``params`` at ``microversion``.

    ``params`` maps each query parameter to its values in the order received.
    Raises ``berth.placement.errors.BadRequest`` for invalid queries, and ``ValueError``
    below 1.10 (the route does not exist there; the HTTP layer answers 404 itself).
    """
    query = parse_query(params, microversion)
    with _gc_paused():
        result = _cut(graph, search(graph, query, microversion), query, options, microversion)
        return _render(graph, query, result, microversion)


def search_candidates(
    graph: ProviderGraph,
    params: Mapping[str, list[str]],
    microversion: tuple[int, int],
    options: CandidateOptions = DEFAULT_OPTIONS,
) -> tuple[CandidateQuery, SearchResult]:
    """The parsed query and the engine's result (limits applied), not rendered.

    For a caller in the same process: a ``FlatResult`` names the chosen providers by
    graph index, so nothing is built per candidate until someone asks.
    ``render_result`` turns it into the response body.
    """
    query = parse_query(params, microversion)
    with _gc_paused():
        return query, _cut(graph, search(graph, query, microversion), query, options, microversion)


def render_result(
    graph: ProviderGraph, query: CandidateQuery, result: SearchResult, microversion: Microversion
) -> dict[str, Any]:
    """The response body of a ``search_candidates`` result (what the API would send)."""
    with _gc_paused():
        return _render(graph, query, result, microversion)


def allocation_candidates_json(
    graph: ProviderGraph,
    params: Mapping[str, list[str]],
    microversion: tuple[int, int],
    options: CandidateOptions = DEFAULT_OPTIONS,
) -> bytes:
    """The same response as ``allocation_candidates``, already encoded as JSON bytes.

    This is the HTTP layer's hot path: at 10,000 candidates building the nested dicts
    and encoding them costs far more than the search, so the common (flat) result is
    written straight from string templates and per-provider summary fragments that the
    graph caches. ``json.loads`` of the bytes equals ``allocation_candidates``' dict.
    """
    query = parse_query(params, microversion)
    with _gc_paused():
        return _encode(graph, query, microversion, options)


def _encode(
    graph: ProviderGraph,
    query: CandidateQuery,
    microversion: Microversion,
    options: CandidateOptions,
) -> bytes:
    result = _cut(graph, search(graph, query, microversion), query, options, microversion)
    if microversion >= (1, 27) and isinstance(result, (ArrayResult, GeneralResult)) and len(result):
        # Requests through orjson (the C ``json`` encoder needs ~10x longer here);
        # summaries from the per-provider fragments the flat path caches too. A tree
        # result's requests are rendered straight from its arrays.
        if isinstance(result, ArrayResult):
            requests = _array_requests_json(graph, result, microversion >= (1, 34))
            in_summary = result.summary_providers(
                graph, microversion >= (1, 29) or not graph.has_trees)
        else:
            requests = orjson.dumps(
                [_render_candidate(graph.uuids, c, microversion) for c in result.candidates])
            in_summary = _summary_providers(graph, result.candidates, microversion,
                                            result.summary)
        summaries = _summary_fragments(graph, np.asarray(in_summary, dtype=np.int64),
                                       microversion)
        return b"".join([b'{"allocation_requests":', requests,
                         b',"provider_summaries":{', b"".join(summaries)[:-1], b"}}"])
    if not isinstance(result, FlatResult) or microversion < (1, 27) or len(result.providers) == 0:
        return orjson.dumps(_render(graph, query, result, microversion))
    picked = result.providers
    res = _dumps(result.resources).encode()
    before, after = _request_fragments(graph, microversion >= (1, 34))
    # One join over [before[p], res, after[p], ...]: no per-candidate string building in
    # Python. Each ``after`` ends with a comma; the last one is cut off.
    parts = np.empty(3 * len(picked), dtype=object)
    parts[0::3] = before[picked]
    parts[1::3] = res
    parts[2::3] = after[picked]
    requests = b"".join(parts.tolist())[:-1]
    summaries = _summary_fragments(graph, picked, microversion)
    return b"".join(
        [
            b'{"allocation_requests":[',
            requests,
            b'],"provider_summaries":{',
            b"".join(summaries)[:-1],
            b"}}",
        ]
    )


def _array_requests_json(graph: ProviderGraph, result: ArrayResult, with_mappings: bool) -> bytes:
    """The JSON array of the requests as :func:`_render_candidate` renders
    ``result.candidates`` at 1.12+ (the bytes orjson gives for that), written from one
    template per shape, without building the candidates: requests whose columns name
    the same providers in the same places (which columns share a provider) differ only
    in the uuids, so each shape's text is formed once and its rows fill in their uuids."""
    combos = result.combos
    count, width = combos.shape
    slots = np.tile(np.arange(width, dtype=np.int64), (count, 1))
    for c in range(1, width):
        for o in range(c):  # a column's slot: the first column with the same provider
            same = (combos[:, o] == combos[:, c]) & (slots[:, c] == c)
            slots[same, c] = o
    if width <= 15:  # a shape as one number (width ** width fits in 64 bits)
        codes = slots @ (width ** np.arange(width, dtype=np.int64))
        _, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
        shapes = slots[first]
    else:
        shapes, inverse = np.unique(slots, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    uuid_json = graph.uuid_json
    out: list[str] = [""] * count
    for k, shape in enumerate(shapes.tolist()):
        template, columns = _request_template(result, tuple(shape), with_mappings)
        rows = np.flatnonzero(inverse == k)
        for i, providers in zip(rows.tolist(), combos[rows][:, columns].tolist()):
            out[i] = template % tuple([uuid_json[p] for p in providers])
    return ("[" + ",".join(out) + "]").encode()


def _request_template(result: ArrayResult, shape: tuple[int, ...],
                      with_mappings: bool) -> tuple[str, list[int]]:
    """One shape's request as a ``%`` template (one ``%s`` per uuid) and, per ``%s``, the
    column whose provider fills it: a candidate's amounts by provider, first column
    first, and its mappings (what :attr:`ArrayResult.candidates` holds)."""
    per_slot: dict[int, dict[str, int]] = {}
    for slot, rc, amount in zip(shape, result.classes, result.amounts):
        held = per_slot.setdefault(slot, {})
        held[rc] = held.get(rc, 0) + amount
    columns: list[int] = []
    parts = []
    for slot, held in per_slot.items():
        resources = ",".join(f"{_quote(rc)}:{int(n)}" for rc, n in held.items())
        parts.append('%s:{"resources":{' + resources.replace("%", "%%") + "}}")
        columns.append(slot)
    text = '{"allocations":{' + ",".join(parts) + "}"
    if with_mappings:
        groups = result.groups
        mapped = []
        for suffix, start, stop in groups:
            if len(groups) == 1 or not suffix:
                listed = list(dict.fromkeys(shape if len(groups) == 1 else shape[start:stop]))
            else:
                listed = [shape[start]]
            columns.extend(listed)
            mapped.append(_quote(suffix).replace("%", "%%") + ":[" + ",".join(["%s"] * len(listed))
                          + "]")
        text += ',"mappings":{' + ",".join(mapped) + "}"
    return text + "}", columns


_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a response is built.

    A large response is tens of thousands of small acyclic containers; with the
    collector on, the generation-2 passes they trigger over the whole heap (graph
    included) cost 2-4x the work itself. Reference counting frees everything as usual;
    only cycle detection waits. Pauses nest across threads: the collector comes back
    when the last one ends, and only if it was on before the first.
    """
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _request_fragments(
    graph: ProviderGraph, with_mappings: bool
) -> tuple[ObjectArray, ObjectArray]:
    """Per provider, a one-provider request's JSON bytes before and after its resources.

    They depend on the uuid only, so ``with_updates`` keeps them (cached on the graph).
    """
    key = "request-1.34" if with_mappings else "request-1.12"
    cached = graph.cached_fragments(key)
    if cached is None:
        before = np.empty(graph.size, dtype=object)
        after = np.empty(graph.size, dtype=object)
        before[:] = [b'{"allocations":{' + q.encode() + b':{"resources":' for q in graph.uuid_json]
        if with_mappings:
            after[:] = [b'}},"mappings":{"":[' + q.encode() + b"]}}," for q in graph.uuid_json]
        else:
            after[:] = [b"}}},"] * graph.size
        cached = (before, after)
        graph.store_fragments(key, cached)
    return cached[0], cached[1]


def _summary_fragments(graph: ProviderGraph, picked: IntArray, mv: Microversion) -> list[bytes]:
    """``"uuid":{summary},`` as JSON bytes for each picked provider (1.27+ rows are fixed).

    Fragments are cached per provider on the graph and built lazily, only for providers
    some response needed: the graph is rebuilt after every change, so building all of
    them up front would tax the first request after each change. They are written with
    string formatting rather than ``json.dumps`` of each row for the same reason.
    """
    # "provider:" keys hold one entry per provider; with_updates() resets changed ones.
    key = "provider:summary-1.29" if mv >= (1, 29) else "provider:summary-1.27"
    cached = graph.cached_fragments(key)
    if cached is None:
        cached = (np.full(graph.size, None, dtype=object), np.zeros(graph.size, dtype=np.bool_))
        graph.store_fragments(key, cached)
    rows, built = cached
    missing = picked[~built[picked]]
    if len(missing):
        with_tree = mv >= (1, 29)
        rows[missing] = [_summary_fragment(graph, p, with_tree) for p in missing.tolist()]
        built[missing] = True
    return list(rows[picked].tolist())


def _summary_fragment(graph: ProviderGraph, p: int, with_tree: bool) -> bytes:
    prov = graph.providers[p]
    usages = prov.usages
    order = graph.class_id
    quote = _quote
    resources = ",".join(
        [
            f'{quote(rc)}:{{"capacity":{int((inv.total - inv.reserved) * inv.allocation_ratio)}'
            f',"used":{int(usages.get(rc, 0))}}}'
            for rc, inv in sorted(prov.inventories.items(), key=lambda item: order[item[0]])
        ]
    )
    traits = ",".join([quote(t) for t in ordered_traits(graph, prov.traits)])
    text = f'{graph.uuid_json[p]}:{{"resources":{{{resources}}},"traits":[{traits}]'
    if with_tree:
        parent = _dumps(prov.parent_uuid) if prov.parent_uuid else "null"
        root = graph.root[p]
        root_json = (
            graph.uuid_json[root] if graph.uuids[root] == prov.root_uuid else _dumps(prov.root_uuid)
        )
        text += f',"parent_provider_uuid":{parent},"root_provider_uuid":{root_json}'
    return (text + "},").encode()


_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.:-]*")
_QUOTED: dict[str, str] = {}


def _quote(name: str) -> str:
    """A JSON string literal for a class or trait name (memoized: the set is small)."""
    quoted = _QUOTED.get(name)
    if quoted is None:
        quoted = f'"{name}"' if _PLAIN_NAME.fullmatch(name) else _dumps(name)
        if len(_QUOTED) < 100_000:
            _QUOTED[name] = quoted
    return quoted


def _cut(graph: ProviderGraph, result: SearchResult, query: CandidateQuery,
         options: CandidateOptions, microversion: Microversion = (1, 29)) -> SearchResult:
    """Apply max_allocation_candidates (Placement stops forming requests after that
    many), then ``limit`` (or the random variants). Either keeps the requests Placement
    would keep, in its order (:mod:`berth.placement.candidates_order`).

    Below 1.29 over trees, Placement forms the nested-aware answer, drops the requests
    that take from two providers of one tree (keeping the order), and only then
    limits; its summaries are then those of the providers the remaining requests use
    whose tree a kept request uses."""
    size = len(result.providers) if isinstance(result, FlatResult) else len(result)
    cap = options.max_allocation_candidates if 0 <= options.max_allocation_candidates < size \
        else None
    keep = size if cap is None else cap
    if query.limit is not None:
        keep = min(keep, query.limit)
    randomize = options.randomize_allocation_candidates
    if keep == size and not randomize:
        return result
    if (microversion < (1, 29) and graph.has_trees and not randomize
            and not isinstance(result, FlatResult)):
        return _cut_not_nested_aware(graph, query, options, keep)
    return _ordered(graph, result, query, options, cap, keep)


def _cut_not_nested_aware(graph: ProviderGraph, query: CandidateQuery,
                          options: CandidateOptions, keep: int) -> SearchResult:
    """:func:`_cut` below 1.29 over trees (see there), from the nested-aware answer
    (the search's own answer below 1.29 has the nested requests dropped already, but
    not in Placement's order, nor capped by ``max_allocation_candidates`` before the
    dropping as Placement's is)."""
    full = search(graph, query, (1, 29))
    assert not isinstance(full, FlatResult)  # a cloud with trees
    size = len(full)
    cap = options.max_allocation_candidates if 0 <= options.max_allocation_candidates < size \
        else None
    whole = _ordered(graph, full, query, options, cap, size if cap is None else cap)
    assert not isinstance(whole, FlatResult)
    root = graph.root
    remaining = [i for i, c in enumerate(whole.candidates)
                 if len({root[p] for p in c.amounts}) == len(c.amounts)]
    used = {p for i in remaining for p in whole.candidates[i].amounts}
    kept = remaining[:keep]
    out: ArrayResult | GeneralResult
    if isinstance(whole, ArrayResult):
        out = whole.take(kept)
    else:
        out = GeneralResult([whole.candidates[i] for i in kept])
    roots = {root[p] for c in out.candidates for p in c.amounts}
    out.summary = sorted(p for p in used if root[p] in roots)
    return out


def _ordered(graph: ProviderGraph, result: SearchResult, query: CandidateQuery,
             options: CandidateOptions, cap: int | None, keep: int) -> SearchResult:
    """The first ``keep`` requests of ``result`` in Placement's order (random ones with
    ``randomize_allocation_candidates``), of at most ``cap`` formed."""
    size = len(result.providers) if isinstance(result, FlatResult) else len(result)
    randomize = options.randomize_allocation_candidates
    order: list[int]
    if randomize:
        rng = random.Random(options.seed)
        pool = list(range(size if cap is None else cap))
        order = sorted(rng.sample(pool, keep)) if keep < len(pool) else pool
        if query.limit is None:
            rng.shuffle(order)
    elif isinstance(result, FlatResult):
        last_rc, amount = list(result.resources.items())[-1]
        fit = graph.fit_mask(last_rc, amount)
        group = next(iter(query.groups.values()))
        if group.in_tree is not None and group.in_tree in graph.index:
            fit &= graph.root_array == graph.root[graph.index[group.in_tree]]
        order = flat_order(graph, result.providers, result.resources, np.flatnonzero(fit),
                           cap, keep=keep)
    elif isinstance(result, ArrayResult) and len(result.groups) == 1:
        order = tree_order(graph, next(iter(query.groups.values())), result.combos,
                           result.anchors, cap, keep=keep, allowed=allowed_anchors(graph, query))
    elif isinstance(result, ArrayResult):
        assert result.parts is not None and result.picks is not None  # several groups
        order = merged_order(graph, result.combos, result.classes, result.amounts,
                             result.anchors, cap, keep=keep, groups=list(query.groups.values()),
                             parts=result.parts, picks=result.picks,
                             allowed=allowed_anchors(graph, query))
    elif result.merge is not None:  # several groups, or sharing providers
        order = general_merged_order(graph, [c.amounts for c in result.candidates], cap,
                                     keep=keep, groups=list(query.groups.values()),
                                     merge=result.merge, allowed=allowed_anchors(graph, query))
    else:  # one group without sharing providers (same_subtree, a resourceless group)
        known = [c.by_class for c in result.candidates if c.by_class is not None]
        order = general_order(graph, [c.amounts for c in result.candidates],
                              next(iter(query.groups.values())), cap,
                              by_class=known if len(known) == size else None,
                              allowed=allowed_anchors(graph, query))[:keep]
    if isinstance(result, FlatResult):
        return FlatResult(result.providers[order], result.resources)
    if isinstance(result, ArrayResult):
        return result.take(order)
    return GeneralResult([result.candidates[i] for i in order])


def _render(
    graph: ProviderGraph, query: CandidateQuery, result: SearchResult, mv: Microversion
) -> dict[str, Any]:
    uuids = graph.uuids
    with_mappings = mv >= (1, 34)
    requests: list[dict[str, Any]]
    if isinstance(result, FlatResult):
        picked: list[int] = result.providers.tolist()
        res = result.resources
        if mv < (1, 12):
            requests = [
                {"allocations": [{"resource_provider": {"uuid": uuids[p]}, "resources": dict(res)}]}
                for p in picked
            ]
        elif with_mappings:
            requests = [
                {
                    "allocations": {uuids[p]: {"resources": dict(res)}},
                    "mappings": {"": [uuids[p]]},
                }
                for p in picked
            ]
        else:
            requests = [{"allocations": {uuids[p]: {"resources": dict(res)}}} for p in picked]
        # Flat snapshot: each provider is its own tree.
        in_summary = picked
    else:
        requests = [_render_candidate(uuids, c, mv) for c in result.candidates]
        in_summary = _summary_providers(graph, result.candidates, mv, result.summary)
    return {
        "allocation_requests": requests,
        "provider_summaries": _summaries(graph, query, in_summary, mv),
    }


def _render_candidate(uuids: list[str], cand: Candidate, mv: Microversion) -> dict[str, Any]:
    # The per-class amount dicts are the candidate's own (built for this request), so
    # the body takes them over instead of copying them.
    if mv < (1, 12):
        return {
            "allocations": [
                {"resource_provider": {"uuid": uuids[p]}, "resources": per_rc}
                for p, per_rc in cand.amounts.items()
            ]
        }
    body: dict[str, Any] = {
        "allocations": {uuids[p]: {"resources": per_rc} for p, per_rc in cand.amounts.items()}
    }
    if mv >= (1, 34):
        body["mappings"] = {s: [uuids[p] for p in ps] for s, ps in cand.mappings.items()}
    return body


def _summary_providers(
    graph: ProviderGraph, candidates: list[Candidate], mv: Microversion,
    summary: list[int] | None = None,
) -> list[int]:
    """Providers to summarize: ``summary`` when the cut set them, else whole trees of
    the used providers (1.29+ or no trees), otherwise only the providers the requests
    use."""
    if summary is not None:
        return summary
    used = {p for c in candidates for p in c.amounts}
    if mv < (1, 29) and graph.has_trees:
        return sorted(used)
    roots = {graph.root[p] for p in used}
    return sorted(p for r in roots for p in graph.tree_members[r])


def _summaries(
    graph: ProviderGraph, query: CandidateQuery, providers: list[int], mv: Microversion
) -> dict[str, Any]:
    uuids = graph.uuids
    if mv < (1, 27):
        # Only the requested classes are listed below 1.27, so rows depend on the query.
        requested = {rc for g in query.groups.values() for rc in g.resources}
        return {uuids[p]: _summary_row(graph, p, mv, requested) for p in providers}
    key = "1.29" if mv >= (1, 29) else "1.27"
    rows = graph.cached_summaries(key)
    if rows is None:
        rows = [_summary_row(graph, p, mv, None) for p in range(graph.size)]
        graph.store_summaries(key, rows)
    return {uuids[p]: rows[p] for p in providers}


def _summary_row(
    graph: ProviderGraph, p: int, mv: Microversion, classes: set[str] | None
) -> dict[str, Any]:
    prov = graph.providers[p]
    resources = {
        rc: {"capacity": capacity_of(inv), "used": prov.usages.get(rc, 0)}
        for rc, inv in sorted(
            prov.inventories.items(), key=lambda item: graph.class_id.get(item[0], 1 << 30)
        )
        if classes is None or rc in classes
    }
    row: dict[str, Any] = {"resources": resources}
    if mv >= (1, 17):
        row["traits"] = ordered_traits(graph, prov.traits)
    if mv >= (1, 29):
        row["parent_provider_uuid"] = prov.parent_uuid
        row["root_provider_uuid"] = prov.root_uuid
    return row
