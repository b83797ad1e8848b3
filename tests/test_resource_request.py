"""The placement query built from a request spec (reference §8.5)."""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berth.config import SchedulerConfig
from berth.errors import ExtraSpecError, ImagePropertyError, InputError, NoValidHost
from berth.hardware.numa import numa_topology_from_request
from berth.model.request import Destination, Flavor, ImageMeta, RequestSpec
from berth.resource_request import (
    NodeRef,
    RequestGroup,
    RequestLevelParams,
    from_request_spec,
    nodes_from_rows,
    resources_from_request_spec,
)

CONFIG = SchedulerConfig.default()
HYPERTHREADING = "HW_CPU_HYPERTHREADING"
NODES = nodes_from_rows([("u1", "host1", "node1"), ("u2", "host2", "node2a"),
                         ("u3", "host2", "node2b")])


def _spec(vcpus: int = 2, memory_mb: int = 2048, root_gb: int = 20, ephemeral_gb: int = 0,
          swap: int = 0, extra_specs: dict[str, str] | None = None,
          image: dict[str, object] | None = None, **kw: object) -> RequestSpec:
    flavor = Flavor(name="f", vcpus=vcpus, memory_mb=memory_mb, root_gb=root_gb,
                    ephemeral_gb=ephemeral_gb, swap=swap, extra_specs=dict(extra_specs or {}))
    return RequestSpec(flavor=flavor, image=ImageMeta(properties=image or {}) if image is not None
                       else None, **kw)  # type: ignore[arg-type]


def _query(spec: RequestSpec, config: SchedulerConfig = CONFIG, pin: bool = True) -> list[tuple[str, str]]:
    return resources_from_request_spec(spec, config, NODES, pin).to_queryparams()


def test_flavor_basics_become_the_unsuffixed_group_with_the_default_limit() -> None:
    assert _query(_spec()) == [("limit", "1000"), ("resources", "DISK_GB:20,MEMORY_MB:2048,VCPU:2")]


def test_querystring_is_sorted_and_urlencoded() -> None:
    spec = _spec(extra_specs={"trait:HW_CPU_X86_AVX2": "required", "trait:CUSTOM_X": "forbidden"})
    qs = resources_from_request_spec(spec, CONFIG, NODES).to_querystring()
    assert qs == ("limit=1000&required=HW_CPU_X86_AVX2%2C%21CUSTOM_X"
                  "&resources=DISK_GB%3A20%2CMEMORY_MB%3A2048%2CVCPU%3A2")
    assert urllib.parse.parse_qsl(qs) == sorted(urllib.parse.parse_qsl(qs))


def test_disk_counts_ephemeral_and_swap_rounded_up_to_gb() -> None:
    groups = from_request_spec(_spec(root_gb=10, ephemeral_gb=5, swap=1025)).groups
    assert groups[""].resources["DISK_GB"] == 10 + 5 + 2


def test_boot_from_volume_leaves_root_disk_out_and_zero_disk_is_stripped() -> None:
    assert from_request_spec(_spec(root_gb=10, ephemeral_gb=1, is_bfv=True)).groups[""].resources[
        "DISK_GB"] == 1
    assert "DISK_GB" not in from_request_spec(_spec(root_gb=10, is_bfv=True)).groups[""].resources


def test_extra_spec_resources_override_the_flavor_basics() -> None:
    req = from_request_spec(_spec(extra_specs={"resources:VCPU": "0", "resources:MEMORY_MB": "512",
                                               "resources:CUSTOM_GPU": "1"}))
    # resources:VCPU=0 suppresses the flavor's VCPU and is then stripped as a zero.
    assert req.groups[""].resources == {"MEMORY_MB": 512, "CUSTOM_GPU": 1, "DISK_GB": 20}


def test_suffixed_resources_and_traits_make_granular_groups() -> None:
    req = from_request_spec(_spec(extra_specs={
        "resources1:SRIOV_NET_VF": "1", "trait1:CUSTOM_PHYSNET_A": "required",
        "resources_gpu:VGPU": "2", "trait_gpu:CUSTOM_SLOW": "forbidden", "group_policy": "isolate"}))
    assert req.groups["1"].resources == {"SRIOV_NET_VF": 1}
    assert req.groups["1"].required_traits == {"CUSTOM_PHYSNET_A"}
    assert req.groups["_gpu"].forbidden_traits == {"CUSTOM_SLOW"}
    assert req.group_policy == "isolate"
    params = req.to_queryparams()
    assert ("resources_gpu", "VGPU:2") in params and ("required1", "CUSTOM_PHYSNET_A") in params


