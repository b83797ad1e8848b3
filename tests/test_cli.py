"""The berth command line: outputs, JSON, exit codes and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from berth.cli import main

ROOT = Path(__file__).resolve().parent.parent
CLOUD = str(ROOT / "examples" / "cloud.yaml")
CONF = str(ROOT / "examples" / "nova.conf")
NOW = "1800000000"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_schedule_prints_one_row_per_instance_with_alternates(capsys):
    code, out, _ = run(capsys, "schedule", CLOUD, "--flavor", "m1.large", "--num", "3",
                       "--seed", "7", "--now", NOW)
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].split()[:3] == ["#", "instance", "host"]
    assert len(lines) == 4
    # The example cloud names its cells: the cell column shows the names.
    assert {line.split()[4] for line in lines[1:]} <= {"cell1", "cell2"}


def test_the_same_seed_gives_the_same_json_decision(capsys):
    args = ("schedule", CLOUD, "--config-file", CONF, "--flavor", "m1.small", "--num", "4",
            "--seed", "11", "--now", NOW, "--json")
    first = json.loads(run(capsys, *args)[1])
    second = json.loads(run(capsys, *args)[1])
    assert first == second
    assert len(first["instances"]) == 4
    hosts = [i["host"] for i in first["instances"]]
    for inst in first["instances"]:
        assert inst["allocation_request"]["allocations"]
        assert inst["host"] not in {a["host"] for a in inst["alternates"]}
        assert not {a["host"] for a in inst["alternates"]} & set(hosts)


def test_explain_shows_the_summary_the_steps_and_the_weights(capsys):
    code, out, _ = run(capsys, "schedule", CLOUD, "--config-file", CONF, "--flavor", "m1.large",
                       "--image", "ubuntu", "--seed", "1", "--now", NOW, "--explain")
    assert code == 0
    assert "hosts available" in out
    # A disabled service is left out by placement (the COMPUTE_STATUS_DISABLED trait), as
    # in Nova 34, before ComputeFilter sees it.
    assert "ComputeFilter" in out and "compute service disabled (trait COMPUTE_STATUS_DISABLED)" in out
    assert "top hosts by weight" in out


def test_no_valid_host_exits_4_with_a_terse_error_and_the_explanation_when_asked(capsys):
    code, out, err = run(capsys, "schedule", CLOUD, "--flavor", "m1.huge", "--num", "40",
                         "--now", NOW, "--explain")
    assert code == 4
    assert err.startswith("error: No valid host was found.")
    assert "hosts available" in out


def test_an_unknown_flavor_is_a_one_line_error_listing_the_known_flavors(capsys):
    code, _, err = run(capsys, "schedule", CLOUD, "--flavor", "m9.giant")
    assert code == 3
    assert err.count("\n") == 1 and "m1.large" in err


def test_a_bad_config_file_exits_2_naming_the_option(capsys, tmp_path):
    bad = tmp_path / "nova.conf"
    bad.write_text("[filter_scheduler]\nenabled_filters = ComputeFilter,NoSuchFilter\n")
    code, _, err = run(capsys, "schedule", CLOUD, "--flavor", "m1.small", "--config-file", str(bad))
    assert code == 2
    assert "NoSuchFilter" in err and "ComputeFilter" in err


def test_config_check_lists_the_enabled_plugins(capsys):
    code, out, _ = run(capsys, "config", "check", CONF)
    assert code == 0
    assert "AvailabilityZoneFilter" in out and "RAMWeigher" in out


def test_cloud_check_summarizes_the_cloud(capsys):
    code, out, _ = run(capsys, "cloud", "check", CLOUD)
    assert code == 0 and "compute nodes" in out


def test_filters_list_prints_every_built_in_with_its_rule(capsys):
    code, out, _ = run(capsys, "filters", "list")
    assert code == 0
    for name in ("ComputeFilter", "RamFilter", "JsonFilter", "NUMATopologyFilter", "TrustedFilter"):
        assert name in out


def test_weighers_list_prints_every_built_in(capsys):
    code, out, _ = run(capsys, "weighers", "list")
    assert code == 0 and "RAMWeigher" in out and "BuildFailureWeigher" in out


def test_flavor_check_reports_a_bad_extra_spec(capsys):
    code, _, _ = run(capsys, "flavor", "check", "--extra-spec", "hw:cpu_policy=dedicated")
    assert code == 0
    code, out, _ = run(capsys, "flavor", "check", "--extra-spec", "hw:cpu_policy=sometimes")
    assert code == 3 and "hw:cpu_policy" in out


@pytest.mark.parametrize("argv", [["schedule", CLOUD, "--flavor", "m1.small", "--hint", "nokey"]],
                         ids=["hint without a value"])
def test_malformed_arguments_are_one_line_errors(capsys, argv):
    code, _, err = run(capsys, *argv)
    assert code == 3 and err.startswith("error:")


def test_seed_001s_flag_file_ranks_by_cost_and_explains_costs(capsys, caplog, tmp_path):
    flags = tmp_path / "nova.flags"
    flags.write_text("--least_cost_functions=nova.scheduler.least_cost.compute_fill_first_cost_fn\n"
                     "--compute_fill_first_cost_fn_weight=-1.0\n")
    code, out, _ = run(capsys, "schedule", CLOUD, "--config-file", str(flags), "--flavor",
                       "m1.small", "--seed", "1", "--now", NOW, "--explain")
    assert code == 0
    assert "hosts are ranked by least cost" in caplog.text  # the notice, on stderr
    header = next(line for line in out.splitlines() if "top hosts by" in line)
    assert "top hosts by cost (lower is better" in header
    costs = [float(line.split()[1]) for line in out.splitlines()[out.splitlines().index(header) + 2:]
             if line.startswith("    ") and not line.startswith("     ")]
    assert costs and costs == sorted(costs) and costs[0] < 0  # -free RAM: spreading


MISTYPED_CLOUD = """
hosts:
  - {host: h1, vcpus: 8, memory_mb: 8192, local_gb: 100, stats: {gpus: "24"}}
