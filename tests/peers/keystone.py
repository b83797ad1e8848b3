"""A real Keystone as a peer process, for the authentication tests.

It runs from its own environment, ``.venv-keystone`` (``make keystone-env``, which
``make test`` builds), on a SQLite database in a scratch directory: ``keystone-manage``
migrates it, makes the Fernet keys and bootstraps the admin, then waitress serves the
public API on a free loopback port. Berth never imports Keystone: the tests talk to it
over HTTP as Berth's servers do.

Users (password ``secret``), all in the ``Default`` domain:

=========  =============  ==============
user       project        role
=========  =============  ==============
admin      admin          admin
alice      demo           reader
bob        demo           member
carol      other          member
berth      service        service (the servers' own credentials)
=========  =============  ==============
"""

from __future__ import annotations

import atexit
import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from berth.service.localcluster import free_port
from peers import ROOT, missing, serve, stop, wait_up

VENV = ROOT / ".venv-keystone"
PASSWORD = "secret"
#: user -> (project, role)
USERS = {"alice": ("demo", "reader"), "bob": ("demo", "member"),
         "carol": ("other", "member"), "berth": ("service", "service")}

def available() -> str | None:
    """Why the peer cannot run here, or None."""
    return missing(VENV, "keystone-manage", "keystone-env")


@dataclass
class Keystone:
    """A running Keystone: ``url`` is its ``/v3`` endpoint."""

    workdir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    _ids: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v3"

    def start(self) -> Keystone:
        """A Keystone of its own, made from the session's template (see
        :func:`_template`): its database and keys are copies, its identity endpoint is
        moved to this server's port."""
        template = _template()
        self.workdir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(template / "keystone.sqlite", self.workdir / "keystone.sqlite")
        for keys in ("fernet-keys", "credential-keys"):
            shutil.copytree(template / keys, self.workdir / keys, dirs_exist_ok=True)
        _write_conf(self.workdir)
        self._serve()
        self._ids = json.loads((template / "ids.json").read_text())
        # Keystone writes a user's last_active_at on its first authentication of the day,
        # and on SQLite two such writes at once deadlock: one answers 500 "database is
        # locked" (Nova's services, started side by side, all authenticate as ``berth``
        # at once). One token per user here, one after the other, makes those writes.
        for user in USERS:
            self.token(user)
        admin = {"X-Auth-Token": self.token("admin")}
        with httpx.Client(base_url=self.url, headers=admin, timeout=30) as http:
            for endpoint in http.get("/endpoints").json()["endpoints"]:
                http.patch(f"/endpoints/{endpoint['id']}", json={"endpoint": {
                    "url": self.url}}).raise_for_status()
        return self

    def _serve(self) -> None:
        self.proc = serve(VENV, "keystone", "keystone.wsgi.api", self.port, self.workdir,
                          {"OS_KEYSTONE_CONFIG_DIR": str(self.workdir), "PATH": "/usr/bin:/bin"},
                          self.workdir / "keystone.log")
        wait_up(self.url, self.proc, self.workdir / "keystone.log")

    def stop(self) -> None:
        stop(self.proc)

    # -- tokens and the users of the table above ---------------------------------------
    def token(self, user: str, project: str | None = None) -> str:
        """A project-scoped token of ``user`` (its own project by default)."""
        project = project or ("admin" if user == "admin" else USERS[user][0])
        body = {"auth": {
            "identity": {"methods": ["password"], "password": {"user": {
                "name": user, "domain": {"id": "default"}, "password": PASSWORD}}},
            "scope": {"project": {"name": project, "domain": {"id": "default"}}}}}
        resp = httpx.post(self.url + "/auth/tokens", json=body, timeout=30)
        resp.raise_for_status()
        return resp.headers["X-Subject-Token"]

    def project_id(self, name: str) -> str:
        return self._ids["projects"][name]

    def _populate(self) -> dict[str, dict[str, str]]:
        """The users of the module's table, their projects and roles; the ids made."""
        admin = {"X-Auth-Token": self.token("admin")}
        http = httpx.Client(base_url=self.url, headers=admin, timeout=30)
        roles = {r["name"]: r["id"] for r in http.get("/roles").json()["roles"]}
        if "service" not in roles:
            roles["service"] = http.post("/roles", json={"role": {"name": "service"}}
                                         ).json()["role"]["id"]
        projects = {p["name"]: p["id"] for p in http.get("/projects").json()["projects"]}
        for name in {p for p, _ in USERS.values()} - set(projects):
            projects[name] = http.post("/projects", json={"project": {
                "name": name, "domain_id": "default"}}).json()["project"]["id"]
        for user, (project, role) in USERS.items():
            uid = http.post("/users", json={"user": {
                "name": user, "domain_id": "default", "password": PASSWORD}}).json()["user"]["id"]
            http.put(f"/projects/{projects[project]}/users/{uid}/roles/{roles[role]}"
                     ).raise_for_status()
        http.close()
        return {"projects": projects}

    def add_endpoint(self, name: str, service_type: str, url: str) -> None:
        """List a service in the catalog with a public endpoint in ``RegionOne``."""
        with httpx.Client(base_url=self.url, timeout=30,
                          headers={"X-Auth-Token": self.token("admin")}) as http:
            if http.get("/regions/RegionOne").status_code == 404:
                http.post("/regions", json={"region": {"id": "RegionOne"}}).raise_for_status()
            service = http.post("/services", json={"service": {
                "name": name, "type": service_type}})
            service.raise_for_status()
            http.post("/endpoints", json={"endpoint": {
                "service_id": service.json()["service"]["id"], "interface": "public",
                "region_id": "RegionOne", "url": url}}).raise_for_status()

    def authtoken_section(self) -> str:
        """``[keystone_authtoken]`` for a server that validates tokens as ``berth``."""
        return ("[keystone_authtoken]\n"
                f"www_authenticate_uri = {self.url}\n"
                f"auth_url = {self.url}\n"
                "auth_type = password\n"
                "interface = public\n"
                "username = berth\n"
                f"password = {PASSWORD}\n"
                "project_name = service\n"
                "user_domain_name = Default\n"
                "project_domain_name = Default\n"
                "service_token_roles_required = true\n")


