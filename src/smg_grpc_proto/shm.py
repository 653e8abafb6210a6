"""Shared-memory tensor segments in ``/dev/shm``, following the SMG gateway's conventions.

Writers create one file per tensor with ``O_EXCL`` and mode ``0600``, reserve its size with
``fallocate`` and write it once; the handle's ``owner_id`` is ``"smg:<pid>"`` and names are
``smg-tokenspeed-<pid>-<unix_nanos>-<seq>``, so the upstream gateway's orphan sweep and ours agree.
Readers validate the name (no ``/``, ``..`` or NUL), open with ``O_NOFOLLOW``, require a regular
file of the expected owner and size, map it read-only, and by default unlink it right after
mapping (``TOKENSPEED_UNLINK_MM_SHM_AFTER_READ=0`` keeps it, as upstream). :func:`reap` removes
segments whose writer process is gone, and this process's own segments left unread too long.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import mmap
import os
import stat
import threading
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from smg_grpc_proto.errors import ShmError

__all__ = [
    "DEFAULT_DIR",
    "PREFIX",
    "Segment",
    "create",
    "namespace_id",
    "open_readonly",
    "reap",
    "unlink",
    "unlink_after_read_default",
    "validate_name",
]

DEFAULT_DIR = Path("/dev/shm")
PREFIX = "smg-tokenspeed-"
_SEQ = itertools.count()
_SEQ_LOCK = threading.Lock()


def validate_name(name: str) -> str:
    """The segment name with a leading ``/`` stripped; :class:`ShmError` if it could escape."""
    if not isinstance(name, str):
        raise ShmError(f"shm.name must be a str, got {type(name).__name__}", field="shm.name")
    bare = name[1:] if name.startswith("/") else name
    bad = not bare or bare in {".", ".."} or "/" in bare or "\0" in bare or bare.startswith("..")
    if bad or len(bare.encode("utf-8", "surrogatepass")) > 255:
        raise ShmError(
            f"shm.name {name!r} is not a plain file name (empty, '.', '..', '/', NUL or too long)",
            field="shm.name",
            actual=name,
        )
    return bare


def unlink_after_read_default() -> bool:
    """Whether readers unlink after mapping: upstream's environment variable, default yes."""
    value = os.environ.get("TOKENSPEED_UNLINK_MM_SHM_AFTER_READ", "1").strip().lower()
    return value not in {"0", "false", "no"}


@cache
def namespace_id(directory: Path = DEFAULT_DIR) -> str:
    """``"<boot_id>:<st_dev of /dev/shm>"``; equal ids mean two processes share segments.

    Compatible with the upstream ``GetServerInfoResponse.shm_namespace_id``; empty string when
    it cannot be determined.
    """
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot_id}:{os.stat(directory).st_dev}"
    except OSError:
        return ""


@dataclass
class Segment:
    """A freshly created, writable segment. Close it after writing."""

    name: str
    path: Path
    nbytes: int
    buffer: np.ndarray[Any, np.dtype[np.uint8]]
    _mmap: mmap.mmap | None

    @property
    def owner_id(self) -> str:
        return f"smg:{os.getpid()}"

    def close(self) -> None:
        """Unmap (the data stays in the file for the reader)."""
        self.buffer = np.empty(0, np.uint8)
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None


def _new_name() -> str:
    with _SEQ_LOCK:
        seq = next(_SEQ)
    return f"{PREFIX}{os.getpid()}-{time.time_ns()}-{seq}"


def create(nbytes: int, *, directory: Path = DEFAULT_DIR) -> Segment:
    """Create a segment of exactly ``nbytes`` (``O_EXCL``, mode 0600, ``fallocate``d)."""
    if nbytes < 0:
        raise ShmError(f"shm.nbytes = {nbytes} is negative", field="shm.nbytes", actual=nbytes)
    name = _new_name()
    path = Path(directory) / name
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        if nbytes:
            try:
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as exc:
                if exc.errno not in {errno.EOPNOTSUPP, errno.EINVAL}:
                    raise
                os.ftruncate(fd, nbytes)
            # No MAP_POPULATE: it would fault the pages in inside mmap(), with the GIL held; the
            # native writer touches them with the GIL released instead.
            mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            buffer = np.frombuffer(mm, dtype=np.uint8)
        else:
            mm, buffer = None, np.empty(0, np.uint8)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)
    return Segment(name, path, nbytes, buffer, mm)