flavors:
  - {name: glued, vcpus: 1, memory_mb: 512, extra_specs: {"capabilities:stats:gpus": ">=24"}}
  - {name: typo, vcpus: 1, memory_mb: 512, extra_specs: {"hw:cpu_polcy": "dedicated"}}
  - {name: fine, vcpus: 1, memory_mb: 512, extra_specs: {"capabilities:stats:gpus": ">= 24"}}
"""


@pytest.mark.parametrize(
    ("value", "warned"),
    [(">=24", "looks like the operator '>='"), ("> 30", "'>' is not an operator"),
     ("<or> a<or> b", "'<or>' without a space"), (">= 24", None), ("x86_64", None)],
    ids=["an operator glued to its operand", "'>' that is no operator",
         "an <or> glued to a candidate", "a well-spaced operator", "a plain value"],
)
def test_flavor_check_warns_about_values_that_only_look_like_operators(capsys, value, warned):
    code, out, _ = run(capsys, "flavor", "check", "--extra-spec", f"capabilities:cpu_info:x={value}")
    assert code == 0  # valid: Nova compares such a value as a string
    if warned:
        assert out.startswith(f"warning: capabilities:cpu_info:x={value!r}: ") and warned in out
        assert out.rstrip().endswith("1 warning(s)")
    else:
        assert "warning" not in out


def test_schedule_explain_warns_about_a_glued_operator_and_compares_it_as_nova(capsys, tmp_path):
    path = tmp_path / "cloud.yaml"
    path.write_text(MISTYPED_CLOUD)
    code, out, err = run(capsys, "schedule", str(path), "--flavor", "glued", "--now", NOW,
                         "--explain")
    # '>=24' is the string '>=24', which the host's '24' is not: no host, as in Nova.
    assert code == 4 and err.startswith("error: No valid host was found.")
    assert "warning: extra spec capabilities:stats:gpus='>=24': looks like the operator '>='" in out
    code, out, _ = run(capsys, "schedule", str(path), "--flavor", "fine", "--now", NOW, "--explain")
    assert code == 0 and "warning" not in out


def test_cloud_check_and_schedule_enforce_the_registered_validators(capsys, tmp_path):
    path = tmp_path / "cloud.yaml"
    path.write_text(MISTYPED_CLOUD)
    code, out, _ = run(capsys, "cloud", "check", str(path))
    assert code == 3
    assert "error: flavor 'typo': hw:cpu_polcy: not a known extra spec in namespace 'hw'" in out
    assert "warning: flavor 'glued': extra spec capabilities:stats:gpus='>=24'" in out
    code, _, err = run(capsys, "schedule", str(path), "--flavor", "typo", "--now", NOW)
    assert code == 3 and err.startswith("error: flavor 'typo': hw:cpu_polcy: not a known")


@pytest.mark.parametrize("num", ["0", "-3", "many"], ids=["zero", "negative", "not a number"])
def test_a_number_of_instances_below_one_is_a_usage_error_not_a_traceback(capsys, num):
    with pytest.raises(SystemExit) as exit_:
        main(["schedule", CLOUD, "--flavor", "m1.small", "--num", num])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.splitlines()[-1].endswith(f"argument --num: expected a positive integer, got {num!r}")


def test_a_bare_berth_prints_help_and_succeeds(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: berth") and "schedule" in out


def test_version_prints_the_package_version(capsys):
    from berth import __version__

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"berth {__version__}"


@pytest.mark.parametrize(
    ("conf", "code", "message"),
    [
        (b"[filter_scheduler]\nhost_subset_size = 1 \xff\n", 2,
         "not UTF-8 text (byte 0xff)"),
        (b"--host_subset_size=1\xff\n", 2, "not UTF-8 text (byte 0xff)"),
        (b"[filter_scheduler]\nenabled_filters = $nope\n", 2,
         "[filter_scheduler] enabled_filters: no such option nope in group [DEFAULT]"),
        (b"[filter_scheduler]\navailable_filters = os.system\n", 2,
         "available_filters: os.system is neither a class nor a function returning classes"),
    ],
    ids=["a nova.conf that is not UTF-8", "a flag file that is not UTF-8",
         "a $reference to no option", "a builtin function as the filter list"],
)
def test_bad_configuration_files_are_one_line_errors(capsys, tmp_path, conf, code, message):
    path = tmp_path / "nova.conf"
    path.write_bytes(conf)
    got, out, err = run(capsys, "schedule", CLOUD, "--flavor", "m1.small",
                        "--config-file", str(path))
    assert got == code and out == ""
    assert err.count("\n") == 1 and err.startswith("error:") and message in err


def test_a_cloud_file_that_is_not_utf8_is_a_one_line_error(capsys, tmp_path):
    path = tmp_path / "cloud.yaml"
    path.write_bytes(b"hosts: [{host: h\xff1}]\n")
    code, _, err = run(capsys, "cloud", "check", str(path))
    assert code == 3
    assert err == f"error: {path}: not UTF-8 text (byte 0xff)\n"


def test_a_list_function_that_fails_is_a_one_line_error(capsys, tmp_path, monkeypatch):
    module = tmp_path / "broken_filters.py"
    module.write_text("def all_filters():\n    raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "nova.conf"
    path.write_text("[filter_scheduler]\navailable_filters = broken_filters.all_filters\n")
    code, _, err = run(capsys, "schedule", CLOUD, "--flavor", "m1.small",
                       "--config-file", str(path))
    assert code == 2
    assert "broken_filters.all_filters() did not return a list of classes: RuntimeError: boom" in err


def test_checks_and_lists_print_json(capsys, tmp_path):
    assert run(capsys, "cloud", "check", CLOUD, "--json")[0] == 0
    code, out, _ = run(capsys, "cloud", "check", CLOUD, "--json")
    data = json.loads(out)
    assert data["ok"] is True and data["compute_nodes"] == 57 and data["errors"] == []
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts: [{host: h1, vcpus: 1, memory_mb: 512, local_gb: 1}]\n"
                   "images: [{name: old, properties: {hw_architecture: z80}}]\n")
    code, out, _ = run(capsys, "cloud", "check", str(bad), "--json")
    data = json.loads(out)
    assert code == 3 and data["ok"] is False and data["errors"][0].startswith("image 'old'")
    code, out, _ = run(capsys, "config", "check", CONF, "--json")
    data = json.loads(out)
    assert code == 0 and "ComputeFilter" in data["enabled_filters"] and data["weighers"]
    code, out, _ = run(capsys, "filters", "list", "--json")
    filters = {f["name"]: f for f in json.loads(out)}
    assert filters["ComputeFilter"]["default"] is True and filters["AllHostsFilter"]["rule"]
    code, out, _ = run(capsys, "weighers", "list", "--json")
    assert any(w["name"] == "RAMWeigher" for w in json.loads(out))
    code, out, _ = run(capsys, "flavor", "check", "--extra-spec", "hw:cpu_policy=bogus", "--json")
    data = json.loads(out)
    assert code == 3 and data["ok"] is False and "hw:cpu_policy" in data["errors"][0]


def test_a_random_pick_below_the_best_host_is_explained(capsys, tmp_path):
    """host_subset_size > 1: the explanation says the host was drawn at random, and
    names the best-ranked host it was preferred over when the pick weighs less."""
    conf = tmp_path / "nova.conf"
    conf.write_text("[filter_scheduler]\nhost_subset_size = 4\n")
    code, out, _ = run(capsys, "schedule", CLOUD, "--config-file", str(conf), "--flavor",
                       "m1.large", "--seed", "9", "--explain")
    assert code == 0
    assert ("random pick (host_subset_size = 4): c1-s03 (weight 3.21) was drawn among the 4 "
            "best, not the best-ranked c1-s08 (weight 4)") in out
    # The table below it lists the best hosts by weight, the drawn one in its place.
    lines = out.splitlines()
    table = lines[lines.index(next(x for x in lines if x.startswith("  top hosts by weight"))) + 2:]
    weights = [float(row.split()[1]) for row in table[:5]]
    assert weights == sorted(weights, reverse=True) and table[0].split()[0] == "c1-s08"
    code, out, _ = run(capsys, "schedule", CLOUD, "--config-file", str(conf), "--flavor",
                       "m1.large", "--seed", "9", "--explain", "--json")
    pick = json.loads(out)["diagnosis"]["instances"][0]["random_pick"]
    assert pick["lower_weighted"] is True and pick["among"] == 4
    assert pick["best"] == ["c1-s08", "c1-s08"]
    # The default (host_subset_size = 1) draws nothing, and says nothing.
    code, out, _ = run(capsys, "schedule", CLOUD, "--flavor", "m1.large", "--seed", "9",
                       "--explain")
    assert "random pick" not in out


def test_a_random_pick_survives_the_json_round_trip():
    """berth boot --explain rebuilds the explanation from the server's JSON."""
    from berth.explain import Diagnosis, InstanceDiagnosis, RandomPick, diagnosis_lines
    from berth.service.cli import diagnosis_from_dict

    pick = RandomPick(among=3, subset_size=3, best=("a", "a"), best_weight=2.0,
                      picked_weight=1.5)
    original = Diagnosis([InstanceDiagnosis(0, None, 5, chosen=("b", "b"), random_pick=pick)])
    rebuilt = diagnosis_from_dict(json.loads(json.dumps(original.to_dict())))
    assert diagnosis_lines(rebuilt) == diagnosis_lines(original)
    assert any("not the best-ranked a (weight 2)" in line for line in diagnosis_lines(rebuilt))


