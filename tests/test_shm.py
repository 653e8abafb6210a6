"""Shared-memory transport: real segments in /dev/shm (or a tmp dir), real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from smg_grpc_proto import shm, tensors, tokenspeed_scheduler_pb2, vllm_engine_pb2
from smg_grpc_proto.errors import ShmError

DEV_SHM = Path("/dev/shm")


@pytest.fixture
def shm_dir(tmp_path):
    return tmp_path


def test_segment_is_created_exclusive_0600_and_unlinked_by_the_reader(shm_dir):
    array = np.arange(100_000, dtype=np.float32)
    msg = tensors.pack(array, vllm_engine_pb2.TensorData, transport="shm", shm_dir=shm_dir)
    path = shm_dir / msg.shm.name
    st = path.stat()
    assert st.st_mode & 0o777 == 0o600
    assert st.st_size == array.nbytes == msg.shm.nbytes
    assert msg.shm.owner_id == f"smg:{os.getpid()}"
    assert msg.shm.name.startswith(f"smg-tokenspeed-{os.getpid()}-")
    back = tensors.unpack(msg, shm_dir=shm_dir)
    assert not path.exists()  # unlinked right after mapping
    assert np.array_equal(back, array)
    assert not back.flags.writeable


def test_real_dev_shm_and_keep_after_read(monkeypatch):
    monkeypatch.setenv("TOKENSPEED_UNLINK_MM_SHM_AFTER_READ", "0")
    array = np.arange(20_000, dtype=np.int64)
    msg = tensors.pack(array, tokenspeed_scheduler_pb2.TensorData, transport="auto")
    assert msg.WhichOneof("payload") == "shm"
    path = DEV_SHM / msg.shm.name
    try:
        assert np.array_equal(tensors.unpack(msg), array)
        assert path.exists()
        assert np.array_equal(tensors.unpack(msg, unlink=True), array)
        assert not path.exists()
    finally:
        path.unlink(missing_ok=True)


def test_auto_stays_inline_below_threshold(shm_dir):
    msg = tensors.pack(
        np.zeros(10, np.float32), vllm_engine_pb2.TensorData, transport="auto", shm_dir=shm_dir
    )
    assert msg.WhichOneof("payload") == "inline"
    assert list(shm_dir.iterdir()) == []


def seg(tag: str) -> str:
    """A contract segment name (readers refuse every other name before opening it)."""
    return f"smg-tokenspeed-{os.getpid()}-{abs(hash(tag)) % 10**12}-0"


def handle(name, nbytes=16, offset=0):
    return vllm_engine_pb2.TensorData(
        shape=[nbytes], dtype="uint8", shm={"name": name, "nbytes": nbytes, "offset": offset}
    )


def test_symlink_is_refused(shm_dir):
    target = shm_dir / seg("target")
    target.write_bytes(b"\0" * 16)
    (shm_dir / seg("link")).symlink_to(target)
    with pytest.raises(ShmError, match="symbolic link"):
        tensors.unpack(handle(seg("link")), shm_dir=shm_dir)
    assert target.exists()
    assert (shm_dir / seg("link")).is_symlink()


@pytest.mark.parametrize("name", ["../x", "a/b", "..", ".", "", "a\0b", "/", "//x", "x" * 300])
def test_names_that_could_escape_are_refused(name, shm_dir):
    with pytest.raises(ShmError, match="not a plain file name"):
        tensors.unpack(handle(name), shm_dir=shm_dir)


def test_leading_slash_is_stripped_like_upstream(shm_dir):
    (shm_dir / seg("seg")).write_bytes(bytes(range(16)))
    assert tensors.unpack(handle("/" + seg("seg")), shm_dir=shm_dir).tolist() == list(range(16))


def test_wrong_owner_is_refused(shm_dir):
    name = seg("foreign")
    path = shm_dir / name
    path.write_bytes(b"\0" * 16)
    if os.geteuid() == 0:
        os.chown(path, 4242, 4242)
        with pytest.raises(ShmError, match="owned by uid 4242, expected uid 0") as info:
            tensors.unpack(handle(name), shm_dir=shm_dir)
    else:
        with pytest.raises(ShmError, match="expected uid 4242") as info:
            shm.open_readonly(name, offset=0, nbytes=16, directory=shm_dir, expected_uid=4242)
    assert info.value.field == "shm.owner"
    assert path.exists()


def test_truncated_segment_is_refused(shm_dir):
    short = shm_dir / seg("short")
    short.write_bytes(b"\0" * 10)
    with pytest.raises(ShmError, match="holds 10 bytes; offset 0 \\+ nbytes 16"):
        tensors.unpack(handle(short.name), shm_dir=shm_dir)
    assert not short.exists()  # consumed although refused: a bad handle leaks nothing
    short.write_bytes(b"\0" * 10)
    with pytest.raises(ShmError, match="offset 8 \\+ nbytes 8 = 16"):
        shm.open_readonly(short.name, offset=8, nbytes=8, directory=shm_dir, unlink_after=False)
    assert short.exists()


def test_directory_and_fifo_are_refused(shm_dir):
    (shm_dir / seg("dir")).mkdir()
    os.mkfifo(shm_dir / seg("fifo"))
    for name in (seg("dir"), seg("fifo")):
        with pytest.raises(ShmError, match=r"not a regular file|cannot open"):
            shm.open_readonly(name, offset=0, nbytes=1, directory=shm_dir)
        assert (shm_dir / name).exists()


def test_missing_segment(shm_dir):
    with pytest.raises(ShmError, match="cannot open"):
        tensors.unpack(handle(seg("gone")), shm_dir=shm_dir)


def test_namespace_id_matches_upstream_format():
    ns = shm.namespace_id()
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert ns == f"{boot_id}:{os.stat('/dev/shm').st_dev}"


def test_reader_killed_before_reading_leaves_nothing_after_reap(shm_dir):
    """A writer process hands a segment to a reader that is SIGKILLed before reading it."""
    writer = textwrap.dedent(f"""
        import sys, time, numpy as np
        from pathlib import Path
        from smg_grpc_proto import tensors, vllm_engine_pb2
        msg = tensors.pack(np.ones(50_000, np.float32), vllm_engine_pb2.TensorData,
                           transport="shm", shm_dir=Path({str(shm_dir)!r}))
        print(msg.shm.name, flush=True)
        sys.stdin.readline()
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", writer], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    name = proc.stdout.readline().strip()
    reader = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    reader.send_signal(signal.SIGKILL)
    reader.wait(timeout=10)
    assert (shm_dir / name).exists()
    # While the writer lives, its segment is not an orphan.
    assert shm.reap(directory=shm_dir) == []
    proc.stdin.close()
    proc.wait(timeout=30)
    proc.stdout.close()
    assert shm.reap(directory=shm_dir) == [name]
    assert list(shm_dir.iterdir()) == []


