"""Remembered policy decisions: asked once per (rule, target, credentials) while the rules
stay the same; a policy file that changes on disk takes effect at the next request, and
rules that ask a remote server are asked every time."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from oslo_policy import policy as oslo_policy

from berth.errors import ConfigError
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


def _reader_policy(tmp_path: Path) -> tuple[PolicyEnforcer, Path, list[float]]:
    """An enforcer on a policy file that lets readers read, with a clock of its own."""
    path = tmp_path / "policy.yaml"
    path.write_text('"thing:read": "role:reader"\n')
    enforcer = PolicyEnforcer(RULES, mode="legacy", policy_file=str(path))
    clock = [0.0]
    enforcer.clock = lambda: clock[0]
    return enforcer, path, clock


def test_a_changed_policy_file_takes_effect(tmp_path: Path) -> None:
    enforcer, path, clock = _reader_policy(tmp_path)
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


def _touch(path: Path, text: str, step: int) -> None:
    path.write_text(text)
    later = path.stat().st_mtime + 10 * step
    os.utime(path, (later, later))


@pytest.mark.parametrize("bad", ["- a list\n", "x: [unclosed\n", "\"thing:read\": 5\n"])
def test_a_policy_file_broken_by_an_edit_keeps_the_rules_before_it(
        tmp_path: Path, bad: str, caplog: pytest.LogCaptureFixture) -> None:
    """A running server whose policy file an operator breaks: the first request after
    the edit answered 500 (oslo.policy's error), the later ones used the old rules with
    nothing said. Now every request keeps the old rules, one error line says why, and
    the file's next good version takes effect."""
    enforcer, path, clock = _reader_policy(tmp_path)
    assert enforcer.allowed("thing:read", READER, {"project_id": "p1"})
    _touch(path, bad, 1)
    for step in range(1, 4):
        clock[0] = step * RELOAD_EVERY
        assert enforcer.allowed("thing:read", READER, {"project_id": "p1"})
        assert not enforcer.allowed("thing:read", MEMBER, {"project_id": "p1"})
    errors = [r for r in caplog.records if "cannot be read after a change" in r.getMessage()]
    assert len(errors) == 1 and "stay in force until it is fixed" in errors[0].getMessage()
    _touch(path, '"thing:read": "role:member"\n', 2)
    clock[0] = 10 * RELOAD_EVERY
    assert enforcer.allowed("thing:read", MEMBER, {"project_id": "p1"})
    assert not enforcer.allowed("thing:read", READER, {"project_id": "p1"})


def test_a_policy_file_that_is_no_mapping_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match=r"not a policy document \(expected a mapping of "
                       r"rule names to rules\)"):
        PolicyEnforcer(RULES, mode="legacy", policy_file=str(path))


def test_remote_checks_are_never_remembered(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text('"thing:read": "role:reader or http://127.0.0.1:9/check"\n')
    enforcer = PolicyEnforcer(RULES, mode="legacy", policy_file=str(path))
    asked = _counting(enforcer, monkeypatch)
    for _ in range(3):
        assert enforcer.allowed("thing:read", READER, {"project_id": "p1"})
    assert len(asked) == 3
