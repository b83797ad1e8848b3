"""Placement's authorization rules (reference 1.8), as oslo.policy defaults.

Every rule is ``role:admin or role:service`` under the new defaults, with the legacy
``rule:admin_api`` as its deprecated fallback, except two:

* ``placement:usages`` (GET /usages) also admits a ``reader`` of the very project asked
  about (the ``project_id`` query value is the target);
* ``placement:reshaper:reshape`` is ``role:service`` only under the new defaults (admin
  keeps it under the legacy rules).

The modes, the policy file and scope are :mod:`berth.webauth.rules`'s. A refusal is a
403 ``Policy does not allow <rule> to be performed.`` without ``vary``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from oslo_policy import policy as oslo_policy

from berth.placement import errors
from berth.webauth.identity import Caller
from berth.webauth.rules import ADMIN_OR_SERVICE, BASE_RULES, Forbidden, PolicyEnforcer, rule

USAGES = "placement:usages"
RESHAPE = "placement:reshaper:reshape"
LEGACY = "rule:admin_api"


def placement_rules(operations: Mapping[str, Sequence[tuple[str, str]]]) -> list[
        oslo_policy.RuleDefault]:
    """The rule defaults: ``operations`` maps each rule name to its (method, path) pairs
    (from the route table, so the two cannot disagree)."""
    rules = list(BASE_RULES)
    for name, ops in sorted(operations.items()):
        if name == USAGES:
            check = f"{ADMIN_OR_SERVICE} or (role:reader and project_id:%(project_id)s)"
            rules.append(rule(name, check, "List the total usages of a project or user.",
                              ops, deprecated=LEGACY))
        elif name == RESHAPE:
            rules.append(rule(name, "role:service",
                              "Reshape the inventories and allocations of a provider tree.",
                              ops, deprecated="rule:admin_or_service_api"))
        else:
            what = name.removeprefix("placement:").replace(":", " ").replace("_", " ")
            rules.append(rule(name, ADMIN_OR_SERVICE, f"Placement: {what}.", ops,
                              deprecated=LEGACY))
    return rules


def enforce(enforcer: PolicyEnforcer, rule_name: str, caller: Caller,
            target_project: str | None = None) -> None:
    """Raise Forbidden (403, no ``vary``) unless ``caller`` may perform ``rule_name``."""
    try:
        enforcer.enforce(rule_name, caller, {"project_id": target_project})
    except Forbidden as exc:
        raise errors.Forbidden(str(exc), outside_handler=True) from None
