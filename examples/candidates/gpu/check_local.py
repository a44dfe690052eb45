"""Check the GPU candidates against expected.json without the evaluator, one line per candidate.

Default (no GPU needed): `triton` candidates run under TRITON_INTERPRET=1 on CPU tensors against the task's
Model; `cuda` sources compile with nvcc (the C++ wrapper is syntax-checked with g++); `cuda_nvrtc` sources
compile with nvcc. With --gpu, every candidate runs for real on the CUDA device, each in its own subprocess.
Usage: python examples/candidates/gpu/check_local.py [--gpu] [NAME_SUBSTRING ...]

This is a quick check of the candidates' code, not the evaluator: it skips the candidates of KernelBench tasks
(``kernelbench:...``, at their own sizes), and with --gpu it has no judge, no special trials and no wall-clock
confirmation, so the integrity expectations (tampered, unordered_stream, suspicious, a sampling reduction caught
by the sensitivity trial) are what ``pytest -m gpu tests/test_gpu.py`` checks.
"""

import os
import sys

GPU = "--gpu" in sys.argv or "--gpu-one" in sys.argv
if not GPU:
    os.environ["TRITON_INTERPRET"] = "1"  # must be set before triton is first imported

import ast  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sysconfig  # noqa: E402
import tempfile  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
TASKS = HERE.parent.parent / "tasks"
EXPECTED = json.loads((HERE / "expected.json").read_text())
TOL = 1e-2  # atol, rtol and the bound on ||out - ref|| / ||ref||
RUN_SECONDS = 60  # --gpu: time allowed for the trials once the candidate is built


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compare(out, ref) -> tuple[bool, str]:
    if not isinstance(out, torch.Tensor) or out.shape != ref.shape or out.dtype != ref.dtype:
        return False, f"got {type(out).__name__} {getattr(out, 'shape', '')}, want {tuple(ref.shape)}"
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    close = torch.allclose(out, ref, atol=TOL, rtol=TOL)
    rel = ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    ok = close and rel < TOL  # rel < TOL also fails NaN
    return ok, f"allclose={close} rel_err={rel:.1e}"


