"""Kimi-K2.5 (``kimi_k25``): what the torch goldens (``tests/goldens/torch/kimi_k25.json``, run by
``test_torch_family_goldens.py``) do not cover — the prompt ``Kimi_K25Processor`` writes, reading
the published checkpoint's ``preprocessor_config.json`` (``media_proc_cfg``) and ``config.json``,
the configurations refused, videos refused, and vLLM's tensor names.

The test environment has no torch, so ``Kimi_K25ImageProcessor`` (torchvision only) cannot run
here: transformers' real ``Kimi_K25Processor`` is given a stand-in image processor returning our
tensors (which the goldens prove bit-exact), so its own text expansion writes the prompt.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from support.model_dirs import KIMI_K25_PREPROCESSOR

from smg_grpc_proto import _native
from smg_grpc_proto.engines import VisionModel, expand_placeholders
from smg_grpc_proto.engines import vllm as vllm_adapter
from smg_grpc_proto.errors import ProcessorConfigError
from smg_grpc_proto.vision import ImageProcessor

# Kimi-K2.5's media tokens (the published tokenizer; Kimi_K25Config's ids).
SPECIAL = {
    "<|media_begin|>": 163602,
    "<|media_content|>": 163603,
    "<|media_end|>": 163604,
    "<|media_pad|>": 163605,
    "<|kimi_k25_video_placeholder|>": 163840,
}
PAD = SPECIAL["<|media_pad|>"]

# moonshotai/Kimi-K2.5's preprocessor_config.json (remote code; every setting nested).
PUBLISHED = KIMI_K25_PREPROCESSOR


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "image": 1, "describe": 2, "and": 3, "compare": 4, **SPECIAL}
    backend = Tokenizer(models.WordLevel(vocab, "<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", additional_special_tokens=list(SPECIAL)
    )


class _StandIn:
    """An image processor returning precomputed outputs (ours), with the merge size the
    processor reads."""

    merge_size = 2
    model_input_names: ClassVar[list[str]] = ["pixel_values", "image_grid_thw"]

    def __init__(self, outputs: dict[str, Any]) -> None:
        self.outputs = outputs

    def fetch_images(self, images: Any) -> Any:
        return images

    def __call__(self, images: Any, **kwargs: Any) -> Any:
        from transformers import BatchFeature

        return BatchFeature(dict(self.outputs))


@pytest.fixture
def _lenient_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Kimi_K25Processor`` checks its image and video processors' classes, both torchvision
    (absent here): accept the stand-in and no video processor."""
    from transformers import processing_utils

    check = processing_utils.ProcessorMixin.check_argument_for_proper_class

    def lenient(self: Any, name: str, argument: Any) -> Any:
        if name in ("image_processor", "video_processor") and (
            argument is None or isinstance(argument, _StandIn)
        ):
            return type(argument)
        return check(self, name, argument)

    monkeypatch.setattr(processing_utils.ProcessorMixin, "check_argument_for_proper_class", lenient)


@pytest.mark.usefixtures("_lenient_classes")
@pytest.mark.parametrize("n", [1, 3])
def test_input_ids_equal_the_transformers_processor(n: int) -> None:
    from PIL import Image
    from transformers.models.kimi_k25.processing_kimi_k25 import Kimi_K25Processor

    rng = np.random.default_rng(n)
    shapes = [(300, 500), (2000, 3000), (1, 1)][:n]
    arrays = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in shapes]
    model = VisionModel.for_family("kimi_k25")
    assert model.image_token_id == PAD
    media = model.prepare(arrays)
    grid = np.asarray(media.output.image_grid_thw)
    stand_in = _StandIn({"image_grid_thw": grid})
    processor = Kimi_K25Processor(
        image_processor=stand_in, tokenizer=_tokenizer(), video_processor=None
    )
    one = "<|media_begin|> image <|media_content|> <|media_pad|> <|media_end|>"
    text = "describe " + " and ".join([one] * n) + " compare"
    out = processor(text=text, images=[Image.fromarray(a) for a in arrays], return_tensors="np")
    want = out["input_ids"][0].tolist()
    assert list(media.token_counts) == [int(np.prod(g)) // 4 for g in grid]
    prompt = _tokenizer()(text)["input_ids"]
    ids, ranges = expand_placeholders(prompt, [media])
    assert ids.tolist() == want
    for (offset, length), count in zip(ranges[0], media.token_counts, strict=True):
        assert length == count
        assert set(ids[offset : offset + length].tolist()) == {PAD}
        assert ids[offset - 1] == SPECIAL["<|media_content|>"]
        assert ids[offset + length] == SPECIAL["<|media_end|>"]


def test_layout() -> None:
    """``(Σ h·w, 3, 14, 14)`` row-major patches and ``[1, h, w]`` grids: a 400x600 image pads to
    420x616 (30x44 patches, 330 tokens), a 1x1 pixel to 28x28 (one merge window)."""
    arrays = [np.zeros((400, 600, 3), np.uint8), np.full((1, 1, 3), 255, np.uint8)]
    out = ImageProcessor.for_family("kimi_k25")(arrays)
    assert out.image_grid_thw.tolist() == [[1, 30, 44], [1, 2, 2]]
    assert out.pixel_values.shape == (30 * 44 + 4, 3, 14, 14)
    assert out.pixel_values.dtype == np.float32
    assert list(out.num_image_tokens) == [330, 1]
    # the white pixel (1.0) at the top left of its first patch, the zero padding (-1.0) after it
    pixel = out.pixel_values[30 * 44]
    assert pixel[:, 0, 0].tolist() == [1.0, 1.0, 1.0]
    assert set(np.unique(pixel).tolist()) == {-1.0, 1.0}
    assert np.all(out.pixel_values[30 * 44 + 1 :] == -1.0)


def test_published_checkpoint(tmp_path: Path) -> None:
    """moonshotai/Kimi-K2.5's files: the family from ``config.json``'s ``model_type``, the
    settings from ``media_proc_cfg`` (transformers' class defaults), ``<|media_pad|>`` from
    ``media_placeholder_token_id``."""
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(PUBLISHED))
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "kimi_k25", "media_placeholder_token_id": PAD})
    )
    processor = ImageProcessor.from_pretrained(tmp_path)
    assert processor.family == "kimi_k25"
    assert processor.config == ImageProcessor.for_family("kimi_k25").config
    model = VisionModel.from_pretrained(tmp_path)
    assert model.image_token_id == PAD
    # the id is read from media_placeholder_token_id, not only defaulted
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "kimi_k25", "media_placeholder_token_id": 99})
    )
    assert VisionModel.from_pretrained(tmp_path).image_token_id == 99


