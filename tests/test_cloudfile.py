"""Cloud files: the example loads, derived usage is right, and errors name field and value."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from berth.cloudfile import load_cloud, parse_cloud
from berth.config import SchedulerConfig
from berth.errors import CloudFileError

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cloud.yaml"
CONFIG = SchedulerConfig.default()


def minimal(**host):
    return {"hosts": [{"host": "h1", "vcpus": 8, "memory_mb": 8192, "local_gb": 100, **host}]}


def test_the_example_cloud_loads_with_two_cells_and_more_than_fifty_hosts():
    cloud = load_cloud(str(EXAMPLE), now=1000.0)
    assert len(cloud.snapshot) >= 50
    assert len(cloud.cells) >= 2
    zones = {a.availability_zone for a in cloud.snapshot.aggregates} - {None}
    assert len(zones) >= 3
    assert {"m1.large", "ssd.large"} <= set(cloud.flavors)
    assert cloud.server_groups["web"].hosts == ["c1-w01", "c1-w02"]


def test_every_host_is_a_node_with_its_service_record_even_without_a_service_block():
    snap = parse_cloud(minimal(), CONFIG, now=0.0).snapshot
    assert snap.num("has_service").tolist() == [True]
    assert load_cloud(str(EXAMPLE), now=1000.0).snapshot.num("has_service").all()


def test_usage_is_derived_from_instances_and_reserved_options_when_not_given():
    doc = {
        "flavors": [{"name": "f", "vcpus": 2, "memory_mb": 1024, "root_gb": 10, "ephemeral_gb": 5}],
        **minimal(instances=[{"uuid": "i1", "flavor": "f"}, {"uuid": "i2", "flavor": "f"}]),
    }
    snap = parse_cloud(doc, CONFIG, now=0.0).snapshot
    assert snap.num("vcpus_used")[0] == 4
    assert snap.num("free_ram_mb")[0] == 8192 - 512 - 2048  # reserved_host_memory_mb 512
    assert snap.num("free_disk_mb")[0] == (100 - 30) * 1024
    assert snap.num("num_instances")[0] == 2


def test_free_disk_uses_disk_available_least_when_it_is_smaller():
    snap = parse_cloud(minimal(local_gb_used=10, disk_available_least=50), CONFIG, 0.0).snapshot
    assert snap.num("free_disk_mb")[0] == 50 * 1024


def test_ratios_fall_back_to_the_config_then_the_initial_ratio():
    snap = parse_cloud(minimal(), CONFIG, 0.0).snapshot
    assert snap.num("cpu_allocation_ratio")[0] == 4.0
    conf = SchedulerConfig.from_dict({"DEFAULT": {"cpu_allocation_ratio": 16.0}})
    assert parse_cloud(minimal(), conf, 0.0).snapshot.num("cpu_allocation_ratio")[0] == 16.0
    assert parse_cloud(minimal(cpu_allocation_ratio=2.0), conf, 0.0).snapshot.num(
        "cpu_allocation_ratio")[0] == 2.0


def test_count_stamps_out_hosts_from_a_pattern():
    doc = {"hosts": [{"host": "r1-{index:02d}", "count": 3, "vcpus": 4, "memory_mb": 4096,
                      "host_ip": "10.0.0.{index}"}]}
    snap = parse_cloud(doc, CONFIG, 0.0).snapshot
    assert list(snap.obj("host")) == ["r1-01", "r1-02", "r1-03"]
    assert list(snap.obj("host_ip")) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]


def test_a_host_said_to_be_down_reports_a_stale_heartbeat():
    snap = parse_cloud(minimal(service={"up": False}), CONFIG, now=10_000.0).snapshot
    assert snap.num("service_heartbeat")[0] < 10_000.0 - CONFIG.service_down_time


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({}, "hosts: required field is missing"),
        (minimal(memory_mb="lots"), "hosts[0].memory_mb: expected an integer, got 'lots'"),
        (minimal(vcpus=-1), "hosts[0].vcpus: expected an integer >= 0, got -1"),
        (minimal(colour="blue"), "hosts[0]: unknown field(s) colour"),
        ({**minimal(), "aggregates": [{"name": "a", "hosts": ["nope"]}]},
         "aggregates[0].hosts[0]: no host named 'nope'"),
        ({**minimal(), "flavors": [{"name": "f", "vcpus": 1}]}, "flavors[0].memory_mb: required"),
        ({**minimal(), "server_groups": [{"name": "g", "policy": "together"}]},
         "server_groups[0].policy: expected one of"),
        (minimal(cell="cellX") | {"cells": [{"name": "cell1"}]}, "hosts[0].cell: no cell named 'cellX'"),
        ({"hosts": [{"host": "h{index}", "count": 2}, {"host": "h1"}]}, "duplicate compute node h1/h1"),
        (minimal(supported_instances=[["x86_64", "kvm"]]), "hosts[0].supported_instances[0]"),
        (minimal(service={"last_seen_up": "yesterday"}), "hosts[0].service.last_seen_up"),
        ({"hosts": "all of them"}, "hosts: expected a list"),
        (minimal(traits=["HW_CPU_X86_AVX9"]), "hosts[0].traits[0]: unknown trait 'HW_CPU_X86_AVX9'"),
        (minimal(resources={"VCPU": 4}), "hosts[0].resources.VCPU: given by the host's vcpus"),
        (minimal(resources={"GPU": 4}), "hosts[0].resources.GPU: unknown resource class 'GPU'"),
        (minimal(resources={"CUSTOM_GPU": {"total": 2, "reserved": 3}}),
         "hosts[0].resources.CUSTOM_GPU.reserved: 3 is more than total 2"),
        (minimal(resources={"CUSTOM_GPU": {"total": 2, "max": 1}}),
         "hosts[0].resources.CUSTOM_GPU: unknown field(s) max"),
        (minimal(cpu_dedicated_set="4-x"), "hosts[0].cpu_dedicated_set: invalid CPU range '4-x'"),
        (minimal(providers=[{"name": "pf1", "parent": "numa0"}]),
         "hosts[0].providers[0].parent: 'numa0' is no provider listed before it"),
        ({**minimal(), "sharing_providers": [{"name": "nfs", "resources": {"DISK_GB": 100},
                                              "aggregates": ["rack9"]}]},
         "sharing_providers[0].aggregates[0]: no aggregate named 'rack9'"),
    ],
    ids=["no hosts", "non-integer memory", "negative vcpus", "unknown field", "aggregate of an unknown host",
         "flavor without memory", "bad group policy", "unknown cell", "duplicate node",
         "short supported_instances triple", "bad heartbeat time", "hosts not a list",
         "unknown trait", "standard class under resources", "unknown class", "reserved over total",
         "unknown inventory field", "bad dedicated CPU set", "nested provider before its parent",
         "sharing provider of an unknown aggregate"],
)
def test_a_bad_cloud_file_names_the_field_and_the_value(doc, message):
    with pytest.raises(CloudFileError) as info:
        parse_cloud(doc, CONFIG, 0.0)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (minimal(vcpus=10**25), "hosts[0].vcpus: expected an integer up to 2147483647"),
        (minimal(memory_mb_used=2**31), "hosts[0].memory_mb_used: expected an integer up to"),
        (minimal(hypervisor_version=10**30),
         "hosts[0].hypervisor_version: expected an integer up to 9223372036854775807"),
        ({**minimal(), "flavors": [{"name": "f", "vcpus": 2**63, "memory_mb": 5}]},
         "flavors[0].vcpus: expected an integer up to 2147483647"),
        ({"hosts": [{"host": "h{index}", "count": 2, "nodename": "same", "vcpus": 4,
                     "memory_mb": 4096}]},
         "hosts[0] (#2).nodename: 'same' is also hosts[0] (#1)'s"),
        ({"hosts": [{"host": "a", "uuid": "6f1f7d0c-1c55-4f0e-9d1e-6a3f1b0b8e11", "vcpus": 4},
                    {"host": "b", "uuid": "6f1f7d0c-1c55-4f0e-9d1e-6a3f1b0b8e11", "vcpus": 4}]},
         "hosts[1].uuid: '6f1f7d0c-1c55-4f0e-9d1e-6a3f1b0b8e11' is also hosts[0]'s"),
        (minimal(stats={"io_workload": "x"}), "hosts[0].stats.io_workload: expected a count"),
        (minimal(cpu_dedicated_set="0-99999999"),
         "hosts[0].cpu_dedicated_set: CPU range '0-99999999' goes past CPU 65535"),
        (minimal(uuid="x"), "hosts[0].uuid: expected a UUID, got 'x'"),
        (minimal(resources={"CUSTOM_GPU": 10**23}),
         "hosts[0].resources.CUSTOM_GPU.total: expected an integer from 1 to 2147483647"),
        (minimal(resources={"CUSTOM_GPU": {"total": 2, "allocation_ratio": 1e39}}),
         "hosts[0].resources.CUSTOM_GPU.allocation_ratio: expected a number > 0 up to"),
        (minimal(cpu_allocation_ratio=1e308),
         "hosts[0].cpu_allocation_ratio: expected a number up to 3.40282e+38"),
    ],
    ids=["host size past Nova's INT", "usage past Nova's INT", "past 64 bits",
         "flavor size past Nova's INT", "two nodes of one name", "two nodes of one uuid",
         "a count that is no number", "a CPU set of 100 million", "a node uuid",
         "an inventory past Placement's INT", "a ratio past Placement's float",
         "a node's ratio past Placement's float"],
)
def test_what_no_store_or_report_could_hold_is_refused_at_load(doc, message):
    """These once passed ``berth cloud check`` and then failed with a traceback (or hung)
    in the store, the reports or the CPU sets."""
    with pytest.raises(CloudFileError) as info:
        parse_cloud(doc, CONFIG, 0.0)
    assert message in str(info.value)


def test_a_node_uuid_is_read_as_placement_writes_it():
    doc = minimal(uuid="6F1F7D0C1C554F0E9D1E6A3F1B0B8E11")
    assert parse_cloud(doc, CONFIG, 0.0).snapshot.obj("uuid")[0] == \
        "6f1f7d0c-1c55-4f0e-9d1e-6a3f1b0b8e11"


def test_a_json_cloud_file_with_an_unpaired_surrogate_is_refused(tmp_path):
    path = tmp_path / "cloud.json"
    path.write_text('{"hosts": [{"host": "h\\ud800", "vcpus": 4}]}')
    with pytest.raises(CloudFileError, match="hosts\\[0\\].host: the string holds an unpaired"):
        load_cloud(str(path))


@pytest.mark.parametrize(("content", "message"), [
    ("", "empty; a cloud file is a mapping"), (None, "a directory, not a cloud file")])
def test_an_empty_file_or_a_directory_is_named_as_such(tmp_path, content, message):
    path = tmp_path / "cloud.yaml"
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    with pytest.raises(CloudFileError, match=f"{path}: {message}"):
        load_cloud(str(path))


@pytest.mark.parametrize(
    ("properties", "message"),
    [
        ({"hw_cpu_cores": "lots"}, "images[1].properties.hw_cpu_cores: expected an integer, got 'lots'"),
        ({"hw_disk_bus": "nvme"},
         "images[1].properties.hw_disk_bus: expected one of fdc, ide, sata, scsi, usb, virtio"),
        ({"hw_numa_cpus.0": "0-1", "hw_numa_cpus.1": "2-x"},
         "images[1].properties.hw_numa_cpus.1: expected a CPU set such as '0-3,^2'"),
        ({"architecture": "z80"}, "images[1].properties.architecture: expected one of"),
    ],
    ids=["non-integer image property", "unknown enum value of an image property",
         "bad CPU set of a guest NUMA node", "bad value under a legacy property name"],
)
def test_a_bad_image_fails_only_the_requests_that_use_it(properties, message):
    doc = minimal(instances=[{"uuid": "11111111-1111-4111-8111-111111111111", "image": "bad"}])
    doc["images"] = [{"name": "good", "properties": {"hw_disk_bus": "virtio"}},
                     {"name": "bad", "properties": {**properties, "hw_video_model": "vga"}}]
    cloud = parse_cloud(doc, CONFIG, 0.0)
    assert cloud.image("good").name == "good"
    with pytest.raises(CloudFileError) as info:
        cloud.image("bad")
    assert message in str(info.value) and "image 'bad' cannot be used" in str(info.value)
    # The instance booted from it keeps the properties that parse.
    instance = cloud.snapshot.obj("instances")[0]["11111111-1111-4111-8111-111111111111"]
    bad_key = message.split(":")[0].split("properties.")[1]
    assert instance.image_properties["hw_video_model"] == "vga"
    assert bad_key not in instance.image_properties


def test_a_file_that_is_not_yaml_names_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("hosts:\n  - {host: a\n")
    with pytest.raises(CloudFileError, match=r"invalid YAML at line \d+"):
        load_cloud(str(path))


def test_json_cloud_files_are_read_too(tmp_path):
    path = tmp_path / "cloud.json"
    path.write_text(json.dumps(minimal()))
    assert len(load_cloud(str(path)).snapshot) == 1


def test_unknown_flavor_lists_the_known_ones():
    cloud = load_cloud(str(EXAMPLE))
    with pytest.raises(CloudFileError, match="m1.tiny"):
        cloud.flavor("m9.giant")


def test_every_flavor_a_cloud_knows_has_an_id_of_its_own():
    """TypeAffinityFilter compares flavor ids: a cloud file's flavors take 1, 2, ...
    (skipping ids given to others), and beside them Berth's defaults take the negative
    of their usual ids, which no flavor of a file can hold, so m1.tiny is not taken for
    the file's first flavor whatever the file adds."""
    doc = {**minimal(), "flavors": [
        {"name": "big", "vcpus": 4, "memory_mb": 4096},
        {"name": "given", "vcpus": 1, "memory_mb": 512, "id": 2},
        {"name": "third", "vcpus": 1, "memory_mb": 512},
        {"name": "m1.small", "vcpus": 1, "memory_mb": 2048, "id": 40}]}
    cloud = parse_cloud(doc, CONFIG, 0.0)
    ids = {name: f.id for name, f in cloud.known_flavors().items()}
    assert ids == {"big": 1, "given": 2, "third": 3, "m1.small": 40, "m1.tiny": -1,
                   "m1.medium": -3, "m1.large": -4, "m1.xlarge": -5}
    assert cloud.flavor("m1.tiny").id == -1 and cloud.flavor("m1.small").id == 40
    assert cloud.own_flavors() == ["big", "given", "m1.small", "third"]
    # Without flavors of its own, a cloud knows the defaults with their usual ids.
    assert {n: f.id for n, f in parse_cloud(minimal(), CONFIG, 0.0).known_flavors().items()} \
        == {"m1.tiny": 1, "m1.small": 2, "m1.medium": 3, "m1.large": 4, "m1.xlarge": 5}


