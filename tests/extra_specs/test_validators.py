"""Extra-spec validators: built-in keys, plugin registration and ``check_flavor``."""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import pytest

from berth.errors import ConfigError
from berth.extra_specs.validators import (
    ExtraSpecValidator,
    ValidatorRegistry,
    builtin_validators,
    check_flavor,
    plugin_validators,
)


@pytest.mark.parametrize(
    "extra_specs",
    [
        {},
        {"hw:cpu_policy": "dedicated", "hw:cpu_thread_policy": "isolate"},
        {"hw:numa_nodes": "2", "hw:numa_cpus.0": "0-3,^2", "hw:numa_mem.0": "1024",
         "hw:numa_cpus.1": "4,5", "hw:numa_mem.1": "2048"},
        {"hw:mem_page_size": "2MB"},
        {"hw:mem_page_size": "large"},
        {"hw:mem_encryption": "true", "hw:mem_encryption_model": "amd-sev-snp"},
        {"hw:mem_encryption": "true", "hw:mem_encryption_model": "intel-tdx"},
        {"hw:maxphysaddr_bits": "42", "hw:emulator_threads_policy": "isolate"},
        {"pci_passthrough:alias": "a1:2, gpu:1"},
        {"trust:trusted_host": "trusted"},
        {"resources:VCPU": "0", "resources1:CUSTOM_FPGA": "2", "resources_gpu:PCPU": "4"},
        {"trait:HW_CPU_X86_AVX2": "required", "trait1:CUSTOM_MAGIC": "forbidden"},
        {"group_policy": "isolate"},
        {"aggregate_instance_extra_specs:ssd": "true", "capabilities:cpu_info:features": "<all-in> aes mmx"},
        {"accel:device_profile": "fpga-profile", "hw:tpm_secret_security": "deployment"},
        {"ssd": "true", "free_ram_mb": ">= 4096", "XXYY": "anything"},
        {"acme:foo": "whatever", "vendor:knob": "100"},
        {"quota:cpu_shares": "100", "quota:cpu_period": "0", "quota:disk_read_iops_sec": "500",
         "quota:vif_outbound_burst": "65536", "quota:memory_limit": "0", "quota:cpu_quota": "-1",
         "quota:cpu_shares_level": "custom", "quota:disk_io_shares_share": "2000"},
        {"vmware:hw_version": "vmx-13", "vmware:storage_policy": "gold"},
        {"powervm:min_mem": "256", "powervm:proc_units": "0.50", "powervm:dedicated_proc": "false",
         "powervm:shared_weight": "255", "powervm:processor_compatibility": "POWER6+_Enhanced",
         "powervm:dedicated_sharing_mode": "keep_idle_procs", "powervm:shared_proc_pool_name": "pool1"},
        {"hw:cpu_realtime": "YES", "hw:vif_multiqueue_enabled": "0"},
        {"hw:pmem": "small,small,large"},
    ],
    ids=[
        "no extra specs",
        "pinning policies",
        "an explicit NUMA topology",
        "a page size with a unit",
        "a named page size",
        "AMD SEV-SNP memory encryption",
        "Intel TDX memory encryption",
        "an int and an enum",
        "PCI aliases with counts",
        "a trust level",
        "resources in unnumbered, numbered and named groups",
        "standard and custom traits",
        "a group policy",
        "scoped capability and aggregate specs with operators",
        "accelerators and vTPM secret security",
        "unscoped keys are capabilities",
        "keys of unknown namespaces are allowed",
        "libvirt and VMware quotas",
        "VMware strings",
        "PowerVM LPAR settings",
        "booleans in any accepted spelling",
        "persistent memory namespaces",
    ],
)
def test_good_flavors_have_no_problems(extra_specs: dict[str, str]) -> None:
    assert check_flavor(extra_specs) == []


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("hw:cpu_policy", "fancy", "hw:cpu_policy='fancy': must be one of shared, dedicated, mixed"),
        ("hw:numa_nodes", "0", "hw:numa_nodes='0': must be an integer >= 1"),
        ("hw:numa_nodes", "two", "hw:numa_nodes='two': must be an integer"),
        ("hw:numa_cpus.0", "0-3;5", "hw:numa_cpus.0='0-3;5': must match"),
        ("hw:mem_page_size", "huge", "hw:mem_page_size='huge': must match"),
        ("hw:cpu_realtime", "maybe", "hw:cpu_realtime='maybe': must be a boolean"),
        ("hw:cpu_polcy", "dedicated", "hw:cpu_polcy: not a known extra spec in namespace 'hw' (did you mean hw:cpu_policy?)"),
        ("hw:numa_mem.x", "1", "hw:numa_mem.x: not a known extra spec in namespace 'hw'"),
        ("resources:VCPUS", "1", "resources:VCPUS: not a known extra spec in namespace 'resources' (expected resources{group}:{resource_class}"),
        ("resources:VCPU", "1.5", "resources:VCPU='1.5': must be an integer"),
        ("trait:HW_NOPE", "required", "not a known extra spec in namespace 'trait'"),
        ("trait:HW_CPU_X86_AVX2", "preferred", "must be one of required, forbidden"),
        ("group_policy", "all", "group_policy='all': must be one of none, isolate"),
        ("capabilities:foo", "= many", "capabilities:foo='= many': operator '=' compares numbers, but 'many' is not a number"),
        ("aggregate_instance_extra_specs:x", "<or>", "'<or>' needs at least one candidate"),
        ("ssd", ">= yes", "ssd='>= yes': operator '>=' compares numbers"),
        ("pci_passthrough:alias", "a1", "pci_passthrough:alias='a1': must match"),
        ("hw:cpu_policy", 3, "hw:cpu_policy=3: extra spec values must be strings"),
        ("acme:foo", 3, "acme:foo=3: extra spec values must be strings"),
        ("trust:trusted_host", "maybe", "must be one of trusted, untrusted, unknown"),
        ("quota:cpu_shares", "-1", "quota:cpu_shares='-1': must be an integer >= 0"),
        ("quota:disk_total_bytes_sec", "10MB", "quota:disk_total_bytes_sec='10MB': must be an integer"),
        ("quota:vif_inbound_peek", "1", "quota:vif_inbound_peek: not a known extra spec in namespace 'quota' (did you mean quota:vif_inbound_peak?)"),
        ("quota:cpu_limit", "lots", "quota:cpu_limit='lots': must be an integer"),
        ("vmware:hw_versoin", "vmx-13", "not a known extra spec in namespace 'vmware' (did you mean vmware:hw_version?)"),
        ("powervm:min_mem", "128", "powervm:min_mem='128': must be an integer >= 256"),
        ("powervm:shared_weight", "256", "powervm:shared_weight='256': must be an integer between 0 and 255"),
        ("powervm:proc_units", "1", "powervm:proc_units='1': must be a decimal such as 0.5"),
        ("powervm:uncapped", "sometimes", "powervm:uncapped='sometimes': must be a boolean"),
        ("powervm:processor_compatibility", "POWER9", "must be one of default, POWER6, POWER6+"),
    ],
    ids=[
        "an enum value outside the enum",
        "an int below its minimum",
        "an int that is not an int",
        "a CPU set with a bad separator",
        "an unknown page size",
        "a boolean that is not one",
        "a typo in a known namespace suggests the key",
        "a bad NUMA node index",
        "an unknown resource class explains the key shape",
        "a resource amount that is not an integer",
        "an unknown trait",
        "a trait value that is neither required nor forbidden",
        "an unknown group policy",
        "a capability with a non-numeric operand",
        "an aggregate spec with a bare <or>",
        "an unscoped key's grammar is checked",
        "an alias without a count",
        "a non-string value of a known key",
        "a non-string value of an unknown key",
        "an unknown trust level",
        "a negative libvirt CPU quota",
        "a disk throttle with a unit",
        "a typo in the quota namespace suggests the key",
        "a VMware limit that is not an int",
        "a typo in the vmware namespace suggests the key",
        "PowerVM memory below 256 MB",
        "a shared weight above 255",
        "processing units that are not a decimal",
        "a PowerVM boolean that is not one",
        "an unknown processor compatibility mode",
    ],
)
def test_each_bad_key_or_value_is_one_clear_problem(key: str, value: Any, expected: str) -> None:
    problems = check_flavor({key: value})
    assert len(problems) == 1
    assert expected in problems[0]


