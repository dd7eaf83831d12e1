"""Joining the Ray cluster that runs sandcell's node agents, in the ``sandcell`` namespace."""

from __future__ import annotations

import logging
import signal
import socket
import threading
from types import ModuleType

from sandcell.errors import ConfigError, InfraError
from sandcell.ray._ray import SLOTS, import_ray

NAMESPACE = "sandcell"
"""The Ray namespace of the node agents: every replica finds the same agent of a node there."""
_PROBE_TIMEOUT_S = 5.0


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
    ray = import_ray()
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


__all__ = ["NAMESPACE", "connect"]
