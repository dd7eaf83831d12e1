"""``sandcell ask``: a question answered by code run in the sandbox, with its evidence.

Progress goes to stderr while the agent works; the result goes to stdout, rendered for people or,
with ``--json``, as one JSON object (the whole transcript). The exit status is the stop reason's
(:func:`sandcell.status.exit_code_for_stop`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from sandcell import status
from sandcell.cli.options import add_backend_option
from sandcell.errors import ConfigError
from sandcell.validation import neutralise

if TYPE_CHECKING:
    from sandcell.agent import Answer, Event
    from sandcell.policy.approvals import Ticket

__all__ = ["add_parser", "handle", "render"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    a = sub.add_parser(
        "ask",
        help="answer a question by writing and running code in the sandbox",
        description="Ask a model to answer QUESTION by running code in fresh sandboxes; every "
        "number of the answer is traced to a run's output, and every run is recorded.",
    )
    a.add_argument("question")
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
        "--model",
        help="provider:model, e.g. openai:gpt-4.1-mini, anthropic:..., openai-compatible:NAME "
        "(with --base-url) or scripted:FILE (default: $SANDCELL_MODEL, else the config file)",
    )
    a.add_argument("--base-url", help="endpoint of an OpenAI-compatible or Anthropic server")
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
        help="when a run needs approval, ask on this terminal instead of stopping",
    )
    a.add_argument("--json", action="store_true", help="print the whole transcript as JSON")


def handle(args: argparse.Namespace) -> int:
    from sandcell.agent import Agent, Budget, answer_to_dict
    from sandcell.executor import Executor
    from sandcell.models.config import resolve_model_and_settings

    if args.out is not None and not args.export:
        raise ConfigError("--out needs at least one --export GLOB to say what to copy out")
    if args.approve_interactive and not sys.stdin.isatty():
        raise ConfigError(
            "--approve-interactive needs a terminal on stdin to ask on; without one, a run that "
            "needs approval stops the agent with its approval id"
        )
    # The model first: without one there is nothing to do, and the message says how to set one.
    model, settings = resolve_model_and_settings(args.model, base_url=args.base_url)
    defaults = Budget()
    budget = Budget(
        max_steps=args.max_steps or defaults.max_steps,
        max_tokens=args.max_tokens or defaults.max_tokens,
        max_sandbox_s=args.max_sandbox_seconds or defaults.max_sandbox_s,
        reply_tokens=settings.max_tokens or defaults.reply_tokens,
    )
    progress = _Progress(sys.stderr)
    with Executor(home=args.home, profile=args.profile, backend=args.backend) as ex:
        agent = Agent(
            ex,
            model,
            budget=budget,
            max_retries=args.max_retries,
            approve=_ask_on_terminal if args.approve_interactive else None,
            on_event=progress,
            sample_bytes=args.sample_bytes if args.sample_bytes is not None else 1024,
        )
        answer = agent.ask(args.question, inputs=args.input, exports=args.export)
        copied = (
            ex.store.copy_out(answer.artifacts, args.out) if args.out and answer.artifacts else []
        )
    if args.json:
        body = answer_to_dict(answer)
        body["model_settings"] = settings.to_dict()
        body["copied_to"] = [str(p) for p in copied]
        print(json.dumps(body, ensure_ascii=False))
    else:
        text = render(answer, copied=copied)
        sys.stdout.write(neutralise(text) if sys.stdout.isatty() else text)
    return status.exit_code_for_stop(answer.stop_reason)


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
                "A run waits for a person. Review and decide it, then ask again:",
                f"  sandcell approvals show {answer.approval_id}",
                f"  sandcell approve {answer.approval_id}",
                f"  sandcell deny {answer.approval_id} --reason '...'",
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
