"""Phi-4-multimodal and Phi-3-vision through the engine builders, and every family's published
token ids through ``VisionModel.for_family``.

Phi-4-multimodal's pixels are ``image_pixel_values``: vLLM gets them under that name
(``encoder_input_key``) beside ``image_sizes``, ``image_attention_mask`` and ``num_img_tokens``
(vLLM's ``phi4_multimodal.py`` fields, all batched); ``<|image|>`` (200010) becomes
``num_img_tokens`` copies of itself, as transformers' ``Phi4MultimodalProcessor`` writes it.
Phi-3-vision's ``pixel_values`` and ``image_sizes`` are batched; its ``<|image|>`` (32044)
becomes a run of ``calc_num_image_tokens_from_image_size`` copies, vLLM's ``phi3v.py`` rule."""

from __future__ import annotations

import math
import os
from typing import Any, ClassVar

import ml_dtypes
import numpy as np
import pytest
from PIL import Image

from smg_grpc_proto import _native, tensors
from smg_grpc_proto.engines import PreparedMedia, VisionModel, expand_placeholders
from smg_grpc_proto.engines import sglang as sglang_adapter
from smg_grpc_proto.engines import tokenspeed as ts_adapter
from smg_grpc_proto.engines import vllm as vllm_adapter
from smg_grpc_proto.engines._media import placeholder_ranges
from smg_grpc_proto.engines._tensors import CROSS_ATTENTION, ENGINE_LAYOUTS

PHI4_IMAGE, PHI4_AUDIO = 200010, 200011  # <|image|>, <|audio|> (Phi4MultimodalConfig)
PHI3V_IMAGE = 32044  # <|image|> (vLLM phi3v.py _IMAGE_TOKEN_ID)
TOKEN = {"phi4_multimodal": PHI4_IMAGE, "phi3_v": PHI3V_IMAGE}
PRIMARY = {"phi4_multimodal": "image_pixel_values", "phi3_v": "pixel_values"}
SIDE = {
    "phi4_multimodal": ["image_attention_mask", "image_sizes", "num_img_tokens"],
    "phi3_v": ["image_sizes"],
}
# (height, width): 2 crops, 3 crops (portrait), 1 crop, a thin landscape.
SIZES = [(300, 500), (900, 400), (448, 448), (120, 700)]
FAMILIES = ["phi4_multimodal", "phi3_v"]


def _images(seed: int, sizes: list[tuple[int, int]]) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]


def _prompt(anchor: int, n: int) -> list[int]:
    ids = [1, 17]
    for k in range(n):
        ids += [anchor, 30 + k]
    return [*ids, 2]


def _wire(request: tensors.TensorMessage[Any]) -> tensors.TensorMessage[Any]:
    return tensors.parse(tensors.serialize(request), type(request.message))


def _same(decoded: np.ndarray[Any, Any], original: np.ndarray[Any, Any]) -> None:
    assert decoded.dtype == original.dtype, (decoded.dtype, original.dtype)
    assert decoded.shape == original.shape
    assert np.ascontiguousarray(decoded).tobytes() == np.ascontiguousarray(original).tobytes()


def _media(family: str, n: int, seed: int = 0) -> PreparedMedia:
    sizes = SIZES[:n] if n > 1 else SIZES[1:2]
    return VisionModel.for_family(family).prepare(_images(seed, sizes))  # type: ignore[arg-type]


def _runs(media: PreparedMedia, ids: np.ndarray[Any, Any], items: Any) -> None:
    """Each item's placeholder is exactly its run of the image token, every position embedded."""
    for i, item in enumerate(items):
        offset, length = item.placeholder
        assert length == media.token_counts[i]
        assert (ids[offset : offset + length] == media.token_id).all()
        assert item.embed_mask is None or bool(item.embed_mask.all())
    assert int((ids == media.token_id).sum()) == sum(media.token_counts)


# -- the tensors -----------------------------------------------------------------------------
def test_phi4_primary_is_image_pixel_values() -> None:
    media = _media("phi4_multimodal", 3)
    assert media.primary_name == "image_pixel_values"
    assert sorted(media.tensors()) == sorted(["image_pixel_values", *SIDE["phi4_multimodal"]])
    assert set(media.layout().values()) == {"batched"}
    out = media.output
    assert out.image_pixel_values is not None
    assert out.image_attention_mask is not None
    assert out.image_sizes is not None
    # global image + crops, padded to the batch's largest: 1 + 2, 1 + 3, 1 + 1 -> 4
    assert out.image_pixel_values.shape == (3, 4, 3, 448, 448)
    assert out.image_attention_mask.shape == (3, 4, 32, 32)
    counts = media.tensors()["num_img_tokens"]
    assert counts.dtype == np.int64
    assert counts.tolist() == list(media.token_counts)
    assert media.primary is out.image_pixel_values
    for i in range(media.count):
        item = media.item_tensors(i)
        _same(item["image_pixel_values"], out.image_pixel_values[i : i + 1])
        _same(item["num_img_tokens"], counts[i : i + 1])


