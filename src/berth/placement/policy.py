"""Placement authorization rules in the modes a deployment chooses at start-up (reference 1.8).

* ``legacy``: oslo.policy with ``enforce_new_defaults=False`` (what Placement's own
  functional tests run): admin or service for everything; reshaper admits admin too.
* ``secure-rbac``: the new defaults: admin or service; reshaper is service-only; GET
  /usages also admits a reader of the very project asked about.
* ``open``: every rule passes for any authenticated caller.

Every rule is scoped to ``project``, so a system-scoped token gets 403 in the two
enforcing modes. CORS is orthogonal (a server option), so "cors" is legacy plus CORS.
"""

from __future__ import annotations

from enum import StrEnum

from berth.placement import errors
from berth.placement.web import Context


class PolicyMode(StrEnum):
    """The policy mode chosen at start-up."""

    LEGACY = "legacy"
    SECURE_RBAC = "secure-rbac"
    OPEN = "open"


USAGES = "placement:usages"
RESHAPE = "placement:reshaper:reshape"


def enforce(mode: PolicyMode, rule: str, ctx: Context, target_project: str | None = None) -> None:
    """Raise Forbidden (403, no ``vary``) unless ``ctx`` may perform ``rule``."""
    if _allowed(mode, rule, ctx, target_project):
        return
    raise errors.Forbidden(f"Policy does not allow {rule} to be performed.", outside_handler=True)


def _allowed(mode: PolicyMode, rule: str, ctx: Context, target_project: str | None) -> bool:
    """The decision itself; see the module docstring for the table."""
    if mode is PolicyMode.OPEN:
        return True
    if ctx.system_scope:
        return False
    roles = {r.strip().lower() for r in ctx.roles}
    if rule == RESHAPE:
        if mode is PolicyMode.SECURE_RBAC:
            return "service" in roles
        return bool(roles & {"service", "admin"})
    if roles & {"admin", "service"}:
        return True
    if rule == USAGES:
        return (
            "reader" in roles
            and ctx.project_id is not None
            and target_project is not None
            and ctx.project_id == target_project
        )
    return False
