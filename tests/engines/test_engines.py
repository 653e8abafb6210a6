"""Engine adapters (smg_grpc_proto.engines): builder -> wire bytes -> decoder, for every engine
and every supported model, compared byte for byte with the processor's output; placeholder
counts against each model's rule (transformers' own functions where they are importable);
validation of every malformed field; mutated wire bytes into every decoder."""

from __future__ import annotations

import functools
import io
import json
import os
import types
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from PIL import Image

from smg_grpc_proto import tensors
from smg_grpc_proto.engines import PreparedMedia, VisionModel, content_hash, expand_placeholders
from smg_grpc_proto.engines import mlx as mlx_adapter
from smg_grpc_proto.engines import sglang as sglang_adapter
from smg_grpc_proto.engines import tokenspeed as ts_adapter
from smg_grpc_proto.engines import trtllm as trt_adapter
from smg_grpc_proto.engines import vllm as vllm_adapter
from smg_grpc_proto.errors import (
    MultimodalError,
    MultimodalLayoutError,
    PlaceholderError,
    SmgProtoError,
    TensorError,
)
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sgl_pb
from smg_grpc_proto.generated import tokenspeed_scheduler_pb2 as ts_pb
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm_pb
from smg_grpc_proto.vision import VisionTokens

QWEN = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
FAMILIES = (*QWEN, "llava", "llava_next", "clip", "siglip")
# CLIP and SigLIP towers have no published default token rule: as a ViT-L/14 with CLS (LLaVA's
# tower) and a SigLIP so400m/14 without CLS.
TOWER = {
    "clip": (VisionTokens(14, 1, "default"), 32000),
    "siglip": (VisionTokens(14, 0, "full"), 257152),
}
SIZES = [(56, 84), (300, 200), (97, 131)]


def _model(family: str) -> VisionModel:
    if family in TOWER:
        vision, token = TOWER[family]
        return VisionModel.for_family(family, image_token_id=token, vision_tokens=vision)  # type: ignore[arg-type]
    return VisionModel.for_family(family)  # type: ignore[arg-type]


def _images(seed: int, sizes: list[tuple[int, int]]) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]


def _png(image: np.ndarray[Any, Any]) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def _prompt(token: int, n: int, *, tail: int = 102) -> list[int]:
    ids = [101, 2023]
    for _ in range(n):
        ids += [151652, token, 151653]
    return [*ids, tail]


def _wire(request: tensors.TensorMessage[Any]) -> tensors.TensorMessage[Any]:
    """What the engine receives: the request's bytes parsed by the zero-copy deserializer."""
    return tensors.parse(tensors.serialize(request), type(request.message))


# -- placeholder counts: each model's rule -------------------------------------------------
def _llava_next_rule(orig: tuple[int, int], processed: tuple[int, int], pinpoints: Any) -> int:
    """transformers' LlavaNextProcessor._get_number_of_features (minus the CLS the "default"
    strategy drops), called on a stand-in holding the published processor_config values."""
    from transformers.models.llava_next.processing_llava_next import LlavaNextProcessor

    ns = types.SimpleNamespace(
        patch_size=14,
        num_additional_image_tokens=1,
        image_processor=types.SimpleNamespace(image_grid_pinpoints=pinpoints),
    )
    ns._get_unpadded_features = functools.partial(LlavaNextProcessor._get_unpadded_features, ns)
    return int(LlavaNextProcessor._get_number_of_features(ns, *orig, *processed)) - 1


