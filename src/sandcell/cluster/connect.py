"""Joining the Ray cluster that runs sandcell's node agents, in the ``sandcell`` namespace."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from types import ModuleType

from sandcell.errors import ConfigError, InfraError
from sandcell.ray._ray import SLOTS, import_ray

NAMESPACE = "sandcell"
"""The Ray namespace of the node agents: every replica finds the same agent of a node there."""
_PROBE_TIMEOUT_S = 5.0
_GCS_PATIENCE_ENV = "RAY_gcs_rpc_server_reconnect_timeout_s"
_GCS_PATIENCE_S = 10 * 365 * 24 * 3600


def _settle_switches() -> None:
    """Ray reads the switches :func:`connect` sets when it is imported, which may have
    happened before: they are set where it looks them up at each connection too."""
    from ray._private import auto_init_hook, ray_constants

    auto_init_hook.enable_auto_connect = os.environ.get("RAY_ENABLE_AUTO_CONNECT") != "0"
    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = os.environ.get(
        "RAY_DISABLE_FAILURE_SIGNAL_HANDLER", ""
    ).lower() in ("1", "true")


def head_answers(address: str, timeout_s: float = _PROBE_TIMEOUT_S) -> str | None:
    """None when something accepts connections at ``address`` (HOST:PORT, the head's GCS),
    else why not: a dead head is told at once, where Ray's own calls would wait for it."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return None
    except (OSError, ValueError) as exc:
        return getattr(exc, "strerror", None) or str(exc)


def _probe(address: str) -> None:
    """Fail at once for a HOST:PORT where nothing listens: Ray itself retries for minutes."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(
            f"--cluster {address!r}: give 'auto', HOST:PORT of the cluster's head, or ray://HOST:PORT"
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_PROBE_TIMEOUT_S):
            pass
    except OSError as exc:
        raise _hint(address, exc.strerror or str(exc)) from None


def _hint(address: str, why: str) -> InfraError:
    return InfraError(
        f"cannot connect to the Ray cluster at {address!r}: {why.rstrip('.')}; start its head "
        f"with ray start --head --resources='{{\"{SLOTS}\": 4}}', or pass its address"
    )


def connect(address: str) -> tuple[ModuleType, bool]:
    """The ``ray`` module, connected to the cluster at ``address`` (``auto``: the one this
    machine belongs to; ``HOST:PORT``: its head; ``ray://HOST:PORT``: through Ray Client).
    The flag is True when this call connected (the caller then disconnects at its end)."""
    # A replica outlives its cluster's head: without this, Ray ends the whole process once
    # the head has been unreachable for a minute (the Cluster reconnects instead, fleet.py).
    os.environ.setdefault(_GCS_PATIENCE_ENV, str(_GCS_PATIENCE_S))
    # And never starts a cluster of its own in this process when a call reaches Ray while
    # it is disconnected (between a lost head and the reconnection).
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    # Nor takes SIGTERM from the service: Ray's failure signal handler, installed at each
    # connection, would end the process at once where the service drains its runs. The first
    # connection puts the service's handler back (below, on the main thread); a connection made
    # again after a lost head is made on the cluster's thread, where that is not possible.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    ray = import_ray()
    _settle_switches()
    if ray.is_initialized():
        return ray, False
    if address != "auto" and not address.startswith("ray://"):
        _probe(address)
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    try:
        ray.init(
            address=address,
            namespace=NAMESPACE,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise _hint(address, str(exc)) from None
    finally:
        # ray.init puts in a SIGTERM handler that exits at once; the service's own (which
        # drains the runs in flight) must stay.
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return ray, True


__all__ = ["NAMESPACE", "connect", "head_answers"]
