"""RequestSpec helpers Nova offers on the spec (reference §1.3, §2.3)."""

from __future__ import annotations

from berth.resource_request import RequestGroup
from builders import spec


def test_the_request_group_mapping_names_each_groups_providers_by_requester_id() -> None:
    req = spec(requested_resources=[
        RequestGroup(requester_id="port1", resources={"VCPU": 1}, provider_uuids=["rp-a"]),
        RequestGroup(requester_id="pci-0", resources={"CUSTOM_PCI": 1}),
    ])
    assert req.get_request_group_mapping() == {"port1": ["rp-a"], "pci-0": []}


def test_a_request_without_requested_resources_has_no_mapping() -> None:
    assert spec(requested_resources=None).get_request_group_mapping() is None
    assert spec().get_request_group_mapping() == {}
