"""Builds over the bus: the compute agent's RPC endpoint and the conductor's driver.

Each ``berth compute`` process serves topic ``compute`` as server ``<server>``
(queue ``compute.<server>``, Nova's layout): for one real hypervisor the server is the
host's name; a ``--fleet`` of simulated hosts is one server for all its hosts, as one
Nova compute service drives many nodes. Which server runs a host is in the shared
database (table ``berth_compute_agents``, written when the agent registers), so an API
process finds any host's agent without listening to reports.

Methods (calls; answers are JSON, a failure is an ``{"error": ...}`` answer):

* ``build_and_run_instance(host, instance_uuid, spec, selection)`` — the late
  server-group check and the driver's build (:func:`~berth.service.conductor.
  build_with_late_check`), on the agent, as in Nova; ``{"host": ...}`` or an error
  with code ``berth.compute.build_failed`` (reschedulable);
* ``terminate_instance(host, instance_uuid)`` — forget the instance and report;
* ``set_service(host, disabled, disabled_reason, forced_down)`` — an operator's switches
  on the host's compute service (``PUT /os-services/{host}``), on every node of the host
  this process runs; ``{"nodes": [state, ...]}``, or an error with code
  ``berth.compute.unknown_service``;
* ``retire_service(host)`` — the host's compute service is being deleted: its agents
  stop reporting and are forgotten; ``{"retired": [node uuid, ...]}``.

:class:`RemoteDriver` is the conductor's side: a :class:`~berth.service.conductor.
ComputeDriver` that calls the host's agent. A call that gets no answer in time is a
failed build (the conductor reschedules), after a best-effort terminate on the host so
an instance built there but not answered for does not stay behind.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from berth.config import SchedulerConfig
from berth.hardware.numa import prepare_request
from berth.model.request import RequestSpec
from berth.model.selection import Selection
from berth.placement.db import create_tables
from berth.service.bus import Bus, BusClient, BusError
from berth.service.compute import ComputeAgent
from berth.service.conductor import (
    BuildFailed,
    ComputeDriver,
    ServiceUnreachable,
    UnknownService,
    build_with_late_check,
)
from berth.service.group_check import GroupPolicyCheck
from berth.service.wire import selection_from_wire, selection_to_wire, spec_from_wire, spec_to_wire

LOG = logging.getLogger(__name__)

COMPUTE_TOPIC = "compute"
BUILD_FAILED = "berth.compute.build_failed"
UNKNOWN_SERVICE = "berth.compute.unknown_service"

agents_metadata = sa.MetaData()

compute_agents = sa.Table(
    "berth_compute_agents",
    agents_metadata,
    sa.Column("host", sa.String(255), primary_key=True),
    sa.Column("server", sa.String(255), nullable=False),
)


_ALL_AGENTS = sa.select(compute_agents.c.host, compute_agents.c.server)
_AGENT_OF = sa.select(compute_agents.c.server).where(
    compute_agents.c.host == sa.bindparam("host"))


class AgentDirectory:
    """host -> the RPC server of the agent process that runs it (shared database)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        create_tables(engine, agents_metadata)
        self._cache: dict[str, str] = {}
        self._lock = threading.Lock()
        #: Whether the whole directory was read (on the first miss): a conductor builds
        #: on hosts all over the cloud, and one query for each was a tenth of an API
        #: process's time in a round of boots at 3,000 hosts.
        self._read_all = False

    def register(self, hosts: Iterable[str], server: str) -> None:
        """Record ``server`` as the agent of ``hosts`` (replacing an earlier one)."""
        names = sorted(set(hosts))
        if not names:
            return
        with self.engine.connect().execution_options(immediate=True) as conn, conn.begin():
            for start in range(0, len(names), 1000):
                part = names[start:start + 1000]
                conn.execute(sa.delete(compute_agents).where(compute_agents.c.host.in_(part)))
                conn.execute(sa.insert(compute_agents), [{"host": h, "server": server}
                                                         for h in part])
        with self._lock:
            self._cache.update(dict.fromkeys(names, server))

    def server_of(self, host: str) -> str | None:
        """The agent server of ``host`` (cached; the first miss reads the whole
        directory, a later one the host's row)."""
        with self._lock:
            server = self._cache.get(host)
        if server is not None:
            return server
        with self.engine.connect() as conn:
            if not self._read_all:
                rows = conn.execute(_ALL_AGENTS).all()
                with self._lock:
                    self._read_all = True
                    for name, where in rows:
                        self._cache.setdefault(name, where)
                    server = self._cache.get(host)
                if server is not None:
                    return server
            server = conn.execute(_AGENT_OF, {"host": host}).scalar()
        if server is not None:
            with self._lock:
                self._cache[host] = server
        return server

    def forget(self, host: str) -> None:
        """Drop the cached server of ``host`` (it moved, or its agent is gone)."""
        with self._lock:
            self._cache.pop(host, None)

    def unregister(self, host: str) -> None:
        """``host`` runs nowhere any more (its compute service was deleted)."""
        self.forget(host)
        with self.engine.begin() as conn:
            conn.execute(sa.delete(compute_agents).where(compute_agents.c.host == host))


