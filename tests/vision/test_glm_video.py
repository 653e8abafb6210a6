"""GLM-4.1V, GLM-4.6V and GLM-5-next videos.

- Pixels: transformers' GLM video processors are torchvision only (no PIL video backend), so
  ours are checked bit for bit against ``tests/goldens/glm_video.json``, written by
  ``scripts/gen_glm_video_goldens.py`` with torch 2.14.1 / torchvision 0.29.1 / transformers
  5.24.0: a video of every real photo (32) and odd shapes per family, a batch, config variants,
  and the reference's refusals.
- Prompt: ``input_ids`` equal to what the real ``Glm4vProcessor`` / ``Glm46VProcessor`` /
  ``Glm5NextProcessor`` write (their ``replace_video_token``, timestamps from the video
  metadata, tokenized by a tokenizer holding GLM's special tokens at their published ids), with
  images and videos in one prompt; the processor's video processor is replaced by one returning
  our outputs and transformers' own metadata (``make_batched_metadata``), as torchvision is
  absent here.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.glm_video_inputs import videos as golden_videos
from support.images import real_photos

from smg_grpc_proto.engines import VisionModel, expand_placeholders
from smg_grpc_proto.errors import MultimodalError
from smg_grpc_proto.vision import (
    GlmVideoMetadata,
    ImageProcessor,
    glm_sample_frames,
    glm_video_text,
    glm_video_timestamps,
)

GOLDENS = Path(__file__).resolve().parents[1] / "goldens" / "glm_video.json"
FAMILIES = ["glm4v", "glm46v", "glm5_next"]


def _cases() -> list[dict[str, Any]]:
    return list(json.loads(GOLDENS.read_text())["cases"])


@pytest.fixture(scope="module")
def clips() -> dict[str, np.ndarray]:
    return golden_videos(real_photos())


def test_goldens_cover_the_acceptance() -> None:
    cases = _cases()
    for family in FAMILIES:
        mine = [c for c in cases if c["family"] == family]
        photos = {
            c["videos"][0]
            for c in mine
            if len(c["videos"]) == 1 and c["videos"][0].startswith("photo_") and not c["config"]
        }
        assert len(photos) >= 30, family
        assert any(len(c["videos"]) > 1 for c in mine), family
        assert any(c["config"] for c in mine), family


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["id"])
def test_golden(case: dict[str, Any], clips: dict[str, np.ndarray]) -> None:
    config = case["config"] or None
    ours = ImageProcessor(case["family"], config)
    videos = [list(clips[name]) for name in case["videos"]]
    if "error" in case:
        with pytest.raises(ValueError):  # noqa: PT011 (the reference's message is transformers')
            ours(videos=videos)
        return
    out = ours(videos=videos)
    want = case["pixel_values_videos"]
    pixels = np.ascontiguousarray(out.pixel_values_videos)
    assert pixels.dtype == np.float32
    assert list(pixels.shape) == want["shape"]
    flat = pixels.reshape(-1)
    for i, v in want["samples"]:
        assert flat[i] == np.float32(v), (i, flat[i], v)
    assert hashlib.sha256(pixels.tobytes()).hexdigest() == want["sha256"]
    assert np.asarray(out.video_grid_thw).tolist() == case["video_grid_thw"]
    merge = 4
    assert list(out.num_video_tokens) == [int(np.prod(g)) // merge for g in case["video_grid_thw"]]


def test_deferred_equals_eager(clips: dict[str, np.ndarray]) -> None:
    for family in FAMILIES:
        ours = ImageProcessor(family)
        videos = [list(clips["photo_astronaut"]), list(clips["noise-3f-5x700"])]
        eager = ours(videos=videos)
        deferred = ours.deferred(videos=videos)
        assert np.asarray(deferred.materialize().pixel_values_videos).tobytes() == (
            np.asarray(eager.pixel_values_videos).tobytes()
        )


def test_video_errors() -> None:
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (60, 60, 3), dtype=np.uint8)
    other = rng.integers(0, 256, (61, 60, 3), dtype=np.uint8)
    for family in FAMILIES:
        with pytest.raises(ValueError, match="frame 1"):
            ImageProcessor(family)(videos=[[frame, other]])
    # GLM-4.1V's smart_resize refuses a video of fewer frames than temporal_patch_size.
    with pytest.raises(ValueError, match="temporal_patch_size"):
        ImageProcessor("glm4v")(videos=[[frame]])
    # GLM-5-next's takes it (aligned to T frames); its pixels: the goldens' noise-1f case
    assert ImageProcessor("glm5_next")(videos=[[frame]]).video_grid_thw[0][0] == 1
    with pytest.raises(ValueError, match="video_size"):
        ImageProcessor("glm4v", {"video_size": {"longest_edge": 100}})
    with pytest.raises(ValueError, match="video_max_image_tokens"):
        ImageProcessor("glm5_next", {"video_max_image_tokens": 0})
    with pytest.raises(ValueError, match="resample"):
        ImageProcessor("glm4v", {"resample": 1})(videos=[[frame, frame]])


# ---- the prompt against transformers' processors ---------------------------------------------

SPECIAL = {
    "glm4v": {
        "<|image|>": 151343,
        "<|video|>": 151344,
        "<|begin_of_image|>": 151339,
        "<|end_of_image|>": 151340,
        "<|begin_of_video|>": 151341,
        "<|end_of_video|>": 151342,
    },
    "glm46v": {
        "<|image|>": 151343,
        "<|video|>": 151344,
        "<|begin_of_image|>": 151339,
        "<|end_of_image|>": 151340,
        "<|begin_of_video|>": 151361,
        "<|end_of_video|>": 151362,
    },
    "glm5_next": {
        "<|image|>": 154854,
        "<|video|>": 154855,
        "<|begin_of_image|>": 154830,
        "<|end_of_image|>": 154831,
        "<|begin_of_video|>": 154832,
        "<|end_of_video|>": 154833,
    },
}


def _tokenizer(special: dict[str, int]) -> Any:
    """Words, the timestamp texts (``0`` … ``299``, ``0.0`` … ``299.9``, ``seconds``) and GLM's
    special tokens at their published ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "describe", "and", "compare", "seconds"]
    words += [str(i) for i in range(300)] + [f"{i / 10:.1f}" for i in range(3000)]
    vocab = {w: i for i, w in enumerate(dict.fromkeys(words))}
    backend = Tokenizer(models.WordLevel({**vocab, **special}, "<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", additional_special_tokens=list(special)
    )


class _OurVideoProcessor:
    """Stands for the torchvision video processor inside transformers' GLM processor: our
    tensors, and the metadata as ``BaseVideoProcessor`` makes it for frames passed already
    sampled (``make_batched_metadata``, ``return_metadata=True``)."""

    merge_size = 2

    def __init__(self, family: str) -> None:
        self.ours = ImageProcessor(family)

    def __call__(self, videos: Any, **kwargs: Any) -> dict[str, Any]:
        from transformers.video_utils import make_batched_metadata

        assert kwargs.get("do_sample_frames") is False
        out = self.ours(videos=[list(v) for v in videos])
        metadata = make_batched_metadata(videos, video_metadata=kwargs.get("video_metadata"))
        return {
            "pixel_values_videos": out.pixel_values_videos,
            "video_grid_thw": out.video_grid_thw,
            "video_metadata": metadata,
        }


@pytest.fixture
def _our_video_processor(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import processing_utils

    check = processing_utils.ProcessorMixin.check_argument_for_proper_class

    def lenient(self: Any, name: str, argument: Any) -> Any:
        if isinstance(argument, _OurVideoProcessor):
            return _OurVideoProcessor
        return check(self, name, argument)

    monkeypatch.setattr(processing_utils.ProcessorMixin, "check_argument_for_proper_class", lenient)


# (frames per video, transformers' video_metadata per video or None, ours)
METADATA: list[tuple[list[int], Any, Any]] = [
    ([4], None, None),  # the processor's fallback: frames 0, 1, 2, … at 24 fps
    ([3, 6], None, None),  # an odd count: the last frame group padded
    (
        [6],
        [{"fps": 30.0, "frames_indices": [0, 15, 30, 45, 60, 75], "total_num_frames": 90}],
        [{"fps": 30.0, "frames_indices": [0, 15, 30, 45, 60, 75]}],
    ),
    (
        [5, 4],
        [
            {"fps": 2.0, "frames_indices": [0, 1, 2, 3, 4], "total_num_frames": 5},
            {"fps": 0.5, "frames_indices": [0, 50, 100, 150], "total_num_frames": 151},
        ],
        [
            GlmVideoMetadata(fps=2.0, frames_indices=[0, 1, 2, 3, 4]),
            {"timestamps": [0.0, 100.0, 200.0, 300.0]},
        ],
    ),
]


@pytest.mark.usefixtures("_our_video_processor")
@pytest.mark.parametrize("case", range(len(METADATA)))
@pytest.mark.parametrize("family", FAMILIES)
def test_input_ids_equal_the_transformers_processor(family: str, case: int) -> None:
    import transformers as tf
    from PIL import Image
    from support.parity import hf_classes

    processor_class = {
        "glm4v": tf.Glm4vProcessor,
        "glm46v": tf.Glm46VProcessor,
        "glm5_next": tf.Glm5NextProcessor,
    }[family]
    frames, hf_meta, our_meta = METADATA[case]
    special = SPECIAL[family]
    tokenizer = _tokenizer(special)
    rng = np.random.default_rng(case)
    clips = [
        rng.integers(0, 256, (n, 90 + 30 * v, 120, 3), dtype=np.uint8) for v, n in enumerate(frames)
    ]
    image = rng.integers(0, 256, (200, 300, 3), dtype=np.uint8)

    def tokenize(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    model = VisionModel.for_family(family, tokenize=tokenize)  # type: ignore[arg-type]
    assert (model.image_token_id, model.video_token_id) == (
        special["<|image|>"],
        special["<|video|>"],
    )
    videos = model.prepare(videos=[list(c) for c in clips], video_metadata=our_meta)
    images = model.prepare([image])
    processor = processor_class(
        image_processor=hf_classes()[family](),
        tokenizer=tokenizer,
        video_processor=_OurVideoProcessor(family),
    )
    video = "<|begin_of_video|> <|video|> <|end_of_video|>"
    text = (
        "describe <|begin_of_image|> <|image|> <|end_of_image|> and "
        + " and ".join([video] * len(clips))
        + " compare"
    )
    kwargs: dict[str, Any] = {"do_sample_frames": False}
    if hf_meta is not None:
        kwargs["video_metadata"] = hf_meta
    out = processor(
        text=text, images=[Image.fromarray(image)], videos=clips, return_tensors="np", **kwargs
    )
    want = out["input_ids"][0].tolist()
    prompt = tokenizer(text)["input_ids"]
    ids, ranges = expand_placeholders(prompt, [images, videos])
    assert ids.tolist() == want
    # the embedding positions: the video's <|image|> runs (transformers' mm_token_type_ids 2)
    types = np.asarray(out["mm_token_type_ids"][0])
    spans = ranges[1]
    video_positions = np.flatnonzero(types == 2)
    ours = [
        offset + int(i)
        for (offset, _), (_, embed) in zip(spans, videos.replacements, strict=True)
        for i in np.flatnonzero(embed)
    ]
    assert ours == video_positions.tolist()
    assert list(videos.token_counts) == [
        int(np.prod(g)) // 4 for g in np.asarray(out["video_grid_thw"])
    ]


def test_timestamps_and_text() -> None:
    # fallback: 24 fps, frames 0, 1, …; every second frame; padded with the last
    assert glm_video_timestamps(5, 3) == [0.0, 2 / 24, 4 / 24]
    assert glm_video_timestamps(4, 3) == [0.0, 2 / 24, 2 / 24]
    meta = GlmVideoMetadata(fps=2.0, frames_indices=[0, 2, 4, 6])
    assert glm_video_timestamps(4, 2, meta) == [0.0, 2.0]
    grid = [2, 4, 6]
    text = glm_video_text("glm4v", grid, [0.0, 2.5])
    assert text == (
        "<|begin_of_image|>" + "<|image|>" * 6 + "<|end_of_image|>0"
        "<|begin_of_image|>" + "<|image|>" * 6 + "<|end_of_image|>2"
    )
    assert glm_video_text("glm46v", grid, [0.0, 2.5]).endswith("<|end_of_image|>2.5 seconds")
    with pytest.raises(MultimodalError, match="frames_indices"):
        glm_video_timestamps(4, 2, GlmVideoMetadata(fps=2.0, frames_indices=[0, 1]))
    with pytest.raises(MultimodalError, match="fps"):
        GlmVideoMetadata.of({"fps": 0}, "video_metadata[0]")
    with pytest.raises(MultimodalError, match="not both"):
        GlmVideoMetadata.of({"frames_indices": [0], "timestamps": [0.0]}, "m")


def test_model_refusals() -> None:
    rng = np.random.default_rng(1)
    clip = list(rng.integers(0, 256, (2, 60, 60, 3), dtype=np.uint8))
    model = VisionModel.for_family("glm46v")  # no tokenizer: the timestamp text cannot be written
    with pytest.raises(MultimodalError, match="tokenizer"):
        model.prepare(videos=[clip])
    # with the pieces given as token ids, no tokenizer is needed
    named = VisionModel.for_family("glm4v", token_ids={"0": 15})
    media = named.prepare(videos=[clip])
    assert media.replacements[0][0].tolist()[-1] == 15
    with pytest.raises(MultimodalError, match="video_metadata"):
        named.prepare(videos=[clip], video_metadata=[None, None])
    with pytest.raises(MultimodalError, match="video_metadata"):
        VisionModel.for_family("qwen2_vl").prepare(videos=[clip], video_metadata=[None])


def _sampling() -> list[dict[str, Any]]:
    return list(json.loads(GOLDENS.read_text())["sampling"])


@pytest.mark.parametrize(
    "case",
    _sampling(),
    ids=lambda c: (
        f"{c['family']}-{c['total_num_frames']}@{c['fps']}-{c['duration']}-{c['target_fps']}"
    ),
)
def test_sample_frames(case: dict[str, Any]) -> None:
    """The frames each video processor's ``sample_frames`` picks (goldens: the classes import
    torch)."""
    got = glm_sample_frames(
        case["family"],
        case["total_num_frames"],
        case["fps"],
        duration=case["duration"],
        target_fps=case["target_fps"],
    )
    assert got == case["indices"]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
