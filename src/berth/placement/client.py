"""A typed Python client for Berth's (or any) Placement API.

    client = PlacementClient("http://127.0.0.1:8778", token="admin")
    rp = client.create_provider("cn1")
    client.set_inventories(rp.uuid, rp.generation, {"VCPU": {"total": 8}})
    body = client.allocation_candidates({"resources": "VCPU:2"})
    client.put_allocations(consumer, {rp.uuid: {"VCPU": 2}}, project_id="p", user_id="u",
                           consumer_generation=None)

Every non-2xx answer raises ``PlacementAPIError`` (subclass by status) carrying
``status``, the ``placement.*`` ``code`` and the ``detail`` text; a connection that
fails raises httpx's errors (``httpx.HTTPError``). Calls to a URL go over kept
standard-library connections (:mod:`berth.placement.transport`); an httpx transport is
a constructor argument, so tests can pass ``httpx.WSGITransport`` or a mock transport.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from berth.placement.transport import (
    DEFAULT_TIMEOUT,
    SYSTEM_TLS,
    TLS,
    KeptConnections,
    Response,
    TokenSource,
)

DEFAULT_MICROVERSION = "1.39"


class PlacementAPIError(Exception):
    """A Placement error response: status, ``placement.*`` code and detail."""

    def __init__(self, status: int, code: str | None, detail: str, request_id: str | None):
        super().__init__(f"{status} {code or ''}: {detail.strip()}")
        self.status = status
        self.code = code
        self.detail = detail
        self.request_id = request_id


class BadRequestError(PlacementAPIError):
    """400."""


class ForbiddenError(PlacementAPIError):
    """403."""


class NotFoundError(PlacementAPIError):
    """404."""


class ConflictError(PlacementAPIError):
    """409: generation conflicts (code ``placement.concurrent_update``), capacity, in use."""

    @property
    def is_generation_conflict(self) -> bool:
        """Whether a retry with fresh generations may succeed."""
        return self.code == "placement.concurrent_update"


#: The request id of the caller's caller (Nova's ``context.global_id``), which every
#: Placement call made meanwhile in this thread sends as ``X-OpenStack-Request-ID``, as
#: Nova's report client does, so Placement's log lines name the request they serve.
GLOBAL_REQUEST_ID: ContextVar[str | None] = ContextVar("berth_global_request_id", default=None)


_BY_STATUS: dict[int, type[PlacementAPIError]] = {
    400: BadRequestError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
}


def error_class(status: int) -> type[PlacementAPIError]:
    """The exception class the client raises for an HTTP ``status``."""
    return _BY_STATUS.get(status, PlacementAPIError)


@dataclass(frozen=True, slots=True)
class ResourceProvider:
    """A provider as the API returns it."""

    uuid: str
    name: str
    generation: int
    parent_provider_uuid: str | None = None
    root_provider_uuid: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ResourceProvider:
        """Build from a provider representation."""
        return cls(
            uuid=data["uuid"],
            name=data["name"],
            generation=data["generation"],
            parent_provider_uuid=data.get("parent_provider_uuid"),
            root_provider_uuid=data.get("root_provider_uuid"),
        )


@dataclass(frozen=True, slots=True)
class ConsumerAllocations:
    """GET /allocations/{consumer}: resources per provider plus consumer metadata."""

    allocations: dict[str, dict[str, int]]
    consumer_generation: int | None
    project_id: str | None
    user_id: str | None
    consumer_type: str | None


@dataclass
class ConsumerPost:
    """One consumer's part of a ``POST /allocations`` body."""

    allocations: Mapping[str, Mapping[str, int]]
    project_id: str
    user_id: str
    consumer_generation: int | None
    consumer_type: str = "INSTANCE"

    def body(self, with_type: bool) -> dict[str, Any]:
        """The JSON of this consumer (``consumer_type`` only when ``with_type``)."""
        data: dict[str, Any] = {
            "allocations": {rp: {"resources": dict(res)} for rp, res in self.allocations.items()},
            "project_id": self.project_id, "user_id": self.user_id,
            "consumer_generation": self.consumer_generation,
        }
        if with_type:
            data["consumer_type"] = self.consumer_type
        return data