def test_problems_come_in_key_order_one_per_bad_key() -> None:
    problems = check_flavor({"hw:cpu_policy": "x", "ok": "1", "hw:numa_nodes": "0"})
    assert [p.split("=")[0] for p in problems] == ["hw:cpu_policy", "hw:numa_nodes"]


def test_every_builtin_has_a_description_and_a_distinct_name() -> None:
    validators = builtin_validators()
    assert all(v.description.endswith(".") for v in validators)
    assert len({v.name for v in validators}) == len(validators)
    names = {v.name for v in validators}
    for required in ("hw:cpu_policy", "hw:cpu_thread_policy", "hw:numa_nodes", "hw:numa_cpus.{N}",
                     "hw:numa_mem.{N}", "hw:mem_page_size", "hw:maxphysaddr_bits",
                     "hw:emulator_threads_policy", "pci_passthrough:alias", "trust:trusted_host",
                     "resources{group}:{resource_class}", "trait{group}:{trait}", "group_policy",
                     "aggregate_instance_extra_specs:{key}", "capabilities:{key}",
                     "accel:device_profile", "hw:tpm_secret_security", "quota:cpu_shares",
                     "quota:cpu_period", "quota:cpu_quota", "quota:cpu_limit",
                     "quota:cpu_reservation", "quota:cpu_shares_level",
                     "quota:cpu_shares_share", "quota:memory_limit", "quota:disk_io_limit",
                     "quota:vif_reservation", "quota:disk_write_bytes_sec",
                     "quota:disk_total_iops_sec", "quota:vif_inbound_average",
                     "quota:vif_outbound_peak", "vmware:hw_version", "vmware:storage_policy",
                     "powervm:min_mem", "powervm:max_mem", "powervm:min_vcpu",
                     "powervm:max_vcpu", "powervm:proc_units", "powervm:min_proc_units",
                     "powervm:max_proc_units", "powervm:dedicated_proc", "powervm:uncapped",
                     "powervm:shared_weight", "powervm:availability_priority",
                     "powervm:dedicated_sharing_mode", "powervm:processor_compatibility",
                     "powervm:shared_proc_pool_name", "powervm:srr_capability"):
        assert required in names