def trials(task, model, new, device: str, n: int = 2) -> tuple[str, str]:
    """Fresh seeded inputs each trial; the reference runs first. Returns (stage, detail)."""
    detail = ""
    for trial in range(n):
        torch.manual_seed(1000 + trial)
        inputs = [t.to(device) for t in task.get_inputs()]
        saved = [t.clone() for t in inputs]
        with torch.no_grad():
            ref = model(*inputs)
            torch.full_like(ref, float("nan"))  # freed at once: poisons the block torch.empty may reuse
            out = new(*inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        if isinstance(out, torch.Tensor) and any(out.data_ptr() == t.data_ptr() for t in inputs):
            return "correctness", f"trial {trial}: the output aliases an input"
        if any(not torch.equal(a, b) for a, b in zip(inputs, saved, strict=True)):
            return "correctness", f"trial {trial}: an input was modified"
        ok, detail = compare(out, ref)
        if not ok:
            return "correctness", f"trial {trial}: {detail}"
    return "ok", detail


def build(task, path: Path, device: str):
    init = task.get_init_inputs()
    torch.manual_seed(0)
    model = task.Model(*init).to(device)
    module = load(path, "candidate_" + path.stem)  # may raise: a build error
    torch.manual_seed(0)
    return model, module.ModelNew(*init).to(device)


def matches(observed: str, expect: str) -> bool:
    if expect == "crash_or_runtime":
        return observed in ("crash", "runtime")
    return observed in expect.split("|")


# ---- CPU: Triton interpreter ------------------------------------------------------------------------


def check_triton(path: Path, meta: dict) -> tuple[str, str]:
    from triton.runtime.interpreter import InterpretedFunction

    launches = []
    original = InterpretedFunction.run

    def counting_run(self, *args, **kwargs):
        launches.append(self.__name__)
        return original(self, *args, **kwargs)

    InterpretedFunction.run = counting_run
    try:
        task = load(TASKS / f"{meta['task']}.py", "task_" + meta["task"])
        model, new = build(task, path, "cpu")
        stage, detail = trials(task, model, new, "cpu")
    finally:
        InterpretedFunction.run = original
    if stage == "ok" and not launches:
        stage = "flag:no_kernel"
    return stage, f"{detail}, {len(launches)} launches"


# ---- CPU: compile the CUDA sources --------------------------------------------------------------------


def strings(path: Path) -> dict:
    """Module-level string constants of a candidate (_CUDA, _CPP, _SOURCE), read without importing it."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found[node.targets[0].id] = node.value.value
    return found


def run(cmd: list, cwd: str) -> tuple[bool, str]:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "error" in ln]
    return proc.returncode == 0, (errors[0].strip() if errors else "")[:150]


def nvcc(source: str, tmp: str) -> tuple[bool, str]:
    work = tempfile.mkdtemp(dir=tmp)
    Path(work, "k.cu").write_text(source)
    return run(["nvcc", "-arch=sm_90", "-O3", "-c", "k.cu", "-o", "k.o"], work)


def check_wrappers(paths: list, tmp: str) -> dict:
    """g++ -fsyntax-only over all the _CPP wrappers in one file, so torch's headers are parsed once: each
    wrapper sits in its own namespace behind a #line naming its file. Returns {file name: first error or ''}."""
    includes, bodies = {}, []
    for i, path in enumerate(paths):
        lines = strings(path)["_CPP"].splitlines()
        includes.update(dict.fromkeys(ln for ln in lines if ln.startswith("#include")))
        body = "\n".join("" if ln.startswith("#include") else ln for ln in lines)
        bodies.append(f'namespace candidate_{i} {{\n#line 1 "{path.name}"\n{body}\n}}\n')
    # the CPU build of torch lacks this generated header, which c10/cuda/CUDAStream.h includes
    stub = Path(tmp, "stub/c10/cuda/impl")
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    Path(tmp, "wrappers.cpp").write_text("\n".join(includes) + "\n" + "".join(bodies))
    from torch.utils.cpp_extension import include_paths

    dirs = [str(stub.parents[2]), *include_paths(), "/usr/local/cuda/include", sysconfig.get_paths()["include"]]
    proc = subprocess.run(
        ["g++", "-std=c++20", "-w", "-fsyntax-only", *[f"-I{d}" for d in dirs], "wrappers.cpp"],
        cwd=tmp,
        capture_output=True,
        text=True,
    )
    errors = {path.name: "" for path in paths}
    for line in proc.stderr.splitlines():
        m = re.match(r"(\S+\.py):\d+:\d+: (fatal )?error: ", line)
        if m and m.group(1) in errors and not errors[m.group(1)]:
            errors[m.group(1)] = line[:150]
    if proc.returncode and not any(errors.values()):  # failed outside the wrappers (e.g. a missing header)
        errors = dict.fromkeys(errors, "g++: " + proc.stderr.strip().splitlines()[-1][:150])
    return errors


def check_sources(path: Path, meta: dict, tmp: str, wrapper_errors: dict) -> tuple[str, str]:
    src = strings(path)
    if meta["backend"] == "cuda_nvrtc":
        ok, err = nvcc(src["_SOURCE"], tmp)
        return ("compiled" if ok else "compile"), err or "nvcc ok"
    if "_CUDA" not in src:
        return "flag:no_kernel", "no CUDA sources"
    ok, err = nvcc(src["_CUDA"], tmp)
    if not ok:
        return "compile", err
    err = wrapper_errors.get(path.name, "")
    return ("compile" if err else "compiled"), "nvcc ok, " + (err or "g++ -fsyntax-only ok")


def cpu_verdict(observed: str, expect: str, backend: str) -> bool:
    if backend == "triton":
        return matches(observed, expect)
    if observed == "compiled":  # compiling is all a CPU can show: anything but a compile error expected
        return expect != "compile"
    return matches(observed, expect)


# ---- GPU: each candidate in a subprocess ----------------------------------------------------------------


def kernels(prof) -> list:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.loads(Path(f.name).read_text()).get("traceEvents", [])
    return [(e["name"], e.get("args", {}).get("stream")) for e in events if e.get("cat") == "kernel"]


def gpu_one(path: Path) -> None:
    """Child process: print one JSON line {stage, detail}. SIGALRM (default action) ends a hung run."""
    from torch.profiler import ProfilerActivity, profile

    meta = EXPECTED[path.name]
    task = load(TASKS / f"{meta['task']}.py", "task_" + meta["task"])
    try:
        model, new = build(task, path, "cuda")
    except Exception as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [type(e).__name__]
        first_error = next((ln for ln in lines if "error:" in ln), lines[-1])  # e.g. nvcc's first error
        print(json.dumps({"stage": "compile", "detail": first_error[:150]}))
        return
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(RUN_SECONDS)
    try:
        torch.manual_seed(7)
        x = [t.cuda() for t in task.get_inputs()]
        with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof_ref:
            model(*x)
            torch.cuda.synchronize()
        with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof_new:
            new(*x)
            torch.cuda.synchronize()
        stage, detail = trials(task, model, new, "cuda")
    except Exception as e:
        msg = " | ".join(ln.strip() for ln in str(e).splitlines() if ln.strip())[:200]
        fatal = "illegal memory access" in msg or "unspecified launch failure" in msg
        print(json.dumps({"stage": "crash" if fatal else "runtime", "detail": msg}))
        return
    ref_streams = {s for _, s in kernels(prof_ref)}
    ours = re.findall(
        r"__global__\s+void\s+(?:__launch_bounds__\(\w+\)\s+)?(\w+)|@triton\.jit\s+def\s+(\w+)", path.read_text()
    )
    names = {a or b for a, b in ours}
    launched = kernels(prof_new)
    own = [(k, s) for k, s in launched if any(n in k for n in names)]
    if stage == "ok" and not own:
        stage = "flag:no_kernel"
    elif stage == "ok" and ref_streams and any(s not in ref_streams for _, s in own):
        stage = "flag:extra_stream"
    detail += f", own kernels {sorted({k[:30] for k, _ in own})} streams {sorted({s for _, s in own})}"
    print(json.dumps({"stage": stage, "detail": detail + f" (reference streams {sorted(ref_streams)})"}))


def gpu_check(path: Path) -> tuple[str, str]:
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "--gpu-one", str(path)], capture_output=True, text=True, timeout=900
        )
    except subprocess.TimeoutExpired:
        return "timeout", "no answer in 900 s"
    if proc.returncode == -signal.SIGALRM:
        return "timeout", f"still running after {RUN_SECONDS} s"
    if proc.returncode < 0:
        return "crash", f"killed by signal {-proc.returncode}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return "crash", f"exit {proc.returncode}: {proc.stderr.strip()[-150:]}"
    result = json.loads(lines[-1])
    return result["stage"], result["detail"]


