"""Run Placement's own gabbi suite (the YAML files shipped with Placement 16) against a
live server: Berth's ``berth placement serve``, or the real Placement as a control.

Runs with the Python of ``.venv-placement`` (Placement, gabbi and the suite's fixtures
live there; Berth is only a server process it talks to over HTTP)::

    .venv-placement/bin/python tests/peers/gabbi_run.py --berth .venv/bin/berth
    .venv-placement/bin/python tests/peers/gabbi_run.py --placement   # the control

For each YAML file: Placement's fixture for it runs in process, on its own in-memory
database, as in Placement's suite; what it created (resource classes, traits,
providers with inventories, traits, aggregates and generations, consumers with their
allocations, generations) is read back through Placement's own WSGI app and written to
a fresh target server over HTTP, in the same order, so internal ids, generations (where
the writes can be split to reach them) and the environment variables the YAML uses
(``$ENVIRON['RP_UUID']`` ...) agree; the target runs with the fixture's policy mode and
CORS settings. The real Placement run through this same replay (``--placement``) is
the control. Then gabbi runs the YAML
against the target. Prints the totals and writes the failures as JSON.

With ``--postgresql ADMIN_URL`` (``postgresql://postgres@127.0.0.1:5432/test``), each
Berth target runs on a fresh PostgreSQL database instead of SQLite (made and dropped
with ``psql``), the database whose write paths differ::

    make placement-gabbi GABBI_DB="--postgresql postgresql://postgres@127.0.0.1:5432/test"
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import types
import unittest
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

#: Numbers the target servers of one run.
_SERVERS = itertools.count()

# This directory holds placement.py (the peer helper), which would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

#: The real stdout: the suite's fixtures capture sys.stdout while they run.
OUT = sys.__stdout__

#: ``--postgresql``: the admin URL databases are made with, and the databases made.
PG_ADMIN: str | None = None
_PG_DATABASES: list[str] = []


def _psql(sql: str) -> None:
    assert PG_ADMIN is not None
    subprocess.run(["psql", PG_ADMIN, "-v", "ON_ERROR_STOP=1", "-q", "-c", sql], check=True,
                   stdout=subprocess.DEVNULL)


def _fresh_pg_database(tag: str) -> str:
    """A new database for one target, as a SQLAlchemy URL (dropped at the end)."""
    assert PG_ADMIN is not None
    name = "berth_gabbi_" + tag.replace("-", "_")
    _psql(f'CREATE DATABASE "{name}"')
    _PG_DATABASES.append(name)
    return "postgresql+psycopg://" + PG_ADMIN.split("://", 1)[1].rsplit("/", 1)[0] + "/" + name


def _drop_pg_databases() -> None:
    for name in _PG_DATABASES:
        _psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
              f"WHERE datname = '{name}'")
        _psql(f'DROP DATABASE IF EXISTS "{name}"')
    _PG_DATABASES.clear()
HEADERS = {"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.39",
           "Accept": "application/json", "Content-Type": "application/json"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ----------------------------------------------------------------- reading the fixture
def _wsgi_get(app: Any, path: str) -> Any:
    import webob

    req = webob.Request.blank(path, headers=HEADERS)
    resp = req.get_response(app)
    assert resp.status_int == 200, (path, resp.status, resp.text)
    return json.loads(resp.body)


def export_state(conf: Any) -> dict[str, Any]:
    """Everything the fixture created, read through Placement's own app."""
    from placement import deploy

    app = deploy.loadapp(conf)
    state: dict[str, Any] = {}
    state["classes"] = [c["name"] for c in _wsgi_get(app, "/resource_classes")["resource_classes"]
                        if c["name"].startswith("CUSTOM_")]
    state["traits"] = _wsgi_get(app, "/traits?name=startswith:CUSTOM_")["traits"]
    providers = _wsgi_get(app, "/resource_providers")["resource_providers"]
    out = []
    consumers: dict[str, Any] = {}
    for p in providers:
        u = p["uuid"]
        inv = _wsgi_get(app, f"/resource_providers/{u}/inventories")["inventories"]
        traits = _wsgi_get(app, f"/resource_providers/{u}/traits")["traits"]
        aggs = _wsgi_get(app, f"/resource_providers/{u}/aggregates")["aggregates"]
        allocs = _wsgi_get(app, f"/resource_providers/{u}/allocations")["allocations"]
        for consumer in allocs:
            if consumer not in consumers:
                consumers[consumer] = _wsgi_get(app, f"/allocations/{consumer}")
        out.append({"uuid": u, "name": p["name"], "parent": p["parent_provider_uuid"],
                    "generation": p["generation"], "inventories": inv, "traits": traits,
                    "aggregates": aggs})
    state["providers"] = out
    state["consumers"] = consumers
    return state


# ----------------------------------------------------------------- writing the target
def _call(base: str, method: str, path: str, body: Any = None, mv: str = "1.39") -> Any:
    data = json.dumps(body).encode() if body is not None else None
    headers = {**HEADERS, "OpenStack-API-Version": f"placement {mv}"}
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw = resp.read()
            return json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{method} {path}: {exc.code} {exc.read()[:300]!r}") from None


