"""A read-only world for an isolated worker: the first process inside the namespaces sets it up, then becomes it.

Started by path (standard library only: no package import before the world is read-only) as
``python jail.py [--rw PATH | --ro PATH]... -- COMMAND...`` in the mount namespace that :mod:`stark_ray.eval.isolation`
creates, where it is root of its user namespace. It then

1. clones (detached, with ``open_tree``) its working directory (the worker's private directory: its requests'
   directories, its TMPDIR) and every ``--rw`` path, and what must stay readable where it lies under ``/tmp``:
   Python's prefixes, every entry of ``sys.path``, every ``--ro`` path (the build cache of a device worker);
2. makes the whole tree read-only with one recursive ``mount_setattr`` (site-packages, the project, the home
   directory, the build cache, every other mount: nothing can be written);
3. mounts a fresh tmpfs on ``/tmp`` and on ``/dev/shm`` (a private ``/tmp``, gone with the worker), and puts back
   the clones on their paths: the working directory and ``--rw`` paths writable, the others read-only;
4. hides well-known credential locations of the home directory (:data:`HIDDEN`) under an empty read-only tmpfs
   (a directory) or ``/dev/null`` (a file): nothing a candidate prints to its log can carry them out;
5. enters a user and mount namespace of its own (root mapped to root), in which every mount above is *locked*:
   a candidate, root in that namespace, can neither remount them writable nor unmount what covers a path
   (Linux locks the mounts a less privileged mount namespace inherits); then, in a session of its own (a signal
   to its process group cannot reach ``unshare`` outside the namespace), it executes ``COMMAND``, which stays the
   namespace's first process.

It needs Linux 5.12 or later (``mount_setattr``); where a step fails it exits with code 97 and one line on stderr,
which the probe of :func:`stark_ray.eval.isolation.isolation_prefix` reports.
"""

from __future__ import annotations

import ctypes
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
FAILED = 97  # the exit code of a world that could not be made

# x86_64 and aarch64 share these (system calls added since Linux 5.1 have one number everywhere)
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442
_OPEN_TREE_CLONE, _AT_RECURSIVE, _AT_EMPTY_PATH, _MOVE_MOUNT_F_EMPTY_PATH = 1, 0x8000, 0x1000, 0x4
_AT_FDCWD = -100
_MOUNT_ATTR_RDONLY = 0x1
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 2, 4, 4096, 0x4000, 1 << 18
_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000

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


def _set_attr(dirfd: int, path: str, flags: int, set_: int = 0, clear: int = 0, what: str = "") -> None:
    attr = _MountAttr(set_, clear, 0, 0)
    _check(_syscall(_SYS_MOUNT_SETATTR, dirfd, os.fsencode(path), flags | _AT_RECURSIVE, ctypes.byref(attr),
                    ctypes.sizeof(attr)), f"mount_setattr {what or path}")


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


def build_world(writable: list[str], readable: list[str], home: str | None) -> None:
    """Steps 1-4 of the module's doc, in this process's mount namespace (``readable``: more paths that must stay
    visible, read-only, where they lie under ``/tmp``)."""
    here = os.getcwd()
    _mount("none", "/", None, _MS_REC | _MS_PRIVATE)  # nothing done here reaches the host's namespace
    for path in (*writable, *readable):  # a path not made yet (a new build cache) is the host's, not a private one
        os.makedirs(path, exist_ok=True)
    keep_rw = {os.path.realpath(p) for p in writable if os.path.isdir(p)}
    python = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, *sys.path, *readable]
    # strictly below /tmp: /tmp itself (PYTHONPATH=/tmp, say) would bring back every other worker's directory
    keep_ro = {os.path.realpath(p) for p in python if p and os.path.isdir(p) and os.path.realpath(p) != "/tmp"
               and _under(os.path.realpath(p), "/tmp")} - keep_rw
    keep_ro |= {p for p in KEEP_IN_RUN if os.path.isdir(p)}
    # a parent before what lies inside it: what is put back later lies on top
    trees = sorted([(p, _clone_tree(p), True) for p in keep_rw] + [(p, _clone_tree(p), False) for p in keep_ro],
                   key=lambda t: len(t[0]))
    _set_attr(_AT_FDCWD, "/", 0, set_=_MOUNT_ATTR_RDONLY, what="/ (read-only)")
    _set_attr(_AT_FDCWD, "/proc", 0, clear=_MOUNT_ATTR_RDONLY, what="/proc")  # this namespace's own
    for knob in PROC_READ_ONLY:
        if os.path.exists(knob):
            _mount(knob, knob, None, _MS_BIND | _MS_REC)
            _set_attr(_AT_FDCWD, knob, 0, set_=_MOUNT_ATTR_RDONLY, what=knob)
    for private in ("/tmp", "/dev/shm"):
        if os.path.isdir(private):
            _mount("tmpfs", private, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")
    if os.path.isdir("/run") and not os.path.islink("/run"):  # /var/run is a link to it where it exists
        _mount("tmpfs", "/run", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755")
    for path, tree, rw in trees:
        if not rw:
            _set_attr(tree, "", _AT_EMPTY_PATH, set_=_MOUNT_ATTR_RDONLY, what=f"{path} (read-only)")
        os.makedirs(path, exist_ok=True)  # under the fresh /tmp: its mount point
        _move(tree, path)
        os.close(tree)
    if home:
        for name in HIDDEN:
            _hide(os.path.join(home, name))
    os.chdir(here)  # the directory put back, not the one it covers


def _hide(path: str) -> None:
    if not os.path.exists(path):  # a link is followed: what it points to is covered
        return
    if os.path.isdir(path):
        _mount("tmpfs", path, "tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV, "size=4k,mode=0555")
    else:
        _mount("/dev/null", path, None, _MS_BIND)


def lock_world() -> None:
    """Step 5: a user and mount namespace of its own, root mapped to root; the inherited mounts are locked."""
    uid, gid = os.geteuid(), os.getegid()
    _check(_libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS), "unshare")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"0 {uid} 1")
    _write("/proc/self/gid_map", f"0 {gid} 1")


def main(argv: list[str]) -> None:
    try:
        paths: dict[str, list[str]] = {"--rw": [os.getcwd()], "--ro": []}
    except OSError as e:
        _fail(e)
    args = list(argv)
    while len(args) > 1 and args[0] in paths:
        paths[args[0]].append(args[1])
        args = args[2:]
    if not args or args[0] != "--" or len(args) < 2:
        print("usage: jail.py [--rw PATH | --ro PATH]... -- COMMAND...", file=sys.stderr)
        sys.exit(2)
    command = args[1:]
    try:
        build_world(paths["--rw"], paths["--ro"], os.environ.get("HOME"))
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
    print(f"a read-only world for the worker could not be made: {e}", file=sys.stderr, flush=True)
    os._exit(FAILED)


if __name__ == "__main__":
    main(sys.argv[1:])