def test_a_multi_create_that_runs_out_of_hosts_says_how_many_fit(capsys):
    code, _, err = run(capsys, "schedule", CLOUD, "--flavor", "m1.huge", "--num", "40",
                       "--seed", "1")
    assert code == 4
    assert err.splitlines()[1] == ("  23 of 40 instances found a host before the hosts ran "
                                   "out (their claims were released: a request is placed "
                                   "whole or not at all)")
    code, out, _ = run(capsys, "schedule", CLOUD, "--flavor", "m1.huge", "--num", "40",
                       "--seed", "1", "--json")
    error = json.loads(out)["error"]
    assert (error["instances_fit"], error["instances_requested"]) == (23, 40)
    # One instance that fits nowhere: nothing to count.
    code, out, _ = run(capsys, "schedule", CLOUD, "--flavor", "m1.huge", "--num", "1",
                       "--seed", "1", "--json", "--az", "nowhere")
    assert "instances_fit" not in out


def test_explanations_name_aggregates_not_their_uuids(capsys):
    # The AZ becomes a member_of of placement's query; its refusal names the aggregate.
    code, out, _ = run(capsys, "schedule", CLOUD, "--config-file", CONF, "--flavor", "m1.large",
                       "--az", "az3", "--seed", "1", "--now", NOW, "--explain")
    assert code == 0
    assert "not in a required aggregate (one of az3)" in out
    assert "one of e431d10b" not in out