# ---------------------------------------------------------------- plugins
@dataclass
class FakeEntryPoint:
    """An entry point whose load() returns a prepared module."""

    name: str
    value: str
    module: Any

    def load(self) -> Any:
        if isinstance(self.module, Exception):
            raise self.module
        return self.module


def acme_module() -> types.ModuleType:
    """Seed 000's acmefilter.validators, written against Berth."""
    module = types.ModuleType("acmefilter.validators")

    def register() -> list[ExtraSpecValidator]:
        return [ExtraSpecValidator(name="acme:foo", description="My custom extra spec.",
                                   value={"type": str, "enum": ["bar", "baz"]})]

    module.register = register  # type: ignore[attr-defined]
    return module


def registry_with(*entry_points: FakeEntryPoint) -> ValidatorRegistry:
    return ValidatorRegistry([*builtin_validators(), *plugin_validators(list(entry_points))])


def test_a_registered_plugin_validator_checks_its_key_and_claims_its_namespace() -> None:
    registry = registry_with(FakeEntryPoint("acme", "acmefilter.validators", acme_module()))
    assert check_flavor({"acme:foo": "bar"}, registry) == []
    assert check_flavor({"acme:foo": "qux"}, registry) == ["acme:foo='qux': must be one of bar, baz"]
    assert check_flavor({"acme:fo": "bar"}, registry) == [
        "acme:fo: not a known extra spec in namespace 'acme' (did you mean acme:foo?)"
    ]


def test_nova_style_validator_objects_and_dicts_are_accepted() -> None:
    class NovaStyle:
        def __init__(self, **kw: Any) -> None:
            self.__dict__.update(kw)

    module = types.ModuleType("novaish")
    module.register = lambda: [  # type: ignore[attr-defined]
        NovaStyle(name="novaish:level", description="A level.", value={"type": int, "min": 1, "max": 3}),
        {"name": "novaish:slot.{N}", "description": "A slot.", "value": {"type": "bool"},
         "parameters": [{"name": "N", "pattern": r"\d+"}]},
    ]
    registry = registry_with(FakeEntryPoint("novaish", "novaish", module))
    assert check_flavor({"novaish:level": "2", "novaish:slot.3": "on"}, registry) == []
    assert check_flavor({"novaish:level": "5"}, registry) == ["novaish:level='5': must be an integer between 1 and 3"]
    assert check_flavor({"novaish:slot.x": "on"}, registry)[0].startswith("novaish:slot.x: not a known")


