"""Move operations: the request Nova sends for each (plan_move), CrossCellWeigher and the
requested destination reached through a move, and ``berth schedule --migrate|--resize|
--evacuate|--rebuild|--live-migrate`` offline with the claims as Nova moves them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from berth.claims import InMemoryPlacement, requested_resources
from berth.cli import main
from berth.config import SchedulerConfig
from berth.errors import InputError, MoveRefused, NoValidHost
from berth.hardware.pci import InstancePCIRequest, InstancePCIRequests, parse_aliases
from berth.model.request import CellMapping, Flavor, ImageMeta, InstanceGroup, RequestSpec
from berth.moves import (
    Hypervisor,
    MoveRequest,
    MovingInstance,
    SourceHost,
    live_migration_problem,
    plan_move,
    schedule_move,
)
from berth.pipeline import Scheduler
from berth.snapshot import HostSnapshot
from builders import NOW as CORE_NOW
from builders import cloud, host

ROOT = Path(__file__).resolve().parent.parent
CLOUD = str(ROOT / "examples" / "cloud.yaml")
CONF = str(ROOT / "examples" / "nova.conf")
NOW = "1800000000"
WEB1 = "0b8f9c3e-0000-4000-8000-000000000001"

TINY = Flavor(name="tiny", vcpus=1, memory_mb=512, root_gb=1, id=1)
SMALL = Flavor(name="small", vcpus=2, memory_mb=1024, root_gb=2, id=2)


def _instance(**spec: object) -> MovingInstance:
    fields: dict[str, object] = {"flavor": TINY, "project_id": "p", "user_id": "u", **spec}
    return MovingInstance("i-1", "h1", "h1-node", RequestSpec(**fields),  # type: ignore[arg-type]
                          cell_uuid="cell-a")


def _plan(request: MoveRequest, instance: MovingInstance | None = None, *, up: bool = True,
          traits: frozenset[str] = frozenset(), same_host: bool = False):  # noqa: ANN202
    nodes = {"h1": [("h1-node", "cell-a")], "h2": [("h2-node", "cell-a")],
             "ironic": [("n-a", "cell-a"), ("n-b", "cell-a")], "far": [("far-node", "cell-b")]}
    return plan_move(instance or _instance(), request, source=SourceHost(traits=traits, up=up),
                     nodes_of=lambda h: nodes.get(h, []), allow_resize_to_same_host=same_host)


# ----------------------------------------------------------------- the request per operation
def test_a_migration_ignores_its_host_and_asks_its_cell() -> None:
    plan = _plan(MoveRequest("migrate"))
    spec = plan.spec
    assert spec.ignore_hosts == ["h1"]
    # Nova 34 gives the check-type hint to a rebuild only: a plugin filter reading the
    # hints of a move sees none.
    assert spec.scheduler_hints == {}
    assert spec.requested_destination is not None
    assert spec.requested_destination.cell == CellMapping("cell-a")
    assert spec.requested_destination.allow_cross_cell_move is False
    assert (spec.instance_uuid, spec.num_instances) == ("i-1", 1)
    assert (plan.migration_allocation, plan.claims, plan.return_alternates) == (True, True, True)
    assert plan.migration_type == "migration"


@pytest.mark.parametrize("request_, traits, same_host, ignored", [
    (MoveRequest("migrate"), frozenset({"COMPUTE_SAME_HOST_COLD_MIGRATE"}), False, None),
    (MoveRequest("migrate"), frozenset(), True, ["h1"]),
    (MoveRequest("resize", flavor=SMALL), frozenset(), True, None),
    (MoveRequest("resize", flavor=SMALL), frozenset({"COMPUTE_SAME_HOST_COLD_MIGRATE"}), False,
     ["h1"]),
], ids=["a migration stays allowed by the source node's trait",
        "allow_resize_to_same_host does not apply to a migration",
        "a resize stays allowed by allow_resize_to_same_host",
        "the trait does not apply to a resize"])
def test_the_source_host_is_ignored_unless_the_operation_may_stay(
        request_: MoveRequest, traits: frozenset[str], same_host: bool,
        ignored: list[str] | None) -> None:
    assert _plan(request_, traits=traits, same_host=same_host).spec.ignore_hosts == ignored


def test_a_requested_host_names_its_first_node_and_keeps_the_cell_rule() -> None:
    dest = _plan(MoveRequest("migrate", host="h2")).spec.requested_destination
    assert dest is not None and dest.cell is not None
    assert (dest.host, dest.node, dest.cell.uuid, dest.allow_cross_cell_move) == (
        "h2", "h2-node", "cell-a", False)
    # A host with several nodes: its first, as Nova's API names it (migrate:
    # get_first_node_by_host_for_old_compat; evacuate: nodes[0]), so placement is asked
    # in that node's tree and the other nodes are not considered.
    for op in ("migrate", "evacuate"):
        dest = _plan(MoveRequest(op, host="ironic"), up=False).spec.requested_destination
        assert dest is not None and (dest.host, dest.node) == ("ironic", "n-a")


def test_a_targeted_move_that_may_cross_cells_is_kept_to_no_cell() -> None:
    """Nova's migrate task drops the instance's cell when a host is named and the move may
    cross cells: the host says where it goes (nor is the source cell preferred)."""
    for name, node in (("h2", "h2-node"), ("far", "far-node")):
        dest = _plan(MoveRequest("migrate", host=name, allow_cross_cell=True)
                     ).spec.requested_destination
        assert dest is not None
        assert (dest.host, dest.node, dest.cell, dest.allow_cross_cell_move) == (
            name, node, None, True)
    # Without a host, the instance's cell stays (preferred by the CrossCellWeigher).
    dest = _plan(MoveRequest("migrate", allow_cross_cell=True)).spec.requested_destination
    assert dest is not None and dest.cell is not None and dest.cell.uuid == "cell-a"


@pytest.mark.parametrize("request_", [MoveRequest("migrate", host="far"),
                                      MoveRequest("evacuate", host="far")],
                         ids=["migrate", "evacuate"])
def test_a_host_of_another_cell_is_not_found_unless_the_move_may_cross_cells(
        request_: MoveRequest) -> None:
    """Nova's API looks the host up in the instance's cell: ComputeHostNotFound (400 for a
    migrate; an evacuate's handler lets it through as a 500). Berth said NoValidHost."""
    with pytest.raises(InputError, match="host: compute host 'far' could not be found"):
        _plan(request_, up=False)


def test_the_boot_routing_never_carries_over_to_a_move() -> None:
    instance = _instance(force_hosts=["h1"], force_nodes=["h1-node"], ignore_hosts=["h9"],
                         scheduler_hints={"same_host": ["x"], "_nova_check_type": ["rebuild"]})
    spec = _plan(MoveRequest("resize", flavor=SMALL), instance).spec
    assert (spec.force_hosts, spec.force_nodes, spec.ignore_hosts) == (None, None, ["h1"])
    assert spec.scheduler_hints == {"same_host": ["x"]}
    assert spec.flavor is SMALL


def test_evacuate_needs_a_down_source_ignores_it_and_takes_no_alternates() -> None:
    with pytest.raises(MoveRefused, match="Compute service of h1 is still in use"):
        _plan(MoveRequest("evacuate"))
    plan = _plan(MoveRequest("evacuate", host="h2"), up=False)
    assert plan.spec.ignore_hosts == ["h1"]
    assert plan.spec.scheduler_hints == {}
    assert plan.spec.requested_destination is not None
    assert plan.spec.requested_destination.host == "h2"
    assert (plan.migration_allocation, plan.keeps_source, plan.return_alternates,
            plan.migration_type) == (True, True, False, "evacuation")


def test_rebuild_forces_the_instance_node_and_a_new_image_only_is_scheduled() -> None:
    ubuntu = ImageMeta(id="img-1", name="ubuntu")
    plan = _plan(MoveRequest("rebuild", image=ImageMeta(id="img-2", name="arm")),
                 _instance(image=ubuntu))
    assert (plan.spec.force_hosts, plan.spec.force_nodes) == (["h1"], ["h1-node"])
    assert plan.spec.is_rebuild() and plan.spec.ignore_hosts is None
    assert (plan.claims, plan.schedule, plan.migration_type) == (False, True, None)
    assert _plan(MoveRequest("rebuild", image=ubuntu), _instance(image=ubuntu)).schedule is False


def test_a_rebuild_with_another_image_keeps_to_the_instance_cell() -> None:
    """Nova's conductor restricts a rebuild's request to the instance's cell (queried
    even when disabled); the host and node are forced as before."""
    plan = _plan(MoveRequest("rebuild", image=ImageMeta(id="img-2", name="arm")),
                 _instance(image=ImageMeta(id="img-1", name="ubuntu")))
    dest = plan.spec.requested_destination
    assert dest is not None and dest.cell is not None and dest.cell.uuid == "cell-a"
    assert (dest.host, dest.node) == (None, None)


GOLD = ImageMeta(id="img-gold", name="gold", properties={"trait:CUSTOM_GOLD": "required"})


@pytest.mark.parametrize(("held", "extra_specs", "message"), [
    (frozenset(), {}, "Image traits cannot be satisfied by the current resource providers"),
    (frozenset({"CUSTOM_GOLD"}), {"trait:CUSTOM_GOLD": "forbidden"},
     "Image traits are part of forbidden traits in flavor"),
    (frozenset({"CUSTOM_GOLD"}), {"trait1:CUSTOM_GOLD": "forbidden"},
     "Image traits are part of forbidden traits in flavor"),
], ids=["trait missing on the allocation providers", "trait forbidden by the flavor",
        "trait forbidden in a numbered group"])
def test_a_rebuild_image_s_required_traits_are_checked_before_scheduling(
        held: frozenset[str], extra_specs: dict[str, str], message: str) -> None:
    """Nova's _validate_image_traits_for_rebuild: NoValidHost, the image unchanged."""
    flavor = Flavor(name="t", vcpus=1, memory_mb=512, root_gb=1, id=7, extra_specs=extra_specs)
    instance = _instance(flavor=flavor, image=ImageMeta(id="img-1", name="ubuntu"))
    with pytest.raises(NoValidHost, match=message):
        plan_move(instance, MoveRequest("rebuild", image=GOLD),
                  source=SourceHost(allocation_traits=held), nodes_of=lambda h: [])


def test_a_rebuild_image_s_traits_held_by_the_allocation_providers_pass() -> None:
    instance = _instance(image=ImageMeta(id="img-1", name="ubuntu"))
    plan = plan_move(instance, MoveRequest("rebuild", image=GOLD),
                     source=SourceHost(allocation_traits=frozenset({"CUSTOM_GOLD"})),
                     nodes_of=lambda h: [])
    assert plan.schedule and plan.spec.image is GOLD
    # Without the allocation providers' traits, the node's own are the providers'.
    plan_move(instance, MoveRequest("rebuild", image=GOLD),
              source=SourceHost(traits=frozenset({"CUSTOM_GOLD"})), nodes_of=lambda h: [])


@pytest.mark.parametrize(("flavor", "bfv", "message"), [
    (Flavor(name="acc", vcpus=1, memory_mb=512, root_gb=1, id=8,
            extra_specs={"accel:device_profile": "gpu"}), False,
     "flavor: a resize to a flavor with accelerators"),
    (Flavor(name="zero", vcpus=2, memory_mb=1024, root_gb=0, id=9), False,
     "flavor: the server disk cannot be resized: a resize to a zero disk flavor"),
    (Flavor(name="zero", vcpus=2, memory_mb=1024, root_gb=0, id=9), True, None),
], ids=["accelerators", "zero disk, image-backed", "zero disk, volume-backed"])
def test_resize_inputs_nova_s_api_refuses(flavor: Flavor, bfv: bool, message: str | None) -> None:
    """Nova's API.resize: ForbiddenWithAccelerators (403), CannotResizeDisk (400)."""
    request = MoveRequest("resize", flavor=flavor)
    if message is None:
        assert _plan(request, _instance(is_bfv=bfv)).spec.flavor is flavor
        return
    with pytest.raises(InputError, match=message):
        _plan(request, _instance(is_bfv=bfv))


@pytest.mark.parametrize("request_, message", [
    (MoveRequest("shelve"), "operation: expected one of migrate, resize, evacuate, rebuild"),
    (MoveRequest("resize"), "flavor: resize needs the new flavor"),
    (MoveRequest("resize", flavor=TINY), "already has flavor 'tiny'"),
    (MoveRequest("rebuild"), "image: rebuild needs an image"),
    (MoveRequest("migrate", host="h1"), "can't be the same one"),
    (MoveRequest("migrate", host="h7"), "compute host 'h7' could not be found"),
    (MoveRequest("resize", flavor=SMALL, host="h2"), "host: resize takes no destination host"),
    (MoveRequest("migrate", flavor=SMALL), "flavor: only resize takes a flavor"),
    (MoveRequest("migrate", image=ImageMeta(name="x")), "image: only rebuild takes an image"),
    (MoveRequest("rebuild", image=ImageMeta(name="x"), allow_cross_cell=True),
     "only migrate and resize may cross cells"),
], ids=["an unknown operation", "resize without a flavor", "resize to the same flavor",
        "rebuild without an image", "migrate to its own host", "migrate to an unknown host",
        "resize to a named host", "migrate with a flavor", "migrate with an image",
        "rebuild across cells"])
def test_a_move_nova_refuses_is_one_line_naming_the_field(request_: MoveRequest,
                                                          message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        _plan(request_)


# ----------------------------------------------------------------- through the core
def _cells_snapshot() -> HostSnapshot:
    return cloud(host("h1", cell_uuid="cell-a", free_ram_mb=4096),
                 host("h2", cell_uuid="cell-a", free_ram_mb=2048),
                 host("h3", cell_uuid="cell-b", free_ram_mb=8192))


def _scheduler() -> Scheduler:
    return Scheduler(SchedulerConfig.from_dict({"filter_scheduler": {
        "enabled_filters": ["ComputeFilter"], "weight_classes": ["RAMWeigher", "CrossCellWeigher"]}}))


def _move_on_core(request: MoveRequest) -> tuple[object, InMemoryPlacement, str]:
    snapshot = _cells_snapshot()
    placement = InMemoryPlacement(snapshot)
    instance = _instance()
    instance.host, instance.nodename = "h1", "h1"
    placement.adopt("i-1", 0, requested_resources(instance.spec))
    cells = {"h1": "cell-a", "h2": "cell-a", "h3": "cell-b"}
    plan = plan_move(instance, request, source=SourceHost(),
                     nodes_of=lambda h: [(h, cells[h])] if h in cells else [])
    scheduler = _scheduler()

    def select(spec, uuids, alternates, explain):  # noqa: ANN001, ANN202
        return scheduler.select_destinations(
            spec, snapshot, now=CORE_NOW, rng=random.Random(1), instance_uuids=uuids,
            candidates=placement.candidates(spec), claimer=placement,
            return_alternates=alternates, explain=explain)

    decision, _ = schedule_move(plan, select, placement, "m-1", explain=True)
    return decision, placement, "m-1"


def test_cross_cell_weigher_keeps_an_allowed_move_in_its_cell() -> None:
    decision, placement, migration = _move_on_core(MoveRequest("migrate", allow_cross_cell=True))
    assert decision.hosts == [("h2", "h2")]  # h3 has more RAM but is in another cell
    weighing = decision.diagnosis.instances[0].weighing  # type: ignore[attr-defined]
    raw = {w.host: {t.weigher: t.raw for t in w.terms}["CrossCellWeigher"] for w in weighing}
    assert raw == {"h2": 1.0, "h3": -1.0}
    # The migration holds the source, the instance the destination.
    assert placement.allocations_of(migration) == {"h1/h1": {"VCPU": 1, "MEMORY_MB": 512,
                                                             "DISK_GB": 1}}
    assert placement.allocations_of("i-1") == {"h2/h2": {"VCPU": 1, "MEMORY_MB": 512,
                                                         "DISK_GB": 1}}


def test_a_move_not_allowed_to_cross_cells_only_sees_its_cell() -> None:
    decision, _, _ = _move_on_core(MoveRequest("migrate"))
    assert decision.hosts == [("h2", "h2")]  # type: ignore[attr-defined]
    steps = decision.diagnosis.instances[0].steps  # type: ignore[attr-defined]
    assert [(s.name, s.hosts_in, s.hosts_out) for s in steps[:3]] == [
        ("placement", 3, 3), ("requested cell", 3, 2), ("ignore_hosts", 2, 1)]
    assert steps[1].rejections[0].host == "h3"
    assert "no cross-cell move" in steps[1].rejections[0].reject.reason


def test_a_requested_destination_is_the_only_host_considered() -> None:
    decision, _, _ = _move_on_core(MoveRequest("migrate", host="h3", allow_cross_cell=True))
    assert decision.hosts == [("h3", "h3")]  # type: ignore[attr-defined]
    step = decision.diagnosis.instances[0].steps[1]  # type: ignore[attr-defined]
    assert step.name == "requested destination" and step.hosts_out == 1


def test_an_anti_affinity_member_may_stay_where_it_runs() -> None:
    # ServerGroupAntiAffinityFilter passes the host already running the instance (§3.6).
    group = InstanceGroup(policy="anti-affinity", uuid="g", members=["i-1", "i-2"],
                          hosts=["h1", "h2"])
    plan = _plan(MoveRequest("resize", flavor=SMALL), _instance(instance_group=group),
                 same_host=True)
    assert plan.spec.ignore_hosts is None and plan.spec.instance_group is not None


# ----------------------------------------------------------------- offline CLI
def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_schedule_migrate_moves_the_claim_and_keeps_anti_affinity(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "schedule", CLOUD, "--config-file", CONF, "--migrate", WEB1,
                       "--seed", "7", "--now", NOW, "--json")
    assert code == 0
    data = json.loads(out)
    chosen = data["decision"]["instances"][0]["host"]
    # web's other member runs on c1-w02; the source c1-w01 is ignored.
    assert chosen not in {"c1-w01", "c1-w02"}
    medium = {"VCPU": 2, "MEMORY_MB": 4096, "DISK_GB": 40}
    assert data["allocations"] == {"instance": {f"{chosen}/{chosen}": medium},
                                   "migration": {"c1-w01/c1-w01": medium}}
    assert data["source"] == {"host": "c1-w01", "nodename": "c1-w01"}


def test_schedule_resize_prints_both_consumers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "schedule", CLOUD, "--config-file", CONF, "--resize", WEB1,
                       "--flavor", "m1.large", "--seed", "7", "--now", NOW, "--explain")
    assert code == 0
    assert out.startswith(f"resize of {WEB1} from c1-w01")
    assert "VCPU=4" in out and "migration" in out and "ignore_hosts" in out


DOWN_CLOUD = """
flavors: [{name: small, vcpus: 1, memory_mb: 1024, root_gb: 10}]
images: [{name: arm, properties: {hw_architecture: aarch64}}]
host_defaults: {supported_instances: [[x86_64, kvm, hvm]]}
hosts:
  - {host: up1, vcpus: 8, memory_mb: 8192, local_gb: 100}
  - {host: gone, vcpus: 8, memory_mb: 8192, local_gb: 100, service: {up: false},
     instances: [{uuid: 0b8f9c3e-0000-4000-8000-0000000000cc, flavor: small}]}
  - {host: live, vcpus: 8, memory_mb: 8192, local_gb: 100,
     instances: [{uuid: 0b8f9c3e-0000-4000-8000-0000000000dd, flavor: small}]}
"""


def test_schedule_evacuate_and_rebuild_offline(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    cloud = tmp_path / "cloud.yaml"
    cloud.write_text(DOWN_CLOUD)
    conf = tmp_path / "nova.conf"
    conf.write_text("[filter_scheduler]\nenabled_filters = ComputeFilter,ImagePropertiesFilter\n")
    code, out, _ = run(capsys, "schedule", str(cloud), "--config-file", str(conf),
                       "--evacuate", "0b8f9c3e-0000-4000-8000-0000000000cc", "--json")
    assert code == 0
    data = json.loads(out)
    small = {"VCPU": 1, "MEMORY_MB": 1024, "DISK_GB": 10}
    assert data["allocations"]["instance"]["gone/gone"] == small
    assert len(data["allocations"]["instance"]) == 2 and data["allocations"]["migration"] == {}
    code, _, err = run(capsys, "schedule", str(cloud), "--evacuate",
                       "0b8f9c3e-0000-4000-8000-0000000000dd")
    assert code == 4 and "Compute service of live is still in use" in err
    code, out, err = run(capsys, "schedule", str(cloud), "--config-file", str(conf), "--rebuild",
                         "0b8f9c3e-0000-4000-8000-0000000000dd", "--image", "arm", "--explain")
    assert code == 4 and "No valid host" in err
    # Only the instance's node is in play, ComputeFilter skips it, the image filter refuses.
    assert "force_nodes" in out and "(skipped: does not run on rebuild)" in out
    assert "live/live: image properties unsupported" in out


# ----------------------------------------------------------------- live migration
def test_a_live_migration_keeps_to_its_cell_ignores_its_host_and_takes_no_alternates() -> None:
    plan = _plan(MoveRequest("live-migrate"))
    spec = plan.spec
    assert spec.ignore_hosts == ["h1"]
    assert spec.requested_destination is not None
    assert (spec.requested_destination.cell, spec.requested_destination.host) == (
        CellMapping("cell-a"), None)
    assert (plan.migration_allocation, plan.claims, plan.return_alternates,
            plan.keeps_source, plan.drops_source) == (True, True, False, False, True)
    assert plan.migration_type == "live-migration"
    # A named host: its first node, in the instance's cell; even its own host is asked
    # for (and ignored: the scheduler answers NoValidHost, as Nova's does).
    named = _plan(MoveRequest("live-migrate", host="ironic")).spec.requested_destination
    assert named is not None and (named.host, named.node, named.cell) == (
        "ironic", "n-a", CellMapping("cell-a"))
    own = _plan(MoveRequest("live-migrate", host="h1")).spec
    assert own.requested_destination.host == "h1" and own.ignore_hosts == ["h1"]  # type: ignore[union-attr]
    with pytest.raises(InputError, match="compute host 'far' could not be found"):
        _plan(MoveRequest("live-migrate", host="far"))
    with pytest.raises(MoveRefused, match="Compute service of h1 is unavailable"):
        _plan(MoveRequest("live-migrate"), up=False)


def _pci(*specs: dict[str, str], alias: str | None = "nic") -> RequestSpec:
    return RequestSpec(flavor=TINY, pci_requests=InstancePCIRequests([InstancePCIRequest(
        count=1, spec=list(specs), alias_name=alias)]))


@pytest.mark.parametrize("source, dest, spec, skip, problem", [
    (Hypervisor("QEMU", 8), Hypervisor("QEMU", 8), RequestSpec(flavor=TINY), False, None),
    (Hypervisor("QEMU", 8), Hypervisor("QEMU", 9), RequestSpec(flavor=TINY), False, None),
    (Hypervisor("QEMU", 8), Hypervisor("VMware", 9), RequestSpec(flavor=TINY), True,
     "hypervisor type 'VMware' is not the source's 'QEMU' (InvalidHypervisorType)"),
    (Hypervisor("QEMU", 8), Hypervisor("QEMU", 7), RequestSpec(flavor=TINY), False,
     "hypervisor version 7 is older than the source's 8 (DestinationHypervisorTooOld)"),
    (Hypervisor("QEMU", 8), Hypervisor("QEMU", 7), RequestSpec(flavor=TINY), True, None),
    (Hypervisor("QEMU", 8), Hypervisor("QEMU", 8), _pci({"live_migratable": "true"}), False,
     None),
    (Hypervisor("QEMU", 8), Hypervisor("QEMU", 8),
     _pci({"live_migratable": "true"}, {"vendor_id": "8086"}), False,
     "PCI alias 'nic' does not explicitly request live-migratable devices "
     "(MigrationPreCheckError)"),
    (Hypervisor("QEMU", 8), Hypervisor("QEMU", 8), _pci({"vendor_id": "8086"}, alias=None),
     False, None),
], ids=["same", "newer", "another type (no skip for it)", "older", "older, check skipped",
        "live-migratable devices", "one spec without the tag", "a port's request"])
def test_the_conductor_checks_a_live_migration_destination_as_nova_does(
        source: Hypervisor, dest: Hypervisor, spec: RequestSpec, skip: bool,
        problem: str | None) -> None:
    assert live_migration_problem(source, dest, spec, skip_version_check=skip) == problem


@pytest.mark.parametrize("value, problem", [("Yes", None), ("1", None), ("off", "does not")])
def test_an_alias_live_migratable_word_is_read_as_nova_reads_it(value: str,
                                                               problem: str | None) -> None:
    """Nova rewrites the alias's boolean word as "true" or "false" when it reads the
    config, and a live migration asks for exactly "true"."""
    alias = json.dumps({"name": "nic", "vendor_id": "8086", "product_id": "1520",
                        "live_migratable": value})
    (spec,) = parse_aliases([alias])["nic"][1]
    assert spec["live_migratable"] == ("false" if problem else "true")
    found = live_migration_problem(Hypervisor("QEMU", 8), Hypervisor("QEMU", 8), _pci(spec),
                                   skip_version_check=False)
    assert (found is None) == (problem is None)


LIVE_CLOUD = """
hosts:
  - {host: src, vcpus: 8, memory_mb: 8192, local_gb: 100, hypervisor_version: 8002000,
     instances: [{uuid: 0b8f9c3e-0000-4000-8000-0000000000aa, flavor: small}]}
  - {host: old, vcpus: 8, memory_mb: 65536, local_gb: 100, hypervisor_version: 6000000}
  - {host: new, vcpus: 8, memory_mb: 16384, local_gb: 100, hypervisor_version: 9000000}
flavors: [{name: small, vcpus: 1, memory_mb: 1024, root_gb: 10}]
"""


def test_schedule_live_migrate_offline_skips_what_the_conductor_would(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """RAMWeigher alone prefers the host with an older hypervisor: skipped, as the
    conductor skips it, for the next one."""
    cloud = tmp_path / "cloud.yaml"
    cloud.write_text(LIVE_CLOUD)
    uuid = "0b8f9c3e-0000-4000-8000-0000000000aa"
    conf = tmp_path / "nova.conf"
    ram = "[filter_scheduler]\nweight_classes = RAMWeigher\n"
    conf.write_text(ram)
    code, out, _ = run(capsys, "schedule", str(cloud), "--live-migrate", uuid, "--json",
                       "--config-file", str(conf))
    assert code == 0
    data = json.loads(out)
    assert data["skipped"] == [{"host": "old", "reason": "hypervisor version 6000000 is older "
                                "than the source's 8002000 (DestinationHypervisorTooOld)"}]
    assert data["allocations"] == {
        "instance": {"new/new": {"VCPU": 1, "MEMORY_MB": 1024, "DISK_GB": 10}}, "migration": {}}
    code, out, _ = run(capsys, "schedule", str(cloud), "--live-migrate", uuid,
                       "--config-file", str(conf))
    assert code == 0 and "skipped old: hypervisor version 6000000" in out
    assert "deleted once the instance runs on its destination" in out
    conf.write_text(ram + "[DEFAULT]\nmigrate_max_retries = 0\n")
    code, _, err = run(capsys, "schedule", str(cloud), "--live-migrate", uuid,
                       "--config-file", str(conf))
    assert code == 6 and "Exceeded max scheduling retries 1" in err
    conf.write_text("[workarounds]\nskip_hypervisor_version_check_on_lm = true\n")
    code, out, _ = run(capsys, "schedule", str(cloud), "--live-migrate", uuid,
                       "--config-file", str(conf), "--host", "old", "--json")
    assert code == 0 and json.loads(out)["skipped"] == []
    assert "old/old" in json.loads(out)["allocations"]["instance"]


@pytest.mark.parametrize("argv, message", [
    (["--migrate", WEB1, "--num", "2"], "--num: not used with --migrate"),
    (["--migrate", WEB1, "--flavor", "m1.large"], "--flavor: only --resize takes a flavor"),
    (["--resize", WEB1, "--host", "c1-a01", "--flavor", "m1.large"], "--host: only --migrate"),
    (["--live-migrate", WEB1, "--image", "ubuntu"], "--image: only --rebuild takes an image"),
    (["--flavor", "m1.small", "--host", "c1-a01"], "--host and --allow-cross-cell: only with a move"),
    ([], "--flavor: required"),
    (["--migrate", "0b8f9c3e-0000-4000-8000-00000000ffff"], "no host of the cloud file lists it"),
], ids=["a boot option with a move", "a flavor with a migration", "a host with a resize",
        "a host without a move", "no flavor and no move", "an instance no host lists",
        "an image with a live migration"])
def test_schedule_move_arguments_are_checked(argv: list[str], message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "schedule", CLOUD, *argv)
    assert code == 3
    assert message in err


DISABLED_CELL_CLOUD = """
cells: [{name: cell1, disabled: true}, {name: cell2}]
flavors: [{name: small, id: 1, vcpus: 1, memory_mb: 1024, root_gb: 10}]
images: [{name: img0, id: 11111111-0000-4000-8000-000000000000}]
hosts:
  - {host: h0, cell: cell1, vcpus: 8, memory_mb: 8192, local_gb: 100,
     instances: [{uuid: 0b8f9c3e-0000-4000-8000-000000000001, flavor: small, image: img0}]}
  - {host: h1, cell: cell1, vcpus: 8, memory_mb: 8192, local_gb: 100}
  - {host: h2, cell: cell2, vcpus: 8, memory_mb: 4096, local_gb: 100}
"""


def test_a_disabled_cell_of_the_cloud_file_is_left_out_as_nova_leaves_it_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nova's host manager reads the enabled cells, unless the request keeps to one cell
    (a move that may not cross cells keeps to the instance's, disabled or not). The
    scheduler service never learnt which cells the file disables: h1 (more RAM) won."""
    cloud = tmp_path / "cells.yaml"
    cloud.write_text(DISABLED_CELL_CLOUD)
    code, out, _ = run(capsys, "schedule", str(cloud), "--flavor", "small", "--now", NOW, "--json")
    assert code == 0 and json.loads(out)["instances"][0]["host"] == "h2"
    uuid = "0b8f9c3e-0000-4000-8000-000000000001"
    code, out, _ = run(capsys, "schedule", str(cloud), "--migrate", uuid, "--allow-cross-cell",
                       "--now", NOW, "--json")
    assert code == 0 and json.loads(out)["decision"]["instances"][0]["host"] == "h2"
    code, out, _ = run(capsys, "schedule", str(cloud), "--migrate", uuid, "--now", NOW, "--json")
    assert code == 0 and json.loads(out)["decision"]["instances"][0]["host"] == "h1"


REBUILD_TRAITS_CLOUD = """
flavors: [{name: small, id: 1, vcpus: 1, memory_mb: 1024, root_gb: 10}]
images:
  - {name: img0, id: 11111111-0000-4000-8000-000000000000}
  - {name: img_t, id: 11111111-0000-4000-8000-000000000005,
     properties: {"trait:CUSTOM_FOO": required}}
hosts:
  - {host: h0, vcpus: 8, memory_mb: 8192, local_gb: 100, traits: [TRAITS_OF_H0],
     instances: [{uuid: 0b8f9c3e-0000-4000-8000-000000000001, flavor: small, image: img0}]}
  - {host: h1, vcpus: 8, memory_mb: 8192, local_gb: 100, traits: [CUSTOM_FOO]}
"""


@pytest.mark.parametrize(("traits", "code"), [("CUSTOM_BAR", 4), ("CUSTOM_FOO", 0)])
def test_schedule_rebuild_checks_the_image_traits_on_the_instance_providers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], traits: str, code: int) -> None:
    cloud = tmp_path / "rebuild.yaml"
    cloud.write_text(REBUILD_TRAITS_CLOUD.replace("TRAITS_OF_H0", traits))
    got, out, _ = run(capsys, "schedule", str(cloud), "--rebuild",
                      "0b8f9c3e-0000-4000-8000-000000000001", "--image", "img_t", "--now", NOW,
                      "--json")
    assert got == code
    if code:
        assert json.loads(out)["error"]["message"].startswith(
            "No valid host was found. Image traits cannot be satisfied")
    else:
        assert json.loads(out)["decision"]["instances"][0]["host"] == "h0"


DRAIN_CLOUD = """
hosts:
  - {host: full, vcpus: 8, memory_mb: 32768, local_gb: 100,
     instances: [{uuid: 0b8f9c3e-0000-4000-8000-0000000000a1, flavor: small},
                 {uuid: 0b8f9c3e-0000-4000-8000-0000000000a2, flavor: large},
                 {uuid: 0b8f9c3e-0000-4000-8000-0000000000a3, flavor: small}]}
  - {host: other, vcpus: 8, memory_mb: 8192, local_gb: 100}
flavors:
  - {name: small, vcpus: 1, memory_mb: 1024, root_gb: 10}
  - {name: large, vcpus: 1, memory_mb: 16384, root_gb: 10}
"""


def test_schedule_drain_moves_what_fits_and_says_what_stays(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cloud = tmp_path / "cloud.yaml"
    cloud.write_text(DRAIN_CLOUD)
    code, out, _ = run(capsys, "schedule", str(cloud), "--drain", "full", "--json")
    assert code == 4
    data = json.loads(out)
    assert [(m["instance_uuid"][-2:], m["host"]) for m in data["moved"]] == [
        ("a1", "other"), ("a3", "other")]
    assert [(f["instance_uuid"][-2:], f["error"]["code"]) for f in data["failed"]] == [
        ("a2", "berth.scheduling.no_valid_host")]
    assert data["error"]["message"] == "1 of 3 instances could not be moved off full"
    code, out, _ = run(capsys, "schedule", str(cloud), "--drain", "full", "--drain-by",
                       "migrate")
    assert code == 4
    assert out.splitlines()[0] == "drain of full by migrate:"
    assert out.splitlines()[-1] == "2 moved, 1 left on full"
    assert "0b8f9c3e-0000-4000-8000-0000000000a2  large        stays: No valid host" in out
    code, out, _ = run(capsys, "schedule", str(cloud), "--drain", "other")
    assert code == 0 and out.splitlines()[-1] == "0 moved, 0 left on other"
    # An instance without a flavor cannot be moved (its resources are unknown): it stays.
    cloud.write_text(DRAIN_CLOUD.replace(
        "{uuid: 0b8f9c3e-0000-4000-8000-0000000000a3, flavor: small}",
        "{uuid: 0b8f9c3e-0000-4000-8000-0000000000a3}"))
    code, out, _ = run(capsys, "schedule", str(cloud), "--drain", "full", "--json")
    data = json.loads(out)
    assert code == 4 and data["unknown_instances"] == 1
    assert data["error"]["message"] == ("2 of 3 instances could not be moved off full; 1 of "
                                        "them unknown to Berth (no flavor), not movable")


@pytest.mark.parametrize("argv, message", [
    (["--drain", "full", "--explain"], "--explain: not used with --drain"),
    (["--drain", "full", "--flavor", "small"], "--flavor: only --resize takes a flavor"),
    (["--drain", "full", "--host", "other"], "--host: only --migrate, --evacuate and "
                                            "--live-migrate take a destination, not --drain"),
    (["--drain-by", "migrate", "--flavor", "small"], "--drain-by: only with --drain HOST"),
    (["--drain", "nowhere"], "host: compute host 'nowhere' could not be found"),
])
def test_schedule_drain_arguments_are_checked(tmp_path: Path, argv: list[str], message: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    cloud = tmp_path / "cloud.yaml"
    cloud.write_text(DRAIN_CLOUD)
    code, _, err = run(capsys, "schedule", str(cloud), *argv)
    assert code == 3 and message in err, err
