"""Llama 4 through the engine builders: tiles mapped to items, ``<|image|>`` expanded exactly as
transformers' ``Llama4Processor`` writes it, and every engine's round trip byte-exact."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar

import ml_dtypes
import numpy as np
import pytest
from PIL import Image

from smg_grpc_proto import tensors
from smg_grpc_proto.engines import PreparedMedia, VisionModel, expand_placeholders
from smg_grpc_proto.engines import sglang as sglang_adapter
from smg_grpc_proto.engines import tokenspeed as ts_adapter
from smg_grpc_proto.engines import vllm as vllm_adapter
from smg_grpc_proto.engines._media import placeholder_ranges
from smg_grpc_proto.errors import PlaceholderError, ProcessorConfigError

# Llama 4 Scout/Maverick's vision special tokens (LLAMA4_VISION_SPECIAL_TOKENS from 200080).
SPECIAL = {
    "<|image_start|>": 200080,
    "<|image_end|>": 200081,
    "<|tile_x_separator|>": 200084,
    "<|tile_y_separator|>": 200085,
    "<|image|>": 200090,
    "<|patch|>": 200092,
}
IMAGE, PATCH = SPECIAL["<|image|>"], SPECIAL["<|patch|>"]
# 1 tile; 2 x 3 tiles + global; 4 x 4 tiles + global (max_patches 16); 1 x 2 + global.
SIZES = [(300, 300), (672, 1008), (1344, 1344), (336, 672)]


def _images(seed: int, sizes: list[tuple[int, int]]) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]


def _prompt(n: int) -> list[int]:
    ids = [200000, 17]
    for k in range(n):
        ids += [IMAGE, 30 + k]
    return [*ids, 200008]


def _wire(request: tensors.TensorMessage[Any]) -> tensors.TensorMessage[Any]:
    return tensors.parse(tensors.serialize(request), type(request.message))


def _same(decoded: np.ndarray[Any, Any], original: np.ndarray[Any, Any]) -> None:
    assert decoded.dtype == original.dtype, (decoded.dtype, original.dtype)
    assert decoded.shape == original.shape
    assert np.ascontiguousarray(decoded).tobytes() == np.ascontiguousarray(original).tobytes()


def _media(sizes: list[tuple[int, int]], seed: int = 0) -> PreparedMedia:
    return VisionModel.for_family("llama4").prepare(_images(seed, sizes))


def _tiles(media: PreparedMedia) -> list[int]:
    ratios = media.output.aspect_ratios
    assert ratios is not None
    return [h * w + (h * w > 1) for h, w in ratios.tolist()]


def _check_items(
    media: PreparedMedia, ids: np.ndarray[Any, Any], items: Any, *, dtype: Any = None
) -> None:
    for i, item in enumerate(items):
        for name, original in media.item_tensors(i).items():
            want = (
                original.astype(dtype) if dtype is not None and name == "pixel_values" else original
            )
            _same(item.tensors[name], want)
        assert item.tensors["pixel_values"].shape[0] == _tiles(media)[i]
        offset, length = item.placeholder
        tokens, embed = media.replacements[i]
        assert (ids[offset : offset + length] == tokens).all()
        # the mask is exactly the <|patch|> positions (vLLM's is_embed for Llama 4)
        assert item.embed_mask is not None
        assert (item.embed_mask == embed).all()
        assert (item.embed_mask == (tokens == PATCH)).all()
        assert int(item.embed_mask.sum()) == media.token_counts[i] == 144 * _tiles(media)[i]


# -- items vs tiles --------------------------------------------------------------------------
def test_tiles_map_to_items() -> None:
    media = _media(SIZES)
    assert media.output.aspect_ratios is not None
    assert media.output.aspect_ratios.tolist() == [[1, 1], [2, 3], [4, 4], [1, 2]]
    assert media.item_rows == (1, 7, 17, 3) == tuple(_tiles(media))
    assert media.layout() == {
        "pixel_values": "flat",
        "aspect_ratios": "batched",
        "patches_per_image": "batched",
    }
    assert media.tensors()["patches_per_image"].tolist() == [1, 7, 17, 3]
    pixels = media.tensors()["pixel_values"]
    starts = np.cumsum([0, *media.item_rows])
    for i in range(media.count):
        _same(media.item_tensors(i)["pixel_values"], pixels[starts[i] : starts[i + 1]])
    assert media.token_counts == (144, 7 * 144, 17 * 144, 3 * 144)
    assert (media.anchor, media.token_id) == (IMAGE, PATCH)


# -- (a) every engine's round trip -----------------------------------------------------------
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize(
    ("transport", "dtype"), [("inline", None), ("shm", None), ("shm", "bfloat16")]
)
def test_vllm_round_trip_exact(n: int, transport: str, dtype: str | None) -> None:
    media = _media(SIZES[1 : 1 + n] if n == 1 else SIZES[:3], seed=n)
    request = vllm_adapter.generate_request(
        "r",
        _prompt(n),
        media,
        transport=transport,
        dtype=dtype,
        shm_min_bytes=0,  # type: ignore[arg-type]
    )
    assert bool(request.shm_segments) == (transport == "shm")
    mm = request.message.mm_inputs
    assert dict(mm.flat_keys) == {"pixel_values": "patches_per_image"}
    assert sorted(mm.batched_keys) == ["aspect_ratios", "patches_per_image"]
    assert mm.im_token_id == PATCH
    (batch,) = vllm_adapter.decode_mm_inputs(_wire(request))
    ids = np.asarray(request.message.tokenized.input_ids)
    assert batch.layout["pixel_values"] == "flat"
    assert batch.sizes["pixel_values"] == media.item_rows
    _check_items(media, ids, batch.items, dtype=ml_dtypes.bfloat16 if dtype else None)
    assert [s for s in request.shm_segments if os.path.exists(f"/dev/shm/{s}")] == []


@pytest.mark.parametrize("n", [1, 3])
def test_sglang_round_trip_exact(n: int) -> None:
    media = _media(SIZES[2:3] if n == 1 else SIZES[1:], seed=10 + n)
    request = sglang_adapter.generate_request("r", _prompt(n), media)
    mm = request.message.mm_inputs
    assert mm.im_token_id == PATCH
    assert sorted(mm.model_specific_tensors) == ["aspect_ratios", "patches_per_image"]
    (batch,) = sglang_adapter.decode_mm_inputs(_wire(request))
    assert batch.layout["pixel_values"] == "flat"
    _check_items(media, np.asarray(request.message.tokenized.input_ids), batch.items)


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize(("transport", "dtype"), [("inline", None), ("shm", "bfloat16")])
def test_tokenspeed_round_trip_exact(n: int, transport: str, dtype: str | None) -> None:
    media = _media(SIZES[:1] if n == 1 else [SIZES[3], SIZES[0], SIZES[1]], seed=20 + n)
    request = ts_adapter.generate_request(
        "r",
        _prompt(n),
        media,
        transport=transport,
        dtype=dtype,
        shm_min_bytes=0,  # type: ignore[arg-type]
    )
    items = request.message.mm_inputs.items
    assert [item.placeholder_token_id for item in items] == [PATCH] * n
    batches = ts_adapter.decode_mm_inputs(_wire(request))
    ids = np.asarray(request.message.tokenized.input_ids)
    decoded = [b.items[0] for b in batches]
    for i, item in enumerate(decoded):
        # each TokenSpeed item is its own batch: compare with the media's item i
        one = type(item)(i, item.modality, item.tensors, item.placeholders, item.embed_mask, None)
        want_dtype = ml_dtypes.bfloat16 if dtype else None
        pixels = media.item_tensors(i)["pixel_values"]
        _same(one.tensors["pixel_values"], pixels.astype(want_dtype) if want_dtype else pixels)
        _same(one.tensors["aspect_ratios"], media.item_tensors(i)["aspect_ratios"])
        _same(one.tensors["patches_per_image"], media.item_tensors(i)["patches_per_image"])
        offset, length = one.placeholder
        tokens, embed = media.replacements[i]
        assert (ids[offset : offset + length] == tokens).all()
        assert one.embed_mask is not None
        assert (one.embed_mask == embed).all()
    assert [s for s in request.shm_segments if os.path.exists(f"/dev/shm/{s}")] == []


def test_fill_mm_inputs_finds_the_replacements() -> None:
    media = _media(SIZES[:3], seed=5)
    ids, ranges = expand_placeholders(_prompt(3), [media])
    assert placeholder_ranges(ids, [media]) == ranges
    request = vllm_adapter.generate_request("r", _prompt(3), media)
    built = tensors.TensorMessage(type(request.message)(request_id="r"))
    built.message.tokenized.input_ids.extend(ids.tolist())
    vllm_adapter.fill_mm_inputs(built, media)
    got, want = built.message.mm_inputs, request.message.mm_inputs
    assert list(got.mm_placeholders) == list(want.mm_placeholders)
    assert list(got.batched_keys) == list(want.batched_keys)
    assert dict(got.flat_keys) == dict(want.flat_keys)
    (batch,) = vllm_adapter.decode_mm_inputs(_wire(built))
    _check_items(media, ids, batch.items)
    broken = ids.copy()
    broken[ranges[0][1][0] + 2] = 17  # a patch of the second image
    with pytest.raises(PlaceholderError, match="item 1: its 1017-token replacement"):
        placeholder_ranges(broken, [media])


# -- (b) the expanded prompt is Llama4Processor's ---------------------------------------------
def _tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "describe": 1, "and": 2, "compare": 3, **SPECIAL}
    backend = Tokenizer(models.WordLevel(vocab, "<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", additional_special_tokens=list(SPECIAL)
    )


def _llama4_processor(outputs: dict[str, Any]) -> Any:
    """transformers' Llama4Processor; its image processor (torchvision-only) hands back our
    processor's outputs, whose bit-exactness tests/vision covers."""
    from transformers import BatchFeature
    from transformers.image_processing_utils import BaseImageProcessor
    from transformers.models.llama4.processing_llama4 import Llama4Processor

    class Outputs(BaseImageProcessor):  # type: ignore[misc]
        model_input_names: ClassVar[list[str]] = ["pixel_values"]

        def __call__(self, images: Any, **kwargs: Any) -> Any:
            return BatchFeature(outputs)

        preprocess = __call__

    return Llama4Processor(image_processor=Outputs(), tokenizer=_tokenizer())