def _rule(family: str, model: VisionModel, media: PreparedMedia, sizes: list[tuple[int, int]]):
    out = media.output
    if family in QWEN:
        merge = int(model.processor.config["merge_size"])
        return [int(t * h * w) // merge**2 for t, h, w in out.image_grid_thw.tolist()]
    h, w = out.pixel_values.shape[-2:]
    if family == "llava_next":
        pinpoints = model.processor.config["image_grid_pinpoints"]
        return [_llava_next_rule(s, (h, w), pinpoints) for s in sizes]
    vision = model.processor.vision_tokens
    extra = vision.num_additional_image_tokens
    drop = 1 if vision.vision_feature_select_strategy == "default" else 0
    return [(h // vision.patch_size) * (w // vision.patch_size) + extra - drop for _ in sizes]


@pytest.mark.parametrize("family", FAMILIES)
def test_token_counts_follow_the_model_rule(family: str) -> None:
    model = _model(family)
    media = model.prepare(_images(1, SIZES))
    assert list(media.token_counts) == _rule(family, model, media, SIZES)
    if family in ("llava", "clip"):
        assert set(media.token_counts) == {256}  # 224 px class defaults: 16 x 16 patches
    ids, (ranges,) = expand_placeholders(_prompt(media.token_id, 3), [media])
    assert [length for _, length in ranges] == list(media.token_counts)
    for offset, length in ranges:
        assert set(ids[offset : offset + length].tolist()) == {media.token_id}
        # the vision start/end markers stay outside the run
        assert ids[offset - 1] == 151652
        assert ids[offset + length] == 151653


# -- builder -> wire -> decoder, byte for byte ----------------------------------------------
def _assert_same(decoded: np.ndarray[Any, Any], original: np.ndarray[Any, Any]) -> None:
    assert decoded.dtype == original.dtype, (decoded.dtype, original.dtype)
    assert decoded.shape == original.shape
    assert np.ascontiguousarray(decoded).tobytes() == np.ascontiguousarray(original).tobytes()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("transport", ["inline", "shm"])
def test_vllm_round_trip_exact(family: str, transport: str) -> None:
    model = _model(family)
    media = model.prepare([_png(x) for x in _images(2, SIZES)])
    request = vllm_adapter.generate_request(
        "r", _prompt(media.token_id, 3), media, transport=transport, shm_min_bytes=0
    )
    assert bool(request.shm_segments) == (transport == "shm")
    mm = request.message.mm_inputs
    assert mm.im_token_id == media.token_id
    assert list(mm.mm_hashes) == list(media.hex_hashes)
    assert all(len(h) == 64 for h in mm.mm_hashes)
    if family in QWEN:
        assert dict(mm.flat_keys) == {"pixel_values": "patches_per_image"}
        assert list(mm.batched_keys) == ["image_grid_thw", "patches_per_image"]
        assert list(mm.keep_on_cpu_keys) == ["image_grid_thw"]
    else:
        assert dict(mm.flat_keys) == {}
        assert set(mm.batched_keys) == set(media.tensors())
    (batch,) = vllm_adapter.decode_mm_inputs(_wire(request), merge_size=2)
    for name, original in media.tensors().items():
        _assert_same(batch.tensors[name], original)
    for i, item in enumerate(batch.items):
        for name, original in media.item_tensors(i).items():
            _assert_same(item.tensors[name], original)
        assert item.placeholder[1] == media.token_counts[i]
        assert item.content_hash == media.hex_hashes[i]
    ids = np.asarray(request.message.tokenized.input_ids)
    for offset, length in batch.placeholders:
        assert (ids[offset : offset + length] == media.token_id).all()
    assert [n for n in request.shm_segments if os.path.exists(f"/dev/shm/{n}")] == []


@pytest.mark.parametrize("family", FAMILIES)
def test_sglang_round_trip_exact(family: str) -> None:
    model = _model(family)
    files = [_png(x) for x in _images(3, SIZES)]
    media = model.prepare(files)
    for build in (sglang_adapter.generate_request, sglang_adapter.embed_request):
        request = build("r", _prompt(media.token_id, 3), media)
        mm = request.message.mm_inputs
        assert list(mm.image_data) == files
        assert list(mm.modalities) == ["image"]
        assert mm.pixel_values.dtype == "float32"
        (batch,) = sglang_adapter.decode_mm_inputs(_wire(request), merge_size=2)
        for name, original in media.tensors().items():
            _assert_same(batch.tensors[name], original)
        for i, item in enumerate(batch.items):
            for name, original in media.item_tensors(i).items():
                _assert_same(item.tensors[name], original)
            assert item.placeholder[1] == media.token_counts[i]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("transport", "dtype"), [("inline", None), ("shm", "bfloat16")])
def test_tokenspeed_round_trip_exact(family: str, transport: str, dtype: str | None) -> None:
    model = _model(family)
    media = model.prepare(_images(4, SIZES))
    request = ts_adapter.generate_request(
        "r", _prompt(media.token_id, 3), media, transport=transport, dtype=dtype, shm_min_bytes=0
    )
    items = request.message.mm_inputs.items
    assert len(items) == 3
    batches = ts_adapter.decode_mm_inputs(_wire(request), merge_size=2)
    assert len(batches) == 3
    for i, (batch, item) in enumerate(zip(batches, items, strict=True)):
        assert item.modality == common_pb2.IMAGE
        assert item.placeholder_token_id == media.token_id
        assert item.content_hash == content_hash(media.hex_hashes[i])
        assert batch.items[0].content_hash == item.content_hash.hex()
        assert batch.items[0].placeholder[1] == media.token_counts[i]
        for name, original in media.item_tensors(i).items():
            want = (
                original.astype(ml_dtypes.bfloat16)
                if (dtype and name == "pixel_values")
                else original
            )
            _assert_same(batch.tensors[name], want)
    assert [n for n in request.shm_segments if os.path.exists(f"/dev/shm/{n}")] == []


def test_tokenspeed_default_dtype_is_bfloat16() -> None:
    media = _model("qwen2_vl").prepare(_images(5, [(56, 56)]))
    request = ts_adapter.generate_request("r", _prompt(151655, 1), media)
    assert request.message.mm_inputs.items[0].encoder_input.dtype == "bfloat16"
    assert (
        request.message.mm_inputs.items[0].model_specific_tensors["image_grid_thw"].dtype == "int64"
    )


def test_video_and_images_in_one_request() -> None:
    model = VisionModel.for_family("qwen2_vl")
    images = model.prepare(_images(6, [(56, 84), (84, 56)]))
    frames = _images(7, [(56, 56)] * 4)
    video = model.prepare(videos=[frames])
    prompt = [101, 151652, 151655, 151653, 7, 151652, 151656, 151653, 8, 151652, 151655, 151653]
    # vLLM: images in mm_inputs, the video in extra_mm_inputs
    request = vllm_adapter.generate_request("r", prompt, [images, video])
    assert request.message.extra_mm_inputs[0].modality == common_pb2.VIDEO
    first, second = vllm_adapter.decode_mm_inputs(_wire(request), merge_size=2)
    assert first.modality == "image"
    assert second.modality == "video"
    _assert_same(second.tensors["pixel_values_videos"], video.output.pixel_values_videos)
    _assert_same(second.tensors["video_grid_thw"], video.output.video_grid_thw)
    assert second.items[0].placeholder[1] == video.token_counts[0]
    # TokenSpeed: items in prompt order, modalities mixed
    ts = ts_adapter.generate_request("r", prompt, [images, video], dtype=None)
    kinds = [item.modality for item in ts.message.mm_inputs.items]
    assert kinds == [common_pb2.IMAGE, common_pb2.VIDEO, common_pb2.IMAGE]
    decoded = ts_adapter.decode_mm_inputs(_wire(ts), merge_size=2)
    _assert_same(decoded[1].tensors["pixel_values_videos"], video.output.pixel_values_videos)
    offsets = [b.items[0].placeholder[0] for b in decoded]
    assert offsets == sorted(offsets)


def test_content_hashes_cover_bytes_and_parameters() -> None:
    files = [_png(x) for x in _images(8, [(56, 84), (56, 84)])]
    base = VisionModel.for_family("qwen2_vl")
    a = base.prepare(files)
    assert a.hashes == base.prepare(files).hashes  # deterministic
    assert a.hashes[0] != a.hashes[1]  # content
    changed = VisionModel.for_family("qwen2_vl", config={"max_pixels": 200_000})
    assert changed.prepare(files).hashes[0] != a.hashes[0]  # a changed config
    other_family = VisionModel.for_family("qwen2_5_vl")
    assert other_family.prepare(files).hashes[0] != a.hashes[0]
    from_output = PreparedMedia.from_output(a.output, token_id=151655, family="qwen2_vl")
    assert len(from_output.hashes) == 2
    assert from_output.hashes[0] != from_output.hashes[1]


def test_from_pretrained_reads_token_ids(tmp_path: Path) -> None:
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({"image_processor_type": "Qwen2VLImageProcessor", "max_pixels": 400_000})
    )
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "qwen2_vl", "image_token_id": 77, "video_token_id": 78})
    )
    model = VisionModel.from_pretrained(tmp_path)
    assert (model.image_token_id, model.video_token_id, model.model_type) == (77, 78, "qwen2_vl")
    llava = tmp_path / "llava"
    llava.mkdir()
    (llava / "preprocessor_config.json").write_text(
        json.dumps({"image_processor_type": "CLIPImageProcessor", "crop_size": 336, "size": 336})
    )
    (llava / "config.json").write_text(json.dumps({"image_token_index": 32000}))
    media = VisionModel.from_pretrained(llava, family="llava").prepare(_images(9, [(40, 60)]))
    assert media.token_counts == (576,)


