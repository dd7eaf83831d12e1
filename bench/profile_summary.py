"""Summarise a py-spy ``raw`` (collapsed stacks) profile: where the CPU samples went, by thread.

Usage::

    .venv/bin/python bench/profile_summary.py PROFILE.txt [--under 'Executor.run'] [--top 25]

For each thread kind (threads named alike are merged: ``sandcell-pool-0`` and ``-1`` are one
line), its share of all samples; then the functions with the most samples *inclusive* (a
function counted once per stack that holds it) and *self* (the frame on top), as a percentage of
all samples. ``--under`` keeps only stacks through a frame whose name contains that text (the
set-up of the profiled script, its imports and pool start, is left out this way).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_THREAD = re.compile(r"^thread \(\d+\)(?:: )?(.*)$")
_NUMBERED = re.compile(r"-\d+$")
_LINE = re.compile(r" \(([^():]+):\d+\)$")


def _frame(raw: str) -> str:
    """``f (path.py:12)`` without the line number: one name per function."""
    return _LINE.sub(r" (\1)", raw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--under", default="")
    parser.add_argument("--thread", default="", help="only threads whose name starts so")
    parser.add_argument("--skip", default="", help="leave out stacks through such a frame")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()

    threads: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in args.profile.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = stack.split(";")
        match = _THREAD.match(frames[0])
        name = _NUMBERED.sub("", match.group(1)) if match else frames[0]
        body = [_frame(f) for f in frames[1:]]
        if args.under and not any(args.under in f for f in body):
            continue
        if args.skip and any(args.skip in f for f in body):
            continue
        if args.thread and not (name or "").startswith(args.thread):
            continue
        count = int(count_text)
        total += count
        threads[name or "(unnamed)"] += count
        for f in set(body):
            inclusive[f] += count
        if body:
            own[body[-1]] += count
    if not total:
        raise SystemExit("no samples matched")
    print(f"{total} samples")
    print("\nby thread:")
    for name, n in threads.most_common():
        print(f"  {100 * n / total:5.1f}%  {name}")
    for title, table in (("inclusive", inclusive), ("self", own)):
        print(f"\n{title}:")
        for f, n in table.most_common(args.top):
            print(f"  {100 * n / total:5.1f}%  {f}")


if __name__ == "__main__":
    main()
