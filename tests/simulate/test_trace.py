"""Trace formats: the CSV reader and writer, the Azure packing trace, the generator."""

from __future__ import annotations

import random
import re
import sqlite3
from pathlib import Path

import pytest

from berth.cli import main
from berth.errors import InputError
from berth.simulate.generate import GroupSpec, Lifetime, generate, parse_mix
from berth.simulate.trace import (
    CREATE,
    DELETE,
    AzureMachine,
    events_at_most,
    load_trace,
    read_csv,
    write_csv,
)

HEADER = "time,event,id,flavor,image,num,group,policy,hints,project\n"
OTHER = "2b8f9c3e-0000-4000-8000-000000000009"


def write(tmp_path: Path, text: str, name: str = "t.csv") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_csv_trace_is_read_in_time_order_with_its_columns(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + "# a comment line\n"
                 "5,delete,a,,,,,,,\n"
                 "0,create,a,m1.small,cirros,2,web,anti-affinity,\"{\"\"different_host\"\": [\"\"" + OTHER + "\"\"]}\",p1\n"
                 "1,create,b,m1.large,,,,,,\n")
    trace = read_csv(path)
    assert [(e.time, e.kind, e.id) for e in trace.events] == [
        (0.0, CREATE, "a"), (1.0, CREATE, "b"), (5.0, DELETE, "a")]
    a = trace.events[0]
    assert (a.flavor, a.image, a.num, a.group, a.policy, a.project) == (
        "m1.small", "cirros", 2, "web", "anti-affinity", "p1")
    assert a.hints == {"different_host": [OTHER]}
    assert trace.events[1].num == 1 and trace.duration == 5.0


def test_only_time_event_and_id_are_required_columns(tmp_path: Path) -> None:
    trace = read_csv(write(tmp_path, "time,event,id,flavor\n0,create,x,m1.tiny\n3,delete,x,\n"))
    assert [e.kind for e in trace.events] == [CREATE, DELETE]


