"""A read-only world for an isolated worker: the first process inside the namespaces sets it up, then becomes it.

Started by path (standard library only: no package import before the world is read-only) as
``python jail.py [--rw PATH | --ro PATH | --hide PATH | --toolchain NAME]... [--quota BYTES] -- COMMAND...`` in the
mount namespace that :mod:`stark_ray.eval.proc.isolation` creates, where it is root of its user namespace. It then

1. clones (detached, with ``open_tree``) its working directory (the worker's private directory: its requests'
   directories, its TMPDIR, its HOME) and every ``--rw`` path, and what must stay readable where it lies in
   something covered below: Python's prefixes, every entry of ``sys.path``, the directories the toolchains are
   found through (:data:`TOOLCHAIN_VARS`: PATH, CUDA_HOME, ...; and every ``--toolchain`` variable: the backends',
   which the caller names), every ``--ro`` path (the package, the build cache of a device worker), and the device
   nodes it needs (:data:`DEVICES`, the GPU's ``/dev/nvidia*``);
2. makes the whole tree read-only with one recursive ``mount_setattr`` (site-packages, the project, the home
   directory, the build cache, every other mount: nothing can be written), and the kernel's knobs under its
   ``/proc`` too (:data:`PROC_READ_ONLY`);
3. gives it a ``/dev`` of its own with only those nodes (no disk, no loop device, no kernel log: a read-only
   mount does not stop writes to a device) and a private ``/dev/shm``;
4. covers, in path order: ``/tmp`` and ``/run`` with a fresh tmpfs each (a private ``/tmp``, gone with the
   worker; none of the host's sockets), every ``--hide`` path (the evaluator's home directory and working
   directory, the run directory: :class:`stark_ray.eval.proc.launch.WorkerSpec`) with an empty one that is then made
   read-only (a file: ``/dev/null``), and puts back the clones of step 1 on their paths, on top: the working
   directory and ``--rw`` paths writable, the others read-only; a ``--hide`` path that lies inside something
   put back is covered after it. With ``--quota``, the working directory is a fresh tmpfs of that size instead
   (nothing of the host's directory in it: what it writes cannot fill the host's disk, and goes with it);
5. hides well-known credential locations (:data:`HIDDEN`) in what was put back of a home directory;
6. where the evaluator is the host's root, gives its own directory and ``--rw`` paths to an unprivileged user
   (:data:`NOBODY`) and becomes it, with no capability left and ``no_new_privs``: the candidate reads only what
   anyone may read (not ``/etc/shadow``, not other users' homes), owns no host file and cannot mount or unmount
   anything; otherwise (the evaluator's own user, mapped to root by the outer user namespace) it enters a user
   and mount namespace of its own (root mapped to root), in which every mount above is *locked*: a candidate,
   root in that namespace, can neither remount them writable nor unmount what covers a path (Linux locks the
   mounts a less privileged mount namespace inherits); then, in a session of its own (a signal to its process
   group cannot reach ``unshare`` outside the namespace), it executes ``COMMAND``, which stays the namespace's
   first process.

A path is never hidden that is, or holds, a system directory (:data:`NEVER_HIDDEN`: the root, ``/usr``, ...).
It needs Linux 5.12 or later (``mount_setattr``); where a step fails it exits with code 97 and one line on stderr,
which the probe of :func:`stark_ray.eval.proc.isolation.isolation_prefix` reports.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

HIDDEN = (".aws", ".ssh", ".gnupg", ".azure", ".kube", ".docker", ".config/gcloud", ".config/gh", ".netrc",
          ".git-credentials", ".pgpass", ".pypirc", ".npmrc", ".cache/huggingface", ".huggingface", ".kaggle",
          ".vault-token", ".s3cfg", ".boto", ".bash_history", ".zsh_history", ".python_history", ".psql_history",
          ".mysql_history", ".config/stark-ray")
# the kernel's knobs under the namespace's own /proc: read-only (a root candidate could set core_pattern and have
# the kernel run a program of its, outside every namespace, on the next crash)
PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")
# sockets of the host's services (a read-only mount does not stop a connect): covered, but for the driver's
KEEP_IN_RUN = ("/run/nvidia-persistenced",)
PRIVATE = ("/tmp", "/run")  # a fresh, writable tmpfs each (and /dev/shm, in the worker's own /dev) ...
TMPFS_SIZES = {"/tmp": "2g", "/run": "64m", "/dev/shm": "1g"}  # ... at most this big (tmpfs lives in host memory)
# never hidden, nor a directory holding one (the root): what every program needs
NEVER_HIDDEN = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/var", "/proc",
                "/sys", "/dev", "/run", "/tmp", "/boot", "/nix", "/gnu", "/snap")
# where the toolchains are found through the environment: put back where they lie in something hidden (with the
# backends' own, named by --toolchain)
TOOLCHAIN_VARS = ("PATH", "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH",
                  "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CC", "CXX", "CUDAHOSTCXX")
# the device nodes of the worker's /dev, beside the GPU's (/dev/nvidia*): no disk, no loop device, no kernel log
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
FAILED = 97  # the exit code of a world that could not be made
NOBODY = 65534  # who a candidate of a root evaluator is: it owns nothing of the host

# x86_64 and aarch64 share these (system calls added since Linux 5.1 have one number everywhere)
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442
_OPEN_TREE_CLONE, _AT_RECURSIVE, _AT_EMPTY_PATH, _MOVE_MOUNT_F_EMPTY_PATH = 1, 0x8000, 0x1000, 0x4
_AT_FDCWD = -100
_MOUNT_ATTR_RDONLY = 0x1
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 2, 4, 4096, 0x4000, 1 << 18
_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_PR_SET_NO_NEW_PRIVS = 38

_libc = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


class JailError(OSError):
    pass


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise JailError(err, f"{what}: {os.strerror(err)}")
    return result


def _syscall(number: int, *args: object) -> int:
    return int(_libc.syscall(ctypes.c_long(number), *args))


def _clone_tree(path: str) -> int:
    flags = _OPEN_TREE_CLONE | _AT_RECURSIVE | os.O_CLOEXEC
    return _check(_syscall(_SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(path), flags), f"open_tree {path}")


def _set_attr(dirfd: int, path: str, flags: int, set_: int = 0, clear: int = 0, what: str = "",
              recursive: bool = True) -> None:
    attr = _MountAttr(set_, clear, 0, 0)
    flags |= _AT_RECURSIVE if recursive else 0
    _check(_syscall(_SYS_MOUNT_SETATTR, dirfd, os.fsencode(path), flags, ctypes.byref(attr), ctypes.sizeof(attr)),
           f"mount_setattr {what or path}")


def _move(tree: int, path: str) -> None:
    _check(_syscall(_SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, os.fsencode(path), _MOVE_MOUNT_F_EMPTY_PATH),
           f"move_mount {path}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(os.fsencode(source), os.fsencode(target), fstype.encode() if fstype else None,
                       ctypes.c_ulong(flags), data.encode() if data else None), f"mount {target}")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _paths_in(env: dict[str, str], toolchain: list[str]) -> list[str]:
    """The directories the toolchains find through the environment (compilers, CUDA, libraries; ``toolchain``:
    more variables to read, the backends')."""
    found = []
    for name in (*TOOLCHAIN_VARS, *toolchain):
        for part in env.get(name, "").split(os.pathsep):
            if part and os.path.isabs(part):
                found.append(part if os.path.isdir(part) else os.path.dirname(part))
    return found


def _hideable(path: str) -> bool:
    """Whether ``path`` may be hidden: never the root nor a system directory (nor one holding one)."""
    real = os.path.realpath(path)
    return os.path.exists(real) and not any(_under(system, real) for system in NEVER_HIDDEN)


def _without_nested(paths: set[str]) -> set[str]:
    return {p for p in paths if not any(q != p and _under(p, q) for q in paths)}


def _closed_ancestors(paths: set[str]) -> set[str]:
    """The directories above ``paths`` that others may not cross (no search permission for them)."""
    closed = set()
    for path in paths:
        parent = os.path.dirname(path)
        while parent not in ("/", ""):
            try:
                if not os.stat(parent).st_mode & 0o001 and _hideable(parent):
                    closed.add(parent)
            except OSError:
                pass
            parent = os.path.dirname(parent)
    return closed


def build_world(writable: list[str], readable: list[str], hidden: list[str], unprivileged: bool = False,
                quota: int = 0, toolchain: list[str] | None = None) -> None:
    """Steps 1-5 of the module's doc, in this process's mount namespace (``readable``: more paths that stay
    visible, read-only, wherever they lie; ``hidden``: directories (or files) covered, but for what of them
    must stay visible; ``unprivileged``: for a process that will not be root, what it needs lies below
    directories it may cross; ``quota``: the working directory a tmpfs of that many bytes; ``toolchain``: more
    variables naming the toolchains' paths, beside :data:`TOOLCHAIN_VARS`)."""
    here = os.getcwd()
    _mount("none", "/", None, _MS_REC | _MS_PRIVATE)  # nothing done here reaches the host's namespace
    for path in (*writable, *readable):  # a path not made yet (a new build cache) is the host's, not a private one
        if not os.path.lexists(path):
            os.makedirs(path, exist_ok=True)
    for path in writable:  # its own directory, a cache: never a system directory (/tmp: every other worker's)
        if not _hideable(path):
            raise JailError(errno.EINVAL, f"{path} cannot be made writable in the read-only world")
    covered = {os.path.realpath(p) for p in hidden if _hideable(p)}
    private = [p for p in PRIVATE if os.path.isdir(p) and not os.path.islink(p)]  # /var/run: a link to /run
    roots = covered | set(private)
    keep_rw = _without_nested({os.path.realpath(p) for p in writable if os.path.isdir(p)})
    python = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, *sys.path]
    # a Python path that is itself hidden (the project, on sys.path) is not put back: what of it is needed is
    # named with --ro (the package); /tmp itself (PYTHONPATH=/tmp, say) would bring back every other worker's
    found = _paths_in(dict(os.environ), toolchain or [])
    wanted = {os.path.realpath(p) for p in (*python, *found) if p and os.path.isdir(p)}
    wanted = {p for p in wanted if p not in roots}
    wanted |= {os.path.realpath(p) for p in readable if os.path.exists(p)}
    wanted |= {p for p in KEEP_IN_RUN if os.path.isdir(p)}
    if unprivileged:  # a directory others may not cross (/root: 0700) is covered, but for what is needed below it
        closed = _closed_ancestors(wanted | keep_rw) - roots
        covered |= closed
        roots |= closed
    keep_ro = _without_nested({p for p in wanted if any(_under(p, r) and p != r for r in roots)
                               or p in covered} - keep_rw)
    keep_ro = {p for p in keep_ro if not any(_under(p, w) for w in keep_rw)}
    devices = _device_trees()
    # every step in path order, a cover before what is put back on it: what lies inside is done later, on top
    quota_at = os.path.realpath(here) if quota else None
    steps = sorted([(p, 0, "private") for p in private] + [(p, 0, "hidden") for p in covered]
                   + [(p, 1, "quota" if p == quota_at else _clone_tree(p)) for p in keep_rw]
                   + [(p, 2, _clone_tree(p)) for p in keep_ro], key=lambda t: (len(t[0]), t[1]))
    _set_attr(_AT_FDCWD, "/", 0, set_=_MOUNT_ATTR_RDONLY, what="/ (read-only)")
    _set_attr(_AT_FDCWD, "/proc", 0, clear=_MOUNT_ATTR_RDONLY, what="/proc")  # this namespace's own
    for knob in PROC_READ_ONLY:
        if os.path.exists(knob):
            _mount(knob, knob, None, _MS_BIND | _MS_REC)
            _set_attr(_AT_FDCWD, knob, 0, set_=_MOUNT_ATTR_RDONLY, what=knob)
    _make_dev(devices)
    sealed = []
    for path, kind, what in steps:
        if kind == 0:
            if not os.path.exists(path):  # under a cover already, and not put back
                continue
            if what == "hidden" and not os.path.isdir(path):
                _mount("/dev/null", path, None, _MS_BIND)
                continue
            mode = "mode=1777" if path in ("/tmp", "/dev/shm") else "mode=0755"
            if path in TMPFS_SIZES:  # the host's memory, which these take from, is not the candidate's to fill
                mode += f",size={TMPFS_SIZES[path]}"
            _mount("tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV, mode)
            if what == "hidden":
                sealed.append(path)
            continue
        if what == "quota":  # its own directory: a tmpfs of its size, on the cover or the host's directory
            os.makedirs(path, exist_ok=True)
            _mount("tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=0755,size={quota}")
            continue
        assert isinstance(what, int)
        if kind == 2:
            _set_attr(what, "", _AT_EMPTY_PATH, set_=_MOUNT_ATTR_RDONLY, what=f"{path} (read-only)")
        if os.path.isdir(path) or not os.path.exists(path):
            os.makedirs(path, exist_ok=True)  # its mount point, on a cover
        _move(what, path)
        os.close(what)
    for path in sealed:  # the covers themselves read-only (not what was put back on them)
        _set_attr(_AT_FDCWD, path, 0, set_=_MOUNT_ATTR_RDONLY, what=f"{path} (read-only)", recursive=False)
    for home in {*covered, os.environ.get("HOME") or "/nonexistent"}:  # what of a home was put back
        for name in HIDDEN:
            _hide(os.path.join(home, name))
    os.chdir(here)  # the directory put back, not the one it covers


def _device_trees() -> list[tuple[str, bool, int]]:
    """Clones of the device nodes a worker needs (the basic ones, the GPU's), before /dev is covered."""
    names = [n for n in DEVICES if os.path.exists(f"/dev/{n}")]
    names += sorted(n for n in os.listdir("/dev") if n.startswith("nvidia")) if os.path.isdir("/dev") else []
    return [(n, os.path.isdir(f"/dev/{n}"), _clone_tree(f"/dev/{n}")) for n in names]


def _make_dev(devices: list[tuple[str, bool, int]]) -> None:
    """A /dev of its own: a tmpfs with only ``devices`` put back (no disk, no loop device, no kernel log), read-only."""
    if not os.path.isdir("/dev") or os.path.islink("/dev"):
        return
    _mount("tmpfs", "/dev", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=64k")
    for name, is_dir, tree in devices:
        path = f"/dev/{name}"
        if is_dir:
            os.mkdir(path)
        else:
            open(path, "w").close()
        _move(tree, path)
        os.close(tree)
    os.mkdir("/dev/shm")
    _mount("tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=1777,size={TMPFS_SIZES['/dev/shm']}")
    for link, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"/dev/{link}")
    _set_attr(_AT_FDCWD, "/dev", 0, set_=_MOUNT_ATTR_RDONLY, what="/dev (read-only)", recursive=False)


def _hide(path: str) -> None:
    if not os.path.exists(path):  # a link is followed: what it points to is covered
        return
    if os.path.isdir(path):
        _mount("tmpfs", path, "tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV, "size=4k,mode=0555")
    else:
        _mount("/dev/null", path, None, _MS_BIND)


def lock_world() -> None:
    """Step 6: a user and mount namespace of its own, root mapped to root; the inherited mounts are locked."""
    uid, gid = os.geteuid(), os.getegid()
    _check(_libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS), "unshare")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"0 {uid} 1")
    _write("/proc/self/gid_map", f"0 {gid} 1")


