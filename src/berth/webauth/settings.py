"""Authentication and policy as a server is told at start-up: the config files
(``[api] auth_strategy``, ``[api] noauth2_trust_client_roles``, ``[keystone_authtoken]``,
``[oslo_policy]``) and the command line (which wins).

``[api] auth_strategy`` defaults to ``keystone``, as in Nova and Placement, so a server
with no Keystone configured refuses to start and says how to choose noauth2: running
without real authentication is always asked for by name.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass

from oslo_config import cfg
from oslo_policy import policy as oslo_policy

from berth.errors import ConfigError
from berth.webauth.identity import Identity, Keystone, NoAuth2
from berth.webauth.options import STRATEGIES
from berth.webauth.rules import PolicyEnforcer

API_OPTS = [
    cfg.StrOpt("auth_strategy", default="keystone", choices=STRATEGIES,
               help="How callers are authenticated: keystone (tokens validated by "
                    "keystonemiddleware) or noauth2 (development only)."),
    cfg.BoolOpt("noauth2_trust_client_roles", default=False,
                help="Under noauth2, take the caller's roles, project and system scope from "
                     "the X-Roles, X-Project-Id and OpenStack-System-Scope headers it sends "
                     "(as Placement's functional tests do). Never in production."),
]


@dataclass(frozen=True)
class Security:
    """How one server authenticates (``identity``) and authorizes (``policy``)."""

    identity: Identity
    policy: PolicyEnforcer

    def describe(self) -> str:
        """One line for the start-up log."""
        trust = (" trusting client role headers"
                 if getattr(self.identity, "trust_client_roles", False) else "")
        where = f", policy file {self.policy.policy_file}" if self.policy.policy_file else ""
        return f"auth {self.identity.strategy}{trust}, policy {self.policy.mode}{where}"


def security_from_args(args: argparse.Namespace, config_files: Sequence[str],
                       *rule_sets: Sequence[oslo_policy.RuleDefault]) -> list[Security]:
    """The security of a server's APIs (one per rule set: one identity, one policy file
    for all) from its arguments and config files; ConfigError, one line naming the
    option, on any problem."""
    return build_security(config_files, *rule_sets, strategy=args.auth_strategy,
                          trust_client_roles=args.noauth2_trust_client_roles,
                          mode=args.policy, policy_file=args.policy_file)


def build_security(config_files: Sequence[str], *rule_sets: Sequence[oslo_policy.RuleDefault],
                   strategy: str | None = None, trust_client_roles: bool | None = None,
                   mode: str | None = None, policy_file: str | None = None) -> list[Security]:
    """As :func:`security_from_args`, from plain values (None: the files decide). A
    value oslo.config cannot read (``enforce_new_defaults = maybe``) is a ConfigError."""
    try:
        return _build_security(config_files, *rule_sets, strategy=strategy,
                               trust_client_roles=trust_client_roles, mode=mode,
                               policy_file=policy_file)
    except cfg.ConfigFileValueError as exc:
        text = re.sub(r"from LocationInfo\(.*?detail='([^']*)'\)", r"in \1",
                      _first_line(exc))
        raise ConfigError(text) from None


def _build_security(config_files: Sequence[str], *rule_sets: Sequence[oslo_policy.RuleDefault],
                    strategy: str | None = None, trust_client_roles: bool | None = None,
                    mode: str | None = None, policy_file: str | None = None) -> list[Security]:
    conf = read_conf(config_files)
    strategy = strategy or conf.api.auth_strategy
    trust = conf.api.noauth2_trust_client_roles if trust_client_roles is None else trust_client_roles
    identity: Identity
    if strategy == "noauth2":
        identity = NoAuth2(trust_client_roles=bool(trust))
    else:
        if trust_client_roles:
            raise ConfigError("--noauth2-trust-client-roles: only with --auth-strategy noauth2")
        if not config_files:
            raise ConfigError("[api] auth_strategy = keystone (the default) needs "
                              "[keystone_authtoken] in a --config-file; for development "
                              "without Keystone pass --auth-strategy noauth2")
        identity = Keystone(conf)
    names = {r.name for rules in rule_sets for r in rules}
    return [Security(identity=identity,
                     policy=PolicyEnforcer(rules, mode=mode, policy_file=policy_file,
                                           config_files=config_files, also_known=names))
            for rules in rule_sets]


def read_conf(config_files: Sequence[str]) -> cfg.ConfigOpts:
    """The files as oslo.config reads them, with ``[api]`` registered."""
    conf = cfg.ConfigOpts()
    conf.register_opts(API_OPTS, group="api")
    try:
        conf([], project="berth", default_config_files=list(config_files), use_env=False)
        conf.api.auth_strategy  # noqa: B018 - a bad value is reported here, in one line
    except (cfg.Error, ValueError) as exc:
        raise ConfigError(f"[api] {_first_line(exc)}") from None
    return conf


def _first_line(exc: Exception) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__
