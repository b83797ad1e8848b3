"""Remembered policy decisions: asked once per (rule, target, credentials) while the rules
stay the same; a policy file that changes on disk takes effect at the next request, and
rules that ask a remote server are asked every time."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from oslo_policy import policy as oslo_policy

from berth.webauth.identity import Caller
from berth.webauth.rules import RELOAD_EVERY, PolicyEnforcer

RULES = [
    oslo_policy.RuleDefault("admin_api", "role:admin"),
    oslo_policy.RuleDefault("thing:read", "role:reader or rule:admin_api"),
]
READER = Caller(user_id="alice", project_id="p1", roles=["reader"])
MEMBER = Caller(user_id="bob", project_id="p1", roles=["member"])


def _counting(enforcer: PolicyEnforcer, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    asked: list[str] = []
    real = enforcer._enforcer.authorize

    def authorize(rule: str, *args: Any, **kwargs: Any) -> Any:
        asked.append(rule)
        return real(rule, *args, **kwargs)

    monkeypatch.setattr(enforcer._enforcer, "authorize", authorize)
    return asked


def test_a_decision_is_asked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    enforcer = PolicyEnforcer(RULES, mode="legacy")
    asked = _counting(enforcer, monkeypatch)
    for _ in range(5):
        assert enforcer.allowed("thing:read", READER, {"project_id": "p1"})
        assert not enforcer.allowed("thing:read", MEMBER, {"project_id": "p1"})
    assert asked == ["thing:read", "thing:read"]
    # Another target or other credentials are other questions.
    assert enforcer.allowed("thing:read", READER, {"project_id": "p2"})
    assert enforcer.allowed("thing:read", Caller("alice", "p1", ["reader", "member"]),
                            {"project_id": "p1"})
    assert len(asked) == 4


def test_a_changed_policy_file_takes_effect(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text('"thing:read": "role:reader"\n')
    enforcer = PolicyEnforcer(RULES, mode="legacy", policy_file=str(path))
    clock = [0.0]
    enforcer.clock = lambda: clock[0]
    assert enforcer.allowed("thing:read", READER, {"project_id": "p1"})
    assert not enforcer.allowed("thing:read", MEMBER, {"project_id": "p1"})
    path.write_text('"thing:read": "role:member"\n')
    later = path.stat().st_mtime + 10
    os.utime(path, (later, later))
    clock[0] = RELOAD_EVERY / 2  # the files are looked at once a RELOAD_EVERY
    assert enforcer.allowed("thing:read", READER, {"project_id": "p1"})
    clock[0] = RELOAD_EVERY
    assert not enforcer.allowed("thing:read", READER, {"project_id": "p1"})
    assert enforcer.allowed("thing:read", MEMBER, {"project_id": "p1"})


def test_remote_checks_are_never_remembered(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text('"thing:read": "role:reader or http://127.0.0.1:9/check"\n')
    enforcer = PolicyEnforcer(RULES, mode="legacy", policy_file=str(path))
    asked = _counting(enforcer, monkeypatch)
    for _ in range(3):
        assert enforcer.allowed("thing:read", READER, {"project_id": "p1"})
    assert len(asked) == 3
