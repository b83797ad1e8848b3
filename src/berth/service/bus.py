"""The message bus: topics, calls, casts and fanout over oslo.messaging.

Seed 003's hub: compute agents publish their host state to the schedulers through the
queue, and the API calls the schedulers and the agents through it. Berth uses the
OpenStack ecosystem's own RPC library, configured as Nova is:

* ``[DEFAULT] transport_url`` — ``rabbit://guest:guest@127.0.0.1:5672/`` for RabbitMQ;
  unset, the embedded default ``fake:/`` (oslo.messaging's in-process driver: the
  all-in-one ``berth serve`` needs no broker);
* ``[DEFAULT] control_exchange`` (Berth's default ``berth``, so a Nova deployment on
  the same broker is not disturbed), ``rpc_response_timeout`` (60 s) and every
  ``[oslo_messaging_rabbit]`` option (heartbeats, reconnect back-off, ...).

Topics, as Nova lays them out (reference ``nova-scheduler-rpc.md`` §1.1): every
scheduler serves topic ``scheduler`` (calls round-robin among them) and receives the
``scheduler`` fanout (host reports); a compute agent serves ``compute.<server>``.

Arguments and answers are JSON-native values (dicts, lists, strings, numbers); the
typed conversions live in :mod:`berth.service.wire`. Expected failures travel as
answers, not as remote exceptions, so a caller always gets a typed error back; a
lost call (no answer within the timeout, a broker gone) is :class:`BusTimeout` /
:class:`BusUnavailable`, never a silent loss.

A broker restart is survived by oslo.messaging's own reconnection: servers re-declare
their queues and resume consuming, casts sent meanwhile wait for the connection
(bounded by the call timeout for calls).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Sequence
from typing import Any

from berth.errors import BusError, BusTimeout, BusUnavailable, ConfigError, one_line

__all__ = ["Bus", "BusClient", "BusError", "BusTimeout", "BusUnavailable"]

LOG = logging.getLogger(__name__)

#: The embedded transport: oslo.messaging's in-process driver (no broker).
EMBEDDED_URL = "fake:/"
DEFAULT_EXCHANGE = "berth"

#: Version of Berth's own RPC interfaces (scheduler and compute topics), served by
#: every server. 1.0: the first. 1.1: ``update_host_states`` takes ``reports_json``
#: (the reports as one JSON string) besides ``reports``.
RPC_VERSION = "1.1"
#: The version a client sends unless a call says otherwise (what every server of 1.x
#: accepts): a message that needs a newer server names its version, so a server too
#: old for it refuses it by version (oslo.messaging's UnsupportedVersion, logged).
BASE_VERSION = "1.0"



def _cfg_error(exc: BaseException) -> str:
    """oslo.config's error on one line, its location object as the file it names."""
    return re.sub(r" from LocationInfo\(.*?detail='([^']*)'\)", r" in \1", one_line(exc))

class Bus:
    """One transport and the clients and servers over it.

    ``url`` overrides ``[DEFAULT] transport_url`` of ``config_files``; neither set gives
    the embedded in-process bus (then every part of the system must share this one
    object, since the fake driver's queues live in it).
    """

    def __init__(self, url: str | None = None, *, config_files: Sequence[str] = (),
                 timeout: float | None = None, exchange: str | None = None) -> None:
        """``exchange`` is the default control exchange (``berth``; Nova's is ``nova``),
        which ``[DEFAULT] control_exchange`` in the files still overrides."""
        oslo_messaging = _oslo_messaging()
        from oslo_config import cfg

        self._om = oslo_messaging
        conf = cfg.ConfigOpts()
        files = [os.fspath(p) for p in config_files]
        for path in files:
            if not os.path.isfile(path):
                raise ConfigError(f"config file {path}: no such file")
        args: list[str] = []
        for path in files:
            args += ["--config-file", path]
        oslo_messaging.set_transport_defaults(DEFAULT_EXCHANGE)
        _register_messaging_opts(conf)
        try:
            conf(args=args, project="nova", default_config_files=[], use_env=False)
            if exchange is not None:
                conf.set_default("control_exchange", exchange)
            url = url or conf.transport_url or EMBEDDED_URL
            self.url = url
            self.transport = oslo_messaging.get_rpc_transport(conf, url=url)
        except (cfg.Error, oslo_messaging.InvalidTransportURL,
                oslo_messaging.DriverLoadFailure, ValueError, ImportError) as exc:
            # ValueError: a port that is no number; ImportError: a driver's library
            # that is not installed (kafka://).
            raise ConfigError(f"[DEFAULT] transport_url {_shown(url or '')!r}: "
                              f"{one_line(exc)}") from None
        self.conf = conf
        try:
            self.timeout = float(timeout if timeout is not None else conf.rpc_response_timeout)
        except cfg.Error as exc:
            raise ConfigError(f"[DEFAULT] rpc_response_timeout: {_cfg_error(exc)}",
                              field="[DEFAULT] rpc_response_timeout") from None
        self._servers: list[Any] = []
        self._lock = threading.Lock()

    @property
    def embedded(self) -> bool:
        """True on the in-process driver."""
        return self.url.startswith("fake:")

    def client(self, topic: str, *, server: str | None = None, fanout: bool = False,
               timeout: float | None = None) -> BusClient:
        """A client of ``topic`` (of one ``server`` of it, or all of them by ``fanout``)."""
        target = self._om.Target(topic=topic, server=server, fanout=fanout,
                                 version=BASE_VERSION)
        rpc = self._om.get_rpc_client(self.transport, target,
                                      timeout=timeout if timeout is not None else self.timeout)
        return BusClient(rpc, self._om)

    def serve(self, topic: str, server: str, endpoints: Sequence[Any],
              *, workers: int = 8, version: str = RPC_VERSION) -> Any:
        """Start serving ``endpoints`` on ``topic`` (shared queue), ``topic.server`` and
        the topic's fanout; returns the started oslo.messaging server."""
        from oslo_config import cfg

        target = self._om.Target(topic=topic, server=server, version=version)
        for endpoint in endpoints:
            # oslo.messaging dispatches by the endpoint's own target, taking one
            # without a target for 1.0: an endpoint that does not say otherwise serves
            # ``version`` (messages of 1.0 up to it).
            if getattr(endpoint, "target", None) is None:
                endpoint.target = self._om.Target(version=version)
        access = self._om.rpc.dispatcher.DefaultRPCAccessPolicy
        # Threads (oslo.messaging's default executor; eventlet is not used).
        rpc_server = self._om.get_rpc_server(self.transport, target, list(endpoints),
                                             access_policy=access)
        # The threading executor's pool size (oslo.messaging's executor_thread_pool_size).
        rpc_server.conf.set_override("executor_thread_pool_size", workers)
        try:
            rpc_server.start()
        except _broker_errors() as exc:  # refused login, no such vhost, ...
            raise BusUnavailable(f"cannot serve {topic} on {_shown(self.url)}: "
                                 f"{one_line(exc)}") from None
        except cfg.Error as exc:  # a driver option's bad value, read as the server starts
            raise ConfigError(f"message bus options: {_cfg_error(exc)}") from None
        with self._lock:
            self._servers.append(rpc_server)
        return rpc_server

    def close(self) -> None:
        """Stop every server this bus started, then the transport."""
        with self._lock:
            servers, self._servers = self._servers, []
        for rpc_server in servers:
            try:
                rpc_server.stop()
                rpc_server.wait()
            except Exception:  # closing must go on for the others
                LOG.exception("stopping an RPC server failed")
        self.transport.cleanup()


