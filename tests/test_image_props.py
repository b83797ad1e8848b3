"""Image properties typed as Nova's ImageMetaProps types them (berth.model.image_props)."""

from __future__ import annotations

from typing import Any

import pytest

from berth.errors import InputError
from berth.hardware.numa import numa_topology_from_request
from berth.model import Flavor, ImageMeta, ImageMetaProps, RequestSpec
from berth.model.image_props import FIELD_TYPES, PER_NODE_FIELDS, ImagePropertyError
from berth.model.request import IMAGE_PROPERTY_FIELDS
from berth.request_filters import packed_virtqueue_filter
from berth.resource_request import from_request_spec as resource_request_from_spec


@pytest.mark.parametrize(
    ("props", "name", "expected"),
    [
        ({"hw_cpu_cores": "4"}, "hw_cpu_cores", 4),
        ({"hw_cpu_cores": " 4 "}, "hw_cpu_cores", 4),
        ({"hw_video_ram": 64}, "hw_video_ram", 64),
        ({"hw_maxphysaddr_bits": "42"}, "hw_maxphysaddr_bits", 42),
        ({"hw_boot_menu": "0"}, "hw_boot_menu", False),
        ({"hw_boot_menu": "false"}, "hw_boot_menu", False),
        ({"hw_boot_menu": "No"}, "hw_boot_menu", False),
        ({"hw_boot_menu": "off"}, "hw_boot_menu", False),
        ({"hw_boot_menu": "maybe"}, "hw_boot_menu", False),
        ({"hw_boot_menu": 2}, "hw_boot_menu", False),
        ({"hw_boot_menu": "1"}, "hw_boot_menu", True),
        ({"hw_boot_menu": " TRUE "}, "hw_boot_menu", True),
        ({"hw_boot_menu": "yes"}, "hw_boot_menu", True),
        ({"hw_boot_menu": "on"}, "hw_boot_menu", True),
        ({"hw_boot_menu": "t"}, "hw_boot_menu", True),
        ({"hw_boot_menu": True}, "hw_boot_menu", True),
        ({"hw_architecture": "AMD64"}, "hw_architecture", "x86_64"),
        ({"hw_architecture": "i386"}, "hw_architecture", "i686"),
        ({"img_hv_type": "XAPI"}, "img_hv_type", "xen"),
        ({"hw_vm_mode": "pv"}, "hw_vm_mode", "xen"),
        ({"hw_vm_mode": "baremetal"}, "hw_vm_mode", "hvm"),
        ({"os_type": "Windows"}, "os_type", "windows"),
        ({"hw_scsi_model": "lsiLogicSAS"}, "hw_scsi_model", "lsisas1068"),
        ({"hw_scsi_model": "paraVirtual"}, "hw_scsi_model", "vmpvscsi"),
        ({"hw_vif_model": "VirtualE1000"}, "hw_vif_model", "e1000"),
        ({"hw_tpm_version": 2.0}, "hw_tpm_version", "2.0"),
        ({"os_distro": 7}, "os_distro", "7"),
        ({"hw_mem_page_size": 2048}, "hw_mem_page_size", "2048"),
        ({"img_hv_requested_version": ">=6.0,<7"}, "img_hv_requested_version", ">=6.0,<7"),
        ({"img_mappings": '[{"virtual": "root", "device": "/dev/vda"}]'}, "img_mappings",
         [{"virtual": "root", "device": "/dev/vda"}]),
        ({"img_block_device_mapping": [{"boot_index": 0, "volume_id": None}]},
         "img_block_device_mapping", [{"boot_index": "0", "volume_id": None}]),
    ],
    ids=[
        "an integer from text", "an integer from padded text", "an integer as given",
        "a non-negative integer", "0 is false", "false is false", "No is false", "off is false",
        "an unknown word is false, not an error", "2 is false (only 1 is a true number)",
        "1 is true", "TRUE in any case and padding is true", "yes is true", "on is true",
        "t is true", "a boolean as given", "AMD64 is x86_64", "i386 is i686", "xapi is xen",
        "pv is xen", "baremetal is hvm", "os_type is lower-cased",
        "the VMware SCSI adapter name", "paravirtual is vmpvscsi", "the VMware NIC name",
        "a YAML float of a text enum", "numbers written out for a string",
        "a page size number is kept as text", "a version predicate is kept as text",
        "mappings as JSON text", "a block device mapping's values become text",
    ],
)
def test_each_field_is_coerced_to_its_type(props: dict[str, Any], name: str, expected: Any) -> None:
    value = ImageMetaProps(props).get(name)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"hw_cpu_cores": "lots"}, "image property hw_cpu_cores: expected an integer, got 'lots'"),
        ({"hw_cpu_cores": "4.0"}, "hw_cpu_cores: expected an integer, got '4.0'"),
        ({"hw_cpu_cores": True}, "hw_cpu_cores: expected an integer, got True"),
        ({"hw_maxphysaddr_bits": "-1"}, "hw_maxphysaddr_bits: expected an integer >= 0"),
        ({"hw_disk_bus": "nvme"}, "hw_disk_bus: expected one of fdc, ide, sata, scsi, usb, virtio, "
                                  "xen, lxc, uml, got 'nvme'"),
        ({"hw_cpu_policy": "Dedicated"}, "hw_cpu_policy: expected one of dedicated, shared, mixed"),
        ({"hw_vm_mode": ""}, "hw_vm_mode: expected one of exe, hvm, uml, xen, got ''"),
        ({"hw_architecture": "z80"}, "hw_architecture: expected one of alpha"),
        ({"architecture": "z80"}, "image property architecture: expected one of"),
        ({"img_hv_requested_version": "six"}, "img_hv_requested_version: expected a version "
                                              "predicate such as '>=6.0,<7', got 'six'"),
        ({"os_distro": ["ubuntu"]}, "os_distro: expected a string, got ['ubuntu']"),
        ({"traits_required": "HW_CPU_X86_AVX2"}, "traits_required: expected a list of strings"),
        ({"hw_numa_cpus.0": "0-1", "hw_numa_cpus.1": "3-2"},
         "hw_numa_cpus.1: expected a CPU set such as '0-3,^2' (invalid CPU range '3-2')"),
        ({"hw_numa_mem.0": "1GB"}, "hw_numa_mem.0: expected an integer, got '1GB'"),
        ({"img_mappings": "{not json"}, "img_mappings: expected a list of mappings"),
        ({"vmware_adaptertype": "floppy"}, "vmware_adaptertype: expected one of buslogic"),
    ],
    ids=[
        "a word for an integer", "a decimal for an integer", "a boolean for an integer",
        "a negative count of bits", "an unknown disk bus", "enums are case-sensitive",
        "an empty enum", "an unknown architecture", "a bad value under a legacy name",
        "a version that is not a predicate", "a list for a string", "a string for a list",
        "a bad CPU range of a NUMA node", "a memory size with a unit", "mappings that are not JSON",
        "an unknown VMware adapter type",
    ],
)
def test_a_value_that_does_not_fit_is_an_input_error_naming_the_property(
        props: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError) as err:
        ImageMeta(properties=props)  # type: ignore[arg-type]
    assert isinstance(err.value, ImagePropertyError)
    assert message in str(err.value)
    assert err.value.code == "berth.input.image_property"


