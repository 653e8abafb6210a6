"""MiniMax-M3-VL through the engine builders: each ``]<]image[>[`` becomes ``]<]start of
image[>[``, n times ``]<]image[>[``, ``]<]end of image[>[`` exactly as transformers'
``MiniMaxM3VLProcessor`` writes it, only the image tokens take embeddings, ``pixel_values``
travels flat (rows per image from ``image_grid_thw``, vLLM's ``flat_from_sizes``), and every
engine's round trip is byte-exact."""

from __future__ import annotations

import os
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
from smg_grpc_proto.errors import ProcessorConfigError

# The published MiniMax-M3 tokenizer's vision tokens (MiniMaxM3VLConfig.image_token_index 200025).
SPECIAL = {
    "]<]image[>[": 200025,
    "]<]video[>[": 200026,
    "]<]start of image[>[": 200029,
    "]<]end of image[>[": 200030,
}
IMAGE, START, END = (
    SPECIAL[k] for k in ("]<]image[>[", "]<]start of image[>[", "]<]end of image[>[")
)
SIZES = [(300, 500), (56, 56), (1080, 720), (29, 1000)]


def _images(seed: int, sizes: list[tuple[int, int]]) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]


def _media(sizes: list[tuple[int, int]], seed: int = 0) -> PreparedMedia:
    return VisionModel.for_family("minimax_m3_vl").prepare(_images(seed, sizes))


def _prompt(n: int) -> list[int]:
    ids = [200034, 17]
    for k in range(n):
        ids += [IMAGE, 30 + k]
    return [*ids, 200020]


def _wire(request: tensors.TensorMessage[Any]) -> tensors.TensorMessage[Any]:
    return tensors.parse(tensors.serialize(request), type(request.message))


def _same(decoded: np.ndarray[Any, Any], original: np.ndarray[Any, Any]) -> None:
    assert decoded.dtype == original.dtype, (decoded.dtype, original.dtype)
    assert decoded.shape == original.shape
    assert np.ascontiguousarray(decoded).tobytes() == np.ascontiguousarray(original).tobytes()


def _rows(media: PreparedMedia) -> list[int]:
    grid = media.output.image_grid_thw
    assert grid is not None
    return [int(t * h * w) for t, h, w in grid.tolist()]


def _check_items(
    media: PreparedMedia, ids: np.ndarray[Any, Any], items: Any, *, dtype: Any = None
) -> None:
    for i, item in enumerate(items):
        for name, original in media.item_tensors(i).items():
            want = (
                original.astype(dtype) if dtype is not None and name == "pixel_values" else original
            )
            _same(item.tensors[name], want)
        assert item.tensors["pixel_values"].shape[0] == _rows(media)[i]
        offset, length = item.placeholder
        tokens, embed = media.replacements[i]
        assert (ids[offset : offset + length] == tokens).all()
        assert tokens[0] == START
        assert tokens[-1] == END
        assert item.embed_mask is not None
        assert (item.embed_mask == embed).all()
        assert (item.embed_mask == (tokens == IMAGE)).all()
        assert int(item.embed_mask.sum()) == media.token_counts[i] == _rows(media)[i] // 4