def test_phi3v_tensors() -> None:
    media = _media("phi3_v", 2)
    assert media.primary_name == "pixel_values"
    assert sorted(media.tensors()) == ["image_sizes", "pixel_values"]
    assert media.tensors()["pixel_values"].shape == (2, 17, 3, 336, 336)  # num_crops 16 + 1
    assert set(media.layout().values()) == {"batched"}


# -- every engine's round trip ---------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize(
    ("transport", "dtype"), [("inline", None), ("shm", None), ("shm", "bfloat16")]
)
def test_vllm_round_trip_exact(family: str, n: int, transport: str, dtype: str | None) -> None:
    media = _media(family, n, seed=n)
    primary = PRIMARY[family]
    request = vllm_adapter.generate_request(
        "r",
        _prompt(TOKEN[family], n),
        media,
        transport=transport,  # type: ignore[arg-type]
        dtype=dtype,
        shm_min_bytes=0,
    )
    assert bool(request.shm_segments) == (transport == "shm")
    mm = request.message.mm_inputs
    if primary == "pixel_values":
        assert not mm.HasField("encoder_input_key")
    else:
        assert mm.encoder_input_key == primary
    assert sorted(mm.batched_keys) == sorted([primary, *SIDE[family]])
    assert dict(mm.flat_keys) == {}
    assert list(mm.keep_on_cpu_keys) == []
    assert sorted(mm.model_specific_tensors) == SIDE[family]
    assert mm.im_token_id == TOKEN[family]
    (batch,) = vllm_adapter.decode_mm_inputs(_wire(request))
    assert set(batch.layout.values()) == {"batched"}
    assert sorted(batch.tensors) == sorted([primary, *SIDE[family]])
    ids = np.asarray(request.message.tokenized.input_ids)
    for i, item in enumerate(batch.items):
        for name, original in media.item_tensors(i).items():
            want = original.astype(ml_dtypes.bfloat16) if dtype and name == primary else original
            _same(item.tensors[name], want)
    _runs(media, ids, batch.items)
    assert [p for p in request.shm_segments if os.path.exists(f"/dev/shm/{p}")] == []


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("n", [1, 3])
def test_sglang_round_trip_exact(family: str, n: int) -> None:
    media = _media(family, n, seed=10 + n)
    request = sglang_adapter.generate_request("r", _prompt(TOKEN[family], n), media)
    mm = request.message.mm_inputs
    assert mm.im_token_id == TOKEN[family]
    assert sorted(mm.model_specific_tensors) == SIDE[family]
    (batch,) = sglang_adapter.decode_mm_inputs(_wire(request))
    ids = np.asarray(request.message.tokenized.input_ids)
    for i, item in enumerate(batch.items):
        for name, original in media.item_tensors(i).items():
            # SGLang's encoder input is MultimodalDataItem.feature: pixel_values on the wire
            _same(item.tensors["pixel_values" if name == PRIMARY[family] else name], original)
    _runs(media, ids, batch.items)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize(("transport", "dtype"), [("inline", None), ("shm", "bfloat16")])
def test_tokenspeed_round_trip_exact(
    family: str, n: int, transport: str, dtype: str | None
) -> None:
    media = _media(family, n, seed=20 + n)
    request = ts_adapter.generate_request(
        "r",
        _prompt(TOKEN[family], n),
        media,
        transport=transport,  # type: ignore[arg-type]
        dtype=dtype,
        shm_min_bytes=0,
    )
    items = request.message.mm_inputs.items
    assert [item.placeholder_token_id for item in items] == [TOKEN[family]] * n
    assert all(sorted(item.model_specific_tensors) == SIDE[family] for item in items)
    batches = ts_adapter.decode_mm_inputs(_wire(request))
    ids = np.asarray(request.message.tokenized.input_ids)
    for i, batch in enumerate(batches):
        (item,) = batch.items
        for name, original in media.item_tensors(i).items():
            if name == PRIMARY[family]:
                want = original.astype(ml_dtypes.bfloat16) if dtype else original
                _same(item.tensors["pixel_values"], want)  # TokenSpeed's encoder_input
            else:
                _same(item.tensors[name], original)
        offset, length = item.placeholder
        assert length == media.token_counts[i]
        assert (ids[offset : offset + length] == TOKEN[family]).all()
    assert [p for p in request.shm_segments if os.path.exists(f"/dev/shm/{p}")] == []