# -- builders refuse what they cannot send ---------------------------------------------------
def test_anchor_count_must_match() -> None:
    media = VisionModel.for_family("qwen2_vl").prepare(_images(10, [(56, 56), (56, 56)]))
    with pytest.raises(
        PlaceholderError, match=r"hold 1 image anchor token\(s\) \(151655\) but"
    ) as e:
        vllm_adapter.generate_request("r", _prompt(151655, 1), media)
    assert e.value.field == "input_ids"
    assert (e.value.expected, e.value.actual) == (2, 1)
    with pytest.raises(PlaceholderError, match="uint32"):
        vllm_adapter.generate_request("r", [-1, 151655, 151655], media)
    with pytest.raises(PlaceholderError, match="1-D"):
        vllm_adapter.generate_request("r", [[1, 2]], media)


def test_engine_specific_refusals() -> None:
    model = VisionModel.for_family("qwen2_vl")
    images = model.prepare(_images(11, [(56, 56)]))
    video = model.prepare(videos=[_images(12, [(56, 56)] * 2)])
    with pytest.raises(MultimodalError, match="SGLang's preprocessed input carries images only"):
        sglang_adapter.generate_request("r", [151656], video)
    with pytest.raises(MultimodalError, match="MLX's contract carries no media"):
        mlx_adapter.generate_request("r", [151655], images)
    with pytest.raises(TensorError, match=r"mm_inputs.pixel_values: .*unknown dtype 'float64'"):
        sglang_adapter.generate_request("r", [151655], images, dtype="float64")
    with pytest.raises(TensorError, match="transport must be 'inline', 'shm', 'auto' or 'remote'"):
        vllm_adapter.generate_request("r", [151655], images, transport="rdma")  # type: ignore[arg-type]
    with pytest.raises(MultimodalError, match="one PreparedMedia per modality"):
        vllm_adapter.generate_request("r", [151655, 151655], [images, images])
    with pytest.raises(MultimodalError, match="TensorRT-LLM needs the encoded files"):
        trt_adapter.generate_request("r", [151655], images, max_tokens=4)


