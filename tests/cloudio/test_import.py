"""``berth cloud import`` against a local OpenStack (Keystone, Nova at 2.100, Glance v2,
Berth's Placement): every field Nova's APIs expose round-trips."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from berth.cloudfile import load_cloud
from berth.cloudio.openstack import OpenStackAPI, read_openstack

from .views import cloud_views, differences, node_views

GPU_UUID = "0b8f9c3e-0000-4000-8000-0000000000a1"

SOURCE: dict[str, Any] = {
    "hosts": [
        {"host": "cmp1", "host_ip": "10.0.0.1", "vcpus": 32, "memory_mb": 131072,
         "local_gb": 1000, "vcpus_used": 6, "memory_mb_used": 20480, "local_gb_used": 120,
         "cpu_allocation_ratio": 4.0, "ram_allocation_ratio": 1.5,
         "disk_allocation_ratio": 1.0, "hypervisor_type": "QEMU",
         "hypervisor_version": 8002000, "io_workload": 3,
         "cpu_info": {"arch": "x86_64", "vendor": "Intel", "features": ["avx2", "aes"]},
         "supported_instances": [["x86_64", "kvm", "hvm"], ["x86_64", "qemu", "hvm"]],
         "instances": [{"uuid": "0b8f9c3e-0000-4000-8000-000000000001", "flavor": "m1.small",
                        "image": "ubuntu", "project_id": "acme"},
                       {"uuid": "0b8f9c3e-0000-4000-8000-000000000002", "flavor": "gpu",
                        "project_id": "acme"}]},
        {"host": "cmp2", "host_ip": "10.0.0.2", "vcpus": 16, "memory_mb": 65536,
         "local_gb": 500, "hypervisor_type": "QEMU", "hypervisor_version": 9000000,
         "cpu_info": {"arch": "x86_64", "vendor": "AMD", "features": ["sse4.2"]},
         "supported_instances": [["x86_64", "kvm", "hvm"], ["x86_64", "qemu", "hvm"]],
         "service": {"disabled": True, "disabled_reason": "maintenance"},
         "instances": [{"uuid": "0b8f9c3e-0000-4000-8000-000000000003", "flavor": "m1.small",
                        "image": "windows", "project_id": "beta"}]},
        {"host": "cmp3", "vcpus": 16, "memory_mb": 65536, "local_gb": 500,
         "hypervisor_type": "QEMU", "hypervisor_version": 9000000,
         "service": {"up": False}},
        {"host": "cmp4", "vcpus": 8, "memory_mb": 16384, "local_gb": 200,
         "hypervisor_type": "QEMU", "hypervisor_version": 9000000,
         "service": {"forced_down": True}},
        {"host": "ironic1", "nodename": "node-a", "vcpus": 4, "memory_mb": 8192,
         "local_gb": 100, "hypervisor_type": "ironic", "hypervisor_version": 1,
         "instances": [{"uuid": "0b8f9c3e-0000-4000-8000-000000000004", "flavor": "m1.small",
                        "project_id": "acme"}]},
        {"host": "ironic1", "nodename": "node-b", "vcpus": 4, "memory_mb": 8192,
         "local_gb": 100, "hypervisor_type": "ironic", "hypervisor_version": 1},
    ],
    "aggregates": [
        {"name": "az1", "availability_zone": "az1", "hosts": ["cmp1", "cmp2", "ironic1"]},
        {"name": "az2", "availability_zone": "az2", "hosts": ["cmp3", "cmp4"]},
        {"name": "ssd", "hosts": ["cmp1"], "metadata": {"ssd": "true",
                                                        "max_io_ops_per_host": "16"}},
        {"name": "acme-only", "hosts": ["cmp2"],
         "metadata": {"filter_tenant_id": "acme"}},
    ],
    "flavors": [
        {"name": "m1.small", "vcpus": 1, "memory_mb": 2048, "root_gb": 20},
        {"name": "m1.large", "vcpus": 4, "memory_mb": 8192, "root_gb": 80, "ephemeral_gb": 10,
         "swap": 1024, "extra_specs": {"aggregate_instance_extra_specs:ssd": "true"}},
        {"name": "gpu", "vcpus": 2, "memory_mb": 4096, "root_gb": 40, "flavorid": GPU_UUID,
         "extra_specs": {"hw:cpu_policy": "shared", "trait:HW_CPU_X86_AVX2": "required"}},
    ],
    "images": [
        {"name": "ubuntu", "disk_format": "qcow2",
         "properties": {"hw_architecture": "x86_64", "os_distro": "ubuntu"}},
        {"name": "windows", "disk_format": "raw",
         "properties": {"os_type": "windows", "hw_boot_menu": "yes",
                        "img_hv_requested_version": ">=8.0"}},
    ],
    "server_groups": [
        {"name": "web", "policy": "anti-affinity", "rules": {"max_server_per_host": 2},
         "members": ["0b8f9c3e-0000-4000-8000-000000000001",
                     "0b8f9c3e-0000-4000-8000-000000000003"], "project_id": "acme"},
        {"name": "db", "policy": "soft-affinity", "project_id": "acme"},
    ],
}

#: What Nova's APIs do not expose, so an import cannot carry it: the compute's own
#: stats beyond its workload, failed_builds, NUMA/PCI, metrics. (supported_instances is
#: derived from cpu_info's arch for libvirt hosts, as the source file's hosts give it.)
NOT_IN_NOVA = ("failed_builds", "numa_topology", "pci_stats", "metrics")


def _import(local: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(local.clouds_yaml))
    return read_openstack(OpenStackAPI.connect("fake"))


def test_every_field_nova_and_placement_expose_round_trips(
        local_cloud_factory: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from berth.cloudio.emit import dump, to_document

    local = local_cloud_factory(SOURCE)
    state = _import(local, monkeypatch)
    doc = to_document(state)
    assert {h.get("nodename", h["host"]): h["uuid"] for h in doc["hosts"]} == {
        local.cloud.snapshot.obj("nodename")[r]: local.cloud.snapshot.obj("uuid")[r]
        for r in range(len(local.cloud.snapshot))}
    out = tmp_path / "imported.yaml"
    dump(doc, str(out))
    imported = load_cloud(str(out), now=local.now)
    assert differences(node_views(local.cloud), node_views(imported), ignore=NOT_IN_NOVA) == []
    assert cloud_views(imported) == cloud_views(local.cloud)
    assert state.warnings == []


def test_the_reads_use_current_microversions_and_follow_every_page(
        local_cloud_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    local = local_cloud_factory(SOURCE)
    _import(local, monkeypatch)
    asked = {(path, version) for method, path, version in local.app.requests
             if path.startswith("/compute/v2.1/")}
    assert ("/compute/v2.1/os-hypervisors/detail", "2.88") in asked
    assert ("/compute/v2.1/os-hypervisors/detail", "2.87") in asked  # cpu_info, workload
    assert ("/compute/v2.1/servers/detail", "2.100") in asked
    assert ("/compute/v2.1/os-server-groups", "2.64") in asked
    # Four servers and six nodes at two per page; Nova links a next page to every full
    # one, so the last page read is empty.
    pages = [p for m, p, v in local.app.requests if p == "/compute/v2.1/servers/detail"]
    assert len(pages) == 3
    assert len([p for m, p, v in local.app.requests
                if p == "/compute/v2.1/os-hypervisors/detail"]) == 2 * 4


def test_an_older_cloud_answers_in_its_older_shapes_and_imports_the_same(
        local_cloud_factory: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """At 2.60: sizes and cpu_info in the one hypervisor listing, extra specs from
    os-extra_specs, a server's flavor as an id, a group's policy in ``policies``."""
    from berth.cloudio.emit import dump, to_document

    local = local_cloud_factory(SOURCE, max_version="2.60")
    state = _import(local, monkeypatch)
    out = tmp_path / "old.yaml"
    dump(to_document(state), str(out))
    imported = load_cloud(str(out), now=local.now)
    assert differences(node_views(local.cloud), node_views(imported), ignore=NOT_IN_NOVA) == []
    # Rules (max_server_per_host) came with 2.64; an older cloud has none to give.
    expected = cloud_views(local.cloud)
    expected["server_groups"]["web"]["rules"] = {}
    assert cloud_views(imported) == expected
    assert {v for m, p, v in local.app.requests if p.startswith("/compute/v2.1/")} == {"2.60"}
    assert any(p.endswith("/os-extra_specs") for m, p, v in local.app.requests)


def _placement_extras(local: Any) -> dict[str, str]:
    """Give the registered cloud what Placement can say beyond the standard classes."""
    client = local.stack.client
    snap = local.cloud.snapshot
    cmp1 = snap.obj("uuid")[snap.row_of("cmp1")]
    client.create_resource_class("CUSTOM_GPU")
    generation, inventory = client.get_inventories(cmp1)
    inventory = {**inventory,
                 "CUSTOM_GPU": {"total": 4, "reserved": 0, "min_unit": 1, "max_unit": 2,
                                "step_size": 1, "allocation_ratio": 1.0},
                 "PCPU": {"total": 8, "reserved": 0, "min_unit": 1, "max_unit": 8,
                          "step_size": 1, "allocation_ratio": 1.0}}
    generation = client.set_inventories(cmp1, generation, inventory)
    client.create_trait("CUSTOM_RACK_A")
    client.set_provider_traits(cmp1, generation, ["HW_CPU_X86_AVX2", "CUSTOM_RACK_A"])
    pf = client.create_provider("cmp1_pf0", parent_provider_uuid=cmp1)
    generation = client.set_inventories(pf.uuid, pf.generation, {
        "SRIOV_NET_VF": {"total": 16, "reserved": 0, "min_unit": 1, "max_unit": 16,
                         "step_size": 1, "allocation_ratio": 1.0}})
    client.create_trait("CUSTOM_PHYSNET_NET1")
    client.set_provider_traits(pf.uuid, generation, ["CUSTOM_PHYSNET_NET1"])
    nfs = client.create_provider("nfs1")
    generation = client.set_inventories(nfs.uuid, nfs.generation, {
        "DISK_GB": {"total": 10000, "reserved": 100, "min_unit": 1, "max_unit": 10000,
                    "step_size": 1, "allocation_ratio": 1.0}})
    generation = client.set_provider_traits(nfs.uuid, generation, ["MISC_SHARES_VIA_AGGREGATE"])
    az1 = next(a.uuid for a in snap.aggregates if a.name == "az1")
    client.set_aggregates(nfs.uuid, generation, [az1])
    client.create_provider("stray")
    return {"cmp1": cmp1, "pf": pf.uuid, "nfs": nfs.uuid}


def test_placement_traits_resources_and_nested_and_sharing_providers_are_written(
        local_cloud_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from berth.cloudio.emit import build_document

    local = local_cloud_factory(SOURCE)
    ids = _placement_extras(local)
    state = _import(local, monkeypatch)
    doc = build_document(state)
    hosts = {(h["host"], h.get("nodename", h["host"])): h for h in doc["hosts"]}
    cmp1 = hosts[("cmp1", "cmp1")]
    assert cmp1["traits"] == ["CUSTOM_RACK_A", "HW_CPU_X86_AVX2"]
    assert cmp1["resources"] == {"CUSTOM_GPU": {"total": 4, "max_unit": 2}}
    assert cmp1["cpu_dedicated_set"] == "32-39"  # after the 32 shared CPUs
    assert cmp1["providers"] == [{"name": "pf0",
                                  "resources": {"SRIOV_NET_VF": {"total": 16, "max_unit": 16}},
                                  "traits": ["CUSTOM_PHYSNET_NET1"]}]
    # The disabled host's COMPUTE_STATUS_DISABLED is its service state, not a trait.
    # (cmp2 lists no traits in the source file: it has what its libvirt driver reports.)
    assert "COMPUTE_STATUS_DISABLED" not in hosts[("cmp2", "cmp2")]["traits"]
    assert "COMPUTE_NODE" in hosts[("cmp2", "cmp2")]["traits"]
    assert hosts[("cmp2", "cmp2")]["service"] == {"disabled": True,
                                                  "disabled_reason": "maintenance"}
    assert doc["sharing_providers"] == [{
        "name": "nfs1", "uuid": ids["nfs"], "resources": {"DISK_GB": {"total": 10000, "reserved": 100,
                                                  "max_unit": 10000}},
        "aggregates": ["az1"]}]
    assert any(w.startswith("resource provider stray (") and w.endswith(
        "neither a compute node nor shared (MISC_SHARES_VIA_AGGREGATE); left out")
        for w in state.warnings)


def test_fields_this_berth_cannot_load_yet_are_left_out_with_one_warning_each(
        local_cloud_factory: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from berth import cloudfile
    from berth.cloudio.emit import PLACEMENT_HOST_FIELDS, to_document

    local = local_cloud_factory(SOURCE)
    _placement_extras(local)
    state = _import(local, monkeypatch)
    doc = to_document(state)
    cmp1 = next(h for h in doc["hosts"] if h["host"] == "cmp1")
    for key in PLACEMENT_HOST_FIELDS:
        if key in cloudfile.HOST_FIELDS:
            assert key in cmp1
        else:
            assert key not in cmp1
            assert f"compute nodes cmp1: {key} left out (this Berth's cloud files do not " \
                   "carry it yet)" in state.warnings
    assert ("sharing_providers" in doc) == ("sharing_providers" in cloudfile.TOP_LEVEL)


def test_bad_data_from_the_cloud_is_warned_about_by_name_and_left_out(
        local_cloud_factory: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from .fake_openstack import new_uuid

    source = copy.deepcopy(SOURCE)
    source["images"].append({"name": "odd", "disk_format": "qcow2",
                             "properties": {"hw_architecture": "pdp11", "os_distro": "bsd"}})
    local = local_cloud_factory(_without_bad_image(source))
    local.app.doc = source  # Glance serves the bad image; the source file could not hold it
    local.app.extra = {
        "hypervisor": {"cmp3": {"frobnicate": 1}, "cmp4": {"frobnicate": 2}},
        "server": {"0b8f9c3e-0000-4000-8000-000000000003": {
            "OS-EXT-SRV-ATTR:host": "ghost", "OS-EXT-SRV-ATTR:hypervisor_hostname": "ghost"}},
        "flavor": {"m1.large": {"vcpus": "lots"}},
        "aggregate": {"ssd": {"hosts": ["cmp1", "gone"]}},
        "server group": {"db": {"policy": "best-effort"}},
    }
    local.app.drop_service_host = {"ironic1"}
    shelved = new_uuid()
    local.app.unplaced_servers = [shelved]
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(local.clouds_yaml))
    out = tmp_path / "bad.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "berth.cli", "cloud", "import", "--os-cloud", "fake", "-o", str(out)],
        capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    node_a, node_b = (local.cloud.snapshot.obj("uuid")[local.cloud.snapshot.row_of("ironic1", n)]
                      for n in ("node-a", "node-b"))
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    for expected in [
        "warning: hypervisors cmp3 ({}), cmp4 ({}): unknown field 'frobnicate'; ignored",
        f"warning: hypervisor node-a ({node_a}): no service host; left out",
        f"warning: hypervisor node-b ({node_b}): no service host; left out",
        "warning: flavor m1.large (m1.large): vcpus: expected an integer, got 'lots'; left out",
        "warning: image odd ({}): property hw_architecture: ",
        "warning: server 0b8f9c3e-0000-4000-8000-000000000003: runs on ghost/ghost, which is "
        "no compute node read; left out",
        "warning: server 0b8f9c3e-0000-4000-8000-000000000004: runs on ironic1/node-a, which "
        "is no compute node read; left out",
        "warning: 1 server(s) on no host (never scheduled, or shelved offloaded): left out",
        "warning: aggregate ssd: host 'gone' is no compute host read; left out of it",
        "warning: aggregate az1: host 'ironic1' is no compute host read; left out of it",
        "warning: server group db (",
        "warning: server group web (",
    ]:
        head = expected.split("{}")[0]
        assert any(w.startswith(head) for w in warnings), (expected, warnings)
    cloud = load_cloud(str(out))
    assert "m1.large" not in cloud.flavors
    assert cloud.images["odd"].properties.raw == {"os_distro": "bsd"}
    assert "db" not in cloud.server_groups
    assert cloud.server_groups["web"].members == ["0b8f9c3e-0000-4000-8000-000000000001"]
    assert result.stderr.strip().splitlines()[-1].startswith("wrote " + str(out) + ": 4 compute nodes")


def _without_bad_image(source: dict[str, Any]) -> dict[str, Any]:
    clean = copy.deepcopy(source)
    clean["images"] = [i for i in clean["images"] if i["name"] != "odd"]
    return clean


def test_the_command_writes_json_that_berth_schedule_takes_unchanged(
        local_cloud_factory: Any, tmp_path: Path) -> None:
    local = local_cloud_factory(SOURCE)
    out = tmp_path / "cloud.json"
    env = {**os.environ, "OS_CLIENT_CONFIG_FILE": str(local.clouds_yaml), "OS_CLOUD": "fake"}
    result = subprocess.run([sys.executable, "-m", "berth.cli", "cloud", "import", "-o", str(out)],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert out.read_text().lstrip().startswith("{")
    scheduled = subprocess.run(
        [sys.executable, "-m", "berth.cli", "schedule", str(out), "--flavor", "m1.large",
         "--image", "ubuntu", "--az", "az1", "--seed", "1", "--json"],
        capture_output=True, text=True, timeout=120)
    assert scheduled.returncode == 0, scheduled.stderr


def test_an_unreachable_or_refusing_cloud_is_one_line_and_exit_7(
        local_cloud_factory: Any, tmp_path: Path) -> None:
    config = tmp_path / "clouds.yaml"
    config.write_text(
        "clouds:\n  nowhere:\n    auth: {auth_url: 'http://127.0.0.1:9/identity/v3', "
        "username: a, password: b, project_name: c, user_domain_name: Default, "
        "project_domain_name: Default}\n    identity_api_version: 3\n")
    env = {**os.environ, "OS_CLIENT_CONFIG_FILE": str(config)}
    for cloud in ("nowhere", "unknown"):
        result = subprocess.run(
            [sys.executable, "-m", "berth.cli", "cloud", "import", "--os-cloud", cloud],
            capture_output=True, text=True, timeout=120, env=env)
        assert result.returncode == 7, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Cloud unknown was not found" in result.stderr


def test_a_wrong_password_is_one_line_naming_the_refusal(local_cloud_factory: Any) -> None:
    local = local_cloud_factory(SOURCE)
    local.clouds_yaml.write_text(local.clouds_yaml.read_text().replace("secret", "wrong"))
    result = subprocess.run(
        [sys.executable, "-m", "berth.cli", "cloud", "import", "--os-cloud", "fake"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "OS_CLIENT_CONFIG_FILE": str(local.clouds_yaml)})
    assert result.returncode == 7
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "requires authentication" in lines[0], result.stderr


def test_without_openstacksdk_the_command_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from berth.errors import CloudSourceError

    monkeypatch.setitem(sys.modules, "openstack", None)
    with pytest.raises(CloudSourceError, match=r"needs openstacksdk.*berth\[openstack\]"):
        OpenStackAPI.connect("fake")


def test_a_reserved_amount_the_configuration_does_not_give_is_warned_about(
        local_cloud_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from berth.cloudio.emit import build_document

    local = local_cloud_factory(SOURCE)
    client = local.stack.client
    cmp3 = local.cloud.snapshot.obj("uuid")[local.cloud.snapshot.row_of("cmp3")]
    generation, inventory = client.get_inventories(cmp3)
    inventory["VCPU"] = {**inventory["VCPU"], "reserved": 2}
    client.set_inventories(cmp3, generation, inventory)
    state = _import(local, monkeypatch)
    doc = build_document(state)
    assert next(h for h in doc["hosts"] if h["host"] == "cmp3")["vcpus_used"] == 2
    assert state.warnings == [
        "compute nodes cmp3: VCPU reserved 2 differs from [DEFAULT] reserved_host_cpus (0) of "
        "the configuration, and a cloud file holds no per-host reserved amount: schedule with "
        "a nova.conf that sets reserved_host_cpus"]


def test_objects_of_the_wrong_shape_are_left_out_by_name_not_with_a_traceback(
        local_cloud_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    local = local_cloud_factory(SOURCE)
    local.app.extra = {"aggregate": {"ssd": {"metadata": ["ssd", "true"]}},
                       "server group": {"db": {"members": 5}},
                       "hypervisor": {"cmp3": {"service": "cmp3"}}}
    state = _import(local, monkeypatch)
    assert [w for w in state.warnings if "unreadable" in w or "no service host" in w] == [
        f"hypervisor cmp3 ({local.cloud.snapshot.obj('uuid')[local.cloud.snapshot.row_of('cmp3')]})"
        ": no service host; left out",
        "aggregate ssd (3): unreadable ('list' object has no attribute 'items'); left out",
        "server group db (dc0ed62d-ed4d-561b-9a7f-17597127f51d): unreadable ('int' object is "
        "not iterable); left out"]
    assert {a["name"] for a in state.aggregates} == {"az1", "az2", "acme-only"}
