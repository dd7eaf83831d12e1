"""``sandcell ask``: a question answered by code run in the sandbox, with its evidence.

Progress goes to stderr while the agent works; the result goes to stdout, rendered for people or,
with ``--json``, as one JSON object (the whole transcript). The exit status is the stop reason's
(:func:`sandcell.status.exit_code_for_stop`).

``sandcell ask --resume ID`` goes on with a question that stopped with ``awaiting_approval``, once
``sandcell approve ID`` has run the held program (or ``sandcell deny ID`` refused it). The model
is the one the question was asked with (its stored settings; the key is read from the
environment again) unless ``--model`` names another; a scripted model continues its script where
the conversation stopped. Budget flags given with ``--resume`` replace the stored budget's values.

Under a profile with governed tools the model is shown them as a typed Python API
(:mod:`sandcell.agent.tool_api`); a tool call that needs approval waits in the approval queue for
``sandcell approve ID`` from another terminal, or is asked here with ``--approve-interactive``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from sandcell import status
from sandcell.cli.options import add_backend_option, check_out_dir
from sandcell.errors import ConfigError
from sandcell.validation import neutralise

if TYPE_CHECKING:
    from sandcell.agent import Answer, Event
    from sandcell.executor import Executor
    from sandcell.models.base import Model
    from sandcell.policy.approvals import Ticket
    from sandcell.tools.approval import Approver

__all__ = ["add_parser", "handle", "render"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    a = sub.add_parser(
        "ask",
        help="answer a question by writing and running code in the sandbox",
        description="Ask a model to answer QUESTION by running code in fresh sandboxes; every "
        "number of the answer is traced to a run's output, and every run is recorded.",
    )
    a.add_argument("question", nargs="?", help="the question (not with --resume)")
    a.add_argument(
        "--resume",
        metavar="APPROVAL_ID",
        help="go on with a question that stopped awaiting approval, after `sandcell approve ID`",
    )
    add_backend_option(a)
    a.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="PATH",
        help="file or directory the code may read (read-only; repeatable)",
    )
    a.add_argument(
        "--export",
        action="append",
        default=[],
        metavar="GLOB",
        help="files the code may hand back, e.g. 'out/*.png' (repeatable)",
    )
    a.add_argument("--out", type=Path, help="copy the exported files of the answer here")
    a.add_argument(
        "--workdir-from",
        type=Path,
        metavar="DIR",
        help="a repository each run changes a fresh copy of; the answer carries the last "
        "successful run's patch for sandcell changes apply (docs/changes.md)",
    )
    a.add_argument(
        "--model",
        help="provider:model, e.g. openai:gpt-4.1-mini, anthropic:..., openai-compatible:NAME "
        "(with --base-url) or scripted:FILE (default: $SANDCELL_MODEL, else the config file)",
    )
    a.add_argument("--base-url", help="endpoint of an OpenAI-compatible or Anthropic server")
    a.add_argument(
        "--tool-calling",
        choices=("auto", "native", "text"),
        help="native tool calls, the plain-text protocol, or tools with a fallback to text when "
        "the server rejects them (default: auto, or tool_calling in the config file)",
    )
    a.add_argument(
        "--profile",
        help="policy profile of the runs (default: $SANDCELL_PROFILE, else strict)",
    )
    a.add_argument("--max-steps", type=int, metavar="N", help="model turns (default 10)")
    a.add_argument(
        "--max-tokens", type=int, metavar="N", help="model tokens in all (default 100000)"
    )
    a.add_argument(
        "--max-sandbox-seconds",
        type=float,
        metavar="S",
        help="wall time in sandboxes in all (default 300)",
    )
    a.add_argument(
        "--max-retries",
        type=int,
        default=3,
        metavar="N",
        help="failed replies in a row before the fallback and the stop (default 3)",
    )
    a.add_argument(
        "--sample-bytes",
        type=int,
        metavar="N",
        help="bytes of each text input shown to the model (default 1024; 0: names and sizes)",
    )
    a.add_argument(
        "--approve-interactive",
        action="store_true",
        help="when a run or a governed tool call needs approval, ask on this terminal instead "
        "of stopping (a run) or waiting in the approval queue (a tool call)",
    )
    a.add_argument("--json", action="store_true", help="print the whole transcript as JSON")


def handle(args: argparse.Namespace) -> int:
    from sandcell.agent import Agent, Budget, answer_to_dict
    from sandcell.executor import Executor
    from sandcell.models.config import resolve_model_and_settings

    if args.resume is not None:
        return _resume(args)
    if not args.question:
        raise ConfigError("ask needs a QUESTION (or --resume APPROVAL_ID to go on with one)")
    if args.out is not None and not args.export:
        raise ConfigError("--out needs at least one --export GLOB to say what to copy out")
    check_out_dir(args.out)
    _check_interactive(args)
    # The model first: without one there is nothing to do, and the message says how to set one.
    model, settings = resolve_model_and_settings(
        args.model, base_url=args.base_url, tool_calling=args.tool_calling
    )
    defaults = Budget()
    budget = Budget(
        max_steps=args.max_steps or defaults.max_steps,
        max_tokens=args.max_tokens or defaults.max_tokens,
        max_sandbox_s=args.max_sandbox_seconds or defaults.max_sandbox_s,
        reply_tokens=settings.max_tokens or defaults.reply_tokens,
    )
    with Executor(
        home=args.home,
        profile=args.profile,
        backend=args.backend,
        tool_approver=_tool_approver(args),
    ) as ex:
        agent = Agent(
            ex,
            model,
            budget=budget,
            model_settings=settings.to_dict(),
            **_agent_options(args),
        )
        workdir = getattr(args, "workdir_from", None)
        answer = agent.ask(args.question, inputs=args.input, exports=args.export, workdir=workdir)
        copied = (
            ex.store.copy_out(answer.artifacts, args.out) if args.out and answer.artifacts else []
        )
        proposal = None if workdir is None else _proposal(ex, answer, workdir)
    return _report(args, answer, answer_to_dict, settings.to_dict(), copied, proposal=proposal)


def _proposal(ex: Executor, answer: Answer, workdir: Path) -> dict[str, object]:
    """The change set of the last successful run of ``answer``, for the person to apply."""
    from sandcell.changes.record import load

    for attempt in reversed(answer.attempts):
        if attempt.outcome != "ok" or attempt.run_id is None:
            continue
        try:
            rec = load(ex.audit, ex.store, attempt.run_id)
        except ConfigError as exc:
            return {"run_id": attempt.run_id, "error": str(exc)}
        return {
            "run_id": rec.run_id,
            "outcome": rec.outcome,
            "changeset_sha256": rec.changeset_sha256,
            "files": [c.path for c in rec.changes],
            "patch": rec.patch.decode("utf-8", errors="replace"),
            "apply": f"sandcell changes approve {rec.run_id} --sha256 {rec.changeset_sha256} "
            f"&& sandcell changes apply {rec.run_id} --to {workdir}",
        }
    return {"run_id": None, "error": "no run succeeded: there is no patch to propose"}


def _resume(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from sandcell.agent import Agent, answer_to_dict
    from sandcell.agent.budget import Budget
    from sandcell.agent.paused import PAUSED_FILENAME, PausedStore
    from sandcell.executor import Executor
    from sandcell.home import data_dir
    from sandcell.models.fake import ScriptedModel
    from sandcell.policy.approvals import ApprovalStore

    given = [f for f in ("question", "input", "export", "profile") if getattr(args, f)]
    if given:
        raise ConfigError(
            f"--resume goes on with the stored question, inputs, exports and profile; leave out "
            f"{', '.join('QUESTION' if f == 'question' else '--' + f for f in given)}"
        )
    _check_interactive(args)
    with ApprovalStore((args.home or data_dir()) / "approvals.sqlite3") as approvals:
        submitted = approvals.get(args.resume).profile.get("backend")
    # The question goes on on the rung it was asked on (the held run was approved for it).
    backend = args.backend or (submitted if isinstance(submitted, str) else None)
    with Executor(home=args.home, backend=backend, tool_approver=_tool_approver(args)) as ex:
        ticket = ex.approvals.get(args.resume)
        with PausedStore(ex.approvals.path.parent / PAUSED_FILENAME) as store:
            paused = store.get(ticket.id)
        paused.ensure_waiting()
        model, settings = _resume_model(args, paused.model_settings)
        if isinstance(model, ScriptedModel):
            model.skip(paused.steps)
        stored = paused.state.get("budget")
        budget = Budget(**stored) if isinstance(stored, dict) else Budget()
        changes = {
            "max_steps": args.max_steps,
            "max_tokens": args.max_tokens,
            "max_sandbox_s": args.max_sandbox_seconds,
        }
        budget = replace(budget, **{k: v for k, v in changes.items() if v})
        agent = Agent(ex, model, model_settings=settings, **_agent_options(args))
        answer = agent.resume(ticket.id, budget=budget)
        exports = answer.artifacts
        copied = ex.store.copy_out(exports, args.out) if args.out and exports else []
    return _report(args, answer, answer_to_dict, settings, copied)


def _resume_model(
    args: argparse.Namespace, stored: Mapping[str, object]
) -> tuple[Model, dict[str, object]]:
    """The model to resume with: ``--model``, else the stored settings (the key from the
    environment), else whatever is configured."""
    from sandcell.models.config import resolve_model_and_settings

    spec: str | None = args.model
    base_url: str | None = args.base_url
    calling = args.tool_calling
    if spec is None and isinstance(stored.get("name"), str):
        name = str(stored["name"])
        if stored.get("provider") == "scripted" and isinstance(stored.get("model"), str):
            name = f"scripted:{stored['model']}"  # the resolved path, not the one as typed
        if ":" in name and not name.startswith("fake:"):
            spec = name
            url = stored.get("base_url")
            base_url = base_url or (url if isinstance(url, str) else None)
            mode = stored.get("tool_calling")
            calling = calling or (mode if mode in ("auto", "native", "text") else None)
    model, settings = resolve_model_and_settings(spec, base_url=base_url, tool_calling=calling)
    return model, settings.to_dict()


def _check_interactive(args: argparse.Namespace) -> None:
    if args.approve_interactive and not sys.stdin.isatty():
        raise ConfigError(
            "--approve-interactive needs a terminal on stdin to ask on; without one, a run that "
            "needs approval stops the agent with its approval id"
        )


def _tool_approver(args: argparse.Namespace) -> Approver | None:
    """With ``--approve-interactive``, a governed tool call that needs approval is asked on this
    terminal too; else it waits in the approval queue (``sandcell approvals list``, then
    ``sandcell approve ID`` from another terminal) for at most the run's wall time."""
    if not args.approve_interactive:
        return None
    from sandcell.cli.run import terminal_approver

    return terminal_approver()