def import_state(base: str, state: dict[str, Any], extra: dict[str, int] | None = None) -> None:
    """Write ``state`` to the target. ``extra[uuid]`` more writes bring a provider's
    generation to the fixture's: its inventories, traits and aggregates written a part
    at a time (one more write each), then an aggregate set and unset (two)."""
    for name in state["classes"]:
        _call(base, "PUT", f"/resource_classes/{name}")
    for name in state["traits"]:
        _call(base, "PUT", f"/traits/{name}")
    for p in state["providers"]:
        body = {"uuid": p["uuid"], "name": p["name"]}
        if p["parent"]:
            body["parent_provider_uuid"] = p["parent"]
        _call(base, "POST", "/resource_providers", body)
        more = (extra or {}).get(p["uuid"], 0)
        path = f"/resource_providers/{p['uuid']}"
        gen = 0
        for key, items in (("inventories", p["inventories"]), ("traits", p["traits"]),
                           ("aggregates", p["aggregates"])):
            if not items:
                continue
            names = list(items)
            parts = min(len(names), 1 + max(0, more))
            more -= parts - 1
            for k in range(1, parts + 1):
                chunk = names[: len(names) * k // parts]
                value = {n: items[n] for n in chunk} if key == "inventories" else chunk
                gen = _call(base, "PUT", f"{path}/{key}", {
                    "resource_provider_generation": gen, key: value}
                )["resource_provider_generation"]
        while more >= 2:  # a passing aggregate: set, then unset
            spare = "00000000-0000-4000-8000-00000000beef"
            for value in ([*p["aggregates"], spare], p["aggregates"]):
                gen = _call(base, "PUT", f"{path}/aggregates", {
                    "resource_provider_generation": gen, "aggregates": value}
                )["resource_provider_generation"]
            more -= 2
    for consumer, data in state["consumers"].items():
        body = {"allocations": {u: {"resources": a["resources"]}
                                for u, a in data["allocations"].items()},
                "project_id": data["project_id"], "user_id": data["user_id"],
                "consumer_generation": None}
        # A consumer of no type ("unknown") is written below 1.38, as it was made.
        kind = data.get("consumer_type")
        mv = "1.39" if kind and kind != "unknown" else "1.37"
        if mv == "1.39":
            body["consumer_type"] = kind
        _call(base, "PUT", f"/allocations/{consumer}", body, mv)
        for _ in range(20):  # a rewrite of the same allocations bumps the generation
            current = _call(base, "GET", f"/allocations/{consumer}")["consumer_generation"]
            if current >= data["consumer_generation"]:
                break
            body["consumer_generation"] = current
            _call(base, "PUT", f"/allocations/{consumer}", body, mv)


def generation_gaps(base: str, state: dict[str, Any]) -> dict[str, int]:
    """How many writes each provider is short of the fixture's generation."""
    gaps = {}
    for p in state["providers"]:
        now = _call(base, "GET", f"/resource_providers/{p['uuid']}")["generation"]
        if now < p["generation"]:
            gaps[p["uuid"]] = p["generation"] - now
    return gaps


# ----------------------------------------------------------------- the target servers
def start_target(kind: str, berth: str | None, workdir: Path, flags: list[str]) -> tuple[Any, str]:
    port = free_port()
    log = open(workdir / f"target-{port}.log", "wb")  # noqa: SIM115
    # A port can come round again: each server gets a database of its own all the same.
    tag = f"{port}-{next(_SERVERS)}"
    if kind == "berth":
        assert berth is not None
        db = (_fresh_pg_database(tag) if PG_ADMIN is not None
              else f"sqlite:///{workdir}/berth-{tag}.sqlite")
        cmd = [berth, "placement", "serve", "--auth-strategy", "noauth2",
               "--noauth2-trust-client-roles", "--port", str(port), "--db", db, *flags]
        proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    else:
        confdir = workdir / f"placement-{tag}"
        confdir.mkdir()
        conf = confdir / "placement.conf"
        mode = "true" if "secure-rbac" in flags else "false"
        policy = cors = ""
        if "open" in flags:  # OpenPolicyFixture: every rule but admin_api is "@"
            from placement import policies

            rules = {r.name: "@" for r in policies.list_rules() if r.name != "admin_api"}
            (confdir / "policy.json").write_text(json.dumps(rules))
            policy = f"policy_file = {confdir / 'policy.json'}\n"
        if "--cors-origin" in flags:
            cors = f"[cors]\nallowed_origin = {flags[flags.index('--cors-origin') + 1]}\n"
        conf.write_text(f"[api]\nauth_strategy = noauth2\n[placement_database]\nconnection = "
                        f"sqlite:///{workdir}/placement-{tag}.sqlite\n[oslo_policy]\n"
                        f"enforce_new_defaults = {mode}\n{policy}{cors}")
        subprocess.run([str(Path(sys.executable).parent / "placement-manage"), "--config-file",
                        str(conf), "db", "sync"], check=True, stdout=log, stderr=log)
        code = ("import sys; sys.argv=['placement']\n"
                "from placement.wsgi.api import application\nimport waitress\n"
                f"waitress.serve(application, host='127.0.0.1', port={port})")
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=log,
                                env={**os.environ, "OS_PLACEMENT_CONFIG_DIR": str(confdir)})
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(base + "/", timeout=1).read()
            return proc, base
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"target exited: {log.name}") from None
            time.sleep(0.1)
    raise RuntimeError("target did not start")


