"""PCI pools, requests and aliases (reference §3.19)."""

from __future__ import annotations

from typing import Any

import pytest

from berth.config import SchedulerConfig
from berth.errors import ConfigError, ExtraSpecError
from berth.hardware.numa import InstanceNUMACell, NUMACell, NUMATopology
from berth.hardware.pci import (
    InstancePCIRequest,
    InstancePCIRequests,
    PciDeviceStats,
    PciRequestFailed,
    parse_aliases,
    pci_requests_from_flavor,
)
from berth.model import Flavor, ImageMetaProps


def pool(count: int = 2, node: int | None = 0, **tags: Any) -> dict[str, Any]:
    base = {"vendor_id": "8086", "product_id": "1520", "numa_node": node, "count": count}
    base.update(tags)
    return base


def req(count: int = 1, policy: str | None = None, request_id: str | None = None,
        **spec: Any) -> InstancePCIRequest:
    return InstancePCIRequest(count, [spec or {"vendor_id": "8086"}], numa_policy=policy,
                              request_id=request_id)


def cells(*ids: int) -> list[InstanceNUMACell]:
    return [InstanceNUMACell(i) for i in ids]


# ------------------------------------------------------------------------ spec matching
def test_strings_match_case_insensitively() -> None:
    stats = PciDeviceStats.from_pools([pool(vendor_id="8086", physical_network="PhysNet0")])
    assert stats.support_requests([req(vendor_id="8086", physical_network="physnet0")])
    assert not stats.support_requests([req(vendor_id="10de")])


def test_any_spec_dict_may_match() -> None:
    stats = PciDeviceStats.from_pools([pool()])
    request = InstancePCIRequest(1, [{"vendor_id": "10de"}, {"product_id": "1520"}])
    assert stats.support_requests([request])


def test_list_values_need_every_requested_item() -> None:
    stats = PciDeviceStats.from_pools([pool(capabilities=["rx", "tx", "tso"])])
    assert stats.support_requests([req(capabilities=["rx", "tx"])])
    assert not stats.support_requests([req(capabilities=["rx", "gso"])])


def test_placement_keys_are_not_matched_against_pools() -> None:
    stats = PciDeviceStats.from_pools([pool()])
    assert stats.support_requests([req(vendor_id="8086", resource_class="CUSTOM_X", traits="T")])


def test_requests_draw_from_one_copy_in_order() -> None:
    stats = PciDeviceStats.from_pools([pool(2)])
    assert stats.support_requests([req(1), req(1)])
    assert not stats.support_requests([req(2), req(1)])
    assert stats.free_count() == 2  # support_requests never changes the pools


# ------------------------------------------------------------------------ NUMA policies
@pytest.mark.parametrize(
    ("policy", "pools", "count", "ok"),
    [
        ("required", [pool(1, 0), pool(4, 1)], 2, False),
        ("required", [pool(2, 0), pool(4, 1)], 2, True),
        ("legacy", [pool(1, 0), pool(1, None)], 2, True),
        ("legacy", [pool(1, 0), pool(4, 1)], 2, False),
        (None, [pool(1, 0), pool(1, None)], 2, True),
        ("preferred", [pool(1, 0), pool(4, 1)], 2, True),
        ("socket", [pool(1, 0), pool(1, 1)], 2, True),
        ("socket", [pool(1, 0), pool(4, 2)], 2, False),
    ],
    ids=[
        "required uses only devices on the guest's cells",
        "required passes with enough local devices",
        "legacy also accepts devices without NUMA affinity",
        "legacy does not take devices from other cells",
        "no policy means legacy",
        "preferred takes remote devices when local ones run out",
        "socket accepts devices on another cell of the same socket",
        "socket refuses devices on another socket",
    ],
)
def test_numa_affinity_policies(policy: str | None, pools: list[dict[str, Any]], count: int, ok: bool) -> None:
    host = NUMATopology((NUMACell(0, socket=0), NUMACell(1, socket=0), NUMACell(2, socket=1)))
    stats = PciDeviceStats.from_pools(pools, numa_topology=host)
    assert stats.support_requests([req(count, policy)], None, cells(0)) is ok


