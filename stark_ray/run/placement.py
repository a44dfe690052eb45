"""What a Ray run is given (:class:`RayRun`) and the plumbing around the driver: joining or starting Ray, the
default number of evaluators, which tasks a run directory has recorded."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from stark_ray.actors.agents import AGENT_CPUS, AGENT_WORKERS, ClientFactory, agent_pool
from stark_ray.actors.evaluator import EvaluatorActor, evaluator_options
from stark_ray.actors.tree_memory import TaskSpec, TreeMemoryActor, write_specs
from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
from stark_ray.eval.service import EvaluatorError
from stark_ray.eval.tasks import Task, TaskError
from stark_ray.run.campaign import Caps
from stark_ray.run.directory import RayUnavailable, RunError
from stark_ray.run.in_flight import InFlightCap
from stark_ray.run.local_ray import LocalRay, RayStartError, quiet_error_broadcasts, start_local_ray
from stark_ray.store.location import Location, locate
from stark_ray.store.read import StoreError, call_rows, recorded_attempts

STATUS_CAPPED = "capped"  # stopped by a spending cap before its budget


@dataclass
class RayRun:
    """What a Ray run is given (and what run.json keeps for a resume)."""

    tasks: list[Task]
    search: SearchConfig
    agents: AgentConfig
    eval: EvalConfig
    out: str | Path | Location  # a local directory or a filesystem URI (s3://...)
    run_id: str | None = None  # default: <task>-<time>
    resume: str | Path | Location | None = None  # an earlier run directory: continue it
    address: str | None = None  # None: an embedded local Ray; "auto" or "ray://...": join a cluster
    evaluators: int | None = None  # default: one per GPU of the cluster now (GPU backends), else one; more than
    # the cluster has wait for the autoscaler to add GPU nodes
    max_in_flight: int | None = None  # expansions in flight at once; None: derived as the run goes (run/in_flight.py)
    client_factory: ClientFactory | None = None  # scripted replies (tests, benchmarks)
    evaluator_cls: Any = None  # an actor class with reference/evaluate/hardware/close (benchmarks)
    runtime_env: dict[str, Any] | None = None  # for a Ray this run starts or joins
    caps: Caps = field(default_factory=Caps)  # spending limits (campaigns)
    extra: dict[str, Any] = field(default_factory=dict)


_local: LocalRay | None = None  # the private Ray this process started (connect), stopped by disconnect


def connect(address: str | None, runtime_env: dict[str, Any] | None = None, num_cpus: int | None = None,
            num_gpus: int | None = None) -> bool:
    """Join the cluster at ``address``, or start a private local Ray (:mod:`stark_ray.run.local_ray`: no dashboard,
    sized to the machine or to ``num_cpus``/``num_gpus``, nothing shared with another run); True when this call
    started it (end it with :func:`disconnect`). RunError, one line, when a local Ray cannot start."""
    global _local
    if ray.is_initialized():
        return False
    logging.getLogger("ray").setLevel(logging.ERROR)  # the CLI's stderr is for one clear line, not Ray's notes
    address = address or os.environ.get("RAY_ADDRESS") or None  # what ray.init() alone would join
    if address:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False, runtime_env=runtime_env)
        quiet_error_broadcasts()
        return False
    try:
        _local = start_local_ray(num_cpus, num_gpus)
    except RayStartError as e:
        raise RayUnavailable(str(e)) from None
    try:
        # "auto" with the head's own directory: Ray then treats it as the local cluster it is and lets this
        # driver use the token authentication that the head turned on (an explicit address would not)
        ray.init(address="auto", _temp_dir=str(_local.temp_dir), logging_level="ERROR", log_to_driver=False,
                 runtime_env=runtime_env or same_code_env())
    except BaseException:
        disconnect()
        raise
    quiet_error_broadcasts()
    return True


def disconnect() -> None:
    """Leave Ray, and end the private local Ray if :func:`connect` started one."""
    global _local
    ray.shutdown()
    local, _local = _local, None
    if local is not None:
        local.stop()


# what pyarrow's filesystems read from the environment: a run directory on one needs them in the one actor that
# writes it (the TreeMemory actor), which a cluster's raylet starts without the driver's environment. They go to
# that actor alone (its options' runtime_env), never job-wide: evaluator actors, whose children run generated
# kernels, do not get them
STORE_CREDENTIALS = {
    "s3": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION",
           "AWS_DEFAULT_REGION", "AWS_EC2_METADATA_DISABLED"),
    "gcs": ("GOOGLE_APPLICATION_CREDENTIALS",),
}


def store_env(run_dir: str | Path | Location) -> dict[str, str]:
    """The credential variables set here that the run directory's filesystem reads ({} for a local one): the
    TreeMemory actor's ``runtime_env`` env_vars."""
    loc = locate(run_dir)
    if loc.fs is None:
        return {}
    return {k: os.environ[k] for k in STORE_CREDENTIALS.get(loc.fs.type_name, ()) if k in os.environ}


def same_code_env() -> dict[str, Any]:
    """Workers of an embedded Ray import this very stark_ray (not another install on the path)."""
    here = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    return {"env_vars": {"PYTHONPATH": path}}


