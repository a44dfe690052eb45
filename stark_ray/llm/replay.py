"""Record LLM exchanges to a JSONL cassette, and replay them without a provider.

One line per successful call::

    {"role": "plan", "prompt_sha256": "...", "prompt": "<LLMRequest.prompt_text()>", "reply": "...",
     "model": "gpt-4o", "input_tokens": 812, "output_tokens": 403, "truncated": false}

Replay serves each agent role from its own queue. An entry whose prompt hash equals the request's is preferred
(the earliest unused one), so a run that follows the recorded path replays exactly even if calls finish in a
different order; next an entry whose prompt differs only in numbers (runtimes and speedups are measured anew
in every run, so a faithful replay never reproduces them digit for digit) or in the hardware description (a
cassette recorded on another machine). Otherwise the next unused entry of that role is served anyway, with a
warning and a count in ``ReplayClient.mismatches``: a changed prompt should not stop a replay, but it should be
visible, so each call's usage says how it matched (``replay_match``: in its ``llm_calls`` row), and the live view
and the run's summary count the mismatches. Every call's usage names the entry that answered it
(``replay_entry``: its index among the cassette's entries, blank lines not counted); a resumed run passes the
entries its rows show were served (``consumed``), which are not served again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stark_ray.config import AgentConfig
from stark_ray.llm.base import Completion, ConfigError, LLMClient, LLMError, LLMRequest
from stark_ray.llm.usage import priced_usage

log = logging.getLogger("stark_ray.llm.replay")

HINT_CHARS = 80


def prompt_sha256(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CassetteEntry:
    role: str
    prompt_sha256: str
    prompt: str | None
    reply: str
    model: str
    input_tokens: int
    output_tokens: int
    truncated: bool

    @staticmethod
    def from_json(obj: Any) -> CassetteEntry:
        """Validate one decoded line; raises ValueError saying what is wrong."""
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        for name in ("role", "reply"):
            if not isinstance(obj.get(name), str):
                raise ValueError(f"field {name!r} must be a string")
        prompt = obj.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise ValueError("field 'prompt' must be a string")
        digest = obj.get("prompt_sha256")
        if digest is None:
            if prompt is None:
                raise ValueError("needs 'prompt_sha256' or 'prompt'")
            digest = prompt_sha256(prompt)
        if not isinstance(digest, str):
            raise ValueError("field 'prompt_sha256' must be a string")
        tokens = [obj.get(n, 0) for n in ("input_tokens", "output_tokens")]
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in tokens):
            raise ValueError("token counts must be non-negative integers")
        truncated = obj.get("truncated", False)
        if not isinstance(truncated, bool):
            raise ValueError("field 'truncated' must be true or false")
        model = obj.get("model", "")
        if not isinstance(model, str):
            raise ValueError("field 'model' must be a string")
        return CassetteEntry(role=obj["role"], prompt_sha256=digest, prompt=prompt, reply=obj["reply"],
                             model=model, input_tokens=tokens[0], output_tokens=tokens[1],
                             truncated=truncated)


def load_cassette(path: str | os.PathLike[str]) -> list[CassetteEntry]:
    """Read a cassette; ConfigError (with file name and line number) when it is missing or malformed."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read cassette {path}: {exc}") from exc
    entries = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entries.append(CassetteEntry.from_json(json.loads(line)))
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            raise ConfigError(f"malformed cassette {path}:{lineno}: {exc}") from exc
    return entries


_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


# the task section's hardware block (prompts/templates/task.txt): its lines up to the next blank one
_HARDWARE = re.compile(r"^Target hardware:\n(?:[^\n]+\n?)+", re.MULTILINE)


