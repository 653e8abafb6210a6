"""Hostile requests against the engine-side decoders: each test is a regression test for an
attack or a silent-wrong-data case (docs/security.md), and checks only files it created."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import typing
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import scaling

from smg_grpc_proto import shm, tensors
from smg_grpc_proto.engines import sglang as sglang_adapter
from smg_grpc_proto.engines import tokenspeed as ts_adapter
from smg_grpc_proto.engines import vllm as vllm_adapter
from smg_grpc_proto.errors import (
    InputFileError,
    MultimodalError,
    MultimodalLayoutError,
    PlaceholderError,
    ProcessorConfigError,
    ShmError,
    TensorError,
)
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sgl_pb
from smg_grpc_proto.generated import tokenspeed_scheduler_pb2 as ts_pb
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm_pb
from smg_grpc_proto.vision import ImageProcessor
from smg_grpc_proto.vision import decode as decode_image
from smg_grpc_proto.vision._config import Family

DEV_SHM = Path("/dev/shm")
TOKEN = 151655


@pytest.fixture
def victim():
    """A file in /dev/shm that is not a segment of the contract (ours, so removable)."""
    path = DEV_SHM / f"victim-{os.getpid()}-{uuid.uuid4().hex}"
    path.write_bytes(b"precious")
    yield path
    path.unlink(missing_ok=True)


def _segment(data: bytes) -> str:
    """A real contract segment holding ``data`` (written the way the gateway writes them)."""
    segment = shm.create(len(data))
    if data:
        segment.buffer[:] = np.frombuffer(data, np.uint8)
    segment.close()
    return segment.name


def _vllm(rows: int = 16, grid: tuple[int, int, int] = (1, 4, 4), embeds: int = 4) -> Any:
    """A valid one-image Qwen-style vLLM request: flat pixel_values, grid, sizes, placeholder."""
    ids = [1, *([TOKEN] * embeds), 2]
    request = vllm_pb.GenerateRequest(request_id="r", tokenized={"input_ids": ids})
    mm = request.mm_inputs
    mm.pixel_values.CopyFrom(tensors.pack(np.ones((rows, 8), np.float32), vllm_pb.TensorData))
    mm.model_specific_tensors["image_grid_thw"].CopyFrom(
        tensors.pack(np.array([grid], np.int64), vllm_pb.TensorData)
    )
    mm.model_specific_tensors["patches_per_image"].CopyFrom(
        tensors.pack(np.array([rows], np.int64), vllm_pb.TensorData)
    )
    mm.flat_keys["pixel_values"] = "patches_per_image"
    mm.batched_keys.extend(["image_grid_thw", "patches_per_image"])
    mm.im_token_id = TOKEN
    mm.mm_placeholders.add(offset=1, length=embeds)
    mm.modality = common_pb2.IMAGE
    return request


def _tokenspeed(embeds: int = 4) -> Any:
    ids = [1, *([TOKEN] * embeds), 2]
    request = ts_pb.GenerateRequest(request_id="r", tokenized={"input_ids": ids})
    item = request.mm_inputs.items.add(modality=common_pb2.IMAGE, placeholder_token_id=TOKEN)
    item.placeholders.add(offset=1, length=embeds)
    item.encoder_input.CopyFrom(tensors.pack(np.ones((16, 8), np.float32), ts_pb.TensorData))
    item.model_specific_tensors["image_grid_thw"].CopyFrom(
        tensors.pack(np.array([[1, 4, 4]], np.int64), ts_pb.TensorData)
    )
    return request


def test_valid_requests_decode() -> None:
    """The baselines the hostile variants below start from are accepted."""
    (batch,) = vllm_adapter.decode_mm_inputs(_vllm(), merge_size=2)
    assert batch.items[0].tensors["pixel_values"].shape == (16, 8)
    (batch,) = ts_adapter.decode_mm_inputs(_tokenspeed(), merge_size=2)
    assert batch.tensors["pixel_values"].shape == (16, 8)


# -- 1. no file outside the contract is opened or unlinked -----------------------------------


def _foreign_handle(td: Any, name: str) -> None:
    td.Clear()
    td.shape.append(0)
    td.dtype = "uint8"
    td.shm.name = name
    td.shm.nbytes = 0


@pytest.mark.parametrize("engine", ["vllm", "tokenspeed"])
@pytest.mark.parametrize("form", ["bare", "slash", "prefixed"])
def test_side_tensor_naming_a_foreign_file_is_refused_and_the_file_kept(
    engine: str, form: str, victim: Path
) -> None:
    name = {"bare": victim.name, "slash": f"/{victim.name}", "prefixed": victim.name}[form]
    if form == "prefixed":  # the contract's prefix, but not its shape
        name = f"smg-tokenspeed-{victim.name}"
        (DEV_SHM / name).write_bytes(b"also precious")
    try:
        if engine == "vllm":
            request = _vllm()
            _foreign_handle(request.mm_inputs.model_specific_tensors["evil"], name)
            decode = vllm_adapter.decode_mm_inputs
        else:
            request = _tokenspeed()
            _foreign_handle(request.mm_inputs.items[0].model_specific_tensors["evil"], name)
            decode = ts_adapter.decode_mm_inputs
        with pytest.raises(ShmError, match="not a segment of the contract") as info:
            decode(request)
        assert info.value.field.endswith("shm.name")
        assert victim.read_bytes() == b"precious"
        if form == "prefixed":
            assert (DEV_SHM / name).read_bytes() == b"also precious"
    finally:
        (DEV_SHM / f"smg-tokenspeed-{victim.name}").unlink(missing_ok=True)


@pytest.mark.parametrize(
    "name",
    [
        "smg-tokenspeed-probe-1",  # the gateway's writability probe
        "smg-tokenspeed-1-2",
        "smg-tokenspeed-1-2-3-4",
        "smg-tokenspeed-+1-2-3",
        "smg-tokenspeed-1-2-3\n",
        "smg-tokenspeed-\u0661-2-3",  # a non-ASCII digit
        "SMG-TOKENSPEED-1-2-3",
        "smg-tokenspeed-12345678901-2-3",  # an 11-digit pid
    ],
)
def test_only_exact_contract_names_pass(name: str) -> None:
    with pytest.raises(ShmError, match="not a segment of the contract"):
        shm.check_segment_name(name)


def test_release_only_touches_contract_segments(victim: Path) -> None:
    assert shm.release(victim.name) is False
    assert victim.exists()
    name = _segment(b"abc")
    assert shm.release(name) is True
    assert not (DEV_SHM / name).exists()
    assert shm.release(name) is False  # already gone: no error


def test_refuse_mode_opens_nothing() -> None:
    name = _segment(bytes(64))
    try:
        request = _vllm()
        request.mm_inputs.pixel_values.Clear()
        td = request.mm_inputs.pixel_values
        td.shape.extend([16, 1])
        td.dtype = "float32"
        td.shm.name, td.shm.nbytes = name, 64
        with pytest.raises(ShmError, match="takes no shared-memory payloads"):
            vllm_adapter.decode_mm_inputs(request, shm_read="refuse")
        assert (DEV_SHM / name).exists()  # a refusing server touches no segment
    finally:
        shm.release(name)


# -- 2. SIGBUS: a writer that shrinks a segment after the reader checked it ---------------------

_SHRINK_CHILD = """
import os, sys, numpy as np
from smg_grpc_proto import shm
name, mode = sys.argv[1], sys.argv[2]
fd = os.open("/dev/shm/" + name, os.O_RDWR)  # the writer keeps a descriptor
view = shm.open_readonly(name, offset=0, nbytes=1 << 20, read=mode)
assert not os.path.exists("/dev/shm/" + name), "unlinked before the mapping is used"
os.ftruncate(fd, 0)  # a hostile writer shrinks the file
print(int(view.astype(np.int64).sum()), flush=True)  # touch every byte
"""


@pytest.mark.parametrize("mode", ["map", "copy"])
def test_shrinking_writer(mode: str) -> None:
    """A mapping dies by SIGBUS when its writer truncates the file: the documented limit of
    map mode. Copy mode reads the bytes once into private memory and is immune."""
    name = _segment(bytes([1]) * (1 << 20))
    try:
        result = subprocess.run(
            [sys.executable, "-c", _SHRINK_CHILD, name, mode],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        shm.release(name)
    if mode == "copy":
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == str(1 << 20)
    else:
        assert result.returncode == -signal.SIGBUS, (result.returncode, result.stderr)


def test_copy_mode_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMG_GRPC_PROTO_SHM_READ", "copy")
    name = _segment(bytes(range(256)))
    view = shm.open_readonly(name, offset=16, nbytes=32)
    assert view.base is None  # private memory, not a view of a mapping
    assert view.tolist() == list(range(16, 48))
    assert not view.flags.writeable
    assert not (DEV_SHM / name).exists()


# -- 3. validation linear in the request size ------------------------------------------------


def _many_ranges(n: int, overlap_last: bool) -> Any:
    request = vllm_pb.GenerateRequest(request_id="r", tokenized={"input_ids": [TOKEN] * n})
    mm = request.mm_inputs
    mm.pixel_values.CopyFrom(tensors.pack(np.ones((n, 1), np.uint8), vllm_pb.TensorData))
    mm.batched_keys.append("pixel_values")
    mm.im_token_id = TOKEN
    for i in range(n):
        mm.mm_placeholders.add(offset=i, length=1)
    if overlap_last:
        mm.mm_placeholders[n - 1].offset = 0
    return request


def _judge(request: Any, overlap_last: bool) -> None:
    """Decode ``request``; one whose last range overlaps (``overlap_last``) must be refused."""
    if overlap_last:
        with pytest.raises(PlaceholderError, match=r"overlaps mm_inputs.mm_placeholders\[0\]"):
            vllm_adapter.decode_mm_inputs(request)
    else:
        (batch,) = vllm_adapter.decode_mm_inputs(request)
        assert len(batch.items) == len(request.mm_inputs.mm_placeholders)


@pytest.mark.parametrize("overlap_last", [True, False])
def test_placeholder_ranges_are_judged_in_linear_time(overlap_last: bool) -> None:
    # the quadratic check took 20+ s for 20 000 ranges: four times the ranges took sixteen times
    # as long. Linear work takes about four times as long (less, with fixed costs).
    ratio, small, large = scaling.growth(
        lambda n: _many_ranges(n, overlap_last),
        lambda r: _judge(r, overlap_last),
        25_000,
        factor=4,
        limit=10,
    )
    assert ratio < 8, (ratio, small, large)
    assert large < 10, (ratio, small, large)  # 100 000 ranges: far from the quadratic 500+ s


def test_more_ranges_than_tokens_is_refused_before_any_work() -> None:
    request = _many_ranges(10, False)
    del request.tokenized.input_ids[5:]
    with pytest.raises(PlaceholderError, match="10 placeholder ranges for 5 tokens"):
        vllm_adapter.decode_mm_inputs(request)


def _many_items(n: int) -> Any:
    request = ts_pb.GenerateRequest(request_id="r", tokenized={"input_ids": [TOKEN] * n})
    for i in range(n):
        item = request.mm_inputs.items.add(modality=common_pb2.IMAGE, placeholder_token_id=TOKEN)
        item.placeholders.add(offset=n - 1 - i, length=1)
        item.encoder_input.CopyFrom(tensors.pack(np.ones((1,), np.uint8), ts_pb.TensorData))
    request.mm_inputs.items[-1].placeholders[0].offset = 5
    return request


def _refuse_overlap(request: Any) -> None:
    with pytest.raises(PlaceholderError, match="overlaps"):
        ts_adapter.decode_mm_inputs(request)


def test_tokenspeed_many_items_checked_at_once() -> None:
    ratio, small, large = scaling.growth(_many_items, _refuse_overlap, 5_000, factor=4, limit=5)
    assert ratio < 8, (ratio, small, large)
    assert large < 5, (ratio, small, large)  # 20 000 items


def _side_tensors(n: int) -> bytes:
    """The wire bytes of a valid one-image vLLM request plus ``n`` four-byte side tensors."""
    request = _vllm()
    side = request.mm_inputs.model_specific_tensors
    for i in range(n):
        side[f"extra_{i}"].CopyFrom(vllm_pb.TensorData(shape=[1], dtype="float32", inline=bytes(4)))
    return typing.cast(bytes, request.SerializeToString())


def test_more_tensors_than_a_message_may_hold_are_refused_before_any_is_read() -> None:
    # 200 000 four-byte tensors (6 MB) took 1.7 s to parse and check, each exposed as an array in
    # Python; past 65 536 the wire decoder now stops at the first one over (protobuf parses
    # nothing first).
    limit = 2**16
    data = _side_tensors(limit - 3)  # + pixel_values and the two side tensors of _vllm()
    assert len(tensors.parse(data, vllm_pb.GenerateRequest)) == limit
    over = _side_tensors(limit - 2)
    with pytest.raises(TensorError, match="more than 65536 tensor payloads") as info:
        tensors.parse(over, vllm_pb.GenerateRequest)
    assert (info.value.field, info.value.expected, info.value.actual) == ("data", limit, limit + 1)


# -- 5. exact size arithmetic ----------------------------------------------------------------


def test_int64_wraparound_sizes_are_refused() -> None:
    request = _vllm(rows=42, grid=(1, 6, 7), embeds=1)
    mm = request.mm_inputs
    mm.model_specific_tensors["image_grid_thw"].CopyFrom(
        tensors.pack(np.array([[1, 1, 1]] * 3, np.int64), vllm_pb.TensorData)
    )
    big = 2**63 - 1
    mm.model_specific_tensors["patches_per_image"].CopyFrom(
        tensors.pack(np.array([big, big, 42], np.int64), vllm_pb.TensorData)
    )
    request.tokenized.input_ids[:] = [1, TOKEN, TOKEN, TOKEN, 2]
    del mm.mm_placeholders[:]
    for i in range(3):
        mm.mm_placeholders.add(offset=1 + i, length=1)
    with pytest.raises(
        MultimodalLayoutError, match=r"patches_per_image\]\[0\] = 9223372036854775807"
    ):
        vllm_adapter.decode_mm_inputs(request)
    # the same sizes through the SGLang layout inference
    sgl = sgl_pb.GenerateRequest(
        request_id="r", tokenized={"input_ids": [1, TOKEN, TOKEN, TOKEN, 2]}
    )
    sgl.mm_inputs.pixel_values.CopyFrom(
        tensors.pack(np.ones((42, 8), np.float32), sgl_pb.TensorData)
    )
    sgl.mm_inputs.model_specific_tensors["patches_per_image"].CopyFrom(
        tensors.pack(np.array([big, big, 42], np.int64), sgl_pb.TensorData)
    )
    for i in range(3):
        sgl.mm_inputs.mm_placeholders.add(offset=1 + i, length=1)
    with pytest.raises(MultimodalLayoutError, match=r"must lie in 0\.\.42"):
        sglang_adapter.decode_mm_inputs(sgl)


def test_uint64_grid_beyond_int64_is_refused_by_its_real_value() -> None:
    request = _vllm()
    request.mm_inputs.model_specific_tensors["image_grid_thw"].Clear()
    td = request.mm_inputs.model_specific_tensors["image_grid_thw"]
    td.shape.extend([1, 3])
    td.dtype = "uint32"
    td.inline = np.array([[1, 4, 4]], "<u4").tobytes()
    (batch,) = vllm_adapter.decode_mm_inputs(request, merge_size=2)
    assert batch.tensors["image_grid_thw"].tolist() == [[1, 4, 4]]


# -- 7. validation gaps ----------------------------------------------------------------------


@pytest.mark.parametrize(("grid", "rows"), [((1, 3, 3), 9), ((1, 1, 9), 9), ((2, 2, 3), 12)])
def test_grid_not_divisible_by_merge_size_is_refused(grid: tuple[int, int, int], rows: int) -> None:
    request = _vllm(rows=rows, grid=grid, embeds=rows // 4)
    with pytest.raises(MultimodalLayoutError, match="multiples of the merge size 2"):
        vllm_adapter.decode_mm_inputs(request, merge_size=2)
    ts = _tokenspeed()
    ts.mm_inputs.items[0].encoder_input.CopyFrom(
        tensors.pack(np.ones((rows, 8), np.float32), ts_pb.TensorData)
    )
    ts.mm_inputs.items[0].model_specific_tensors["image_grid_thw"].CopyFrom(
        tensors.pack(np.array([grid], np.int64), ts_pb.TensorData)
    )
    with pytest.raises(MultimodalLayoutError, match="multiples of the merge size 2"):
        ts_adapter.decode_mm_inputs(ts, merge_size=2)


def test_grid_without_flat_keys_is_refused_for_several_items() -> None:
    request = _vllm(rows=32, embeds=4)
    mm = request.mm_inputs
    mm.model_specific_tensors["image_grid_thw"].CopyFrom(
        tensors.pack(np.array([[1, 4, 4]] * 2, np.int64), vllm_pb.TensorData)
    )
    mm.model_specific_tensors["patches_per_image"].CopyFrom(
        tensors.pack(np.array([16, 16], np.int64), vllm_pb.TensorData)
    )
    request.tokenized.input_ids[:] = [1, *[TOKEN] * 4, 2, *[TOKEN] * 4, 3]
    mm.mm_placeholders.add(offset=6, length=4)
    (batch,) = vllm_adapter.decode_mm_inputs(request, merge_size=2)
    assert [it.tensors["pixel_values"].shape[0] for it in batch.items] == [16, 16]
    del mm.flat_keys["pixel_values"]  # every item would get all 32 rows
    with pytest.raises(MultimodalLayoutError, match="shared by all 2 items, but the batch has a"):
        vllm_adapter.decode_mm_inputs(request, merge_size=2)


def test_grid_without_flat_keys_for_one_item_checks_the_rows() -> None:
    request = _vllm()
    del request.mm_inputs.flat_keys["pixel_values"]
    (batch,) = vllm_adapter.decode_mm_inputs(request, merge_size=2)
    assert batch.items[0].tensors["pixel_values"].shape == (16, 8)
    request.mm_inputs.pixel_values.CopyFrom(
        tensors.pack(np.ones((12, 8), np.float32), vllm_pb.TensorData)
    )
    with pytest.raises(MultimodalLayoutError, match="means 16 patches, but the item has 12 rows"):
        vllm_adapter.decode_mm_inputs(request, merge_size=2)


# -- 8. shapes numpy cannot hold are library errors ------------------------------------------


@pytest.mark.parametrize(
    ("shape", "match"),
    [
        ([1] * 65, "65 dimensions; at most"),
        ([0, 2**32 - 1, 2**32 - 1, 2**32 - 1], "more than an array can address"),
    ],
)
def test_shapes_numpy_cannot_hold(shape: list[int], match: str) -> None:
    td = vllm_pb.TensorData(shape=shape, dtype="float32", inline=b"")
    with pytest.raises(TensorError, match=match):
        tensors.unpack(td)
    request = vllm_pb.GenerateRequest(request_id="r")
    request.mm_inputs.pixel_values.CopyFrom(td)
    with pytest.raises(TensorError, match=match):
        tensors.parse(request.SerializeToString(), vllm_pb.GenerateRequest)


# -- 9. path inputs ---------------------------------------------------------------------------


def test_fifo_path_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "image.jpg"
    os.mkfifo(fifo)
    start = time.perf_counter()
    with pytest.raises(InputFileError, match="not a regular file") as info:
        decode_image(str(fifo))
    assert time.perf_counter() - start < 5
    assert info.value.field == "data"


def test_device_path_is_refused() -> None:
    with pytest.raises(InputFileError, match="not a regular file"):
        decode_image("/dev/zero")


def test_file_longer_than_the_cap_is_refused(tmp_path: Path) -> None:
    from smg_grpc_proto.vision._inputs import read_file

    path = tmp_path / "big.bin"
    path.write_bytes(bytes(1000))
    assert read_file(path, "x", max_bytes=1000) == bytes(1000)
    with pytest.raises(InputFileError, match="holds more than 999 bytes") as info:
        read_file(path, "x", max_bytes=999)
    assert (info.value.expected, info.value.actual) == (999, 1000)


# -- 10. errors that name their place --------------------------------------------------------


def test_parse_error_of_a_top_level_tensor_names_its_type() -> None:
    td = vllm_pb.TensorData(shape=[4], dtype="float32", inline=bytes(12))
    with pytest.raises(TensorError) as info:
        tensors.parse(td.SerializeToString(), vllm_pb.TensorData)
    assert str(info.value).startswith("vllm.grpc.engine.TensorData.inline: 12 bytes")
    assert info.value.field == "vllm.grpc.engine.TensorData.inline"


@pytest.mark.parametrize("key", ["a.b", "x[0]", "]", "a.b[c].d", "[", "."])
def test_to_message_with_map_keys_holding_path_characters(key: str) -> None:
    request = vllm_pb.GenerateRequest(request_id="r")
    values = np.arange(64, dtype=np.float32)
    request.mm_inputs.model_specific_tensors[key].CopyFrom(tensors.pack(values, vllm_pb.TensorData))
    received = tensors.parse(request.SerializeToString(), vllm_pb.GenerateRequest)
    assert received.to_message() == request


# -- 11. a refused request leaves no segment behind -------------------------------------------


def _shm_vllm() -> tuple[Any, list[str]]:
    request = _vllm()
    names = []
    mm = request.mm_inputs
    for td in (mm.pixel_values, mm.model_specific_tensors["image_grid_thw"]):
        data = td.inline
        name = _segment(data)
        td.ClearField("inline")
        td.shm.name, td.shm.nbytes = name, len(data)
        names.append(name)
    return request, names


@pytest.mark.parametrize(
    "spoil",
    [
        "placeholder_past_end",  # refused before any tensor is read
        "bad_hash",  # refused after the placeholders
        "wrong_nbytes",  # the first segment's handle is wrong
        "grid_mismatch",  # refused after every tensor was read
    ],
)
def test_vllm_refused_request_consumes_its_segments(spoil: str) -> None:
    request, names = _shm_vllm()
    mm = request.mm_inputs
    if spoil == "placeholder_past_end":
        mm.mm_placeholders[0].length = 99
    elif spoil == "bad_hash":
        mm.mm_hashes.append("zz")
    elif spoil == "wrong_nbytes":
        mm.pixel_values.shm.nbytes += 4
    else:
        mm.model_specific_tensors["patches_per_image"].CopyFrom(
            tensors.pack(np.array([15], np.int64), vllm_pb.TensorData)
        )
    with pytest.raises((MultimodalError, TensorError)):
        vllm_adapter.decode_mm_inputs(request, merge_size=2)
    assert [n for n in names if (DEV_SHM / n).exists()] == []


def test_tokenspeed_refused_request_consumes_its_segments() -> None:
    request = _tokenspeed()
    item = request.mm_inputs.items[0]
    data = item.encoder_input.inline
    name = _segment(data)
    item.encoder_input.ClearField("inline")
    item.encoder_input.shm.name, item.encoder_input.shm.nbytes = name, len(data)
    item.content_hash = b"short"
    with pytest.raises(Exception, match="content_hash has 5 bytes"):
        ts_adapter.decode_mm_inputs(request)
    assert not (DEV_SHM / name).exists()


def test_kept_segments_stay_when_the_reader_keeps_them() -> None:
    request, names = _shm_vllm()
    request.mm_inputs.mm_placeholders[0].length = 99
    try:
        with pytest.raises(PlaceholderError):
            vllm_adapter.decode_mm_inputs(request, unlink=False)
        assert all((DEV_SHM / n).exists() for n in names)
    finally:
        for n in names:
            shm.release(n)


# -- 7. normalisation constants that would write inf or flip signs ---------------------------


@pytest.mark.parametrize("family", typing.get_args(Family))
@pytest.mark.parametrize("std", [[0.0, 0.5, 0.5], [0.5, -0.5, 0.5], [0.5, 0.5, float("inf")]])
def test_image_std_must_be_positive_and_finite(family: str, std: list[float]) -> None:
    with pytest.raises(ProcessorConfigError, match="image_std: expected") as info:
        ImageProcessor(family, {"image_std": std})  # type: ignore[arg-type]
    assert info.value.field == "image_std"


def test_processor_max_pixels_past_64_bits_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"max_pixels must lie in 0\.\.18446744073709551615"):
        ImageProcessor("qwen2_vl", max_pixels=2**70)
    ImageProcessor("qwen2_vl", max_pixels=2**64 - 1)  # the largest value the limit holds


# -- a tensor hidden in an unknown field ---------------------------------------------------------


def _len_record(number: int, payload: bytes) -> bytes:
    def varint(n: int) -> bytes:
        out = bytearray()
        while n >= 0x80:
            out.append(n & 0x7F | 0x80)
            n >>= 7
        out.append(n)
        return bytes(out)

    return varint(number << 3 | 2) + varint(len(payload)) + payload


def test_map_entry_with_a_stray_field_round_trips_like_protobuf() -> None:
    """upb keeps a map entry holding a field other than key and value as an unknown field of the
    map's message, tensor bytes and all; the parsed message and `to_message()` equal protobuf's
    (found by the fuzz campaign: the unknown field carried our payload token instead)."""
    tensor = vllm_pb.TensorData(
        inline=np.arange(6, dtype=np.int64).tobytes(), shape=[2, 3], dtype="int64"
    )
    value = _len_record(2, tensor.SerializeToString())
    good_entry = _len_record(1, b"patches_per_image") + value
    stray_entry = _len_record(1, b"image_grid_thw") + value + _len_record(3, b"x")  # not key/value
    mm = _len_record(3, good_entry) + _len_record(3, stray_entry)
    data = _len_record(1, b"r") + _len_record(7, mm)
    reference = vllm_pb.GenerateRequest.FromString(data)
    assert list(reference.mm_inputs.model_specific_tensors) == ["patches_per_image"]

    parsed = tensors.parse(data, vllm_pb.GenerateRequest)
    assert parsed.to_message() == reference
    assert parsed.to_message().SerializeToString() == reference.SerializeToString()
    assert parsed.message.SerializeToString() == reference.SerializeToString()
    key = "mm_inputs.model_specific_tensors[patches_per_image]"
    np.testing.assert_array_equal(parsed.arrays[key], np.arange(6).reshape(2, 3))