def test_media_proc_cfg_values_are_read() -> None:
    """Nested values stand for the transformers keys the file does not set itself."""
    config = {
        "media_proc_cfg": {"in_patch_limit": 256, "patch_limit_on_one_side": 8},
        "merge_size": 1,
    }
    processor = ImageProcessor.from_pretrained(config, family="kimi_k25")
    assert processor.config["max_patches"] == 256
    assert processor.config["size"] == {"max_height": 8, "max_width": 8}
    assert processor.config["merge_size"] == 1
    out = processor([np.zeros((1000, 1000, 3), np.uint8)])
    assert out.image_grid_thw.tolist() == [[1, 8, 8]]  # 112 px: the per-side cap binds


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"size": {"max_height": 32, "max_width": 64}}, "size"),
        ({"size": {"height": 32, "width": 32}}, "size"),
        ({"size": 512}, "size"),
        ({"resample": 1}, "resample"),
        ({"do_normalize": False}, "do_normalize"),
        ({"max_patches": 0}, "max_patches"),
        ({"media_proc_cfg": {"transparent_bg_config": {"pattern": "chessboard"}}}, "transparent"),
        ({"media_proc_cfg": {"fixed_output_tokens": 256}}, "fixed_output_tokens"),
    ],
)
def test_refused_configs(config: dict[str, Any], field: str) -> None:
    with pytest.raises(ProcessorConfigError, match=field):
        ImageProcessor.from_pretrained(config, family="kimi_k25")


def test_kimi_k3_is_not_kimi_k25(tmp_path: Path) -> None:
    """Kimi-K3 (chessboard-composited transparency, per-image size text in its prompt) is not an
    alias of this family: its directory is refused, and forced into this family its
    ``transparent_bg_config`` is refused by name."""
    assert _native.family_of_model_type("kimi_k25") == "kimi_k25"
    assert _native.family_of_model_type("kimi_k3") is None
    k3 = {  # an excerpt of moonshotai/Kimi-K3's preprocessor_config.json
        "media_proc_cfg": {
            "in_patch_limit": 65536,
            "patch_size": 14,
            "merge_kernel_size": 2,
            "patch_limit_on_one_side": 512,
            "transparent_bg_config": {"pattern": "chessboard", "chessboard_square_size": 8},
            "transparent_bg_fill_stage": "after_resize",
        }
    }
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(k3))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "kimi_k3"}))
    with pytest.raises(ValueError, match="image_processor_type"):
        ImageProcessor.from_pretrained(tmp_path)
    with pytest.raises(ProcessorConfigError, match="transparent_bg_config"):
        ImageProcessor.from_pretrained(tmp_path, family="kimi_k25")


def test_videos_are_refused() -> None:
    frames = [np.zeros((28, 28, 3), np.uint8)] * 4
    with pytest.raises(ProcessorConfigError, match="video"):
        ImageProcessor.for_family("kimi_k25")(videos=[frames])


def test_do_resize_off_needs_patch_multiples() -> None:
    processor = ImageProcessor("kimi_k25", {"do_resize": False})
    out = processor([np.zeros((28, 42, 3), np.uint8)])
    assert out.image_grid_thw.tolist() == [[1, 2, 3]]
    assert list(out.num_image_tokens) == [1]  # 6 // 4, as the processor floors it
    with pytest.raises(ValueError, match="multiples of patch_size 14"):
        processor([np.zeros((20, 28, 3), np.uint8)])


def test_vllm_tensor_names() -> None:
    """vLLM's ``KimiK25ForConditionalGeneration`` takes ``grid_thws`` (batched, kept on the CPU)
    and ``pixel_values`` flat, split per image by ``patches_per_image``."""
    media = VisionModel.for_family("kimi_k25").prepare(
        [np.zeros((100, 60, 3), np.uint8), np.zeros((30, 300, 3), np.uint8)]
    )
    prompt = [5, PAD, 6, PAD, 7]
    request = vllm_adapter.generate_request("r", prompt, media)
    mm = request.message.mm_inputs
    assert set(mm.model_specific_tensors) == {"grid_thws", "patches_per_image"}
    assert dict(mm.flat_keys) == {"pixel_values": "patches_per_image"}
    assert set(mm.batched_keys) == {"grid_thws", "patches_per_image"}
    assert list(mm.keep_on_cpu_keys) == ["grid_thws"]
    (batch,) = vllm_adapter.decode_mm_inputs(request.to_message())
    grid = np.asarray(media.output.image_grid_thw)
    for i, item in enumerate(batch.items):
        assert item.tensors["grid_thws"].tolist() == grid[i : i + 1].tolist()
        assert item.tensors["pixel_values"].shape == (int(np.prod(grid[i])), 3, 14, 14)