@pytest.mark.parametrize(
    ("module", "message"),
    [
        (ImportError("no module named acmefilter"), "failed to load: no module named acmefilter"),
        (types.ModuleType("empty"), "has no register() function"),
        (types.SimpleNamespace(register=lambda: "acme:foo"), "register() returned str, not a list"),
        (types.SimpleNamespace(register=lambda: [42]), "is not an extra spec validator"),
        (types.SimpleNamespace(register=lambda: [{"name": "x:y", "description": "d", "value": {"kind": "str"}}]),
         "unknown value keys ['kind']"),
        (types.SimpleNamespace(register=lambda: [{"name": "x:{k}", "description": "d"}]),
         "placeholders ['k'] have no parameter pattern"),
        (types.SimpleNamespace(register=lambda: [{"name": "x:y", "description": "d", "value": {"type": float}}]),
         "is not str, int or bool"),
    ],
    ids=[
        "a module that fails to import",
        "a module without register()",
        "register() returning a string",
        "register() returning a non-validator",
        "a value rule with an unknown key",
        "a placeholder without a pattern",
        "an unsupported value type",
    ],
)
def test_broken_plugins_are_config_errors_naming_the_entry_point(module: Any, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        plugin_validators([FakeEntryPoint("acme", "acmefilter.validators", module)])
    assert message in str(err.value)


def test_a_plugin_may_not_redefine_a_builtin_key() -> None:
    module = types.SimpleNamespace(register=lambda: [{"name": "hw:cpu_policy", "description": "Mine."}])
    with pytest.raises(ConfigError, match="'hw:cpu_policy' is registered twice"):
        registry_with(FakeEntryPoint("acme", "acme", module))


def test_every_enum_value_and_range_bound_of_the_builtins_is_accepted() -> None:
    for validator in builtin_validators():
        if validator.is_template:
            continue
        rule = validator.value
        samples = [str(v) for v in rule.get("enum", [])]
        samples += [str(rule[b]) for b in ("min", "max") if b in rule]
        samples += ["true", "No"] if validator.kind == "bool" else []
        for sample in samples:
            assert check_flavor({validator.name: sample}) == [], (validator.name, sample)


def test_the_package_exports_the_validator_api_for_plugins() -> None:
    import berth.extra_specs as extra_specs

    assert extra_specs.ExtraSpecValidator is ExtraSpecValidator
    assert extra_specs.check_flavor({"group_policy": "none"}) == []
    with pytest.raises(AttributeError):
        extra_specs.nonexistent  # noqa: B018


@pytest.mark.parametrize(("key", "value", "nova_accepts"), [
    # Read off Nova 34's validators (nova/api/validation/extra_specs) in its own
    # environment: 75,924 keys and values from every one of them agree with Berth's.
    ("hw:ephemeral_encryption_format", "luksv2", True),
    ("hw:usb_model", "qemu-xhci", True),
    ("hw:usb_model", "usb3", False),
    ("hw:redirected_usb_ports", "15", True),
    ("hw:redirected_usb_ports", "16", False),
    ("hw:numa_mem.0", "0", False),
    ("hw:pmem", "a_1,b,", True),
    ("hw:pmem", "a, b", False),
    ("hw:pmem", "0-3", False),
    ("os:secure_boot", "optional", False),
    ("quota:memory_limit", "-1", False),
    ("quota:cpu_quota", "-1", True),
    ("quota:disk_io_shares_level", "high", True),
    ("quota:disk_io_shares_level", "bogus", False),
    ("quota:vif_shares_share", "-1", False),
    ("accel:device_profile", "", True),
    ("resources1:VGPU", "-1", True),
    ("hide_hypervisor_id", "true", True),
    ("hide_hypervisor_id", "sometimes", False),
])
def test_validators_accept_what_nova_34_accepts(key: str, value: str, nova_accepts: bool) -> None:
    assert (check_flavor({key: value}) == []) is nova_accepts, check_flavor({key: value})


def test_a_long_pmem_value_is_read_without_backtracking() -> None:
    """Nova's pattern nests repetitions (it backtracks exponentially on a long label
    followed by a bad character); Berth's accepts the same strings in linear time."""
    assert check_flavor({"hw:pmem": "a" * 5000 + "!"})
    assert check_flavor({"hw:pmem": ",".join(["label_1"] * 2000)}) == []
