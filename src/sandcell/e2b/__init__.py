"""E2B's API, served by sandcell: the official ``e2b`` and ``e2b-code-interpreter`` SDKs work
unchanged against ``sandcell serve`` with ``E2B_API_URL`` and ``E2B_SANDBOX_URL`` pointing at
``/e2b`` and ``E2B_API_KEY`` set to a tenant's key.

An E2B sandbox is a sandcell session on the tenant's profile and backend (:mod:`.registry`);
``run_code`` is a cell of it, ``commands.run`` a Bash program started as a process of the same
sandbox, and every file operation a generated cell, so each is gated by the profile and recorded
as a run. The routes: the control plane (:mod:`.control`), envd's files and filesystem RPCs
(:mod:`.files`, watches in :mod:`.watch`), its process RPCs (:mod:`.process`,
:mod:`.process_control`, :mod:`.pty`) and the code interpreter (:mod:`.interpreter`), put
together by :func:`sandcell.e2b.app.e2b_app`. docs/e2b.md lists what is served and what is not.
"""

from __future__ import annotations

E2B_PATH = "/e2b"
"""Where the service mounts the E2B API."""

__all__ = ["E2B_PATH"]
