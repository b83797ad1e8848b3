"""JsonFilter (reference §6): Nova's grammar, its quirks, and the vectorized path."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berth.errors import SchedulerHintError
from berth.filters.json_filter import JsonFilter, compile_query
from builders import cloud, host, passes_bulk, passes_per_host, spec, state


def verified_host():  # type: ignore[no-untyped-def]
    return cloud(host("h1", free_ram_mb=1024, vcpus_total=4,
                      stats={"n": "5", "num_instances": "3"}))


def evaluate(query: Any, snap=None) -> list[bool]:  # type: ignore[no-untyped-def]
    snap = snap if snap is not None else verified_host()
    req = spec(hints={"query": query if isinstance(query, str) else json.dumps(query)})
    f = JsonFilter()
    f.validate_request(req)
    per_host = passes_per_host(f, snap, req)
    assert passes_bulk(f, snap, req) == per_host
    return per_host


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ([">=", "$free_ram_mb", 1024], True),
        ([">", "$free_ram_mb", 1024], False),
        (["=", "$free_ram_mb"], False),
        (["in", "$free_ram_mb", 1, 1024], True),
        (["not", False, True], True),
        (["=", 1, 1, 2], False),
        ([">=", "$vcpus_total", 4, 3], True),
    ],
    ids=[
        "verified: >= free_ram_mb 1024 is true",
        "verified: > free_ram_mb 1024 is false",
        "verified: a comparison with one argument is false",
        "verified: in is list membership",
        "verified: a top-level not list is reduced with any",
        "verified: comparisons hold against every later argument",
        "verified: >= against several bounds",
    ],
)
def test_verified_examples(query: list[Any], expected: bool) -> None:
    assert evaluate(query) == [expected]


def test_verified_int_against_str_comparison_is_an_error_naming_query_and_host() -> None:
    with pytest.raises(SchedulerHintError) as err:
        evaluate(["<", "$free_ram_mb", "2000"])
    message = str(err.value)
    assert "query=" in message and '"$free_ram_mb"' in message and "host h1" in message
    assert "'<' not supported between instances of 'int' and 'str'" in message


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (["=", "$missing", 5, 5], True),
        (["=", None, 5, 5], True),
        (["=", "", 5, 5], True),
        (["and", True, ["not", True]], True),
        (["and", ["not", True]], True),
        (["not", True], False),
        (["not"], False),
        (["or"], False),
        (["and"], True),
        ([], True),
        (["and", [], True], True),
        (["=", "$stats.n", 5], False),
        (["=", "$stats.n", "5"], True),
        (["=", "$stats.missing", "5"], False),
        (["<", 1, 2, 3], True),
        (["<", 2, 1, 3], False),
        (["=", "abc", "abc"], True),
        (["<", "abc", "abd"], True),
        (["=", 1, True], True),
        (["=", 1, "1"], False),
        (["in", "$stats.n", "4", "5"], True),
        (["in", 5], False),
        ([">=", "$free_ram_mb", 1024.0], True),
        (["=", {"a": 1}, {"a": 1}], True),
        (["or", ["=", 1, 2], ["in", "$vcpus_total", 4]], True),
        (["and", "$free_ram_mb", "$vcpus_total"], True),
        (["and", "$stats.missing"], True),
        (["=", "$service.disabled", False], True),
        (["=", "$host", "h1"], True),
        (["=", "$now", "$row", 5, 5], True),
    ],
    ids=[
        "an unresolved $var is dropped, shifting the arguments",
        "JSON null is dropped",
        "an empty string is dropped",
        "verified: a nested not returns a list, which is truthy",
        "a nested not of true is still a non-empty list",
        "a top-level not of true is any([False])",
        "a top-level empty not is any([])",
        "an empty or is false",
        "an empty and is true",
        "an empty query passes",
        "a nested empty query is true",
        "$stats values are strings, so 5 does not equal them",
        "$stats values equal their string",
        "a missing stats key is dropped",
        "chained comparisons compare the first argument with each",
        "one failing comparison fails the whole",
        "string literals compare as strings",
        "strings order lexicographically",
        "True equals 1 as in Python",
        "= across types is simply false",
        "in with strings",
        "in with one argument is false",
        "int and float compare numerically",
        "dict literals compare by value",
        "nested or of comparisons",
        "and over host values uses their truthiness",
        "and with every argument dropped is all([])",
        "the service dict is reachable",
        "string attributes are reachable",
        "Berth's own HostState attributes do not exist for a query, as in Nova",
    ],
)
def test_grammar_quirks(query: list[Any], expected: bool) -> None:
    assert evaluate(query) == [expected]


@pytest.mark.parametrize(
    "query",
    [
        ["=", "$free_ram_mb.x", 1],
        ["=", "$stats.n.deeper", "5"],
        ["<", "$stats.n", 5],
        ["<", {"a": 1}, {"a": 2}],
        ["and", ["<", "$free_ram_mb", "2000"]],
        ["<", "$free_ram_mb", 1, "x"],
    ],
    ids=[
        "a path through an int (Nova: AttributeError)",
        "a path through a stats string (Nova: AttributeError)",
        "a stats string against a number (Nova: TypeError)",
        "ordering dicts (Nova: TypeError)",
        "a nested type error",
        "every comparison runs, even after one failed",
    ],
)
def test_host_dependent_errors_name_the_query_and_the_host(query: list[Any]) -> None:
    with pytest.raises(SchedulerHintError, match=r"query=.* cannot be evaluated on host h1"):
        evaluate(query)


def test_a_path_error_only_where_the_value_exists() -> None:
    # h2 has no stats key "n": the path stops at None and nothing is raised there.
    snap = cloud(host("h1", stats={"n": "5"}), host("h2", stats={}))
    req = spec(hints={"query": '["=", "$stats.n.x", 1]'})
    f = JsonFilter()
    assert f.check(state(snap, "h2"), req) is not None
    with pytest.raises(SchedulerHintError, match="host h1"):
        f.check(state(snap, "h1"), req)


@pytest.mark.parametrize(
    ("hint", "problem"),
    [
        ("[>=, 1]", "not valid JSON"),
        ('["=", 1', "not valid JSON"),
        ('{"op": "="}', "a query is a JSON list"),
        ("5", "a query is a JSON list"),
        ('"="', "a query is a JSON list"),
        ('["==", 1, 1]', "unknown operator '=='"),
        ('["and", ["xor", 1]]', "unknown operator 'xor'"),
        ('["in", "$host", ["a", "b"]]', "unknown operator 'a'"),
        ('[1, 2]', "unknown operator 1"),
        ('[["=", 1, 1]]', "unknown operator"),
        (["[\"=\", 1, 1]", "[]"], "expected one JSON string, got 2 values"),
    ],
    ids=[
        "malformed JSON (Nova: ValueError)",
        "truncated JSON",
        "a dict at the top level",
        "a number at the top level",
        "a string at the top level",
        "an unknown operator (Nova: KeyError)",
        "an unknown nested operator",
        "a list argument is itself a query, so its first item must be an operator",
        "a non-string operator",
        "a list as operator (Nova: unhashable TypeError)",
        "two query values (Nova: TypeError from loads of a list)",
    ],
)
def test_request_side_errors_are_raised_up_front_naming_the_hint_and_value(
    hint: Any, problem: str
) -> None:
    with pytest.raises(SchedulerHintError) as err:
        JsonFilter().validate_request(spec(hints={"query": hint}))
    assert "scheduler hint query=" in str(err.value)
    assert problem in str(err.value)


@pytest.mark.parametrize("hint", ["", "[]", "{}", "0", "null", "false", '""'],
                         ids=["an empty hint", "an empty list", "an empty dict", "zero", "null",
                              "false", "an empty JSON string"])
def test_falsy_queries_pass_every_host_as_novas_if_not_query_does(hint: str) -> None:
    req = spec(hints={"query": hint})
    JsonFilter().validate_request(req)
    assert passes_bulk(JsonFilter(), verified_host(), req) == [True]
    assert passes_per_host(JsonFilter(), verified_host(), req) == [True]


def test_no_hint_passes() -> None:
    assert passes_bulk(JsonFilter(), verified_host(), spec()) == [True]


def test_reason_carries_the_query() -> None:
    req = spec(hints={"query": '[">", "$free_ram_mb", 4096]'})
    reject = JsonFilter().check(state(verified_host(), "h1"), req)
    assert reject is not None and reject.reason == "JSON query false"
    assert reject.numbers == {"query": '[">", "$free_ram_mb", 4096]', "host": "free_ram_mb=1024"}


def test_reason_names_the_clause_that_failed_and_the_hosts_values() -> None:
    query = json.dumps(["and", [">=", "$free_ram_mb", 1024],
                        ["or", ["=", "$hypervisor_type", "QEMU"], ["<", "$vcpus_used", 2]],
                        ["and", [">=", "$free_disk_mb", 1024], ["<=", "$stats.num_instances", "3"]]])
    snap = cloud(host("h1", free_ram_mb=2048, free_disk_mb=300 * 1024, hypervisor_type="QEMU",
                      stats={"num_instances": "7"}),
                 host("h2", free_ram_mb=2048, hypervisor_type="xen", vcpus_used=4))
    req = spec(hints={"query": query})
    first = JsonFilter().check(state(snap, "h1"), req)
    assert first is not None and first.numbers["clause"] == '["<=", "$stats.num_instances", "3"]'
    assert first.numbers["host"] == 'stats.num_instances="7"'
    second = JsonFilter().check(state(snap, "h2"), req)
    assert second is not None
    assert second.numbers["clause"] == \
        '["or", ["=", "$hypervisor_type", "QEMU"], ["<", "$vcpus_used", 2]]'
    assert second.numbers["host"] == 'hypervisor_type="xen", vcpus_used=4'
    assert "clause" in second.render() and "host" in second.render()


def test_the_seed_query_free_ram_and_free_disk() -> None:
    query = ["and", [">=", "$free_ram_mb", 1024], [">=", "$free_disk_mb", 200 * 1024]]
    snap = cloud(host("h1", free_ram_mb=2048, free_disk_mb=300 * 1024),
                 host("h2", free_ram_mb=512, free_disk_mb=300 * 1024),
                 host("h3", free_ram_mb=2048, free_disk_mb=100 * 1024))
    assert compile_query(json.dumps(query)).vector is not None
    assert evaluate(query, snap) == [True, False, False]


def test_unset_columns_are_dropped_per_host_even_on_the_vector_path() -> None:
    snap = cloud(host("h1", hypervisor_version=None), host("h2", hypervisor_version=5),
                 host("h3", hypervisor_version=7))
    query = ["<", "$hypervisor_version", 6, 6]  # on h1 this becomes ["<", 6, 6]: false
    assert compile_query(json.dumps(query)).vector is not None
    assert evaluate(query, snap) == [False, True, False]
    query2 = ["=", "$hypervisor_version", 6, 6]  # on h1: ["=", 6, 6]: true
    assert evaluate(query2, snap) == [True, False, False]


@pytest.mark.parametrize(
    ("query", "vectorized"),
    [
        ([">=", "$free_ram_mb", 1024], True),
        (["and", ["<", "$num_io_ops", 3], ["or", [">", "$vcpus_total", 2.5], True]], True),
        (["=", "$free_ram_mb", None, 5], True),
        (["in", "$free_ram_mb", 1, 2], False),
        (["not", True], False),
        (["=", "$stats.n", "5"], False),
        (["<", "$free_ram_mb", "2000"], False),
        (["<", "$free_ram_mb", 2**60], False),
        (["=", "$host", "h1"], False),
        (["=", "$updated", 1], False),
    ],
    ids=[
        "a numeric comparison is vectorized",
        "nested and/or of numeric comparisons are vectorized",
        "a null literal is dropped at compile time",
        "in goes per host",
        "not goes per host",
        "stats paths go per host",
        "string literals go per host",
        "integers beyond float64 precision go per host",
        "non-numeric attributes go per host",
        "updated is not a plain column",
    ],
)
def test_which_queries_compile_to_numpy(query: list[Any], vectorized: bool) -> None:
    assert (compile_query(json.dumps(query)).vector is not None) is vectorized


def test_flags_are_novas() -> None:
    assert not JsonFilter.run_filter_once_per_request and not JsonFilter.RUN_ON_REBUILD


# ---------------------------------------------------------------------- properties
NUMERIC_VARS = ["$free_ram_mb", "$vcpus_total", "$num_io_ops", "$hypervisor_version",
                "$cpu_allocation_ratio", "$free_disk_mb"]
NUMERIC_LITERALS = st.one_of(st.integers(-3, 3000), st.sampled_from([0.5, 1.5, 2048.0, -1.0]),
                             st.booleans(), st.none())
OTHER_ATOMS = st.sampled_from(["$stats.flavor", "$stats.num_instances", "$missing", "", "5", "a",
                               "$host", 2**60, "$free_ram_mb.x"])


def numeric_queries() -> st.SearchStrategy[Any]:
    atom = st.one_of(st.sampled_from(NUMERIC_VARS), NUMERIC_LITERALS)
    return st.recursive(
        st.tuples(st.sampled_from(["=", "<", ">", "<=", ">="]), st.lists(atom, max_size=3)).map(
            lambda t: [t[0], *t[1]]),
        lambda inner: st.tuples(
            st.sampled_from(["and", "or", "=", "<", ">=", "<=", ">"]),
            st.lists(st.one_of(inner, atom, st.just([])), max_size=3),
        ).map(lambda t: [t[0], *t[1]]),
        max_leaves=8,
    )


def any_queries() -> st.SearchStrategy[Any]:
    atom = st.one_of(st.sampled_from(NUMERIC_VARS), NUMERIC_LITERALS, OTHER_ATOMS)
    ops = st.sampled_from(["=", "<", ">", "<=", ">=", "in", "not", "and", "or"])
    return st.recursive(
        st.tuples(ops, st.lists(atom, max_size=3)).map(lambda t: [t[0], *t[1]]),
        lambda inner: st.tuples(ops, st.lists(st.one_of(inner, atom), max_size=3)).map(
            lambda t: [t[0], *t[1]]),
        max_leaves=8,
    )


@st.composite
def json_cloud(draw: Any) -> Any:
    builders = []
    for i in range(draw(st.integers(1, 6))):
        builders.append(host(
            f"h{i}",
            free_ram_mb=draw(st.integers(-512, 4096)),
            free_disk_mb=draw(st.sampled_from([0, 1024, 204800])),
            vcpus_total=draw(st.integers(0, 8)),
            num_io_ops=draw(st.integers(0, 4)),
            hypervisor_version=draw(st.sampled_from([None, 0, 1, 6000000])),
            cpu_allocation_ratio=draw(st.sampled_from([0.5, 1.5, 16.0])),
            stats={"flavor": draw(st.sampled_from(["a", "5"])), "num_instances": "3"},
        ))
    return cloud(*builders)


def outcome(f: JsonFilter, path: Any, snap: Any, req: Any) -> Any:
    try:
        return path(f, snap, req)
    except SchedulerHintError as exc:
        return ("error", str(exc))


@settings(max_examples=60, deadline=None)
@given(snap=json_cloud(), query=numeric_queries())
def test_vectorized_and_per_host_evaluation_agree_on_numeric_queries(snap, query) -> None:  # type: ignore[no-untyped-def]
    text = json.dumps(query)
    assert compile_query(text).vector is not None
    req = spec(hints={"query": text})
    f = JsonFilter()
    f.validate_request(req)
    assert passes_bulk(f, snap, req) == passes_per_host(f, snap, req)


@settings(max_examples=60, deadline=None)
@given(snap=json_cloud(), query=any_queries())
def test_bulk_and_per_host_paths_agree_on_any_query(snap, query) -> None:  # type: ignore[no-untyped-def]
    req = spec(hints={"query": json.dumps(query)})
    f = JsonFilter()
    f.validate_request(req)
    assert outcome(f, passes_bulk, snap, req) == outcome(f, passes_per_host, snap, req)


def test_nesting_is_bounded_up_front() -> None:
    from berth.filters.json_filter import MAX_DEPTH

    ok = '["and", ' * (MAX_DEPTH - 1) + "true" + "]" * (MAX_DEPTH - 1)
    assert compile_query(ok).parsed
    deep = '["and", ' * (MAX_DEPTH + 1) + "true" + "]" * (MAX_DEPTH + 1)
    with pytest.raises(SchedulerHintError, match=f"nested more than {MAX_DEPTH} levels deep"):
        JsonFilter().validate_request(spec(hints={"query": deep}))


# ------------------------------------------------- $host_ip is an address, as in Nova
def ip_hosts():  # type: ignore[no-untyped-def]
    return cloud(host("h1", host_ip="10.0.0.1"), host("h2", host_ip="10.0.0.2"),
                 host("h3", host_ip=None))


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (["=", "$host_ip", "10.0.0.1"], [False, False, False]),
        (["in", "$host_ip", "10.0.0.1", "10.0.0.2"], [False, False, False]),
        (["=", "$host_ip", "$host_ip"], [True, True, False]),
        (["not", ["=", "$host_ip", "10.0.0.1"]], [True, True, True]),
    ],
    ids=["equal to a string matches no host, as in Nova",
         "in a list of strings matches no host either",
         "two addresses compare as addresses (a host without one drops both arguments)",
         "so its negation passes every host"],
)
def test_host_ip_is_an_ip_address_as_in_nova(query: Any, expected: list[bool]) -> None:
    assert evaluate(query, ip_hosts()) == expected


def test_ordering_host_ip_against_a_string_is_an_error_that_says_why() -> None:
    with pytest.raises(SchedulerHintError, match=r"host h1 .*\$host_ip is an IP address, as in Nova"):
        evaluate(["<", "$host_ip", "10.0.0.5"], ip_hosts())


def test_a_host_rejected_by_a_string_comparison_of_host_ip_is_explained() -> None:
    req = spec(hints={"query": json.dumps(["=", "$host_ip", "10.0.0.1"])})
    reject = JsonFilter().check(state(ip_hosts(), "h1"), req)
    assert reject is not None
    assert reject.numbers["note"].startswith("$host_ip is an IP address, as in Nova")


def test_a_host_ip_that_is_no_address_is_a_host_state_error() -> None:
    from berth.errors import HostStateError

    with pytest.raises(HostStateError, match="host h1: host_ip '10.0.0' is not an IP address"):
        evaluate(["=", "$host_ip", "$host_ip"], cloud(host("h1", host_ip="10.0.0")))


def test_updated_is_a_datetime_as_in_nova() -> None:
    """Nova's host state holds the compute node's updated_at, a datetime: ordering it
    against a number raises (a SchedulerHintError here), equality is simply false.
    Berth compared its epoch seconds (found by a differential run against Nova 34)."""
    snap = cloud(host("h1", updated=1.7e9))
    with pytest.raises(SchedulerHintError, match="'>' not supported between instances of "
                                                 "'datetime.datetime' and 'int'"):
        evaluate([">", "$updated", 5], snap)
    assert evaluate(["=", "$updated", 1700000000], snap) == [False]


def test_pci_stats_is_an_object_on_every_host_as_in_nova() -> None:
    """Nova's host state always holds device stats, empty on a host without devices, so
    ``$pci_stats`` is never dropped as a missing argument there. A differential run
    against Nova 34 found Berth answering no host for a query Nova passes."""
    assert evaluate(["or", ["not", "$pci_stats"], ["=", "$pci_stats", "$pci_stats"]]) == [True]
    with pytest.raises(SchedulerHintError, match="cannot be evaluated on host h1"):
        evaluate(["<=", 8192, "$pci_stats"])  # Nova: TypeError