def host_root() -> bool:
    """Whether this process is root of the host's own user namespace (an evaluator run as root: a container, a
    cloud image), where a candidate mapped to it would own every root-owned file it can see."""
    try:
        with open("/proc/self/uid_map") as f:
            return os.geteuid() == 0 and f.read().split() == ["0", "0", "4294967295"]
    except OSError:
        return False


def drop_root(writable: list[str]) -> None:
    """Step 6 where the evaluator is the host's root: ``writable`` given to :data:`NOBODY`, which this process
    becomes, with no capability and no way back (``no_new_privs``: a set-user-ID program grants nothing). It can
    neither mount nor unmount here, and mounts it sees from a namespace of its own are locked."""
    for path in writable:
        if os.path.isdir(path):
            os.chown(path, NOBODY, NOBODY)
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


def main(argv: list[str]) -> None:
    try:
        paths: dict[str, list[str]] = {"--rw": [os.getcwd()], "--ro": [], "--hide": [], "--toolchain": [],
                                       "--quota": []}
    except OSError as e:
        _fail(e)
    args = list(argv)
    while len(args) > 1 and args[0] in paths:
        paths[args[0]].append(args[1])
        args = args[2:]
    quota = paths["--quota"][-1] if paths["--quota"] else "0"
    if not args or args[0] != "--" or len(args) < 2 or not quota.isdigit():
        print("usage: jail.py [--rw PATH | --ro PATH | --hide PATH | --toolchain NAME]... [--quota BYTES] "
              "-- COMMAND...", file=sys.stderr)
        sys.exit(2)
    command = args[1:]
    os.umask(0o022)  # the mount points it makes: crossable by the worker, whoever it is (the caller's may be 077)
    try:
        unprivileged = host_root()
        build_world(paths["--rw"], paths["--ro"], paths["--hide"], unprivileged, int(quota), paths["--toolchain"])
        if unprivileged:
            drop_root(paths["--rw"])
        else:
            lock_world()
        # a session and process group of its own: `kill(0, ...)` by a candidate would otherwise reach `unshare`,
        # outside the namespace, which shares the group it was started in
        os.setsid()
    except (OSError, ValueError) as e:  # ValueError: a path that cannot be encoded
        _fail(e)
    try:
        os.execvp(command[0], command)
    except OSError as e:
        _fail(e)


def _fail(e: BaseException) -> None:
    why = e.strerror if isinstance(e, JailError) else e  # JailError: what failed and why, without the number
    print(f"a read-only world for the worker could not be made: {why}", file=sys.stderr, flush=True)
    os._exit(FAILED)


if __name__ == "__main__":
    main(sys.argv[1:])
