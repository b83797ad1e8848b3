"""Pre-placement request filters (reference §9), one behaviour per test."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from berth.config import SchedulerConfig
from berth.errors import NoValidHost
from berth.hardware.pci import InstancePCIRequest, InstancePCIRequests
from berth.model.aggregate import Aggregate
from berth.model.request import Flavor, ImageMeta, RequestSpec
from berth.request_filters import (
    ALL_REQUEST_FILTERS,
    FilterContext,
    RequestFilterFailed,
    StaticNetworkLookup,
    accelerators_filter,
    compute_status_filter,
    ephemeral_encryption_filter,
    isolate_aggregates,
    map_az_to_placement_aggregate,
    owner_nova_filter,
    packed_virtqueue_filter,
    process_reqspec,
    remote_managed_ports_filter,
    require_image_type_support,
    require_tenant_aggregate,
    routed_networks_filter,
    tpm_secret_security_filter,
    transform_image_metadata,
    virtio_sound_filter,
)
from berth.resource_request import RequestGroup, RequestLevelParams, resources_from_request_spec

DEFAULT = SchedulerConfig.default()
NO_CTX = FilterContext()
AGGS = [
    Aggregate(1, "t1", uuid="agg-t1", metadata={"filter_tenant_id": "proj"}),
    Aggregate(2, "t2", uuid="agg-t2", metadata={"filter_tenant_id2": "proj"}),
    Aggregate(3, "t3", uuid="agg-t3", metadata={"filter_tenant_id": "proj,other"}),
    Aggregate(4, "az1", uuid="agg-az1", metadata={"availability_zone": "az1"}),
    Aggregate(5, "gpu", uuid="agg-gpu", metadata={"trait:CUSTOM_GPU": "required"}),
    Aggregate(6, "ssd", uuid="agg-ssd", metadata={"trait:CUSTOM_SSD": "required"}),
]


def _spec(extra_specs: dict[str, str] | None = None, image: dict[str, object] | None = None,
          disk_format: str | None = None, **kw: object) -> RequestSpec:
    return RequestSpec(
        flavor=Flavor(name="f", vcpus=1, memory_mb=512, root_gb=1, extra_specs=extra_specs or {}),
        image=ImageMeta(disk_format=disk_format, properties=image or {}), **kw)  # type: ignore[arg-type]


def _config(**scheduler: object) -> SchedulerConfig:
    return DEFAULT.replace("scheduler", **scheduler)


def _root(spec: RequestSpec) -> set[str]:
    return set(spec.request_level_params.root_required) if spec.request_level_params else set()


def test_filters_run_in_novas_order() -> None:
    assert [f.__name__ for f in ALL_REQUEST_FILTERS] == [
        "require_tenant_aggregate", "map_az_to_placement_aggregate",
        "require_image_type_support", "compute_status_filter", "isolate_aggregates",
        "transform_image_metadata", "accelerators_filter", "packed_virtqueue_filter",
        "routed_networks_filter", "remote_managed_ports_filter", "ephemeral_encryption_filter",
        "virtio_sound_filter", "tpm_secret_security_filter", "owner_nova_filter"]


# ----------------------------------------------------------------- tenant aggregates
def test_tenant_aggregates_are_one_or_group_with_exact_value_match() -> None:
    spec = _spec(project_id="proj")
    assert require_tenant_aggregate(spec, _config(limit_tenants_to_placement_aggregate=True),
                                    AGGS, NO_CTX)
    assert spec.requested_destination is not None
    # agg-t3's "proj,other" is not split, unlike AggregateMultiTenancyIsolation.
    assert spec.requested_destination.aggregates == ["agg-t1,agg-t2"]


def test_tenant_filter_is_off_by_default() -> None:
    spec = _spec(project_id="proj")
    assert not require_tenant_aggregate(spec, DEFAULT, AGGS, NO_CTX)
    assert spec.requested_destination is None


def test_a_tenant_without_aggregate_fails_when_one_is_required() -> None:
    config = _config(limit_tenants_to_placement_aggregate=True,
                     placement_aggregate_required_for_tenants=True)
    with pytest.raises(RequestFilterFailed, match="No hosts available for tenant"):
        require_tenant_aggregate(_spec(project_id="nobody"), config, AGGS, NO_CTX)
    assert not require_tenant_aggregate(
        _spec(project_id="nobody"), _config(limit_tenants_to_placement_aggregate=True), AGGS, NO_CTX)


def test_a_request_filter_failure_reads_as_novas_scheduling_failed() -> None:
    config = _config(limit_tenants_to_placement_aggregate=True,
                     placement_aggregate_required_for_tenants=True)
    with pytest.raises(RequestFilterFailed) as failed:
        require_tenant_aggregate(_spec(project_id="nobody"), config, AGGS, NO_CTX)
    assert failed.value.reason == "No hosts available for tenant"
    assert str(failed.value) == "Scheduling failed: No hosts available for tenant"
    # The scheduler raises NoValidHost(exc.message), as Nova raises NoValidHost(reason=e.message).
    assert str(NoValidHost(failed.value.message)) == (
        "No valid host was found. Scheduling failed: No hosts available for tenant")


# ----------------------------------------------------------------- availability zone
def test_availability_zone_requires_its_aggregates() -> None:
    spec = _spec(availability_zone="az1")
    assert map_az_to_placement_aggregate(spec, DEFAULT, AGGS, NO_CTX)
    assert spec.requested_destination is not None
    assert spec.requested_destination.aggregates == ["agg-az1"]


def test_an_unknown_zone_adds_nothing() -> None:
    spec = _spec(availability_zone="nowhere")
    assert not map_az_to_placement_aggregate(spec, DEFAULT, AGGS, NO_CTX)
    assert spec.requested_destination is None


# ----------------------------------------------------------------- image type
def test_image_type_support_requires_the_disk_format_trait() -> None:
    spec = _spec(disk_format="qcow2")
    assert require_image_type_support(spec, _config(query_placement_for_image_type_support=True),
                                      AGGS, NO_CTX)
    assert _root(spec) == {"COMPUTE_IMAGE_TYPE_QCOW2"}


@pytest.mark.parametrize("kw", [{"disk_format": "qcow2", "is_bfv": True}, {"disk_format": "bogus"}],
                         ids=["boot from volume is skipped", "a format without a trait is skipped"])
def test_image_type_support_skips(kw: dict[str, object]) -> None:
    spec = _spec(**kw)  # type: ignore[arg-type]
    assert not require_image_type_support(
        spec, _config(query_placement_for_image_type_support=True), AGGS, NO_CTX)
    assert _root(spec) == set()


# ----------------------------------------------------------------- compute status
def test_disabled_computes_are_always_forbidden() -> None:
    spec = _spec()
    assert compute_status_filter(spec, DEFAULT, AGGS, NO_CTX)
    assert spec.request_level_params.root_forbidden == {"COMPUTE_STATUS_DISABLED"}


# ----------------------------------------------------------------- isolation
def test_aggregates_requiring_unrequested_traits_are_forbidden() -> None:
    spec = _spec(extra_specs={"trait:CUSTOM_GPU": "required"})
    assert isolate_aggregates(spec, _config(enable_isolated_aggregate_filtering=True), AGGS, NO_CTX)
    assert spec.requested_destination is not None
    assert spec.requested_destination.forbidden_aggregates == {"agg-ssd"}


def test_image_traits_count_for_isolation() -> None:
    spec = _spec(image={"traits_required": ["CUSTOM_GPU", "CUSTOM_SSD"]})
    assert not isolate_aggregates(spec, _config(enable_isolated_aggregate_filtering=True),
                                  AGGS, NO_CTX)


# ----------------------------------------------------------------- image metadata
def test_image_properties_become_root_traits() -> None:
    spec = _spec(image={"hw_disk_bus": "virtio", "hw_video_model": "vga",
                        "hw_vif_model": "e1000e", "hw_architecture": "x86_64",
                        "hw_emulation_architecture": "aarch64"})
    assert transform_image_metadata(spec, _config(image_metadata_prefilter=True), AGGS, NO_CTX)
    assert _root(spec) == {"COMPUTE_STORAGE_BUS_VIRTIO", "COMPUTE_GRAPHICS_MODEL_VGA",
                           "COMPUTE_NET_VIF_MODEL_E1000E", "HW_ARCH_X86_64",
                           "COMPUTE_ARCH_AARCH64"}


def test_one_unknown_image_trait_drops_them_all() -> None:
    # A valid emulation architecture os-traits has no COMPUTE_ARCH_ trait for.
    spec = _spec(image={"hw_disk_bus": "virtio", "hw_emulation_architecture": "sparc"})
    assert not transform_image_metadata(spec, _config(image_metadata_prefilter=True), AGGS, NO_CTX)
    assert _root(spec) == set()


@pytest.mark.parametrize("model", ["intel", "smmuv3", "virtio", "auto"])
def test_a_viommu_model_maps_to_an_unknown_trait_and_drops_them_all_as_in_nova(model: str) -> None:
    # Nova 34 prefixes COMPUTE_VIOMMU_; os-traits names them COMPUTE_VIOMMU_MODEL_<MODEL>.
    spec = _spec(image={"hw_disk_bus": "virtio", "hw_viommu_model": model})
    assert not transform_image_metadata(spec, _config(image_metadata_prefilter=True), AGGS, NO_CTX)
    assert _root(spec) == set()


# ----------------------------------------------------------------- simple trait filters
@pytest.mark.parametrize("func, kw, trait", [
    (accelerators_filter, {"extra_specs": {"accel:device_profile": "dp1"}}, "COMPUTE_ACCELERATORS"),
    (packed_virtqueue_filter, {"extra_specs": {"hw:virtio_packed_ring": "true"}},
     "COMPUTE_NET_VIRTIO_PACKED"),
    (packed_virtqueue_filter, {"image": {"hw_virtio_packed_ring": "yes"}},
     "COMPUTE_NET_VIRTIO_PACKED"),
    (virtio_sound_filter, {"image": {"hw_sound_model": "virtio"}}, "COMPUTE_SOUND_MODEL_VIRTIO"),
    (tpm_secret_security_filter, {"extra_specs": {"hw:tpm_version": "2.0"}},
     "COMPUTE_SECURITY_TPM_SECRET_SECURITY_USER"),
    (tpm_secret_security_filter, {"extra_specs": {"hw:tpm_version": "2.0",
                                                  "hw:tpm_secret_security": ""}},
     "COMPUTE_SECURITY_TPM_SECRET_SECURITY_USER"),
    (tpm_secret_security_filter, {"extra_specs": {"hw:tpm_version": "2.0",
                                                  "hw:tpm_secret_security": "deployment"}},
     "COMPUTE_SECURITY_TPM_SECRET_SECURITY_DEPLOYMENT"),
], ids=["a device profile requires accelerators", "packed ring from the flavor",
        "packed ring from the image", "virtio sound model", "vTPM secret security defaults to user",
        "an empty vTPM secret security is user too", "vTPM secret security deployment"])
def test_trait_filters_add_their_root_trait(func, kw, trait) -> None:  # type: ignore[no-untyped-def]
    spec = _spec(**kw)
    assert func(spec, DEFAULT, AGGS, NO_CTX)
    assert _root(spec) == {trait}


@pytest.mark.parametrize("func", [accelerators_filter, packed_virtqueue_filter, virtio_sound_filter,
                                  tpm_secret_security_filter, ephemeral_encryption_filter,
                                  remote_managed_ports_filter])
def test_trait_filters_do_nothing_for_a_plain_request(func) -> None:  # type: ignore[no-untyped-def]
    spec = _spec()
    assert not func(spec, DEFAULT, AGGS, NO_CTX)
    assert _root(spec) == set()


def test_ephemeral_encryption_adds_the_format_trait() -> None:
    spec = _spec(extra_specs={"hw:ephemeral_encryption": "True"},
                 image={"hw_ephemeral_encryption_format": "luks"})
    assert ephemeral_encryption_filter(spec, DEFAULT, AGGS, NO_CTX)
    assert _root(spec) == {"COMPUTE_EPHEMERAL_ENCRYPTION", "COMPUTE_EPHEMERAL_ENCRYPTION_LUKS"}


def test_an_unknown_tpm_secret_security_fails_the_request() -> None:
    spec = _spec(extra_specs={"hw:tpm_version": "2.0", "hw:tpm_secret_security": "cloud"})
    with pytest.raises(RequestFilterFailed, match="hw:tpm_secret_security 'cloud'"):
        tpm_secret_security_filter(spec, DEFAULT, AGGS, NO_CTX)


# ----------------------------------------------------------------- networks
LOOKUP = StaticNetworkLookup(
    ports={"p-fixed": {"network_id": "net-r", "fixed_ips": [{"subnet_id": "sub-1"}]},
           "p-free": {"network_id": "net-r", "fixed_ips": []},
           "p-rm": {"network_id": "net-x", "binding:vnic_type": "remote-managed"},
           "p-plain": {"network_id": "net-plain", "fixed_ips": [{"subnet_id": "sub-plain"}]},
           "p-orphan": {"network_id": "net-r", "fixed_ips": [{"subnet_id": "sub-orphan"}]}},
    networks={"net-r": ["seg-1", "seg-2"]},
    subnets={"sub-1": ["seg-1"], "sub-orphan": []})
ROUTED = _config(query_placement_for_routed_network_aggregates=True)


def test_routed_networks_require_one_segment_aggregate_per_nic() -> None:
    spec = _spec(requested_networks=[SimpleNamespace(port_id="p-fixed", network_id=None),
                                     {"network_id": "net-r"},
                                     {"port_id": "p-free"},
                                     {"network_id": "net-plain"}])
    assert routed_networks_filter(spec, ROUTED, AGGS, FilterContext(network_lookup=LOOKUP))
    assert spec.requested_destination is not None
    assert spec.requested_destination.aggregates == ["seg-1", "seg-1,seg-2", "seg-1,seg-2"]


def test_a_failed_network_lookup_fails_the_request() -> None:
    spec = _spec(requested_networks=[{"port_id": "p-missing"}])
    with pytest.raises(RequestFilterFailed, match="port p-missing not found"):
        routed_networks_filter(spec, ROUTED, AGGS, FilterContext(network_lookup=LOOKUP))


def test_a_port_on_a_subnet_without_a_segment_requires_no_aggregate() -> None:
    spec = _spec(requested_networks=[{"port_id": "p-plain"}])
    assert routed_networks_filter(spec, ROUTED, AGGS, FilterContext(network_lookup=LOOKUP))
    assert spec.requested_destination is None


def test_a_subnet_whose_segment_has_no_aggregate_fails_the_request() -> None:
    spec = _spec(requested_networks=[{"port_id": "p-orphan"}])
    with pytest.raises(RequestFilterFailed, match="Aggregates not found for the subnet sub-orphan"):
        routed_networks_filter(spec, ROUTED, AGGS, FilterContext(network_lookup=LOOKUP))


def test_routed_networks_without_a_lookup_fail_with_a_clear_message() -> None:
    spec = _spec(requested_networks=[{"network_id": "net-r"}])
    with pytest.raises(RequestFilterFailed, match="no network lookup is configured"):
        routed_networks_filter(spec, ROUTED, AGGS, NO_CTX)
    assert not routed_networks_filter(spec, DEFAULT, AGGS, NO_CTX)


def test_remote_managed_ports_are_found_through_the_lookup_or_the_request() -> None:
    spec = _spec(requested_networks=[{"port_id": "p-rm"}])
    assert remote_managed_ports_filter(spec, DEFAULT, AGGS, FilterContext(network_lookup=LOOKUP))
    assert _root(spec) == {"COMPUTE_REMOTE_MANAGED_PORTS"}
    spec = _spec(requested_networks=[{"port_id": "p9", "vnic_type": "remote-managed"}])
    assert remote_managed_ports_filter(spec, DEFAULT, AGGS, NO_CTX)


# ----------------------------------------------------------------- owner nova
def test_owner_nova_needs_a_new_enough_compute_fleet() -> None:
    spec = _spec()
    assert not owner_nova_filter(spec, DEFAULT, AGGS, FilterContext(min_compute_version=72))
    assert not owner_nova_filter(spec, DEFAULT, AGGS, NO_CTX)
    assert owner_nova_filter(spec, DEFAULT, AGGS, FilterContext(min_compute_version=73))
    assert _root(spec) == {"OWNER_NOVA"}


def test_a_pci_request_without_an_alias_comes_from_a_neutron_port() -> None:
    assert InstancePCIRequest(1, [{}], alias_name=None).source == InstancePCIRequest.NEUTRON_PORT
    assert InstancePCIRequest(1, [{}], alias_name="gpu").source == InstancePCIRequest.FLAVOR_ALIAS
    # Nova's constants: FLAVOR_ALIAS = 0, NEUTRON_PORT = 1.
    assert (InstancePCIRequest.FLAVOR_ALIAS, InstancePCIRequest.NEUTRON_PORT) == (0, 1)


def test_owner_nova_is_added_to_flavor_pci_groups_only() -> None:
    pci = InstancePCIRequests([InstancePCIRequest(1, [{}], alias_name="gpu", request_id="req-a"),
                               InstancePCIRequest(1, [{}], alias_name=None, request_id="req-n")])
    groups = [RequestGroup(requester_id="req-a-0", resources={"CUSTOM_PCI": 1}),
              RequestGroup(requester_id="req-n-0", resources={"CUSTOM_PCI": 1}),
              RequestGroup(requester_id="port-1", resources={"NET_BW_EGR_KILOBIT_PER_SEC": 1})]
    spec = _spec(pci_requests=pci, requested_resources=groups)
    assert owner_nova_filter(spec, DEFAULT, AGGS, FilterContext(min_compute_version=80))
    assert [g.required_traits for g in groups] == [{"OWNER_NOVA"}, set(), set()]


def test_owner_nova_already_required_is_kept_without_a_version_check() -> None:
    # A reschedule's spec already carries OWNER_NOVA: Nova returns before the version check
    # and leaves the PCI groups as they are.
    groups = [RequestGroup(requester_id="req-a-0", resources={"CUSTOM_PCI": 1})]
    pci = InstancePCIRequests([InstancePCIRequest(1, [{}], alias_name="gpu", request_id="req-a")])
    spec = _spec(pci_requests=pci, requested_resources=groups,
                 request_level_params=RequestLevelParams(root_required={"OWNER_NOVA"}))
    assert owner_nova_filter(spec, DEFAULT, AGGS, FilterContext(min_compute_version=72))
    assert _root(spec) == {"OWNER_NOVA"} and groups[0].required_traits == set()


# ----------------------------------------------------------------- all together
def test_process_reqspec_feeds_the_query() -> None:
    spec = _spec(availability_zone="az1", extra_specs={"accel:device_profile": "dp"})
    applied = process_reqspec(spec, DEFAULT, AGGS)
    assert applied == ["map_az_to_placement_aggregate", "compute_status_filter",
                       "accelerators_filter"]
    query = resources_from_request_spec(spec, DEFAULT, lambda h, n: []).to_queryparams()
    assert ("member_of", "in:agg-az1") in query
    assert ("root_required", "COMPUTE_ACCELERATORS,!COMPUTE_STATUS_DISABLED") in query


@pytest.mark.parametrize("kw, text", [
    ({"extra_specs": {"hw:sound_model": "ich6"}, "image": {"hw_sound_model": "virtio"}},
     "hw_sound_model: conflicts with the flavor's hw:sound_model 'ich6'"),
    ({"extra_specs": {"hw:sound_model": "bogus"}}, "invalid sound device model"),
    ({"extra_specs": {"hw:ephemeral_encryption": "true"},
      "image": {"hw_ephemeral_encryption": False}},
     "hw_ephemeral_encryption: conflicts with the flavor's hw:ephemeral_encryption 'true'"),
    ({"extra_specs": {"hw:ephemeral_encryption": "true",
                      "hw:ephemeral_encryption_format": "bogus"}},
     "invalid ephemeral encryption format"),
])
def test_sound_and_ephemeral_encryption_refuse_what_nova_refuses(kw: dict, text: str) -> None:  # type: ignore[type-arg]
    """Nova's request filters raise FlavorImageConflict and Invalid here (a differential
    run against Nova 34 found Berth taking the flavor's value)."""
    from berth.errors import InputError

    spec = _spec(**kw)
    with pytest.raises(InputError, match=text):
        virtio_sound_filter(spec, DEFAULT, AGGS, NO_CTX)
        ephemeral_encryption_filter(spec, DEFAULT, AGGS, NO_CTX)
    # The same value on both sides is no conflict.
    same = _spec(extra_specs={"hw:ephemeral_encryption": "yes",
                              "hw:ephemeral_encryption_format": "luksv2"},
                 image={"hw_ephemeral_encryption": True})
    assert ephemeral_encryption_filter(same, DEFAULT, AGGS, NO_CTX)
    assert _root(same) == {"COMPUTE_EPHEMERAL_ENCRYPTION", "COMPUTE_EPHEMERAL_ENCRYPTION_LUKSV2"}