def test_a_file_an_earlier_export_wrote_with_the_defaults_loads():
    """An earlier ``berth cloud export`` wrote Berth's defaults (ids 1-5) beside the
    file's own flavors (ids 1, 2, ...): an entry that is exactly a default is that
    default, and only the file's own flavors count as its own."""
    defaults = [{"name": "m1.tiny", "id": 1, "vcpus": 1, "memory_mb": 512, "root_gb": 1},
                {"name": "m1.small", "id": 2, "vcpus": 1, "memory_mb": 2048, "root_gb": 20}]
    doc = {**minimal(), "flavors": [
        *defaults, {"name": "big", "id": 1, "vcpus": 4, "memory_mb": 4096},
        {"name": "m1.medium", "id": 3, "vcpus": 2, "memory_mb": 9999, "root_gb": 40}]}
    cloud = parse_cloud(doc, CONFIG, 0.0)
    assert cloud.own_flavors() == ["big", "m1.medium"]
    assert {n: f.id for n, f in cloud.known_flavors().items()} == {
        "big": 1, "m1.medium": 3, "m1.tiny": -1, "m1.small": -2, "m1.large": -4,
        "m1.xlarge": -5}
    # A default changed in any way is the file's own (and its id is checked).
    doc["flavors"][0]["memory_mb"] = 1024
    with pytest.raises(CloudFileError, match=r"flavors\[2\]\.id: 1 is also flavor 'm1.tiny''s id"):
        parse_cloud(doc, CONFIG, 0.0)


