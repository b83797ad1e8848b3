"""What travels on the bus: request specs, selections, decisions and errors as JSON.

The API process turns a ``POST /boot`` body into a :class:`RequestSpec`, a scheduler
process answers with a :class:`Decision`, the conductor sends the build to the compute
agent; between processes each travels as plain JSON values. One function per direction
and type, each the inverse of the other (the tests check the round trips).

A spec carries the fields the boot API sets (flavor, image, hints, server group,
project, user, AZ, count, forced and ignored hosts). Its NUMA topology and PCI requests
are not sent: they follow from the flavor and the image, and every receiver derives
them again with :func:`~berth.hardware.numa.prepare_request` under its configuration
(the same nova.conf). A spec with any other field set (a move's destination) is
refused by :func:`spec_to_wire` with a ValueError rather than silently sent without it.

Errors travel as ``{"error": {"code", "message", "details"}}`` answers and come back
as the same :class:`~berth.errors.BerthError` class, found by its stable code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from berth import errors
from berth.model.request import Flavor, ImageMeta, ImageMetaProps, InstanceGroup, RequestSpec
from berth.model.selection import Selection
from berth.pipeline import Decision

#: Fields of a spec that must be unset (their defaults) to travel.
_UNSENT = ("instance_uuid", "force_nodes", "requested_destination", "retry",
           "network_metadata", "request_level_params", "requested_networks")


#: The fields of a server group a request carries (a newer sender's others are left out).
_GROUP_FIELDS = frozenset(f.name for f in dataclasses.fields(InstanceGroup))

def spec_to_wire(spec: RequestSpec) -> dict[str, Any]:
    """A boot's request spec as JSON values."""
    for name in _UNSENT:
        if getattr(spec, name) is not None:
            raise ValueError(f"RequestSpec.{name} cannot travel on the bus (boot specs only)")
    if spec.requested_resources or spec.is_bfv:
        raise ValueError("RequestSpec.requested_resources/is_bfv cannot travel on the bus")
    image = spec.image
    return {
        "flavor": dataclasses.asdict(spec.flavor),
        "image": None if image is None else {
            "id": image.id, "name": image.name, "disk_format": image.disk_format,
            "properties": dict(image.properties.raw)},
        "scheduler_hints": spec.scheduler_hints,
        "instance_group": _group_to_wire(spec.instance_group),
        # Where the members are claimed: a key of its own, which a receiver of an
        # earlier version leaves unread (inside the group its InstanceGroup(**...) failed).
        "group_claims": (None if spec.instance_group is None
                         or not spec.instance_group.member_hosts else {
                             "hosts": spec.instance_group.member_hosts,
                             "flavors": spec.instance_group.member_flavors}),
        "project_id": spec.project_id,
        "user_id": spec.user_id,
        "availability_zone": spec.availability_zone,
        "num_instances": spec.num_instances,
        "ignore_hosts": spec.ignore_hosts,
        "force_hosts": spec.force_hosts,
    }


def _group_to_wire(group: InstanceGroup | None) -> dict[str, Any] | None:
    """A server group as the first versions had it (``member_hosts`` and
    ``member_flavors`` travel apart, as ``group_claims``)."""
    if group is None:
        return None
    return {k: v for k, v in dataclasses.asdict(group).items()
            if k not in ("member_hosts", "member_flavors")}


def spec_from_wire(data: Mapping[str, Any]) -> RequestSpec:
    """The inverse of :func:`spec_to_wire`."""
    image = data.get("image")
    group = data.get("instance_group")
    if group is not None:
        group = {k: v for k, v in group.items() if k in _GROUP_FIELDS}
        claims = data.get("group_claims")
        if claims:
            group["member_hosts"] = dict(claims.get("hosts") or {})
            group["member_flavors"] = dict(claims.get("flavors") or {})
    return RequestSpec(
        flavor=Flavor(**data["flavor"]),
        image=None if image is None else ImageMeta(
            id=image.get("id"), name=image.get("name"), disk_format=image.get("disk_format"),
            properties=ImageMetaProps(image.get("properties") or {})),
        scheduler_hints=data.get("scheduler_hints"),
        instance_group=None if group is None else InstanceGroup(**group),
        project_id=data.get("project_id"),
        user_id=data.get("user_id"),
        availability_zone=data.get("availability_zone"),
        num_instances=int(data.get("num_instances", 1)),
        ignore_hosts=data.get("ignore_hosts"),
        force_hosts=data.get("force_hosts"),
    )