# a node's share of the task's speed of light (prompts/render.py): a measured figure, absent from cassettes recorded
# before it existed or on a device without its figures
_LIGHT = re.compile(r", \d+(?:\.\d+)?% of the speed of light")
# a runtime's spread and a speedup's interval (prompts/render.py): absent where the judge's own figure stands for the
# worker's (it has neither), which the run's noise decides (a loaded host recorded the judge's 4.56x of a 6.2x claim)
_SPREAD = re.compile(r" \(calls vary by [^)\n]*%\)")
_INTERVAL = re.compile(r" \(±[^)\n]*, 95%\)")
# an accepted node's errors (prompts/render.py), absent from cassettes recorded before they were shown
_ERRORS = re.compile(r"; its error against the reference at most [^\n]*? \(normalized [^)\n]*\)")
# a node's kernels in one call and its Nsight Compute counters (prompts/render.py's KERNELS_LINE, NCU_LINE): names
# and figures from a GPU profile, absent from cassettes recorded before they existed, off the GPU or without ncu
_KERNELS = re.compile(r"^(?:Kernels in one call \(GPU profile\): |Nsight Compute, top kernel ).*\n?", re.MULTILINE)
# the judge's lines on how it measured a node (prompts/render.py's JUDGE_LINE): whether it timed again or confirmed
# depends on the run's noise, and cassettes recorded before they were shown have none
_JUDGE = re.compile(r"^Judge: .*\n?", re.MULTILINE)
# the system prompt: the product's own instructions (its version's, its device's rules), not the search's state
_SYSTEM = re.compile(r"\A\[system\]\n[\s\S]*?(?=^\[user\]\n)", re.MULTILINE)
# the task's reference (the same task's, or a pointer where the prompt shows it as the scaffold) and the plan agent's
# analysis passed to the code agent (prompts/messages.py), absent from cassettes recorded before
_REFERENCE = re.compile(r"^(The reference implementation \(`Model`[^\n]*\n)[\s\S]*?(?=^Target hardware:\n)",
                        re.MULTILINE)
_ANALYSIS = re.compile(r"^# The plan agent's analysis\n[\s\S]*?(?=^# Your job\n)", re.MULTILINE)


# a node's flags (prompts/render.py) that a measured figure alone sets: a speedup above 10x by one timing
_MEASURED_FLAGS = ("large_speedup", "faster_than_sol", "reduced_precision", "library_compute")
_FLAGS = re.compile(r"^Flags: (.*)\n?", re.MULTILINE)
# the judge's line for such a flag (prompts/render.py), absent from cassettes recorded before it existed
_FLAG_LINES = re.compile(r"^Flag (?:" + "|".join(_MEASURED_FLAGS) + r"): .*\n?", re.MULTILINE)


def _unmeasured_flags(m: re.Match[str]) -> str:
    kept = [f for f in m.group(1).split(", ") if f not in _MEASURED_FLAGS]
    return f"Flags: {', '.join(kept)}\n" if kept else ""


def prompt_shape(prompt: str) -> str:
    """The prompt with every number and the hardware description masked (the task's speed of light, math modes and
    tolerance on it included), and the nodes' shares of the speed of light, their errors, their kernels, their
    runtimes' spreads, their speedups' intervals and the flags a measured figure alone sets (``large_speedup``,
    ``faster_than_sol``, ``reduced_precision``, ``library_compute``, with their lines) left out: prompts that differ
    only in measured runtimes, speedups or errors (which change from run to run) or in the machine (a cassette
    recorded on another CPU or GPU: its name, cores, SIMD) have the same shape."""
    prompt = _ANALYSIS.sub("", _REFERENCE.sub(r"\1<reference>\n\n", _SYSTEM.sub("", prompt)))
    measured = _INTERVAL.sub("", _SPREAD.sub("", _ERRORS.sub("", _KERNELS.sub("", _JUDGE.sub("", prompt)))))
    text = _FLAGS.sub(_unmeasured_flags, _FLAG_LINES.sub("", _LIGHT.sub("", measured)))
    return _NUMBER.sub("#", _HARDWARE.sub("Target hardware:\n<hardware>\n", text))


def first_difference(recorded: str, actual: str) -> str:
    """A short hint: the first line where two prompts differ in shape (numbers shown as #: a machine's or a
    timing's figures are no difference)."""
    old, new = prompt_shape(recorded).splitlines(), prompt_shape(actual).splitlines()
    for i in range(max(len(old), len(new))):
        a = old[i] if i < len(old) else "<end>"
        b = new[i] if i < len(new) else "<end>"
        if a != b:
            return f"first difference: recorded {a[:HINT_CHARS]!r}, now {b[:HINT_CHARS]!r}"
    return "same lines, different whitespace"