def test_every_known_field_has_a_type() -> None:
    assert set(FIELD_TYPES) == IMAGE_PROPERTY_FIELDS
    assert set(PER_NODE_FIELDS) <= IMAGE_PROPERTY_FIELDS


def test_guest_numa_nodes_come_from_the_per_node_keys_up_to_the_first_gap() -> None:
    props = ImageMetaProps({"hw_numa_cpus.0": "0-1", "hw_numa_cpus.1": "2,^2,3",
                            "hw_numa_cpus.3": "9", "hw_numa_mem.0": "512", "hw_numa_mem.1": 1024})
    assert props.hw_numa_cpus == [{0, 1}, {3}]
    assert props.hw_numa_mem == [512, 1024]
    assert props.raw["hw_numa_cpus.3"] == "9"


def test_a_lone_numa_value_is_ignored_as_nova_ignores_it_but_a_list_is_taken() -> None:
    assert ImageMetaProps({"hw_numa_cpus": "0-3"}).get("hw_numa_cpus") is None
    assert ImageMetaProps({"hw_numa_cpus": [[0, 1], "2-3"]}).hw_numa_cpus == [{0, 1}, {2, 3}]


def test_legacy_names_translate_and_the_current_name_wins() -> None:
    props = ImageMetaProps({"architecture": "aarch64", "hw_architecture": "x86_64",
                            "hypervisor_type": "QEMU", "vm_mode": "hvm", "ipxe_boot": "yes"})
    assert props.to_dict() == {"hw_architecture": "x86_64", "img_hv_type": "qemu",
                               "hw_vm_mode": "hvm", "hw_ipxe_boot": True}


