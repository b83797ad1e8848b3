"""TrustedFilter (reference §12.6): file and HTTP attestation, the per-node cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berth.config import SchedulerConfig
from berth.errors import ConfigError
from berth.filters.trusted import (
    AttestationClient,
    FileAttestationClient,
    HttpAttestationClient,
    StaticAttestationClient,
    TrustedFilter,
    parse_vtime,
)
from builders import NOW, cloud, host, passes_bulk, passes_per_host, spec, state

TRUSTED = {"trust:trusted_host": "trusted"}


def nodes():  # type: ignore[no-untyped-def]
    return cloud(host("h1", node="n1"), host("h2", node="n2"), host("h3", node="n3"))


def static(**levels: str) -> TrustedFilter:
    return TrustedFilter(client=StaticAttestationClient(levels))


@pytest.mark.parametrize(
    ("extra_specs", "expected"),
    [
        ({}, [True, True, True]),
        ({"trust:trusted_host": ""}, [True, True, True]),
        (TRUSTED, [True, False, False]),
        ({"trust:trusted_host": "untrusted"}, [False, True, False]),
        ({"trust:trusted_host": "unknown"}, [False, False, True]),
        ({"trust:trusted_host": "Trusted"}, [False, False, False]),
    ],
    ids=[
        "a flavor without the extra spec passes every node",
        "an empty extra spec passes every node",
        "trusted passes only attested-trusted nodes",
        "untrusted passes only untrusted nodes",
        "unknown passes nodes the attestation does not name",
        "levels compare exactly",
    ],
)
def test_trusted_filter(extra_specs: dict[str, str], expected: list[bool]) -> None:
    f = static(n1="trusted", n2="untrusted")
    req = spec(extra_specs=extra_specs)
    assert passes_per_host(f, nodes(), req) == expected
    assert passes_bulk(f, nodes(), req) == expected


def test_the_node_name_is_what_is_attested_not_the_host() -> None:
    f = static(h1="trusted")
    assert passes_bulk(f, nodes(), spec(extra_specs=TRUSTED)) == [False, False, False]


def test_reason_names_requested_and_attested_levels() -> None:
    reject = static(n1="untrusted").check(state(nodes(), "h1", "n1"), spec(extra_specs=TRUSTED))
    assert reject is not None and reject.reason == "untrusted host"
    assert reject.numbers == {"requested": "trusted", "level": "untrusted"}


def test_flags_are_novas() -> None:
    assert TrustedFilter.run_filter_once_per_request is True
    assert TrustedFilter.RUN_ON_REBUILD is False


def test_clients_satisfy_the_protocol(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text("n1: trusted\n")
    assert isinstance(StaticAttestationClient(), AttestationClient)
    assert isinstance(FileAttestationClient(path), AttestationClient)
    assert isinstance(HttpAttestationClient("s", transport=httpx.MockTransport(
        lambda r: httpx.Response(500))), AttestationClient)


# ---------------------------------------------------------------------- file client
@pytest.mark.parametrize(
    ("name", "text"),
    [("att.yaml", "n1: trusted\nn2: untrusted\n"),
     ("att.json", '{"n1": "trusted", "n2": "untrusted"}')],
    ids=["a YAML file", "a JSON file"],
)
def test_the_default_client_reads_the_attestation_file(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    config = SchedulerConfig.from_dict({"trusted_computing": {"attestation_file": str(path)}})
    f = TrustedFilter(config)
    assert isinstance(f.client, FileAttestationClient)
    assert passes_bulk(f, nodes(), spec(extra_specs=TRUSTED)) == [True, False, False]
    assert passes_bulk(f, nodes(), spec(extra_specs={"trust:trusted_host": "unknown"})) == [
        False, False, True]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (None, "cannot read it"),
        ("n1: [trusted\n", "not valid YAML or JSON"),
        ("- n1\n- n2\n", "expected a mapping of node name to trust level"),
        ("", "expected a mapping"),
        ("n1: 1\n", "the trust level of node 'n1' must be a string"),
    ],
    ids=["a missing file", "a syntax error", "a list instead of a mapping", "an empty file",
         "a level that is not a string"],
)
def test_a_bad_attestation_file_is_a_config_error_naming_file_and_problem(
    tmp_path: Path, text: str | None, problem: str
) -> None:
    path = tmp_path / "att.yaml"
    if text is not None:
        path.write_text(text)
    config = SchedulerConfig.from_dict({"trusted_computing": {"attestation_file": str(path)}})
    with pytest.raises(ConfigError) as err:
        TrustedFilter(config)
    assert str(path) in str(err.value) and problem in str(err.value)


def test_without_any_source_every_node_is_unknown() -> None:
    f = TrustedFilter()
    assert passes_bulk(f, nodes(), spec(extra_specs=TRUSTED)) == [False, False, False]
    assert passes_bulk(f, nodes(), spec(extra_specs={"trust:trusted_host": "unknown"})) == [True] * 3


# ---------------------------------------------------------------------- HTTP client
class FakeServer:
    """An attestation server behind httpx.MockTransport: records requests, answers levels."""

    def __init__(self, levels: dict[str, str], vtime: Any = "2023-11-14T22:13:20Z",
                 status: int = 200, body: Any = None) -> None:
        self.levels = levels
        self.vtime = vtime
        self.status = status
        self.body = body
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.body is not None:
            return httpx.Response(self.status, content=self.body)
        asked = json.loads(request.content)["hosts"]
        hosts = [{"host_name": h, "trust_lvl": self.levels[h], "vtime": self.vtime}
                 for h in asked if h in self.levels]
        return httpx.Response(self.status, json={"hosts": hosts})


def http_filter(server: FakeServer, **options: Any) -> TrustedFilter:
    values = {"attestation_server": "oat.example", "attestation_auth_timeout": 60, **options}
    config = SchedulerConfig.from_dict({"trusted_computing": values})
    client = HttpAttestationClient.from_config(config, transport=httpx.MockTransport(server))
    return TrustedFilter(config, client=client)


# 2023-11-14T22:13:20Z is builders.NOW (1_700_000_000).
def test_the_http_client_posts_every_known_node_once_with_novas_request() -> None:
    server = FakeServer({"n1": "trusted", "n2": "untrusted", "n3": "untrusted"})
    f = http_filter(server, attestation_port=9443, attestation_api_url="/OAT/V1",
                    attestation_auth_blob="secret")
    assert passes_bulk(f, nodes(), spec(extra_specs=TRUSTED)) == [True, False, False]
    assert len(server.requests) == 1
    request = server.requests[0]
    assert request.method == "POST"
    assert str(request.url) == "https://oat.example:9443/OAT/V1/PollHosts"
    assert json.loads(request.content) == {"count": 3, "hosts": ["n1", "n2", "n3"]}
    assert request.headers["content-type"] == "application/json"
    assert request.headers["accept"] == "application/json"
    assert request.headers["x-auth-blob"] == "secret"


def test_a_node_the_server_does_not_answer_for_stays_stale_and_is_polled_again() -> None:
    server = FakeServer({"n1": "trusted", "n2": "untrusted"})
    f = http_filter(server)
    assert passes_bulk(f, nodes(), spec(extra_specs=TRUSTED)) == [True, False, False]
    # n3's entry is still the expired seed after the first poll, so its lookup re-polls.
    assert len(server.requests) == 2


def test_no_auth_blob_header_without_the_option() -> None:
    server = FakeServer({"n1": "trusted"})
    passes_bulk(http_filter(server), nodes(), spec(extra_specs=TRUSTED))
    assert "x-auth-blob" not in server.requests[0].headers


def test_the_cache_is_valid_for_the_timeout_measured_against_the_scheduling_instant() -> None:
    server = FakeServer({"n1": "trusted", "n2": "untrusted", "n3": "trusted"})
    f = http_filter(server, attestation_auth_timeout=60)
    req = spec(extra_specs=TRUSTED)
    assert passes_per_host(f, nodes(), req, now=NOW + 10) == [True, False, True]
    assert len(server.requests) == 1
    assert passes_bulk(f, nodes(), req, now=NOW + 60) == [True, False, True]
    assert len(server.requests) == 1  # vtime NOW, 60 s later: still valid
    server.levels["n1"] = "untrusted"
    server.vtime = "2023-11-14T22:14:21Z"  # NOW + 61
    assert passes_bulk(f, nodes(), req, now=NOW + 61) == [False, False, True]
    assert len(server.requests) == 2


def test_an_entry_older_than_the_timeout_is_refreshed_on_every_lookup() -> None:
    server = FakeServer({"n1": "trusted"}, vtime="2000-01-01T00:00:00Z")
    f = http_filter(server)
    assert passes_per_host(f, nodes(), spec(extra_specs=TRUSTED)) == [True, False, False]
    assert len(server.requests) == 3  # each lookup found its entry stale, as in Nova


@pytest.mark.parametrize(
    ("vtime", "expected_level"),
    [
        ("2023-11-14T22:13:20Z", "trusted"),
        ("2023-11-14T23:13:20+01:00", "trusted"),
        ("2023-11-14 22:13:20", "trusted"),
        ("Tue Nov 14 22:13:20 2023", "trusted"),
        ("yesterday", "unknown"),
        (12345, "unknown"),
    ],
    ids=[
        "ISO 8601 with Z",
        "ISO 8601 with an offset",
        "ISO 8601 without zone is UTC",
        "the %c format (Mt. Wilson)",
        "an unparseable vtime makes the node unknown",
        "a vtime that is not a string makes the node unknown",
    ],
)
def test_vtime_formats(vtime: Any, expected_level: str) -> None:
    server = FakeServer({"n1": "trusted"}, vtime=vtime)
    f = http_filter(server)
    req = spec(extra_specs={"trust:trusted_host": expected_level})
    assert passes_bulk(f, nodes(), req)[0] is True


def test_an_unknown_vtime_is_valid_from_now() -> None:
    server = FakeServer({"n1": "trusted"}, vtime="garbage")
    f = http_filter(server)
    req = spec(extra_specs={"trust:trusted_host": "unknown"})
    assert passes_bulk(f, nodes(), req, now=NOW + 1000) == [True, True, True]
    requests = len(server.requests)
    assert passes_bulk(f, nodes(), req, now=NOW + 1030) == [True, True, True]
    # n1 is cached (unknown, vtime NOW+1000); n2 and n3 were never answered, so stale.
    assert len(server.requests) > requests


def test_parse_vtime_to_epoch_seconds() -> None:
    assert parse_vtime("2023-11-14T22:13:20Z") == NOW
    assert parse_vtime("Tue Nov 14 22:13:20 2023") == NOW
    assert parse_vtime("nope") is None


@pytest.mark.parametrize(
    "server",
    [
        FakeServer({"n1": "trusted"}, status=500),
        FakeServer({}, body=b"not json"),
        FakeServer({}, body=b'["a list"]'),
        FakeServer({}, body=b'{"hosts": "n1"}'),
        FakeServer({}, body=b'{"hosts": [{"trust_lvl": "trusted"}, "junk"]}'),
    ],
    ids=[
        "an error status",
        "a body that is not JSON",
        "a JSON body that is not an object",
        "a hosts field that is not a list",
        "malformed host entries are skipped",
    ],
)
def test_a_failed_poll_leaves_every_node_unknown(server: FakeServer) -> None:
    f = http_filter(server)
    assert passes_bulk(f, nodes(), spec(extra_specs=TRUSTED)) == [False, False, False]
    assert passes_bulk(f, nodes(), spec(extra_specs={"trust:trusted_host": "unknown"})) == [True] * 3


def test_a_network_error_leaves_every_node_unknown() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    config = SchedulerConfig.from_dict({"trusted_computing": {"attestation_server": "oat"}})
    client = HttpAttestationClient.from_config(config, transport=httpx.MockTransport(refuse))
    f = TrustedFilter(config, client=client)
    assert passes_bulk(f, nodes(), spec(extra_specs=TRUSTED)) == [False, False, False]


def test_a_bad_ca_file_is_a_config_error(tmp_path: Path) -> None:
    ca = tmp_path / "missing-ca.pem"
    config = SchedulerConfig.from_dict({"trusted_computing": {
        "attestation_server": "oat", "attestation_server_ca_file": str(ca)}})
    with pytest.raises(ConfigError, match="attestation_server_ca_file"):
        TrustedFilter(config)


def test_the_server_option_selects_the_http_client() -> None:
    config = SchedulerConfig.from_dict({"trusted_computing": {
        "attestation_server": "oat", "attestation_insecure_ssl": True}})
    f = TrustedFilter(config)
    assert isinstance(f.client, HttpAttestationClient)
    assert f.client.url == "https://oat:8443/OpenAttestationWebServices/V1.0/PollHosts"
    f.client.close()


@settings(max_examples=40, deadline=None)
@given(
    levels=st.dictionaries(st.sampled_from(["n0", "n1", "n2", "n3", "h0", "h1"]),
                           st.sampled_from(["trusted", "untrusted"]), max_size=5),
    trust=st.sampled_from(["", "trusted", "untrusted", "unknown"]),
    n=st.integers(1, 5),
    named=st.lists(st.booleans(), min_size=5, max_size=5),
)
def test_bulk_and_per_host_paths_agree(levels, trust, n, named) -> None:  # type: ignore[no-untyped-def]
    snap = cloud(*(host(f"h{i}", node=f"n{i}" if named[i] else None) for i in range(n)))
    req = spec(extra_specs={"trust:trusted_host": trust})
    f = static(**levels)
    assert passes_bulk(f, snap, req) == passes_per_host(f, snap, req)
    server = FakeServer(levels)
    g = http_filter(server)
    assert passes_bulk(g, snap, req) == passes_per_host(g, snap, req) == passes_per_host(f, snap, req)
