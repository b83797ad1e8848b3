"""Nova's scheduler RPC interface (topic ``scheduler``, exchange ``nova``, version 4.5),
served by Berth (reference ``nova-scheduler-rpc.md`` §1).

:class:`NovaSchedulerEndpoint` answers the six methods a Nova 34 deployment calls:

* ``select_destinations`` (call): any 4.x message up to 4.5. 4.5 and 4.4 carry a
  RequestSpec primitive. 4.3 adds no ``instance_uuids``. 4.0 carries the legacy
  ``request_spec`` and ``filter_properties`` dicts.
  * With instance uuids, each instance's resources are claimed in placement, as Nova's
    scheduler claims them. Without them (4.0–4.2), nothing is claimed (Nova's path for
    such conductors).
  * The answer is a list of Selection primitives per instance when ``return_objects``
    (the chosen host, then the alternates if ``return_alternates``). Otherwise it is one
    legacy dict per instance.
  * A refusal raises :class:`NoValidHost`, which the caller receives as
    ``nova.exception.NoValidHost``.
* ``update_aggregates``, ``delete_aggregate``, ``update_instance_info``,
  ``delete_instance_info``, ``sync_instance_info`` (fanout casts): handed to the
  host-state feed (:class:`HostStateSink`). A cast never raises back.

oslo.messaging's dispatcher refuses versions above 4.5 with ``UnsupportedVersion``. It also
heartbeats long calls, since Nova's conductor calls with ``call_monitor_timeout``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from berth.errors import NoValidHost as BerthNoValidHost
from berth.errors import SchedulingError
from berth.model.compute import Instance
from berth.nova import primitives as prim
from berth.pipeline import Decision
from berth.placement.client import GLOBAL_REQUEST_ID
from berth.service.bus import _oslo_messaging

LOG = logging.getLogger(__name__)

#: The interface version Berth serves (Nova 34's ``SchedulerManager.target``).
SCHEDULER_RPC_VERSION = "4.5"
TOPIC = "scheduler"
#: Nova's control exchange.
EXCHANGE = "nova"

_UNSET = object()


class NoValidHost(Exception):
    """What Nova's conductor expects when no host fits. oslo.messaging serializes the
    class name, the module and ``kwargs``; Nova's client (which allows the
    ``nova.exception`` module) rebuilds its own ``NoValidHost`` from them."""

    def __init__(self, reason: str = "") -> None:
        self.kwargs = {"reason": reason}
        super().__init__(f"No valid host was found. {reason}".strip())


NoValidHost.__module__ = "nova.exception"


class Scheduler(Protocol):
    """What the endpoint schedules with: a
    :class:`~berth.service.scheduler.SchedulerService`."""

    def select_destinations(self, spec: Any, instance_uuids: Sequence[str] | None = None, *,
                            return_alternates: bool = True, explain: bool = False,
                            builds_in_flight: bool = True, claim: bool = True) -> Decision: ...


class HostStateSink(Protocol):
    """Where the casts go: the host-state feed from Nova's databases."""

    def aggregates_changed(self, aggregates: list[Any]) -> None: ...
    def aggregate_deleted(self, aggregate: Any) -> None: ...
    def instances_changed(self, host: str, instances: Sequence[Instance]) -> None: ...
    def instance_deleted(self, host: str, instance_uuid: str) -> None: ...
    def instances_synced(self, host: str, instance_uuids: list[str]) -> None: ...