# -- TensorRT-LLM and MLX ------------------------------------------------------------------
def test_trtllm_files_round_trip() -> None:
    files = [_png(x) for x in _images(13, [(40, 60), (70, 30)])]
    media = VisionModel.for_family("qwen2_vl").prepare(files)
    prompt = _prompt(151655, 2)
    request = trt_adapter.generate_request("r", prompt, media, max_tokens=8)
    assert list(request.message.tokenized.input_token_ids) == prompt  # not expanded
    assert trt_adapter.decode_mm_inputs(_wire(request), image_token_id=151655) == tuple(files)
    with pytest.raises(PlaceholderError, match=r"holds 2 image anchor token\(s\) \(151655\) for 1"):
        trt_adapter.generate_request("r", prompt, files[:1], max_tokens=8, image_token_id=151655)
    with pytest.raises(MultimodalError, match=r"media\[1\]: not a JPEG, PNG, GIF, BMP or WebP"):
        trt_adapter.generate_request("r", prompt, [files[0], b"hello world"], max_tokens=8)
    with pytest.raises(MultimodalError, match="max_tokens"):
        trt_adapter.generate_request("r", prompt, files, max_tokens=0)
    bad = request.to_message()
    bad.multimodal_input.image_data[0] = b""
    with pytest.raises(MultimodalError, match=r"multimodal_input.image_data\[0\] is empty"):
        trt_adapter.decode_mm_inputs(bad)