def test_socket_policy_without_socket_information_fails() -> None:
    stats = PciDeviceStats.from_pools([pool(1, 0), pool(1, 1)])
    assert not stats.support_requests([req(2, "socket")], None, cells(0))


def test_preferred_draws_local_devices_first() -> None:
    stats = PciDeviceStats.from_pools([pool(4, 1), pool(1, 0)])
    after = stats.apply_requests([req(2, "preferred")], cells(0))
    assert sorted((p["numa_node"], p["count"]) for p in after.pools) == [(1, 3)]


# ------------------------------------------------------------------------ exclusions and mapping
def test_pf_vdpa_and_remote_managed_pools_are_kept_for_requests_that_ask() -> None:
    stats = PciDeviceStats.from_pools([pool(1, dev_type="type-PF"), pool(1, dev_type="vdpa"),
                                       pool(1, dev_type="type-VF", remote_managed="true")])
    assert not stats.support_requests([req()])
    assert stats.support_requests([req(dev_type="type-PF")])
    assert stats.support_requests([req(dev_type="vdpa")])
    assert stats.support_requests([req(remote_managed="true")])


def test_mapped_providers_restrict_the_pools() -> None:
    stats = PciDeviceStats.from_pools([pool(1, rp_uuid="rp-a"), pool(1, rp_uuid="rp-b")])
    request = req(1, request_id="r1")
    assert stats.support_requests([request], {"r1-0": ["rp-b"]})
    assert not stats.support_requests([req(2, request_id="r1")], {"r1-0": ["rp-b"]})
    assert stats.support_requests([req(2, request_id="r1")], {"other": ["rp-b"]})
    # Without a mapping the spec's rp_uuids (comma-joined) restrict instead.
    spec_rp = InstancePCIRequest(2, [{"vendor_id": "8086", "rp_uuids": "rp-a"}])
    assert not stats.support_requests([spec_rp])


def test_live_migratable_requests_match_the_pool_tag() -> None:
    """As Nova 34 (a differential run found a request for non-live-migratable devices
    served from an untagged pool, where Nova finds none): the tag is matched as any
    key, so a pool without it serves neither value."""
    stats = PciDeviceStats.from_pools([pool(1, live_migratable="true"), pool(1)])
    assert not stats.support_requests([req(2, live_migratable="true")])
    assert stats.support_requests([req(1, live_migratable="yes")])
    assert not stats.support_requests([req(1, live_migratable="false")])
    assert stats.support_requests([req(2)])
    tagged = PciDeviceStats.from_pools([pool(1, live_migratable="false"), pool(1)])
    assert tagged.support_requests([req(1, live_migratable="false")])
    assert not tagged.support_requests([req(2, live_migratable="false")])


# ------------------------------------------------------------------------ consumption
def test_apply_requests_returns_new_stats_with_counts_decremented() -> None:
    stats = PciDeviceStats.from_pools([pool(2, 0), pool(1, 1, product_id="1521")])
    after = stats.apply_requests(InstancePCIRequests([req(1), req(1, product_id="1521")]))
    assert after is not stats and stats.free_count() == 3
    assert after.free_count() == 1 and after.pools == [pool(1, 0, dev_type="type-PCI")]


def test_apply_requests_raises_when_the_pools_cannot_serve() -> None:
    with pytest.raises(PciRequestFailed):
        PciDeviceStats.from_pools([pool(1)]).apply_requests([req(2)])


