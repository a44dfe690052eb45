"""Where a run's CPU goes: every process started on the host while a command ran, sampled from /proc, grouped by
what it is (the judge, a worker, a spare, a builder, g++, Ray's own, the CLI), with its CPU seconds and when the
first of each kind began.

Processes are read every ``--every`` seconds; one that starts and ends between two readings is missed (its CPU
with it), and a process's CPU is the last reading before it ended. On a host with other work, every process
started meanwhile counts, theirs too.

    python benchmarks/process_census.py [--every 0.1] [--json FILE] -- COMMAND ...
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def kind(cmdline: str) -> str:
    """What a process is, from its command line."""
    if "stark_ray.eval.judge.main" in cmdline:
        return "judge"
    if "stark_ray.eval.worker.main" in cmdline:
        if "--compile-only" in cmdline:
            return "worker: builder" + (" (spare)" if "--spare" in cmdline else "")
        return "worker" + (" (spare)" if "--spare" in cmdline else "")
    for part, name in (("ray::", "ray: actor"), ("default_worker.py", "ray: idle worker"),
                       ("cc1plus", "g++ (cc1plus)"), ("/ld", "g++ (ld)"), ("nvcc", "nvcc"), ("ninja", "ninja"),
                       ("gcs_server", "ray: gcs"), ("dashboard", "ray: dashboard"), ("log_monitor", "ray: log monitor"),
                       ("runtime_env", "ray: runtime env agent"), ("ray_client_server", "ray: client server"),
                       ("/raylet", "ray: raylet"), ("stark_ray.cli", "the CLI"), ("pytest", "pytest")):
        if part in cmdline:
            if name == "ray: actor":
                return "ray: " + cmdline.split("ray::", 1)[1].split()[0].split(".")[0]
            return name
    return Path(cmdline.split(" ", 1)[0]).name or "?"  # its program


@dataclass
class Seen:
    kind: str
    first_s: float  # when it was first read, from the census's start
    cpu_s: float = 0.0


@dataclass
class Census:
    """Every process that started after ``started`` (the host's boot clock), read by :meth:`read`."""
    started: float = field(default_factory=time.monotonic)
    seen: dict[tuple[int, int], Seen] = field(default_factory=dict)  # (pid, its start tick) -> what it is

    def read(self) -> None:
        now = time.monotonic()
        boot_ticks = self.started * TICKS  # CLOCK_MONOTONIC and /proc's start times count from boot alike
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_text()
                fields = stat.rsplit(")", 1)[1].split()
                start_tick = int(fields[19])
                if start_tick < boot_ticks - TICKS:  # began before the census
                    continue
                key = (int(entry.name), start_tick)
                cpu = (int(fields[11]) + int(fields[12])) / TICKS
                if key not in self.seen:
                    cmd = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    self.seen[key] = Seen(kind(cmd or stat.split("(", 1)[1].split(")", 1)[0]), now - self.started)
                self.seen[key].cpu_s = cpu
            except (OSError, IndexError, ValueError):
                continue

    def table(self) -> list[dict[str, object]]:
        rows: dict[str, dict[str, object]] = {}
        for s in self.seen.values():
            row = rows.setdefault(s.kind, {"kind": s.kind, "processes": 0, "cpu_s": 0.0, "first_s": s.first_s})
            row["processes"] = int(row["processes"]) + 1  # type: ignore[call-overload]
            row["cpu_s"] = round(float(row["cpu_s"]) + s.cpu_s, 2)  # type: ignore[arg-type]
            row["first_s"] = round(min(float(row["first_s"]), s.first_s), 2)  # type: ignore[arg-type]
        return sorted(rows.values(), key=lambda r: -float(r["cpu_s"]))  # type: ignore[arg-type]


def show(table: list[dict[str, object]], wall_s: float) -> None:
    total = sum(float(r["cpu_s"]) for r in table)  # type: ignore[arg-type]
    print(f"{total:.1f} CPU-s in {wall_s:.1f} s of wall")
    print(f"{'what':32} {'processes':>9} {'CPU-s':>8} {'share':>6} {'first at':>9}")
    for r in table:
        share = float(r["cpu_s"]) / total if total else 0.0  # type: ignore[arg-type]
        print(f"{r['kind']!s:32} {r['processes']:>9} {r['cpu_s']:>8} {share:>6.0%} {r['first_s']:>8}s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--every", type=float, default=0.1, help="seconds between readings")
    p.add_argument("--json", help="write the table here too")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command (after --)")
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("process_census: name a command after --", file=sys.stderr)
        return 2
    census = Census()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        census.read()
        time.sleep(args.every)
    wall = time.monotonic() - census.started
    table = census.table()
    show(table, wall)
    if args.json:
        Path(args.json).write_text(json.dumps({"wall_s": wall, "rc": proc.returncode, "table": table}, indent=1))
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
