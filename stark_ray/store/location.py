"""Where a run lives: a local directory, or a directory in a filesystem that ``pyarrow.fs`` reaches by URI
(``s3://bucket/prefix``, ``gs://...``, ``hdfs://...``; a ``file://`` URI is the local case).

A :class:`Location` is what every part of a run that reads or writes its directory holds: the Parquet store, the
driver's ``run.json``, summaries and best kernels, ``--resume``, ``stark sql`` and ``stark report``. Local
directories take the fast path (plain file operations, atomic renames); other filesystems go through
``pyarrow.fs``. ``str(location)`` is a URI again (with the query the root was given, such as an S3
``endpoint_override``), so a run directory printed by one command can be given to the next. A Location pickles
(filesystem options, never credentials: those come from the environment), so an actor gets it as it is.

Writes of small files are atomic where the filesystem allows: local files are written under a temporary name and
renamed; an object store (S3, GCS) publishes an object only once it is complete, so objects are written in place;
other filesystems write a temporary file and move it.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import pyarrow.fs as pafs

_HALF_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:[/~]")  # s3:/bucket, file:~/x: a URI missing '//'
_OBJECT_STORES = ("s3", "gcs")  # a written object appears whole or not at all


def writes_whole(fs: pafs.FileSystem) -> bool:
    """True for object stores, where an object is published only once it is complete (no temporary name)."""
    return fs.type_name in _OBJECT_STORES


@dataclass(frozen=True)
class Location:
    """``fs`` is None for a local directory (``path`` is then a local path), else a pyarrow filesystem and the
    path inside it. ``prefix`` and ``query`` are how :meth:`__str__` renders it as a URI (``s3://`` and the
    root's query string)."""

    fs: pafs.FileSystem | None
    path: str
    prefix: str = ""
    query: str = ""

    # -- naming ------------------------------------------------------------------------------------------
    @property
    def local(self) -> bool:
        return self.fs is None

    def join(self, *parts: str) -> Location:
        if self.fs is None:
            return Location(None, os.path.join(self.path, *parts))
        return Location(self.fs, "/".join([self.path.rstrip("/"), *parts]), self.prefix, self.query)

    def __truediv__(self, part: str) -> Location:
        return self.join(part)

    @property
    def name(self) -> str:
        return Path(self.path).name if self.fs is None else posixpath.basename(self.path.rstrip("/"))

    @property
    def parent(self) -> Location:
        if self.fs is None:
            return Location(None, str(Path(self.path).parent))
        return Location(self.fs, posixpath.dirname(self.path.rstrip("/")), self.prefix, self.query)

    def __str__(self) -> str:
        if self.fs is None:
            return self.path
        return f"{self.prefix}{quote(self.path, safe='/')}" + (f"?{self.query}" if self.query else "")

    def __fspath__(self) -> str:
        """Local locations work with ``open`` and ``os`` functions; others refuse."""
        if self.fs is not None:
            raise TypeError(f"{self} is not a local path")
        return self.path

    def local_path(self) -> Path:
        if self.fs is not None:
            raise ValueError(f"{self} is not a local path")
        return Path(self.path)

    # -- queries -----------------------------------------------------------------------------------------
    def _type(self) -> pafs.FileType:
        if self.fs is None:
            p = Path(self.path)
            return (pafs.FileType.Directory if p.is_dir() else pafs.FileType.File if p.exists()
                    else pafs.FileType.NotFound)
        return self.fs.get_file_info(self.path).type

    def exists(self) -> bool:
        return self._type() != pafs.FileType.NotFound

    def is_dir(self) -> bool:
        return self._type() == pafs.FileType.Directory

    def is_file(self) -> bool:
        return self._type() == pafs.FileType.File

    def subdirs(self) -> list[Location]:
        """The directories directly in this one, by name ([] when it does not exist)."""
        if self.fs is None:
            try:
                entries = sorted(e.name for e in os.scandir(self.path) if e.is_dir())
            except (FileNotFoundError, NotADirectoryError):
                return []
            return [self.join(n) for n in entries]
        infos = self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))
        return [self.join(i.base_name) for i in sorted(infos, key=lambda i: i.base_name)
                if i.type == pafs.FileType.Directory]

    def find(self, name: str) -> list[Location]:
        """Every file called ``name`` anywhere below this directory, by path ([] when it does not exist)."""
        if self.fs is None:
            return [Location(None, str(p)) for p in sorted(Path(self.path).rglob(name)) if p.is_file()]
        infos = self.fs.get_file_info(pafs.FileSelector(self.path, recursive=True, allow_not_found=True))
        return [Location(self.fs, i.path, self.prefix, self.query) for i in sorted(infos, key=lambda i: i.path)
                if i.type == pafs.FileType.File and i.base_name == name]

    # -- directories -------------------------------------------------------------------------------------
    def mkdir(self) -> None:
        """Create the directory and its parents (nothing when it exists). On an object store directories are
        implicit (a prefix exists once an object is under it): nothing is written, so a bucket policy that
        allows writes only under the run's prefix is enough."""
        if self.fs is None:
            Path(self.path).mkdir(parents=True, exist_ok=True)
        elif not writes_whole(self.fs):
            self.fs.create_dir(self.path, recursive=True)

    def make_new(self) -> None:
        """Create the directory, which must not exist yet (FileExistsError); its parent must exist locally.
        On an object store this only checks the name (the directory appears with its first object): callers
        make names unlikely to collide (:func:`~stark_ray.run.directory.new_run_dir` adds a random suffix there)."""
        if self.fs is None:
            os.mkdir(self.path)
            return
        if self.exists():
            raise FileExistsError(str(self))
        self.mkdir()

    def check_writable(self) -> None:
        """Create the directory and prove that files can be written in it (a probe written and deleted on a
        remote filesystem); OSError (PermissionError locally) when they cannot."""
        self.mkdir()
        if self.fs is None:
            if not os.access(self.path, os.W_OK):
                raise PermissionError(f"{self}: the directory is not writable")
            return
        probe = self.join(f".stark-write-check-{uuid.uuid4().hex[:8]}")
        probe.write_bytes(b"")
        self.fs.delete_file(probe.path)

    # -- small files -------------------------------------------------------------------------------------
    def read_bytes(self) -> bytes:
        if self.fs is None:
            return Path(self.path).read_bytes()
        with self.fs.open_input_stream(self.path) as f:
            return f.read()

    def read_text(self, encoding: str = "utf-8") -> str:
        """The file's text; FileNotFoundError when it is absent (on every filesystem)."""
        if self.fs is not None and not self.is_file():
            raise FileNotFoundError(f"{self}: no such file")
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data: bytes) -> None:
        """Write the whole file atomically (see the module's note). Its directory must exist locally (see
        :meth:`mkdir`)."""
        if self.fs is None:
            final = Path(self.path)
            tmp = final.with_name(f".{final.name}.tmp")
            try:
                tmp.write_bytes(data)
                os.replace(tmp, final)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            return
        if writes_whole(self.fs):
            with self.fs.open_output_stream(self.path) as f:
                f.write(data)
            return
        staged = self.parent.join(f".{self.name}.tmp").path
        try:
            with self.fs.open_output_stream(staged) as f:
                f.write(data)
            self.fs.move(staged, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                self.fs.delete_file(staged)
            raise

    def write_text(self, text: str, encoding: str = "utf-8") -> None:
        self.write_bytes(text.encode(encoding))

    def remove(self) -> None:
        """Delete the file (nothing when it is already gone)."""
        if self.fs is None:
            Path(self.path).unlink(missing_ok=True)
            return
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self.path)