def test_equal_pools_are_equal_stats() -> None:
    assert PciDeviceStats.from_pools([pool()]) == PciDeviceStats.from_pools([pool()])
    assert hash(PciDeviceStats.from_pools([pool()])) == hash(PciDeviceStats.from_pools([pool()]))
    assert PciDeviceStats.from_pools([pool(1)]) != PciDeviceStats.from_pools([pool(2)])


@pytest.mark.parametrize(
    ("pools", "field"),
    [([{"vendor_id": "8086"}], "[0].count"), ([pool(-1)], "[0].count"),
     ([pool(node="zero")], "[0].numa_node"), ([pool(), "x"], "[1]"),
     ([pool(vendor_id=8086)], "[0].vendor_id")],
    ids=["a pool without a count", "a negative count", "a NUMA node that is not a number",
         "a pool that is not a mapping", "a vendor id that is not a string"],
)
def test_bad_pools_name_the_field(pools: list[Any], field: str) -> None:
    with pytest.raises((TypeError, ValueError)) as err:
        PciDeviceStats.from_pools(pools)
    assert str(err.value).startswith(field)


# ------------------------------------------------------------------------ aliases
GPU = '{"name": "gpu", "vendor_id": "10de", "product_id": "1eb8", "device_type": "type-PCI"}'


def config(*aliases: str) -> SchedulerConfig:
    return SchedulerConfig.from_dict({"pci": {"alias": list(aliases)}})


def flavor(alias: str, **extra: str) -> Flavor:
    return Flavor("f", 2, 1024, extra_specs={"pci_passthrough:alias": alias, **extra})


def test_alias_definitions_with_one_name_add_specs() -> None:
    aliases = parse_aliases([GPU, '{"name": "gpu", "vendor_id": "10de", "product_id": "2236", '
                                  '"device_type": "type-PCI", "numa_policy": "legacy"}'])
    policy, specs = aliases["gpu"]
    assert policy == "legacy"
    assert [s["product_id"] for s in specs] == ["1eb8", "2236"]
    assert specs[0]["dev_type"] == "type-PCI" and "device_type" not in specs[0]


@pytest.mark.parametrize(
    "alias",
    ["{not json", '["gpu"]', '{"vendor_id": "10de"}', '{"name": "g", "colour": "red"}',
     '{"name": "g", "vendor_id": "10dex"}', '{"name": "g", "numa_policy": "nearby"}',
     '{"name": "g", "device_type": "type-GPU"}', '{"name": "g", "vendor_id": 4318}'],
    ids=["bad JSON", "not an object", "no name", "an unknown key", "a vendor id that is not hex",
         "an unknown NUMA policy", "an unknown device type", "a number instead of a string"],
)
def test_bad_alias_definitions_are_config_errors(alias: str) -> None:
    with pytest.raises(ConfigError, match=r"\[pci\] alias #1"):
        parse_aliases([alias])


def test_redefining_an_alias_with_another_policy_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="numa_policy"):
        parse_aliases([GPU, '{"name": "gpu", "vendor_id": "10de", "device_type": "type-PCI", '
                            '"numa_policy": "required"}'])


def test_flavor_alias_becomes_one_request_per_name() -> None:
    nic = '{"name": "nic", "vendor_id": "8086", "numa_policy": "required"}'
    reqs = pci_requests_from_flavor(flavor("gpu:2, nic:1"), config(GPU, nic))
    assert [(r.alias_name, r.count, r.numa_policy) for r in reqs.requests] == [
        ("gpu", 2, "legacy"), ("nic", 1, "required")]
    assert len({r.request_id for r in reqs.requests}) == 2


def test_flavor_or_image_numa_affinity_policy_overrides_the_alias() -> None:
    reqs = pci_requests_from_flavor(flavor("gpu:1", **{"hw:pci_numa_affinity_policy": "preferred"}),
                                    config(GPU))
    assert reqs.requests[0].numa_policy == "preferred"
    reqs = pci_requests_from_flavor(flavor("gpu:1"), config(GPU),
                                    ImageMetaProps({"hw_pci_numa_affinity_policy": "socket"}))
    assert reqs.requests[0].numa_policy == "socket"


