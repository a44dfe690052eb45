"""Frozen settings of a run. Where the paper leaves a value open, the default is ours (see docs/method.md).

A setting the command line takes is declared with :func:`option`: its help and its spellings live with the field,
and every command that takes its dataclass gets the option from there (stark_ray/cli/options.py), as a campaign
file gets its key (stark_ray/run/campaign.py). The names a registry holds, a search policy's and a backend's, are
checked by that registry (``search.policy.policy_factory``, ``eval.backends.backend_class``) where the name is
resolved, so that this module needs no part of the search or the evaluator: the judge's process imports it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import TypeVar

T = TypeVar("T")
CLI = "cli"  # the key of a field's metadata that holds its CliOption


@dataclass(frozen=True)
class CliOption:
    """How a settings field is given on the command line.

    ``flags``: its spellings, where they are not ``--the-field-name`` alone (``("--budget", "-B")``). Fields that
    share a spelling are one option that sets each of them (``--seed``: the search's and the evaluator's); their
    defaults agree, and the first field's ``help`` is the option's. ``help`` may hold ``{policies}`` and
    ``{backends}``: the command line writes the registries' names there. ``derived``: the default is worked out
    from other settings, as ``help`` says; the option is unset (None) unless given. ``path``: the value is a path
    (the field holds its text).
    """

    help: str
    flags: tuple[str, ...] = ()
    derived: bool = False
    path: bool = False


def option(default: T, help: str = "", *flags: str, derived: bool = False, path: bool = False) -> T:
    """A settings field with ``default`` that the command line takes too (:class:`CliOption`)."""
    return field(default=default, metadata={CLI: CliOption(help, flags, derived, path)})


def cli_option(f: object) -> CliOption | None:
    """The command-line option of a dataclass field, or None for a field the command line does not take."""
    found = getattr(f, "metadata", {}).get(CLI)
    return found if isinstance(found, CliOption) else None


ABLATIONS = ("none", "search_agent", "ma_only")
PROVIDERS = ("openai", "anthropic", "replay")

# USD per million tokens (input, output). Overridable with AgentConfig.prices. A model missing here costs 0.
DEFAULT_PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "o3": (2.00, 8.00),
    "o4-mini": (1.10, 4.40),
    "claude-sonnet-4-20250514": (3.00, 15.00),
    "claude-sonnet-4-5": (3.00, 15.00),
    "claude-opus-4-1": (15.00, 75.00),
    "claude-3-5-haiku-latest": (0.80, 4.00),
}


@dataclass(frozen=True)
class SearchConfig:
    budget: int = option(30, "Evaluated candidates per task (debug fixes count).", "--budget", "-B")
    policy: str = option("epsilon_greedy", "{policies}")
    ablation: str = option("none", " | ".join(ABLATIONS))
    epsilon: float = option(0.3, "Exploration probability of the ε-greedy policy.")
    n_root: int = option(5, "The root gets at most this many children.")
    # a node other than the root with more than this many children, none of them accepted, is pruned
    n_child: int = option(3, "Prune a node with more failed children than this.")
    # no node gets more children than this (the root: n_root), so exploitation spreads; 0: no cap
    n_child_max: int = option(8, "No node but the root gets more children than this (0: no cap).")
    top_r: int = option(5, "Leaderboard entries shown to the plan agent.")
    k: int = option(0, "Best-of-K width (0: the whole budget).")  # 0: the whole budget goes to root children
    max_debug_chain: int = option(2, "Repairs in a row one lineage may get.")
    # search/policy.py: a failure streak sends the latest failed child to the debug agent (else a leaf is explored)
    fail_streak: int = option(2, "After this many failed children in a row of the node to exploit, repair its latest "
                                 "failure (or explore) before expanding it again (0: off).")
    # exploit, of the nodes whose speedup intervals overlap the best's, the one with the fewest children (search/
    # policy.py: ties); False: the best score alone, as the paper's policy (a campaign TOML's [search] ties = false)
    ties: bool = True
    # size limit of one context window (code shown per node shrinks to fit)
    window_chars: int = option(24_000, "Size limit of one context window in a prompt.")
    # size limit of a whole user message, fixed parts included (docs/method.md)
    prompt_chars: int = option(100_000, "Size limit of a whole prompt, its fixed parts included.")
    # what a prompt is fitted to (prompts/messages.py: window_room): its window shrinks, down to 4,000 characters, so
    # that the whole prompt stays about this size; 0: the window takes window_chars wherever prompt_chars allows
    prompt_goal: int = option(25_000, "The size a prompt is fitted to by shrinking its window (0: off).")
    # search/runoff.py: the top accepted candidates evaluated again in one sitting (mirrored order, two rounds), the
    # best named by those figures; not attempts (the budget does not count them)
    runoff: int = option(3, "Before a task's best is named, evaluate its top N accepted candidates again side by side "
                            "(0: off).")
    seed: int = option(0, "Seeds the policy and the evaluator's inputs.")
    parallel: int = option(1, "Expansions of a task in flight at once (1: the paper's sequential search).")
    # a task stops once its best candidate reaches this share of its speed of light (eval/judge/sol.py); 0: off
    stop_at_sol: float = option(0.0, "Stop a task once its best candidate runs at this share of its speed of light, "
                                     "e.g. 0.9 (0: off).")

    def __post_init__(self) -> None:
        if self.parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {self.parallel}")
        if self.budget < 1:
            raise ValueError(f"budget must be >= 1, got {self.budget}")
        if self.ablation not in ABLATIONS:
            raise ValueError(f"unknown ablation {self.ablation!r}; choose one of {', '.join(ABLATIONS)}")
        if not 0.0 <= self.epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {self.epsilon}")
        if (self.n_root < 1 or self.n_child < 0 or self.n_child_max < 0 or self.top_r < 0 or self.k < 0
                or self.max_debug_chain < 0 or self.fail_streak < 0):
            raise ValueError("n_root must be >= 1; n_child, n_child_max, top_r, k, max_debug_chain and fail_streak "
                             ">= 0")
        if self.window_chars < 1000:
            raise ValueError(f"window_chars must be >= 1000, got {self.window_chars}")
        if not 0.0 <= self.stop_at_sol <= 1.0:
            raise ValueError(f"stop_at_sol must be in [0, 1] (0: off), got {self.stop_at_sol}")
        if self.prompt_goal < 0:
            raise ValueError(f"prompt_goal must be >= 0 (0: off), got {self.prompt_goal}")
        if self.runoff < 0 or self.runoff == 1:
            raise ValueError(f"runoff must be 0 (off) or at least 2 (one candidate is not a choice), got {self.runoff}")
        if self.prompt_chars < 4000:
            raise ValueError(f"prompt_chars must be >= 4000, got {self.prompt_chars}")


# the model every agent uses where none is given, per provider (a replayed run reads the cassette's)
DEFAULT_MODELS: dict[str, str] = {"openai": "gpt-4o", "anthropic": "claude-sonnet-4-5", "replay": ""}


@dataclass(frozen=True)
class AgentConfig:
    provider: str = option("openai", f"{' | '.join(PROVIDERS)} (default: openai, or replay when --cassette is given).",
                           derived=True)
    # "": the provider's default (DEFAULT_MODELS)
    model: str = option("", f"Model name for every agent (default: {DEFAULT_MODELS['openai']} with openai, "
                            f"{DEFAULT_MODELS['anthropic']} with anthropic).", derived=True)
    base_url: str | None = option(None, "OpenAI-compatible server (vLLM, SGLang, Ollama).")
    temperature_plan: float = option(0.8, "Plan agent temperature.")
    temperature_code: float = option(0.1, "Code agent temperature (and the single agent's: --ablation search_agent).")
    temperature_debug: float = option(0.1, "Debug agent temperature.")
    temperature_single: float = option(0.1, "", "--temperature-code")  # given with the code agent's
    max_tokens: int = 8192
    timeout_s: float = option(180.0, "Seconds per LLM call.", "--timeout")  # per call
    max_retries: int = 4  # retries of a transient failure (429, 5xx, timeouts), each try a row: llm/retry.py
    cassette: str | None = None  # replay provider: the JSONL to read
    record: str | None = None  # any provider: write a cassette here
    prices: dict[str, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.model:
            object.__setattr__(self, "model", DEFAULT_MODELS.get(self.provider, DEFAULT_MODELS["openai"]))
        for role in ("plan", "code", "debug", "single"):
            t = getattr(self, f"temperature_{role}")
            if not 0.0 <= t <= 2.0:
                raise ValueError(f"temperature for {role} must be in [0, 2], got {t}")
        if self.max_tokens < 1 or self.timeout_s <= 0 or self.max_retries < 0:
            raise ValueError("max_tokens must be >= 1, timeout_s > 0 and max_retries >= 0")

    def temperature(self, role: str) -> float:
        return float(getattr(self, f"temperature_{role}", self.temperature_code))

    def price(self, model: str) -> tuple[float, float]:
        table = {**DEFAULT_PRICES, **self.prices}
        # a dated snapshot ("gpt-4o-2024-08-06", "claude-3-5-haiku-20241022") costs what its model costs
        base = re.sub(r"-(\d{4}-\d{2}-\d{2}|\d{8})$", "", model)
        return table.get(model) or table.get(base) or (0.0, 0.0)


TOLERANCES = ("default", "kernelbench")
BASELINES = ("eager", "compile")
PROFILES = ("none", "ncu")


ISOLATE_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class EvalConfig:
    backend: str = option("cpu_cpp", "Candidate format: {backends}")
    # correctness trials, fresh inputs each (the last ones scaled: another distribution)
    trials: int = option(5, "Correctness trials with fresh inputs.")
    # allclose tolerances and the normalized-error bound ||out - ref|| / ||ref||: per output dtype from the
    # preset (stark_ray/eval/measure/tolerance.py: TOLERANCE_PRESETS); a value given here overrides it for every dtype
    # "kernelbench": atol = rtol = 1e-2, as the paper
    tolerance: str = option("default", "default (per dtype) | kernelbench (atol=rtol=1e-2).")
    atol: float | None = None
    rtol: float | None = None
    max_rel_err: float | None = None
    warmup: int = 3
    # timed calls per function; None: the backend's default
    timing_trials: int | None = option(None, "Timed calls at most (default: CPU 20, GPU 100).")
    # timing stops before timing_trials once every median is known within this relative standard error (checked
    # every 10 rounds from the 40th); 0: always timing_trials
    timing_precision: float = option(0.003, "Stop timing (after 40 rounds) once each median's relative standard "
                                            "error is below this; 0: always --timing-trials.")
    # "compile": also time torch.compile(reference) in the same worker and run
    baseline: str = option("eager", "eager | compile (also time torch.compile(reference)).")
    compile_timeout_s: float = option(300.0, "Seconds one candidate's build may take (a busy host's builds can take "
                                             "minutes).", "--compile-timeout")
    # eval/proc/outcome.py: build_limit: the limit is raised to this many times the host's slowest recent build (at
    # most 4x the configured one), said in a timed-out build's message; 0: the configured limit alone
    compile_timeout_scale: float = option(2.0, "Raise the build limit to this many times the host's slowest recent "
                                               "build (at most 4x --compile-timeout; 0: off).")
    check_timeout_s: float = 120.0  # correctness trials (and the task set-up in the worker)
    timing_timeout_s: float = 120.0
    # persistent build cache; default ~/.cache/stark-ray/build
    build_dir: str | None = option(None, "Build cache (default ~/.cache/stark-ray/build).", path=True)
    seed: int = option(0, "Seeds the inputs.")
    # workers that run generated code in namespaces of their own (no other process visible, no network, a
    # read-only world): stark_ray/eval/proc/isolation.py, jail.py. "auto" (the default): where the host can create
    # them, else one line and the run goes on unisolated; "on": an error where it cannot; "off". (True/False,
    # from run.json of older versions: on/off.)
    isolate: str = option("auto", "auto | on | off: generated code in namespaces of its own, no other process "
                                  "visible, no network (auto: where the host allows it; on: an error where it does "
                                  "not).")
    # paths isolated generated code never sees, beside the evaluator's home and working directory (a run adds
    # its run directory: hiding()); what a worker needs of them is put back (stark_ray/eval/proc/jail.py)
    hidden_paths: tuple[str, ...] = ()
    # device memory for one evaluation, judge and worker together (GB); None: 90% of the device's free memory when
    # the evaluator starts. What is kept (timing sets, trials, other tasks) is chosen to fit; a task that cannot
    # fit is one line and no evaluation (stark_ray/eval/measure/memory.py). No effect on the CPU backends.
    memory_budget_gb: float | None = option(None, "Device memory (GB) for one evaluation, judge and worker together "
                                                  "(default: 90% of the GPU's free memory); what is kept is chosen to "
                                                  "fit, a task that cannot is one line (a campaign skips it).",
                                            "--memory-budget")
    # a speedup above this is measured again by the judge's own wall clock before it counts
    # (stark_ray/eval/judge/confirmation.py: the reference in the judge's process, the worker stopped meanwhile,
    # taking turns with the candidate), and any gain whose reference ran slower beside the candidate than alone
    # (eval/judge/drift.py REF_DRIFT). 1 (the default): every claimed gain, since whatever the candidate does in its
    # own process while the worker times the reference beside it (a thread that keeps a core busy, work left
    # running) inflates a claim under 2x as much as one above; 0: every candidate's (benchmarks/kernelbench_sweep.py
    # --confirm). Higher trusts the worker's figure below it (cheaper, for code one trusts)
    confirm_above: float = 1.0
    # candidates one worker process serves before a fresh one takes over. 1: each candidate its own process, the
    # only setting under which nothing a candidate leaves in the interpreter (code patched in place, global hooks,
    # threads, descriptors, files in its /tmp) can reach a later candidate's verdict. None (the default): 1, on every
    # device (a hot spare makes a fresh worker cost a CUDA context on a GPU, little on a CPU: the spare imports torch
    # meanwhile); 64 with --baseline compile (each worker compiles the reference again, from a cold cache). On the CPU
    # backends it was 64 until a candidate that took every file descriptor failed the next 5 of its worker. More is
    # faster, for code one trusts (stark_ray/eval/judge/judge.py)
    worker_candidates: int | None = None
    # the most hot spares a device worker keeps (stark_ray/eval/proc/spares.py): processes with torch imported, waiting
    # to take over at a restart for the cost of a CUDA context. One at first, one more each time a start found none
    # ready (requests faster than a spare's imports: small tasks back to back), and at most one per 4 cores of the
    # host (each imports on a core of its own). Each holds ~0.5-1 GB of host memory and none of the device's.
    # 0: none (every restart a whole interpreter start). CPU backends: none
    worker_spares: int = 3
    # what a process running generated code may write (GB): isolated, its private directory is a tmpfs of this size
    # (with /tmp's 2 GB and /dev/shm's 1 GB: eval/proc/jail.py); isolated or not, no file it writes grows past it
    # (RLIMIT_FSIZE, its log included). A candidate filling the host's disk would take the run's results with it
    worker_disk_gb: float = 4.0
    # the most host memory the process running a candidate's calls may hold (GB; RLIMIT_DATA: its heap and private
    # mappings, the inputs it shares with the judge not counted): past it an allocation fails where the candidate made
    # it, and the verdict says "out of memory on the host" in one line, instead of the host's OOM killer taking a
    # process of the run. None: half the host's memory on a CPU backend, no cap on a GPU (the CUDA driver's own
    # mappings are not sized here); 0: no cap
    worker_memory_gb: float | None = None
    # "ncu": each accepted candidate's top kernel counted by Nsight Compute after its evaluation, on a GPU where ncu
    # can read the counters (else one line says why): DRAM and SM throughput, achieved occupancy and what limits
    # it, in its observations (stark_ray/eval/ncu.py). Seconds per accepted candidate.
    profile: str = option("none", "none | ncu (each accepted candidate's top kernel counted by Nsight Compute, on a "
                                  "GPU where it can).")
    # defences of the evaluator switched off, by name (stark_ray/eval/defences.py: the table), for tests and
    # ablations only: a verdict with one off says so in its log, and can be fooled by what that defence stops
    defences_off: tuple[str, ...] = ()

    def candidates_per_worker(self) -> int | None:
        """``worker_candidates`` as it applies: 1 unless set, or None (the worker's own cap) with a compiled
        baseline."""
        return self.worker_candidates or (None if self.baseline == "compile" else 1)

    def hiding(self, *paths: object) -> EvalConfig:
        """This configuration with ``paths`` (a run directory: a path or a filesystem URI, which needs none) hidden
        too."""
        more = tuple(str(p) for p in paths if "://" not in str(p))
        return replace(self, hidden_paths=tuple(dict.fromkeys((*self.hidden_paths, *more))))

    def __post_init__(self) -> None:
        hidden = (self.hidden_paths,) if isinstance(self.hidden_paths, str) else self.hidden_paths
        object.__setattr__(self, "hidden_paths", tuple(str(p) for p in hidden))
        off = (self.defences_off,) if isinstance(self.defences_off, str) else self.defences_off
        object.__setattr__(self, "defences_off", tuple(str(d) for d in off))
        if isinstance(self.isolate, bool):
            object.__setattr__(self, "isolate", "on" if self.isolate else "off")
        if self.isolate not in ISOLATE_MODES:
            raise ValueError(f"unknown isolate mode {self.isolate!r}; choose one of {', '.join(ISOLATE_MODES)}")
        if self.tolerance not in TOLERANCES:
            raise ValueError(f"unknown tolerance {self.tolerance!r}; choose one of {', '.join(TOLERANCES)}")
        if self.baseline not in BASELINES:
            raise ValueError(f"unknown baseline {self.baseline!r}; choose one of {', '.join(BASELINES)}")
        if self.profile not in PROFILES:
            raise ValueError(f"unknown profile {self.profile!r}; choose one of {', '.join(PROFILES)}")
        if self.trials < 1 or (self.timing_trials is not None and self.timing_trials < 1):
            raise ValueError("trials and timing_trials must be >= 1")
        if not 0 <= self.timing_precision < 1:
            raise ValueError("timing_precision must be >= 0 and < 1")
        for name in ("atol", "rtol", "max_rel_err"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"{name} must be >= 0")
        if self.memory_budget_gb is not None and not (isinstance(self.memory_budget_gb, int | float)
                                                      and not isinstance(self.memory_budget_gb, bool)
                                                      and self.memory_budget_gb > 0):
            raise ValueError(f"memory_budget_gb must be a number of GB > 0, got {self.memory_budget_gb!r}")
        if isinstance(self.confirm_above, bool) or not (isinstance(self.confirm_above, int | float)
                                                       and 0 <= self.confirm_above < float("inf")):
            raise ValueError(f"confirm_above must be a speedup >= 0, got {self.confirm_above!r}")
        if self.worker_candidates is not None and (isinstance(self.worker_candidates, bool)
                                                   or not isinstance(self.worker_candidates, int)
                                                   or self.worker_candidates < 1):
            raise ValueError(f"worker_candidates must be a whole number >= 1, got {self.worker_candidates!r}")
        if isinstance(self.worker_spares, bool) or not isinstance(self.worker_spares, int) or self.worker_spares < 0:
            raise ValueError(f"worker_spares must be a whole number >= 0, got {self.worker_spares!r}")
        if isinstance(self.worker_disk_gb, bool) or not (isinstance(self.worker_disk_gb, int | float)
                                                        and 0 < self.worker_disk_gb < float("inf")):
            raise ValueError(f"worker_disk_gb must be a number of GB > 0, got {self.worker_disk_gb!r}")
        if self.worker_memory_gb is not None and (isinstance(self.worker_memory_gb, bool) or not (
                isinstance(self.worker_memory_gb, int | float) and 0 <= self.worker_memory_gb < float("inf"))):
            raise ValueError(f"worker_memory_gb must be a number of GB >= 0 (0: no cap), got {self.worker_memory_gb!r}")
        for name in ("compile_timeout_s", "check_timeout_s", "timing_timeout_s"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ValueError(f"{name} must be > 0 seconds and finite")
