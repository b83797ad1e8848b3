"""The authentication and policy options of every API server's command line."""

from __future__ import annotations

import argparse

STRATEGIES = ("keystone", "noauth2")
#: The policy modes (:class:`berth.webauth.rules.PolicyMode`).
MODES = ("legacy", "secure-rbac", "open")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--auth-strategy``, ``--noauth2-trust-client-roles``, ``--policy``,
    ``--policy-file`` (each overrides its config-file option)."""
    parser.add_argument("--auth-strategy", choices=STRATEGIES, default=None,
                        help="keystone or noauth2 (default [api] auth_strategy, else "
                             "keystone); noauth2 is for development")
    parser.add_argument("--noauth2-trust-client-roles", action="store_true", default=None,
                        help="noauth2 only: believe the X-Roles, X-Project-Id and "
                             "OpenStack-System-Scope headers clients send")
    parser.add_argument("--policy", choices=MODES, default=None,
                        help="rule set: legacy, secure-rbac or open (default: [oslo_policy] "
                             "enforce_new_defaults, else legacy)")
    parser.add_argument("--policy-file", default=None,
                        help="oslo.policy file overriding rules (default [oslo_policy] "
                             "policy_file)")
