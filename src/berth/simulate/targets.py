"""Where a replay sends its events: a cloud in process, or a running Berth.

Both take the same ``POST /boot`` bodies and answer in the same shape, so the replay
cannot tell them apart:

* :class:`LocalTarget`: a cloud file registered in a scratch store
  (:mod:`berth.service.offline`), scheduled by the objects ``berth serve`` runs per
  request — :class:`~berth.service.api.SchedulerApp`'s ``boot`` (request parsing,
  server groups, the conductor, the scheduler service, placement's candidates, the
  core, the claims, the fake driver's build through the compute agents) and the move
  service's delete — without HTTP in between.
* :class:`RemoteTarget`: a running ``berth serve`` (or ``berth api``) over HTTP:
  ``POST /boot``, ``DELETE /servers/{uuid}``, ``POST /server-groups``, and its Placement
  API for the resource ledger.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from berth.errors import SchedulingError, error_dict
from berth.model.request import Flavor
from berth.placement import amounts
from berth.placement.amounts import ProviderAmounts
from berth.placement.client import PlacementClient
from berth.service.api_client import call_json


@dataclass
class Placed:
    """One instance built: its uuid, host and what it claimed per provider."""

    uuid: str
    host: str
    allocations: dict[str, dict[str, int]]


@dataclass
class BootOutcome:
    """What one create request gave: the instances built, and for a refusal (or the
    instances not built) the cause and the message."""

    placed: list[Placed]
    refused: int = 0
    cause: str | None = None
    message: str | None = None
    seconds: float = 0.0
    #: Hosts each filter removed before a refusal (from the NoValidHost answer).
    rejections: dict[str, int] = field(default_factory=dict)


class Target(Protocol):
    """What a replay needs of a cloud."""

    placement: PlacementClient

    def provider_amounts(self) -> list[ProviderAmounts]:
        """Every provider's capacity and usage, for the replay's ledger."""
        ...

    def boot(self, body: dict[str, Any]) -> BootOutcome: ...
    def delete(self, uuid: str) -> None: ...
    def compute_nodes(self) -> list[dict[str, Any]]: ...
    def flavors(self) -> dict[str, Flavor]: ...
    def images(self) -> set[str]: ...
    def groups(self) -> set[str]: ...
    def create_group(self, name: str, policy: str) -> None: ...
    def close(self) -> None: ...


def refusal_cause(error: Mapping[str, Any]) -> str:
    """The cause of a refused boot, from its error body: ``placement`` (no allocation
    candidates), ``request filter``, the filter that removed the last hosts
    (``emptied_by``), ``claims`` (hosts were left but placement refused their claims), or
    the error's code for anything else."""
    cause = error.get("cause")
    if cause == "placement":
        return "placement"
    if cause == "request_filter":
        return "request filter"
    if cause == "hosts":
        return str(error.get("emptied_by") or "claims")
    return str(error.get("code") or "error")


def outcome_of(answer: Mapping[str, Any], requested: int, seconds: float) -> BootOutcome:
    """A ``POST /boot`` answer (200, or 409 with the built and failed instances) or an
    error body (``{"error": ...}``), as an outcome."""
    placed = [Placed(i["instance_uuid"], i["host"],
                     {rp: dict(body.get("resources", {})) for rp, body in
                      (i.get("allocation_request") or {}).get("allocations", {}).items()})
              for i in answer.get("instances", [])]
    error = answer.get("error")
    if error is None:
        return BootOutcome(placed, seconds=seconds)
    return BootOutcome(placed, refused=requested - len(placed),
                       cause=refusal_cause(error) if not placed else "build",
                       message=str(error.get("message", "")), seconds=seconds,
                       rejections=dict(error.get("rejections") or {}))


class LocalTarget:
    """A cloud file in process (see the module's docstring)."""

    def __init__(self, offline: Any, *, seed: int | None = None) -> None:
        from berth.service.api import SchedulerApp

        stack = offline.stack
        self.stack = stack
        self.service = stack.scheduler(seed=seed)
        conductor = stack.conductor(self.service)
        self.moves = stack.moves(conductor)
        self._flavors = offline.cloud.known_flavors()
        self.app = SchedulerApp(self.service, conductor, stack.placement_app, self._flavors,
                                offline.cloud.images, groups=stack.groups, moves=self.moves)
        self.placement = stack.client

    def boot(self, body: dict[str, Any]) -> BootOutcome:
        start = time.perf_counter()
        try:
            answer = self.app.boot(body)
        except SchedulingError as exc:  # NoValidHost, a policy no filter honours...
            answer = {"error": error_dict(exc)}
        return outcome_of(answer, int(body.get("num", 1)), time.perf_counter() - start)

    def provider_amounts(self) -> list[ProviderAmounts]:
        """From the store's provider graph (current as of this call: the snapshot the
        allocation candidates are computed from), without a request per provider."""
        return self.stack.provider_amounts()  # type: ignore[no-any-return]

    def delete(self, uuid: str) -> None:
        self.moves.delete(uuid)

    def compute_nodes(self) -> list[dict[str, Any]]:
        return list(self.app.hosts()["hosts"])

    def flavors(self) -> dict[str, Flavor]:
        return dict(self._flavors)

    def images(self) -> set[str]:
        return set(self.app.images)

    def groups(self) -> set[str]:
        return {g.name for g in self.stack.groups.all()}

    def create_group(self, name: str, policy: str) -> None:
        self.app.create_server_group({"name": name, "policy": policy,
                                      "project_id": "simulate", "user_id": "simulate"})

    def close(self) -> None:
        """The offline cloud's context closes the stack."""


class RemoteTarget:
    """A running Berth over HTTP (see the module's docstring)."""

    def __init__(self, url: str, *, token: str = "admin", timeout: float = 120.0) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, timeout=timeout,
                                 headers={"X-Auth-Token": token})
        self.placement = PlacementClient(self.url + "/placement", token=token, timeout=timeout)

    def _call(self, method: str, path: str, body: Any = None,
              ok: tuple[int, ...] = (200,)) -> tuple[int, Any]:
        return call_json(self.http, self.url, method, path, body, ok)

    def boot(self, body: dict[str, Any]) -> BootOutcome:
        start = time.perf_counter()
        _, answer = self._call("POST", "/boot", body, ok=(200, 409))
        return outcome_of(answer, int(body.get("num", 1)), time.perf_counter() - start)

    def provider_amounts(self) -> list[ProviderAmounts]:
        """Through the running Berth's Placement API."""
        return amounts.over_api(self.placement)

    def delete(self, uuid: str) -> None:
        self._call("DELETE", f"/servers/{uuid}")

    def compute_nodes(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/hosts")[1]["hosts"])

    def flavors(self) -> dict[str, Flavor]:
        out = {}
        for f in self._call("GET", "/flavors")[1]["flavors"]:
            out[f["name"]] = Flavor(name=f["name"], vcpus=f["vcpus"], memory_mb=f["memory_mb"],
                                    root_gb=f["root_gb"], ephemeral_gb=f["ephemeral_gb"],
                                    swap=f["swap"], id=f.get("id"), flavorid=f.get("flavorid"),
                                    extra_specs=dict(f["extra_specs"]))
        return out

    def images(self) -> set[str]:
        return {i["name"] for i in self._call("GET", "/images")[1]["images"]}

    def groups(self) -> set[str]:
        return {g["name"] for g in self._call("GET", "/server-groups")[1]["server_groups"]}

    def create_group(self, name: str, policy: str) -> None:
        self._call("POST", "/server-groups", {"name": name, "policy": policy})

    def close(self) -> None:
        self.http.close()
        self.placement.close()
