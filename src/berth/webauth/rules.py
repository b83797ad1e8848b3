"""What a caller may do: oslo.policy over an API's default rules.

Each API declares its rules as oslo.policy ``RuleDefault``s (Placement's in
:mod:`berth.placement.policy`, the scheduler API's in :mod:`berth.service.policy`), each
new default with the deprecated legacy rule it replaced. A deployment picks a mode at
start-up, and an operator's policy file (YAML or JSON, oslo.policy's format) overrides
any rule by name:

* ``legacy``: ``[oslo_policy] enforce_new_defaults = False``: a rule passes on its new
  default or on its deprecated one (what Placement's own functional tests run);
* ``secure-rbac``: ``enforce_new_defaults = True``: the new defaults only;
* ``open``: every rule but ``admin_api`` passes for any authenticated caller.

oslo.policy always enforces ``scope_types``: every rule of both APIs is scoped to
``project``, so a system-scoped token is refused (403).

Without ``--policy`` the mode comes from the config files' ``[oslo_policy]
enforce_new_defaults``; when they do not set it Berth runs ``legacy`` (oslo.policy's own
default is the new rules: a deliberate deviation, see docs/architecture.md).
"""

from __future__ import annotations

import logging
import os
import re
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any

from oslo_config import cfg
from oslo_policy import policy as oslo_policy

from berth.errors import ConfigError
from berth.webauth.identity import Caller

LOG = logging.getLogger(__name__)

ADMIN = "role:admin"
SERVICE = "role:service"
ADMIN_OR_SERVICE = "role:admin or role:service"
#: The shared base rules of both APIs.
BASE_RULES = (
    oslo_policy.RuleDefault("admin_api", ADMIN, "Default rule for most admin APIs."),
    oslo_policy.RuleDefault("service_api", SERVICE, "Default rule for service-to-service APIs."),
    oslo_policy.RuleDefault("admin_or_service_api", ADMIN_OR_SERVICE,
                            "Default rule for admin or service APIs."),
)


class PolicyMode(StrEnum):
    """The rule set chosen at start-up."""

    LEGACY = "legacy"
    SECURE_RBAC = "secure-rbac"
    OPEN = "open"


class Forbidden(Exception):
    """The policy refused a rule; ``rule`` names it."""

    def __init__(self, rule: str) -> None:
        super().__init__(f"Policy does not allow {rule} to be performed.")
        self.rule = rule


def rule(name: str, check: str, description: str, operations: Sequence[tuple[str, str]],
         deprecated: str | None = None, since: str = "Wallaby") -> oslo_policy.RuleDefault:
    """One documented, project-scoped rule; ``deprecated`` is the legacy check it replaced."""
    old = None
    if deprecated is not None:
        old = oslo_policy.DeprecatedRule(
            name, deprecated, deprecated_since=since,
            deprecated_reason="The API now knows the reader, member and service roles.")
    return oslo_policy.DocumentedRuleDefault(
        name, check, description, [{"path": p, "method": m} for m, p in operations],
        scope_types=["project"], deprecated_rule=old)


#: Remembered policy decisions per enforcer (the lot is dropped when full).
_DECISIONS_KEPT = 4096
#: Seconds between two looks at the policy files (oslo.policy stats every directory it
#: searches on each look: a fifth of a Placement write's CPU when done per request).
RELOAD_EVERY = 1.0
#: A rule that asks a remote server: its decisions are never remembered.
_REMOTE_CHECK = re.compile(r"\bhttps?:")


