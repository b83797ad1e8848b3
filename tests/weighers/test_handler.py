"""The weighing handler (reference §7.1, §7.3, §7.4), the explanation of weights, and the
server-group policy check (§8.6): a policy whose filter or weigher is not enabled is an
UnsupportedPolicy error."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berth import plugins
from berth.errors import ConfigError, PluginNotFound, UnsupportedPolicy
from berth.filters.base import BaseHostFilter
from berth.model import InstanceGroup
from berth.pipeline import Scheduler
from berth.weighers.base import BaseHostWeigher
from berth.weighers.disk import DiskWeigher
from berth.weighers.ram import RAMWeigher
from berth.weighers.registry import BUILTIN_WEIGHERS, builtin_weigher_classes
from builders import NOW, cloud, host, spec

from ._helpers import check_paths_agree, config, weights_of


def worked_example_builders():
    """Reference §7.3: host0 ram 512, disk 1000, cpu 4x4.0-2 = 14, io 1, inst 3;
    host1 ram 1024, disk 500, cpu 4x4.0-0 = 16, io 0, inst 1."""
    return [
        host("host0", free_ram_mb=512, free_disk_mb=1000, vcpus_total=4, vcpus_used=2,
             cpu_allocation_ratio=4.0, num_io_ops=1, num_instances=3),
        host("host1", free_ram_mb=1024, free_disk_mb=500, vcpus_total=4, vcpus_used=0,
             cpu_allocation_ratio=4.0, num_io_ops=0, num_instances=1),
    ]


def worked_example_cloud():
    """The two hosts of the worked example."""
    return cloud(*worked_example_builders())


WORKED_CONFIG = {"filter_scheduler": {"num_instances_weight_multiplier": -1.0}}


def test_the_worked_example_of_the_reference():
    conf = config(**WORKED_CONFIG)
    weighers = plugins.load_weighers(conf)
    assert [type(w).__name__ for w in weighers] == list(BUILTIN_WEIGHERS)
    host0, host1 = weights_of(weighers, worked_example_cloud(), spec())
    # host1: RAM 1024/1024 = 1.0 + Disk 500/1000 = 0.5 + CPU 16/16 = 1.0
    #        + IoOps -1 x 0/1 = 0 + NumInstances -1 x (1-1)/(3-1) = 0            = 2.5
    # host0: RAM 512/1024 = 0.5 + Disk 1000/1000 = 1.0 + CPU 14/16 = 0.875
    #        + IoOps -1 x 1/1 = -1 + NumInstances -1 x (3-1)/(3-1) = -1          = 0.375
    # Every other weigher sees equal raw values (or 0) and normalizes them to 0.
    assert host1 == pytest.approx(2.5, abs=1e-12)
    assert host0 == pytest.approx(0.375, abs=1e-12)


def test_ties_keep_the_input_order():
    snap = cloud(host("a", free_ram_mb=1), host("b", free_ram_mb=5), host("c", free_ram_mb=5),
                 host("d", free_ram_mb=1))
    from berth.host_state import WorkingSet
    from berth.weighers.handler import WeigherRanker

    ranking = WeigherRanker([RAMWeigher()]).rank(WorkingSet(snap, NOW).hosts(), spec())
    assert ranking.order.tolist() == [1, 2, 0, 3]


def test_the_multiplier_is_applied_per_host():
    # RAM normalized [0.5, 1.0]; host a's aggregate multiplier 4 -> 2.0 beats b's 1.0
    snap = cloud(host("a", free_ram_mb=1024).in_aggregate("big", ram_weight_multiplier="4"),
                 host("b", free_ram_mb=2048))
    assert weights_of([RAMWeigher()], snap, spec()) == [2.0, 1.0]


def test_weighers_sum_in_order():
    # RAM [0.5, 1.0] + Disk [1.0, 0.5] -> [1.5, 1.5]: a tie, input order kept
    snap = cloud(host("a", free_ram_mb=1024, free_disk_mb=1000),
                 host("b", free_ram_mb=2048, free_disk_mb=500))
    assert weights_of([RAMWeigher(), DiskWeigher()], snap, spec()) == [1.5, 1.5]


def test_a_weigher_named_twice_weighs_twice_as_in_nova():
    """Nova's loader keeps every entry of weight_classes and its host manager makes a
    weigher of each; Berth dropped the repeat and picked the other host."""
    conf = config(filter_scheduler={
        "weight_classes": ["nova.scheduler.weights.ram.RAMWeigher",
                           "nova.scheduler.weights.cpu.CPUWeigher",
                           "nova.scheduler.weights.ram.RAMWeigher"],
        "cpu_weight_multiplier": 6.0})
    weighers = plugins.load_weighers(conf)
    assert [type(w).__name__ for w in weighers] == ["RAMWeigher", "CPUWeigher", "RAMWeigher"]
    snap = cloud(host("h0", free_ram_mb=2048, vcpus_total=8, vcpus_used=4),
                 host("h1", free_ram_mb=1024, vcpus_total=8, vcpus_used=0))
    # RAM h0 1.0, h1 0.5, twice; CPU h0 6 x 0.875, h1 6 x 1.0. Once, RAM would leave
    # h0 6.25 and h1 6.5: the other host.
    h0, h1 = weights_of(weighers, snap, spec())
    assert (h0, h1) == (pytest.approx(7.25), pytest.approx(7.0))
    decision = Scheduler(conf, filters=[]).select_destinations(
        spec(), snap, now=NOW, rng=random.Random(0))
    assert decision.hosts == [("h0", "h0")]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_every_built_in_weigher_agrees_on_both_paths_and_with_the_reference_loop(data):
    check_paths_agree(builtin_weigher_classes(), data)


# ----------------------------------------------------------------------- explanations
def test_explained_terms_sum_to_each_hosts_weight():
    conf = config(**WORKED_CONFIG)
    sched = Scheduler(conf, filters=[])
    snap = cloud(*worked_example_builders(),
                 host("host2", free_ram_mb=300, free_disk_mb=100, failed_builds=1,
                      num_io_ops=4, num_instances=7).in_aggregate("x", ram_weight_multiplier="2"))
    decision = sched.select_destinations(spec(), snap, now=NOW, rng=random.Random(0),
                                         explain=True, return_alternates=False)
    diag = decision.diagnosis.instances[0]
    assert len(diag.weighing) == 3
    for weighing in diag.weighing:
        assert [t.weigher for t in weighing.terms] == list(BUILTIN_WEIGHERS)
        assert sum(t.contribution for t in weighing.terms) == pytest.approx(weighing.weight,
                                                                             abs=1e-9)
    by_host = {w.host: w.weight for w in diag.weighing}
    # host2 is clamped to the minimum everywhere and fails builds: far behind
    assert by_host["host1"] > by_host["host0"] > by_host["host2"]
    assert decision.hosts[0][0] == "host1"
    ram_of_host2 = next(t for t in diag.weighing[2].terms if t.weigher == "RAMWeigher")
    assert (ram_of_host2.raw, ram_of_host2.multiplier) == (300.0, 2.0)


def test_the_worked_example_weights_appear_in_the_explanation():
    sched = Scheduler(config(**WORKED_CONFIG), filters=[])
    decision = sched.select_destinations(spec(), worked_example_cloud(), now=NOW,
                                         rng=random.Random(0), explain=True,
                                         return_alternates=False)
    weighing = decision.diagnosis.instances[0].weighing
    assert [(w.host, round(w.weight, 12)) for w in weighing] == [("host1", 2.5),
                                                                 ("host0", 0.375)]


# ----------------------------------------------------------------- server-group policy
class ServerGroupAffinityFilter(BaseHostFilter):
    """Stands in for the real filter: the policy check looks at the enabled class names."""

    def host_passes(self, host_state, spec_obj):
        return True


class ServerGroupAntiAffinityFilter(ServerGroupAffinityFilter):
    """Stands in for the real filter."""


def select(sched, policy):
    req = spec(group=InstanceGroup(policy=policy, members=[]))
    return sched.select_destinations(req, cloud(host("a")), now=NOW, rng=random.Random(0),
                                     return_alternates=False)


@pytest.mark.parametrize(
    ("policy", "needed"),
    [
        pytest.param("affinity", "ServerGroupAffinityFilter",
                     id="affinity needs ServerGroupAffinityFilter"),
        pytest.param("anti-affinity", "ServerGroupAntiAffinityFilter",
                     id="anti-affinity needs ServerGroupAntiAffinityFilter"),
    ],
)
def test_a_hard_policy_without_its_filter_is_unsupported(policy, needed):
    sched = Scheduler(config(), filters=[], weighers=[])
    with pytest.raises(UnsupportedPolicy, match=needed) as err:
        select(sched, policy)
    assert err.value.code == "berth.scheduling.unsupported_policy"


def test_a_hard_policy_with_its_filter_enabled_is_scheduled():
    sched = Scheduler(config(), filters=[ServerGroupAffinityFilter(),
                                         ServerGroupAntiAffinityFilter()], weighers=[])
    assert select(sched, "affinity").hosts == [("a", "a")]
    assert select(sched, "anti-affinity").hosts == [("a", "a")]


@pytest.mark.parametrize(
    ("policy", "needed"),
    [
        pytest.param("soft-affinity", "ServerGroupSoftAffinityWeigher",
                     id="soft-affinity needs its weigher in weight_classes"),
        pytest.param("soft-anti-affinity", "ServerGroupSoftAntiAffinityWeigher",
                     id="soft-anti-affinity needs its weigher in weight_classes"),
    ],
)
def test_a_soft_policy_without_its_weigher_is_unsupported(policy, needed):
    conf = config(filter_scheduler={"weight_classes": ["RAMWeigher", "DiskWeigher"]})
    sched = Scheduler(conf, filters=[])
    with pytest.raises(UnsupportedPolicy, match=needed):
        select(sched, policy)
    ok = config(filter_scheduler={"weight_classes": ["RAMWeigher", needed]})
    assert select(Scheduler(ok, filters=[]), policy).hosts == [("a", "a")]


@pytest.mark.parametrize("all_weighers", sorted(plugins.ALL_WEIGHERS_NAMES))
def test_all_weighers_in_weight_classes_supports_soft_policies(all_weighers):
    conf = config(filter_scheduler={"weight_classes": [all_weighers]})
    sched = Scheduler(conf, filters=[], weighers=[RAMWeigher(conf)])
    assert select(sched, "soft-anti-affinity").hosts == [("a", "a")]


def test_an_unknown_policy_is_unsupported():
    with pytest.raises(UnsupportedPolicy, match="'best-effort' is not one of"):
        select(Scheduler(config(), filters=[], weighers=[]), "best-effort")


class _Counting(BaseHostWeigher):
    """Counts bulk calls, to show the handler uses the bulk methods."""

    calls = 0

    def weigh_all_hosts(self, hosts, weight_properties):
        type(self).calls += 1
        return np.arange(len(hosts), dtype=float)

    def _weigh_object(self, host_state, weight_properties):
        raise AssertionError("the handler should use the bulk path")


def test_the_handler_uses_the_bulk_path_once_per_weigher():
    snap = cloud(host("a"), host("b"), host("c"))
    from berth.host_state import WorkingSet
    from berth.weighers.handler import WeigherRanker

    ranking = WeigherRanker([_Counting()]).rank(WorkingSet(snap, NOW).hosts(), spec())
    assert _Counting.calls == 1
    assert ranking.weights.tolist() == [0.0, 0.5, 1.0]
    assert ranking.order.tolist() == [2, 1, 0]


def test_every_built_in_weigher_documents_its_rule_and_its_lever():
    import sys

    from berth.weighers.utils import MultiplierWeigher

    for cls in builtin_weigher_classes():
        first_line = (cls.__doc__ or "").strip().splitlines()[0]
        assert first_line and len(first_line) <= 100, cls
        assert issubclass(cls, MultiplierWeigher)
        module_doc = sys.modules[cls.__module__].__doc__ or ""
        assert cls.multiplier_option in module_doc or cls.aggregate_key() in module_doc, cls
        info = cls(config()).describe()
        assert info["name"] == cls.__name__ and info["aggregate_key"] == cls.aggregate_key()


# ---------------------------------------------------------------------- request memo
def _memo_case(seed: int):
    from berth.host_state import WorkingSet
    from berth.model import Instance

    rnd = random.Random(seed)
    snap = cloud(*(host(f"h{i}", free_ram_mb=rnd.choice([1024, 4096, 8192, 16384]),
                        total_usable_ram_mb=16384, vcpus_used=rnd.randint(0, 8),
                        free_disk_mb=rnd.choice([10240, 51200, 102400]),
                        stats={"io_workload": str(rnd.randint(0, 3))},
                        instances=[f"i{i}"] if i % 3 == 0 else [])
                   for i in range(12)))
    group = InstanceGroup(policy="soft-anti-affinity", uuid="g", members=["i0", "i3"])
    req = spec(memory_mb=2048, vcpus=2, root_gb=10, group=group)
    weighers = [cls(config()) for cls in builtin_weigher_classes()]
    return snap, req, weighers, WorkingSet(snap, NOW), Instance


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000),
       steps=st.lists(st.tuples(st.integers(0, 11), st.booleans()), min_size=1, max_size=8))
def test_memoized_rankings_are_bit_for_bit_a_fresh_weighing(seed, steps):
    from berth.weighers.handler import WeigherRanker

    snap, req, weighers, ws, instance = _memo_case(seed)
    ranker = WeigherRanker(weighers)
    ws.memo["instances"] = 5
    rows = np.arange(len(snap), dtype=np.int64)
    for consumed, drop in steps:
        memoized = ranker.rank(ws.hosts(rows), req).weights
        ws.memo["instances"] = 1
        fresh = WeigherRanker(weighers).rank(ws.hosts(rows), req).weights
        ws.memo["instances"] = 5
        np.testing.assert_array_equal(memoized, fresh)
        if len(rows) <= 2:
            break
        row = int(rows[consumed % len(rows)])
        ws.consume(row, req)
        ws.add_instance(row, instance(uuid=f"new-{row}"))
        if drop:
            rows = rows[rows != row]


def test_the_memo_never_writes_to_a_weighers_array():
    from berth.host_state import WorkingSet
    from berth.weighers.handler import WeigherRanker

    class Cached(BaseHostWeigher):
        """Hands out one array per host list, as a weigher with a cache would."""

        minval = 0.0

        def __init__(self, conf):
            super().__init__(conf)
            self.cache = {}

        def weigh_all_hosts(self, hosts, weight_properties):
            key = tuple(hosts.rows.tolist())
            if key not in self.cache:
                self.cache[key] = hosts.col("free_ram_mb")
            return self.cache[key]

        def _weigh_object(self, host_state, weight_properties):
            return host_state.free_ram_mb

    snap = cloud(host("a", free_ram_mb=4096), host("b", free_ram_mb=8192))
    weigher = Cached(config())
    ranker = WeigherRanker([RAMWeigher(config()), weigher])
    ranker._memoizable = True  # as a built-in: weighed incrementally
    ranker._inputs = [frozenset({"free_ram_mb"}), frozenset({"free_ram_mb"})]
    ws = WorkingSet(snap, NOW)
    ws.memo["instances"] = 3
    rows = np.arange(2)
    req = spec()
    ranker.rank(ws.hosts(rows), req)
    handed_out = weigher.cache[(0, 1)].copy()
    ws.consume(1, spec(memory_mb=1024))
    weights = ranker.rank(ws.hosts(rows), req).weights
    np.testing.assert_array_equal(weigher.cache[(0, 1)], handed_out)
    # b: 7168 MB left, still the most; both weighers normalize from 0 (minval).
    assert weights.tolist() == [2 * 4096 / 7168, 2.0]


def test_hosts_the_memo_has_not_seen_start_it_over():
    from berth.weighers.handler import WeigherRanker

    snap, req, weighers, ws, _ = _memo_case(3)
    ranker = WeigherRanker(weighers)
    ws.memo["instances"] = 5
    for rows in (np.array([0, 2, 4]), np.array([0, 4]), np.array([0, 1, 4]), np.arange(12)):
        memoized = ranker.rank(ws.hosts(rows), req).weights
        ws.memo["instances"] = 1
        fresh = WeigherRanker(weighers).rank(ws.hosts(rows), req).weights
        ws.memo["instances"] = 5
        np.testing.assert_array_equal(memoized, fresh)


class RankByNameWeigher(BaseHostWeigher):
    """Seed 000's second shape: only ``weigh_objects``, which sees every host at once."""

    def weigh_objects(self, weighed_obj_list, weight_properties):
        names = sorted(w.obj.host for w in weighed_obj_list)
        # The alphabetically last host weighs most; values are not clamped by the handler.
        return [names.index(w.obj.host) * 10.0 for w in weighed_obj_list]


