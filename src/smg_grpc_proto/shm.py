"""Shared-memory tensor segments in ``/dev/shm``, following the SMG gateway's conventions.

Writers create one file per tensor with ``O_EXCL`` and mode ``0600``, reserve its size with
``fallocate`` and write it once; the handle's ``owner_id`` is ``"smg:<pid>"`` and names are
``smg-tokenspeed-<pid>-<unix_nanos>-<seq>``, so the upstream gateway's orphan sweep and ours agree.

Readers treat every name as hostile (``docs/security.md``): before anything is opened the name
must be a segment name of the contract (:func:`check_segment_name`); the file is opened with
``O_NOFOLLOW | O_NONBLOCK``, must be a regular file of the expected owner, is unlinked at once
(open -> fstat -> unlink -> size check -> map, so no later opener can reach it;
``TOKENSPEED_UNLINK_MM_SHM_AFTER_READ=0`` keeps it, as upstream) and then mapped read-only —
or, in copy mode (``read="copy"`` / ``SMG_GRPC_PROTO_SHM_READ=copy``), read with ``pread`` into
private memory, which a writer that shrinks the file later cannot take away (a mapping would
then fault with ``SIGBUS``). :func:`reap` removes segments whose writer process is gone, and
this process's own segments left unread too long.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import mmap
import os
import re
import stat
import threading
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import numpy as np

from smg_grpc_proto.errors import ShmError

__all__ = [
    "DEFAULT_DIR",
    "PREFIX",
    "ReadMode",
    "Segment",
    "check_segment_name",
    "create",
    "namespace_id",
    "open_readonly",
    "read_mode_default",
    "reap",
    "release",
    "unlink",
    "unlink_after_read_default",
    "validate_name",
]

DEFAULT_DIR = Path("/dev/shm")
PREFIX = "smg-tokenspeed-"
_SEQ = itertools.count()
_SEQ_LOCK = threading.Lock()
# The contract's segment names: smg-tokenspeed-<pid>-<unix_nanos>-<seq>, decimal, no signs.
_SEGMENT_NAME = re.compile(r"smg-tokenspeed-([0-9]{1,10})-([0-9]{1,20})-([0-9]{1,20})")

ReadMode = Literal["map", "copy"]
"""How a reader gets a segment's bytes: ``"map"`` (zero-copy, read-only mapping) or ``"copy"``
(one ``pread`` into private memory: immune to a writer that truncates the file later)."""


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


def check_segment_name(name: str) -> str:
    """The bare name of a contract segment (``smg-tokenspeed-<pid>-<nanos>-<seq>``, a leading
    ``/`` allowed); :class:`ShmError` for anything else, before any file is touched. Readers and
    :func:`release` open and unlink nothing that fails this check."""
    bare = validate_name(name)
    if _SEGMENT_NAME.fullmatch(bare) is None:
        raise ShmError(
            f"shm.name {bare[:80]!r} is not a segment of the contract "
            f"({PREFIX}<pid>-<unix_nanos>-<seq>); refusing to open it",
            field="shm.name",
            expected=f"{PREFIX}<pid>-<unix_nanos>-<seq>",
            actual=bare[:255],
        )
    return bare


def read_mode_default() -> ReadMode:
    """The readers' default mode: ``SMG_GRPC_PROTO_SHM_READ`` (``map`` or ``copy``), else map."""
    value = os.environ.get("SMG_GRPC_PROTO_SHM_READ", "map").strip().lower()
    return "copy" if value == "copy" else "map"


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
    read: ReadMode | None = None,
) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """``nbytes`` at ``offset`` of segment ``name`` as a read-only uint8 array.

    ``name`` must be a contract segment name (checked before anything is opened); the file must
    be a regular file (not a symlink, FIFO or device) owned by ``expected_uid`` (default: this
    process's euid). It is unlinked as soon as it is opened and checked to be such a file —
    before its size is checked, so a segment handed over with a wrong size is consumed too —
    unless ``unlink_after=False`` (default: ``TOKENSPEED_UNLINK_MM_SHM_AFTER_READ``). Then it
    must hold at least ``offset + nbytes`` bytes. ``read="map"`` maps it (the mapping lives as
    long as the returned array); ``read="copy"`` reads it into private memory (default:
    ``SMG_GRPC_PROTO_SHM_READ``, else map).
    """
    bare = check_segment_name(name)
    if offset < 0 or nbytes < 0:
        raise ShmError(
            f"shm.offset = {offset}, shm.nbytes = {nbytes}: must not be negative",
            field="shm.offset" if offset < 0 else "shm.nbytes",
            actual=offset if offset < 0 else nbytes,
        )
    mode = read_mode_default() if read is None else read
    if mode not in ("map", "copy"):
        raise ShmError(
            f"read must be 'map' or 'copy', got {mode!r}",
            field="read",
            expected=["map", "copy"],
            actual=mode,
        )
    path = Path(directory) / bare
    fd = _open_segment(path, bare)
    try:
        st = os.fstat(fd)
        _check_file(bare, st, expected_uid)
        if unlink_after_read_default() if unlink_after is None else unlink_after:
            _unlink_if_same(path, st)
        _check_size(bare, st, offset, nbytes)
        if nbytes == 0:
            view = np.empty(0, np.uint8)
        elif mode == "copy":
            view = _pread_exact(fd, bare, offset, nbytes)
        else:
            mm = mmap.mmap(fd, offset + nbytes, mmap.MAP_SHARED, mmap.PROT_READ)
            view = np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=offset)
    finally:
        os.close(fd)
    return view