def selection_to_wire(selection: Selection) -> dict[str, Any]:
    """A selection as JSON values (``limits`` as Nova's legacy dict has them)."""
    return {
        "compute_node_uuid": selection.compute_node_uuid,
        "service_host": selection.service_host,
        "nodename": selection.nodename,
        "cell_uuid": selection.cell_uuid,
        "limits": selection.to_dict()["limits"],
        "allocation_request": selection.allocation_request,
        "allocation_request_version": selection.allocation_request_version,
        "availability_zone": selection.availability_zone,
    }


def selection_from_wire(data: Mapping[str, Any]) -> Selection:
    """The inverse of :func:`selection_to_wire` (NUMA limits come back as the limits
    object the compute's claim reads)."""
    limits = dict(data.get("limits") or {})
    numa = limits.get("numa_topology")
    if isinstance(numa, Mapping):
        from berth.hardware.numa import NUMATopologyLimits

        limits["numa_topology"] = NUMATopologyLimits(
            cpu_allocation_ratio=numa.get("cpu_allocation_ratio"),
            ram_allocation_ratio=numa.get("ram_allocation_ratio"))
    return Selection(
        compute_node_uuid=data.get("compute_node_uuid"), service_host=data["service_host"],
        nodename=data["nodename"], cell_uuid=data.get("cell_uuid"), limits=limits,
        allocation_request=data.get("allocation_request") or "null",
        allocation_request_version=data.get("allocation_request_version"),
        availability_zone=data.get("availability_zone"))


def decision_to_wire(decision: Decision) -> dict[str, Any]:
    """A decision as JSON values (its diagnosis as ``Diagnosis.to_dict``)."""
    return {
        "selections": [[selection_to_wire(s) for s in hosts] for hosts in decision.selections],
        "instance_uuids": list(decision.instance_uuids),
        "diagnosis": None if decision.diagnosis is None else decision.diagnosis.to_dict(),
    }


def decision_from_wire(data: Mapping[str, Any]) -> Decision:
    """The inverse of :func:`decision_to_wire`."""
    diagnosis = None
    if data.get("diagnosis") is not None:
        from berth.service.cli import diagnosis_from_dict

        diagnosis = diagnosis_from_dict(data["diagnosis"])
    return Decision(
        selections=[[selection_from_wire(s) for s in hosts] for hosts in data["selections"]],
        instance_uuids=list(data["instance_uuids"]), diagnosis=diagnosis)


def error_to_wire(exc: errors.BerthError) -> dict[str, Any]:
    """An expected failure as an answer: its stable code, message and JSON details
    (a NoValidHost's diagnosis included)."""
    details = {k: v for k, v in exc.details.items() if _json_like(v)}
    body: dict[str, Any] = {"code": exc.code, "message": exc.message, "details": details}
    diagnosis = getattr(exc, "diagnosis", None)
    if diagnosis is not None:
        body["diagnosis"] = diagnosis.to_dict()
    if isinstance(exc, errors.NoValidHost):
        body["no_valid_host"] = {"cause": exc.cause, "fitted": exc.fitted,
                                 "requested": exc.requested, "emptied_by": exc.emptied_by,
                                 "rejections": dict(exc.rejections)}
    return {"error": body}


def error_from_wire(data: Mapping[str, Any]) -> errors.BerthError:
    """The :class:`~berth.errors.BerthError` an :func:`error_to_wire` answer stands for
    (the class with its code; BerthError for a code this version does not know)."""
    body = data["error"]
    known = {c.code: c for c in _subclasses(errors.BerthError)}
    cls = known.get(body.get("code"), errors.BerthError)
    # Built around the class's own constructor: the message is already the final one.
    exc = cls.__new__(cls)
    errors.BerthError.__init__(exc, str(body.get("message", "")), **dict(body.get("details") or {}))
    if isinstance(exc, errors.NoValidHost):
        exc.reason = ""
        exc.diagnosis = None
        extra = body.get("no_valid_host") or {}
        exc.rejections = {str(k): int(v) for k, v in (extra.get("rejections") or {}).items()}
        exc.cause = extra.get("cause")
        exc.fitted, exc.requested = extra.get("fitted"), extra.get("requested")
        exc.emptied_by = extra.get("emptied_by")
        exc.placed, exc.claimed = [], []
        if body.get("diagnosis") is not None:
            from berth.service.cli import diagnosis_from_dict

            exc.diagnosis = diagnosis_from_dict(body["diagnosis"])
    return exc


def _json_like(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool, type(None), list, dict))


def _subclasses(cls: type[errors.BerthError]) -> list[type[errors.BerthError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out += _subclasses(sub)
    return out

