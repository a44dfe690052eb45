"""The process ``ncu`` watches for ``--profile ncu`` (:mod:`stark_ray.eval.ncu`): a candidate's ModelNew on the task's
inputs, made as the worker makes them — one call to warm it (builds, caches, autotuning), then one call between
``cudaProfilerStart`` and ``cudaProfilerStop``, which ncu counts (it runs with ``--profile-from-start off``).

    python -m stark_ray.eval.worker.ncu_target --backend B --build-dir D --task T.py --name NAME --candidate C.py
    --seed S

Started isolated as the worker is, and killed with its process tree when it takes too long.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

from stark_ray.eval.backends import get_backend
from stark_ray.eval.loader import import_file
from stark_ray.eval.measure.inputs import make_inputs
from stark_ray.eval.proc.lifetime import die_with_parent
from stark_ray.eval.tasks import load_reference
from stark_ray.eval.worker.warm_reference import on_device


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="stark_ray.eval.worker.ncu_target")
    for flag in ("--backend", "--build-dir", "--task", "--name", "--candidate"):
        p.add_argument(flag, required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    die_with_parent()
    backend = get_backend(args.backend)
    backend.prepare_worker(Path(args.build_dir), 1)
    import torch

    torch.set_grad_enabled(False)
    module, reference, init_inputs = load_reference(args.name, Path(args.task).read_text(), args.seed, backend.device)
    del reference  # only its module and init inputs are needed: its parameters go back to the device
    candidate = import_file(Path(args.candidate), "stark_candidate")
    torch.manual_seed(args.seed)  # as the worker builds it: the reference's parameters
    model = on_device(candidate.ModelNew(*copy.deepcopy(init_inputs)), backend.device)
    inputs = make_inputs(module.get_inputs, args.seed, 1.0, backend.device)
    model(*inputs)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    model(*inputs)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