def test_mlx_text_only() -> None:
    request = mlx_adapter.generate_request("r", [1, 2, 3], stream=True)
    assert list(request.message.tokenized.input_ids) == [1, 2, 3]
    assert mlx_adapter.decode_mm_inputs(request) == ()


# -- decoders refuse malformed requests, naming field and numbers ---------------------------
def _vllm_two() -> tuple[tensors.TensorMessage[vllm_pb.GenerateRequest], PreparedMedia]:
    media = VisionModel.for_family("qwen2_vl").prepare(_images(14, [(56, 84), (84, 56)]))
    return vllm_adapter.generate_request("r", _prompt(151655, 2), media), media


def _vllm_case(mutate: Any) -> vllm_pb.GenerateRequest:
    request, _ = _vllm_two()
    message = request.to_message()
    mutate(message.mm_inputs)
    return message


def _drop_sizes(mm: Any) -> None:
    mm.batched_keys.remove("patches_per_image")
    del mm.model_specific_tensors["patches_per_image"]


VLLM_BAD = [
    (_drop_sizes, MultimodalLayoutError, "flat_keys[pixel_values] = 'patches_per_image', which is"),
    (lambda mm: mm.mm_hashes.append("ab" * 32), MultimodalError, "3 hashes for 2 items"),
    (lambda mm: mm.mm_hashes.__setitem__(0, "XYZ"), MultimodalError, "64 lower-case hex"),
    (lambda mm: setattr(mm, "modality", common_pb2.AUDIO), MultimodalError, "IMAGE or VIDEO"),
    (lambda mm: mm.ClearField("mm_placeholders"), MultimodalError, "mm_placeholders is empty"),
    (
        lambda mm: setattr(mm.mm_placeholders[1], "offset", mm.mm_placeholders[0].offset),
        PlaceholderError,
        "overlaps mm_inputs.mm_placeholders[0]",
    ),
    (lambda mm: setattr(mm.mm_placeholders[0], "length", 0), PlaceholderError, "length is 0"),
    (lambda mm: setattr(mm, "im_token_id", 5), PlaceholderError, "holds no placeholder token 5"),
    (lambda mm: mm.batched_keys.append("nope"), MultimodalLayoutError, "names 'nope'"),
    (
        lambda mm: mm.batched_keys.append("pixel_values"),
        MultimodalLayoutError,
        "in both batched_keys and flat_keys",
    ),
    (lambda mm: mm.ClearField("pixel_values"), MultimodalError, "pixel_values is not set"),
    (
        lambda mm: setattr(mm.mm_placeholders[0], "length", mm.mm_placeholders[0].length - 1),
        PlaceholderError,
        "item 0: 5 placeholder tokens, but grid [1, 4, 6] with merge size 2 needs 6",
    ),
]


@pytest.mark.parametrize(("mutate", "cls", "message"), VLLM_BAD)
def test_vllm_decoder_refuses(mutate: Any, cls: type[Exception], message: str) -> None:
    with pytest.raises(cls) as info:
        vllm_adapter.decode_mm_inputs(_vllm_case(mutate), merge_size=2)
    assert message in str(info.value)
    assert str(info.value.field).startswith("mm_inputs")  # type: ignore[attr-defined]


def test_vllm_decoder_ignores_keep_on_cpu_keys_of_absent_tensors() -> None:
    """smg 1.13.0 sends Qwen3-VL's model-wide keep_on_cpu_keys (image_grid_thw and
    video_grid_thw) with an image batch; vLLM's servicer consults them only for the tensors
    present, and so does the decoder."""
    message = _vllm_case(lambda mm: mm.keep_on_cpu_keys.append("video_grid_thw"))
    (batch,) = vllm_adapter.decode_mm_inputs(message, merge_size=2)
    assert batch.keep_on_cpu == frozenset({"image_grid_thw"})


