"""GLM videos through every engine: ``VisionModel.prepare(videos=..., video_metadata=...)`` →
builder → ``tensors.serialize`` → ``tensors.parse`` → ``decode_mm_inputs`` gives back every
video's ``pixel_values_videos`` rows and ``video_grid_thw`` byte for byte (vLLM inline, shared
memory, shared memory as bfloat16; TokenSpeed inline and shared memory), next to an image in
the same prompt; each video's placeholder range covers its whole replacement (the frame groups
with their timestamp text) and the embed mask is exactly its ``<|image|>`` positions. SGLang's
contract carries no video, and its builder says so. The tokens themselves are checked against
transformers' processors in ``tests/vision/test_glm_video.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from smg_grpc_proto import tensors
from smg_grpc_proto.engines import PreparedMedia, VisionModel, expand_placeholders
from smg_grpc_proto.engines import sglang as sglang_adapter
from smg_grpc_proto.engines import tokenspeed as ts_adapter
from smg_grpc_proto.engines import vllm as vllm_adapter
from smg_grpc_proto.errors import MultimodalError
from smg_grpc_proto.generated import common_pb2

FAMILIES = ["glm4v", "glm46v", "glm5_next"]
# a text piece per timestamp text the clips below produce, so no tokenizer is needed here
PIECES = {
    "0": 15,
    "1": 16,
    "2": 17,
    "0.0 seconds": (15, 13, 15, 6235),
    "0.1 seconds": (15, 13, 16, 6235),
    "1.0 seconds": (16, 13, 15, 6235),
}


def _clips(seed: int) -> list[list[np.ndarray[Any, Any]]]:
    rng = np.random.default_rng(seed)
    shapes = [(3, 90, 120), (4, 200, 150)]
    return [list(rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)) for n, h, w in shapes]


def _prepared(family: str) -> tuple[VisionModel, PreparedMedia, PreparedMedia]:
    model = VisionModel.for_family(family, token_ids=PIECES)  # type: ignore[arg-type]
    image = model.prepare([np.full((120, 160, 3), 7, dtype=np.uint8)])
    meta = [{"fps": 2.0, "frames_indices": [0, 1, 2]}, {"fps": 2.0, "frames_indices": [0, 1, 2, 3]}]
    video = model.prepare(videos=_clips(1), video_metadata=meta)
    return model, image, video


def _prompt(model: VisionModel) -> list[int]:
    ids = model.token_ids
    boi, eoi = ids["<|begin_of_image|>"], ids["<|end_of_image|>"]
    video = model.video_token_id
    assert isinstance(boi, int)
    assert isinstance(eoi, int)
    assert video is not None
    return [1, boi, model.image_token_id, eoi, 9, 8, video, 7, 8, video, 7, 2]


def _wire(request: tensors.TensorMessage[Any]) -> tensors.TensorMessage[Any]:
    return tensors.parse(tensors.serialize(request), type(request.message))


def _check_video(
    video: PreparedMedia, batch: Any, ids: np.ndarray[Any, Any], dtype: Any = None
) -> None:
    for i, item in enumerate(batch.items):
        want = video.item_tensors(i)
        pixels = want.pop("pixel_values_videos")
        if dtype is not None:
            pixels = pixels.astype(dtype)
        got = dict(item.tensors)
        primary = got.pop("pixel_values_videos", None)
        if primary is None:
            primary = got.pop("pixel_values")
        assert primary.dtype == pixels.dtype
        assert primary.tobytes() == pixels.tobytes()
        for name, array in want.items():
            if name in got:
                assert got[name].tobytes() == np.asarray(array).tobytes(), name
        assert np.asarray(got["video_grid_thw"]).reshape(-1).tolist() == (
            np.asarray(video.output.video_grid_thw)[i].tolist()
        )
        offset, length = item.placeholder
        tokens, embed = video.replacements[i]
        assert length == tokens.shape[0]
        assert (ids[offset : offset + length] == tokens).all()
        assert (np.asarray(item.embed_mask) == embed).all()
        assert int(embed.sum()) == video.token_counts[i]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    ("transport", "dtype"), [("inline", None), ("shm", None), ("shm", "bfloat16")]
)
def test_vllm_round_trip(family: str, transport: str, dtype: str | None) -> None:
    model, image, video = _prepared(family)
    assert video.modality == "video"
    assert video.anchor == model.video_token_id
    assert video.token_id == model.image_token_id  # the frames' embeddings: the <|image|> runs
    request = vllm_adapter.generate_request(
        "r",
        _prompt(model),
        [image, video],
        transport=transport,  # type: ignore[arg-type]
        dtype=dtype,
        shm_min_bytes=0,
    )
    extra = request.message.extra_mm_inputs[0]
    assert extra.modality == common_pb2.VIDEO
    assert extra.im_token_id == model.image_token_id
    first, second = vllm_adapter.decode_mm_inputs(_wire(request))
    ids = np.asarray(request.message.tokenized.input_ids)
    want_ids, _ = expand_placeholders(_prompt(model), [image, video])
    assert ids.tolist() == want_ids.tolist()
    assert (
        first.items[0].tensors["pixel_values"].tobytes()
        == (
            np.asarray(image.output.pixel_values).astype(
                ml_dtypes.bfloat16 if dtype else np.float32
            )
        ).tobytes()
    )
    _check_video(video, second, ids, ml_dtypes.bfloat16 if dtype else None)
    assert [s for s in request.shm_segments if os.path.exists(f"/dev/shm/{s}")] == []


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("transport", "dtype"), [("inline", None), ("shm", "bfloat16")])
def test_tokenspeed_round_trip(family: str, transport: str, dtype: str | None) -> None:
    model, image, video = _prepared(family)
    request = ts_adapter.generate_request(
        "r",
        _prompt(model),
        [image, video],
        transport=transport,  # type: ignore[arg-type]
        dtype=dtype,
        shm_min_bytes=0,
    )
    items = request.message.mm_inputs.items
    assert [i.modality for i in items] == [common_pb2.IMAGE, common_pb2.VIDEO, common_pb2.VIDEO]
    decoded = ts_adapter.decode_mm_inputs(_wire(request))
    ids = np.asarray(request.message.tokenized.input_ids)
    bf16 = ml_dtypes.bfloat16 if dtype else None
    for v in range(2):
        batch = decoded[1 + v]
        (item,) = batch.items
        tokens, embed = video.replacements[v]
        offset, length = item.placeholder
        assert (ids[offset : offset + length] == tokens).all()
        assert (np.asarray(item.embed_mask) == embed).all()
        want = video.item_tensors(v)["pixel_values_videos"]
        got = item.tensors.get("pixel_values_videos", item.tensors.get("pixel_values"))
        assert got.tobytes() == (want.astype(bf16) if bf16 else want).tobytes()
    assert [s for s in request.shm_segments if os.path.exists(f"/dev/shm/{s}")] == []


@pytest.mark.parametrize("family", FAMILIES)
def test_sglang_refuses_videos(family: str) -> None:
    model, _, video = _prepared(family)
    with pytest.raises(MultimodalError, match=r"(?i)video"):
        sglang_adapter.generate_request("r", _prompt(model)[5:], video)


def test_from_pretrained_reads_the_tokenizer(tmp_path: Path) -> None:
    """A GLM model directory: config.json's ids, tokenizer.json's added tokens and its model
    for the timestamp text."""
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "0": 5, "1": 6, "2": 7, ".": 8, "seconds": 9}
    special = {"<|image|>": 151343, "<|begin_of_image|>": 151339, "<|end_of_image|>": 151340}
    tokenizer = Tokenizer(models.WordLevel({**vocab, **special}, "<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Digits(individual_digits=True)]
    )
    tokenizer.add_special_tokens(list(special))
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    config = {"model_type": "glm46v", "image_token_id": 151343, "video_token_id": 151344}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({"image_processor_type": "Glm46VImageProcessor"})
    )
    model = VisionModel.from_pretrained(tmp_path)
    assert model.family == "glm46v"
    assert model.video_token_id == 151344
    video = model.prepare(
        videos=_clips(2)[:1], video_metadata=[{"fps": 1.0, "frames_indices": [0, 1, 2]}]
    )
    tokens, embed = video.replacements[0]
    # groups at 0.0 s and 2.0 s: "0.0 seconds" -> 0 . 0 seconds
    assert tokens[~embed].tolist()[:6] == [151339, 151340, 5, 8, 5, 9]
    assert tokens[~embed].tolist()[6:] == [151339, 151340, 7, 8, 5, 9]


@pytest.mark.parametrize("family", FAMILIES)
def test_wrap_an_output_made_elsewhere(family: str) -> None:
    """``wrap`` of the processor's own output gives the same replacements as ``prepare``."""
    model, _, video = _prepared(family)
    meta = [{"fps": 2.0, "frames_indices": [0, 1, 2]}, {"fps": 2.0, "frames_indices": [0, 1, 2, 3]}]
    wrapped = model.wrap(model.processor(videos=_clips(1)), modality="video", video_metadata=meta)
    assert wrapped.anchor == video.anchor
    assert wrapped.token_counts == video.token_counts
    for (a, ea), (b, eb) in zip(wrapped.replacements, video.replacements, strict=True):
        assert a.tolist() == b.tolist()
        assert ea.tolist() == eb.tolist()
    # without metadata: the processor's fallback timestamps, whatever the frame count
    plain = model.prepare(videos=_clips(1))
    bare = model.wrap(model.processor(videos=_clips(1)), modality="video")
    for (a, _), (b, _) in zip(bare.replacements, plain.replacements, strict=True):
        assert a.tolist() == b.tolist()