def test_a_host_used_past_its_capacity_takes_no_more_and_a_typo_is_refused(
        capsys, tmp_path, caplog):
    """Usage past capacity was split into one consumer per host size and what placement
    refused was dropped, so such a host took more instances; 100 million VCPU hung."""
    cloud = tmp_path / "cloud.yaml"
    cloud.write_text(
        "flavors: [{name: f, vcpus: 1, memory_mb: 5}]\nhosts:\n"
        "  - {host: h1, vcpus: 16, memory_mb: 65536, local_gb: 500, vcpus_used: 100}\n")
    code, _, err = run(capsys, "schedule", str(cloud), "--flavor", "f")
    assert code == 4 and "No valid host" in err
    assert any("placement holds it over capacity" in r.getMessage() for r in caplog.records)
    cloud.write_text(
        "flavors: [{name: f, vcpus: 1, memory_mb: 5}]\nhosts:\n"
        "  - {host: h2, vcpus: 16, memory_mb: 65536, local_gb: 500, vcpus_used: 100000000}\n")
    code, _, err = run(capsys, "schedule", str(cloud), "--flavor", "f")
    assert code == 3 and "needs 6250000 consumers" in err


def test_an_amount_past_64_bits_is_explained_not_a_traceback(capsys, tmp_path):
    cloud = tmp_path / "cloud.yaml"
    cloud.write_text(
        "flavors: [{name: f, vcpus: 1, memory_mb: 5, extra_specs: "
        "{'resources:VCPU': '99999999999999999999'}}]\n"
        "hosts: [{host: h1, vcpus: 4, memory_mb: 1000, local_gb: 10}]\n")
    code, out, err = run(capsys, "schedule", str(cloud), "--flavor", "f", "--explain")
    assert code == 4
    assert "VCPU amount outside min_unit..max_unit (requested 99999999999999999999" in out + err


@pytest.mark.parametrize("command", ["schedule", "capacity"])
def test_a_non_finite_instant_is_a_usage_error(capsys, command):
    with pytest.raises(SystemExit) as exited:
        main([command, CLOUD, "--flavor", "m1.small", "--now", "nan"])
    assert exited.value.code == 2
    assert "--now: expected epoch seconds, got 'nan'" in capsys.readouterr().err


def test_a_file_that_is_no_database_is_one_line(capsys, tmp_path):
    path = tmp_path / "db.sqlite"
    path.write_text("garbage\n" * 100)
    assert main(["audit", "--db", f"sqlite:///{path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("file is not a database") and "\n" not in err


def test_cloud_export_to_a_directory_writes_nothing(tmp_path):
    from berth.cloudio.emit import dump
    from berth.errors import InputError

    with pytest.raises(InputError, match="a directory; give a file name"):
        dump({"hosts": []}, str(tmp_path))
    assert list(tmp_path.iterdir()) == []