def test_owner_reaps_its_own_unconsumed_segments_after_max_age(shm_dir):
    msg = tensors.pack(
        np.ones(10, np.uint8), vllm_engine_pb2.TensorData, transport="shm", shm_dir=shm_dir
    )
    assert shm.reap(directory=shm_dir, max_age=60) == []
    assert shm.reap(directory=shm_dir, max_age=60, now=time.time() + 120) == [msg.shm.name]


def test_reap_ignores_foreign_files(shm_dir):
    (shm_dir / "other-file").write_bytes(b"x")
    (shm_dir / "smg-tokenspeed-notapid").write_bytes(b"x")
    (shm_dir / "smg-tokenspeed-999999999-1-2").symlink_to(shm_dir / "other-file")
    assert shm.reap(directory=shm_dir) == []
    assert len(list(shm_dir.iterdir())) == 3


def test_upstream_style_reader_reads_our_segment(shm_dir):
    """The engine servicer's convention: O_NOFOLLOW open + pread(nbytes, offset)."""
    array = np.arange(64, dtype=np.float32)
    msg = tensors.pack(array, vllm_engine_pb2.TensorData, transport="shm", shm_dir=shm_dir)
    fd = os.open(shm_dir / msg.shm.name, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        data = os.pread(fd, msg.shm.nbytes, msg.shm.offset)
    finally:
        os.close(fd)
    assert np.frombuffer(data, "<f4").tolist() == array.tolist()


def test_we_read_an_upstream_style_segment_at_an_offset(shm_dir):
    """A gateway writes with a plain file; we read with offset and leave nothing behind."""
    payload = np.arange(10, dtype="<i8").tobytes()
    name = f"smg-tokenspeed-{os.getpid()}-{time.time_ns()}-0"
    fd = os.open(shm_dir / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    os.write(fd, b"HEADER!!" + payload)
    os.close(fd)
    msg = tokenspeed_scheduler_pb2.TensorData(
        shape=[10],
        dtype="int64",
        shm={"name": name, "offset": 8, "nbytes": len(payload), "owner_id": "smg:1"},
    )
    assert tensors.unpack(msg, shm_dir=shm_dir).tolist() == list(range(10))
    assert not (shm_dir / name).exists()