class ComputeEndpoint:
    """The RPC methods of one agent process (one host, or a fleet of them)."""

    def __init__(self, agents: Mapping[str, ComputeAgent], driver: ComputeDriver,
                 group_check: GroupPolicyCheck, config: SchedulerConfig) -> None:
        self.agents = agents
        self.driver = driver
        self.group_check = group_check
        self.config = config
        #: Builds answered, by result (``built``, ``failed``), and instances terminated.
        self.counts: dict[str, int] = {"built": 0, "failed": 0, "terminated": 0}

    def build_and_run_instance(self, ctxt: Any, host: str, instance_uuid: str,
                               spec: dict[str, Any], selection: dict[str, Any]) -> dict[str, Any]:
        """Check the server group late, then build; ``{"host"}`` or a build error."""
        answer = self._build(host, instance_uuid, spec, selection)
        self.counts["failed" if "error" in answer else "built"] += 1
        return answer

    def _build(self, host: str, instance_uuid: str, spec: dict[str, Any],
               selection: dict[str, Any]) -> dict[str, Any]:
        if host not in self.agents:
            return _failed(f"build of {instance_uuid} failed on {host}: unknown node {host!r} "
                           "on this compute service")
        try:
            chosen, request = selection_from_wire(selection), spec_from_wire(spec)
            prepare_request(request, self.config)  # its NUMA cells and PCI devices
            build_with_late_check(self.group_check, self.config, chosen, instance_uuid,
                                  request, lambda: self.driver.spawn(chosen, instance_uuid,
                                                                     request))
        except BuildFailed as exc:
            return _failed(str(exc))
        except Exception as exc:  # a driver's bug is this build's failure, not the server's
            LOG.exception("building %s on %s failed", instance_uuid, host)
            return _failed(f"build of {instance_uuid} failed on {host}: {exc}")
        return {"host": host}

    def terminate_instance(self, ctxt: Any, host: str, instance_uuid: str) -> dict[str, Any]:
        """Forget the instance on ``host`` and report."""
        agent = self.agents.get(host)
        if agent is not None:
            agent.destroy(instance_uuid)
            self.counts["terminated"] += 1
        return {"host": host}

    def set_service(self, ctxt: Any, host: str, disabled: bool | None = None,
                    disabled_reason: str | None = None,
                    forced_down: bool | None = None) -> dict[str, Any]:
        """Set the switches on every node of ``host`` this process runs."""
        try:
            return {"nodes": self.driver.set_service(host, disabled=disabled,
                                                     reason=disabled_reason,
                                                     forced_down=forced_down)}
        except UnknownService:
            return _unknown(host)

    def retire_service(self, ctxt: Any, host: str) -> dict[str, Any]:
        """Stop and forget the agents of ``host`` (its service is being deleted)."""
        try:
            return {"retired": self.driver.retire_service(host)}
        except UnknownService:
            return _unknown(host)


def _unknown(host: str) -> dict[str, Any]:
    return {"error": {"code": UNKNOWN_SERVICE,
                      "message": f"no compute service on host {host!r} here"}}


def _failed(message: str) -> dict[str, Any]:
    return {"error": {"code": BUILD_FAILED, "message": message}}