def _open_segment(path: Path, bare: str) -> int:
    try:
        # O_NONBLOCK: opening a FIFO planted under a segment name must not wait for a writer.
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
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


def _pread_exact(
    fd: int, name: str, offset: int, nbytes: int
) -> np.ndarray[Any, np.dtype[np.uint8]]:
    try:
        out = np.empty(nbytes, np.uint8)
    except MemoryError:
        raise MemoryError(
            f"shm segment {name!r}: cannot allocate {nbytes} bytes to copy it into"
        ) from None
    view = out.data
    done = 0
    while done < nbytes:
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            raise ShmError(
                f"shm segment {name!r} ended after {done} of {nbytes} bytes (it shrank while "
                "being read)",
                field="shm.nbytes",
                expected=nbytes,
                actual=done,
            )
        done += got
    out.flags.writeable = False
    return out


def release(name: str, *, directory: Path | None = None, expected_uid: int | None = None) -> bool:
    """Consume a segment a request handed over without reading it (the request was refused):
    unlink it if ``name`` is a contract segment name and the file a regular file of the expected
    owner. Never raises for a bad name or a missing file; True if a file was removed.
    ``directory`` defaults to :data:`DEFAULT_DIR` as it is at call time."""
    try:
        bare = check_segment_name(name)
        path = Path(DEFAULT_DIR if directory is None else directory) / bare
        fd = _open_segment(path, bare)
    except ShmError:
        return False
    try:
        st = os.fstat(fd)
        _check_file(bare, st, expected_uid)
        return _unlink_if_same(path, st)
    except ShmError:
        return False
    finally:
        os.close(fd)


def _check_file(name: str, st: os.stat_result, expected_uid: int | None) -> None:
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


def _check_size(name: str, st: os.stat_result, offset: int, nbytes: int) -> None:
    if offset + nbytes > st.st_size:
        raise ShmError(
            f"shm segment {name!r} holds {st.st_size} bytes; offset {offset} + nbytes {nbytes} "
            f"= {offset + nbytes} would read past its end",
            field="shm.nbytes",
            expected=offset + nbytes,
            actual=st.st_size,
        )


def _unlink_if_same(path: Path, opened: os.stat_result) -> bool:
    """Unlink ``path`` only if it still names the file we opened (no swap in between)."""
    try:
        now = os.stat(path, follow_symlinks=False)
        if (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino):
            os.unlink(path)
            return True
    except FileNotFoundError:
        pass
    return False


def unlink(name: str, *, directory: Path = DEFAULT_DIR) -> bool:
    """Remove a segment (writer-side cleanup after a failed send). True if it existed. Only
    contract segment names are accepted (:class:`ShmError` otherwise)."""
    try:
        os.unlink(Path(directory) / check_segment_name(name))
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
