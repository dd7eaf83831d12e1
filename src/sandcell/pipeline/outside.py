"""What leaves a run while it runs: its ways out (the egress proxy and the tool gateway of a run
or a session) and its live output, redacted of the host's secrets like its final output.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from sandcell.live_output import LiveOutput, OutputListener
from sandcell.policy.approvals import ApprovalStore
from sandcell.policy.profiles import Profile
from sandcell.run_sockets import RunSockets
from sandcell.spec import RunRequest
from sandcell.tools.queue_approver import open_run_sockets

if TYPE_CHECKING:
    from sandcell.network.addresses import Resolver
    from sandcell.tools.approval import Approver

_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH)", re.IGNORECASE)


def host_secrets(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Values of the host's secret-looking environment variables: never given to a sandbox, so
    finding one in its output means it leaked some other way; they are redacted by value."""
    env = os.environ if environ is None else environ
    return tuple(v for k, v in env.items() if _SECRET_NAME.search(k) and len(v) >= 8)


def open_sockets(
    profile: Profile,
    request: RunRequest,
    *,
    approvals: ApprovalStore,
    approver: Approver | None,
    resolver: Resolver | None,
    run_id: str | None = None,
    ingress: bool = False,
) -> RunSockets | None:
    """The ways out of a run (or a session) under ``profile``: its egress proxy and tool
    gateway (and, with ``ingress``, a session's ports), started; None when the profile allows
    nothing outside. A call needing approval waits at most the run's wall time, for
    ``approver`` or else the approval queue in ``approvals`` (its tickets name ``run_id``)."""
    return open_run_sockets(
        profile,
        store=approvals,
        approver=approver,
        approval_timeout_s=request.effective_limits.wall_time_s,
        resolver=resolver,
        run_id=run_id,
        ingress=ingress,
    )


def live_output(
    listener: OutputListener | None, request: RunRequest, *, known_secrets: Sequence[str]
) -> LiveOutput | None:
    """The output sink a backend is given for ``listener``: the run's caps, and
    ``known_secrets`` redacted as in its final output; None without a listener."""
    if listener is None:
        return None
    limits = request.effective_limits
    return LiveOutput(
        listener,
        caps={"stdout": limits.stdout_bytes, "stderr": limits.stderr_bytes},
        known_secrets=known_secrets,
    )
