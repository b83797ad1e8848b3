"""The scheduler API's authorization rules, as oslo.policy defaults (Berth's own names,
overridable by name in a policy file like Placement's).

=============================  ==========================================================
rule                           default (legacy fallback: ``rule:admin_api``)
=============================  ==========================================================
berth:boot:create              admin or service, or a member of the project booted for
berth:hosts:list               admin or service (GET /hosts, /compute-nodes, /aggregates,
                               /cells)
berth:hosts:drain              admin or service (POST /hosts/{host}/drain: every instance
                               moved off, as Nova's admin-only moves)
berth:server_groups:list       admin or service (every project's groups)
berth:catalog:list             any authenticated caller (GET /flavors, /images)
berth:servers:list             admin or service (every project's instances)
berth:servers:show             admin or service, or a reader of the instance's project
berth:servers:migrate          admin or service (as Nova: cold migration is an admin's)
berth:servers:evacuate         admin or service
berth:servers:live_migrate     admin or service (as Nova's os-migrateLive)
berth:servers:resize           admin or service, or a member of the instance's project
berth:servers:rebuild          admin or service, or a member of the instance's project
berth:servers:confirm_resize   admin or service, or a member of the instance's project
berth:servers:revert_resize    admin or service, or a member of the instance's project
berth:servers:delete           admin or service, or a member of the instance's project
berth:services:list            admin or service (GET /os-services)
berth:services:update          admin or service (PUT /os-services/{host}: disable, enable,
                               force down; Nova's os-services update is an admin's)
berth:services:delete          admin or service (DELETE /os-services/{host})
=============================  ==========================================================

The target is ``{"project_id": ...}``: for a boot, the project it boots for (the body's
``project_id``, else the caller's); for an instance, the project that owns it. Only an
admin or a service may boot for another project. ``GET /healthz`` and ``GET /metrics``
need no token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from oslo_policy import policy as oslo_policy

from berth.webauth.rules import ADMIN_OR_SERVICE, BASE_RULES, rule

if TYPE_CHECKING:
    from berth.webauth.settings import Security

BOOT = "berth:boot:create"
HOSTS = "berth:hosts:list"
HOSTS_DRAIN = "berth:hosts:drain"
SERVER_GROUPS = "berth:server_groups:list"
SERVER_GROUPS_CREATE = "berth:server_groups:create"
WHAT_IF = "berth:what_if:create"
CATALOG = "berth:catalog:list"
SERVERS_LIST = "berth:servers:list"
SERVERS_SHOW = "berth:servers:show"
SERVERS_DELETE = "berth:servers:delete"
SERVICES_LIST = "berth:services:list"
SERVICES_UPDATE = "berth:services:update"
SERVICES_DELETE = "berth:services:delete"

LEGACY = "rule:admin_api"
_MEMBER = f"{ADMIN_OR_SERVICE} or (role:member and project_id:%(project_id)s)"
_READER = f"{ADMIN_OR_SERVICE} or (role:reader and project_id:%(project_id)s)"

#: The rule of each ``POST /servers/{uuid}/{action}``.
MOVE_RULES = {
    "migrate": "berth:servers:migrate",
    "evacuate": "berth:servers:evacuate",
    "live-migrate": "berth:servers:live_migrate",
    "resize": "berth:servers:resize",
    "rebuild": "berth:servers:rebuild",
    "confirm-resize": "berth:servers:confirm_resize",
    "revert-resize": "berth:servers:revert_resize",
}
_ADMIN_MOVES = ("migrate", "evacuate", "live-migrate")


def scheduler_rules() -> list[oslo_policy.RuleDefault]:
    """The scheduler API's rule defaults."""
    rules = list(BASE_RULES) + [
        rule(BOOT, _MEMBER, "Schedule and build instances.", [("POST", "/boot")],
             deprecated=LEGACY),
        rule(HOSTS, ADMIN_OR_SERVICE, "List compute hosts, their reports and aggregates.",
             [("GET", "/hosts"), ("GET", "/compute-nodes"), ("GET", "/aggregates"),
              ("GET", "/cells"),
              ("GET", "/decisions"), ("GET", "/capacity"), ("POST", "/capacity")],
             deprecated=LEGACY),
        rule(HOSTS_DRAIN, ADMIN_OR_SERVICE, "Move every instance off a compute host (live "
             "or cold migrations, one after another).", [("POST", "/hosts/{host}/drain")],
             deprecated=LEGACY),
        rule(SERVER_GROUPS, ADMIN_OR_SERVICE, "List every project's server groups.",
             [("GET", "/server-groups")], deprecated=LEGACY),
        rule(WHAT_IF, ADMIN_OR_SERVICE, "Ask what a boot would get now, explained host by "
             "host (nothing is claimed).", [("POST", "/what-if")], deprecated=LEGACY),
        rule(SERVER_GROUPS_CREATE, _MEMBER, "Create a server group in a project.",
             [("POST", "/server-groups")], deprecated=LEGACY),
        rule(CATALOG, "", "List the flavors and images the server knows.",
             [("GET", "/flavors"), ("GET", "/images")]),
        rule(SERVERS_LIST, ADMIN_OR_SERVICE, "List every instance.", [("GET", "/servers")],
             deprecated=LEGACY),
        rule(SERVERS_SHOW, _READER, "Show an instance, its migrations and allocations.",
             [("GET", "/servers/{uuid}")], deprecated=LEGACY),
        rule(SERVERS_DELETE, _MEMBER, "Delete an instance: its allocations go.",
             [("DELETE", "/servers/{uuid}")], deprecated=LEGACY),
        rule(SERVICES_LIST, ADMIN_OR_SERVICE, "List the compute services and their state.",
             [("GET", "/os-services")], deprecated=LEGACY),
        rule(SERVICES_UPDATE, ADMIN_OR_SERVICE, "Disable, enable or force down a compute "
             "service.", [("PUT", "/os-services/{host}")], deprecated=LEGACY),
        rule(SERVICES_DELETE, ADMIN_OR_SERVICE, "Delete a compute service that hosts no "
             "instance: its agents stop, its providers and records go.",
             [("DELETE", "/os-services/{host}")], deprecated=LEGACY),
    ]
    for action, name in MOVE_RULES.items():
        check = ADMIN_OR_SERVICE if action in _ADMIN_MOVES else _MEMBER
        rules.append(rule(name, check, f"{action.capitalize().replace('-', ' ')} an instance.",
                          [("POST", f"/servers/{{uuid}}/{action}")], deprecated=LEGACY))
    return rules


def api_security(args: Any) -> tuple[Security, Security]:
    """The security of a server's scheduler API and of the Placement API it mounts (one
    identity, one policy file for both), from its ``--config-file``, ``--auth-strategy``,
    ``--policy`` ... arguments."""
    from berth.placement.app import placement_rules
    from berth.webauth.settings import security_from_args

    scheduler, placement = security_from_args(args, args.config_file or [], scheduler_rules(),
                                              placement_rules())
    return scheduler, placement