def test_layout_and_counts() -> None:
    media = _media(SIZES)
    assert media.layout() == {"pixel_values": "flat", "image_grid_thw": "batched"}
    assert media.flat_sizes() == tuple(_rows(media))
    assert (media.anchor, media.token_id) == (IMAGE, IMAGE)
    assert media.token_counts == tuple(r // 4 for r in _rows(media))
    for (tokens, embed), n in zip(media.replacements, media.token_counts, strict=True):
        assert tokens.tolist() == [START, *[IMAGE] * n, END]
        assert embed.tolist() == [False, *[True] * n, False]


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize(
    ("transport", "dtype"), [("inline", None), ("shm", None), ("shm", "bfloat16")]
)
def test_vllm_round_trip_exact(n: int, transport: str, dtype: str | None) -> None:
    media = _media(SIZES[:1] if n == 1 else SIZES[1:], seed=n)
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
    # vLLM's MiniMax-M3 processor: pixel_values flat_from_sizes(image_grid_thw.prod(-1)),
    # image_grid_thw batched; the sizes travel as patches_per_image (as for Qwen, and as the
    # SMG gateway's minimax_m3 spec lays them out).
    assert dict(mm.flat_keys) == {"pixel_values": "patches_per_image"}
    assert sorted(mm.batched_keys) == ["image_grid_thw", "patches_per_image"]
    assert mm.im_token_id == IMAGE
    (batch,) = vllm_adapter.decode_mm_inputs(_wire(request))
    ids = np.asarray(request.message.tokenized.input_ids)
    assert batch.layout["pixel_values"] == "flat"
    assert batch.sizes["pixel_values"] == tuple(_rows(media))
    _check_items(media, ids, batch.items, dtype=ml_dtypes.bfloat16 if dtype else None)
    assert [s for s in request.shm_segments if os.path.exists(f"/dev/shm/{s}")] == []


@pytest.mark.parametrize("n", [1, 3])
def test_sglang_round_trip_exact(n: int) -> None:
    media = _media(SIZES[2:3] if n == 1 else SIZES[:3], seed=10 + n)
    request = sglang_adapter.generate_request("r", _prompt(n), media)
    mm = request.message.mm_inputs
    assert mm.im_token_id == IMAGE
    (batch,) = sglang_adapter.decode_mm_inputs(_wire(request))
    assert batch.layout["pixel_values"] == "flat"
    _check_items(media, np.asarray(request.message.tokenized.input_ids), batch.items)


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize(("transport", "dtype"), [("inline", None), ("shm", "bfloat16")])
def test_tokenspeed_round_trip_exact(n: int, transport: str, dtype: str | None) -> None:
    media = _media(SIZES[3:] if n == 1 else SIZES[:3], seed=20 + n)
    request = ts_adapter.generate_request(
        "r",
        _prompt(n),
        media,
        transport=transport,
        dtype=dtype,
        shm_min_bytes=0,  # type: ignore[arg-type]
    )
    items = request.message.mm_inputs.items
    assert [item.placeholder_token_id for item in items] == [IMAGE] * n
    batches = ts_adapter.decode_mm_inputs(_wire(request))
    ids = np.asarray(request.message.tokenized.input_ids)
    for i, batch in enumerate(batches):
        item = batch.items[0]
        pixels = media.item_tensors(i)["pixel_values"]
        _same(item.tensors["pixel_values"], pixels.astype(ml_dtypes.bfloat16) if dtype else pixels)
        _same(item.tensors["image_grid_thw"], media.item_tensors(i)["image_grid_thw"])
        offset, length = item.placeholder
        tokens, embed = media.replacements[i]
        assert (ids[offset : offset + length] == tokens).all()
        assert item.embed_mask is not None
        assert (item.embed_mask == embed).all()
    assert [s for s in request.shm_segments if os.path.exists(f"/dev/shm/{s}")] == []


# -- the expanded prompt is MiniMaxM3VLProcessor's --------------------------------------------
def _tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "describe": 1, "and": 2, "compare": 3, **SPECIAL}
    backend = Tokenizer(models.WordLevel(vocab, "<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", additional_special_tokens=list(SPECIAL)
    )


@pytest.fixture
def _no_video_processor(monkeypatch: pytest.MonkeyPatch) -> None:
    """MiniMaxM3VLProcessor also takes a video processor, whose class needs torchvision (absent
    here); images need none, so the class check accepts ``video_processor=None``."""
    from transformers import processing_utils

    check = processing_utils.ProcessorMixin.check_argument_for_proper_class

    def lenient(self: Any, name: str, argument: Any) -> Any:
        if argument is None and name == "video_processor":
            return type(None)
        return check(self, name, argument)

    monkeypatch.setattr(processing_utils.ProcessorMixin, "check_argument_for_proper_class", lenient)


def _minimax_processor(outputs: dict[str, Any]) -> Any:
    """transformers' MiniMaxM3VLProcessor; its image processor (torchvision-only) hands back our
    processor's outputs, whose bit-exactness the torch goldens cover."""
    from transformers import BatchFeature
    from transformers.image_processing_utils import BaseImageProcessor
    from transformers.models.minimax_m3_vl.processing_minimax_m3_vl import MiniMaxM3VLProcessor

    class Outputs(BaseImageProcessor):  # type: ignore[misc]
        model_input_names: ClassVar[list[str]] = ["pixel_values", "image_grid_thw"]
        merge_size = 2

        def __call__(self, images: Any, **kwargs: Any) -> Any:
            return BatchFeature(outputs)

        preprocess = __call__

    return MiniMaxM3VLProcessor(
        image_processor=Outputs(), tokenizer=_tokenizer(), video_processor=None
    )


@pytest.mark.usefixtures("_no_video_processor")
@pytest.mark.parametrize(
    "sizes", [[(300, 500)], [(56, 56)], SIZES], ids=["1-image", "tiny", "4-images"]
)
def test_input_ids_equal_minimax_processor(sizes: list[tuple[int, int]]) -> None:
    media = _media(sizes, seed=7)
    out = media.output
    assert out.pixel_values is not None
    assert out.image_grid_thw is not None
    text = "describe " + " and ".join(["]<]image[>["] * len(sizes)) + " compare"
    processor = _minimax_processor(
        {"pixel_values": np.asarray(out.pixel_values), "image_grid_thw": out.image_grid_thw}
    )
    images = [Image.new("RGB", (w, h)) for h, w in sizes]
    want = processor(text=text, images=images)["input_ids"][0]
    prompt = _tokenizer()(text)["input_ids"]
    ids, ranges = expand_placeholders(prompt, [media])
    assert ids.tolist() == list(want)
    for (offset, length), (tokens, _) in zip(ranges[0], media.replacements, strict=True):
        assert ids[offset] == START
        assert ids[offset + length - 1] == END
        assert length == tokens.shape[0]


def test_published_ids_and_videos_refused() -> None:
    model = VisionModel.for_family("minimax_m3_vl")
    assert model.image_token_id == IMAGE
    assert model.video_token_id is None
    with pytest.raises(ProcessorConfigError, match="MiniMaxM3VLVideoProcessor"):
        model.processor(videos=[_images(0, [(56, 56), (56, 56)])])