def start_memory(run: RayRun, run_dir: Location, name: str, specs: list[TaskSpec]) -> Any:
    """The run's TreeMemory actor, on the driver's node (the run directory it writes is the driver's; a GPU
    worker may be scaled away), restarted whenever it dies; the credentials of a run directory on an object
    store go to it alone (:func:`store_env`)."""
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    credentials = store_env(run_dir)
    write_specs(run_dir, specs)  # read by the actor at each start: nothing of it held in Ray's object store
    return TreeMemoryActor.options(  # type: ignore[attr-defined]  # Ray's decorator
        name=name, max_restarts=-1, max_task_retries=-1, num_cpus=0, scheduling_strategy=here,
        runtime_env={"env_vars": credentials} if credentials else None).remote(
        run_dir.parent, run_dir.name, run.search, run.agents)


def start_evaluators(run: RayRun, embedded: bool, token: str) -> list[Any]:
    """The run's evaluator actors (one per GPU by default), created now; their device workers start with the
    first call each gets. RunError when an embedded Ray has fewer GPUs than evaluators (they would wait forever:
    no autoscaler adds any)."""
    cls = run.evaluator_cls or EvaluatorActor
    n = run.evaluators or default_evaluators(run.eval)
    opts = evaluator_options(run.eval)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if embedded and opts.get("num_gpus") and n > gpus:
        raise RunError(f"{n} evaluators need {n} GPUs and this machine has {gpus}")
    cpus = float(ray.cluster_resources().get("CPU", 0))
    if opts.get("num_cpus") and cpus - n * opts["num_cpus"] < AGENT_CPUS:  # a 1-CPU machine: leave agents room
        opts["num_cpus"] = max(0.0, (cpus - AGENT_CPUS) / n)
    cfg = run.eval.hiding(run.out)  # generated code never sees the run directory (nor the others beside it)
    return [cls.options(name=f"stark-eval-{token}-{i}", **opts).remote(cfg) for i in range(n)]


def start_agents(run: RayRun) -> list[Any]:
    """The agent workers, on the driver's node: one per CPU the evaluators leave (at least one, at most
    AGENT_WORKERS), each taking its share of the in-flight cap's ceiling in calls at once."""
    cpus = int(ray.cluster_resources().get("CPU", 1))
    n = max(1, min(AGENT_WORKERS, cpus - (run.evaluators or 1)))
    consumed: frozenset[int] = frozenset()
    if run.agents.provider == "replay" and run.client_factory is None:
        n = 1  # one cassette, served once: one worker, whose threads share it
        if run.resume is not None:
            consumed = replay_consumed(run.resume)  # what the rows show was served
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)  # the driver's
    calls = -(-InFlightCap(run.max_in_flight).ceiling // n)
    return agent_pool(n, calls, run.agents, run.search, run.client_factory, consumed,
                      scheduling_strategy=here)


def stop_actors(agents: list[Any], actors: list[Any]) -> None:
    """Kill the agent workers (their calls still running are dropped with them); close, then kill, the others."""
    for agent in agents:
        with contextlib.suppress(RayError, ValueError):
            ray.kill(agent, no_restart=True)
    live = [a for a in actors if a is not None]
    closing = []
    for actor in live:  # all at once: each ends its worker processes
        with contextlib.suppress(RayError):
            closing.append(actor.close.remote())
    deadline = time.monotonic() + 30
    for ref in closing:
        with contextlib.suppress(RayError, TimeoutError):
            ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
    for actor in live:
        ray.kill(actor, no_restart=True)


def checked_get(ref: Any) -> Any:
    """``ray.get`` of an evaluator's call (a reference's result, its hardware); TaskError or EvaluatorError (one
    line, as the local executor says it) when the task cannot serve as a reference or the evaluator cannot work."""
    try:
        return ray.get(ref)
    except RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, TaskError | EvaluatorError):
            raise type(cause)(str(cause)) from None
        raise


def replay_consumed(run_dir: str | Path | Location) -> frozenset[int]:
    """The cassette entries that answered the calls of the attempts a run recorded: a resumed replay does not
    serve them again. The calls of an attempt whose own row was lost (written apart from it, or dropped after a
    gap) do not count: that attempt is made again and gets the same entries."""
    try:
        rows = call_rows(run_dir)
        attempts = recorded_attempts(run_dir)  # seqs 0..attempts[task] are in the rebuilt tree
    except FileNotFoundError:
        return frozenset()
    except StoreError as e:
        raise RunError(f"{run_dir}: {e}") from None
    return frozenset(int(r["replay_entry"]) for r in rows if r.get("replay_entry") is not None
                     and r["seq"] <= attempts.get(r["task"], -1))


def recorded_tasks(run_dir: str | Path | Location) -> list[str]:
    try:
        return list(recorded_attempts(run_dir))
    except FileNotFoundError:
        return []
    except StoreError as e:
        raise RunError(f"{run_dir}: {e}") from None


def default_evaluators(cfg: EvalConfig) -> int:
    if evaluator_options(cfg).get("num_gpus"):
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if gpus < 1:
            raise RunError(f"backend {cfg.backend} needs a GPU and the Ray cluster has none")
        return gpus
    return 1


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]