def test_two_flavors_with_one_id_are_refused():
    doc = {**minimal(), "flavors": [{"name": "a", "vcpus": 1, "memory_mb": 512, "id": 7},
                                    {"name": "b", "vcpus": 1, "memory_mb": 512, "id": 7}]}
    with pytest.raises(CloudFileError) as caught:
        parse_cloud(doc, CONFIG, 0.0)
    assert str(caught.value) == "flavors[1].id: 7 is also flavor 'a''s id"


def test_a_hosts_instance_may_run_one_of_berths_default_flavors():
    doc = {**minimal(), "flavors": [{"name": "big", "vcpus": 4, "memory_mb": 4096}]}
    doc["hosts"][0]["instances"] = [{"uuid": "i1", "flavor": "m1.tiny"},
                                    {"uuid": "i2", "flavor": "big"}]
    cloud = parse_cloud(doc, CONFIG, 0.0)
    instances = cloud.snapshot.obj("instances")[0]
    assert {u: i.instance_type_id for u, i in instances.items()} == {"i1": -1, "i2": 1}
    doc["hosts"][0]["instances"] = [{"uuid": "i1", "flavor": "m9.giant"}]
    with pytest.raises(CloudFileError, match=r"hosts\[0\]\.instances\[0\]\.flavor: no flavor "
                       r"named 'm9.giant' in flavors or Berth's defaults \(m1.tiny, "):
        parse_cloud(doc, CONFIG, 0.0)