class ReplayClient:
    """An :class:`~stark_ray.llm.base.LLMClient` that answers from a recorded cassette. Thread-safe."""

    def __init__(self, path: str | os.PathLike[str], *, provider: str = "replay", model: str | None = None,
                 cfg: AgentConfig | None = None, consumed: Iterable[int] = ()) -> None:
        self.path = Path(path)
        self.provider = provider
        self.cfg = cfg or AgentConfig()
        self.mismatches = 0
        entries = load_cassette(self.path)
        self.model = model or (cfg.model if cfg else None) or (entries[0].model if entries else None) or "replay"
        self._queues: dict[str, list[CassetteEntry]] = {}
        self._lines: dict[str, list[int]] = {}  # per role: each entry's line in the cassette (from 0)
        for line, e in enumerate(entries):
            self._queues.setdefault(e.role, []).append(e)
            self._lines.setdefault(e.role, []).append(line)
        served = set(consumed)
        self._used: dict[str, list[bool]] = {r: [line in served for line in lines]
                                             for r, lines in self._lines.items()}
        self._lock = threading.Lock()

    def remaining(self, role: str) -> int:
        with self._lock:
            return self._used.get(role, []).count(False)

    def complete(self, request: LLMRequest) -> Completion:
        prompt = request.prompt_text()
        entry, exact, line = self._take(request.role, prompt_sha256(prompt), prompt_shape(prompt))
        if exact == "shape":
            log.info("replay %s: %s prompt matches the recorded one up to measured numbers",
                     self.path.name, request.role)
        elif exact is None:
            hint = "prompt hash differs" if entry.prompt is None else first_difference(entry.prompt, prompt)
            log.warning("replay %s: %s prompt differs from the recorded one (%s); serving the next recorded "
                        "reply", self.path.name, request.role, hint)
        model = entry.model or self.model
        usage = priced_usage(self.cfg, request.role, self.provider, model, entry.input_tokens,
                             entry.output_tokens)
        usage.replay_entry = line
        usage.replay_match = exact or "order"
        return Completion(text=entry.reply, usage=usage, truncated=entry.truncated,
                          extra={"replayed": True, "exact": exact == "hash", "match": exact or "order"})

    def _take(self, role: str, digest: str, shape: str) -> tuple[CassetteEntry, str | None, int]:
        """The entry to serve, how it matched — "hash" (the same prompt), "shape" (the same prompt up to
        numbers), or None (the next unused entry of the role, counted in ``mismatches``) — and its line."""
        with self._lock:
            queue, used = self._queues.get(role, []), self._used.get(role, [])
            free = [i for i, u in enumerate(used) if not u]
            if not free:
                raise LLMError(f"cassette {self.path.name}: no more {role!r} replies ({len(queue)} recorded)",
                               kind="cassette_exhausted", transient=False)
            how: str | None = "hash"
            i = next((i for i in free if queue[i].prompt_sha256 == digest), None)
            if i is None:
                how = "shape"
                i = next((i for i in free if queue[i].prompt is not None
                          and prompt_shape(queue[i].prompt or "") == shape), None)
            if i is None:
                how, i = None, free[0]
                self.mismatches += 1
            used[i] = True
            return queue[i], how, self._lines[role][i]


class RecordingClient:
    """Wraps any client and appends each successful exchange to a cassette (one flushed line per call).

    Lines are appended, so a crashed run keeps what it recorded and a resumed run adds to it. Failed calls
    (an LLMError from the inner client) are not recorded. Thread-safe.
    """

    def __init__(self, inner: LLMClient, path: str | os.PathLike[str]) -> None:
        self.inner = inner
        self.path = Path(path)
        self.provider = inner.provider
        self.model = inner.model
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def complete(self, request: LLMRequest) -> Completion:
        completion = self.inner.complete(request)
        prompt = request.prompt_text()
        line = json.dumps({
            "role": request.role,
            "prompt_sha256": prompt_sha256(prompt),
            "prompt": prompt,
            "reply": completion.text,
            "model": completion.usage.model,
            "input_tokens": completion.usage.input_tokens,
            "output_tokens": completion.usage.output_tokens,
            "truncated": completion.truncated,
        }, ensure_ascii=False)
        with self._lock, open(self.path, "a", encoding="utf-8") as f:  # closed (so flushed) per line
            f.write(line + "\n")
        return completion
