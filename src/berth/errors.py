"""Berth's exception tree, with stable error codes.

Every error a user can see derives from :class:`BerthError`; its ``code`` never changes
once released and is what scripts should match on. CLI exit codes are mapped from the
classes in one place (:data:`EXIT_CODES`, used by :mod:`berth.cli`).

    BerthError                               berth.error
    ├── ConfigError                          berth.config.invalid
    │   ├── PluginNotFound                   berth.config.plugin_not_found
    │   ├── SchedulerCostFunctionNotFound    berth.config.cost_function_not_found
    │   └── SchedulerWeightFlagNotFound      berth.config.cost_weight_not_found
    ├── InputError                           berth.input.invalid
    │   ├── CloudFileError                   berth.input.cloud_file
    │   ├── ExtraSpecError                   berth.input.extra_spec
    │   ├── SchedulerHintError               berth.input.scheduler_hint
    │   ├── ImagePropertyError               berth.input.image_property
    │   ├── HostStateError                   berth.input.host_state
    │   │   └── MissingAllocationRatio       berth.input.host_allocation_ratio
    │   └── InstanceNotFound                 berth.input.instance_not_found
    ├── CloudSourceError                     berth.cloud_source
    ├── SchedulingError                      berth.scheduling
    │   ├── NoValidHost                      berth.scheduling.no_valid_host
    │   ├── UnsupportedPolicy                berth.scheduling.unsupported_policy
    │   ├── MaxRetriesExceeded               berth.scheduling.max_retries_exceeded
    │   ├── RequestFilterFailed              berth.scheduling.request_filter
    │   ├── ComputeHostMetricNotFound        berth.scheduling.metric_not_found
    │   ├── PciRequestFailed                 berth.scheduling.pci_request
    │   ├── NUMAUsageError                   berth.scheduling.numa_usage
    │   └── MoveRefused                      berth.scheduling.move_refused
    │       └── AllocationMoveFailed         berth.scheduling.allocation_move_failed
    ├── InstanceExists                       berth.conflict.instance_exists
    └── ServiceUnavailable                   berth.unavailable
        └── BusError                         berth.unavailable.bus
            ├── BusTimeout                   berth.unavailable.bus_timeout
            └── BusUnavailable               berth.unavailable.broker

(MissingAllocationRatio and the scheduling errors from RequestFilterFailed to
NUMAUsageError live beside their rule: ``berth.weighers.least_cost``,
``berth.weighers.cpu``, ``berth.weighers.metrics``, ``berth.request_filters``,
``berth.hardware``.)

Categories as Nova's. Where Nova fails on a malformed request too, Berth's error is of
the category Nova's failure belongs to, so that a tool can tell what to fix:

* a flavor extra spec Nova cannot evaluate (a ``ValueError``/``TypeError`` out of its
  extra-spec operators, ``InvalidCPUAllocationPolicy``, ``InvalidNUMANodesNumber``,
  ``PciInvalidAlias``, ``PciRequestAliasNotDefined``, a bad ``resources:`` key) is an
  :class:`ExtraSpecError` naming the key;
* a scheduler hint Nova cannot use (JsonFilter's ``query``, SimpleCIDRAffinityFilter's
  ``build_near_host_ip``/``cidr``: a ``ValueError`` or ``netaddr`` error in Nova, or the
  API's 400) is a :class:`SchedulerHintError` naming the hint;
* an image property that does not fit its field (Nova's ``ImageMetaProps`` field
  errors, ``InvalidArchitectureName``, the ``Image*Forbidden`` NUMA/CPU conflicts) is an
  :class:`ImagePropertyError` naming the property;
* a value a host reports that a rule cannot read (a ``TypeError``/``ValueError`` on host
  state in Nova) is a :class:`HostStateError` naming the host.
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

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled whole (a worker process sends its error to its parent): the default
        # calls the class with ``args`` alone, which loses the details and fails for
        # classes whose constructor takes other arguments.
        return (_rebuilt, (type(self), self.args, self.__dict__))


def _rebuilt(cls: type[BerthError], args: tuple[Any, ...], state: dict[str, Any]) -> BerthError:
    """A pickled :class:`BerthError`, without calling its constructor."""
    error = cls.__new__(cls, *args)
    error.__dict__.update(state)
    return error


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


class ImagePropertyError(InputError):
    """An image property value that does not fit its field or the flavor.

    ``key`` is the property as given (``hw_numa_cpus.1``, a legacy name such as
    ``architecture``), ``problem`` what was expected; callers that know where the
    properties came from (a cloud file, an API body) name it by their own path
    (``where``).
    """

    code = "berth.input.image_property"

    def __init__(self, key: str, value: Any, problem: str, *, where: str | None = None) -> None:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        super().__init__(f"{where or 'image property ' + key}: {problem}, got {shown}",
                         key=key, value=value, problem=problem)
        self.key = key
        self.value = value
        self.problem = problem


class HostStateError(InputError):
    """A host reports a value a filter or weigher cannot use (a negative hypervisor
    version, an unparsable IP address or cpu_info field, a missing allocation ratio)."""

    code = "berth.input.host_state"


class InstanceNotFound(InputError):
    """A move names an instance the service (or the cloud file) does not know."""

    code = "berth.input.instance_not_found"


class CloudSourceError(BerthError):
    """A cloud to import from (OpenStack, a running Berth) cannot be read: unreachable,
    refused, or a library it needs is missing."""

    code = "berth.cloud_source"


class SchedulingError(BerthError):
    """The request is well-formed but cannot be placed as asked."""

    code = "berth.scheduling"


class NoValidHost(SchedulingError):
    """Fewer hosts could be selected and claimed than instances were requested.

    ``diagnosis`` carries the explanation when the caller asked for one; the message
    itself stays terse, as Nova's does. ``cause`` says which stage ran out of hosts, for
    metrics: ``request_filter``, ``placement`` (no allocation candidates) or ``hosts``
    (the filters, weighers and claims left fewer hosts than instances).
    """

    code = "berth.scheduling.no_valid_host"

    def __init__(self, reason: str = "", diagnosis: Any = None, cause: str | None = None,
                 rejections: dict[str, int] | None = None) -> None:
        message = "No valid host was found. " + reason if reason else "No valid host was found."
        super().__init__(message.strip())
        self.reason = reason
        self.diagnosis = diagnosis
        #: Hosts each filter removed before the request ran out of hosts (for metrics).
        self.rejections = rejections or {}
        #: For a multi-create that ran out of hosts: how many of how many instances
        #: had found a host (their claims released) when it did.
        self.fitted: int | None = None
        self.requested: int | None = None
        #: The (host, node) each of those ``fitted`` instances had found, in order (in
        #: process only: what-if and capacity read it; it does not cross the wire).
        self.placed: list[tuple[str, str]] = []
        #: The step that left the last instance tried no host (a filter's name, or
        #: "claims"), when the hosts ran out in the core.
        self.emptied_by: str | None = None
        #: And the (instance uuid, allocation request) each had claimed (released).
        self.claimed: list[tuple[str, dict[str, Any]]] = []
        self.cause = cause

    def fit_note(self) -> str | None:
        """``"3 of 5 instances fit ..."`` for a multi-create, else None."""
        if self.fitted is None or not self.requested or self.requested < 2:
            return None
        return (f"{self.fitted} of {self.requested} instances found a host before the hosts "
                "ran out (their claims were released: a request is placed whole or not at "
                "all)")


class UnsupportedPolicy(SchedulingError):
    """A server group's policy needs a filter or weigher that is not enabled."""

    code = "berth.scheduling.unsupported_policy"


