"""Qwen3-Omni (``qwen3_omni_moe``) images and videos without audio, and the Qwen3.5 model-type
aliases, as the gateway sends them.

- ``expand_placeholders`` gives exactly the ``input_ids`` of transformers 5.24's
  ``Qwen3OmniMoeProcessor`` for the same text, images and videos: each ``<|image_pad|>``
  (151655) becomes a run of ``t·h·w / merge²`` of itself, each ``<|video_pad|>`` (151656) a run
  of its video's count (no timestamps: ``Qwen3OmniMoeProcessor.replace_video_token``). The
  tokenizer is built here with the published special tokens at their ids; the image and video
  processors are stand-ins handing back our outputs (tests/vision covers their bit-exactness;
  the video processor class needs torchvision, absent here), and the stand-in video processor
  records the ``size`` the processor passes it — the video size our family uses.
- Videos with audio (``load_audio_from_video``: video runs interleaved with audio tokens by
  time) are not ours: a video here is its frames alone, as the processor lays out a video
  without audio.
- ``VisionModel.from_pretrained`` on a Qwen3-Omni directory reads the ids from
  ``thinker_config``; a ``qwen4_exp`` / ``qwen3_5_moe`` / ``qwen3_6`` directory is Qwen3.5.
- Images and videos round-trip builder → wire → decoder for vLLM and TokenSpeed (SGLang's
  preprocessed input carries images only); images for SGLang too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from smg_grpc_proto import common_pb2, tensors
from smg_grpc_proto.engines import VisionModel, expand_placeholders
from smg_grpc_proto.engines import sglang as sglang_adapter
from smg_grpc_proto.engines import tokenspeed as ts_adapter
from smg_grpc_proto.engines import vllm as vllm_adapter

pytest.importorskip("transformers", reason="the reference is transformers")

# Qwen/Qwen3-Omni-30B-A3B-*: tokenizer added tokens; image/video ids are
# Qwen3OmniMoeThinkerConfig's image_token_id / video_token_id (151655 / 151656), the audio pad
# its audio_token_id 151675 in the published thinker_config (the class default says 151646).
SPECIAL = {
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
    "<|audio_start|>": 151669,
    "<|audio_end|>": 151670,
    "<|audio_pad|>": 151675,
}
SHAPES = [(300, 500), (900, 400), (40, 40)]


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "describe": 1, "and": 2, "compare": 3, **SPECIAL}
    backend = Tokenizer(models.WordLevel(vocab, "<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # The published tokenizer_config.json names these (Qwen3OmniMoeProcessor reads them).
    named = {
        "image_token": "<|image_pad|>",
        "video_token": "<|video_pad|>",
        "audio_token": "<|audio_pad|>",
        "vision_bos_token": "<|vision_start|>",
        "vision_eos_token": "<|vision_end|>",
        "audio_bos_token": "<|audio_start|>",
        "audio_eos_token": "<|audio_end|>",
    }
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", extra_special_tokens=named
    )


class _Videos:
    """A stand-in for ``Qwen2VLVideoProcessor`` (torchvision-only): hands back our outputs and
    records the keyword arguments the processor calls it with."""

    temporal_patch_size = 2
    merge_size = 2
    model_input_names: ClassVar[list[str]] = ["pixel_values_videos", "video_grid_thw"]

    def __init__(self, outputs: dict[str, Any]) -> None:
        self.outputs = outputs
        self.calls: list[dict[str, Any]] = []

    def __call__(self, videos: Any = None, **kwargs: Any) -> Any:
        from transformers import BatchFeature

        self.calls.append(kwargs)
        return BatchFeature(self.outputs)


@pytest.fixture(autouse=True)
def _accept_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import processing_utils

    check = processing_utils.ProcessorMixin.check_argument_for_proper_class

    def lenient(self: Any, name: str, argument: Any) -> Any:
        if isinstance(argument, _Videos):
            return _Videos
        return check(self, name, argument)

    monkeypatch.setattr(processing_utils.ProcessorMixin, "check_argument_for_proper_class", lenient)


def _processor(images: dict[str, Any], videos: dict[str, Any]) -> tuple[Any, _Videos]:
    import transformers as tf
    from transformers import BatchFeature

    class Images(tf.Qwen2VLImageProcessorPil):  # type: ignore[misc]
        model_input_names: ClassVar[list[str]] = list(images)

        def __call__(self, images_: Any = None, **kwargs: Any) -> Any:
            return BatchFeature(images)

        preprocess = __call__

    video_processor = _Videos(videos)
    processor = tf.Qwen3OmniMoeProcessor(
        image_processor=Images(merge_size=2),
        video_processor=video_processor,
        feature_extractor=tf.WhisperFeatureExtractor(feature_size=128),
        tokenizer=_tokenizer(),
    )
    return processor, video_processor


def _arrays(seed: int, shapes: list[tuple[int, int]]) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in shapes]


def _tensors(media: Any) -> dict[str, Any]:
    return {k: np.asarray(v) for k, v in media.output.tensors().items()}


IMAGE = "<|vision_start|> <|image_pad|> <|vision_end|>"
VIDEO = "<|vision_start|> <|video_pad|> <|vision_end|>"


CASES = [(n, frames) for n in (0, 1, 3) for frames in ([], [4], [3, 1]) if n or frames]


@pytest.mark.parametrize(("n_images", "video_frames"), CASES)
def test_input_ids_equal_qwen3_omni_processor(n_images: int, video_frames: list[int]) -> None:
    model = VisionModel.for_family("qwen3_omni_moe")
    assert (model.image_token_id, model.video_token_id) == (151655, 151656)
    arrays = _arrays(n_images, SHAPES[:n_images])
    clips = [_arrays(10 + v, [(120 + 40 * v, 200)] * f) for v, f in enumerate(video_frames)]
    prepared = []
    image_out: dict[str, Any] = {}
    video_out: dict[str, Any] = {}
    if arrays:
        prepared.append(model.prepare(arrays))
        image_out = _tensors(prepared[-1])
    if clips:
        prepared.append(model.prepare(videos=clips))
        video_out = _tensors(prepared[-1])
    processor, videos = _processor(image_out, video_out)
    pieces = ["describe", *([IMAGE] * n_images), *([VIDEO] * len(clips)), "compare"]
    text = " and ".join(pieces)
    result = processor(text=text, images=list(arrays) or None, videos=clips or None)
    want = result["input_ids"][0]
    want_seconds = np.asarray(result.get("video_second_per_grid", []), dtype=np.float32)
    prompt = _tokenizer()(text)["input_ids"]
    ids, ranges = expand_placeholders(prompt, prepared)
    assert ids.tolist() == list(want)
    for media, item_ranges in zip(prepared, ranges, strict=True):
        for (offset, length), count in zip(item_ranges, media.token_counts, strict=True):
            assert length == count
            assert set(ids[offset : offset + length].tolist()) == {media.token_id}
    if clips:
        # the size the processor passes its video processor is our family's video size
        (call,) = videos.calls
        assert call["size"] == model.processor.config["video_size"]
        assert call["size"] == {"shortest_edge": 131072, "longest_edge": 786432}
        # and the timing tensor is the processor's (temporal_patch_size / fps, fps 1.0)
        got = prepared[-1].output.video_second_per_grid
        assert got.tolist() == want_seconds.tolist()


def _wire(request: Any) -> Any:
    return tensors.parse(tensors.serialize(request), type(request.message))


def test_engines_round_trip_images_and_video() -> None:
    model = VisionModel.for_family("qwen3_omni_moe")
    images = model.prepare(_arrays(1, [(300, 500), (40, 40)]))
    video = model.prepare(videos=[_arrays(2, [(200, 320)] * 3)])
    assert video.token_counts == (int(np.prod(video.output.video_grid_thw[0])) // 4,)
    prompt = [101, 151652, 151655, 151653, 7, 151652, 151656, 151653, 8, 151652, 151655, 151653]
    request = vllm_adapter.generate_request("r", prompt, [images, video])
    assert request.message.extra_mm_inputs[0].modality == common_pb2.VIDEO
    first, second = vllm_adapter.decode_mm_inputs(_wire(request), merge_size=2)
    for name in ("pixel_values", "image_grid_thw"):
        got = first.tensors[name]
        assert got.tobytes() == np.asarray(getattr(images.output, name)).tobytes()
    for name in ("pixel_values_videos", "video_grid_thw", "video_second_per_grid"):
        got = second.tensors[name]
        assert got.tobytes() == np.asarray(getattr(video.output, name)).tobytes()
    assert second.items[0].placeholder[1] == video.token_counts[0]
    ts = ts_adapter.generate_request("r", prompt, [images, video], dtype=None)
    kinds = [item.modality for item in ts.message.mm_inputs.items]
    assert kinds == [common_pb2.IMAGE, common_pb2.VIDEO, common_pb2.IMAGE]
    decoded = ts_adapter.decode_mm_inputs(_wire(ts), merge_size=2)
    got = decoded[1].tensors["pixel_values_videos"]
    assert got.tobytes() == np.asarray(video.output.pixel_values_videos).tobytes()
    only_images = [101, 151655, 7, 151655]
    sg = sglang_adapter.generate_request("r", only_images, images, dtype=None)
    back = sglang_adapter.decode_mm_inputs(_wire(sg))
    assert back is not None


def _directory(tmp_path: Path, config: dict[str, Any], preprocessor: dict[str, Any]) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(preprocessor), encoding="utf-8")
    return tmp_path


OMNI_PREPROCESSOR = {
    "feature_extractor_type": "WhisperFeatureExtractor",
    "feature_size": 128,
    "image_processor_type": "Qwen2VLImageProcessor",
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "processor_class": "Qwen3OmniMoeProcessor",
}


def test_from_pretrained_qwen3_omni_reads_thinker_config(tmp_path: Path) -> None:
    config = {
        "model_type": "qwen3_omni_moe",
        "thinker_config": {
            "model_type": "qwen3_omni_moe_thinker",
            "image_token_id": 151655,
            "video_token_id": 151656,
            "audio_token_id": 151675,
        },
    }
    model = VisionModel.from_pretrained(_directory(tmp_path / "omni", config, OMNI_PREPROCESSOR))
    assert model.family == "qwen3_omni_moe"
    assert (model.image_token_id, model.video_token_id) == (151655, 151656)
    assert model.model_type == "qwen3_omni_moe"
    # the ids come from thinker_config, not the family's defaults
    moved = {**config, "thinker_config": {"image_token_id": 9001, "video_token_id": 9002}}
    bare = {k: v for k, v in OMNI_PREPROCESSOR.items() if k != "processor_class"}
    other = VisionModel.from_pretrained(_directory(tmp_path / "moved", moved, bare))
    assert other.family == "qwen3_omni_moe"  # by config.json's model_type
    assert (other.image_token_id, other.video_token_id) == (9001, 9002)


@pytest.mark.parametrize("model_type", ["qwen3_5", "qwen3_5_moe", "qwen3_6", "qwen4_exp"])
def test_from_pretrained_qwen35_aliases(tmp_path: Path, model_type: str) -> None:
    preprocessor = {
        "image_processor_type": "Qwen2VLImageProcessorFast",
        "processor_class": "Qwen3VLProcessor",
        "patch_size": 16,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    }
    config = {"model_type": model_type, "image_token_id": 248056, "video_token_id": 248057}
    model = VisionModel.from_pretrained(_directory(tmp_path, config, preprocessor))
    assert model.family == "qwen3_5"
    assert (model.image_token_id, model.video_token_id) == (248056, 248057)
    # without the ids in config.json, Qwen3.5's published ones (transformers' Qwen3_5Config,
    # Qwen3_5MoeConfig and Qwen4ExpConfig defaults)
    directory = _directory(tmp_path / "bare", {"model_type": model_type}, preprocessor)
    bare = VisionModel.from_pretrained(directory)
    assert (bare.image_token_id, bare.video_token_id) == (248056, 248057)