def test_the_vmware_adapter_type_sets_the_disk_bus_and_scsi_model() -> None:
    assert ImageMetaProps({"vmware_adaptertype": "ide"}).to_dict() == {"hw_disk_bus": "ide"}
    assert ImageMetaProps({"vmware_adaptertype": "lsiLogic"}).to_dict() == {
        "hw_disk_bus": "scsi", "hw_scsi_model": "lsilogic"}
    assert ImageMetaProps({"vmware_adaptertype": "ide", "hw_disk_bus": "virtio"}).hw_disk_bus == "virtio"


def test_required_trait_keys_make_traits_required() -> None:
    props = ImageMetaProps({"trait:HW_CPU_X86_AVX2": "required", "trait:CUSTOM_X": "forbidden",
                            "traits_required": ["CUSTOM_GPU", "HW_CPU_X86_AVX2"]})
    assert props.traits_required == ["HW_CPU_X86_AVX2", "CUSTOM_GPU"]


def test_unknown_names_are_kept_raw_but_never_answered() -> None:
    props = ImageMetaProps({"os": "linux", "hw_cpu_cores": "2", "hw_frobnicate": "lots"})
    assert props.get("os", "default") == "default" and "os" not in props
    assert props.raw == {"os": "linux", "hw_cpu_cores": "2", "hw_frobnicate": "lots"}
    assert props.to_dict() == {"hw_cpu_cores": 2}


def test_typed_values_are_taken_again_unchanged() -> None:
    props = ImageMetaProps({"hw_numa_cpus.0": "0-1", "hw_numa_mem.0": "512", "hw_boot_menu": "on",
                            "trait:CUSTOM_X": "required", "architecture": "amd64", "hw_cpu_cores": "2"})
    assert ImageMetaProps(props.to_dict()) == props


# ----------------------------------------------------------------- consumers read typed values
def _spec(extra_specs: dict[str, str] | None = None, vcpus: int = 4, **image: Any) -> RequestSpec:
    return RequestSpec(flavor=Flavor(name="f", vcpus=vcpus, memory_mb=2048,
                                     extra_specs=extra_specs or {}),
                       image=ImageMeta(properties=image))  # type: ignore[arg-type]


def test_the_numa_request_reads_typed_nodes_cpus_and_memory() -> None:
    spec = _spec(extra_specs={"hw:mem_page_size": "any"}, hw_numa_nodes="2",
                 **{"hw_numa_cpus.0": "0", "hw_numa_cpus.1": "1-3", "hw_numa_mem.0": "512",
                    "hw_numa_mem.1": "1536"}, hw_mem_page_size="2048")
    assert spec.image is not None
    topology = numa_topology_from_request(spec.flavor, spec.image.properties)
    assert topology is not None
    assert [(set(c.cpuset), c.memory) for c in topology.cells] == [({0}, 512), ({1, 2, 3}, 1536)]
    assert {c.pagesize for c in topology.cells} == {2048}


def test_a_false_boolean_in_text_asks_for_nothing() -> None:
    assert not packed_virtqueue_filter(_spec(hw_virtio_packed_ring="no"), None,  # type: ignore[arg-type]
                                       [], None)  # type: ignore[arg-type]
    req = resource_request_from_spec(_spec(hw_mem_encryption="off", hw_firmware_stateless="0"))
    assert "MEM_ENCRYPTION_CONTEXT" not in req.unsuffixed.resources
    assert "COMPUTE_SECURITY_STATELESS_FIRMWARE" not in req.unsuffixed.required_traits
    req = resource_request_from_spec(_spec(hw_mem_encryption="Yes", hw_firmware_stateless="on",
                                           hw_firmware_type="uefi"))
    assert req.unsuffixed.resources["MEM_ENCRYPTION_CONTEXT"] == 1
    assert "COMPUTE_SECURITY_STATELESS_FIRMWARE" in req.unsuffixed.required_traits


def test_image_traits_from_trait_keys_reach_the_placement_request() -> None:
    req = resource_request_from_spec(_spec(**{"trait:HW_CPU_X86_AVX2": "required"}))
    assert "HW_CPU_X86_AVX2" in req.unsuffixed.required_traits