def test_no_alias_in_the_flavor_gives_no_requests() -> None:
    assert pci_requests_from_flavor(Flavor("f", 1, 512), config(GPU)).requests == []


@pytest.mark.parametrize(
    ("value", "extra", "message"),
    [("gpu", {}, "expected name:count"), ("gpu:two", {}, "must be an integer"),
     ("gpu:0", {}, ">= 1"), ("fpga:1", {}, "not defined"), ("gpu:1:2", {}, "expected name:count"),
     ("gpu:1", {"hw:pci_numa_affinity_policy": "close"}, "must be one of")],
    ids=["a name without a count", "a count that is not a number", "a zero count",
         "an alias that is not configured", "two colons", "an unknown affinity policy"],
)
def test_bad_flavor_aliases_are_extra_spec_errors(value: str, extra: dict[str, str], message: str) -> None:
    with pytest.raises(ExtraSpecError, match=message):
        pci_requests_from_flavor(flavor(value, **extra), config(GPU))


def test_flavor_and_image_affinity_policies_must_agree() -> None:
    with pytest.raises(ExtraSpecError, match="hw_pci_numa_affinity_policy"):
        pci_requests_from_flavor(flavor("gpu:1", **{"hw:pci_numa_affinity_policy": "required"}),
                                 config(GPU), ImageMetaProps({"hw_pci_numa_affinity_policy": "socket"}))


def test_affinity_policies_are_checked_without_an_alias_too() -> None:
    """Nova's API checks them for every boot (found by a differential run against Nova
    34: Berth scheduled a boot whose flavor and image policies conflict)."""
    plain = Flavor("f", 1, 512, extra_specs={"hw:pci_numa_affinity_policy": "socket"})
    with pytest.raises(ExtraSpecError, match="conflicts with the flavor"):
        pci_requests_from_flavor(plain, config(GPU),
                                 ImageMetaProps({"hw_pci_numa_affinity_policy": "required"}))
    bad = Flavor("f", 1, 512, extra_specs={"hw:pci_numa_affinity_policy": "close"})
    with pytest.raises(ExtraSpecError, match="must be one of"):
        pci_requests_from_flavor(bad, config(GPU))
    assert pci_requests_from_flavor(plain, config(GPU)).requests == []


def test_placement_allocation_is_followed_device_by_device() -> None:
    stats = PciDeviceStats.from_pools([pool(2, rp_uuid="rp-a"), pool(1, rp_uuid="rp-b"), pool(5)])
    mapping = {"r1-0": ["rp-a"], "r1-1": ["rp-b"], "": ["root"]}
    after = stats.apply_requests([req(2, request_id="r1")], None, mapping)
    # (Nova's order: pools by how many keys they have, the untagged one first.)
    assert [(p.get("rp_uuid"), p["count"]) for p in after.pools] == [(None, 5), ("rp-a", 1)]
    # A pool cannot give more than it holds of what placement allocated from it.
    two_from_b = {"r1-0": ["rp-b"], "r1-1": ["rp-b"]}
    assert not stats.support_requests([req(2, request_id="r1")], two_from_b)



def test_pools_are_ordered_and_taken_from_as_nova_orders_them() -> None:
    """Nova's PciDeviceStats sorts its pools by how many keys each has: an untagged pool
    gives its devices before one tagged with a provider. A differential run against Nova
    34 found Berth taking the tagged one (and then a port's request mapped to it had
    none left)."""
    stats = PciDeviceStats.from_pools([pool(1, rp_uuid="RP1"), pool(1)])
    assert [p.get("rp_uuid") for p in stats.pools] == [None, "RP1"]
    after = stats.apply_requests([req(1)])
    assert [(p.get("rp_uuid"), p["count"]) for p in after.pools] == [("RP1", 1)]
