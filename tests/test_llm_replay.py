"""Recording exchanges to a cassette and replaying them."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from llm_server import OPENAI_PATH, FakeLLMServer, ok, unauthorized

from stark_ray.agents.base import TaskInfo
from stark_ray.config import AgentConfig
from stark_ray.llm.base import Completion, ConfigError, LLMError, LLMRequest, Message
from stark_ray.llm.openai_provider import OpenAIClient
from stark_ray.llm.replay import RecordingClient, ReplayClient, prompt_sha256, prompt_shape
from stark_ray.llm.usage import UsageTotals
from stark_ray.prompts.anchors import first_difference, has_markers, strip_anchors
from stark_ray.prompts.extract import extract_code
from stark_ray.prompts.messages import task_section
from stark_ray.records import LLMUsage

ROOT = Path(__file__).resolve().parents[1]

LOGGER = "stark_ray.llm.replay"


def req(role: str, text: str, system: str = "sys") -> LLMRequest:
    return LLMRequest(role=role, system=system, messages=(Message("user", text),), temperature=0.2)


PLAN_1, CODE_1, PLAN_2 = req("plan", "plan one"), req("code", "code one"), req("plan", "plan two")


@pytest.fixture
def cassette(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Three exchanges (plan, code, plan) recorded through the real OpenAI SDK; a failed call in between."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-rec")
    path = tmp_path / "runs" / "cassette.jsonl"
    with FakeLLMServer() as server:
        server.script(OPENAI_PATH, ok("reply plan 1", input_tokens=100, output_tokens=10), unauthorized(),
                      ok("reply code 1", input_tokens=200, output_tokens=20, truncated=True),
                      ok("reply plan 2", input_tokens=300, output_tokens=30))
        cfg = AgentConfig(base_url=server.openai_base_url, max_retries=0, timeout_s=5)
        rec = RecordingClient(OpenAIClient(cfg), path)
        assert (rec.provider, rec.model) == ("openai", "gpt-4o")
        rec.complete(PLAN_1)
        with pytest.raises(LLMError):
            rec.complete(CODE_1)  # the 401: not recorded
        assert len(path.read_text().splitlines()) == 1  # flushed as soon as it was recorded
        rec.complete(CODE_1)
        rec.complete(PLAN_2)
    yield path


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_recording_writes_one_line_per_successful_call(cassette: Path) -> None:
    recs = lines(cassette)
    assert [r["role"] for r in recs] == ["plan", "code", "plan"]
    assert [r["reply"] for r in recs] == ["reply plan 1", "reply code 1", "reply plan 2"]
    first = recs[0]
    assert first["prompt"] == PLAN_1.prompt_text()
    assert first["prompt_sha256"] == prompt_sha256(PLAN_1.prompt_text())
    assert (first["model"], first["input_tokens"], first["output_tokens"]) == ("gpt-4o", 100, 10)
    assert [r["truncated"] for r in recs] == [False, True, False]


def test_exact_replay(cassette: Path, caplog: pytest.LogCaptureFixture) -> None:
    rp = ReplayClient(cassette, cfg=AgentConfig(prices={"gpt-4o": (1.0, 2.0)}))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        a, b, c = rp.complete(PLAN_1), rp.complete(CODE_1), rp.complete(PLAN_2)
    assert [x.text for x in (a, b, c)] == ["reply plan 1", "reply code 1", "reply plan 2"]
    assert b.truncated and not a.truncated
    assert (a.usage.input_tokens, a.usage.output_tokens, a.usage.model) == (100, 10, "gpt-4o")
    assert a.usage.cost_usd == pytest.approx((100 * 1.0 + 10 * 2.0) / 1e6)
    assert a.usage.provider == "replay" and a.usage.role == "plan"
    assert rp.mismatches == 0 and not caplog.records
    assert all(x.extra["exact"] for x in (a, b, c))


def test_each_call_names_its_line_and_consumed_lines_are_not_served_again(cassette: Path) -> None:
    first = ReplayClient(cassette)
    assert [first.complete(r).usage.replay_entry for r in (PLAN_1, CODE_1)] == [0, 1]
    resumed = ReplayClient(cassette, consumed={0, 1})  # what a killed run's rows show was served
    assert resumed.remaining("plan") == 1 and resumed.remaining("code") == 0
    again = resumed.complete(PLAN_1)  # the prompt of line 0, which was served: line 2 answers
    assert again.text == "reply plan 2" and again.usage.replay_entry == 2
    with pytest.raises(LLMError, match="no more 'code' replies"):
        resumed.complete(CODE_1)


def test_exact_match_wins_over_order(cassette: Path, caplog: pytest.LogCaptureFixture) -> None:
    rp = ReplayClient(cassette)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert rp.complete(PLAN_2).text == "reply plan 2"  # asked out of order
        assert rp.complete(PLAN_1).text == "reply plan 1"
    assert rp.mismatches == 0 and not caplog.records


def test_prompts_that_differ_only_in_measured_numbers_match_quietly(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    recorded = [req("plan", "scalar loop: runtime 8.587 ms, speedup 1.41x"),
                req("plan", "simd loop: runtime 2.767 ms, speedup 3.55x")]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"role": "plan", "prompt": r.prompt_text(), "reply": f"reply {i}"}) + "\n"
                            for i, r in enumerate(recorded)))
    rp = ReplayClient(path)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        # asked out of order, with other measurements: each finds its own entry by shape
        second = rp.complete(req("plan", "simd loop: runtime 2.91 ms, speedup 3.2x"))
        first = rp.complete(req("plan", "scalar loop: runtime 7.9 ms, speedup 1.5x"))
    assert (first.text, second.text) == ("reply 0", "reply 1")
    assert first.extra["match"] == "shape" and first.extra["exact"] is False
    assert rp.mismatches == 0 and not caplog.records


def test_a_cassette_recorded_on_another_machine_matches_up_to_the_hardware(tmp_path: Path,
                                                                            caplog: pytest.LogCaptureFixture) -> None:
    """The CPU's (or GPU's) name, cores and SIMD are in every prompt's task section: a cassette recorded on another
    machine mismatched on every prompt. The hardware block is masked like the measured numbers."""
    def prompt(hardware: str) -> LLMRequest:
        task = TaskInfo("1_LeakyReluScale", "class Model: ...", "cpu_cpp", hardware)
        return req("plan", task_section(task) + "\n\n# Selected node\nscalar loop, 8.5 ms")

    recorded = prompt("CPU: AMD EPYC (x86_64), 2 logical cores, 2 usable.\nSIMD: sse4_2, avx, avx2, fma.")
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"role": "plan", "prompt": recorded.prompt_text(), "reply": "the plan"}) + "\n")
    rp = ReplayClient(path)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        comp = rp.complete(prompt("CPU: Intel(R) Xeon(R) Platinum 8488C (x86_64), 16 logical cores, 8 usable.\n"
                                  "SIMD: sse4_2, avx, avx2, fma, avx512f."))
    assert comp.text == "the plan" and comp.extra["match"] == "shape" and comp.usage.replay_match == "shape"
    assert rp.mismatches == 0 and not caplog.records
    assert prompt_shape(recorded.prompt_text()).endswith("# Selected node\nscalar loop, # ms")  # the rest kept


def test_how_each_replayed_call_matched_is_on_its_usage_and_mismatches_are_counted(cassette: Path) -> None:
    rp = ReplayClient(cassette)
    totals = UsageTotals()
    for r in (PLAN_1, req("code", "code one, edited"), PLAN_2):
        totals.add(rp.complete(r).usage)
    assert totals.replay_mismatches == 1 and rp.mismatches == 1


def test_changed_prompt_warns_and_serves_in_order(cassette: Path, caplog: pytest.LogCaptureFixture) -> None:
    rp = ReplayClient(cassette)
    changed = req("plan", "plan one, edited")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        comp = rp.complete(changed)
    assert comp.text == "reply plan 1" and comp.extra["exact"] is False
    assert rp.mismatches == 1
    [record] = caplog.records
    assert record.levelno == logging.WARNING and record.name == LOGGER
    assert "first difference" in record.getMessage() and "plan one, edited" in record.getMessage()
    assert rp.complete(PLAN_2).text == "reply plan 2"  # the rest still matches exactly
    assert rp.mismatches == 1


def test_exhausted_role(cassette: Path) -> None:
    rp = ReplayClient(cassette)
    rp.complete(CODE_1)
    assert rp.remaining("code") == 0 and rp.remaining("plan") == 2
    with pytest.raises(LLMError) as info:
        rp.complete(CODE_1)
    assert (info.value.kind, info.value.transient) == ("cassette_exhausted", False)
    with pytest.raises(LLMError) as info:
        rp.complete(req("debug", "never recorded"))
    assert info.value.kind == "cassette_exhausted"


def test_malformed_cassette_names_the_line(cassette: Path) -> None:
    good = cassette.read_text().splitlines()
    cassette.write_text(good[0] + "\n\n" + "{not json\n" + good[1] + "\n")
    with pytest.raises(ConfigError, match=r"cassette\.jsonl:3"):
        ReplayClient(cassette)


@pytest.mark.parametrize("line, problem", [
    ('["a list"]', "not a JSON object"),
    ('{"role": "plan", "prompt": "p"}', "reply"),
    ('{"role": "plan", "reply": "r"}', "prompt_sha256"),
    ('{"role": "plan", "prompt": "p", "reply": "r", "input_tokens": "many"}', "token"),
])
def test_invalid_entries(tmp_path: Path, line: str, problem: str) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ConfigError, match=problem) as info:
        ReplayClient(path)
    assert "c.jsonl:1" in str(info.value)


def test_missing_cassette(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.jsonl"):
        ReplayClient(tmp_path / "nope.jsonl")


def test_hash_only_entry(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "c.jsonl"
    entry = {"role": "code", "prompt_sha256": prompt_sha256(CODE_1.prompt_text()), "reply": "r"}
    path.write_text(json.dumps(entry) + "\n" + json.dumps(entry) + "\n")
    rp = ReplayClient(path, model="label")
    assert rp.complete(CODE_1).extra["exact"] is True
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        comp = rp.complete(req("code", "other"))
    assert comp.text == "r" and rp.mismatches == 1 and "hash" in caplog.text
    assert comp.usage.model == "label"


class _Echo:
    provider, model = "echo", "echo-1"

    def complete(self, request: LLMRequest) -> Completion:
        text = request.messages[-1].content
        usage = LLMUsage(role=request.role, provider="echo", model="echo-1", input_tokens=len(text),
                         output_tokens=1)
        return Completion(text=f"re: {text}", usage=usage)


def test_recording_is_thread_safe(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    rec = RecordingClient(_Echo(), path)
    threads = [threading.Thread(target=lambda i=i: [rec.complete(req("code", f"t{i} c{j} " + "x" * 5000))
                                                    for j in range(20)]) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    recs = lines(path)
    assert len(recs) == 8 * 20
    assert all(r["reply"] == "re: " + r["prompt"].split("\n")[-1] for r in recs)  # type: ignore[union-attr]
    rp = ReplayClient(path)
    assert rp.complete(req("code", "t3 c7 " + "x" * 5000)).text == "re: t3 c7 " + "x" * 5000
    assert rp.mismatches == 0


@pytest.mark.parametrize(("folder", "cassette"), [("demo", "2_FusedSwishScaleClamp.jsonl"),
                                                  ("demo_cuda", "2_FusedSwishScaleClamp_cuda.jsonl")])
def test_demo_cassettes_hold_their_written_replies_and_valid_scaffolds(folder: str, cassette: str) -> None:
    """A reply edited in ``examples/cassettes/<demo>/`` without re-recording (record_demo.py) fails here, and so does
    a plan whose scaffold is not its parent's code with anchors added (the replay would then go off its path)."""
    here = ROOT / "examples" / "cassettes"
    exchanges = [json.loads(line) for line in (here / cassette).read_text().splitlines()]
    for role in ("plan", "code", "debug"):
        written = [p.read_text() for p in sorted((here / folder).glob(f"{role}_*.md"))]
        assert [e["reply"] for e in exchanges if e["role"] == role] == written, role
    code = {f"{e['role']}_{n}": extract_code(e["reply"]).code for n, e in enumerate(exchanges)}
    order = [e["role"] for e in exchanges]
    assert order == ["plan", "code", "debug", "plan", "code", "plan", "code", "debug"], order
    task = (ROOT / "examples" / "tasks" / "2_FusedSwishScaleClamp.py").read_text()
    for plan, parent in (("plan_0", task), ("plan_3", code["debug_2"]), ("plan_5", code["code_4"])):
        assert first_difference(strip_anchors(code[plan]), parent) is None, plan
        assert has_markers(code[plan]), plan