#: Where oslo.messaging declares the options it reads: (module, attribute, group).
#: Some (metrics, tracing) are registered by the library only on the global CONF, so a
#: private ConfigOpts must register them itself; this is the list the library's own
#: ConfFixture registers.
_MESSAGING_OPTS = (
    ("oslo_messaging._drivers.impl_rabbit", "rabbit_opts", "oslo_messaging_rabbit"),
    ("oslo_messaging._drivers.amqp", "amqp_opts", "oslo_messaging_rabbit"),
    ("oslo_messaging.rpc.client", "_client_opts", None),
    ("oslo_messaging.transport", "_transport_opts", None),
    ("oslo_messaging.rpc.dispatcher", "_dispatcher_opts", None),
    ("oslo_messaging.notify.notifier", "_notifier_opts", "oslo_messaging_notifications"),
    ("oslo_messaging._metrics.client", "oslo_messaging_metrics", "oslo_messaging_metrics"),
    ("oslo_messaging._tracing.client", "oslo_messaging_tracing", "oslo_messaging_tracing"),
)


def _register_messaging_opts(conf: Any) -> None:
    import importlib

    for module_name, attribute, group in _MESSAGING_OPTS:
        try:
            opts = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError):  # not in this version of the library
            continue
        conf.register_opts(opts, group=group)


def _oslo_messaging() -> Any:
    """oslo.messaging, imported without the deprecation noise of its eventlet backend
    (Berth runs it on threads)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import oslo_messaging
    return oslo_messaging


class BusClient:
    """``call`` (waits for the answer) and ``cast`` (fire and forget) on one target."""

    def __init__(self, rpc: Any, oslo_messaging: Any) -> None:
        self._rpc = rpc
        self._om = oslo_messaging

    def call(self, method: str, timeout: float | None = None, **kwargs: Any) -> Any:
        """Call ``method`` and return its answer; BusTimeout when none comes back in
        time, BusUnavailable when the broker cannot be reached."""
        client = self._rpc.prepare(timeout=timeout) if timeout is not None else self._rpc
        try:
            return client.call({}, method, **kwargs)
        except self._om.MessagingTimeout as exc:
            raise BusTimeout(f"no answer to {method} within the timeout: {exc}") from None
        except self._om.MessageDeliveryFailure as exc:
            raise BusUnavailable(f"{method}: the message bus is unavailable: {exc}") from None
        except _broker_errors() as exc:  # the broker refused the connection
            raise BusUnavailable(f"{method}: the message bus is unavailable: "
                                 f"{one_line(exc)}") from None

    def cast(self, method: str, *, version: str | None = None, **kwargs: Any) -> None:
        """Send ``method`` without waiting (as of RPC ``version`` when given);
        BusUnavailable when it cannot be sent."""
        client = self._rpc.prepare(version=version) if version is not None else self._rpc
        try:
            client.cast({}, method, **kwargs)
        except self._om.MessageDeliveryFailure as exc:
            raise BusUnavailable(f"{method}: the message bus is unavailable: {exc}") from None
        except _broker_errors() as exc:
            raise BusUnavailable(f"{method}: the message bus is unavailable: "
                                 f"{one_line(exc)}") from None


def _broker_errors() -> tuple[type[BaseException], ...]:
    """What the rabbit driver raises when the broker refuses or drops a connection
    (a wrong password, a vhost that does not exist), besides oslo.messaging's own."""
    errors: list[type[BaseException]] = [OSError]
    try:
        import amqp.exceptions
        import kombu.exceptions

        errors += [amqp.exceptions.AMQPError, kombu.exceptions.OperationalError]
    except ImportError:  # no rabbit driver installed: nothing of it to catch
        pass
    return tuple(errors)


def _shown(url: str) -> str:
    """``url`` with its password masked."""
    import re

    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)