@pytest.mark.parametrize("key, value", [
    ("resources:NOT_A_CLASS", "1"),
    ("resources:VCPU", "-1"),
    ("resources:VCPU", "two"),
    ("trait:HW_CPU_X86_AVX2", "preferred"),
], ids=["an unknown resource class is ignored", "a negative amount is ignored",
        "a non-integer amount is ignored", "a trait value other than required/forbidden is ignored"])
def test_bad_extra_specs_are_ignored(key: str, value: str) -> None:
    req = from_request_spec(_spec(extra_specs={key: value}))
    assert req.groups[""].resources == {"VCPU": 2, "MEMORY_MB": 2048, "DISK_GB": 20}
    assert not req.groups[""].required_traits


@pytest.mark.parametrize("key", ["resources:CUSTOM_foo", "resources1:CUSTOM_"],
                         ids=["a lower-case custom class", "a custom class with no name"])
def test_a_malformed_custom_resource_class_is_an_error_naming_the_key(key: str) -> None:
    # Nova would send it on and placement would answer 400 (a bare NoValidHost).
    with pytest.raises(ExtraSpecError, match=f"^{key}: "):
        from_request_spec(_spec(extra_specs={key: "1"}))


def test_image_traits_required_go_to_the_unsuffixed_group() -> None:
    req = from_request_spec(_spec(image={"traits_required": ["HW_CPU_X86_SSE42", "CUSTOM_A"]}))
    assert req.groups[""].required_traits == {"HW_CPU_X86_SSE42", "CUSTOM_A"}


def test_dedicated_cpu_policy_asks_for_pcpu_instead_of_vcpu() -> None:
    req = from_request_spec(_spec(vcpus=4, extra_specs={"hw:cpu_policy": "dedicated"}))
    assert req.groups[""].resources == {"PCPU": 4, "MEMORY_MB": 2048, "DISK_GB": 20}
    assert req.cpu_pinning_requested


def test_image_dedicated_policy_is_translated_too() -> None:
    req = from_request_spec(_spec(vcpus=2, image={"hw_cpu_policy": "dedicated"}))
    assert req.groups[""].resources["PCPU"] == 2 and "VCPU" not in req.groups[""].resources


def test_emulator_threads_isolate_adds_one_pcpu() -> None:
    req = from_request_spec(_spec(vcpus=4, extra_specs={
        "hw:cpu_policy": "dedicated", "hw:emulator_threads_policy": "isolate"}))
    assert req.groups[""].resources["PCPU"] == 5


def test_mixed_policy_splits_vcpu_and_pcpu_by_the_dedicated_mask() -> None:
    req = from_request_spec(_spec(vcpus=4, extra_specs={
        "hw:cpu_policy": "mixed", "hw:cpu_dedicated_mask": "^0"}))
    assert req.groups[""].resources["PCPU"] == 3 and req.groups[""].resources["VCPU"] == 1


def test_mixed_policy_without_a_mask_is_a_clear_error() -> None:
    with pytest.raises(ExtraSpecError, match="hw:cpu_dedicated_mask"):
        from_request_spec(_spec(vcpus=4, extra_specs={"hw:cpu_policy": "mixed"}))


def test_mixed_policy_takes_the_realtime_vcpus_with_the_image_mask_winning() -> None:
    req = from_request_spec(_spec(vcpus=4, extra_specs={
        "hw:cpu_policy": "mixed", "hw:cpu_realtime": "yes", "hw:cpu_realtime_mask": "^0"},
        image={"hw_cpu_realtime_mask": "^0-1"}))
    # The image's ^0-1 leaves vCPUs 2 and 3 realtime (the flavor's ^0 would leave three).
    assert req.groups[""].resources["PCPU"] == 2 and req.groups[""].resources["VCPU"] == 2


def test_a_realtime_mask_without_hw_cpu_realtime_gives_a_mixed_instance_no_pcpus() -> None:
    with pytest.raises(ExtraSpecError, match="hw:cpu_dedicated_mask"):
        from_request_spec(_spec(vcpus=4, extra_specs={
            "hw:cpu_policy": "mixed", "hw:cpu_realtime_mask": "^0"}))