@pytest.mark.parametrize(("text", "message"), [
    ("time,event\n", "the header has no id column"),
    ("", "empty: no header row"),
    ("# only a comment\n\n", "empty: no header row"),
    ("time,event,id,colour\n", "unknown column 'colour'"),
    (HEADER + "-1,create,a,m1.small,,,,,,\n", "line 2: time: expected seconds >= 0, got '-1'"),
    (HEADER + "soon,create,a,m1.small,,,,,,\n", "time: expected seconds >= 0, got 'soon'"),
    (HEADER + "0,boot,a,m1.small,,,,,,\n", "event: expected 'create' or 'delete', got 'boot'"),
    (HEADER + "0,create,,m1.small,,,,,,\n", "id: missing"),
    (HEADER + "0,create,a,,,,,,,\n", "flavor: a create needs one"),
    (HEADER + "0,create,a,m1.small,,0,,,,\n", "num: expected an integer from 1 to 1000, got '0'"),
    (HEADER + "0,create,a,m1.small,,,g,friendly,,\n", "policy: expected one of"),
    (HEADER + "0,create,a,m1.small,,,,,[1],\n", "hints: expected a JSON object"),
    (HEADER + "0,create,a,m1.small,,,,,{x,\n", "hints: not a JSON object"),
    (HEADER + "0,create,a,m1.small,,,,,\"{\"\"k\"\": 1}\",\n", "hints.k: expected a string"),
    (HEADER + "0,create,a,m1.small,,,,,\"{\"\"availability_zone\"\": \"\"az1\"\"}\",\n",
     "line 2: hints.availability_zone: a zone is not a scheduler hint; give it in the "
     "availability_zone column"),
    (HEADER + "0,create,a,m1.small,,,,,,,extra\n", "more cells than the header has columns"),
    (HEADER + "0,create,a,m1.small,,,,,,\n1,create,a,m1.small,,,,,,\n",
     "'a' at t=1 (line 3): created while still live"),
    (HEADER + "0,delete,a,,,,,,,\n", "delete of 'a' at t=0 (line 2): no live create"),
    ("time,event,id,flavor,id\n0,create,a,m1.small,b\n", "the header names column 'id' twice"),
    (HEADER + "0,create,a,m1.small,,1000000000,,,,\n",
     "line 2: num: expected an integer from 1 to 1000, got '1000000000'"),
    (HEADER + "0,create,a,m1.small,,,,,,\n1,create,b,m1.small,,," + "g" * 300 + ",soft-affinity,,\n",
     "t.csv line 3: group: expected a name of at most 255 characters, got 300"),
])
def test_a_bad_row_is_one_error_naming_line_and_column(tmp_path: Path, text: str,
                                                        message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        read_csv(write(tmp_path, text))


def test_a_file_that_is_not_text_or_missing_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bin.csv"
    bad.write_bytes(b"time,event,id\n\xff\xfe,create,a\n")
    with pytest.raises(InputError, match="not UTF-8"):
        load_trace(str(bad))
    with pytest.raises(InputError, match="no such file"):
        load_trace(str(tmp_path / "nope.csv"))


def test_written_traces_read_back_the_same(tmp_path: Path) -> None:
    trace = generate(creates=200, rate=2.0, lifetime=Lifetime.parse("exp:30"),
                     mix={"m1.small": 2, "m1.large": 1}, seed=5,
                     groups=GroupSpec(0.2, 3, "soft-affinity"), image="cirros")
    path = str(tmp_path / "g.csv")
    write_csv(trace, path)
    again = read_csv(path)
    assert again.events == trace.events


def test_generation_is_seeded_and_follows_its_parameters() -> None:
    def make(seed: int):  # type: ignore[no-untyped-def]
        return generate(creates=2000, rate=4.0, lifetime=Lifetime.parse("fixed:100"),
                        mix=parse_mix("a=3,b"), seed=seed, groups=GroupSpec(0.1, 2))

    one, two, other = make(1), make(1), make(2)
    assert one.events == two.events and one.events != other.events
    creates = [e for e in one.events if e.kind == CREATE]
    assert len(creates) == 2000
    # Poisson arrivals at 4/s: 2000 arrivals take about 500 s.
    assert 430 < creates[-1].time < 570
    share_a = sum(e.flavor == "a" for e in creates) / len(creates)
    assert 0.70 < share_a < 0.80
    grouped = [e for e in creates if e.group]
    assert 0.07 < len(grouped) / len(creates) < 0.13
    assert {e.group for e in grouped} == {"group-0", "group-1"}
    # Fixed lifetimes: each delete 100 s after its create, none past the last arrival.
    born = {e.id: e.time for e in creates}
    deletes = [e for e in one.events if e.kind == DELETE]
    assert deletes and all(abs(e.time - born[e.id] - 100) < 0.01 for e in deletes)
    assert max(e.time for e in deletes) <= creates[-1].time


@pytest.mark.parametrize(("text", "field"), [
    ("exp", "--lifetime"), ("exp:0", "--lifetime"), ("uniform:5,1", "--lifetime"),
    ("weibull:1", "--lifetime"), ("lognormal:10", "--lifetime")])
def test_bad_lifetimes_name_the_option(text: str, field: str) -> None:
    with pytest.raises(InputError, match=field):
        Lifetime.parse(text)


def test_bad_mixes_name_the_option() -> None:
    for text in ("a=0", "=2", "a=x"):
        with pytest.raises(InputError, match="--flavor-mix"):
            parse_mix(text)
    with pytest.raises(InputError, match="--flavor-mix: flavor 'a' named twice"):
        parse_mix("a=1,b,a=2")


def test_a_bad_lifetime_says_which_values_may_be_zero() -> None:
    with pytest.raises(InputError) as info:
        Lifetime.parse("exp:0")
    assert "(MEAN and MEDIAN > 0, the others >= 0, LOW <= HIGH), got 'exp:0'" in str(info.value)
    assert Lifetime.parse("fixed:0").params == (0.0,)


def azure_db(path: Path) -> str:
    """A small trace in the Azure packing trace 2020 schema."""
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE vm (vmId INTEGER, tenantId INTEGER, vmTypeId INTEGER, priority INTEGER,
                         starttime REAL, endtime REAL);
        CREATE TABLE vmType (id INTEGER, vmTypeId INTEGER, machineId INTEGER, core REAL,
                             memory REAL, hdd REAL, ssd REAL, nic REAL);
        INSERT INTO vmType VALUES (1, 10, 0, 0.125, 0.0625, 0, 0.05, 0.01),
                                  (2, 11, 0, 0.5, 0.25, 0, 0.1, 0.02),
                                  (3, 10, 1, 0.25, 0.125, 0, 0.1, 0.01);
        INSERT INTO vm VALUES (1, 7, 10, 1, -0.5, 0.25),
                              (2, 7, 11, 0, 0.1, NULL),
                              (3, 8, 10, 1, 0.2, 0.2);
    """)
    db.commit()
    db.close()
    return str(path)


def test_the_azure_packing_trace_becomes_events_and_flavors(tmp_path: Path) -> None:
    trace = load_trace(azure_db(tmp_path / "azure.sqlite"),
                       machine=AzureMachine(32, 131072, 1000))
    # Days become seconds; a VM from before the trace starts at 0; NULL never ends; a
    # zero-length VM is created then deleted.
    assert [(e.time, e.kind, e.id) for e in trace.events] == [
        (0.0, CREATE, "1"), (8640.0, CREATE, "2"), (17280.0, CREATE, "3"),
        (17280.0, DELETE, "3"), (21600.0, DELETE, "1")]
    assert trace.events[0].project == "7"
    # Machine 0 has the most VM types: its fractions of a 32-vCPU, 128 GiB, 1 TB machine.
    assert trace.flavors == {"azure-10": {"vcpus": 4, "memory_mb": 8192, "root_gb": 50},
                             "azure-11": {"vcpus": 16, "memory_mb": 32768, "root_gb": 100}}


def test_a_bad_azure_trace_is_one_line(tmp_path: Path) -> None:
    path = azure_db(tmp_path / "azure.sqlite")
    machine = AzureMachine(32, 131072, 1000)
    with pytest.raises(InputError, match="--azure-machine-id: 5 is not a machineId"):
        load_trace(path, machine=machine, machine_id=5)
    with pytest.raises(InputError, match="vmTypeId 11 has no vmType row for machineId 1"):
        load_trace(path, machine=machine, machine_id=1)
    db = sqlite3.connect(tmp_path / "other.sqlite")
    db.execute("CREATE TABLE x (a)")
    db.commit()
    db.close()
    with pytest.raises(InputError, match="table vmType"):
        load_trace(str(tmp_path / "other.sqlite"), machine=machine)
    with pytest.raises(InputError, match="--azure-machine: expected VCPUS,MEMORY_MB,DISK_GB"):
        AzureMachine.parse("32,0,1")
    db = sqlite3.connect(path)
    db.execute("INSERT INTO vm VALUES (4, 8, 10, 1, 0.5, 0.25)")
    db.commit()
    db.close()
    with pytest.raises(InputError, match="vm 4: endtime 0.25 is before starttime 0.5"):
        load_trace(path, machine=machine)
    db = sqlite3.connect(path)
    db.execute("DELETE FROM vm WHERE vmId = 4")
    db.execute("UPDATE vmType SET hdd = NULL")  # no disk: 0
    db.commit()
    assert load_trace(path, machine=machine).flavors["azure-10"]["root_gb"] == 50
    db.execute("UPDATE vmType SET core = NULL WHERE id = 1")
    db.commit()
    db.close()
    with pytest.raises(InputError, match="vmType 10 machine 0: core: expected a fraction of "
                                         "the machine \\(0 to 1\\), got None"):
        load_trace(path, machine=machine)


def test_trace_generate_writes_a_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "g.csv"
    assert main(["trace", "generate", "--creates", "50", "--rate", "1", "--lifetime",
                 "uniform:5,10", "--flavor-mix", "m1.small", "-o", str(out)]) == 0
    assert "50 creates" in capsys.readouterr().out
    assert read_csv(str(out)).creates() == 50
    assert main(["trace", "generate", "--creates", "5", "--rate", "0", "--flavor-mix", "a",
                 "-o", str(out)]) == 3
    assert capsys.readouterr().err.strip() == (
        "error: --rate: expected creates per second > 0, got 0.0")


def test_a_hint_naming_no_earlier_id_is_refused_before_the_replay(tmp_path: Path) -> None:
    text = (HEADER + "0,create,a,m1.small,,,,,,\n"
            "1,create,b,m1.small,,,,,\"{\"\"same_host\"\": [\"\"a\"\"]}\",\n"
            "2,create,c,m1.small,,,,,\"{\"\"different_host\"\": "
            "[\"\"2b8f9c3e-0000-4000-8000-000000000001\"\"]}\",\n")
    assert len(read_csv(write(tmp_path, text)).events) == 3
    bad = HEADER + "0,create,a,m1.small,,,,,\"{\"\"same_host\"\": [\"\"later\"\"]}\",\n" \
        "1,create,later,m1.small,,,,,,\n"
    with pytest.raises(InputError, match=r"'a' at t=0 \(line 2\): hints.same_host: 'later' "
                                         "is neither an earlier id of the trace nor an "
                                         "instance uuid"):
        read_csv(write(tmp_path, bad))


def test_an_azure_trace_needs_its_machine(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--azure-machine: the trace's sizes are fractions"):
        load_trace(azure_db(tmp_path / "azure.sqlite"))


def test_a_trace_is_counted_before_it_is_loaded(tmp_path: Path) -> None:
    # An upper bound, read without parsing: it sizes the scratch store before the
    # trace is loaded (an Azure trace's sizes need the cloud that store holds).
    csv_path = tmp_path / "t.csv"
    csv_path.write_text(HEADER + "# a comment\n0,create,a,small,,1,,,,\n1,delete,a,,,,,,,\n"
                        "2,create,b,small,,40,,,,\n")
    assert events_at_most(str(csv_path)) == 1 + 1 + 40  # a multi-create's instances
    assert events_at_most(str(csv_path), limit=2) == 2
    azure = azure_db(tmp_path / "azure.sqlite")
    assert events_at_most(azure) == 6  # three VMs: a create and a delete each, at most
    assert events_at_most(azure, limit=2) == 4
    assert len(load_trace(azure, machine=AzureMachine(32, 131072, 1000)).events) <= 6
    # What cannot be read counts nothing (loading it says why).
    assert events_at_most(str(tmp_path / "missing.csv")) == 0
    broken = tmp_path / "broken.sqlite"
    broken.write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)
    assert events_at_most(str(broken)) == 0


def test_a_byte_order_mark_is_not_part_of_the_header(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + HEADER.encode() + b"0,create,a,m1.small,,3,,,,\n")
    assert [(e.id, e.num) for e in read_csv(str(path)).events] == [("a", 3)]
    assert events_at_most(str(path)) == 3


def test_a_huge_num_does_not_size_the_scratch_store(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + "0,create,a,m1.small,,1000000000,,,,\n")
    assert events_at_most(path) == 1000  # the load says what is wrong with the row


def azure_with(path: Path, sql: str) -> str:
    """:func:`azure_db` and then ``sql``."""
    azure_db(path)
    db = sqlite3.connect(path)
    db.executescript(sql)
    db.commit()
    db.close()
    return str(path)


@pytest.mark.parametrize(("sql", "message"), [
    # vm 1 lives from -0.5 to 0.25 days: the same vmId again at 0.2 days overlaps it.
    ("INSERT INTO vm VALUES (1, 7, 10, 1, 0.2, 0.3)", "'1' at t=17280: created while still live"),
    ("INSERT INTO vm VALUES (NULL, 7, 10, 1, 0.2, 0.3)", "table vm: a row with starttime 0.2 has no vmId"),
    ("INSERT INTO vmType VALUES (4, 12, 'abc', 0.5, 0.25, 0, 0.1, 0.02)",
     "table vmType, column machineId, row 4 (vmTypeId 12): expected an integer, got 'abc'"),
    ("INSERT INTO vmType VALUES (4, 12, NULL, 0.5, 0.25, 0, 0.1, 0.02)",
     "table vmType, column machineId, row 4 (vmTypeId 12): expected an integer, got None"),
    ("INSERT INTO vmType VALUES (4, 12, 2.5, 0.5, 0.25, 0, 0.1, 0.02)",
     "table vmType, column machineId, row 4 (vmTypeId 12): expected an integer, got 2.5"),
])
def test_a_bad_azure_row_is_one_error_naming_table_column_and_row(tmp_path: Path, sql: str,
                                                                   message: str) -> None:
    path = azure_with(tmp_path / "azure.sqlite", sql)
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_trace(path, machine=AzureMachine(32, 131072, 1000))


def test_azure_vm_ids_may_repeat_when_the_lifetimes_do_not_overlap(tmp_path: Path) -> None:
    # vm 3 was created and deleted at 0.2 days; the same vmId again at 0.3 days is a new
    # VM. An integral REAL machineId is the integer.
    path = azure_with(tmp_path / "azure.sqlite", "INSERT INTO vm VALUES (3, 8, 10, 1, 0.3, 0.4);"
                      "UPDATE vmType SET machineId = 1.0 WHERE machineId = 1")
    trace = load_trace(path, machine=AzureMachine(32, 131072, 1000))
    assert [(e.time, e.kind) for e in trace.events if e.id == "3"] == [
        (17280.0, CREATE), (17280.0, DELETE), (25920.0, CREATE), (34560.0, DELETE)]
    with pytest.raises(InputError, match=r"5 is not a machineId of the trace \(it has 0, 1\)"):
        load_trace(path, machine=AzureMachine(32, 131072, 1000), machine_id=5)


@pytest.mark.parametrize("value", ["1,2", "a,b,c", "1,2,3,4", "0,1,1", ""])
def test_a_bad_azure_machine_is_a_usage_error(tmp_path: Path, value: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = azure_db(tmp_path / "azure.sqlite")
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--url", "http://127.0.0.1:9", path, f"--azure-machine={value}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert (f"error: argument --azure-machine: expected VCPUS,MEMORY_MB,DISK_GB (positive "
            f"integers), got {value!r}") in err and "Traceback" not in err


def test_huge_lifetimes_outlive_the_trace() -> None:
    # exp() of a lognormal draw past a float's range is a lifetime past any end.
    trace = generate(creates=50, rate=1.0, lifetime=Lifetime.parse("lognormal:1e308,1e308"),
                     mix={"a": 1.0}, seed=3)
    assert all(e.time <= trace.events[-1].time < 100 for e in trace.events)
    assert Lifetime.parse("lognormal:1e308,1").sampler(random.Random(0))() > 0


@pytest.mark.parametrize(("args", "message"), [
    (["--rate", "1e-320"], "--rate: 1e-320 creates per second is too low"),
    (["--rate", "nan"], "--rate: expected creates per second > 0, got nan"),
    (["--rate", "-1"], "--rate: expected creates per second > 0, got -1.0"),
    (["--duration", "-1"], "--duration: expected seconds > 0, got -1.0"),
    (["--duration", "0"], "--duration: expected seconds > 0, got 0.0"),
    (["--duration", "nan"], "--duration: expected seconds > 0, got nan"),
    (["--duration", "inf"], "--duration: expected seconds > 0, got inf"),
    (["--rate", "0.001", "--duration", "1"], "--duration: no create arrives within 1 s"),
    (["--creates", "100000000000"], "--creates: expected 1 to 10,000,000, got 100000000000"),
    (["--creates", "10000001"], "--creates: expected 1 to 10,000,000, got 10000001"),
    (["--cloud", "CLOUD", "--flavor-mix", "small,nosuch"],
     "--flavor-mix: flavor 'nosuch' is not one of --cloud's or Berth's defaults (known: "
     "small, large, m1.tiny, m1.small, m1.medium, m1.large, m1.xlarge)"),
    (["--cloud", "CLOUD", "--image", "nosuch"],
     "--image: 'nosuch' is not one of --cloud's images (known: cirros)"),
    (["--cloud", "/nonexistent/cloud.yaml"], "--cloud /nonexistent/cloud.yaml: no such file"),
    (["-o", "DIR"], "--output DIR: is a directory, expected a file"),
    (["-o", "DIR/nodir/x.csv"], "--output DIR/nodir/x.csv: no such directory 'DIR/nodir'"),
    (["-o", "FILE/x.csv"], "--output FILE/x.csv: FILE is not a directory"),
    (["-o", ""], "--output: expected a path, got ''"),
])
def test_bad_generate_arguments_are_one_line_before_any_work(
        tmp_path: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    cloud = tmp_path / "cloud.yaml"
    cloud.write_text("hosts: [{host: n1, vcpus: 8, memory_mb: 16384, local_gb: 100}]\n"
                     "flavors: [{name: small, vcpus: 1, memory_mb: 512, root_gb: 1},\n"
                     "          {name: large, vcpus: 4, memory_mb: 8192, root_gb: 10}]\n"
                     "images: [{name: cirros}]\n")
    (tmp_path / "file").write_text("")
    subst = {"CLOUD": str(cloud), "DIR": str(tmp_path), "FILE": str(tmp_path / "file")}

    def fill(text: str) -> str:
        for key, value in subst.items():
            text = text.replace(key, value)
        return text

    given = dict(zip(args[::2], args[1::2]))
    argv = ["trace", "generate", "--creates", "20", "--rate", "1",
            "--flavor-mix" if "--cloud" not in given else "--cloud",
            "small" if "--cloud" not in given else str(cloud), "-o", str(tmp_path / "g.csv")]
    argv += [fill(a) for a in args]
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert err.startswith(f"error: {fill(message)}") and err.count("\n") == 1
    assert not (tmp_path / "g.csv").exists()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_a_trace_that_cannot_be_written_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "generate", "--creates", "5", "--rate", "1", "--flavor-mix", "a",
                 "-o", "/dev/full"]) == 3
    assert capsys.readouterr().err == (
        "error: --output /dev/full: cannot write: No space left on device\n")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="no /proc")
def test_a_trace_cannot_go_under_proc(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "generate", "--creates", "5", "--rate", "1", "--flavor-mix", "a",
                 "-o", "/proc/x/y.csv"]) == 3
    assert capsys.readouterr().err == "error: --output /proc/x/y.csv: no such directory '/proc/x'\n"


def test_a_create_asks_for_a_zone_in_its_own_column(tmp_path: Path) -> None:
    trace = read_csv(write(tmp_path, "time,event,id,flavor,availability_zone\n"
                           "0,create,a,m1.small,az1\n1,create,b,m1.small,\n"))
    assert [e.availability_zone for e in trace.events] == ["az1", None]
    path = str(tmp_path / "again.csv")
    write_csv(trace, path)
    assert read_csv(path).events == trace.events
