"""Authentication and policy of both HTTP APIs, as an operator runs them: ``berth serve``
and ``berth placement serve`` processes validating tokens of a real Keystone (a peer
process from ``.venv-keystone``), and the noauth2 development mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from peers import keystone as peer

from .serving import free_port

CLOUD = """
flavors: [{name: web, vcpus: 1, memory_mb: 512, root_gb: 1}]
hosts:
  - {host: "n{index}", count: 2, vcpus: 8, memory_mb: 8704, local_gb: 100}
"""
PLACEMENT = {"OpenStack-API-Version": "placement 1.39"}




class Server:
    """A ``berth`` server process on a free port (its output in ``log``)."""

    def __init__(self, tmp: Path, *argv: str, health: str = "/healthz") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"server-{self.port}.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "berth.cli", *argv, "--port", str(self.port)],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                httpx.get(self.url + health, timeout=1)
                return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise AssertionError(f"not up: {self.log.read_text()}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "berth.cli", *argv], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


# ------------------------------------------------------------------ with Keystone
@pytest.fixture(scope="module")
def keystone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[peer.Keystone]:
    why = peer.available()
    if why:
        pytest.skip(why)
    ks = peer.Keystone(tmp_path_factory.mktemp("keystone")).start()
    yield ks
    ks.stop()


@pytest.fixture(scope="module")
def nova_conf(keystone: peer.Keystone, tmp_path_factory: pytest.TempPathFactory) -> Path:
    conf = tmp_path_factory.mktemp("conf") / "nova.conf"
    conf.write_text("[api]\nauth_strategy = keystone\n" + keystone.authtoken_section())
    return conf


@pytest.fixture(scope="module")
def berth(keystone: peer.Keystone, nova_conf: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("berth")
    (tmp / "cloud.yaml").write_text(CLOUD)
    server = Server(tmp, "serve", "--config-file", str(nova_conf), "--db",
                    f"sqlite:///{tmp}/b.sqlite", "--cloud", str(tmp / "cloud.yaml"))
    yield server
    server.stop()


def test_no_token_is_a_401_on_both_apis_naming_keystone(berth: Server,
                                                       keystone: peer.Keystone) -> None:
    boot = httpx.post(berth.url + "/boot", json={"flavor": "web"})
    assert boot.status_code == 401
    assert boot.json()["error"]["code"] == "berth.auth.unauthenticated"
    assert boot.headers["WWW-Authenticate"] == f'Keystone uri="{keystone.url}"'
    providers = httpx.get(berth.url + "/placement/resource_providers", headers=PLACEMENT)
    assert providers.status_code == 401
    assert providers.headers["WWW-Authenticate"] == f'Keystone uri="{keystone.url}"'
    # Placement's root document and the health check need no token.
    assert httpx.get(berth.url + "/placement/").status_code == 200
    assert httpx.get(berth.url + "/healthz").status_code == 200


def test_an_admin_role_header_without_a_valid_token_is_a_401(berth: Server) -> None:
    forged = {"X-Auth-Token": "admin", "X-Roles": "admin", "X-Project-Id": "admin",
              "X-Identity-Status": "Confirmed", "X-User-Id": "admin", **PLACEMENT}
    assert httpx.get(berth.url + "/placement/resource_providers",
                     headers=forged).status_code == 401
    assert httpx.delete(berth.url + "/placement/allocations/"
                        "00000000-0000-4000-8000-000000000001", headers=forged).status_code == 401
    assert httpx.get(berth.url + "/hosts", headers=forged).status_code == 401


def test_a_reader_reads_its_usages_but_cannot_write(berth: Server,
                                                    keystone: peer.Keystone) -> None:
    reader = {"X-Auth-Token": keystone.token("alice"), **PLACEMENT}
    demo = keystone.project_id("demo")
    usages = httpx.get(berth.url + "/placement/usages", params={"project_id": demo},
                       headers=reader)
    assert usages.status_code == 200, usages.text
    other = httpx.get(berth.url + "/placement/usages",
                      params={"project_id": keystone.project_id("other")}, headers=reader)
    assert other.status_code == 403
    write = httpx.post(berth.url + "/placement/resource_providers", headers=reader,
                       json={"name": "rogue"})
    assert write.status_code == 403
    assert "placement:resource_providers:create" in write.text
    boot = httpx.post(berth.url + "/boot", headers=reader, json={"flavor": "web"})
    assert boot.status_code == 403
    assert boot.json()["error"] == {"code": "berth.auth.forbidden", "message":
                                    "Policy does not allow berth:boot:create to be performed."}


def test_role_headers_beside_a_real_token_are_not_believed(berth: Server,
                                                           keystone: peer.Keystone) -> None:
    forged = {"X-Auth-Token": keystone.token("alice"), "X-Roles": "admin,service",
              "X-Project-Id": "admin", **PLACEMENT}
    assert httpx.get(berth.url + "/placement/resource_providers",
                     headers=forged).status_code == 403
    assert httpx.get(berth.url + "/hosts", headers=forged).status_code == 403


def test_a_member_boots_for_its_project_only(berth: Server, keystone: peer.Keystone) -> None:
    member = {"X-Auth-Token": keystone.token("bob")}
    resp = httpx.post(berth.url + "/boot", headers=member, json={"flavor": "web"}, timeout=60)
    assert resp.status_code == 200, resp.text
    (instance,) = resp.json()["instances"]
    admin = {"X-Auth-Token": keystone.token("admin"), **PLACEMENT}
    allocation = httpx.get(f"{berth.url}/placement/allocations/{instance['instance_uuid']}",
                           headers=admin).json()
    assert allocation["project_id"] == keystone.project_id("demo")
    elsewhere = httpx.post(berth.url + "/boot", headers=member, timeout=60,
                           json={"flavor": "web", "project_id": keystone.project_id("other")})
    assert elsewhere.status_code == 403
    # The instance is its project's: its members may see it, others may not.
    shown = httpx.get(f"{berth.url}/servers/{instance['instance_uuid']}", headers=member)
    assert shown.status_code == 200
    stranger = {"X-Auth-Token": keystone.token("carol")}
    assert httpx.get(f"{berth.url}/servers/{instance['instance_uuid']}",
                     headers=stranger).status_code == 403
    # Cold migration is an admin's, as in Nova.
    assert httpx.post(f"{berth.url}/servers/{instance['instance_uuid']}/migrate",
                      headers=member, json={}).status_code == 403


def test_an_admin_sees_the_hosts(berth: Server, keystone: peer.Keystone) -> None:
    admin = {"X-Auth-Token": keystone.token("admin")}
    hosts = httpx.get(berth.url + "/hosts", headers=admin)
    assert hosts.status_code == 200 and len(hosts.json()["hosts"]) == 2


def test_berth_boot_gets_its_token_from_the_os_variables(berth: Server,
                                                         keystone: peer.Keystone) -> None:
    env = {"OS_AUTH_URL": keystone.url, "OS_USERNAME": "bob", "OS_PASSWORD": peer.PASSWORD,
           "OS_PROJECT_NAME": "demo", "OS_AUTH_TOKEN": ""}
    done = _run("boot", "--url", berth.url, "--flavor", "web", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["instances"]) == 1
    refused = _run("boot", "--url", berth.url, "--flavor", "web",
                   env={**env, "OS_USERNAME": "alice"})
    assert refused.returncode == 9
    assert "Policy does not allow berth:boot:create" in refused.stderr


def test_a_policy_file_changes_a_rule(keystone: peer.Keystone, nova_conf: Path,
                                      tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text('"berth:hosts:list": "role:reader"\n'
                      '"placement:resource_providers:list": "role:reader"\n')
    (tmp_path / "cloud.yaml").write_text(CLOUD)
    server = Server(tmp_path, "serve", "--config-file", str(nova_conf), "--policy-file",
                    str(policy), "--db", f"sqlite:///{tmp_path}/b.sqlite",
                    "--cloud", str(tmp_path / "cloud.yaml"))
    try:
        reader = {"X-Auth-Token": keystone.token("alice"), **PLACEMENT}
        assert httpx.get(server.url + "/hosts", headers=reader).status_code == 200
        assert httpx.get(server.url + "/placement/resource_providers",
                         headers=reader).status_code == 200
        # The rules the file leaves alone keep their defaults.
        assert httpx.get(server.url + "/placement/traits", headers=reader).status_code == 403
    finally:
        server.stop()
    assert f"policy file {policy}" in server.log.read_text()


def test_placement_serve_validates_tokens_too(keystone: peer.Keystone, nova_conf: Path,
                                              tmp_path: Path) -> None:
    server = Server(tmp_path, "placement", "serve", "--config-file", str(nova_conf), "--db",
                    f"sqlite:///{tmp_path}/p.sqlite", health="/")
    try:
        assert httpx.get(server.url + "/resource_providers").status_code == 401
        forged = {"X-Auth-Token": "admin", "X-Roles": "admin", **PLACEMENT}
        assert httpx.get(server.url + "/resource_providers", headers=forged).status_code == 401
        reader = {"X-Auth-Token": keystone.token("alice"), **PLACEMENT}
        assert httpx.put(server.url + "/traits/CUSTOM_X", headers=reader).status_code == 403
        service = {"X-Auth-Token": keystone.token("berth"), **PLACEMENT}
        assert httpx.put(server.url + "/traits/CUSTOM_X", headers=service).status_code == 201
        # The reshaper: service only under the new defaults; the legacy default admits admin.
        admin = {"X-Auth-Token": keystone.token("admin"), **PLACEMENT}
        assert httpx.post(server.url + "/reshaper", headers=admin, json={}).status_code == 400
    finally:
        server.stop()


# ------------------------------------------------------------------ without Keystone
def test_keystone_is_the_default_and_noauth2_must_be_asked_for(tmp_path: Path) -> None:
    for argv in (["serve"], ["placement", "serve"]):
        done = _run(*argv, "--db", f"sqlite:///{tmp_path}/x.sqlite", "--port", "0")
        assert done.returncode == 2
        assert done.stderr.strip().endswith(
            "[api] auth_strategy = keystone (the default) needs [keystone_authtoken] in a "
            "--config-file; for development without Keystone pass --auth-strategy noauth2")
    conf = tmp_path / "nova.conf"
    conf.write_text("[api]\nauth_strategy = keystone\n[keystone_authtoken]\n"
                    "www_authenticate_uri = http://127.0.0.1:5000/v3\n")
    done = _run("serve", "--config-file", str(conf), "--db", f"sqlite:///{tmp_path}/x.sqlite")
    assert done.returncode == 2
    assert "[keystone_authtoken] auth_type: not set" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("content, message", [
    ("berth:hosts:list: [unclosed\n", "policy file {path}: "),
    ("- a list\n", "policy file {path}: "),
])
def test_a_bad_policy_file_is_one_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(content)
    done = _run("serve", "--auth-strategy", "noauth2", "--policy-file", str(path), "--db",
                f"sqlite:///{tmp_path}/x.sqlite", "--port", "0")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("berth serve: " +
                                                   message.format(path=path)), done.stderr


def test_a_missing_policy_file_is_named(tmp_path: Path) -> None:
    done = _run("placement", "serve", "--auth-strategy", "noauth2", "--policy-file",
                str(tmp_path / "nope.yaml"), "--db", f"sqlite:///{tmp_path}/x.sqlite",
                "--port", "0")
    assert done.returncode == 2
    assert done.stderr.strip() == (f"berth placement serve: [oslo_policy] policy_file: "
                                   f"{tmp_path / 'nope.yaml'}: no such file")


def test_noauth2_ignores_role_headers_unless_told_to_trust_them(tmp_path: Path) -> None:
    (tmp_path / "cloud.yaml").write_text(CLOUD)
    server = Server(tmp_path, "serve", "--auth-strategy", "noauth2", "--db",
                    f"sqlite:///{tmp_path}/b.sqlite", "--cloud", str(tmp_path / "cloud.yaml"))
    try:
        claimed = {"X-Auth-Token": "mallory", "X-Roles": "admin", **PLACEMENT}
        assert httpx.get(server.url + "/placement/resource_providers",
                         headers=claimed).status_code == 403
        assert httpx.get(server.url + "/hosts", headers=claimed).status_code == 403
        admin = {"X-Auth-Token": "admin", **PLACEMENT}
        assert httpx.get(server.url + "/hosts", headers=admin).status_code == 200
    finally:
        server.stop()
    trusting = Server(tmp_path, "placement", "serve", "--auth-strategy", "noauth2",
                      "--noauth2-trust-client-roles", "--db", f"sqlite:///{tmp_path}/p.sqlite",
                      health="/")
    try:
        assert httpx.get(trusting.url + "/resource_providers",
                         headers=claimed).status_code == 200
    finally:
        trusting.stop()
    assert "trusting client role headers" in trusting.log.read_text()


def test_a_keystone_that_cannot_validate_tokens_is_a_503_not_a_500(
        keystone: peer.Keystone, tmp_path: Path) -> None:
    # The middleware looks for Keystone's "internal" endpoint by default; this catalog
    # has only the public one.
    conf = tmp_path / "nova.conf"
    conf.write_text("[api]\nauth_strategy = keystone\n" +
                    keystone.authtoken_section().replace("interface = public\n", ""))
    server = Server(tmp_path, "placement", "serve", "--config-file", str(conf), "--db",
                    f"sqlite:///{tmp_path}/p.sqlite", health="/")
    try:
        resp = httpx.get(server.url + "/resource_providers",
                         headers={"X-Auth-Token": keystone.token("admin"), **PLACEMENT})
        assert resp.status_code == 503
        assert resp.json()["error"]["code"] == "berth.unavailable.keystone"
        assert resp.headers["Retry-After"] == "5"
    finally:
        server.stop()


def test_a_service_authenticates_to_placement_with_its_placement_credentials(
        keystone: peer.Keystone, nova_conf: Path, tmp_path: Path) -> None:
    """What ``berth compute`` does: a token from the keystoneauth options of
    ``[placement]``, renewed by the plugin, sent to a Placement API that validates it."""
    from berth.placement.client import PlacementClient
    from berth.webauth.client import placement_access

    server = Server(tmp_path, "placement", "serve", "--config-file", str(nova_conf), "--db",
                    f"sqlite:///{tmp_path}/p.sqlite", health="/")
    conf = tmp_path / "compute.conf"
    conf.write_text("[placement]\nauth_type = password\n"
                    f"auth_url = {keystone.url}\nusername = berth\n"
                    f"password = {peer.PASSWORD}\nproject_name = service\n"
                    "user_domain_name = Default\nproject_domain_name = Default\n")
    try:
        auth = placement_access([str(conf)]).auth
        assert auth is not None
        with PlacementClient(server.url, auth=auth) as client:
            created = client.create_provider("compute-1")
            assert [p.uuid for p in client.list_providers()] == [created.uuid]
        # Without [placement] credentials: the noauth2 token, which Keystone refuses.
        assert placement_access([str(nova_conf)]).auth is None
        with PlacementClient(server.url) as client, pytest.raises(Exception, match="401"):
            client.list_providers()
    finally:
        server.stop()