def test_vllm_decoder_ignores_batched_keys_of_the_other_modality() -> None:
    """smg 1.13.0's GLM-5.3-Flash / GLM-5-next spec lists its video tensors in batched_keys of
    an image batch; vLLM's servicer registers only the tensors present, and so does the decoder.
    A batched name of the batch's own modality without a tensor is still refused."""
    video_names = ("video_grid_thw", "patches_per_video", "video_second_per_grid")
    message = _vllm_case(lambda mm: mm.batched_keys.extend(video_names))
    (batch,) = vllm_adapter.decode_mm_inputs(message, merge_size=2)
    assert set(batch.tensors) == {"pixel_values", "image_grid_thw", "patches_per_image"}
    bad = _vllm_case(lambda mm: mm.batched_keys.append("image_sizes"))
    with pytest.raises(MultimodalLayoutError, match="names 'image_sizes'"):
        vllm_adapter.decode_mm_inputs(bad, merge_size=2)


def test_vllm_decoder_refuses_exclusive_inputs() -> None:
    request, _ = _vllm_two()
    message = request.to_message()
    message.media_refs.items.add(url="data:,")
    with pytest.raises(MultimodalError, match="media_refs and mm_inputs are mutually exclusive"):
        vllm_adapter.decode_mm_inputs(message)
    message = request.to_message()
    message.text = "hello"
    with pytest.raises(MultimodalError, match="needs tokenized input_ids"):
        vllm_adapter.decode_mm_inputs(message)


def _ts_case(mutate: Any) -> ts_pb.GenerateRequest:
    model = VisionModel.for_family("qwen2_vl")
    media = model.prepare(_images(15, [(56, 84), (84, 56)]))
    message = ts_adapter.generate_request("r", _prompt(151655, 2), media, dtype=None).to_message()
    mutate(message.mm_inputs.items)
    return message


def _rename(items: Any, old: str, new: str) -> None:
    items[0].model_specific_tensors[new].CopyFrom(items[0].model_specific_tensors[old])
    del items[0].model_specific_tensors[old]


TS_BAD = [
    (lambda it: setattr(it[0], "modality", 0), "must be IMAGE (1), AUDIO (2) or VIDEO (3)"),
    (lambda it: _rename(it, "image_grid_thw", "video_grid_thw"), "must not carry video_grid_thw"),
    (lambda it: setattr(it[0], "modality", common_pb2.VIDEO), "must carry video_grid_thw"),
    (lambda it: setattr(it[0], "modality", common_pb2.AUDIO), "an AUDIO item carries no grid"),
    (lambda it: it[0].ClearField("placeholders"), "placeholders is empty"),
    (lambda it: setattr(it[1], "placeholder_token_id", 9), "uses 151655"),
    (lambda it: setattr(it[0], "content_hash", b"x" * 31), "has 31 bytes; expected 32"),
    (lambda it: it[0].ClearField("encoder_input"), "encoder_input is not set"),
    (
        lambda it: setattr(it[1].placeholders[0], "offset", it[0].placeholders[0].offset),
        "overlaps mm_inputs.items[0].placeholders[0]",
    ),
]


@pytest.mark.parametrize(("mutate", "message"), TS_BAD)
def test_tokenspeed_decoder_refuses(mutate: Any, message: str) -> None:
    with pytest.raises(MultimodalError) as info:
        ts_adapter.decode_mm_inputs(_ts_case(mutate), merge_size=2)
    assert message in str(info.value)
    assert info.value.field.startswith("mm_inputs.items[")


def test_tokenspeed_epd_item_without_encoder_input() -> None:
    def drop(items: Any) -> None:
        items[1].ClearField("encoder_input")
        items[1].model_specific_tensors.clear()

    message = _ts_case(drop)
    message.encode_bootstrap_info.items.add(item_index=1, bootstrap_host="127.0.0.1")
    first, second = ts_adapter.decode_mm_inputs(message)
    assert "pixel_values" in first.tensors
    assert dict(second.tensors) == {}


