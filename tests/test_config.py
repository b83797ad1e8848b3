"""nova.conf options: Nova's names and defaults, deprecated names, flag files, errors."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from berth.config import SchedulerConfig, unknown_options
from berth.errors import ConfigError
from berth.weighers.setting import parse_weight_setting


def write(tmp_path, text, name="nova.conf"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_defaults_are_nova_34s():
    c = SchedulerConfig.default()
    assert c.filter_scheduler.enabled_filters == (
        "ComputeFilter", "ComputeCapabilitiesFilter", "ImagePropertiesFilter",
        "ServerGroupAntiAffinityFilter", "ServerGroupAffinityFilter",
    )
    assert c.filter_scheduler.host_subset_size == 1
    assert c.filter_scheduler.max_io_ops_per_host == 8
    assert c.filter_scheduler.max_instances_per_host == 50
    assert c.filter_scheduler.io_ops_weight_multiplier == -1.0
    assert c.filter_scheduler.num_instances_weight_multiplier == 0.0
    assert c.filter_scheduler.build_failure_weight_multiplier == 1000000.0
    assert c.scheduler.max_attempts == 3
    assert c.scheduler.max_placement_results == 1000
    assert c.metrics.weight_of_unavailable == -10000.0
    assert c.initial_cpu_allocation_ratio == 4.0 and c.initial_ram_allocation_ratio == 1.0
    assert c.cpu_allocation_ratio is None
    assert c.service_down_time == 60 and c.default_availability_zone == "nova"
    assert c.compute_fill_first_cost_fn_weight == -1.0
    assert c.workarounds.disable_group_policy_check_upcall is False


def test_the_late_group_policy_check_is_turned_off_by_its_workaround(tmp_path):
    path = write(tmp_path, "[workarounds]\ndisable_group_policy_check_upcall = true\n")
    assert SchedulerConfig.from_files([path]).workarounds.disable_group_policy_check_upcall is True


def test_the_configuration_is_immutable():
    c = SchedulerConfig.default()
    with pytest.raises(AttributeError):
        c.filter_scheduler.host_subset_size = 3  # type: ignore[misc]
    assert c.replace("filter_scheduler", host_subset_size=3).filter_scheduler.host_subset_size == 3
    assert c.filter_scheduler.host_subset_size == 1


def test_available_filters_repeats_accumulate_like_nova(tmp_path):
    path = write(tmp_path, "[filter_scheduler]\navailable_filters = berth.filters.all_filters\n"
                           "available_filters = acme.AcmeFilter\nenabled_filters = ComputeFilter, AcmeFilter\n")
    c = SchedulerConfig.from_files([path])
    assert c.filter_scheduler.available_filters == ("berth.filters.all_filters", "acme.AcmeFilter")
    assert c.filter_scheduler.enabled_filters == ("ComputeFilter", "AcmeFilter")


@pytest.mark.parametrize(
    ("old", "group", "new", "value", "expected"),
    [
        ("scheduler_default_filters", "filter_scheduler", "enabled_filters", "RamFilter,ComputeFilter",
         ("RamFilter", "ComputeFilter")),
        ("scheduler_weight_classes", "filter_scheduler", "weight_classes", "RAMWeigher", ("RAMWeigher",)),
        ("scheduler_available_filters", "filter_scheduler", "available_filters",
         "nova.scheduler.filters.standard_filters", ("nova.scheduler.filters.standard_filters",)),
        ("scheduler_host_subset_size", "filter_scheduler", "host_subset_size", "4", 4),
        ("scheduler_max_attempts", "scheduler", "max_attempts", "5", 5),
        ("metrics_weight_setting", "metrics", "weight_setting", "cpu.percent=-1.0, load=2",
         ("cpu.percent=-1.0", "load=2")),
        ("image_isolated", "filter_scheduler", "isolated_images", "img-a,img-b", ("img-a", "img-b")),
        ("host_isolated", "filter_scheduler", "isolated_hosts", "h1,h2", ("h1", "h2")),
    ],
    ids=["scheduler_default_filters", "scheduler_weight_classes", "scheduler_available_filters",
         "scheduler_host_subset_size", "scheduler_max_attempts", "metrics_weight_setting",
         "image_isolated", "host_isolated"],
)
def test_the_seeds_deprecated_names_are_accepted_with_a_warning(tmp_path, caplog, old, group, new, value, expected):
    path = write(tmp_path, f"[DEFAULT]\n{old} = {value}\n")
    with caplog.at_level(logging.WARNING):
        c = SchedulerConfig.from_files([path])
    assert getattr(c.group(group), new) == expected
    assert any(old in r.getMessage() for r in caplog.records)


def test_an_old_flag_file_is_read_like_nova_conf(tmp_path):
    path = write(tmp_path, "# seed 001 style\n"
                           "--scheduler_default_filters=AvailabilityZoneFilter,RamFilter,ComputeFilter\n"
                           "--least_cost_functions=nova.scheduler.least_cost.compute_fill_first_cost_fn\n"
                           "--compute_fill_first_cost_fn_weight=-1.0\n"
                           "--ram_allocation_ratio=1.5\n"
                           "--filter_scheduler.host_subset_size=2\n", name="nova.flags")
    c = SchedulerConfig.from_files([path])
    assert c.filter_scheduler.enabled_filters == ("AvailabilityZoneFilter", "RamFilter", "ComputeFilter")
    assert c.least_cost_functions == ("nova.scheduler.least_cost.compute_fill_first_cost_fn",)
    assert c.ram_allocation_ratio == 1.5
    assert c.filter_scheduler.host_subset_size == 2


def test_the_seeds_isolated_hosts_flags_are_read_from_a_flag_file(tmp_path, caplog):
    path = write(tmp_path, "--image_isolated=img-a,img-b\n--host_isolated=h1\n", name="nova.flags")
    with caplog.at_level(logging.WARNING):
        c = SchedulerConfig.from_files([path])
    assert c.filter_scheduler.isolated_images == ("img-a", "img-b")
    assert c.filter_scheduler.isolated_hosts == ("h1",)
    assert "image_isolated" in caplog.text and "host_isolated" in caplog.text


def test_metrics_weight_setting_in_the_metrics_group_is_an_old_name_too(tmp_path, caplog):
    path = write(tmp_path, "[metrics]\nmetrics_weight_setting = cpu.percent=-1.0\n")
    with caplog.at_level(logging.WARNING):
        c = SchedulerConfig.from_files([path])
    assert c.metrics.weight_setting == ("cpu.percent=-1.0",)
    assert "metrics_weight_setting" in caplog.text


def test_a_custom_cost_functions_weight_option_is_registered_from_the_function_list(tmp_path):
    path = write(tmp_path, "[DEFAULT]\nleast_cost_functions = my.costs.compute_spread_cost_fn\n"
                           "compute_spread_cost_fn_weight = 2.5\n")
    assert SchedulerConfig.from_files([path]).compute_spread_cost_fn_weight == 2.5


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[filter_scheduler]\nhost_subset_size = zero\n", "host_subset_size"),
        ("[filter_scheduler]\nhost_subset_size = 0\n", "host_subset_size"),
        ("[filter_scheduler]\nimage_properties_default_architecture = pdp11\n",
         "image_properties_default_architecture"),
        ("[filter_scheduler]\nweighing_strategy = magic\n", "weighing_strategy"),
        ("[filter_scheduler\nhost_subset_size = 1\n", "nova.conf"),
        ("--not a flag\n", "not a --name=value flag"),
        ("[filter_scheduler]\ncpu_weight_multiplier = nan\n",
         r"cpu_weight_multiplier = nan: must be a finite number"),
        ("[filter_scheduler]\nram_weight_multiplier = -inf\n",
         r"ram_weight_multiplier = -inf: must be a finite number"),
        ("[DEFAULT]\ncpu_allocation_ratio = inf\n", r"cpu_allocation_ratio = inf"),
    ],
    ids=["non-integer", "below the minimum", "unknown architecture", "unknown strategy",
         "broken section header", "broken flag line", "a NaN multiplier",
         "an infinite multiplier", "an infinite allocation ratio"],
)
def test_a_bad_value_is_a_config_error_naming_the_option(tmp_path, text, fragment):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=fragment):
        SchedulerConfig.from_files([path])


def test_a_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        SchedulerConfig.from_files([str(tmp_path / "absent.conf")])


def test_unknown_options_in_known_groups_are_reported_as_likely_typos(tmp_path):
    path = write(tmp_path, "[filter_scheduler]\nhost_subset_sise = 2\n[unrelated]\nx = 1\n"
                           "[libvirt]\nvirt_typ = kvm\n")
    assert unknown_options([path]) == [
        f"{path}: [filter_scheduler] host_subset_sise is not a known option; did you mean "
        "host_subset_size?",
        f"{path}: [unrelated] is not a known section (its options are ignored)",
        f"{path}: [libvirt] virt_typ is not a known option; did you mean virt_type?"]


def test_a_near_miss_of_a_known_section_is_reported_and_other_groups_are_not(tmp_path):
    path = write(tmp_path, "[filtr_scheduler]\nhost_subset_size = 3\n"
                           "[placement]\nauth_type = password\n")
    assert unknown_options([path]) == [
        f"{path}: [filtr_scheduler] is not a known section; did you mean [filter_scheduler]? "
        "(its options are ignored)"]


def test_reading_a_config_warns_about_typos_so_every_command_does(tmp_path, caplog):
    path = write(tmp_path, "[filter_scheduler]\nhost_subset_sise = 3\n")
    with caplog.at_level(logging.WARNING, logger="berth.config"):
        config = SchedulerConfig.from_files([path])
    assert config.filter_scheduler.host_subset_size == 1
    assert any("host_subset_sise is not a known option; did you mean host_subset_size?"
               in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="berth.config"):
        SchedulerConfig.from_files([path], warn_unknown=False)
    assert not caplog.records


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (["a=1.0", "b=-2"], [("a", 1.0), ("b", -2.0)]),
        (["name", "=5", "name=2.0t"], []),
        (["a =2", "a=3"], [("a ", 2.0), ("a", 3.0)]),
    ],
    ids=["plain pairs", "bad items are dropped", "keys are not stripped and duplicates stay"],
)
def test_name_ratio_settings_parse_like_nova(items, expected):
    assert parse_weight_setting(items) == expected


def test_a_real_nova_conf_is_quiet_and_nova_options_are_named_not_used(tmp_path):
    """A controller's nova.conf: Nova's own options ([DEFAULT] debug, [database] ...),
    the Keystone and Placement credentials Berth's services read, and an honoured
    deprecated name ([DEFAULT] scheduler_default_filters) give no warning."""
    from berth.config_check import check_files

    path = os.path.join(os.path.dirname(__file__), "data", "real-nova.conf")
    report = check_files([path])
    assert report.problems == []
    assert "[DEFAULT] debug" in report.not_used and "[libvirt] virt_type" in report.not_used
    assert not any(entry.startswith(("[keystone_authtoken]", "[placement]", "[api]"))
                   for entry in report.not_used)
    done = subprocess.run([sys.executable, "-m", "berth.cli", "config", "check", path, "--json"],
                          capture_output=True, text=True, check=True)
    answer = json.loads(done.stdout)
    assert answer["warnings"] == [] and "[vnc] enabled" in answer["not_used_by_berth"]
    assert done.stderr == ""


@pytest.mark.parametrize(("text", "message"), [
    ("[scheduler]\nmax_attempts =\n",
     "[scheduler] max_attempts: empty value; give one, or leave the option out for its "
     "default (3)"),
    ("[filter_scheduler]\nram_weight_multiplier =\n",
     "[filter_scheduler] ram_weight_multiplier: empty value"),
    ("[DEFAULT]\nreserved_host_memory_mb = 99999999999999999999999\n",
     "[DEFAULT] reserved_host_memory_mb = 99999999999999999999999: out of the 64-bit"),
    ("no section = 1\n", "line 1: no [section] header before 'no section = 1'"),
    ("[DEFAULT]\n[DEFAULT\n", "line 2: cannot parse '[DEFAULT\\n'"),
], ids=["empty int", "empty float", "past 64 bits", "no section", "broken header"])
def test_values_nothing_could_use_are_one_line_config_errors(tmp_path, text, message):
    """An empty "name =" reads as None, which every use of a number failed on with a
    traceback after ``berth config check`` said ok."""
    path = tmp_path / "nova.conf"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        SchedulerConfig.from_files([str(path)])
    assert message in str(info.value) and "\n" not in str(info.value)