def _agent_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "max_retries": args.max_retries,
        "approve": _ask_on_terminal if args.approve_interactive else None,
        "on_event": _Progress(sys.stderr),
        "sample_bytes": args.sample_bytes if args.sample_bytes is not None else 1024,
    }


def _report(
    args: argparse.Namespace,
    answer: Answer,
    to_dict: Callable[[Answer], dict[str, object]],
    settings: Mapping[str, object],
    copied: Sequence[Path],
    *,
    proposal: Mapping[str, object] | None = None,
) -> int:
    if args.json:
        body = to_dict(answer)
        body["model_settings"] = dict(settings)
        body["copied_to"] = [str(p) for p in copied]
        if proposal is not None:
            body["changes"] = dict(proposal)
        print(json.dumps(body, ensure_ascii=False))
    else:
        text = render(answer, copied=copied)
        if proposal is not None:
            text += _render_proposal(proposal)
        sys.stdout.write(neutralise(text) if sys.stdout.isatty() else text)
    return status.exit_code_for_stop(answer.stop_reason)


def _render_proposal(p: Mapping[str, object]) -> str:
    if p.get("error"):
        return f"\npatch: none ({p['error']})\n"
    files = p.get("files")
    listed = ", ".join(str(f) for f in files) if isinstance(files, list) else ""
    return (
        f"\npatch of run {p['run_id']} (outcome {p['outcome']}; files: {listed or 'none'}):\n"
        f"{p['patch']}\nto apply it: {p['apply']}\n"
    )