def report(f: str, observed: str, detail: str) -> bool:
    meta = EXPECTED[f]
    good = matches(observed, meta["expect"]) if GPU else cpu_verdict(observed, meta["expect"], meta["backend"])
    print(f"{'PASS' if good else 'FAIL'}  {f:48s} expect={meta['expect']:30s} got={observed:16s} {detail}", flush=True)
    return good


def main() -> int:
    if "--gpu-one" in sys.argv:
        gpu_one(Path(sys.argv[-1]))
        return 0
    wanted = [a for a in sys.argv[1:] if not a.startswith("--")]
    files = [f for f in EXPECTED if (not wanted or any(w in f for w in wanted))
             and not EXPECTED[f]["task"].startswith("kernelbench:")]
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        if GPU:
            with ThreadPoolExecutor(8) as pool:  # the builds dominate; they run side by side
                for f, result in zip(files, pool.map(lambda f: gpu_check(HERE / f), files), strict=True):
                    bad += not report(f, *result)
        else:
            sources = [f for f in files if EXPECTED[f]["backend"] != "triton"]
            wrappers = [HERE / f for f in sources if "_CPP" in strings(HERE / f)]
            wrapper_errors = check_wrappers(wrappers, tmp) if wrappers else {}
            with ThreadPoolExecutor(4) as pool:
                checked = pool.map(lambda f: check_sources(HERE / f, EXPECTED[f], tmp, wrapper_errors), sources)
                compiled = dict(zip(sources, checked, strict=True))
            for f in files:
                bad += not report(f, *(compiled[f] if f in compiled else check_triton(HERE / f, EXPECTED[f])))
    print(f"{len(files) - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