def test_start_sets_the_first_index_of_a_stamped_group():
    doc = {"hosts": [{"host": "r{index}", "count": 2}, {"host": "r{index}", "count": 2, "start": 3}]}
    assert list(parse_cloud(doc, CONFIG, 0.0).snapshot.obj("host")) == ["r1", "r2", "r3", "r4"]


def test_image_properties_are_typed_as_nova_types_them():
    doc = {**minimal(), "images": [{"name": "pinned", "properties": {
        "hw_cpu_policy": "dedicated", "hw_numa_nodes": "2", "hw_numa_cpus.0": "0-1",
        "hw_numa_mem.0": "2048", "hw_numa_cpus.1": "2-3", "hw_numa_mem.1": "2048",
        "hw_boot_menu": "no", "trait:HW_CPU_X86_AVX2": "required", "architecture": "AMD64"}}]}
    props = parse_cloud(doc, CONFIG, 0.0).image("pinned").properties
    assert props.to_dict() == {
        "hw_cpu_policy": "dedicated", "hw_numa_nodes": 2, "hw_numa_cpus": [{0, 1}, {2, 3}],
        "hw_numa_mem": [2048, 2048], "hw_boot_menu": False,
        "traits_required": ["HW_CPU_X86_AVX2"], "hw_architecture": "x86_64"}