class RemoteDriver:
    """The conductor's compute driver: builds through the hosts' agents over the bus."""

    def __init__(self, bus: Bus, directory: AgentDirectory, *, timeout: float | None = None) -> None:
        self.bus = bus
        self.directory = directory
        self.timeout = timeout
        self._clients: dict[str, BusClient] = {}
        self._lock = threading.Lock()

    def _client(self, server: str) -> BusClient:
        with self._lock:
            client = self._clients.get(server)
            if client is None:
                client = self._clients[server] = self.bus.client(
                    COMPUTE_TOPIC, server=server, timeout=self.timeout)
            return client

    def spawn(self, selection: Selection, instance_uuid: str, spec: RequestSpec) -> None:
        """Build on the selection's host through its agent; BuildFailed otherwise."""
        host = selection.service_host
        server = self.directory.server_of(host)
        if server is None:
            raise BuildFailed(f"build of {instance_uuid} failed on {host}: no compute agent "
                              "registered for this host")
        client = self._client(server)
        try:
            answer = client.call("build_and_run_instance", host=host, instance_uuid=instance_uuid,
                                 spec=spec_to_wire(spec), selection=selection_to_wire(selection))
        except BusError as exc:
            self.directory.forget(host)
            try:  # the build may have happened without its answer reaching us
                client.cast("terminate_instance", host=host, instance_uuid=instance_uuid)
            except BusError:
                LOG.warning("could not ask %s to drop %s after a lost build call", host,
                            instance_uuid)
            raise BuildFailed(f"build of {instance_uuid} failed on {host}: {exc}") from None
        if isinstance(answer, Mapping) and answer.get("error"):
            raise BuildFailed(str(answer["error"].get("message")))

    def terminate(self, instance_uuid: str, host: str, nodename: str | None) -> None:
        """Have ``host``'s agent forget a deleted instance and report. An agent that does
        not answer is told again by a cast and logged: the instance is deleted all the
        same (its claim is gone already), as Nova deletes one whose compute is down."""
        server = self.directory.server_of(host)
        if server is None:
            LOG.warning("instance %s deleted; no compute agent is registered for its host %s",
                        instance_uuid, host)
            return
        client = self._client(server)
        try:
            client.call("terminate_instance", host=host, instance_uuid=instance_uuid)
        except BusError as exc:
            self.directory.forget(host)
            LOG.warning("instance %s deleted; the agent of %s did not answer (%s): told "
                        "again without waiting", instance_uuid, host, exc)
            with contextlib.suppress(BusError):
                client.cast("terminate_instance", host=host, instance_uuid=instance_uuid)

    def set_service(self, host: str, *, disabled: bool | None, reason: str | None,
                    forced_down: bool | None) -> list[dict[str, Any]]:
        """Set the switches on ``host``'s agent process (see
        :meth:`ComputeEndpoint.set_service`)."""
        return self._call_agent(host, "set_service", "nodes", disabled=disabled,
                                disabled_reason=reason, forced_down=forced_down)

    def retire_service(self, host: str) -> list[str]:
        """Stop and forget ``host``'s agents in their process (see
        :meth:`ComputeEndpoint.retire_service`); their node uuids."""
        return [str(u) for u in self._call_agent(host, "retire_service", "retired")]

    def _call_agent(self, host: str, method: str, key: str, **kwargs: Any) -> list[Any]:
        """Call ``method`` on ``host``'s agent process; the answer's list ``key``.
        :class:`UnknownService` when no process runs the host, :class:`ServiceUnreachable`
        when its process does not answer (nothing changed) or answers nonsense."""
        server = self.directory.server_of(host)
        if server is None:
            raise UnknownService(host)
        try:
            answer = self._client(server).call(method, host=host, **kwargs)
        except BusError as exc:
            self.directory.forget(host)
            raise ServiceUnreachable(
                f"the compute agent of host {host!r} (server {server!r}) did not answer: "
                f"{exc}; nothing was changed (is its 'berth compute' running?)") from None
        if isinstance(answer, Mapping) and isinstance(answer.get(key), list):
            return list(answer[key])
        error = answer.get("error") if isinstance(answer, Mapping) else None
        if isinstance(error, Mapping) and error.get("code") == UNKNOWN_SERVICE:
            self.directory.forget(host)  # it may have moved to another process
            raise UnknownService(host)
        raise ServiceUnreachable(f"the compute agent of host {host!r} answered {answer!r}")


def announce_deleted(bus: Bus) -> Callable[[list[str], float], None]:
    """What tells every scheduler that compute nodes were deleted (the
    ``hosts_deleted`` fanout cast); a lost cast is logged (those schedulers keep a row
    that is down and never a candidate, until they restart)."""
    fanout = bus.client("scheduler", fanout=True)

    def announce(uuids: list[str], deleted_at: float) -> None:
        try:
            fanout.cast("hosts_deleted", uuids=uuids, deleted_at=deleted_at)
        except BusError as exc:
            LOG.warning("could not tell the schedulers that %s were deleted: %s",
                        ", ".join(uuids), exc)

    return announce