def test_sglang_decoder_refuses() -> None:
    media = VisionModel.for_family("qwen2_vl").prepare(_images(16, [(56, 84), (84, 56)]))
    good = sglang_adapter.generate_request("r", _prompt(151655, 2), media).to_message()
    cases = [
        (lambda mm: mm.modalities.append("video"), "carries images only"),
        (lambda mm: mm.ClearField("pixel_values"), "pixel_values is not set"),
        (lambda mm: mm.image_data.append(b"x"), "image_data holds 1 files for 2"),
        (lambda mm: mm.ClearField("mm_placeholders"), "mm_placeholders is empty"),
    ]
    for mutate, text in cases:
        message = sgl_pb.GenerateRequest()
        message.CopyFrom(good)
        mutate(message.mm_inputs)
        with pytest.raises(MultimodalError, match=text):
            sglang_adapter.decode_mm_inputs(message)
    message = sgl_pb.GenerateRequest()
    message.CopyFrom(good)
    grid = message.mm_inputs.model_specific_tensors["image_grid_thw"]
    values = np.frombuffer(grid.data, dtype="<i8").copy()
    values[2] += 2
    grid.data = values.tobytes()
    with pytest.raises(
        MultimodalLayoutError, match="the grids give 56 patches, but 'pixel_values' has 48"
    ):
        sglang_adapter.decode_mm_inputs(message)


# -- mutated wire bytes: only documented errors ----------------------------------------------
@pytest.mark.parametrize("engine", ["vllm", "sglang", "tokenspeed"])
def test_mutated_requests_raise_only_documented_errors(engine: str) -> None:
    from google.protobuf.message import DecodeError

    adapter = {"vllm": vllm_adapter, "sglang": sglang_adapter, "tokenspeed": ts_adapter}[engine]
    media = VisionModel.for_family("qwen2_vl").prepare(_images(17, [(28, 56), (56, 28)]))
    request = adapter.generate_request("r", _prompt(151655, 2), media)
    data = bytearray(tensors.serialize(request))
    message_type = type(request.message)
    rng = np.random.default_rng(0)
    outcomes = {"ok": 0, "refused": 0}
    for _ in range(1500):
        mutated = bytearray(data)
        for _ in range(int(rng.integers(1, 4))):
            kind = rng.integers(0, 3)
            at = int(rng.integers(0, len(mutated)))
            if kind == 0:
                mutated[at] = int(rng.integers(0, 256))
            elif kind == 1:
                del mutated[at : at + int(rng.integers(1, 16))]
            else:
                mutated[at:at] = rng.integers(
                    0, 256, int(rng.integers(1, 8)), dtype=np.uint8
                ).tobytes()
        try:
            adapter.decode_mm_inputs(tensors.parse(bytes(mutated), message_type), merge_size=2)
            outcomes["ok"] += 1
        except (SmgProtoError, DecodeError):
            outcomes["refused"] += 1
    assert outcomes["refused"] > 100, outcomes


@pytest.mark.parametrize(
    ("engine", "stubs"),
    [
        ("vllm", ["vllm_engine_pb2"]),
        ("sglang", ["sglang_scheduler_pb2"]),
        ("tokenspeed", ["tokenspeed_scheduler_pb2"]),
        ("trtllm", ["trtllm_service_pb2"]),
        ("mlx", ["mlx_engine_pb2"]),
    ],
)
def test_an_adapter_loads_only_its_engines_stubs(engine: str, stubs: list[str]) -> None:
    import subprocess
    import sys

    code = (
        f"import sys, smg_grpc_proto.engines.{engine}\n"
        "print(sorted(m.rsplit('.', 1)[1] for m in sys.modules\n"
        "             if m.startswith('smg_grpc_proto.generated.') and m.endswith('_pb2')))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(run.stdout.replace("'", '"')) == sorted(["common_pb2", *stubs])
