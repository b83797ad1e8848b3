"""A real client: the osc-placement plugin of ``openstack`` driven against our server.

The CLI authenticates with keystoneauth's ``admin_token`` plugin (a fixed token and
endpoint, no Keystone); the token ``admin`` is noauth2's admin user. All commands run in
one ``openstack`` process (cliff's interactive mode reading stdin) because the CLI takes
seconds to start.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from placement.support import Server

OPENSTACK = Path(sys.executable).parent / "openstack"


def run_batch(server: Server, commands: list[str]) -> list[Any]:
    """Run CLI commands (each with ``-f json``) in one process; their JSON outputs in order."""
    exe = str(OPENSTACK) if OPENSTACK.exists() else shutil.which("openstack")
    if exe is None:
        pytest.skip("the openstack CLI (python-openstackclient + osc-placement) is not installed")
    argv = [
        exe,
        "--os-auth-type",
        "admin_token",
        "--os-token",
        "admin",
        "--os-endpoint",
        server.url,
        "--os-placement-api-version",
        "1.39",
    ]
    script = "".join(f"{c} -f json\n" for c in commands)
    proc = subprocess.run(argv, input=script, capture_output=True, text=True, timeout=120)
    docs: list[Any] = []
    decoder = json.JSONDecoder()
    text = proc.stdout
    pos = 0
    while True:
        starts = [i for i in (text.find("\n{", pos), text.find("\n[", pos)) if i >= 0]
        if not starts:
            break
        start = min(starts) + 1
        try:
            doc, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            pos = start
            continue
        docs.append(doc)
        pos = end
    assert len(docs) == len(commands), (proc.stdout[-3000:], proc.stderr[-3000:])
    return docs


def test_openstack_cli_creates_providers_sets_inventory_traits_and_lists_candidates(
    server: Server,
) -> None:
    rp = str(uuid.uuid4())
    consumer = str(uuid.uuid4())
    name = f"osc-{rp[:8]}"
    docs = run_batch(
        server,
        [
            f"resource provider create {name} --uuid {rp}",
            f"resource provider inventory set {rp} --resource VCPU=8 --resource MEMORY_MB=4096",
            f"resource provider trait set {rp} --trait HW_CPU_X86_AVX --trait HW_CPU_X86_SSE",
            "allocation candidate list --resource VCPU=2 --resource MEMORY_MB=512 "
            "--required HW_CPU_X86_AVX",
            f"resource provider allocation set {consumer} --allocation rp={rp},VCPU=2 "
            f"--project-id proj --user-id user --consumer-type INSTANCE",
            f"resource provider usage show {rp}",
            f"resource provider show {rp}",
        ],
    )
    created, inventory, traits, candidates, allocation, usage, shown = docs
    assert created["uuid"] == rp and created["name"] == name and created["generation"] == 0
    assert {i["resource_class"]: i["total"] for i in inventory} == {"VCPU": 8, "MEMORY_MB": 4096}
    assert sorted(t["name"] for t in traits) == ["HW_CPU_X86_AVX", "HW_CPU_X86_SSE"]
    ours = [c for c in candidates if c["resource provider"] == rp]
    assert len(ours) == 1 and "VCPU=2" in ours[0]["allocation"]
    assert allocation[0]["resource_provider"] == rp
    assert {u["resource_class"]: u["usage"] for u in usage} == {"VCPU": 2, "MEMORY_MB": 0}
    assert shown["generation"] == 3