@pytest.mark.parametrize(
    "sizes",
    [[(300, 300)], [(1344, 1344)], [(672, 1008)], [(336, 672), (300, 300), (1344, 1344)]],
    ids=["1-tile", "16-tiles", "2x3-tiles", "3-images"],
)
def test_input_ids_equal_llama4_processor(sizes: list[tuple[int, int]]) -> None:
    media = _media(sizes, seed=7)
    out = media.output
    assert out.pixel_values is not None
    assert out.aspect_ratios is not None
    text = "describe " + " and ".join(["<|image|>"] * len(sizes)) + " compare"
    processor = _llama4_processor(
        {"pixel_values": np.asarray(out.pixel_values), "aspect_ratios": out.aspect_ratios}
    )
    images = [Image.new("RGB", (w, h)) for h, w in sizes]
    want = processor(text=text, images=images)["input_ids"][0]
    prompt = _tokenizer()(text)["input_ids"]
    ids, ranges = expand_placeholders(prompt, [media])
    assert ids.tolist() == list(want)
    for (offset, length), (tokens, _) in zip(ranges[0], media.replacements, strict=True):
        assert ids[offset] == SPECIAL["<|image_start|>"]
        assert ids[offset + length - 1] == SPECIAL["<|image_end|>"]
        assert length == tokens.shape[0]