def test_mixed_policy_with_isolated_emulator_threads_adds_one_pcpu() -> None:
    req = from_request_spec(_spec(vcpus=4, extra_specs={
        "hw:cpu_policy": "mixed", "hw:cpu_dedicated_mask": "2-3",
        "hw:emulator_threads_policy": "isolate"}))
    assert req.groups[""].resources["PCPU"] == 2 + 1 and req.groups[""].resources["VCPU"] == 2


def test_only_dedicated_counts_as_pinning_requested_so_mixed_gets_no_fallback_query() -> None:
    mixed = from_request_spec(_spec(vcpus=4, extra_specs={
        "hw:cpu_policy": "mixed", "hw:cpu_dedicated_mask": "2-3"}))
    assert not mixed.cpu_pinning_requested


def test_the_emulator_threads_policy_is_read_from_the_flavor_only() -> None:
    req = from_request_spec(_spec(vcpus=4, extra_specs={"hw:cpu_policy": "dedicated"},
                                  image={"hw_emulator_threads_policy": "isolate"}))
    assert req.groups[""].resources["PCPU"] == 4


def test_the_image_cannot_ask_for_mixed_cpus_when_the_flavor_says_shared() -> None:
    with pytest.raises(ImagePropertyError, match="hw_cpu_policy: .*got 'mixed'"):
        from_request_spec(_spec(extra_specs={"hw:cpu_policy": "shared"},
                                image={"hw_cpu_policy": "mixed"}))


def test_vpmem_labels_become_pmem_namespace_resources_counted_per_label() -> None:
    req = from_request_spec(_spec(extra_specs={
        "hw:pmem": "small, small,large-1,", "resources:CUSTOM_PMEM_NAMESPACE_SMALL": "5"}))
    # The translation comes after the extra specs and replaces their amount.
    assert req.groups[""].resources == {
        "VCPU": 2, "MEMORY_MB": 2048, "DISK_GB": 20,
        "CUSTOM_PMEM_NAMESPACE_SMALL": 2, "CUSTOM_PMEM_NAMESPACE_LARGE_1": 1}


@pytest.mark.parametrize("policy, required, forbidden", [
    ("isolate", set(), {"HW_CPU_HYPERTHREADING"}),
    ("require", {"HW_CPU_HYPERTHREADING"}, set()),
    ("prefer", set(), set()),
], ids=["thread policy isolate forbids hyperthreading",
        "thread policy require requires hyperthreading", "thread policy prefer adds nothing"])
def test_thread_policy_translates_to_the_hyperthreading_trait(
        policy: str, required: set[str], forbidden: set[str]) -> None:
    group = from_request_spec(_spec(extra_specs={"hw:cpu_policy": "dedicated",
                                                 "hw:cpu_thread_policy": policy})).groups[""]
    assert group.required_traits == required and group.forbidden_traits == forbidden


def test_without_pinning_translation_dedicated_cpus_are_asked_as_vcpu() -> None:
    req = from_request_spec(_spec(vcpus=4, extra_specs={"hw:cpu_policy": "dedicated"}),
                            enable_pinning_translate=False)
    assert req.groups[""].resources["VCPU"] == 4 and not req.cpu_pinning_requested


def test_image_cannot_ask_for_dedicated_cpus_when_the_flavor_says_shared() -> None:
    with pytest.raises(ImagePropertyError, match="hw_cpu_policy"):
        from_request_spec(_spec(extra_specs={"hw:cpu_policy": "shared"},
                                image={"hw_cpu_policy": "dedicated"}))


def test_a_malformed_dedicated_mask_is_an_error_naming_the_key() -> None:
    with pytest.raises(ExtraSpecError, match="hw:cpu_dedicated_mask='x-1'"):
        from_request_spec(_spec(vcpus=4, extra_specs={"hw:cpu_policy": "mixed",
                                                      "hw:cpu_dedicated_mask": "x-1"}))


def test_aggregates_become_member_of_and_forbidden_aggregates_not_in() -> None:
    spec = _spec(requested_destination=Destination(aggregates=["a,b", "c"],
                                                   forbidden_aggregates={"z", "y"}))
    params = _query(spec)
    assert ("member_of", "in:a,b") in params and ("member_of", "in:c") in params
    assert ("member_of", "!in:y,z") in params


def test_a_forced_host_with_one_node_sets_in_tree_and_the_destination() -> None:
    spec = _spec(force_hosts=["host1"])
    params = _query(spec)
    assert ("in_tree", "u1") in params and ("limit", "1000") in params
    assert spec.requested_destination is not None
    assert (spec.requested_destination.host, spec.requested_destination.node) == ("host1", "node1")