def _decision_key(rule_name: str, target: Mapping[str, Any],
                  creds: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """A hashable form of one question to the policy; None when a value is not plain."""
    def plain(value: Any) -> Any:
        if isinstance(value, list | tuple):
            return tuple(plain(v) for v in value)
        if value is None or isinstance(value, str | int | float | bool):
            return value
        raise TypeError
    try:
        return (rule_name, tuple(sorted((k, plain(v)) for k, v in target.items())),
                tuple(sorted((k, plain(v)) for k, v in creds.items())))
    except TypeError:
        return None


def _problem(exc: Exception) -> str:
    """What is wrong with a policy file, from oslo.policy's (or the parser's) error."""
    if isinstance(exc, AttributeError):  # oslo.policy reads a list or a scalar as a mapping
        return "not a policy document (expected a mapping of rule names to rules)"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


class PolicyEnforcer:
    """oslo.policy's Enforcer over one API's rules, loaded and checked at start-up."""

    def __init__(self, defaults: Sequence[oslo_policy.RuleDefault], *,
                 mode: PolicyMode | str | None = None, policy_file: str | None = None,
                 config_files: Sequence[str] = (), also_known: Iterable[str] = ()) -> None:
        """``also_known``: rule names of the other API sharing the policy file (not
        warned about as unknown here)."""
        conf = cfg.ConfigOpts()
        try:
            conf([], project="berth", default_config_files=list(config_files), use_env=False)
        except cfg.Error as exc:
            raise ConfigError(f"cannot read configuration: {exc}") from None
        self.mode = PolicyMode(mode) if mode is not None else None
        if self.mode is PolicyMode.OPEN:
            defaults = [d if d.name == "admin_api" else oslo_policy.RuleDefault(
                d.name, "@", d.description) for d in defaults]
        enforcer = oslo_policy.Enforcer(conf, policy_file=policy_file)
        enforcer.register_defaults(list(defaults))
        new_defaults = self.mode is PolicyMode.SECURE_RBAC
        if self.mode is None:
            # The files decide; unset, Berth keeps the legacy rules.
            conf.set_default("enforce_new_defaults", False, group="oslo_policy")
            new_defaults = conf.oslo_policy.enforce_new_defaults
            self.mode = PolicyMode.SECURE_RBAC if new_defaults else PolicyMode.LEGACY
        else:
            conf.set_override("enforce_new_defaults", new_defaults, group="oslo_policy")
        path = policy_file or conf.oslo_policy.policy_file
        explicit = policy_file is not None or conf.oslo_policy.policy_file != "policy.yaml"
        if explicit:
            found = path if os.path.isabs(path) else conf.find_file(path)
            if not found or not os.path.isfile(found):
                raise ConfigError(f"[oslo_policy] policy_file: {path}: no such file")
            self.policy_file: str | None = found
        else:
            self.policy_file = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # each deprecated rule warns once, by design
                enforcer.load_rules()
                enforcer.check_rules(raise_on_violation=True)
        except oslo_policy.InvalidDefinitionError as exc:
            raise ConfigError(f"policy file {self.policy_file}: {exc}") from None
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"policy file {self.policy_file}: not a policy document "
                              f"({str(exc).splitlines()[0]})") from None
        except AttributeError as exc:
            raise ConfigError(f"policy file {self.policy_file}: {_problem(exc)}") from None
        except Exception as exc:  # yaml and json errors, unreadable files
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(f"policy file {self.policy_file}: {first}") from None
        known = {d.name for d in defaults} | set(also_known)
        for name in sorted(set(enforcer.file_rules) - known):
            LOG.warning("policy file %s: rule %r is not one of this API's rules (ignored)",
                        self.policy_file, name)
        self._enforcer = enforcer
        #: The clock of :data:`RELOAD_EVERY` (seconds; monotonic).
        self.clock = time.monotonic
        self._next_look = 0.0
        self._rules_seen: Any = None
        self._cacheable = False
        self._decisions: dict[tuple[Any, ...], bool] = {}

    def allowed(self, rule_name: str, caller: Caller, target: Mapping[str, Any]) -> bool:
        """Whether ``caller`` may perform ``rule_name`` on ``target``.

        A decision is a pure function of the rules, the target and the credentials, so
        it is remembered until the rules change (oslo.policy re-reads a policy file
        whose modification time moved; Berth has it look at most every
        :data:`RELOAD_EVERY` seconds); never when a rule asks a remote server
        (``http:``/``https:`` checks). oslo.policy's evaluation costs about half a
        millisecond a request, more than a write of the Placement API's hot paths."""
        creds = caller.creds()
        enforcer = self._enforcer
        now = self.clock()
        if now >= self._next_look:
            self._next_look = now + RELOAD_EVERY
            try:
                enforcer.load_rules()
            except Exception as exc:  # noqa: BLE001 - an edit of the file, not a request's fault
                # oslo.policy has taken the file's new text as read: the rules loaded
                # before stay in force (said once per such edit) until the next edit.
                LOG.error("policy file %s: cannot be read after a change (%s); the rules "
                          "loaded before stay in force until it is fixed",
                          self.policy_file or "in [oslo_policy] policy_dirs", _problem(exc))
        if enforcer.rules is not self._rules_seen:
            self._rules_seen = enforcer.rules
            self._decisions.clear()
            self._cacheable = not any(_REMOTE_CHECK.search(str(rule))
                                      for rule in enforcer.rules.values())
        key = _decision_key(rule_name, target, creds) if self._cacheable else None
        if key is not None:
            known = self._decisions.get(key)
            if known is not None:
                return known
        try:
            decision = bool(enforcer.authorize(rule_name, dict(target), creds, do_raise=False))
        except oslo_policy.InvalidScope:
            decision = False
        if key is not None:
            if len(self._decisions) >= _DECISIONS_KEPT:
                self._decisions.clear()
            self._decisions[key] = decision
        return decision

    def enforce(self, rule_name: str, caller: Caller, target: Mapping[str, Any]) -> None:
        """Raise :class:`Forbidden` unless ``caller`` may perform ``rule_name``."""
        if not self.allowed(rule_name, caller, target):
            raise Forbidden(rule_name)
