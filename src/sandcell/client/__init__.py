"""The sandcell service from Python: the executor's ``run`` and ``session`` over HTTP, with the
same result types (:class:`~sandcell.spec.RunResult`, ``SessionInfo``, ``SessionEnd``,
``AuditEntry``), so code moves between in-process and remote by changing one line::

    ex = Executor(home=home)                    # in-process
    ex = Client("http://127.0.0.1:8790", key)   # the service (or Client.from_env())
    result = ex.run(RunRequest(code="print(6*7)"), profile="analysis")

:class:`AsyncClient` does the same for asyncio. Errors are sandcell's own (see
:mod:`sandcell.client.errors`). Needs ``httpx2`` (``pip install 'sandcell[client]'``); see
docs/service.md.
"""

from __future__ import annotations

from sandcell.client.aio import AsyncClient, AsyncRemoteSession
from sandcell.client.errors import QuotaExceeded, ServiceError, ServiceUnavailable
from sandcell.client.sync import Client, RemoteSession
from sandcell.client.wire import Approval, SavedSession

__all__ = [
    "Approval",
    "AsyncClient",
    "AsyncRemoteSession",
    "Client",
    "QuotaExceeded",
    "RemoteSession",
    "SavedSession",
    "ServiceError",
    "ServiceUnavailable",
]
