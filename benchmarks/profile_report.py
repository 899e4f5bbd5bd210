"""Sums up a py-spy profile in folded form (`frame;frame;... count` per line, as
`py-spy record --format raw` writes it): the share of samples in each function, by itself
(self) and with what it calls (inclusive), and the share under a few named parts.

    python -m benchmarks.profile_report FILE [--top 30] [--under PATTERN ...]

A frame is `function (file:line)`; the line number is dropped so that a function is one row.
`--under PATTERN`: the share of samples with a frame containing PATTERN (the cost of a whole
step, e.g. `status.py` or `_follow`). No side effects besides printing.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

LINE = re.compile(r":\d+\)$")


@dataclass
class Profile:
    """Samples by function: on top of the stack (self), anywhere on it (inclusive)."""

    total: int = 0
    own: Counter[str] = field(default_factory=Counter)
    inclusive: Counter[str] = field(default_factory=Counter)
    stacks: list[tuple[list[str], int]] = field(default_factory=list)

    def share_under(self, pattern: str) -> float:
        hits = sum(n for frames, n in self.stacks if any(pattern in f for f in frames))
        return hits / self.total if self.total else 0.0


def frame_name(frame: str) -> str:
    """`fn (path/to/file.py:12)` -> `fn (file.py)`: a function, whatever line was running."""
    name, _, where = frame.partition(" (")
    where = LINE.sub(")", "(" + where) if where else ""
    short = where.rsplit("/", 1)[-1] if "/" in where else where.lstrip("(")
    return f"{name} ({short.rstrip(')')})" if where else name


def parse(lines: Iterable[str]) -> Profile:
    profile = Profile()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        # py-spy puts the process and thread first; frames run outermost to innermost.
        frames = [frame_name(f) for f in stack.split(";") if " (" in f]
        if not frames:
            continue
        profile.total += n
        profile.own[frames[-1]] += n
        for name in set(frames):
            profile.inclusive[name] += n
        profile.stacks.append((frames, n))
    return profile


def report(profile: Profile, top: int, under: Sequence[str]) -> str:
    out = [f"{profile.total} samples"]
    for title, table in (("self", profile.own), ("inclusive", profile.inclusive)):
        out.append(f"\n{title}:")
        for name, n in table.most_common(top):
            out.append(f"  {100 * n / profile.total:5.1f}%  {name}")
    if under:
        out.append("\nunder:")
        for pattern in under:
            out.append(f"  {100 * profile.share_under(pattern):5.1f}%  {pattern}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--under", action="append", default=[])
    args = parser.parse_args(argv)
    with args.file.open() as lines:
        print(report(parse(lines), args.top, args.under))
    return 0


if __name__ == "__main__":
    sys.exit(main())