def test_an_instance_keeps_its_image_properties_as_given_so_reports_stay_json():
    doc = {**minimal(instances=[{"uuid": "i1", "image": "numa"}]),
           "images": [{"name": "numa", "properties": {"hw_numa_cpus.0": "0-1", "hw_boot_menu": "1"}}]}
    instance = parse_cloud(doc, CONFIG, 0.0).snapshot.obj("instances")[0]["i1"]
    assert instance.image_properties == {"hw_numa_cpus.0": "0-1", "hw_boot_menu": "1"}
    json.dumps(instance.image_properties)



def ironic_nodes(*extra):
    return {"hosts": [{"host": "ironic1", "nodename": "node-a", "vcpus": 8, "memory_mb": 8192,
                       "local_gb": 100, "instances": ["i-1"],
                       "service": {"disabled": True, "disabled_reason": "maintenance"}},
                      {"host": "ironic1", "nodename": "node-b", "vcpus": 8, "memory_mb": 8192,
                       "local_gb": 100}, *extra]}


def test_entries_sharing_a_host_are_the_nodes_of_one_service_host():
    cloud = parse_cloud({**ironic_nodes(), "server_groups": [
        {"name": "g", "policy": "anti-affinity", "members": ["i-1"]}]}, CONFIG, 0.0)
    snap = cloud.snapshot
    assert [snap.row_of("ironic1", n) for n in ("node-a", "node-b")] == [0, 1]
    # One service for the host: the second node takes the first one's (disabled) state.
    assert snap.num("service_disabled").tolist() == [True, True]
    assert snap.obj("service")[1].disabled_reason == "maintenance"
    # Instances: each node lists its own (usage, num_instances); the host shares them.
    assert snap.num("num_instances").tolist() == [1, 0]
    assert [set(i) for i in snap.service_hosts().instances_column()] == [{"i-1"}, {"i-1"}]
    assert cloud.server_groups["g"].hosts == ["ironic1"]