# -- (3) token ids ---------------------------------------------------------------------------
def test_for_family_uses_the_published_ids() -> None:
    model = VisionModel.for_family("llama4")
    assert model.image_token_id == PATCH
    assert dict(model.token_ids) == SPECIAL
    other = VisionModel.for_family("llama4", token_ids={"<|image|>": 5}, image_token_id=6)
    assert other.token_ids["<|image|>"] == 5
    assert other.token_ids["<|patch|>"] == 6
    media = other.prepare(_images(1, [(300, 300)]))
    assert (media.anchor, media.token_id) == (5, 6)
    ids, _ = expand_placeholders([5], [media])
    assert ids.tolist() == [200080, 5, *[6] * 144, 200081]


def test_from_pretrained_reads_token_ids(tmp_path: Path) -> None:
    ids = {name: 1000 + k for k, name in enumerate(SPECIAL)}
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({"image_processor_type": "Llama4ImageProcessorFast", "max_patches": 4})
    )
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llama4", "image_token_index": ids["<|patch|>"]})
    )
    half = list(ids)[:3]
    (tmp_path / "tokenizer.json").write_text(
        json.dumps({"added_tokens": [{"id": ids[n], "content": n} for n in half]})
    )
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "added_tokens_decoder": {
                    str(ids[n]): {"content": n, "special": True} for n in list(ids)[3:]
                }
            }
        )
    )
    model = VisionModel.from_pretrained(tmp_path)
    assert dict(model.token_ids) == ids
    assert (model.image_token_id, model.model_type) == (ids["<|patch|>"], "llama4")
    media = model.prepare(_images(2, [(672, 1008)]))
    expanded, _ = expand_placeholders([ids["<|image|>"]], [media])
    assert expanded[0] == ids["<|image_start|>"]
    assert expanded[-1] == ids["<|image_end|>"]
    assert ids["<|tile_x_separator|>"] in expanded.tolist()
    # no tokenizer files: Scout/Maverick's ids
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "tokenizer_config.json").unlink()
    fallback = VisionModel.from_pretrained(tmp_path)
    assert fallback.token_ids["<|image_start|>"] == 200080
    assert fallback.image_token_id == ids["<|patch|>"]


def test_anchor_count_and_missing_ids() -> None:
    media = _media([(300, 300), (300, 300)])
    with pytest.raises(PlaceholderError, match=r"hold 1 image anchor token\(s\) \(200090\)"):
        expand_placeholders(_prompt(1), [media])
    native = VisionModel.for_family("llama4").processor._native
    with pytest.raises(ProcessorConfigError, match=r"<\|image_start\|>"):
        native.prompt_replacement([1, 1], [])
    with pytest.raises(ProcessorConfigError, match="aspect_ratios"):
        native.prompt_replacement([0, 3], sorted(SPECIAL.items()))
    assert VisionModel.for_family("qwen2_vl").processor._native.replacement_spec() is None
