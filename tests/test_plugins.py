"""Third-party plugins: a Nova-style custom filter installed as a real package."""

from __future__ import annotations

import importlib
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from berth import plugins
from berth.claims import InMemoryPlacement
from berth.config import SchedulerConfig
from berth.errors import PluginNotFound
from berth.pipeline import Scheduler
from builders import NOW, cloud, host, spec

PLUGIN_SOURCE = Path(__file__).parent / "plugins" / "acmefilter"


@pytest.fixture(scope="module")
def installed_acme(tmp_path_factory: pytest.TempPathFactory):
    """pip-install the AcmeFilter package (with its entry points) into a temporary target."""
    source = tmp_path_factory.mktemp("src") / "acmefilter"
    shutil.copytree(PLUGIN_SOURCE, source)
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(source)],
        check=True, capture_output=True,
    )
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    yield target
    sys.path.remove(str(target))
    from berth.extra_specs.validators import default_registry

    default_registry.cache_clear()
    for name in [m for m in sys.modules if m.startswith("acmefilter")]:
        del sys.modules[name]
    importlib.invalidate_caches()


def test_a_nova_style_filter_from_an_installed_package_is_found_by_its_entry_point(installed_acme):
    config = SchedulerConfig.from_dict(
        {"filter_scheduler": {"enabled_filters": ["ComputeFilter", "AcmeFilter"]}}
    )
    scheduler = Scheduler(config)
    assert [type(f).__name__ for f in scheduler.filters] == ["ComputeFilter", "AcmeFilter"]
    snap = cloud(host("a"), host("b"))
    req = spec(extra_specs={"acme:foo": "bar"})
    placement = InMemoryPlacement(snap)
    decision = scheduler.select_destinations(
        req, snap, now=NOW, rng=random.Random(1), candidates=placement.candidates(req),
        claimer=placement,
    )
    assert decision.hosts[0][0] in {"a", "b"}


def test_the_seeds_nova_conf_form_names_the_plugin_by_dotted_path(installed_acme, tmp_path):
    conf = tmp_path / "nova.conf"
    conf.write_text(
        "[filter_scheduler]\n"
        "available_filters = nova.scheduler.filters.all_filters\n"
        "available_filters = acmefilter.AcmeFilter\n"
        "enabled_filters = ComputeFilter,AcmeFilter\n"
    )
    filters = plugins.load_filters(SchedulerConfig.from_files([conf]))
    assert [type(f).__name__ for f in filters] == ["ComputeFilter", "AcmeFilter"]


def test_an_unknown_filter_fails_at_start_up_listing_the_known_ones():
    config = SchedulerConfig.from_dict({"filter_scheduler": {"enabled_filters": ["NoSuchFilter"]}})
    with pytest.raises(PluginNotFound) as info:
        Scheduler(config)
    message = str(info.value)
    assert "NoSuchFilter" in message and "ComputeFilter" in message and "RamFilter" in message


def test_an_unimportable_dotted_path_names_the_option_and_the_module():
    config = SchedulerConfig.from_dict(
        {"filter_scheduler": {"available_filters": ["nowhere.to.be.Found"]}}
    )
    with pytest.raises(PluginNotFound, match=r"available_filters.*nowhere\.to\.be"):
        plugins.load_filters(config)


def test_an_unknown_weigher_fails_at_start_up_listing_the_known_ones():
    config = SchedulerConfig.from_dict({"filter_scheduler": {"weight_classes": ["FooWeigher"]}})
    with pytest.raises(PluginNotFound, match="RAMWeigher"):
        plugins.load_weighers(config)


def test_nova_paths_of_built_ins_are_aliases():
    config = SchedulerConfig.from_dict({"filter_scheduler": {
        "available_filters": ["nova.scheduler.filters.compute_filter.ComputeFilter"],
        "enabled_filters": ["ComputeFilter"],
        "weight_classes": ["nova.scheduler.weights.ram.RAMWeigher"],
    }})
    assert plugins.names(plugins.load_filters(config)) == ["ComputeFilter"]
    assert plugins.names(plugins.load_weighers(config)) == ["RAMWeigher"]


def test_the_old_name_compute_capability_filter_is_an_alias(caplog):
    config = SchedulerConfig.from_dict(
        {"filter_scheduler": {"enabled_filters": ["ComputeCapabilityFilter"]}}
    )
    assert plugins.names(plugins.load_filters(config)) == ["ComputeCapabilitiesFilter"]
    assert "old name" in caplog.text


@pytest.mark.parametrize("name", ["RamWeigher", "nova.scheduler.weights.ram.RamWeigher"])
def test_seed_003s_ram_weigher_is_an_old_name_of_the_ram_weigher(caplog, name):
    config = SchedulerConfig.from_dict({"filter_scheduler": {"weight_classes": [name]}})
    assert plugins.names(plugins.load_weighers(config)) == ["RAMWeigher"]
    assert "RamWeigher is an old name of RAMWeigher" in caplog.text


def test_the_plugins_extra_spec_validators_are_registered_by_entry_point(installed_acme):
    from berth.extra_specs.validators import check_flavor, default_registry

    default_registry.cache_clear()  # plugins are read once per process; this one came later
    assert check_flavor({"acme:foo": "bar"}) == []
    problems = check_flavor({"acme:foo": "qux"})
    assert len(problems) == 1 and "acme:foo" in problems[0]


def test_cloud_check_and_schedule_enforce_the_plugins_validator_too(installed_acme, tmp_path, capsys):
    from berth.cli import main
    from berth.extra_specs.validators import default_registry

    default_registry.cache_clear()  # plugins are read once per process; this one came later
    path = tmp_path / "cloud.yaml"
    path.write_text("hosts:\n  - {host: h1, vcpus: 8, memory_mb: 8192, local_gb: 100}\n"
                    "flavors:\n"
                    "  - {name: good, vcpus: 1, memory_mb: 512, extra_specs: {'acme:foo': bar}}\n"
                    "  - {name: bad, vcpus: 1, memory_mb: 512, extra_specs: {'acme:foo': qux}}\n")
    assert main(["cloud", "check", str(path)]) == 3
    assert "error: flavor 'bad': acme:foo='qux': must be one of bar, baz" in capsys.readouterr().out
    assert main(["schedule", str(path), "--flavor", "bad", "--now", "1800000000"]) == 3
    assert "error: flavor 'bad': acme:foo='qux'" in capsys.readouterr().err
    assert main(["schedule", str(path), "--flavor", "good", "--now", "1800000000"]) == 0
