"""Deferred pixel values: Qwen's ``pixel_values`` written straight into the serialized request
(or the shared-memory segment) instead of into an array that is then copied.

Every path is compared byte for byte with the eager one (the processor's array attached and
serialized as before): the wire bytes at every alignment of the payload inside the message,
small and large tensors (plain and streaming stores), images and videos, shm, dtype conversion,
the numpy fallback codec, and the materialised output."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from smg_grpc_proto import _native, tensors
from smg_grpc_proto.engines import VisionModel
from smg_grpc_proto.engines import sglang as sglang_adapter
from smg_grpc_proto.engines import vllm as vllm_adapter
from smg_grpc_proto.errors import TensorError
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sgl_pb
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm_pb
from smg_grpc_proto.tensors import _backend
from smg_grpc_proto.vision import DeferredOutput, ImageProcessor

PATH = "mm_inputs.pixel_values"
MASK_PATH = "mm_inputs.model_specific_tensors[pixel_attention_mask]"


def _images(seed: int, sizes: list[tuple[int, int]]) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]


def _jpeg(image: np.ndarray[Any, Any]) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def _prompt(n: int) -> list[int]:
    return [101, *([151652, 151655, 151653] * n), 102]


def _deferred_and_eager(
    seed: int, size: tuple[int, int]
) -> tuple[VisionModel, list[np.ndarray[Any, Any]], Any, np.ndarray[Any, Any]]:
    """A Qwen2-VL model, one random image, its deferred media and the eager pixel values."""
    model = VisionModel.for_family("qwen2_vl")
    images = _images(seed, [size])
    reference = ImageProcessor.for_family("qwen2_vl")(images).pixel_values
    assert reference is not None
    return model, images, model.prepare(images), reference


def _eager_wire(
    request_id: str, media: Any, pixels: np.ndarray[Any, Any], dtype: str | None = None
) -> bytes:
    """The request with the materialised array attached (converted to ``dtype`` on the wire),
    as before deferral."""
    request = vllm_adapter.generate_request(request_id, _prompt(media.count), media)
    request.attach(PATH, pixels, dtype=dtype)
    return tensors.serialize(request)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_deferred_output_materialises_the_eager_output(family: str) -> None:
    processor = ImageProcessor.for_family(family)  # type: ignore[arg-type]
    images = _images(1, [(300, 200), (97, 131)])
    eager = processor(images)
    deferred = processor.deferred(images)
    assert isinstance(deferred, DeferredOutput)
    assert set(deferred.pending) == {"pixel_values"}
    assert deferred.ready.pixel_values is None
    pending = deferred.pending["pixel_values"]
    assert eager.pixel_values is not None
    assert list(pending.shape) == list(eager.pixel_values.shape)
    assert pending.dtype == "float32"
    assert pending.nbytes == eager.pixel_values.nbytes
    np.testing.assert_array_equal(deferred.ready.image_grid_thw, eager.image_grid_thw)
    assert deferred.ready.num_image_tokens == eager.num_image_tokens
    out = deferred.materialize()
    assert out.pixel_values is not None
    assert out.pixel_values.tobytes() == eager.pixel_values.tobytes()
    # Each materialisation writes the values again, the same bits.
    again = np.asarray(pending.materialize())
    assert again.tobytes() == eager.pixel_values.tobytes()


def test_deferred_videos_and_other_families() -> None:
    processor = ImageProcessor.for_family("qwen2_vl")
    frames = _images(2, [(84, 112)] * 3)
    eager = processor(videos=[frames])
    deferred = processor.deferred(videos=[frames])
    assert set(deferred.pending) == {"pixel_values_videos"}
    pending = deferred.pending["pixel_values_videos"]
    assert pending.name == "pixel_values_videos"
    assert eager.pixel_values_videos is not None
    assert np.asarray(pending.materialize()).tobytes() == eager.pixel_values_videos.tobytes()
    np.testing.assert_array_equal(deferred.ready.video_grid_thw, eager.video_grid_thw)
    # A family without deferral computes everything now.
    clip = ImageProcessor.for_family("clip")
    done = clip.deferred(_images(3, [(50, 70)]))
    assert not done.pending
    assert done.ready.pixel_values is not None
    assert done.ready.pixel_values.tobytes() == clip(_images(3, [(50, 70)])).pixel_values.tobytes()  # type: ignore[union-attr]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [None, "bfloat16"])
@pytest.mark.parametrize("size", [(300, 200), (960, 1280)], ids=["small", "23MB-streamed"])
def test_wire_bytes_at_every_payload_alignment(size: tuple[int, int], dtype: str | None) -> None:
    """The payload's offset in the message follows the fields before it: request ids of 1..64
    characters move it through 64 consecutive offsets, so every byte alignment within a cache
    line. Large tensors take the streaming-store path, whose cache-line split depends on it.
    As ``bfloat16`` the values are written straight into the request too, half the bytes, the
    same bits as the float32 array converted on the wire."""
    model = VisionModel.for_family("qwen2_vl")
    files = [_jpeg(_images(4, [size])[0])]
    media = model.prepare(files, threads=1)
    reference = VisionModel.for_family("qwen2_vl").prepare(files, threads=1).output.pixel_values
    assert reference is not None
    offsets = set()
    payload = _native.convert(reference, dtype) if dtype else reference.tobytes()
    assert len(payload) == reference.nbytes // (2 if dtype else 1)
    for n in range(1, 65):
        request_id = "r" * n
        request = vllm_adapter.generate_request(request_id, _prompt(1), media, dtype=dtype)
        assert PATH in request
        assert len(request) == 3
        wire = tensors.serialize(request)
        expected = _eager_wire(request_id, media, reference, dtype)
        assert wire == expected, f"request id of {n} characters"
        offsets.add(wire.find(payload[:64]) % 64)
        decoded = vllm_adapter.decode_mm_inputs(tensors.parse(wire, vllm_pb.GenerateRequest))
        got = decoded[0].tensors["pixel_values"]
        assert np.asarray(got).tobytes() == payload
    assert len(offsets) == 64


def test_media_materialises_once_and_builders_stay_deferred() -> None:
    model = VisionModel.for_family("qwen2_vl")
    images = _images(5, [(140, 196), (56, 56)])
    media = model.prepare(images)
    assert isinstance(media.processed, DeferredOutput)
    wire_tensors = media.wire_tensors()
    assert isinstance(wire_tensors["pixel_values"], _native.PendingTensor)
    assert media.layout() == {"pixel_values": "flat", "image_grid_thw": "batched"}
    assert media.flat_sizes() == (140 * 196 // 196, 16)
    eager = ImageProcessor.for_family("qwen2_vl")(images)
    first = media.output
    assert first is media.output  # written once, then cached
    assert first.pixel_values is not None
    assert eager.pixel_values is not None
    assert first.pixel_values.tobytes() == eager.pixel_values.tobytes()
    assert isinstance(media.wire_tensors()["pixel_values"], np.ndarray)
    assert media.item_tensors(1)["pixel_values"].shape == (16, 1176)


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_shm_transport_writes_straight_into_the_segment(tmp_path: Path, dtype: str | None) -> None:
    _, _, media, reference = _deferred_and_eager(6, (200, 300))
    request = vllm_adapter.generate_request("r", _prompt(1), media, transport="shm", dtype=dtype)
    assert len(request.shm_segments) == 1
    received = tensors.parse(tensors.serialize(request), vllm_pb.GenerateRequest)
    assert received.message.mm_inputs.pixel_values.shm.nbytes == reference.nbytes // (
        2 if dtype else 1
    )
    decoded = vllm_adapter.decode_mm_inputs(received)
    want = _native.convert(reference, dtype) if dtype else reference.tobytes()
    assert np.asarray(decoded[0].tensors["pixel_values"]).tobytes() == want


def test_conversion_and_accessors_materialise() -> None:
    model, images, media, reference = _deferred_and_eager(7, (112, 84))
    request = vllm_adapter.generate_request("r", _prompt(1), media, dtype="bfloat16")
    want = tensors.pack(reference, vllm_pb.TensorData, dtype="bfloat16").inline
    wire = tensors.parse(tensors.serialize(request), vllm_pb.GenerateRequest)
    assert wire.message.mm_inputs.pixel_values.dtype == "bfloat16"
    assert wire.to_message().mm_inputs.pixel_values.inline == want
    # A pending attachment reads back as the array it stands for.
    message = tensors.TensorMessage(vllm_pb.GenerateRequest(request_id="r"))
    pending = model.processor.deferred(images).pending["pixel_values"]
    message.attach(PATH, pending)
    assert PATH in message
    assert list(message) == [PATH]
    assert "pixel_values" in repr(message)
    assert message[PATH].tobytes() == reference.tobytes()
    assert message.arrays[PATH].tobytes() == reference.tobytes()
    assert tensors.serialize(message) == tensors.serialize(message.to_message())


def test_numpy_fallback_codec_writes_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    model = VisionModel.for_family("qwen2_vl")
    media = model.prepare(_images(8, [(100, 150)]))
    native = tensors.serialize(vllm_adapter.generate_request("r", _prompt(1), media))
    monkeypatch.setattr(_backend, "_NATIVE", None)
    fallback = tensors.serialize(vllm_adapter.generate_request("r", _prompt(1), media))
    assert fallback == native


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_sglang_builder_writes_pending_pixels(dtype: str | None) -> None:
    _, _, media, reference = _deferred_and_eager(9, (90, 120))
    request = sglang_adapter.generate_request("r", _prompt(1), media, dtype=dtype)
    wire = tensors.serialize(request)
    received = tensors.parse(wire, sgl_pb.GenerateRequest)
    decoded = sglang_adapter.decode_mm_inputs(received)
    want = _native.convert(reference, dtype) if dtype else reference.tobytes()
    assert np.asarray(decoded[0].tensors["pixel_values"]).tobytes() == want
    # The pixel values are most of the request: as bfloat16 it is half the size.
    assert len(want) < len(wire) < len(want) + 4096


@pytest.mark.parametrize(
    "family",
    ["qwen2_5_vl", "qwen3_vl", "qwen3_omni_moe", "glm4v", "glm46v", "glm5_next", "minimax_m3_vl"],
)
def test_every_deferring_family_writes_bfloat16_as_its_float32_rounded(family: str) -> None:
    """Every family that defers its pixel values shares the window-row writer: written as
    bfloat16, the bytes are its float32 values converted on the wire (images of two sizes,
    one of them a strip, in one batch)."""
    processor = ImageProcessor.for_family(family)  # type: ignore[arg-type]
    images = _images(11, [(90, 130), (29, 300)])
    pending = processor.deferred(images).pending["pixel_values"]
    float32 = np.asarray(pending.materialize())
    assert float32.tobytes() == processor(images).pixel_values.tobytes()  # type: ignore[union-attr]
    half = np.zeros(pending.nbytes // 2, np.uint8)
    _native.convert_into(pending, half, "bfloat16")
    assert half.tobytes() == _native.convert(float32, "bfloat16")


def test_native_refusals_name_the_numbers() -> None:
    pending = ImageProcessor.for_family("qwen2_vl").deferred(_images(10, [(56, 56)]))
    tensor = pending.pending["pixel_values"]
    with pytest.raises(
        ValueError,
        match=r"PendingTensor \(pixel_values\) is written as float32 or bfloat16, not float16",
    ):
        _native.convert_into(tensor, np.zeros(tensor.nbytes // 2, np.uint8), "float16")
    with pytest.raises(ValueError, match=rf"holds 7 bytes, .* needs exactly {tensor.nbytes // 2}"):
        _native.convert_into(tensor, np.zeros(7, np.uint8), "bfloat16")
    half = np.zeros(tensor.nbytes // 2, np.uint8)
    _native.convert_into(tensor, half, "bfloat16")
    assert half.tobytes() == _native.convert(np.asarray(tensor.materialize()), "bfloat16")
    with pytest.raises(ValueError, match=rf"holds 7 bytes, .* needs exactly {tensor.nbytes}"):
        _native.convert_into(tensor, np.zeros(7, np.uint8), "float32")
    out = np.zeros(tensor.nbytes, np.uint8)
    _native.convert_into(tensor, out, "float32")
    assert out.tobytes() == np.asarray(tensor.materialize()).tobytes()
    message = tensors.TensorMessage(vllm_pb.GenerateRequest(request_id="r"))
    with pytest.raises(TensorError, match="dtype"):
        message.attach(PATH, tensor, dtype="int64")


# Families whose writes go through `Slot`s plan their pixel values too (`processors/pending.rs`):
# the same writer fills the eager array and the request, so the bytes must agree everywhere.
PLANNED = ["llava_next", "gemma3", "internvl", "idefics3", "mllama", "gemma4", "gemma4_unified"]
# Llama 3.2 Vision reaches no engine (a cross-attention model, `engines/_tensors.py`).
TO_ENGINES = [f for f in PLANNED if f != "mllama"]


@pytest.mark.parametrize("family", PLANNED)
def test_planned_families_defer_and_materialise_the_eager_output(family: str) -> None:
    # A strip, a large image (tiles, pan-and-scan crops) and a tiny one: batch padding in
    # LLaVA-NeXT, several crops in Gemma 3 (pan-and-scan on), several tiles in InternVL.
    images = _images(21, [(30, 400), (700, 300), (9, 13)])
    config = (
        {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 30} if family == "gemma3" else None
    )
    processor = ImageProcessor(family, config)  # type: ignore[arg-type]
    eager = processor(images)
    deferred = processor.deferred(images)
    # Idefics3's mask (all ones) is planned too: written where it travels, never computed first.
    mask = {"pixel_attention_mask"} if family == "idefics3" else set()
    assert set(deferred.pending) == {"pixel_values", *mask}
    assert deferred.ready.pixel_values is None
    assert deferred.ready.pixel_attention_mask is None
    pending = deferred.pending["pixel_values"]
    assert eager.pixel_values is not None
    assert list(pending.shape) == list(eager.pixel_values.shape)
    assert pending.nbytes == eager.pixel_values.nbytes
    assert deferred.ready.num_image_tokens == eager.num_image_tokens
    # More tiles, crops or patches than images (LLaVA-NeXT keeps them in a dimension of their
    # own, Idefics3 behind a sample dimension of 1, Llama 3.2 Vision both, Gemma 4 per image).
    shape = eager.pixel_values.shape
    rows = {"idefics3": shape[1], "mllama": shape[1] * shape[2]}.get(family, shape[0])
    if family.startswith("gemma4"):
        rows = shape[0] * shape[1]
    assert rows > len(images) or family == "llava_next"
    for name in (
        "image_sizes",
        "num_crops",
        "num_patches",
        "rows",
        "cols",
        "image_position_ids",
        "num_soft_tokens_per_image",
    ):
        if getattr(eager, name) is not None:
            np.testing.assert_array_equal(getattr(deferred.ready, name), getattr(eager, name))
    materialized = deferred.materialize()
    assert materialized.pixel_values.tobytes() == eager.pixel_values.tobytes()  # type: ignore[union-attr]
    if mask:
        want = eager.pixel_attention_mask
        assert want is not None
        assert want.dtype == np.int64
        assert (want == 1).all()
        got = materialized.pixel_attention_mask
        assert got is not None
        assert got.dtype == np.int64
        assert got.shape == want.shape
        assert got.tobytes() == want.tobytes()
        planned = deferred.pending["pixel_attention_mask"]
        assert (planned.dtype, list(planned.shape), planned.nbytes) == (
            "int64",
            list(want.shape),
            want.nbytes,
        )
        out = np.zeros(want.nbytes, np.uint8)
        _native.convert_into(planned, out, "int64")
        assert out.tobytes() == want.tobytes()
        with pytest.raises(ValueError, match="written as int64, not float32"):
            _native.convert_into(planned, out[: want.nbytes // 2], "float32")
    half = np.zeros(pending.nbytes // 2, np.uint8)
    _native.convert_into(pending, half, "bfloat16")
    assert half.tobytes() == _native.convert(eager.pixel_values, "bfloat16")
    with pytest.raises(ValueError, match="float32 or bfloat16, not float16"):
        _native.convert_into(pending, np.zeros(pending.nbytes // 2, np.uint8), "float16")


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
@pytest.mark.parametrize("family", TO_ENGINES)
def test_planned_families_write_the_eager_request(family: str, dtype: str | None) -> None:
    """The request built from planned pixel values is byte for byte the one built from the
    eager array, at every payload alignment within 8 bytes, and decodes to the eager values;
    over shared memory too."""
    model = VisionModel.for_family(family)  # type: ignore[arg-type]
    files = [_jpeg(image) for image in _images(22, [(300, 500), (64, 48)])]
    media = model.prepare(files, threads=2)
    assert isinstance(media.processed, DeferredOutput)
    assert isinstance(media.wire_tensors()["pixel_values"], _native.PendingTensor)
    output = VisionModel.for_family(family).prepare(files).output  # type: ignore[arg-type]
    reference = output.pixel_values
    assert reference is not None
    mask = output.pixel_attention_mask  # Idefics3's, planned too
    if media.per_sample:  # Idefics3: the request carries the batch's one sample
        assert reference.shape[0] == 1
        reference = reference[0]
        assert mask is not None
        mask = mask[0]
    prompt = [1, *([media.anchor] * media.count), 2]
    want = _native.convert(reference, dtype) if dtype else reference.tobytes()
    for n in range(1, 9):
        request = vllm_adapter.generate_request("r" * n, prompt, media, dtype=dtype)
        eager = vllm_adapter.generate_request("r" * n, prompt, media, dtype=dtype)
        eager.attach(PATH, reference, dtype=dtype)
        if mask is not None:
            eager.attach(MASK_PATH, mask)
        wire = tensors.serialize(request)
        assert wire == tensors.serialize(eager), f"request id of {n} characters"
        decoded = vllm_adapter.decode_mm_inputs(tensors.parse(wire, vllm_pb.GenerateRequest))
        assert np.asarray(decoded[0].tensors["pixel_values"]).tobytes() == want
    shm = vllm_adapter.generate_request("r", prompt, media, transport="shm", dtype=dtype)
    received = tensors.parse(tensors.serialize(shm), vllm_pb.GenerateRequest)
    # The pixel values in a segment of their own (Idefics3's large mask takes another).
    assert received.message.mm_inputs.pixel_values.shm.nbytes == len(want)
    decoded = vllm_adapter.decode_mm_inputs(received)
    assert np.asarray(decoded[0].tensors["pixel_values"]).tobytes() == want
    if mask is not None:
        # The mask, planned as well, arrives as the eager int64 ones in a segment of its own.
        assert isinstance(media.wire_tensors()["pixel_attention_mask"], _native.PendingTensor)
        assert received.message.mm_inputs.model_specific_tensors["pixel_attention_mask"].shm.name
        got = np.asarray(decoded[0].tensors["pixel_attention_mask"])
        assert got.dtype == np.int64
        assert got.tobytes() == mask.tobytes()


def test_a_pending_tensor_views_its_values_under_another_shape() -> None:
    """Idefics3's pixel values travel without their sample dimension of 1: a view of the
    pending tensor, which writes the same bytes; a shape of another size is refused with both
    sizes."""
    processor = ImageProcessor.for_family("idefics3")
    images = _images(23, [(200, 500)])
    pending = processor.deferred(images).pending["pixel_values"]
    shape = list(pending.shape)
    assert shape[0] == 1
    view = pending.reshaped(shape[1:])
    assert list(view.shape) == shape[1:]
    assert list(pending.shape) == shape
    assert view.nbytes == pending.nbytes
    assert np.asarray(view.materialize()).shape == tuple(shape[1:])
    assert np.asarray(view.materialize()).tobytes() == np.asarray(pending.materialize()).tobytes()
    with pytest.raises(TensorError, match=r"cannot be viewed as \[2, .*values\)"):
        pending.reshaped([2, *shape[1:]])
