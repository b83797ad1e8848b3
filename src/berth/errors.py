"""Berth's exception tree, with stable error codes.

Every error a user can see derives from :class:`BerthError`; its ``code`` never changes
once released and is what scripts should match on. CLI exit codes are mapped from the
classes in one place (:data:`EXIT_CODES`, used by :mod:`berth.cli`).

    BerthError                               berth.error
    ├── ConfigError                          berth.config.invalid
    │   └── PluginNotFound                   berth.config.plugin_not_found
    ├── InputError                           berth.input.invalid
    │   ├── CloudFileError                   berth.input.cloud_file
    │   ├── ExtraSpecError                   berth.input.extra_spec
    │   └── SchedulerHintError               berth.input.scheduler_hint
    └── SchedulingError                      berth.scheduling
        ├── NoValidHost                      berth.scheduling.no_valid_host
        ├── UnsupportedPolicy                berth.scheduling.unsupported_policy
        └── MaxRetriesExceeded               berth.scheduling.max_retries_exceeded
"""

from __future__ import annotations

from typing import Any


class BerthError(Exception):
    """Base of every error Berth reports to a user."""

    code = "berth.error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def __str__(self) -> str:
        return self.message


class ConfigError(BerthError):
    """A nova.conf option, a plugin path or a config file is invalid."""

    code = "berth.config.invalid"


class PluginNotFound(ConfigError):
    """A filter, weigher or cost function name is not known; the message lists known names."""

    code = "berth.config.plugin_not_found"


class InputError(BerthError):
    """A request, a cloud file or an API body is malformed."""

    code = "berth.input.invalid"


class CloudFileError(InputError):
    """The offline cloud description names a bad field or value."""

    code = "berth.input.cloud_file"


class ExtraSpecError(InputError):
    """A flavor extra spec cannot be evaluated (bad operator operand, bad value type)."""

    code = "berth.input.extra_spec"


class SchedulerHintError(InputError):
    """A scheduler hint is malformed (bad JSON query, bad CIDR, ...)."""

    code = "berth.input.scheduler_hint"


class SchedulingError(BerthError):
    """The request is well-formed but cannot be placed as asked."""

    code = "berth.scheduling"


class NoValidHost(SchedulingError):
    """Fewer hosts could be selected and claimed than instances were requested.

    ``diagnosis`` carries the explanation when the caller asked for one; the message
    itself stays terse, as Nova's does.
    """

    code = "berth.scheduling.no_valid_host"

    def __init__(self, reason: str = "", diagnosis: Any = None) -> None:
        message = "No valid host was found. " + reason if reason else "No valid host was found."
        super().__init__(message.strip())
        self.reason = reason
        self.diagnosis = diagnosis


class UnsupportedPolicy(SchedulingError):
    """A server group's policy needs a filter or weigher that is not enabled."""

    code = "berth.scheduling.unsupported_policy"


class MaxRetriesExceeded(SchedulingError):
    """A build was retried on ``max_attempts`` hosts and failed on each."""

    code = "berth.scheduling.max_retries_exceeded"


#: CLI exit status per error class; the most specific class wins.
EXIT_CODES: dict[type[BerthError], int] = {
    BerthError: 1,
    ConfigError: 2,
    PluginNotFound: 2,
    InputError: 3,
    CloudFileError: 3,
    ExtraSpecError: 3,
    SchedulerHintError: 3,
    SchedulingError: 4,
    NoValidHost: 4,
    UnsupportedPolicy: 5,
    MaxRetriesExceeded: 6,
}


def exit_code_for(error: BaseException) -> int:
    """Return the CLI exit status for ``error`` (1 for anything not a BerthError)."""
    for cls in type(error).__mro__:
        if cls in EXIT_CODES:
            return EXIT_CODES[cls]  # type: ignore[index]
    return 1