def test_count_can_stamp_out_the_nodes_of_one_service_host():
    doc = {"hosts": [{"host": "ironic1", "nodename": "bm-{index}", "count": 3, "vcpus": 4,
                      "memory_mb": 4096}]}
    snap = parse_cloud(doc, CONFIG, 0.0).snapshot
    assert list(snap.obj("host")) == ["ironic1"] * 3
    assert list(snap.obj("nodename")) == ["bm-1", "bm-2", "bm-3"]


@pytest.mark.parametrize(("extra", "message"), [
    ({"service": {"disabled": False}},
     "hosts[1].service: differs from hosts[0].service of the same service host 'ironic1'"),
    ({"cell": "cell2"},
     "hosts[1].cell: 'cell2' is not the cell of hosts[0], another node of service host "
     "'ironic1'"),
], ids=["a second node with another service state", "a second node in another cell"])
def test_the_nodes_of_one_host_must_agree_on_what_belongs_to_the_host(extra, message):
    doc = ironic_nodes()
    doc["hosts"][1].update(extra)
    with pytest.raises(CloudFileError) as info:
        parse_cloud(doc, CONFIG, 0.0)
    assert message in str(info.value)


def test_a_node_may_repeat_its_hosts_service():
    doc = ironic_nodes()
    doc["hosts"][1]["service"] = dict(doc["hosts"][0]["service"])
    assert parse_cloud(doc, CONFIG, 0.0).snapshot.num("service_disabled").tolist() == [True, True]


def test_count_without_a_placeholder_in_host_or_nodename_is_an_error():
    with pytest.raises(CloudFileError) as info:
        parse_cloud({"hosts": [{"host": "h", "nodename": "n", "count": 2}]}, CONFIG, 0.0)
    assert "hosts[0].host: with count, the host name (or, for the nodes of one service host, " \
           "nodename) needs an {index} placeholder" in str(info.value)


def test_count_is_bounded_before_any_host_is_expanded():
    # 999,999 + 2 nodes: refused at the second entry, before a single host is built.
    doc = {"hosts": [{"host": "a{index}", "count": 999_999, "vcpus": 4, "memory_mb": 4096},
                     {"host": "b{index}", "count": 2, "vcpus": 4, "memory_mb": 4096}]}
    with pytest.raises(CloudFileError, match=r"hosts\[1\]\.count: 2 would make 1,000,001 "
                                             r"compute nodes; a cloud file holds at most 1,000,000"):
        parse_cloud(doc, CONFIG, 0.0)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("deep.json", "[" * 100_000 + "]" * 100_000, "nested too deeply to be a cloud file"),
        ("deep.yaml", "a: " + "[" * 5_000 + "]" * 5_000, "exceeded maximum nesting depth"),
    ],
    ids=["JSON nested 100,000 deep", "YAML nested 5,000 deep"],
)
def test_a_deeply_nested_document_is_a_cloud_file_error(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(CloudFileError, match=message):
        load_cloud(str(path))


@pytest.mark.parametrize("snippet, field", [
    ("hosts: [{host: %s, vcpus: 1, memory_mb: 1, local_gb: 1}]", "hosts[0].host"),
    ("hosts: [{host: h1, vcpus: 1, memory_mb: 1, local_gb: 1}]\n"
     "aggregates: [{name: %s, hosts: [h1]}]", "aggregates[0].name"),
    ("hosts: [{host: h1, vcpus: 1, memory_mb: 1, local_gb: 1}]\n"
     "flavors: [{name: %s, vcpus: 1, memory_mb: 1, root_gb: 1}]", "flavors[0].name"),
])
def test_a_name_longer_than_nova_s_columns_is_refused(snippet: str, field: str) -> None:
    document = yaml.safe_load(snippet % ("x" * 256))
    with pytest.raises(CloudFileError, match=rf"^{re.escape(field)}: at most 255 characters"):
        parse_cloud(document, SchedulerConfig.default(), 0.0)
    parse_cloud(yaml.safe_load(snippet % ("x" * 255)), SchedulerConfig.default(), 0.0)


@pytest.mark.parametrize("name", ["rack1/h1", "", "..", "h\t1"])
def test_a_host_name_that_cannot_be_one_segment_of_a_path_is_refused(name):
    """`/os-services/{host}` and `berth compute --host` could not name such a host."""
    with pytest.raises(CloudFileError, match=r"hosts\[0\]\.host: expected a host name"):
        parse_cloud(minimal(host=name), CONFIG, 0.0)