def open_readonly(
    name: str,
    *,
    offset: int,
    nbytes: int,
    directory: Path = DEFAULT_DIR,
    unlink_after: bool | None = None,
    expected_uid: int | None = None,
) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """Map ``nbytes`` at ``offset`` of segment ``name`` read-only; returns a uint8 view.

    The mapping lives as long as the returned array (and arrays viewing it). The file must be a
    regular file (not a symlink) owned by ``expected_uid`` (default: this process's euid) and
    hold at least ``offset + nbytes`` bytes.
    """
    bare = validate_name(name)
    if offset < 0 or nbytes < 0:
        raise ShmError(
            f"shm.offset = {offset}, shm.nbytes = {nbytes}: must not be negative",
            field="shm.offset" if offset < 0 else "shm.nbytes",
            actual=offset if offset < 0 else nbytes,
        )
    path = Path(directory) / bare
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ShmError(
                f"shm.name {bare!r} is a symbolic link; refusing to follow it",
                field="shm.name",
                actual=bare,
            ) from None
        raise ShmError(
            f"shm.name {bare!r}: cannot open {path}: {exc.strerror}", field="shm.name", actual=bare
        ) from None
    try:
        st = os.fstat(fd)
        _check_file(bare, st, offset, nbytes, expected_uid)
        if nbytes == 0:
            view = np.empty(0, np.uint8)
        else:
            mm = mmap.mmap(fd, offset + nbytes, mmap.MAP_SHARED, mmap.PROT_READ)
            view = np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=offset)
    finally:
        os.close(fd)
    if unlink_after_read_default() if unlink_after is None else unlink_after:
        _unlink_if_same(path, st)
    return view


def _check_file(
    name: str, st: os.stat_result, offset: int, nbytes: int, expected_uid: int | None
) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise ShmError(
            f"shm.name {name!r} is not a regular file (mode {stat.filemode(st.st_mode)})",
            field="shm.name",
            actual=stat.filemode(st.st_mode),
        )
    uid = os.geteuid() if expected_uid is None else expected_uid
    if st.st_uid != uid:
        raise ShmError(
            f"shm.name {name!r} is owned by uid {st.st_uid}, expected uid {uid}",
            field="shm.owner",
            expected=uid,
            actual=st.st_uid,
        )
    if offset + nbytes > st.st_size:
        raise ShmError(
            f"shm segment {name!r} holds {st.st_size} bytes; offset {offset} + nbytes {nbytes} "
            f"= {offset + nbytes} would read past its end",
            field="shm.nbytes",
            expected=offset + nbytes,
            actual=st.st_size,
        )


def _unlink_if_same(path: Path, opened: os.stat_result) -> None:
    """Unlink ``path`` only if it still names the file we opened (no swap in between)."""
    with contextlib.suppress(FileNotFoundError):
        now = os.stat(path, follow_symlinks=False)
        if (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino):
            os.unlink(path)


def unlink(name: str, *, directory: Path = DEFAULT_DIR) -> bool:
    """Remove a segment (writer-side cleanup after a failed send). True if it existed."""
    try:
        os.unlink(Path(directory) / validate_name(name))
    except FileNotFoundError:
        return False
    return True


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap(
    *, directory: Path = DEFAULT_DIR, max_age: float | None = None, now: float | None = None
) -> list[str]:
    """Remove stale segments of ours; returns the names removed.

    A segment ``smg-tokenspeed-<pid>-<nanos>-<seq>`` owned by this user is stale when process
    ``pid`` no longer exists, or — with ``max_age`` seconds given — when it was created by this
    process more than ``max_age`` seconds ago and no reader consumed (unlinked) it.
    """
    removed: list[str] = []
    uid = os.geteuid()
    me = os.getpid()
    now_ns = time.time_ns() if now is None else int(now * 1e9)
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return removed
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        parts = entry.name[len(PREFIX) :].split("-")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            continue
        pid, created_ns = int(parts[0]), int(parts[1])
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if st.st_uid != uid or not stat.S_ISREG(st.st_mode):
            continue
        stale = not _pid_alive(pid) or (
            pid == me and max_age is not None and now_ns - created_ns > max_age * 1e9
        )
        if stale:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
                removed.append(entry.name)
    return removed