def target_flags(fixture_names: list[str]) -> list[str]:
    flags: list[str] = []
    if "SecureRBACPolicyFixture" in fixture_names:
        flags += ["--policy", "secure-rbac"]
    elif "OpenPolicyFixture" in fixture_names:
        flags += ["--policy", "open"]
    if "CORSFixture" in fixture_names:
        flags += ["--cors-origin", "http://valid.example.com", "--cors-allow-header",
                  "openstack-api-version"]
    return flags


# ----------------------------------------------------------------- one YAML file
def run_file(path: Path, kind: str, berth: str | None, workdir: Path) -> tuple[int, int, list]:
    import yaml
    from gabbi import driver
    from gabbi import fixture as gfixture
    from placement.tests.functional.fixtures import gabbits as real

    doc = yaml.safe_load(path.read_text())
    names = doc.get("fixtures") or []
    # The fixture runs here, in process, on its own database.
    before = dict(os.environ)
    started = []
    for name in names:
        fx = getattr(real, name)()
        fx.start_fixture()
        started.append(fx)
    api = next((f for f in started if hasattr(f, "conf_fixture")), None)
    state = export_state(api.conf_fixture.conf) if api is not None else None
    env = {k: v for k, v in os.environ.items() if before.get(k) != v}
    for fx in reversed(started):
        fx.stop_fixture()
    os.environ.clear()
    os.environ.update(before)

    proc, base = start_target(kind, berth, workdir, target_flags(names))
    try:
        if state is not None:
            import_state(base, state)
            gaps = generation_gaps(base, state)
            if gaps:  # once more, on a fresh server, with the writes that were missing
                proc.terminate()
                proc.wait(timeout=30)
                proc, base = start_target(kind, berth, workdir, target_flags(names))
                import_state(base, state, gaps)

        class Replay(gfixture.GabbiFixture):
            def start_fixture(self) -> None:
                os.environ.update(env)

            def stop_fixture(self) -> None:
                for key in env:
                    os.environ.pop(key, None)
                os.environ.update({k: v for k, v in before.items() if k in env})

        module = types.ModuleType("replayed_fixtures")
        for name in names:
            setattr(module, name, type(name, (Replay,), {}))
        single = workdir / "one"
        single.mkdir(exist_ok=True)
        for old in single.iterdir():
            old.unlink()
        (single / path.name).write_text(path.read_text())
        port = int(base.rsplit(":", 1)[1])
        suite = driver.build_tests(str(single), unittest.TestLoader(), host="127.0.0.1",
                                   port=port, fixture_module=module,
                                   test_loader_name="placement_gabbi")
        result = unittest.TestResult()
        suite.run(result)
        failures = [(str(t), tb.splitlines()[-1][:400]) for t, tb in result.failures + result.errors]
        return result.testsRun, len(failures), failures
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--berth", help="the berth executable (target: berth placement serve)")
    which.add_argument("--placement", action="store_true", help="target: the real Placement")
    parser.add_argument("--only", action="append", default=[], help="run these YAML files")
    parser.add_argument("--failures", help="write the failures here (JSON)")
    parser.add_argument("--postgresql", metavar="ADMIN_URL",
                        help="Berth targets on fresh PostgreSQL databases made through "
                             "this libpq URL (default: SQLite)")
    args = parser.parse_args()
    global PG_ADMIN
    PG_ADMIN = args.postgresql
    import placement.tests.functional as functional

    gabbits = Path(functional.__file__).parent / "gabbits"
    files = sorted(gabbits.glob("*.yaml"))
    if args.only:
        files = [f for f in files if f.name in args.only]
    kind = "placement" if args.placement else "berth"
    total = failed = 0
    all_failures: list = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for path in files:
                ran, bad, failures = run_file(path, kind, args.berth, Path(tmp))
                total += ran
                failed += bad
                all_failures += failures
                print(f"{path.name}: {ran - bad}/{ran}", file=OUT, flush=True)
        finally:
            if PG_ADMIN is not None:
                _drop_pg_databases()
    where = " on PostgreSQL" if PG_ADMIN is not None and kind == "berth" else ""
    print(f"TOTAL {kind}{where}: {total - failed}/{total} passed", file=OUT, flush=True)
    if args.failures:
        Path(args.failures).write_text(json.dumps(all_failures, indent=1))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        import traceback

        traceback.print_exc(file=sys.__stderr__)
        sys.exit(1)