class MaxRetriesExceeded(SchedulingError):
    """A build was retried on ``max_attempts`` hosts and failed on each."""

    code = "berth.scheduling.max_retries_exceeded"


class InstanceExists(BerthError):
    """An instance uuid that was issued before; uuids are never re-used."""

    code = "berth.conflict.instance_exists"


class ServiceUnavailable(BerthError):
    """The shared database is unreachable or locked past its timeout, and the operation
    could not be retried safely: the caller should try again later (HTTP 503)."""

    code = "berth.unavailable"

    #: Seconds a client is asked to wait before retrying (``Retry-After``).
    retry_after = 2


class MoveRefused(SchedulingError):
    """A move operation cannot start in the instance's present state (a resize waiting
    for confirmation, a source host still up for an evacuation): Nova's conflict
    answers (InstanceInvalidState, ComputeServiceInUse)."""

    code = "berth.scheduling.move_refused"


class AllocationMoveFailed(MoveRefused):
    """Placement would not move a consumer's allocations to another consumer (Nova's
    ``AllocationMoveFailed``): someone else changed them meanwhile."""

    code = "berth.scheduling.allocation_move_failed"


class BusError(ServiceUnavailable):
    """The message bus could not carry a call (:mod:`berth.service.bus`)."""

    code = "berth.unavailable.bus"
    retry_after = 1


class BusTimeout(BusError):
    """A call got no answer within its timeout (its server died, or is overloaded); the
    caller has released what the call may have claimed."""

    code = "berth.unavailable.bus_timeout"


class BusUnavailable(BusError):
    """The message broker cannot be reached."""

    code = "berth.unavailable.broker"


#: CLI exit status per error class; the most specific class wins.
EXIT_CODES: dict[type[BerthError], int] = {
    BerthError: 1,
    ConfigError: 2,
    PluginNotFound: 2,
    InputError: 3,
    CloudFileError: 3,
    ExtraSpecError: 3,
    SchedulerHintError: 3,
    ImagePropertyError: 3,
    HostStateError: 3,
    InstanceNotFound: 3,
    CloudSourceError: 7,
    SchedulingError: 4,
    NoValidHost: 4,
    UnsupportedPolicy: 5,
    MaxRetriesExceeded: 6,
    InstanceExists: 1,
    ServiceUnavailable: 7,
    MoveRefused: 4,
    AllocationMoveFailed: 4,
}


def one_line(value: object) -> str:
    """An error's text (a message a library spreads over several lines) on one line;
    an exception with no text is named by its class."""
    text = " ".join(str(value).split())
    return text or (type(value).__name__ if isinstance(value, BaseException) else "")


def exit_code_for(error: BaseException) -> int:
    """Return the CLI exit status for ``error`` (1 for anything not a BerthError)."""
    for cls in type(error).__mro__:
        if cls in EXIT_CODES:
            return EXIT_CODES[cls]  # type: ignore[index]
    return 1


def error_dict(exc: BerthError) -> dict[str, Any]:
    """The ``{"code", "message"}`` of an error as the APIs and ``--json`` answer it, with
    how many instances of a multi-create found a host when NoValidHost ended it."""
    body: dict[str, Any] = {"code": exc.code, "message": exc.message}
    if isinstance(exc, NoValidHost):
        if exc.fit_note():
            body["instances_fit"] = exc.fitted
            body["instances_requested"] = exc.requested
        # Which stage ran out of hosts, and the hosts each filter removed before it did.
        if exc.cause:
            body["cause"] = exc.cause
        if exc.rejections:
            body["rejections"] = dict(exc.rejections)
        if exc.emptied_by:
            body["emptied_by"] = exc.emptied_by
    return body