def test_a_host_with_several_nodes_drops_the_limit_instead() -> None:
    params = _query(_spec(force_hosts=["host2"]))
    assert not any(k in ("in_tree", "limit") for k, _ in params)


def test_requested_node_wins_over_forced_nodes() -> None:
    spec = _spec(requested_destination=Destination(host="host2", node="node2b"),
                 force_nodes=["node2a"])
    assert ("in_tree", "u3") in _query(spec)


def test_an_unknown_host_is_no_valid_host_naming_host_and_node() -> None:
    with pytest.raises(NoValidHost, match="No such host - host: nohost node: None"):
        _query(_spec(force_hosts=["nohost"]))


@pytest.mark.parametrize("hint", ["group", "same_host", "different_host"])
def test_group_and_host_hints_drop_the_limit(hint: str) -> None:
    params = _query(_spec(scheduler_hints={hint: "x"}))
    assert "limit" not in dict(params)


def test_max_placement_results_is_the_limit() -> None:
    config = CONFIG.replace("scheduler", max_placement_results=7)
    assert ("limit", "7") in _query(_spec(), config)


def test_group_policy_defaults_to_none_with_two_external_suffixed_groups() -> None:
    spec = _spec(requested_resources=[
        RequestGroup(requester_id="port-a", resources={"NET_BW_EGR_KILOBIT_PER_SEC": 10}),
        RequestGroup(requester_id="port-b", resources={"NET_BW_EGR_KILOBIT_PER_SEC": 20})])
    req = from_request_spec(spec)
    assert req.group_policy == "none"
    assert ("resourcesport-a", "NET_BW_EGR_KILOBIT_PER_SEC:10") in req.to_queryparams()


@pytest.mark.parametrize("requester_id", ["", "1"],
                         ids=["a group without a requester id", "a requester id the flavor uses"])
def test_an_external_group_must_have_its_own_suffix(requester_id: str) -> None:
    spec = _spec(extra_specs={"resources1:CUSTOM_A": "1"},
                 requested_resources=[RequestGroup(requester_id=requester_id,
                                                   resources={"CUSTOM_BW": 10})])
    with pytest.raises(InputError, match="requested_resources: .*requester"):
        from_request_spec(spec)


def test_an_invalid_group_policy_is_ignored() -> None:
    req = from_request_spec(_spec(extra_specs={"group_policy": "bogus"}))
    assert req.group_policy is None
    assert "group_policy" not in dict(req.to_queryparams())


def test_an_ignored_group_policy_still_gets_the_none_default_for_external_groups() -> None:
    spec = _spec(extra_specs={"group_policy": "bogus", "resources1:VGPU": "1"},
                 requested_resources=[RequestGroup(requester_id="port-a",
                                                   resources={"NET_BW_EGR_KILOBIT_PER_SEC": 10})])
    assert from_request_spec(spec).group_policy == "none"


def test_group_policy_is_not_defaulted_with_two_flavor_groups() -> None:
    req = from_request_spec(_spec(extra_specs={"resources1:VGPU": "1", "resources2:VGPU": "1"}))
    assert req.group_policy is None


def test_flavor_groups_count_for_the_group_policy_default_before_zeros_are_stripped() -> None:
    # As in Nova: the flavor named groups 1 and 2, so it should have set a group_policy,
    # even though group 2 asks for nothing and is dropped from the query.
    spec = _spec(extra_specs={"resources1:CUSTOM_A": "1", "resources2:CUSTOM_B": "0"},
                 requested_resources=[RequestGroup(requester_id="port1",
                                                   resources={"CUSTOM_BW": 10})])
    req = from_request_spec(spec)
    assert set(req.groups) == {"", "1", "port1"} and req.group_policy is None


def test_root_required_forbidden_and_same_subtree_are_request_level() -> None:
    params = RequestLevelParams(root_required={"B", "A"}, root_forbidden={"C"},
                                same_subtree=[["_b", "_a"]])
    query = _query(_spec(request_level_params=params))
    assert ("root_required", "A,B,!C") in query and ("same_subtree", "_a,_b") in query


