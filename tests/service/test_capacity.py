"""berth capacity: counts made by the real pipeline, agreeing with berth schedule; spread,
limits and unusable capacity; JSON and Prometheus; a running berth serve read by URL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from berth.cli import main

from .serving import berth_serve

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "cloud.yaml")
EXAMPLE_CONF = str(ROOT / "examples" / "nova.conf")
NOW = "1800000000"

# Two zones; n1-n2 hold 4 web instances each (memory and vCPUs both run out), n3 2;
# "big" fits only on the large ones; n4 is disabled. With 1 GiB "small" the vCPUs run
# out first.
CLOUD = """
flavors:
  - {name: web, vcpus: 2, memory_mb: 2048, root_gb: 10}
  - {name: big, vcpus: 4, memory_mb: 6144, root_gb: 10}
  - {name: small, vcpus: 2, memory_mb: 1024, root_gb: 10}
hosts:
  - {host: n1, vcpus: 8, memory_mb: 8704, local_gb: 100}
  - {host: n2, vcpus: 8, memory_mb: 8704, local_gb: 100}
  - {host: n3, vcpus: 4, memory_mb: 4608, local_gb: 100}
  - {host: n4, vcpus: 8, memory_mb: 8704, local_gb: 100, service: {disabled: true}}
aggregates:
  - {name: zone-a, availability_zone: az-a, hosts: [n1, n3]}
  - {name: zone-b, availability_zone: az-b, hosts: [n2, n4]}