def test_a_weigher_overriding_only_weigh_objects_ranks_hosts_on_both_paths():
    snapshot = cloud(host("b"), host("c"), host("a"))
    weigher = RankByNameWeigher(config())
    # raw b 10, c 20, a 0 -> normalized 0.5, 1.0, 0.0
    assert weights_of([weigher], snapshot, spec()) == [0.5, 1.0, 0.0]
    for per_host in (False, True):
        sched = Scheduler(config(), filters=[], weighers=[weigher], per_host=per_host)
        decision = sched.select_destinations(spec(), snapshot, now=NOW, rng=random.Random(0))
        assert decision.hosts == [("c", "c")]


def test_a_weigh_objects_list_of_the_wrong_length_names_the_weigher():
    class ShortWeigher(BaseHostWeigher):
        def weigh_objects(self, weighed_obj_list, weight_properties):
            return [1.0]

    sched = Scheduler(config(), filters=[], weighers=[ShortWeigher(config())])
    with pytest.raises(ConfigError, match="ShortWeigher: weigh_objects returned 1 weights for 2 hosts"):
        sched.select_destinations(spec(), cloud(host("a"), host("b")), now=NOW, rng=random.Random(0))


def test_seed_000s_spelling_weight_objects_is_taken_as_weigh_objects(caplog):
    class SpelledLikeTheSeedWeigher(BaseHostWeigher):
        def weight_objects(self, weighed_obj_list, weight_properties):
            return [float(w.obj.free_ram_mb) for w in weighed_obj_list]

    assert "old spelling of weigh_objects" in caplog.text
    snapshot = cloud(host("a", free_ram_mb=100), host("b", free_ram_mb=300))
    assert weights_of([SpelledLikeTheSeedWeigher(config())], snapshot, spec()) == [0.0, 1.0]


def test_a_weigher_implementing_no_weighing_method_fails_at_start_up(monkeypatch):
    class EmptyWeigher(BaseHostWeigher):
        pass

    monkeypatch.setattr(plugins, "weigher_classes", lambda conf: [EmptyWeigher])
    with pytest.raises(PluginNotFound, match="EmptyWeigher implements neither"):
        plugins.load_weighers(config())