def locate(root: str | Path | Location, filesystem: pafs.FileSystem | None = None) -> Location:
    """Resolve a local path or a URI (``file://``, ``s3://``, ...) to a :class:`Location`; with ``filesystem``
    the root is a path inside it. A URI that names the local filesystem takes the local fast path. A
    :class:`Location` is returned as it is. Raises ValueError, one line, for a URI pyarrow cannot resolve, a
    filesystem it cannot reach, credentials written into the URI, or a URI this module cannot print back."""
    if isinstance(root, Location):
        return root
    if filesystem is not None:
        if isinstance(filesystem, pafs.LocalFileSystem):
            return Location(None, str(root))
        return Location(filesystem, str(root), f"{filesystem.type_name}://")
    if isinstance(root, Path):
        return Location(None, str(root))
    if "://" not in root:
        if _HALF_URI.match(root):
            raise ValueError(f"{root}: looks like a URI without '//' after the scheme (s3://bucket/prefix)")
        return Location(None, os.path.expanduser(root))
    parts = urlsplit(root)
    if parts.password:  # s3://KEY:SECRET@bucket/... (abfs://container@account/... names no secret)
        raise ValueError(f"{root.split('@')[-1]}: credentials in the URI would be printed and recorded with the "
                         "run; give them in the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...)")
    try:
        fs, path = pafs.FileSystem.from_uri(root)
    except (ValueError, TypeError) as e:  # pyarrow.lib.ArrowInvalid is a ValueError
        raise ValueError(f"{root}: not a filesystem URI pyarrow can open ({_first_line(e)})") from None
    except OSError as e:  # S3 resolves the bucket's region with a request
        raise ValueError(f"{root}: cannot reach it ({_first_line(e)})") from None
    if isinstance(fs, pafs.LocalFileSystem):
        return Location(None, path)
    uri, _, query = root.partition("?")
    uri, stripped = unquote(uri.rstrip("/")), path.rstrip("/")
    if not stripped or not uri.endswith(stripped) or uri[: len(uri) - len(stripped)].count("/") < 2:
        raise ValueError(f"{root}: cannot be used as a run directory (give a path inside a bucket, such as "
                         f"{fs.type_name}://bucket/prefix)")
    return Location(fs, stripped, uri[: len(uri) - len(stripped)], query)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