"""
CONF = "[DEFAULT]\nreserved_host_memory_mb = 512\ncpu_allocation_ratio = 1.0\n"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def files(tmp_path: Path) -> tuple[str, str]:
    (tmp_path / "cloud.yaml").write_text(CLOUD)
    (tmp_path / "nova.conf").write_text(CONF)
    return str(tmp_path / "cloud.yaml"), str(tmp_path / "nova.conf")


def capacity(capsys: pytest.CaptureFixture[str], files: tuple[str, str], *extra: str) -> str:
    """``berth capacity`` of the test cloud with its nova.conf; its output (exit 0)."""
    cloud, conf = files
    code, out, _ = run(capsys, "capacity", cloud, "--config-file", conf, "--now", NOW, *extra)
    assert code == 0
    return out


def test_counts_spread_limits_and_unusable_capacity(capsys: pytest.CaptureFixture[str],
                                                     files: tuple[str, str]) -> None:
    report = json.loads(capacity(capsys, files, "--json"))
    by = {f["flavor"]: f for f in report["flavors"]}
    assert by["web"]["fits"] == 4 + 4 + 2 and not by["web"]["capped"]
    assert by["web"]["by_availability_zone"] == {"az-a": 6, "az-b": 4}
    assert by["web"]["by_aggregate"] == {"zone-a": 6, "zone-b": 4}
    # n1-n3 run out of memory (placement names the first class short); n4 is out of
    # play (disabled): what the scheduler says of one more instance.
    memory, disabled = "placement: insufficient MEMORY_MB", "placement: compute service disabled"
    assert by["web"]["hosts_limited_by"] == {memory: 3, disabled: 1}
    hosts = {h["host"]: (h["instances"], h["limited_by"]) for h in by["web"]["hosts"]}
    assert hosts == {"n1": (4, memory), "n2": (4, memory), "n3": (2, memory),
                     "n4": (0, disabled)}
    assert by["big"]["fits"] == 2
    assert by["small"]["fits"] == 4 + 4 + 2
    assert by["small"]["hosts_limited_by"]["placement: insufficient VCPU"] == 3
    # Only the disabled host takes nothing: all its capacity is unusable.
    assert report["unusable"] == {"computed": True, "hosts": 1,
                                  "free": {"DISK_GB": 100, "MEMORY_MB": 8192, "VCPU": 8}}


def test_a_count_is_what_berth_schedule_places(capsys: pytest.CaptureFixture[str]) -> None:
    # The one path: the count fits as one multi-create, one more does not.
    code, out, _ = run(capsys, "capacity", EXAMPLE, "--config-file", EXAMPLE_CONF,
                       "--flavor", "m1.huge", "--now", NOW, "--seed", "3", "--json")
    assert code == 0
    fits = json.loads(out)["flavors"][0]["fits"]
    assert fits > 1
    common = ("schedule", EXAMPLE, "--config-file", EXAMPLE_CONF, "--flavor", "m1.huge",
              "--now", NOW, "--seed", "3", "--no-alternates")
    assert run(capsys, *common, "--num", str(fits))[0] == 0
    code, _, err = run(capsys, *common, "--num", str(fits + 1))
    assert code == 4 and f"{fits} of {fits + 1} instances found a host" in err


def test_a_limit_caps_the_count_and_says_so(capsys: pytest.CaptureFixture[str],
                                             files: tuple[str, str]) -> None:
    out = capacity(capsys, files, "--flavor", "web", "--limit", "3")
    assert ">=3" in out and "unusable capacity: not computed" in out
    # Nothing limited the hosts yet: the count stopped first (not "filters").
    report = json.loads(capacity(capsys, files, "--flavor", "web", "--limit", "3", "--json"))
    assert report["flavors"][0]["hosts_limited_by"] == {"not full when the count stopped": 4}


def test_prometheus_text_parses(capsys: pytest.CaptureFixture[str],
                                files: tuple[str, str]) -> None:
    out = capacity(capsys, files, "--prometheus")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(out) for s in family.samples}
    assert samples[("berth_capacity_instances",
                    (("capped", "false"), ("flavor", "web")))] == 10
    assert samples[("berth_capacity_instances_by_zone",
                    (("availability_zone", "az-b"), ("flavor", "web")))] == 4
    assert samples[("berth_capacity_unusable", (("resource_class", "VCPU"),))] == 8


@pytest.mark.parametrize("argv, message", [
    (["capacity"], "give a cloud file or --url (one of them)"),
    (["capacity", "{cloud}", "--flavor", "nope"], "unknown flavor 'nope'"),
])
def test_bad_input_is_one_line(capsys: pytest.CaptureFixture[str], files: tuple[str, str],
                               argv: list[str], message: str) -> None:
    code, _, err = run(capsys, *[a.format(cloud=files[0]) for a in argv])
    assert code == 3 and err.count("\n") == 1 and message in err


def test_a_bad_limit_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                      files: tuple[str, str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["capacity", files[0], "--limit", "0"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--limit" in err and "Traceback" not in err


@pytest.fixture
def serve(tmp_path: Path, files: tuple[str, str]) -> Iterator[str]:
    cloud, conf = files
    with berth_serve(tmp_path, "--config-file", conf, "--cloud", cloud) as url:
        yield url


def test_a_running_berth_counts_with_its_own_configuration_and_its_boots_count(
        capsys: pytest.CaptureFixture[str], serve: str, files: tuple[str, str]) -> None:
    """The count is the server's (``POST /capacity``): its nova.conf, not Nova's
    defaults, which would admit twice the vCPUs (``cpu_allocation_ratio`` 4.0 against the
    server's 1.0)."""
    cloud, conf = files
    assert main(["boot", "--flavor", "web", "--num", "3", "--url", serve]) == 0
    capsys.readouterr()
    code, out, _ = run(capsys, "capacity", "--url", serve, "--flavor", "web", "--json")
    assert code == 0
    # Three of the ten places are taken now.
    served = json.loads(out)
    assert served["flavors"][0]["fits"] == 7
    # In every output form; the cloud file with the same configuration and no boots
    # has all ten places.
    code, table, _ = run(capsys, "capacity", "--url", serve, "--flavor", "web")
    assert code == 0
    assert [line.split()[:2] for line in table.splitlines() if line.startswith("web ")] == [
        ["web", "7"]]
    code, text, _ = run(capsys, "capacity", "--url", serve, "--flavor", "web", "--prometheus")
    assert code == 0 and 'berth_capacity_instances{capped="false",flavor="web"} 7.0' in text
    fresh = json.loads(run(capsys, "capacity", cloud, "--config-file", conf, "--flavor", "web",
                           "--json", "--now", NOW)[1])
    assert fresh["flavors"][0]["fits"] == 10


@pytest.mark.parametrize("option", [["--config-file", "CONF"], ["--seed", "1"],
                                    ["--now", NOW]])
def test_what_a_running_berth_decides_is_not_asked_of_the_command(
        capsys: pytest.CaptureFixture[str], files: tuple[str, str], option: list[str]) -> None:
    _, conf = files
    code, _, err = run(capsys, "capacity", "--url", "http://127.0.0.1:9",
                       *[conf if v == "CONF" else v for v in option])
    assert code == 3
    assert err == (f"error: {option[0]}: a running Berth counts with its own configuration, "
                   "seed and clock; count a cloud file to choose them\n")


def test_a_seeded_count_of_a_seeded_server_does_not_reuse_its_instance_uuids(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, files: tuple[str, str]) -> None:
    """A server started with ``--seed 1`` names its instances as a fresh scratch store
    seeded with 1 would: the count's trial instances must not take those names (their
    claims were refused as consumers that exist, and the count came out low)."""
    cloud, conf = files
    with berth_serve(tmp_path, "--config-file", conf, "--cloud", cloud, "--seed", "1") as url:
        assert main(["boot", "--flavor", "web", "--num", "3", "--url", url]) == 0
        capsys.readouterr()
        code, out, err = run(capsys, "capacity", "--url", url, "--flavor", "web", "--json")
    assert code == 0, err
    assert json.loads(out)["flavors"][0]["fits"] == 7
    assert "exists" not in err


def test_cells_are_shown_by_their_names(capsys: pytest.CaptureFixture[str]) -> None:
    """The example cloud names its cells: the table, the JSON and the gauges use the
    names, not the uuids."""
    args = ("capacity", EXAMPLE, "--config-file", EXAMPLE_CONF, "--flavor", "m1.large",
            "--now", NOW)
    code, table, _ = run(capsys, *args)
    assert code == 0 and "cells: cell1 348, cell2 288" in table
    code, out, _ = run(capsys, *args, "--json")
    assert json.loads(out)["flavors"][0]["by_cell"] == {"cell1": 348, "cell2": 288}
    code, text, _ = run(capsys, *args, "--prometheus")
    assert 'berth_capacity_instances_by_cell{cell="cell1",flavor="m1.large"} 348.0' in text


def test_every_flavor_of_the_cloud_is_the_same_set_from_a_file_and_from_a_server(
        capsys: pytest.CaptureFixture[str], serve: str, files: tuple[str, str]) -> None:
    """The cloud file's flavors, not Berth's m1.* defaults too (which every command knows
    by name: --flavor m1.small counts on both paths)."""
    cloud, conf = files
    served = json.loads(run(capsys, "capacity", "--url", serve, "--json")[1])
    offline = json.loads(run(capsys, "capacity", cloud, "--config-file", conf, "--json",
                             "--now", NOW)[1])
    assert [f["flavor"] for f in served["flavors"]] == ["big", "small", "web"]
    assert [f["flavor"] for f in offline["flavors"]] == ["big", "small", "web"]
    by_url = json.loads(run(capsys, "capacity", "--url", serve, "--flavor", "m1.small",
                            "--json")[1])
    by_file = json.loads(run(capsys, "capacity", cloud, "--config-file", conf, "--flavor",
                             "m1.small", "--json", "--now", NOW)[1])
    assert by_url["flavors"][0]["fits"] == by_file["flavors"][0]["fits"] > 0


def test_a_cloud_without_flavors_counts_berths_defaults(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cloud = tmp_path / "bare.yaml"
    cloud.write_text("hosts:\n  - {host: n1, vcpus: 8, memory_mb: 16384, local_gb: 200}\n")
    out = json.loads(run(capsys, "capacity", str(cloud), "--json", "--now", NOW)[1])
    assert [f["flavor"] for f in out["flavors"]] == [
        "m1.tiny", "m1.small", "m1.medium", "m1.large", "m1.xlarge"]