class _Progress:
    """Prints the agent's events on stderr as it works, one line each."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()

    def __call__(self, event: Event) -> None:
        line = f"sandcell ask [{event.step}] {event.message}"
        # The plan is the model's text: harmless on a pipe, defanged on a terminal.
        print(neutralise(line) if self.tty else line, file=self.stream, flush=True)


def _ask_on_terminal(ticket: Ticket) -> bool:
    from sandcell.policy.approvals import render_ticket

    # The question goes to stderr: stdout carries the result (and --json must stay one object).
    print(neutralise(render_ticket(ticket)), file=sys.stderr)
    print("approve this run? [y/N] ", end="", file=sys.stderr, flush=True)
    reply = sys.stdin.readline()
    if not reply.endswith("\n"):
        # No answer (end of input): what follows must not continue the question's line.
        print(file=sys.stderr)
    return reply.strip().lower() in ("y", "yes")


def render(answer: Answer, *, copied: Sequence[Path] = ()) -> str:
    """The answer for people: explanation, figures, the code that ran, runs and artifacts."""
    out: list[str] = []
    if answer.answered:
        out += ["Answer", _indent(answer.explanation or ""), ""]
        if answer.figures:
            rows = [("figure", "value", "unit", "run")] + [
                (f.name, f.shown, f.unit, (f.run_id or "")[:12]) for f in answer.figures
            ]
            out += ["Figures", *_table(rows), ""]
    else:
        out += [f"No answer: {answer.stop_reason}", _indent(answer.message), ""]
        if answer.stop_reason == "awaiting_approval" and answer.approval_id:
            out += [
                "A run waits for a person. Review and decide it, then resume the question:",
                f"  sandcell approvals show {answer.approval_id}",
                f"  sandcell approve {answer.approval_id}",
                f"  sandcell deny {answer.approval_id} --reason '...'",
                f"  sandcell ask --resume {answer.approval_id}",
                "",
            ]
    ran = [a for a in answer.attempts if a.ok]
    for a in ran:
        out += [f"Code that ran (attempt {a.index}, {a.language}, run {a.run_id})"]
        out += [_indent(a.code.rstrip("\n")), ""]
    if answer.attempts:
        rows = [("attempt", "outcome", "run", "details")] + [
            (str(a.index), a.outcome, a.run_id or "-", f"sandcell audit show {a.run_id}")
            if a.run_id
            else (str(a.index), a.outcome, "-", a.reason)
            for a in answer.attempts
        ]
        out += ["Runs", *_table(rows), ""]
    if answer.artifacts:
        out += ["Artifacts"]
        out += [f"  {x.path}  {x.size} bytes  sha256 {x.sha256[:16]}" for x in answer.artifacts]
        out += [f"  copied to {p}" for p in copied]
        out.append("")
    t = answer.tokens
    out.append(
        f"{answer.model}, profile {answer.profile}: {answer.steps} steps, "
        f"{t.input_tokens}+{t.output_tokens} tokens, {answer.sandbox_s:.1f} s in sandboxes"
    )
    return "\n".join(out) + "\n"


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" if line else "" for line in text.splitlines())


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