@pytest.mark.parametrize("family", FAMILIES)
def test_fill_mm_inputs_finds_the_runs(family: str) -> None:
    media = _media(family, 3, seed=5)
    ids, ranges = expand_placeholders(_prompt(TOKEN[family], 3), [media])
    assert placeholder_ranges(ids, [media]) == ranges
    built = tensors.TensorMessage(vllm_adapter.pb.GenerateRequest(request_id="r"))
    built.message.tokenized.input_ids.extend(ids.tolist())
    vllm_adapter.fill_mm_inputs(built, media)
    want = vllm_adapter.generate_request("r", _prompt(TOKEN[family], 3), media)
    assert tensors.serialize(built) == tensors.serialize(want)


def test_vllm_decode_side_without_pixels_names_the_primary() -> None:
    media = _media("phi4_multimodal", 1, seed=6)
    request = vllm_adapter.generate_request(
        "r", _prompt(PHI4_IMAGE, 1), media, pixels=False, kv_transfer_params={"k": 1}
    )
    mm = request.message.mm_inputs
    assert not mm.HasField("pixel_values")
    assert "image_pixel_values" not in mm.batched_keys
    (batch,) = vllm_adapter.decode_mm_inputs(_wire(request))
    assert not batch.pixels
    assert sorted(batch.tensors) == SIDE["phi4_multimodal"]


