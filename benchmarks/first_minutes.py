"""The first minutes of a run: seconds from `stark optimize` to its first LLM call, and from `--resume` to the first
call of the resumed search, with each executor; quiet, or with busy processes beside it.

The LLM is a local server speaking the OpenAI protocol (tests/llm_server.py, through the official SDK as any
OpenAI-compatible endpoint); the product is the real CLI in a process of its own, on the example task
examples/tasks/1_LeakyReluScale.py with the `cpu_cpp` backend. The clock starts when the process is spawned and stops
when the server receives the first chat completion. Where the seconds go: the CLI's imports (`python -c "import
stark_ray.cli.main"`, measured alone), the provider check (the server's GET of the model), the reference's
evaluation (its row's `eval_s`), and the rest (the evaluator's processes; Ray's start with `--executor ray`).

    python benchmarks/first_minutes.py [--executor local ray] [--busy 0 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from llm_server import OPENAI_PATH, FakeLLMServer, ok  # noqa: E402
from process_census import Census, show  # noqa: E402

TASK = ROOT / "examples" / "tasks" / "1_LeakyReluScale.py"
LIMIT_S = 600.0


def first_call(server: FakeLLMServer, args: list[str], env: dict[str, str],
               census: bool = False) -> tuple[float, float | None, int]:
    """Spawn the CLI; seconds to the first chat completion the server receives (and to its provider check), and the
    exit code once it ends. With ``census``, where the host's CPU went up to that call (process_census.py)."""
    before = len(server.received(OPENAI_PATH))
    checks = len(server.model_checks())
    processes = Census() if census else None
    last_read = 0.0
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "stark_ray.cli", *args], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    checked: float | None = None
    while time.monotonic() - started < LIMIT_S:
        if processes is not None and time.monotonic() - last_read >= 0.1:
            processes.read()
            last_read = time.monotonic()
        if checked is None and len(server.model_checks()) > checks:
            checked = time.monotonic() - started
        got = server.received(OPENAI_PATH)[before:]
        if got:
            at = got[0].at - started
            if processes is not None:
                processes.read()
                show(processes.table(), time.monotonic() - processes.started)
            break
        if proc.poll() is not None:
            raise SystemExit(f"first_minutes: the run ended before its first call: {proc.stderr.read()[-2000:]}")
        time.sleep(0.02)
    else:
        proc.kill()
        raise SystemExit(f"first_minutes: no call within {LIMIT_S:.0f} s")
    try:
        rc = proc.wait(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = -9
    return at, checked, rc


def import_s() -> float:
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import stark_ray.cli.main"], check=True, cwd=ROOT)
    return time.monotonic() - started


def reference_eval_s(run_dir: Path) -> float | None:
    import pyarrow.compute as pc  # pyarrow, not duckdb: the GPU machine's image has one and not the other
    import pyarrow.dataset as ds

    rows = ds.dataset(sorted(run_dir.glob("attempts/*/*.parquet")), format="parquet").to_table(
        columns=["seq", "eval_s"])
    found = rows.filter(pc.equal(rows["seq"], 0))["eval_s"].to_pylist()
    return found[0] if found else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--executor", nargs="+", default=["local", "ray"], choices=["local", "ray"])
    p.add_argument("--busy", type=int, nargs="+", default=[0, 2], help="spinning processes beside the run")
    p.add_argument("--census", action="store_true",
                   help="after each first call, the CPU of every process started up to it, by kind")
    args = p.parse_args()
    print(f"imports of the CLI alone: {import_s():.2f} s; host load {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
    print(f"{'executor':<9}{'busy':>5}  {'first call':>11}  {'of which: check':>16}  {'reference':>10}  "
          f"{'resume to call':>15}")
    with FakeLLMServer() as server, tempfile.TemporaryDirectory() as tmp:
        server.models(ok())
        server.fallback(OPENAI_PATH, ok("no code here"))  # every attempt a parse failure: the timing is the point
        env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        env.update(OPENAI_API_KEY="sk-bench", COLUMNS="160", RAY_AUTH_MODE="disabled")
        for busy in args.busy:
            spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
            try:
                for executor in args.executor:
                    out = Path(tmp) / f"{executor}-{busy}"
                    common = ["--base-url", server.openai_base_url, "--model", "bench", "--executor", executor,
                              "-q", "--build-dir", str(Path(tmp) / "build")]
                    at, checked, _ = first_call(server, ["optimize", str(TASK), "-B", "1", "--out", str(out),
                                                         *common], env, args.census)
                    [run] = [d for d in out.iterdir() if d.is_dir()]
                    ref_s = reference_eval_s(run)
                    again, _, _ = first_call(server, ["optimize", "--resume", str(run), "-B", "2", "-q",
                                                      "--executor", executor], env, args.census)
                    check = f"{checked:.2f} s" if checked is not None else "-"
                    ref = f"{ref_s:.2f} s" if ref_s is not None else "-"
                    print(f"{executor:<9}{busy:>5}  {at:>9.2f} s  {check:>16}  {ref:>10}  {again:>13.2f} s",
                          flush=True)
            finally:
                for s in spinners:
                    s.kill()
    print(json.dumps({"python": sys.version.split()[0]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
