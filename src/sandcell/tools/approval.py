"""Asking the host for approval of a tool call, bounded by a deadline.

The gateway never decides on its own that a call needing approval may go ahead: the host gives
an :data:`Approver`; None from it, no approver, an error or the deadline all refuse the call.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sandcell.errors import SandcellError
from sandcell.tools.records import canonical, text_digest


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRequest:
    """What a person is asked about: one complete call, as the exact text that will run.

    The arguments are held only as their canonical JSON (``args_json``): an approver reads
    copies (:attr:`args`), so nothing it does can change the call that runs after it said yes.
    """

    profile: str
    tool: str
    """``tool`` or ``tool.operation``."""
    args_json: str
    """The arguments' canonical JSON (:func:`sandcell.tools.records.canonical`)."""

    @classmethod
    def for_call(cls, *, profile: str, tool: str, args: Mapping[str, object]) -> ApprovalRequest:
        return cls(profile=profile, tool=tool, args_json=canonical(dict(args)))

    @property
    def args(self) -> dict[str, object]:
        """A fresh copy of the arguments."""
        value: dict[str, object] = json.loads(self.args_json)
        return value

    @property
    def args_sha256(self) -> str:
        """The hash the call's record and its approval ticket carry."""
        return text_digest(self.args_json)


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalDecision:
    """A person's answer."""

    approved: bool
    approver: str
    """Who answered (a user name, ``cli:<user>``...), for the record."""
    args_sha256: str | None = None
    """The hash of the arguments the person was shown and approved; when given, the gateway
    runs the call only if the arguments it is about to send hash to exactly this."""


Approver = Callable[[ApprovalRequest], ApprovalDecision | None]
"""Returns a decision, or None when nobody can approve (no person at a terminal); raises
:class:`NoApproval` to refuse with a reason of its own."""


class NoApproval(SandcellError):
    """Nobody approved, for the reason in the message (the call record carries it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    decision: ApprovalDecision | None
    reason: str


def ask(approver: Approver | None, request: ApprovalRequest, timeout_s: float) -> Outcome:
    """Ask ``approver``, waiting at most ``timeout_s``; the outcome says why when refused."""
    if approver is None:
        return Outcome(decision=None, reason=_nobody(request))
    box: list[ApprovalDecision | BaseException | None] = []

    def run() -> None:
        try:
            box.append(approver(request))
        except BaseException as exc:  # reported as a refusal below
            box.append(exc)

    worker = threading.Thread(target=run, name="sandcell-tool-approval", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not box:
        return Outcome(decision=None, reason=f"no approval within {timeout_s:g} s; refused")
    answer = box[0]
    if isinstance(answer, NoApproval):
        return Outcome(decision=None, reason=f"{request.tool}: {answer}; refused")
    if isinstance(answer, BaseException):
        return Outcome(
            decision=None, reason=f"the approver failed ({type(answer).__name__}); refused"
        )
    if answer is None:
        return Outcome(decision=None, reason=_nobody(request))
    if not answer.approved:
        return Outcome(decision=answer, reason=f"{request.tool} was denied by {answer.approver}")
    return Outcome(decision=answer, reason="ok")


def _nobody(request: ApprovalRequest) -> str:
    return (
        f"{request.tool} needs approval (profile {request.profile}) and nobody can approve "
        "this run; run it where a person can answer, or set approval = 'never' for it"
    )
