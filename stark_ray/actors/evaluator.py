"""The Evaluator actor: one per GPU (``num_gpus=1``; CPU backends take a CPU instead), a shell over
:class:`~stark_ray.eval.service.EvalService` — its warm device worker and compile pool live as long as it does.

The actor is threaded (``max_concurrency``): every evaluation sent to it runs at once up to the service's
device lock, so a ``cuda`` candidate builds in the compile pool while the device checks and times the ones
already built. Candidates run in the service's worker process, so a crashing kernel costs a worker, not the
actor. Should the
actor itself die (out of memory, a candidate that kills it, a user's ``kill -9``), Ray restarts it
(``max_restarts``) but never retries a call (``max_task_retries=0``): the driver decides. While a candidate is on
the device its digest is in a note of the actor's own (:func:`note_path`, on the actor's host); the restarted
actor reads what the dead one left there and says, in :meth:`where`, which candidate it died running (None: it
was building or waiting, or the actor came back on another host). The driver charges that candidate alone and
sends the others in flight again — unless Ray's memory monitor killed the actor (the host ran low on memory): then
no candidate is charged (run/evaluator_deaths.py).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import uuid
from pathlib import Path
from typing import Any

import ray

from stark_ray.config import EvalConfig
from stark_ray.eval.backends import get_backend
from stark_ray.eval.service import EvalService, EvaluatorError
from stark_ray.eval.tasks import Task
from stark_ray.records import EvalResult


@ray.remote(max_restarts=-1, max_task_retries=0)
class EvaluatorActor:
    def __init__(self, cfg: EvalConfig) -> None:
        self.cfg = cfg
        self.instance = uuid.uuid4().hex  # this process of the actor (a restart is another)
        note = note_path(ray.get_runtime_context().get_actor_name() or f"evaluator-{os.getpid()}")
        self._note = note
        self.died_running = take_note(note)  # the candidate the previous process of this actor died running
        on_gpu = get_backend(cfg.backend).device == "cuda"
        self._service: EvalService | None = None
        self._error: EvaluatorError | None = None
        try:
            self._service = EvalService(cfg, device=0 if on_gpu else None)  # Ray set CUDA_VISIBLE_DEVICES: its GPU
            self._service.running_note = note
        except EvaluatorError as e:  # every call raises it (an __init__ that raised would be ActorDiedError,
            self._error = e  # a traceback to the user instead of the reason in one line)

    @property
    def service(self) -> EvalService:
        if self._service is None:
            raise EvaluatorError(str(self._error))
        return self._service

    def reference(self, task: Task) -> EvalResult:
        """Raises TaskError (to the caller) when the task cannot serve as a reference."""
        return self.service.reference(task)

    def evaluate(self, task: Task, source: str) -> EvalResult:
        return self.service.evaluate(task, source)

    def activity(self) -> dict[str, tuple[str, float]]:
        """What each candidate in evaluation here is going through now, by its digest (for the live view)."""
        return self.service.activity() if self._service is not None else {}

    def hardware(self) -> dict[str, Any]:
        """The device's description for the prompts, its class (evaluators of one class share tasks) and where
        its worker's start went (starting the worker the first time). EvaluatorError when this host cannot
        evaluate."""
        return {"description": self.service.hardware_description(), "class": self.service.hardware_class(),
                "device": self.service.device_kind(),
                "start_phases": self.service.hello().get("start_phases", {}), "instance": self.instance,
                "node": ray.get_runtime_context().get_node_id()}

    def where(self) -> dict[str, Any]:
        """The actor's process (``instance``: which start of it), Ray node and GPU; ``died_running``: the digest of the
        candidate that was on the device when its previous process died, if it was one."""
        return {"pid": os.getpid(), "instance": self.instance, "died_running": self.died_running,
                "node": ray.get_runtime_context().get_node_id(),
                "gpus": [str(g) for g in ray.get_gpu_ids()],
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def close(self) -> None:
        if self._service is not None:
            self._service.close()
        take_note(self._note)  # a run that ends leaves no note behind


def note_path(actor_name: str) -> Path | None:
    """Where an Evaluator actor names the candidate on its device: in a directory of this user's alone on the
    actor's host (the actor's processes come and go; its name stays). None where that directory is not this
    user's own and private (another user made it first, say): then there is no note, and a death with candidates
    in flight sends them all again (the driver's rule without a note)."""
    folder = Path(tempfile.gettempdir()) / f"stark-ray-running-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        st = folder.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return folder / actor_name


def take_note(note: Path | None) -> str | None:
    """What a dead process of this actor left in its note (and the note gone), or None."""
    if note is None:
        return None
    try:
        digest = note.read_text().strip()[:64] or None
    except OSError:
        return None
    with contextlib.suppress(OSError):
        note.unlink()
    return digest


EVALUATOR_THREADS = 64  # evaluations one actor takes at once (they wait for the device; builds run meanwhile)


def evaluator_options(cfg: EvalConfig) -> dict[str, Any]:
    """A GPU backend's actor takes one GPU; a CPU backend's takes one CPU (its worker times on it)."""
    if get_backend(cfg.backend).device == "cuda":
        return {"num_gpus": 1, "num_cpus": 0, "max_concurrency": EVALUATOR_THREADS}
    return {"num_cpus": 1, "max_concurrency": EVALUATOR_THREADS}
