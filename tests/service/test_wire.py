"""What travels on the bus comes back as it left."""

from __future__ import annotations

import pytest

from berth.errors import InputError, NoValidHost
from berth.explain import Diagnosis, FilterStep, InstanceDiagnosis
from berth.model.request import Flavor, ImageMeta, InstanceGroup, RequestSpec
from berth.model.selection import Selection
from berth.pipeline import Decision
from berth.service.wire import (
    decision_from_wire,
    decision_to_wire,
    error_from_wire,
    error_to_wire,
    spec_from_wire,
    spec_to_wire,
)


def _spec() -> RequestSpec:
    return RequestSpec(
        flavor=Flavor(name="m1.small", vcpus=1, memory_mb=2048, root_gb=20, id=2,
                      extra_specs={"hw:cpu_policy": "shared"}),
        image=ImageMeta(id="img", name="cirros", disk_format="qcow2",
                        properties={"hw_architecture": "x86_64"}),
        scheduler_hints={"group": "g1", "different_host": ["a", "b"]},
        instance_group=InstanceGroup(policy="anti-affinity", uuid="u1", name="g1",
                                     rules={"max_server_per_host": 2}, members=["m1"]),
        project_id="p", user_id="u", availability_zone="az1", num_instances=3,
        ignore_hosts=["h9"], force_hosts=None)


def test_a_boot_spec_round_trips() -> None:
    spec = _spec()
    back = spec_from_wire(spec_to_wire(spec))
    assert back.flavor == spec.flavor
    assert back.image is not None and back.image.properties == spec.image.properties  # type: ignore[union-attr]
    assert back.scheduler_hints == spec.scheduler_hints
    assert back.instance_group == spec.instance_group
    assert (back.project_id, back.user_id, back.availability_zone, back.num_instances,
            back.ignore_hosts) == ("p", "u", "az1", 3, ["h9"])


def test_where_members_are_claimed_travels_apart_from_the_group() -> None:
    """A receiver of an earlier version rebuilt the group with InstanceGroup(**group):
    the group carries its first fields only, and the members' claims go beside it."""
    spec = _spec()
    assert spec.instance_group is not None
    spec.instance_group.member_hosts = {"m1": "h1"}
    spec.instance_group.member_flavors = {"m1": 2}
    wire = spec_to_wire(spec)
    assert set(wire["instance_group"]) == {"policy", "uuid", "name", "rules", "members",
                                           "hosts", "project_id", "user_id"}
    back = spec_from_wire(wire)
    assert back.instance_group == spec.instance_group
    # From a sender of an earlier version: no claims, nothing counted from them.
    del wire["group_claims"]
    assert spec_from_wire(wire).instance_group.member_hosts == {}  # type: ignore[union-attr]
    # A group that carries them itself keeps them.
    wire["instance_group"]["member_hosts"] = {"m1": "h1"}
    assert spec_from_wire(wire).instance_group.member_hosts == {"m1": "h1"}  # type: ignore[union-attr]


def test_a_spec_with_fields_the_bus_does_not_carry_is_refused() -> None:
    spec = _spec()
    spec.force_nodes = ["n1"]
    with pytest.raises(ValueError, match="force_nodes"):
        spec_to_wire(spec)


def test_a_decision_round_trips_with_its_allocation_requests() -> None:
    chosen = Selection(compute_node_uuid="c1", service_host="h1", nodename="h1", cell_uuid="cell",
                       limits={"vcpu": 32.0}, allocation_request='{"allocations": {}}',
                       allocation_request_version="1.36", availability_zone="nova")
    alternate = Selection(compute_node_uuid="c2", service_host="h2", nodename="h2", cell_uuid="cell")
    decision = Decision([[chosen, alternate]], ["i1"])
    back = decision_from_wire(decision_to_wire(decision))
    assert back.selections == [[chosen, alternate]] and back.instance_uuids == ["i1"]


def test_errors_come_back_as_their_class_with_the_diagnosis() -> None:
    diagnosis = Diagnosis([InstanceDiagnosis(0, None, hosts_considered=3,
                                             steps=[FilterStep("request filters", 3, 0)])])
    back = error_from_wire(error_to_wire(NoValidHost("no room", diagnosis=diagnosis)))
    assert isinstance(back, NoValidHost)
    assert back.message == "No valid host was found. no room"
    assert back.diagnosis is not None and back.diagnosis.to_dict() == diagnosis.to_dict()
    bad = error_from_wire(error_to_wire(InputError("flavor: nope", field="flavor")))
    assert isinstance(bad, InputError) and bad.details == {"field": "flavor"}


def test_a_no_valid_host_keeps_its_cause_and_how_many_fit_over_the_bus() -> None:
    """What an API process answers for a scheduler's refusal (the 409 counts the
    instances that fit), and a refusal from an older scheduler without those fields."""
    from berth.errors import error_dict

    refused = NoValidHost("There are not enough hosts available.", cause="hosts",
                          rejections={"ComputeFilter": 2})
    refused.fitted, refused.requested = 3, 4
    refused.emptied_by = "claims"
    back = error_from_wire(error_to_wire(refused))
    assert isinstance(back, NoValidHost) and back.cause == "hosts"
    assert error_dict(back)["instances_fit"] == 3 and back.fit_note() is not None
    assert error_dict(back)["emptied_by"] == "claims"
    assert error_dict(back)["rejections"] == {"ComputeFilter": 2}
    old = error_to_wire(NoValidHost("no room"))
    del old["error"]["no_valid_host"]
    assert error_dict(error_from_wire(old)) == {"code": "berth.scheduling.no_valid_host",
                                                "message": "No valid host was found. no room"}


def test_numa_and_pci_requests_are_derived_again_by_the_receiver() -> None:
    """A boot's NUMA topology and PCI requests follow from its flavor and image: they
    do not travel, and the receiver's prepare_request gives the same ones back."""
    import json

    from berth.config import SchedulerConfig
    from berth.hardware.numa import prepare_request

    config = SchedulerConfig.from_dict({"pci": {"alias": [json.dumps(
        {"name": "gpu", "vendor_id": "10de", "product_id": "1db4"})]}})
    spec = RequestSpec(flavor=Flavor(name="f", vcpus=2, memory_mb=2048, extra_specs={
        "hw:numa_nodes": "2", "pci_passthrough:alias": "gpu:1"}))
    prepare_request(spec, config)
    assert spec.numa_topology is not None and spec.pci_requests is not None
    sent = spec_to_wire(spec)
    assert "numa_topology" not in sent and "pci_requests" not in sent
    received = spec_from_wire(sent)
    prepare_request(received, config)
    assert received.numa_topology == spec.numa_topology
    assert [r.to_dict() for r in received.pci_requests.requests] == [  # type: ignore[union-attr]
        r.to_dict() for r in spec.pci_requests.requests]  # type: ignore[union-attr]