def _write_conf(workdir: Path) -> None:
    """``keystone.conf`` of a Keystone in ``workdir``: SQLite, Fernet tokens."""
    keys, creds = workdir / "fernet-keys", workdir / "credential-keys"
    keys.mkdir(exist_ok=True)
    creds.mkdir(exist_ok=True)
    (workdir / "keystone.conf").write_text(
        "[database]\n"
        f"connection = sqlite:///{workdir}/keystone.sqlite\n"
        "[token]\nprovider = fernet\n"
        f"[fernet_tokens]\nkey_repository = {keys}\n"
        f"[fernet_receipts]\nkey_repository = {keys}\n"
        f"[credential]\nkey_repository = {creds}\n")


_TEMPLATE: Path | None = None


def _template() -> Path:
    """keystone-manage's work and the users of the table, done once per test session:
    ``keystone-manage`` migrates a database, makes the Fernet and credential keys and
    bootstraps the admin, then a server adds the users. Each :class:`Keystone` starts
    from a copy (four ``keystone-manage`` runs cost ~12 s a Keystone on this machine).
    Removed when the session ends."""
    global _TEMPLATE
    if _TEMPLATE is not None:
        return _TEMPLATE
    work = Path(tempfile.mkdtemp(prefix="berth-keystone-template-"))
    atexit.register(shutil.rmtree, work, True)
    _write_conf(work)
    seed = Keystone(work)
    manage = [str(VENV / "bin" / "keystone-manage"), "--config-file", str(work / "keystone.conf")]
    with open(work / "keystone.log", "ab") as log:
        for step in (["db_sync"],
                     ["fernet_setup", "--keystone-user", "root", "--keystone-group", "root"],
                     ["credential_setup", "--keystone-user", "root", "--keystone-group", "root"],
                     ["bootstrap", "--bootstrap-password", PASSWORD,
                      "--bootstrap-public-url", seed.url]):
            subprocess.run([*manage, *step], check=True, stdout=log, stderr=log, timeout=120)
    seed._serve()
    try:
        ids = seed._populate()
    finally:
        seed.stop()
    (work / "ids.json").write_text(json.dumps(ids))
    _TEMPLATE = work
    return work