def test_a_cassette_recorded_before_the_speed_of_light_matches_prompts_that_show_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The task's speed of light (a line under the hardware) and each node's share of it are measured figures: a
    cassette recorded before they existed, or on a device without them, still matches by shape."""
    from stark_ray.agents.base import TaskInfo
    from stark_ray.prompts.render import describe_result
    from stark_ray.records import AGENT_PLAN_CODE, STAGE_OK, EvalResult, Node

    def prompt(light: str, fraction: float | None) -> LLMRequest:
        task = TaskInfo("1_LeakyReluScale", "class Model: ...", "cpu_cpp", "CPU: AMD EPYC (x86_64)", light)
        node = Node(id=1, parent=0, depth=1, source="...", agent=AGENT_PLAN_CODE, result=EvalResult(
            compiled=True, passed_checks=True, runtime_ms=1.2, ref_runtime_ms=1.4, speedup=1.17, stage=STAGE_OK,
            sol_ms=0.8 if fraction else None, sol_bound="memory", sol_fraction=fraction))
        return req("plan", task_section(task) + "\n\n# Node 1\n" + describe_result(node))

    shown = prompt("Speed of light of this task on it: 0.8 ms, memory-bound (the least time ...)", 0.667)
    text = shown.prompt_text()
    assert "0.8 ms, memory-bound" in text and "speedup 1.17x, 67% of the speed of light" in text
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"role": "plan", "prompt": prompt("", None).prompt_text(), "reply": "the plan"}) + "\n")
    rp = ReplayClient(path)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        comp = rp.complete(shown)
    assert comp.text == "the plan" and comp.extra["match"] == "shape" and rp.mismatches == 0 and not caplog.records


def test_a_flag_that_one_timing_sets_is_no_change_of_shape_and_the_hint_names_the_real_change() -> None:
    """A node measured above 10x once is flagged ``large_speedup``: the next prompts differ by that word only, which
    a loaded host can make come and go (the demo's cassette left its path that way in a simulation). The hint for a
    real difference names the first line that differs in shape, not the hardware (every line of which differs on
    another machine)."""
    from stark_ray.llm.replay import first_difference as hint_for

    flagged = "## Node 3 — by plan+code\nResult: correct; speedup 10.2x\nFlags: large_speedup\n## Node 4\n"
    plain = "## Node 3 — by plan+code\nResult: correct; speedup 9.8x\n## Node 4\n"
    assert prompt_shape(flagged) == prompt_shape(plain)
    assert "Flags: extra_stream" in prompt_shape(flagged.replace("large_speedup", "large_speedup, extra_stream"))
    recorded = "Target hardware:\nCPU: AMD EPYC 7B13\nSIMD: avx2\n\n## Node 3 (selected) — by plan+code\n"
    now = "Target hardware:\nCPU: Intel Xeon\nSIMD: avx512f\n\n## Node 3 (selected) — by debug\n"
    hint = hint_for(recorded, now)
    assert "by plan+code" in hint and "by debug" in hint and "SIMD" not in hint, hint
