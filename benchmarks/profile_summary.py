"""Summarise the profiles ``bench_overhead.py --profile DIR`` wrote: per process, where its CPU went by
library (``perf``: the kernel, the interpreter, uvloop, orjson, ...) and the functions with the most samples
of their own and in all (``py-spy``: Python frames; a C call counts in its caller).

    .venv/bin/python benchmarks/profile_summary.py DIR [--top 25]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path


def by_library(data: Path) -> list[tuple[float, str]]:
    """(percent of samples, library) from ``perf report``, largest first."""
    out = subprocess.run(
        ["perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort", "dso"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    rows = re.findall(r"^\s+([\d.]+)%\s+(\S+)\s*$", out, re.M)
    return [(float(pct), dso) for pct, dso in rows]


def by_kernel_symbol(data: Path, top: int) -> list[tuple[float, str]]:
    out = subprocess.run(
        [
            "perf",
            "report",
            "-i",
            str(data),
            "--stdio",
            "--no-children",
            "--sort",
            "sym",
            "--dsos",
            "[kernel.kallsyms]",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    rows = re.findall(r"^\s+([\d.]+)%\s+\[k\]\s+(\S+)", out, re.M)
    return [(float(pct), sym) for pct, sym in rows][:top]


def python_functions(raw: Path, top: int) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """(samples, the frames with most samples of their own, the lbtestbed frames with most in all)."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        samples += n
        own[_short(frames[-1])] += n
        for f in {_short(f) for f in frames if "lbtestbed" in f or "openloop" in f}:
            total[f] += n
    return samples, own.most_common(top), total.most_common(top)


def _short(frame: str) -> str:
    """``function (path:line)`` as ``function (file)``."""
    m = re.match(r"(.*) \((.*?)(?::\d+)?\)$", frame)
    if not m:
        return frame
    path = m.group(2)
    where = path.split("/lbtestbed/", 1)[-1] if "/lbtestbed/" in path else Path(path).name
    return f"{m.group(1)} ({where})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("dir", type=Path)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    for data in sorted(args.dir.glob("*.perf.data")):
        name = data.name.removesuffix(".perf.data")
        print(f"== {name}")
        print("  by library: " + ", ".join(f"{dso} {pct:.1f}%" for pct, dso in by_library(data)[:8]))
        kernel = by_kernel_symbol(data, 12)
        print("  kernel symbols: " + ", ".join(f"{sym} {pct:.1f}%" for pct, sym in kernel))
        raw = args.dir / f"{name}.pyspy.txt"
        if raw.exists():
            samples, own, total = python_functions(raw, args.top)
            print(f"  py-spy: {samples} samples; most of their own:")
            for f, n in own:
                print(f"    {100 * n / samples:5.1f}%  {f}")
            print("  lbtestbed frames, in all:")
            for f, n in total:
                print(f"    {100 * n / samples:5.1f}%  {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
