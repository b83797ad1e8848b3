"""Parsing a guest NUMA topology from flavor extra specs and image properties."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berth.config import SchedulerConfig
from berth.errors import ExtraSpecError, ImagePropertyError
from berth.hardware.numa import (
    MEMPAGES_ANY,
    MEMPAGES_LARGE,
    MEMPAGES_SMALL,
    format_cpu_spec,
    numa_topology_from_request,
    parse_cpu_spec,
    prepare_request,
)
from berth.hardware.pci import InstancePCIRequests
from berth.model import Flavor, ImageMetaProps
from builders import spec


def specs(vcpus: int = 4, memory_mb: int = 4096, image: dict[str, Any] | None = None,
          extra: dict[str, str] | None = None):
    return numa_topology_from_request(Flavor("f", vcpus, memory_mb, extra_specs=extra or {}),
                                      ImageMetaProps(image or {}))


def test_cpu_spec_parses_ranges_singles_and_exclusions() -> None:
    assert parse_cpu_spec("0-3,^2,8") == {0, 1, 3, 8}
    assert parse_cpu_spec(" 4 , 6-7 ") == {4, 6, 7}
    assert format_cpu_spec({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"


@pytest.mark.parametrize("bad", ["a", "3-1", "1-x", "-2"],
                         ids=["a word", "a reversed range", "a range end that is not a number",
                              "a negative number"])
def test_cpu_spec_rejects_malformed_tokens(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_cpu_spec(bad)


def test_a_plain_flavor_asks_for_no_topology() -> None:
    assert specs() is None
    assert specs(extra={"hw:cpu_policy": "shared"}) is None


def test_persistent_memory_asks_for_a_single_cell_topology() -> None:
    topo = specs(vcpus=2, memory_mb=1024, extra={"hw:pmem": "4GB,4GB"})
    assert topo is not None and len(topo.cells) == 1 and topo.cells[0].cpuset == {0, 1}
    assert specs(extra={"hw:pmem": " , "}) is None


def test_numa_nodes_split_cpus_and_memory_evenly() -> None:
    topo = specs(vcpus=4, memory_mb=4096, extra={"hw:numa_nodes": "2"})
    assert topo is not None
    assert [(c.id, c.cpuset, c.pcpuset, c.memory) for c in topo.cells] == [
        (0, {0, 1}, set(), 2048), (1, {2, 3}, set(), 2048)]
    assert all(c.cpu_policy is None and c.pagesize is None for c in topo.cells)


def test_dedicated_policy_gives_one_cell_of_pinned_cpus() -> None:
    topo = specs(vcpus=2, memory_mb=1024, extra={"hw:cpu_policy": "dedicated"})
    assert topo is not None and len(topo.cells) == 1
    cell = topo.cells[0]
    assert (cell.cpuset, cell.pcpuset, cell.memory, cell.cpu_policy) == (set(), {0, 1}, 1024, "dedicated")


def test_mixed_policy_splits_by_the_dedicated_mask() -> None:
    topo = specs(vcpus=4, extra={"hw:cpu_policy": "mixed", "hw:cpu_dedicated_mask": "^0-1"})
    assert topo is not None
    assert (topo.cells[0].cpuset, topo.cells[0].pcpuset) == ({0, 1}, {2, 3})
    topo = specs(vcpus=4, extra={"hw:cpu_policy": "mixed", "hw:cpu_dedicated_mask": "3"})
    assert topo is not None and topo.cells[0].pcpuset == {3}


def test_manual_cells_take_the_given_cpus_and_memory() -> None:
    topo = specs(vcpus=4, memory_mb=3072, extra={
        "hw:numa_nodes": "2", "hw:numa_cpus.0": "0", "hw:numa_cpus.1": "1-3",
        "hw:numa_mem.0": "1024", "hw:numa_mem.1": "2048"})
    assert topo is not None
    assert [(c.cpuset, c.memory) for c in topo.cells] == [({0}, 1024), ({1, 2, 3}, 2048)]


def test_image_may_give_the_node_layout_when_the_flavor_does_not() -> None:
    topo = specs(vcpus=2, memory_mb=2048, image={
        "hw_numa_nodes": 2, "hw_numa_cpus.0": "0", "hw_numa_cpus.1": "1",
        "hw_numa_mem.0": "1024", "hw_numa_mem.1": "1024"})
    assert topo is not None and [c.cpuset for c in topo.cells] == [{0}, {1}]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("small", MEMPAGES_SMALL), ("large", MEMPAGES_LARGE), ("any", MEMPAGES_ANY),
     ("2048", 2048), ("2MB", 2048), ("1GB", 1048576), ("1GiB", 1048576), ("16Mb", 2048)],
    ids=["small", "large", "any", "a size in KiB", "2MB with a unit", "1GB with a unit",
         "an IEC unit", "a size in bits"],
)
def test_page_size_forms(value: str, expected: int) -> None:
    topo = specs(extra={"hw:mem_page_size": value})
    assert topo is not None and topo.cells[0].pagesize == expected


def test_image_page_size_is_used_when_the_flavor_allows_large_or_any() -> None:
    topo = specs(extra={"hw:mem_page_size": "large"}, image={"hw_mem_page_size": "1GB"})
    assert topo is not None and topo.cells[0].pagesize == 1048576


def test_thread_policy_prefer_in_the_flavor_lets_the_image_choose() -> None:
    topo = specs(extra={"hw:cpu_policy": "dedicated", "hw:cpu_thread_policy": "prefer"},
                 image={"hw_cpu_thread_policy": "isolate"})
    assert topo is not None and topo.cells[0].cpu_thread_policy == "prefer"
    topo = specs(extra={"hw:cpu_policy": "dedicated"}, image={"hw_cpu_thread_policy": "isolate"})
    assert topo is not None and topo.cells[0].cpu_thread_policy == "isolate"


def test_image_dedicated_policy_applies_when_the_flavor_is_silent() -> None:
    topo = specs(image={"hw_cpu_policy": "dedicated"})
    assert topo is not None and topo.cells[0].cpu_policy == "dedicated"


def test_emulator_threads_policy_is_kept_on_the_topology() -> None:
    topo = specs(extra={"hw:cpu_policy": "dedicated", "hw:emulator_threads_policy": "isolate"})
    assert topo is not None and topo.emulator_threads_isolated


@pytest.mark.parametrize(
    ("extra", "image", "key"),
    [
        ({"hw:numa_nodes": "zero"}, {}, "hw:numa_nodes"),
        ({"hw:numa_nodes": "0"}, {}, "hw:numa_nodes"),
        ({"hw:numa_nodes": "3"}, {}, "hw:numa_nodes"),
        ({"hw:numa_nodes": "2"}, {"hw_numa_nodes": "2"}, "hw_numa_nodes"),
        ({"hw:cpu_policy": "pinned"}, {}, "hw:cpu_policy"),
        ({"hw:cpu_policy": "shared"}, {"hw_cpu_policy": "dedicated"}, "hw_cpu_policy"),
        ({"hw:cpu_policy": "mixed", "hw:cpu_dedicated_mask": "0"}, {"hw_cpu_policy": "dedicated"},
         "hw_cpu_policy"),
        ({"hw:cpu_policy": "dedicated", "hw:cpu_thread_policy": "sometimes"}, {}, "hw:cpu_thread_policy"),
        ({"hw:cpu_policy": "dedicated", "hw:cpu_thread_policy": "isolate"},
         {"hw_cpu_thread_policy": "require"}, "hw_cpu_thread_policy"),
        ({"hw:cpu_thread_policy": "isolate"}, {}, "hw:cpu_thread_policy"),
        ({"hw:emulator_threads_policy": "isolate"}, {}, "hw:emulator_threads_policy"),
        ({"hw:emulator_threads_policy": "everywhere"}, {}, "hw:emulator_threads_policy"),
        ({"hw:cpu_policy": "mixed"}, {}, "hw:cpu_policy"),
        ({"hw:cpu_policy": "mixed", "hw:cpu_dedicated_mask": "0-3"}, {}, "hw:cpu_dedicated_mask"),
        ({"hw:cpu_policy": "mixed", "hw:cpu_dedicated_mask": "7"}, {}, "hw:cpu_dedicated_mask"),
        ({"hw:cpu_policy": "dedicated", "hw:cpu_dedicated_mask": "0"}, {}, "hw:cpu_dedicated_mask"),
        ({"hw:mem_page_size": "huge"}, {}, "hw:mem_page_size"),
        ({"hw:mem_page_size": "2mb"}, {}, "hw:mem_page_size"),
        ({"hw:mem_page_size": "512B"}, {}, "hw:mem_page_size"),
        ({}, {"hw_mem_page_size": "2MB"}, "hw_mem_page_size"),
        ({"hw:mem_page_size": "small"}, {"hw_mem_page_size": "2MB"}, "hw_mem_page_size"),
        ({"hw:numa_nodes": "2", "hw:numa_cpus.0": "0-1", "hw:numa_cpus.1": "2-3"}, {},
         "hw:numa_cpus.0"),
        ({"hw:numa_nodes": "2", "hw:numa_cpus.0": "0-1", "hw:numa_cpus.1": "1-3",
          "hw:numa_mem.0": "2048", "hw:numa_mem.1": "2048"}, {}, "hw:numa_cpus.1"),
        ({"hw:numa_nodes": "2", "hw:numa_cpus.0": "0-1", "hw:numa_cpus.1": "2-5",
          "hw:numa_mem.0": "2048", "hw:numa_mem.1": "2048"}, {}, "hw:numa_cpus.1"),
        ({"hw:numa_nodes": "2", "hw:numa_cpus.0": "0", "hw:numa_cpus.1": "2-3",
          "hw:numa_mem.0": "2048", "hw:numa_mem.1": "2048"}, {}, "hw:numa_cpus.0"),
        ({"hw:numa_nodes": "2", "hw:numa_cpus.0": "0-1", "hw:numa_cpus.1": "2-3",
          "hw:numa_mem.0": "1024", "hw:numa_mem.1": "1024"}, {}, "hw:numa_mem.0"),
        ({"hw:numa_nodes": "2", "hw:numa_cpus.0": "0-1", "hw:numa_cpus.1": "2-3",
          "hw:numa_mem.0": "lots", "hw:numa_mem.1": "1024"}, {}, "hw:numa_mem.0"),
        ({"hw:numa_nodes": "1", "hw:numa_cpus.0": "0-3", "hw:numa_mem.0": "4096"},
         {"hw_numa_cpus.0": "0-3", "hw_numa_mem.0": "4096"}, "hw_numa_cpus.0"),
    ],
    ids=[
        "a node count that is not a number",
        "zero nodes",
        "nodes that do not divide the vCPUs",
        "the image repeating the flavor's node count",
        "an unknown CPU policy",
        "the image asking for pinning against a shared flavor",
        "the image asking for dedicated against a mixed flavor",
        "an unknown thread policy",
        "the image contradicting the flavor's thread policy",
        "a thread policy without pinning",
        "isolated emulator threads without pinning",
        "an unknown emulator threads policy",
        "mixed without a dedicated mask",
        "a dedicated mask covering every vCPU",
        "a dedicated mask beyond the vCPUs",
        "a dedicated mask with the dedicated policy",
        "an unknown page size word",
        "a lower-case unit",
        "a page size below one KiB",
        "an image page size without a flavor page size",
        "an image page size against a small flavor page size",
        "node CPUs without node memory",
        "a vCPU on two nodes",
        "a vCPU beyond the flavor",
        "a vCPU on no node",
        "node memory not adding up to the flavor",
        "node memory that is not a number",
        "the image repeating the flavor's node CPUs",
    ],
)
def test_bad_or_conflicting_values_name_the_key(extra: dict[str, str], image: dict[str, Any], key: str) -> None:
    # The category is the side the key names, as Nova's errors are: an extra spec
    # (hw:...) or an image property (hw_..., Nova's Image*Forbidden and field errors).
    category = ExtraSpecError if ":" in key else ImagePropertyError
    with pytest.raises(category) as err:
        specs(vcpus=4, memory_mb=4096, extra=extra, image=image)
    assert err.value.details["key"] == key
    assert key in str(err.value)


def test_prepare_request_fills_numa_and_pci_only_when_missing() -> None:
    config = SchedulerConfig.from_dict({"pci": {"alias": ['{"name": "gpu", "vendor_id": "10de"}']}})
    req = spec(vcpus=2, memory_mb=1024,
               extra_specs={"hw:cpu_policy": "dedicated", "pci_passthrough:alias": "gpu:1"})
    prepare_request(req, config)
    assert req.numa_topology is not None and req.numa_topology.cells[0].pcpuset == {0, 1}
    assert isinstance(req.pci_requests, InstancePCIRequests)
    assert [(r.alias_name, r.count) for r in req.pci_requests.requests] == [("gpu", 1)]
    kept = req.numa_topology
    prepare_request(req, config)
    assert req.numa_topology is kept


def test_prepare_request_without_an_image_reads_only_the_flavor() -> None:
    req = spec(vcpus=2, memory_mb=1024, no_image=True, extra_specs={"hw:numa_nodes": "2"})
    prepare_request(req, SchedulerConfig.default())
    assert req.numa_topology is not None and len(req.numa_topology.cells) == 2
    assert req.pci_requests is not None and req.pci_requests.requests == []


SPEC_VALUES: dict[str, list[str]] = {
    "hw:numa_nodes": ["1", "2", "3", "0", "x"],
    "hw:cpu_policy": ["shared", "dedicated", "mixed", "bogus"],
    "hw:cpu_thread_policy": ["prefer", "isolate", "require", "never"],
    "hw:emulator_threads_policy": ["share", "isolate"],
    "hw:mem_page_size": ["small", "large", "any", "2048", "2MB", "1GB", "huge"],
    "hw:cpu_dedicated_mask": ["^0", "0", "1-2", "0-5", "9"],
    "hw:numa_cpus.0": ["0-1", "0", "0-3"],
    "hw:numa_cpus.1": ["2-3", "1-3"],
    "hw:numa_mem.0": ["1024", "2048", "x"],
    "hw:numa_mem.1": ["1024", "3072"],
}
IMAGE_VALUES: dict[str, list[Any]] = {
    "hw_numa_nodes": [1, 2],
    "hw_cpu_policy": ["shared", "dedicated", "mixed"],
    "hw_cpu_thread_policy": ["prefer", "isolate", "require"],
    "hw_mem_page_size": ["small", "2MB", "any"],
}


@settings(max_examples=60, deadline=None)
@given(
    st.fixed_dictionaries({}, optional={k: st.sampled_from(v) for k, v in SPEC_VALUES.items()}),
    st.fixed_dictionaries({}, optional={k: st.sampled_from(v) for k, v in IMAGE_VALUES.items()}),
    st.sampled_from([2, 4]),
)
def test_parsing_either_raises_extra_spec_errors_or_covers_every_vcpu_and_mb_once(
    extra: dict[str, str], image: dict[str, Any], vcpus: int
) -> None:
    try:
        topo = specs(vcpus=vcpus, memory_mb=4096, extra=extra, image=image)
    except (ExtraSpecError, ImagePropertyError) as exc:
        assert exc.details["key"] in str(exc)
        return
    if topo is None:
        return
    cpus = [cpu for c in topo.cells for cpu in sorted(c.cpuset | c.pcpuset)]
    assert sorted(cpus) == list(range(vcpus))
    assert sum(c.memory for c in topo.cells) == 4096
    policy = topo.cells[0].cpu_policy
    pinned = {cpu for c in topo.cells for cpu in c.pcpuset}
    if policy == "dedicated":
        assert pinned == set(range(vcpus))
    elif policy == "mixed":
        assert pinned and pinned != set(range(vcpus))
    else:
        assert not pinned


def test_resources_pcpu_stands_for_the_dedicated_policy() -> None:
    topo = specs(vcpus=2, extra={"resources:PCPU": "2"})
    assert topo is not None and topo.cells[0].cpu_policy == "dedicated"
    topo = specs(vcpus=2, extra={"resources:PCPU": "3", "hw:emulator_threads_policy": "isolate"})
    assert topo is not None and topo.emulator_threads_isolated


def test_resources_vcpu_stands_for_the_shared_policy() -> None:
    assert specs(vcpus=2, extra={"resources:VCPU": "2"}) is None


def test_the_hyperthreading_trait_stands_for_a_thread_policy() -> None:
    topo = specs(vcpus=2, extra={"hw:cpu_policy": "dedicated", "trait:HW_CPU_HYPERTHREADING": "forbidden"})
    assert topo is not None and topo.cells[0].cpu_thread_policy == "isolate"
    topo = specs(vcpus=2, extra={"hw:cpu_policy": "dedicated"},
                 image={"traits_required": ["HW_CPU_HYPERTHREADING"]})
    assert topo is not None and topo.cells[0].cpu_thread_policy == "require"


def test_mixed_with_a_realtime_mask_dedicates_the_realtime_vcpus() -> None:
    topo = specs(vcpus=4, extra={"hw:cpu_policy": "mixed", "hw:cpu_realtime": "yes",
                                 "hw:cpu_realtime_mask": "^0-1"})
    assert topo is not None and topo.cells[0].pcpuset == {2, 3}


@pytest.mark.parametrize(
    ("extra", "image", "key"),
    [
        ({"hw:cpu_policy": "dedicated", "resources:PCPU": "4"}, {}, "hw:cpu_policy"),
        ({"resources:PCPU": "2", "resources:VCPU": "2"}, {}, "resources:PCPU"),
        ({"resources:PCPU": "3"}, {}, "resources:PCPU"),
        ({"hw:cpu_policy": "dedicated", "hw:cpu_thread_policy": "prefer",
          "trait:HW_CPU_HYPERTHREADING": "required"}, {}, "trait:HW_CPU_HYPERTHREADING"),
        ({"hw:cpu_realtime": "yes", "hw:cpu_realtime_mask": "^0"}, {}, "hw:cpu_realtime"),
        ({"hw:cpu_policy": "dedicated", "hw:cpu_realtime": "yes"}, {}, "hw:cpu_realtime_mask"),
        ({"hw:cpu_policy": "mixed", "hw:cpu_realtime": "yes", "hw:cpu_realtime_mask": "^0",
          "hw:cpu_dedicated_mask": "1"}, {}, "hw:cpu_dedicated_mask"),
        ({"hw:cpu_policy": "dedicated", "hw:cpu_realtime": "yes"}, {"hw_cpu_realtime_mask": "0-9"},
         "hw_cpu_realtime_mask"),
    ],
    ids=["a CPU policy with explicit PCPU resources", "both VCPU and PCPU resources",
         "PCPU resources that differ from the vCPUs", "a thread policy with the hyperthreading trait",
         "realtime without pinning", "every vCPU realtime without an emulator policy",
         "both a realtime and a dedicated mask on a mixed flavor",
         "an image realtime mask beyond the vCPUs"],
)
def test_bad_cpu_resource_trait_and_realtime_combinations(
    extra: dict[str, str], image: dict[str, Any], key: str
) -> None:
    with pytest.raises(ExtraSpecError if ":" in key else ImagePropertyError) as err:
        specs(vcpus=4, extra=extra, image=image)
    assert err.value.details["key"] == key
