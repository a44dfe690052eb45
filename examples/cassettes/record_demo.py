"""Re-record the demo cassette: run the real search on the demo task with the replies in ``demo/``.

The replies were written by the developers in the style of real models (analysis, anchored scaffolds,
a compile error, a wrong approximation, and the debug agent's fixes); everything else — prompts, parsing,
anchor validation, compilation, correctness checks, timing — is the real pipeline, and the prompts stored in
the cassette are the ones this run actually sent. Run from the repository root:

    python examples/cassettes/record_demo.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
from stark_ray.eval.tasks import load_task
from stark_ray.llm.replay import RecordingClient
from stark_ray.llm.scripted import ScriptedClient
from stark_ray.optimize import optimize
from stark_ray.progress import RichReporter

HERE = Path(__file__).parent
TASK = HERE.parent / "tasks" / "2_FusedSwishScaleClamp.py"
CASSETTE = HERE / "2_FusedSwishScaleClamp.jsonl"
# the README's demo command uses the same. Seed 5 explores at selections 1, 2 and 4 (search/memory.py:
# selection_rng): the debug fix, the plan on its result and the last debug fix are taken whatever the timings (the
# fused scalar loop of node 2 times 0.9-1.2x eager by the machine: a greedy step there went to the reference)
BUDGET, SEED = 5, 5


def replies(role: str) -> list[str]:
    return [p.read_text() for p in sorted((HERE / "demo").glob(f"{role}_*.md"))]


def main() -> int:
    CASSETTE.unlink(missing_ok=True)
    script = ScriptedClient({r: replies(r) for r in ("plan", "code", "debug")}, model="hand-written")
    client = RecordingClient(script, CASSETTE)
    with tempfile.TemporaryDirectory() as out:
        summary = optimize(load_task(TASK), client, SearchConfig(budget=BUDGET, seed=SEED),
                           AgentConfig(model="hand-written"), EvalConfig(seed=SEED), Path(out), RichReporter())
    unused = {r: script.remaining(r) for r in ("plan", "code", "debug") if script.remaining(r)}
    if unused:
        print(f"warning: replies left unused: {unused}", file=sys.stderr)
    print(f"wrote {CASSETTE} (best speedup {summary.best_speedup})")
    return 0 if summary.best_correct and not unused else 1


if __name__ == "__main__":
    sys.exit(main())