class NovaSchedulerEndpoint:
    """The endpoint (see the module's docstring)."""

    def __init__(self, scheduler: Scheduler, sink: HostStateSink | None = None,
                 *, explain: bool = False) -> None:
        om = _oslo_messaging()
        self.target = om.Target(version=SCHEDULER_RPC_VERSION)
        self.scheduler = scheduler
        self.sink = sink
        #: Explain every decision (logged at INFO, keyed by instance uuid).
        self.explain = explain
        self.select_destinations = om.expected_exceptions(NoValidHost)(self._select)

    def _select(self, ctxt: Any, request_spec: Any = None, filter_properties: Any = None,
                spec_obj: Any = _UNSET, instance_uuids: list[str] | None = None,
                return_objects: bool = False, return_alternates: bool = False) -> Any:
        given = None if spec_obj is _UNSET else spec_obj
        if not instance_uuids and prim.instances_asked(given, request_spec) <= 0:
            return []  # Nova schedules none (its loop runs num_instances times)
        if spec_obj is _UNSET or spec_obj is None:
            spec = prim.request_spec_from_legacy(request_spec, filter_properties)
        else:
            spec = prim.request_spec_from_primitive(spec_obj)
        if instance_uuids:
            spec.num_instances = len(instance_uuids)
        if not spec.user_id:  # Nova's claim_resources: the caller's user then
            spec.user_id = _context_value(ctxt, "user_id", "user")
        # Nova's report client sends the caller's global request id to Placement.
        token = GLOBAL_REQUEST_ID.set(_context_value(ctxt, "global_request_id", "request_id"))
        try:
            decision = self.scheduler.select_destinations(
                spec, list(instance_uuids) if instance_uuids else None,
                return_alternates=bool(return_objects and return_alternates),
                explain=self.explain, claim=bool(instance_uuids))
        except BerthNoValidHost as exc:
            LOG.info("NoValidHost for %s: %s", ", ".join(instance_uuids or []) or "a request",
                     exc.reason or exc.message)
            if exc.diagnosis is not None:
                _log_explanation(instance_uuids or [], exc.diagnosis)
            raise NoValidHost(exc.reason or "") from None
        except SchedulingError as exc:  # a policy no filter can honour, ...
            raise NoValidHost(exc.message) from None
        finally:
            GLOBAL_REQUEST_ID.reset(token)
        if decision.diagnosis is not None:
            _log_explanation(decision.instance_uuids, decision.diagnosis)
        if return_objects:
            return [[prim.selection_primitive(s) for s in hosts] for hosts in decision.selections]
        return [prim.legacy_selection(hosts[0]) for hosts in decision.selections]

    # ---------------------------------------------------------------- casts
    def update_aggregates(self, ctxt: Any, aggregates: Any) -> None:
        items = aggregates if isinstance(aggregates, list) else prim.data_of(
            aggregates, "AggregateList", "aggregates").get("objects", [])
        self._cast("update_aggregates", lambda sink: sink.aggregates_changed(
            [prim.aggregate_from_primitive(a) for a in items]))

    def delete_aggregate(self, ctxt: Any, aggregate: Any) -> None:
        self._cast("delete_aggregate", lambda sink: sink.aggregate_deleted(
            prim.aggregate_from_primitive(aggregate)))

    def update_instance_info(self, ctxt: Any, host_name: str, instance_info: Any) -> None:
        self._cast("update_instance_info", lambda sink: sink.instances_changed(
            host_name, prim.instances_of(instance_info)))

    def delete_instance_info(self, ctxt: Any, host_name: str, instance_uuid: str) -> None:
        self._cast("delete_instance_info",
                   lambda sink: sink.instance_deleted(host_name, instance_uuid))

    def sync_instance_info(self, ctxt: Any, host_name: str, instance_uuids: list[str]) -> None:
        self._cast("sync_instance_info",
                   lambda sink: sink.instances_synced(host_name, list(instance_uuids)))

    def _cast(self, name: str, apply: Any) -> None:
        if self.sink is None:
            LOG.debug("%s: no host-state feed here; ignored", name)
            return
        try:
            apply(self.sink)
        except Exception:  # a cast has no caller to answer: log, keep serving
            LOG.exception("%s failed", name)


def _context_value(ctxt: Any, *names: str) -> str | None:
    """The first of ``names`` set in the caller's request context (Nova sends its
    RequestContext as a dict)."""
    if not isinstance(ctxt, dict):
        return None
    for name in names:
        value = ctxt.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def _log_explanation(instance_uuids: Sequence[str], diagnosis: Any) -> None:
    from berth.explain import diagnosis_lines

    key = ", ".join(instance_uuids) or "request"
    for line in diagnosis_lines(diagnosis):
        LOG.info("[%s] %s", key, line)


def serve(bus: Any, endpoint: NovaSchedulerEndpoint, host: str, *, workers: int = 8) -> Any:
    """Serve ``endpoint`` on ``bus`` as a nova-scheduler on ``host`` does: the shared
    ``scheduler`` queue, ``scheduler.<host>`` and the ``scheduler`` fanout."""
    return bus.serve(TOPIC, host, [endpoint], workers=workers, version=SCHEDULER_RPC_VERSION)