# -- the expanded prompt: Phi4MultimodalProcessor's, and vLLM's Phi-3-V rule ------------------
def _tokenizer(special: dict[str, int], extra: dict[str, str]) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "describe": 1, "and": 2, "compare": 3, **special}
    backend = Tokenizer(models.WordLevel(vocab, "<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", extra_special_tokens=extra
    )


def _phi4_processor(outputs: dict[str, Any]) -> Any:
    """transformers' Phi4MultimodalProcessor with its real audio feature extractor; its image
    processor (torchvision-only) hands back our processor's outputs, whose bit-exactness
    tests/vision covers."""
    from transformers import BatchFeature
    from transformers.image_processing_utils import BaseImageProcessor
    from transformers.models.phi4_multimodal.feature_extraction_phi4_multimodal import (
        Phi4MultimodalFeatureExtractor,
    )
    from transformers.models.phi4_multimodal.processing_phi4_multimodal import (
        Phi4MultimodalProcessor,
    )

    class Outputs(BaseImageProcessor):  # type: ignore[misc]
        model_input_names: ClassVar[list[str]] = ["image_pixel_values"]

        def __call__(self, images: Any, **kwargs: Any) -> Any:
            return BatchFeature(outputs)

        preprocess = __call__

    tokenizer = _tokenizer(
        {"<|image|>": PHI4_IMAGE, "<|audio|>": PHI4_AUDIO},
        {"image_token": "<|image|>", "audio_token": "<|audio|>"},
    )
    assert (tokenizer.image_token_id, tokenizer.audio_token_id) == (PHI4_IMAGE, PHI4_AUDIO)
    return Phi4MultimodalProcessor(
        image_processor=Outputs(),
        audio_processor=Phi4MultimodalFeatureExtractor(),
        tokenizer=tokenizer,
    )


@pytest.mark.parametrize(
    "sizes",
    [[(448, 448)], [(900, 400)], [(120, 700)], [(300, 500), (900, 400), (448, 448)]],
    ids=["1-crop", "portrait", "thin", "3-images"],
)
def test_input_ids_equal_phi4_multimodal_processor(sizes: list[tuple[int, int]]) -> None:
    media = VisionModel.for_family("phi4_multimodal").prepare(_images(7, sizes))
    out = media.output
    text = "describe " + " and ".join(["<|image|>"] * len(sizes)) + " compare"
    processor = _phi4_processor(
        {
            "image_pixel_values": out.image_pixel_values,
            "image_sizes": out.image_sizes,
            "image_attention_mask": out.image_attention_mask,
            "num_img_tokens": media.tensors()["num_img_tokens"].tolist(),
        }
    )
    images = [Image.new("RGB", (w, h)) for h, w in sizes]
    want = processor(text=text, images=images)
    prompt = processor.tokenizer(text)["input_ids"]
    ids, ranges = expand_placeholders(prompt, [media])
    assert ids.tolist() == list(want["input_ids"][0])
    assert [length for _, length in ranges[0]] == list(media.token_counts)
    assert "num_img_tokens" not in want  # the processor drops it; vLLM takes it back


def _phi3v_tokens(height: int, width: int, num_crops: int = 16) -> int:
    """vLLM's Phi-3-V count, ``Phi3VImageProcessor.calc_num_image_tokens_from_image_size``
    (hub remote code of microsoft/Phi-3-vision-128k-instruct): the HD size of the original
    size, then ``(h // 336 * w // 336 + 1) * 144 + 1 + (h // 336 + 1) * 12``."""
    w, h = (height, width) if width < height else (width, height)
    ratio = w / h
    scale = 1
    while scale * math.ceil(scale / ratio) <= num_crops:
        scale += 1
    scale -= 1
    new_w = int(scale * 336)
    new_h = math.ceil(int(new_w / ratio) / 336) * 336
    if width < height:
        new_w, new_h = new_h, new_w
    return int((new_h // 336 * new_w // 336 + 1) * 144 + 1 + (new_h // 336 + 1) * 12)


@pytest.mark.parametrize(
    "sizes",
    [[(336, 336)], [(900, 400)], [(120, 700)], [(300, 500), (1000, 1000), (50, 1200)]],
    ids=["square", "portrait", "thin", "3-images"],
)
def test_input_ids_follow_vllm_phi3v_rule(sizes: list[tuple[int, int]]) -> None:
    media = VisionModel.for_family("phi3_v").prepare(_images(8, sizes))
    prompt = _prompt(PHI3V_IMAGE, len(sizes))
    ids, _ = expand_placeholders(prompt, [media])
    want: list[int] = []
    counts = iter(_phi3v_tokens(h, w) for h, w in sizes)
    for token in prompt:
        want += [PHI3V_IMAGE] * next(counts) if token == PHI3V_IMAGE else [token]
    assert ids.tolist() == want
    # the count is the image processor's num_img_tokens of the HD size it reports
    sizes_out = media.output.image_sizes
    assert sizes_out is not None
    for (h, w), count in zip(sizes_out.tolist(), media.token_counts, strict=True):
        assert count == ((h // 336) * (w // 336) + 1) * 144 + 1 + (h // 336 + 1) * 12


# -- every family's published ids ------------------------------------------------------------
# The run-of-one-token families (the others take theirs from the Rust family's
# replacement_spec defaults).
PUBLISHED = {
    "qwen2_vl": (151655, 151656),
    "qwen2_5_vl": (151655, 151656),
    "qwen3_vl": (151655, 151656),
    "qwen3_5": (248056, 248057),
    "clip": (32000, None),
    "llava": (32000, None),
    "llava_next": (32000, None),
    "siglip": (257152, None),
    "phi4_multimodal": (200010, None),
    "phi3_v": (32044, None),
}


@pytest.mark.parametrize(
    "family",
    [
        f[0]
        for f in _native.families()
        if f[0] not in CROSS_ATTENTION and f[0] not in ENGINE_LAYOUTS
    ],
)
def test_for_family_prepares_and_builds_a_vllm_request(family: str) -> None:
    # (a cross-attention family, or one vLLM's models do not read, is refused by the builder:
    # test_every_family.py)
    model = VisionModel.for_family(family)  # type: ignore[arg-type]
    if family in PUBLISHED:
        assert (model.image_token_id, model.video_token_id) == PUBLISHED[family]
    media = model.prepare(_images(9, [(224, 224), (300, 500)]))
    assert media.count == 2
    assert all(c > 0 for c in media.token_counts)
    request = vllm_adapter.generate_request("r", _prompt(media.anchor, 2), media)
    (batch,) = vllm_adapter.decode_mm_inputs(_wire(request))
    ids = np.asarray(request.message.tokenized.input_ids)
    for i, item in enumerate(batch.items):
        mask = item.embed_mask
        embedded = length = item.placeholder[1]
        if mask is not None:
            embedded = int(mask.sum())
            assert mask.shape == (length,)
        assert embedded == media.token_counts[i]
        offset = item.placeholder[0]
        assert int((ids[offset : offset + length] == media.token_id).sum()) == embedded


def test_tower_defaults_count_like_their_vlm() -> None:
    # CLIP as LLaVA-1.5's tower: 336 px -> 24 x 24 patches, the CLS dropped
    clip = VisionModel.for_family("clip", config={"size": {"shortest_edge": 336}, "crop_size": 336})
    assert clip.prepare(_images(1, [(400, 500)])).token_counts == (576,)
    # SigLIP as PaliGemma-3b-pt-224's tower: 16 x 16 patches, every one a token
    siglip = VisionModel.for_family("siglip")
    assert siglip.prepare(_images(1, [(400, 500)])).token_counts == (256,)
