"""The store in the same process, behind the client's interface: no HTTP, no JSON.

``berth serve`` runs the resource store and the scheduler in one process. Going through
the WSGI app for every request would render allocation candidates to JSON only to parse
them again, and validate a PUT body the scheduler built itself. :class:`LocalPlacement`
offers the calls the scheduler makes (:meth:`allocation_candidates`,
:meth:`get_allocations`, :meth:`put_allocations`, :meth:`post_allocations`,
:meth:`delete_allocations`, and the reads that explain a refused claim,
:meth:`get_inventories` and :meth:`provider_usages`) with the
same arguments, results and exceptions as :class:`~berth.placement.client.PlacementClient`,
straight on a :class:`~berth.placement.store.PlacementStore`, plus :meth:`search`, which
keeps a candidates answer as engine objects.

The semantics are the API's: the same store methods, the same microversion rules (the
candidates microversion is fixed per instance), the same error texts and ``placement.*``
codes, raised as the client's ``PlacementAPIError`` subclasses. An unavailable database
is retried where the API would retry it (:mod:`berth.placement.dbfaults`) and otherwise
raised as :class:`~berth.errors.ServiceUnavailable`, the API's 503.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from berth.placement import candidates as engine
from berth.placement import errors, schemas
from berth.placement.client import (
    ConsumerAllocations,
    ConsumerPost,
    error_class,
    microversion_tuple,
)
from berth.placement.dbfaults import call_with_retry
from berth.placement.store import UNSET, ConsumerWrite, PlacementStore, inventory_from_body
from berth.placement.web import error_detail


@contextmanager
def _as_client_errors() -> Iterator[None]:
    """Store errors as the client raises them for the same HTTP answer."""
    try:
        yield
    except errors.PlacementError as exc:
        raise error_class(exc.status)(
            exc.status, exc.code, error_detail(exc.status, exc.message), None) from exc


class LocalPlacement:
    """A :class:`PlacementStore` with the scheduler's slice of the client's interface.

    ``microversion`` is what the calls speak (the allocation calls need >= 1.28 for
    consumer generations; candidates are rendered at this version too).
    ``options`` are the engine's ``[placement]`` candidate knobs.
    """

    def __init__(
        self,
        store: PlacementStore,
        *,
        microversion: str = "1.39",
        options: engine.CandidateOptions = engine.DEFAULT_OPTIONS,
    ) -> None:
        self.store = store
        self.version: tuple[int, int] = microversion_tuple(microversion)
        self.options = options

    def close(self) -> None:
        """Nothing to release (the store's engine belongs to the caller)."""

    # -- candidates --------------------------------------------------------------------

    def warm(self) -> None:
        """Read the providers now (a process that starts, before its first request:
        loading 10,000 providers takes about a second)."""
        call_with_retry(self.store.provider_graph, safe=True, what="reading providers")

    def search(
        self, params: Mapping[str, str | Sequence[str]]
    ) -> tuple[engine.ProviderGraph, Any, engine.SearchResult]:
        """``(graph, query, result)``: the candidates answer before rendering."""
        graph = call_with_retry(self.store.provider_graph, safe=True, what="reading providers")
        with _as_client_errors():
            query, result = engine.search_candidates(graph, _multi(params), self.version,
                                                     self.options)
        return graph, query, result

    def allocation_candidates(self, params: Mapping[str, str | Sequence[str]]) -> dict[str, Any]:
        """GET /allocation_candidates; the body as the API would send it."""
        graph, query, result = self.search(params)
        return engine.render_result(graph, query, result, self.version)

    # -- allocations -------------------------------------------------------------------

    def get_allocations(self, consumer: str) -> ConsumerAllocations:
        """GET /allocations/{consumer}."""
        with _as_client_errors():
            data = call_with_retry(lambda: self.store.consumer_allocations(consumer),
                                   safe=True, what=f"GET /allocations/{consumer}")
        found = bool(data.allocations)
        v = self.version
        return ConsumerAllocations(
            allocations={rp: dict(res) for rp, res in data.allocations.items()},
            consumer_generation=data.consumer_generation if found and v >= (1, 28) else None,
            project_id=data.project_id if found and v >= (1, 12) else None,
            user_id=data.user_id if found and v >= (1, 12) else None,
            consumer_type=(data.consumer_type or "unknown") if found and v >= (1, 38) else None,
        )

    def put_allocations(
        self,
        consumer: str,
        allocations: Mapping[str, Mapping[str, int]],
        *,
        project_id: str,
        user_id: str,
        consumer_generation: int | None,
        consumer_type: str = "INSTANCE",
        microversion: str | None = None,
    ) -> None:
        """PUT /allocations/{consumer}: claim (replace) the consumer's allocations, at
        ``microversion`` when given (else this instance's)."""
        version = self.version if microversion is None else microversion_tuple(microversion)
        uuid = schemas.normalize_uuid(consumer)
        if uuid is None:
            raise error_class(400)(400, errors.UNDEFINED_CODE,
                                  error_detail(400, f"Malformed consumer_uuid: {consumer}"), None)
        items = [
            (schemas.normalize_uuid(rp) or rp.lower(), rc, int(used))
            for rp, resources in allocations.items()
            for rc, used in resources.items()
        ]
        write = ConsumerWrite(
            consumer_uuid=uuid,
            project_id=project_id,
            user_id=user_id,
            allocations=items,
            consumer_type=consumer_type if version >= (1, 38) else None,
            generation=consumer_generation if version >= (1, 28) else UNSET,
        )
        with _as_client_errors():
            call_with_retry(lambda: self.store.write_allocations([write], post=False),
                            safe=False, what=f"PUT /allocations/{uuid}")

    def post_allocations(
        self, consumers: Mapping[str, ConsumerPost], *, microversion: str | None = None
    ) -> None:
        """POST /allocations: every consumer's new allocations in one transaction."""
        version = self.version if microversion is None else microversion_tuple(microversion)
        writes = []
        for consumer, post in consumers.items():
            uuid = schemas.normalize_uuid(consumer)
            if uuid is None:
                raise error_class(400)(400, errors.UNDEFINED_CODE, error_detail(
                    400, f"Malformed consumer_uuid: {consumer}"), None)
            writes.append(ConsumerWrite(
                consumer_uuid=uuid, project_id=post.project_id, user_id=post.user_id,
                allocations=[(schemas.normalize_uuid(rp) or rp.lower(), rc, int(used))
                             for rp, resources in post.allocations.items()
                             for rc, used in resources.items()],
                consumer_type=post.consumer_type if version >= (1, 38) else None,
                generation=post.consumer_generation if version >= (1, 28) else UNSET))
        with _as_client_errors():
            self.store.write_allocations(writes, post=True)

    def delete_allocations(self, consumer: str) -> None:
        """DELETE /allocations/{consumer} (NotFoundError when it has none)."""
        self.take_allocations(consumer)

    def take_allocations(self, consumer: str) -> dict[str, dict[str, int]]:
        """DELETE /allocations/{consumer}, answering what it held (provider -> class ->
        amount) from the deleted rows themselves (NotFoundError when it has none)."""
        uuid = schemas.normalize_uuid(consumer) or consumer
        with _as_client_errors():
            return call_with_retry(lambda: self.store.delete_consumer_allocations(uuid),
                                   safe=False, what=f"DELETE /allocations/{uuid}")

    # -- reads a claimer makes to explain a refusal ------------------------------------

    def get_inventories(self, uuid: str) -> tuple[int, dict[str, dict[str, Any]]]:
        """(generation, {class: record})."""
        found = call_with_retry(lambda: self.store.get_inventories(uuid), safe=True,
                                what=f"GET /resource_providers/{uuid}/inventories")
        if found is None:
            raise _not_found(uuid)
        prov, invs = found
        return prov.generation, {rc: inv.as_dict() for rc, inv in invs.items()}

    def provider_usages(self, uuid: str) -> dict[str, int]:
        """GET .../usages."""
        found = call_with_retry(lambda: self.store.provider_usages(uuid), safe=True,
                                what=f"GET /resource_providers/{uuid}/usages")
        if found is None:
            raise _not_found(uuid)
        return dict(found[1])


class LocalProviders(LocalPlacement):
    """:class:`LocalPlacement` plus the provider writes a compute agent makes (create a
    provider, replace its inventories, traits and aggregates, ensure custom traits and
    classes, read usages), with the client's results and exceptions.

    ``berth serve`` and offline scheduling give their in-process agents this instead of
    the HTTP client: the same store methods the API's handlers call, without rendering a
    body to JSON and validating it again. The bodies are the agents' own; a body from a
    user still goes through the API.
    """

    def create_provider(self, name: str, *, uuid: str | None = None,
                        parent_provider_uuid: str | None = None,
                        repeatable: bool = False) -> Any:
        """POST /resource_providers: the provider (``.uuid``, ``.generation``).
        ``repeatable`` is the HTTP client's (nothing is sent twice here)."""
        with _as_client_errors():
            return call_with_retry(
                lambda: self.store.create_provider(name, uuid, parent_provider_uuid),
                safe=False, what="POST /resource_providers")

    def get_provider(self, uuid: str) -> Any:
        """GET /resource_providers/{uuid} (NotFoundError when missing)."""
        prov = call_with_retry(lambda: self.store.get_provider(uuid), safe=True,
                               what=f"GET /resource_providers/{uuid}")
        if prov is None:
            raise _not_found(uuid)
        return prov

    def set_inventories(self, uuid: str, generation: int,
                        inventories: Mapping[str, Mapping[str, Any]]) -> int:
        """PUT .../inventories (replace all); the new generation."""
        new = {rc: inventory_from_body(rc, rec) for rc, rec in inventories.items()}
        with _as_client_errors():  # a missing provider: the store's 404
            gen, _ = call_with_retry(
                lambda: self.store.set_inventories(uuid, generation, new, self.version),
                safe=False, what=f"PUT /resource_providers/{uuid}/inventories")
        return int(gen)

    def get_provider_traits(self, uuid: str) -> tuple[int, list[str]]:
        """(generation, traits)."""
        found = call_with_retry(lambda: self.store.get_provider_traits(uuid), safe=True,
                                what=f"GET /resource_providers/{uuid}/traits")
        if found is None:
            raise _not_found(uuid)
        prov, names = found
        return prov.generation, list(names)

    def set_provider_traits(self, uuid: str, generation: int, traits: Sequence[str]) -> int:
        """PUT .../traits; the new generation."""
        with _as_client_errors():
            result = call_with_retry(
                lambda: self.store.set_provider_traits(uuid, list(traits), generation),
                safe=False, what=f"PUT /resource_providers/{uuid}/traits")
        if result is None:
            raise _not_found(uuid)
        return int(result[0])

    def create_trait(self, name: str) -> bool:
        """PUT /traits/{name}; True if it was created."""
        if schemas.first_error(schemas.CUSTOM_TRAIT, name) is not None:
            raise error_class(400)(400, errors.UNDEFINED_CODE,
                                   error_detail(400, f"Invalid trait name {name!r}"), None)
        with _as_client_errors():
            created, _ = call_with_retry(lambda: self.store.ensure_trait(name), safe=False,
                                         what=f"PUT /traits/{name}")
        return bool(created)

    def set_aggregates(self, uuid: str, generation: int, aggregates: Sequence[str]) -> int:
        """PUT .../aggregates (>= 1.19, with the generation); the new generation."""
        if self.store.get_provider(uuid) is None:
            raise _not_found(uuid)
        with _as_client_errors():
            gen, _ = call_with_retry(
                lambda: self.store.set_aggregates(uuid, list(aggregates), generation),
                safe=False, what=f"PUT /resource_providers/{uuid}/aggregates")
        return int(gen)

    def create_resource_class(self, name: str) -> bool:
        """PUT /resource_classes/{name}; True if it was created."""
        with _as_client_errors():
            return bool(call_with_retry(
                lambda: self.store.create_resource_class(name, exists_ok=True), safe=False,
                what=f"PUT /resource_classes/{name}"))


def _not_found(uuid: str) -> Exception:
    """The client's NotFoundError for a missing provider."""
    return error_class(404)(404, errors.UNDEFINED_CODE,
                            error_detail(404, f"No resource provider with uuid {uuid} found"),
                            None)


def _multi(params: Mapping[str, str | Sequence[str]]) -> dict[str, list[str]]:
    return {k: [v] if isinstance(v, str) else list(v) for k, v in params.items()}