def test_other_translations_add_their_traits() -> None:
    group = from_request_spec(_spec(extra_specs={
        "hw:tpm_version": "2.0", "hw:tpm_model": "tpm-crb", "hw:maxphysaddr_mode": "passthrough",
        "hw:mem_encryption": "true", "hw:pci_numa_affinity_policy": "socket"},
        image={"os_secure_boot": "required", "hw_firmware_stateless": True,
               "hw_firmware_type": "uefi"})).groups[""]
    assert group.required_traits >= {
        "COMPUTE_SECURITY_TPM_2_0", "COMPUTE_SECURITY_TPM_CRB",
        "COMPUTE_ADDRESS_SPACE_PASSTHROUGH", "HW_CPU_X86_AMD_SEV",
        "COMPUTE_SOCKET_PCI_NUMA_AFFINITY", "COMPUTE_SECURITY_UEFI_SECURE_BOOT",
        "COMPUTE_SECURITY_STATELESS_FIRMWARE"}
    assert group.resources["MEM_ENCRYPTION_CONTEXT"] == 1


def test_node_lookup_matches_host_and_node_exactly() -> None:
    assert NODES("host2", None) == [NodeRef("u2", "host2", "node2a"), NodeRef("u3", "host2", "node2b")]
    assert NODES(None, "node1") == [NodeRef("u1", "host1", "node1")]
    assert NODES("HOST1", None) == []


@settings(max_examples=60, deadline=None)
@given(vcpus=st.integers(1, 16), memory=st.integers(1, 65536), root=st.integers(0, 100),
       ephemeral=st.integers(0, 50), swap=st.integers(0, 5000), bfv=st.booleans(),
       policy=st.sampled_from([None, "shared", "dedicated"]),
       emulator=st.sampled_from([None, "share", "isolate"]), pin=st.booleans())