class PlacementClient:
    """Synchronous client for the Placement API (microversion 1.39 by default)."""

    def __init__(
        self,
        base_url: str | Sequence[str],
        *,
        token: str = "admin",
        microversion: str = DEFAULT_MICROVERSION,
        roles: Sequence[str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
        auth: httpx.Auth | None = None,
        tls: TLS = SYSTEM_TLS,
    ) -> None:
        """``auth`` (e.g. :class:`berth.webauth.client.KeystoneAuth`) replaces the noauth2
        ``token`` with Keystone's.

        Calls to a real URL go over kept connections of the standard library
        (:mod:`berth.placement.transport`: a third of httpx's CPU per call; several
        ``base_url`` share the calls, one refusing connections is passed over); with
        a ``transport`` (an app in process, a mock) or an ``auth`` that is not a token
        source, through httpx and one URL. A URL that is not http(s) is a ValueError.
        ``tls``: the authorities and client certificate of an https URL."""
        headers = {
            "X-Auth-Token": token,
            "OpenStack-API-Version": f"placement {microversion}",
            "Accept": "application/json",
        }
        if roles is not None:
            headers["X-Roles"] = ",".join(roles)
        self._http: httpx.Client | KeptConnections
        if transport is None and (auth is None or isinstance(auth, TokenSource)):
            if auth is not None:
                del headers["X-Auth-Token"]
            self._http = KeptConnections(base_url, headers=headers, timeout=timeout,
                                         auth=auth, tls=tls)
        else:
            if not isinstance(base_url, str):
                if len(base_url) != 1:
                    raise ValueError("several base URLs need kept connections (no "
                                     "transport, a token source as auth)")
                base_url = base_url[0]
            self._http = httpx.Client(
                base_url=base_url.rstrip("/"), headers=headers, timeout=timeout,
                transport=transport, auth=auth, verify=tls.ssl_context(),
            )

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> PlacementClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport ---------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Any = None,
        headers: Mapping[str, str] | None = None,
        repeatable: bool = False,
    ) -> httpx.Response | Response:
        global_id = GLOBAL_REQUEST_ID.get()
        if global_id:
            headers = {**(headers or {}), "X-OpenStack-Request-ID": global_id}
        if repeatable and isinstance(self._http, KeptConnections):
            resp: httpx.Response | Response = self._http.request(
                method, path, json=json, params=params, headers=headers, repeatable=True)
        else:
            resp = self._http.request(method, path, json=json, params=params, headers=headers)
        if resp.status_code >= 400:
            raise _error(resp)
        return resp

    # -- providers ---------------------------------------------------------------------

    def create_provider(
        self, name: str, *, uuid: str | None = None, parent_provider_uuid: str | None = None,
        repeatable: bool = False,
    ) -> ResourceProvider:
        """POST /resource_providers. ``repeatable`` (with ``uuid``): the POST may be sent
        twice (:mod:`berth.placement.transport`), so a 409 may mean that this call's
        first send created the provider; the caller reads it back on a 409."""
        body: dict[str, Any] = {"name": name}
        if uuid is not None:
            body["uuid"] = uuid
        if parent_provider_uuid is not None:
            body["parent_provider_uuid"] = parent_provider_uuid
        return ResourceProvider.from_json(
            self._call("POST", "/resource_providers", json=body,
                       repeatable=repeatable and uuid is not None).json()
        )

    def get_provider(self, uuid: str) -> ResourceProvider:
        """GET /resource_providers/{uuid}."""
        return ResourceProvider.from_json(self._call("GET", f"/resource_providers/{uuid}").json())

    def list_providers(self, **filters: str | Sequence[str]) -> list[ResourceProvider]:
        """GET /resource_providers with filters (name, uuid, member_of, resources, ...)."""
        resp = self._call("GET", "/resource_providers", params=_params(filters))
        return [ResourceProvider.from_json(p) for p in resp.json()["resource_providers"]]

    def update_provider(
        self, uuid: str, name: str, *, parent_provider_uuid: str | None = None
    ) -> ResourceProvider:
        """PUT /resource_providers/{uuid}."""
        body: dict[str, Any] = {"name": name}
        if parent_provider_uuid is not None:
            body["parent_provider_uuid"] = parent_provider_uuid
        resp = self._call("PUT", f"/resource_providers/{uuid}", json=body)
        return ResourceProvider.from_json(resp.json())

    def delete_provider(self, uuid: str) -> None:
        """DELETE /resource_providers/{uuid}."""
        self._call("DELETE", f"/resource_providers/{uuid}")

    # -- inventories -------------------------------------------------------------------

    def get_inventories(self, uuid: str) -> tuple[int, dict[str, dict[str, Any]]]:
        """(generation, {class: record})."""
        data = self._call("GET", f"/resource_providers/{uuid}/inventories").json()
        return data["resource_provider_generation"], data["inventories"]

    def set_inventories(
        self, uuid: str, generation: int, inventories: Mapping[str, Mapping[str, Any]]
    ) -> int:
        """PUT .../inventories (replace all); returns the new generation."""
        body = {"resource_provider_generation": generation, "inventories": dict(inventories)}
        data = self._call("PUT", f"/resource_providers/{uuid}/inventories", json=body).json()
        return int(data["resource_provider_generation"])

    # -- traits and aggregates ---------------------------------------------------------

    def get_provider_traits(self, uuid: str) -> tuple[int, list[str]]:
        """(generation, traits)."""
        data = self._call("GET", f"/resource_providers/{uuid}/traits").json()
        return data["resource_provider_generation"], data["traits"]

    def set_provider_traits(self, uuid: str, generation: int, traits: Sequence[str]) -> int:
        """PUT .../traits; returns the new generation."""
        body = {"resource_provider_generation": generation, "traits": list(traits)}
        data = self._call("PUT", f"/resource_providers/{uuid}/traits", json=body).json()
        return int(data["resource_provider_generation"])

    def create_trait(self, name: str) -> bool:
        """PUT /traits/{name}; True if it was created."""
        return self._call("PUT", f"/traits/{name}").status_code == 201

    def list_traits(self, *, name: str | None = None, associated: bool | None = None) -> list[str]:
        """GET /traits."""
        params: dict[str, str] = {}
        if name is not None:
            params["name"] = name
        if associated is not None:
            params["associated"] = "true" if associated else "false"
        return list(self._call("GET", "/traits", params=params).json()["traits"])

    def get_aggregates(self, uuid: str) -> tuple[int, list[str]]:
        """(generation, aggregate uuids)."""
        data = self._call("GET", f"/resource_providers/{uuid}/aggregates").json()
        return data["resource_provider_generation"], data["aggregates"]

    def set_aggregates(self, uuid: str, generation: int, aggregates: Sequence[str]) -> int:
        """PUT .../aggregates; returns the new generation."""
        body = {"resource_provider_generation": generation, "aggregates": list(aggregates)}
        data = self._call("PUT", f"/resource_providers/{uuid}/aggregates", json=body).json()
        return int(data["resource_provider_generation"])

    def create_resource_class(self, name: str) -> bool:
        """PUT /resource_classes/{name}; True if it was created."""
        return self._call("PUT", f"/resource_classes/{name}").status_code == 201

    # -- allocations -------------------------------------------------------------------

    def allocation_candidates(self, params: Mapping[str, str | Sequence[str]]) -> dict[str, Any]:
        """GET /allocation_candidates; the raw body."""
        resp = self._call("GET", "/allocation_candidates", params=_params(params))
        # At 10,000 providers the body is megabytes; orjson decodes it several times faster.
        return dict(orjson.loads(resp.content))

    def get_allocations(self, consumer: str) -> ConsumerAllocations:
        """GET /allocations/{consumer}."""
        data = self._call("GET", f"/allocations/{consumer}").json()
        return ConsumerAllocations(
            allocations={rp: v["resources"] for rp, v in data["allocations"].items()},
            consumer_generation=data.get("consumer_generation"),
            project_id=data.get("project_id"),
            user_id=data.get("user_id"),
            consumer_type=data.get("consumer_type"),
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
        """PUT /allocations/{consumer}: claim (replace) the consumer's allocations.

        ``consumer_generation`` is None for a new consumer; a ConflictError with
        ``is_generation_conflict`` means someone else changed it first. ``microversion``
        overrides the client's for this call (Nova claims at the allocation request's
        version); ``consumer_type`` is sent only from 1.38, where the API takes it.
        """
        body: dict[str, Any] = {
            "allocations": {rp: {"resources": dict(res)} for rp, res in allocations.items()},
            "project_id": project_id,
            "user_id": user_id,
            "consumer_generation": consumer_generation,
        }
        if microversion is None or microversion_tuple(microversion) >= (1, 38):
            body["consumer_type"] = consumer_type
        headers = (None if microversion is None
                   else {"OpenStack-API-Version": f"placement {microversion}"})
        self._call("PUT", f"/allocations/{consumer}", json=body, headers=headers)

    def delete_allocations(self, consumer: str) -> None:
        """DELETE /allocations/{consumer}."""
        self._call("DELETE", f"/allocations/{consumer}")

    def take_allocations(self, consumer: str) -> dict[str, dict[str, int]]:
        """What the consumer holds (GET /allocations/{consumer}), then DELETE it
        (NotFoundError when it holds nothing)."""
        held = {rp: dict(res) for rp, res in self.get_allocations(consumer).allocations.items()}
        self.delete_allocations(consumer)
        return held

    def post_allocations(
        self, consumers: Mapping[str, ConsumerPost], *, microversion: str | None = None
    ) -> None:
        """POST /allocations: replace several consumers' allocations in one transaction
        (an empty set clears a consumer). ``microversion`` overrides the client's for
        this call; ``consumer_type`` is sent only from 1.38, where the API takes it."""
        version = microversion_tuple(microversion) if microversion is not None else None
        with_type = version is None or version >= (1, 38)
        body = {consumer: post.body(with_type) for consumer, post in consumers.items()}
        headers = (None if microversion is None
                   else {"OpenStack-API-Version": f"placement {microversion}"})
        self._call("POST", "/allocations", json=body, headers=headers)

    def provider_usages(self, uuid: str) -> dict[str, int]:
        """GET .../usages."""
        return dict(self._call("GET", f"/resource_providers/{uuid}/usages").json()["usages"])

    def project_usages(self, project_id: str, user_id: str | None = None) -> dict[str, Any]:
        """GET /usages."""
        params = {"project_id": project_id}
        if user_id is not None:
            params["user_id"] = user_id
        return dict(self._call("GET", "/usages", params=params).json()["usages"])


def microversion_tuple(text: str) -> tuple[int, int]:
    """``"1.36"`` as ``(1, 36)``."""
    major, _, minor = text.partition(".")
    return int(major), int(minor)


def _params(filters: Mapping[str, str | Sequence[str]]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for key, value in filters.items():
        if isinstance(value, str):
            out.append((key, value))
        else:
            out.extend((key, v) for v in value)
    return out


def _error(resp: httpx.Response | Response) -> PlacementAPIError:
    code = None
    detail = resp.text
    request_id = resp.headers.get("x-openstack-request-id")
    try:
        entry = resp.json()["errors"][0]
        code = entry.get("code")
        detail = entry.get("detail", detail)
    except (ValueError, KeyError, IndexError, TypeError):
        pass
    cls = _BY_STATUS.get(resp.status_code, PlacementAPIError)
    return cls(resp.status_code, code, detail, request_id)