def test_cpu_amounts_and_querystring_invariants(vcpus: int, memory: int, root: int, ephemeral: int,
                                               swap: int, bfv: bool, policy: str | None,
                                               emulator: str | None, pin: bool) -> None:
    extra = {}
    if policy:
        extra["hw:cpu_policy"] = policy
    if emulator:
        extra["hw:emulator_threads_policy"] = emulator
    spec = _spec(vcpus=vcpus, memory_mb=memory, root_gb=root, ephemeral_gb=ephemeral, swap=swap,
                 extra_specs=extra, is_bfv=bfv)
    req = from_request_spec(spec, enable_pinning_translate=pin)
    res = req.groups[""].resources
    assert all(n > 0 for n in res.values())
    if pin and policy == "dedicated":
        assert "VCPU" not in res and res["PCPU"] == vcpus + (emulator == "isolate")
    else:
        assert "PCPU" not in res and res["VCPU"] == vcpus
    disk = ephemeral + -(-swap // 1024) + (0 if bfv else root)
    assert res.get("DISK_GB", 0) == disk
    params = req.to_queryparams()
    assert params == sorted(params)
    assert urllib.parse.parse_qsl(req.to_querystring()) == params


_MASKS = st.sampled_from([None, "^0", "^0-1", "0", "1-2", "2-3"])


@settings(max_examples=300, deadline=None)
@given(vcpus=st.integers(1, 6),
       policy=st.sampled_from([None, "shared", "dedicated", "mixed"]),
       image_policy=st.sampled_from([None, "shared", "dedicated", "mixed"]),
       thread=st.sampled_from([None, "prefer", "isolate", "require"]),
       image_thread=st.sampled_from([None, "isolate", "require"]),
       emulator=st.sampled_from([None, "share", "isolate"]),
       image_emulator=st.sampled_from([None, "isolate"]),
       realtime=st.sampled_from([None, "yes", "no"]),
       rt_mask=_MASKS, image_rt_mask=_MASKS, dedicated_mask=_MASKS)
def test_the_query_and_the_guest_numa_topology_pin_the_same_vcpus(
        vcpus: int, policy: str | None, image_policy: str | None, thread: str | None,
        image_thread: str | None, emulator: str | None, image_emulator: str | None,
        realtime: str | None, rt_mask: str | None, image_rt_mask: str | None,
        dedicated_mask: str | None) -> None:
    extra = {k: v for k, v in {
        "hw:cpu_policy": policy, "hw:cpu_thread_policy": thread,
        "hw:emulator_threads_policy": emulator, "hw:cpu_realtime": realtime,
        "hw:cpu_realtime_mask": rt_mask, "hw:cpu_dedicated_mask": dedicated_mask}.items() if v}
    image = {k: v for k, v in {
        "hw_cpu_policy": image_policy, "hw_cpu_thread_policy": image_thread,
        "hw_emulator_threads_policy": image_emulator,
        "hw_cpu_realtime_mask": image_rt_mask}.items() if v}
    spec = _spec(vcpus=vcpus, extra_specs=extra, image=image)
    try:
        topology = numa_topology_from_request(spec.flavor, spec.image.properties)  # type: ignore[union-attr]
    except (ExtraSpecError, ImagePropertyError):
        return  # Rejected up front (Nova's API); the query need not agree on bad input.
    # Whatever the NUMA code accepts, the query accepts, with the same pinned vCPUs.
    group = from_request_spec(spec).groups[""]
    if topology is None or not topology.cpu_pinning_requested:
        assert "PCPU" not in group.resources and group.resources["VCPU"] == vcpus
        assert HYPERTHREADING not in group.required_traits | group.forbidden_traits
        return
    pinned = sum(len(cell.pcpuset) for cell in topology.cells)
    floating = sum(len(cell.cpuset) for cell in topology.cells)
    assert group.resources["PCPU"] == pinned + topology.emulator_threads_isolated
    assert group.resources.get("VCPU", 0) == floating
    thread_policy = topology.cells[0].cpu_thread_policy
    assert (HYPERTHREADING in group.forbidden_traits) == (thread_policy == "isolate")
    assert (HYPERTHREADING in group.required_traits) == (thread_policy == "require")


@pytest.mark.parametrize("model, trait", [
    ("amd-sev", "HW_CPU_X86_AMD_SEV"), ("amd-sev-es", "HW_CPU_X86_AMD_SEV_ES"),
    ("amd-sev-snp", "HW_CPU_X86_AMD_SEV_SNP"), ("intel-tdx", "HW_CPU_X86_INTEL_TDX"),
])
def test_every_memory_encryption_model_of_nova_34_requires_its_trait(model: str, trait: str) -> None:
    """Nova 34's four models (``MemEncryptionModel``), from the flavor and the image, on
    an image each model can boot (UEFI; stateless firmware; no video device for TDX)."""
    bootable = {"hw_firmware_type": "uefi", "hw_firmware_stateless": True,
                "hw_video_model": "none"}
    by_flavor = from_request_spec(_spec(extra_specs={
        "hw:mem_encryption": "true", "hw:mem_encryption_model": model},
        image=bootable)).groups[""]
    by_image = from_request_spec(_spec(image={
        "hw_mem_encryption": True, "hw_mem_encryption_model": model, **bootable})).groups[""]
    for group in (by_flavor, by_image):
        assert trait in group.required_traits
        assert group.resources["MEM_ENCRYPTION_CONTEXT"] == 1



@pytest.mark.parametrize(("extra_specs", "image", "message"), [
    ({"hw:mem_encryption": "true"}, {}, "image property hw_firmware_type: memory encryption "
     "is requested by hw:mem_encryption extra spec in f flavor: the image must set 'uefi'"),
    ({}, {"hw_mem_encryption": True, "hw_firmware_type": "bios"},
     "hw_firmware_type: memory encryption is requested by hw_mem_encryption property of image"),
    ({"hw:mem_encryption": "false"}, {"hw_mem_encryption": True, "hw_firmware_type": "uefi"},
     "hw_mem_encryption: the flavor's hw:mem_encryption is 'false'; the flavor and the image "
     "conflict"),
    ({"hw:mem_encryption": "true"}, {"hw_firmware_type": "uefi", "hw_machine_type": "pc"},
     "hw_machine_type: q35 type is required for amd-sev to work"),
    ({"hw:mem_encryption": "true", "hw:mem_encryption_model": "amd-sev-snp"},
     {"hw_firmware_type": "uefi"}, "hw_firmware_stateless: the amd-sev-snp memory encryption "
     "model requires stateless firmware"),
    ({"hw:mem_encryption": "true", "hw:mem_encryption_model": "intel-tdx"},
     {"hw_firmware_type": "uefi", "hw_firmware_stateless": True},
     "hw_video_model: the intel-tdx memory encryption model is incompatible with an attached "
     "video device"),
], ids=["flavor asks, no UEFI image", "image asks, BIOS", "flavor says no, image yes",
        "machine type not q35", "SNP without stateless firmware", "TDX with video"])
def test_memory_encryption_refuses_what_nova_refuses(
        extra_specs: dict[str, str], image: dict[str, Any], message: str) -> None:
    """Nova's get_mem_encryption_constraint (its API refuses the boot; its scheduler's
    ResourceRequest raises): FlavorImageConflict, InvalidMachineType,
    StatelessFirmwareRequired, InvalidVideoMode. Berth asked placement for the context."""
    with pytest.raises(ImagePropertyError, match=re.escape(message)):
        from_request_spec(_spec(extra_specs=extra_specs, image=image))


def test_flavor_and_image_resolve_as_nova_34_does() -> None:
    """Read off Nova 34's ResourceRequest in its own environment (a differential run of
    3,000 random requests): stateless firmware counts on a UEFI image only; hw:pmem
    labels count per class once normalized; a flavor and an image that set one value
    differently, an unknown value, or CRB with TPM 1.2 are refused."""
    def group(**kw: Any) -> RequestGroup:
        return from_request_spec(_spec(**kw)).groups[""]

    assert "COMPUTE_SECURITY_STATELESS_FIRMWARE" not in group(
        image={"hw_firmware_stateless": True}).required_traits
    assert "COMPUTE_SECURITY_STATELESS_FIRMWARE" in group(
        image={"hw_firmware_stateless": True, "hw_firmware_type": "uefi"}).required_traits
    assert group(extra_specs={"hw:pmem": "small,SMALL"}).resources[
        "CUSTOM_PMEM_NAMESPACE_SMALL"] == 2
    # The same value on both sides is fine, and the image alone is read.
    assert {"COMPUTE_SECURITY_TPM_2_0", "COMPUTE_SECURITY_TPM_CRB"} <= group(
        extra_specs={"hw:tpm_version": "2.0"},
        image={"hw_tpm_version": "2.0", "hw_tpm_model": "tpm-crb"}).required_traits
    for extra, image, error, text in (
            ({"hw:tpm_version": "1.2"}, {"hw_tpm_version": "2.0"}, ImagePropertyError,
             "image property hw_tpm_version: conflicts with the flavor's hw:tpm_version '1.2'"),
            ({"os:secure_boot": "required"}, {"os_secure_boot": "disabled"}, ImagePropertyError,
             "os_secure_boot: conflicts"),
            ({"hw:maxphysaddr_mode": "emulate"}, {"hw_maxphysaddr_mode": "passthrough"},
             ImagePropertyError, "hw_maxphysaddr_mode: conflicts"),
            ({"hw:pci_numa_affinity_policy": "required"},
             {"hw_pci_numa_affinity_policy": "socket"}, ImagePropertyError,
             "ImagePCINUMAPolicyForbidden"),
            ({"hw:tpm_version": "1.2", "hw:tpm_model": "tpm-crb"}, {}, ExtraSpecError,
             "CRB is only valid with TPM version 2.0"),
            ({"hw:tpm_version": "3.0"}, {}, ExtraSpecError, "invalid TPM version"),
            ({"os:secure_boot": "bogus"}, {}, ExtraSpecError, "invalid secure boot policy"),
            ({"hw:pci_numa_affinity_policy": "bogus"}, {}, ExtraSpecError,
             "invalid PCI NUMA affinity policy")):
        with pytest.raises(error, match=text):
            from_request_spec(_spec(extra_specs=extra, image=image))


def test_a_group_of_traits_alone_asks_for_empty_resources_as_nova() -> None:
    """Nova always sends ``resources$S``: a numbered group of traits alone asks for
    ``resources1=`` empty, which Placement refuses (Nova then finds no host), and a group
    left with nothing (all amounts 0) is not sent at all."""
    query = _query(_spec(extra_specs={"trait1:CUSTOM_X": "required"}))
    assert ("resources1", "") in query and ("required1", "CUSTOM_X") in query
    query = _query(_spec(extra_specs={"resources:VCPU": "0", "resources:MEMORY_MB": "0",
                                      "resources:DISK_GB": "0", "resources1:VCPU": "1"}))
    assert [k for k, _ in query if k.startswith("resources")] == ["resources1"]
    from berth.placement.candidates_query import parse_query
    from berth.placement.errors import BadRequest

    with pytest.raises(BadRequest, match="empty string"):
        grouped: dict[str, list[str]] = {}
        for key, value in _query(_spec(extra_specs={"trait1:CUSTOM_X": "required"})):
            grouped.setdefault(key, []).append(value)
        parse_query(grouped, (1, 36))
