"""Gemma 4 unified (``Gemma4UnifiedImageProcessor``, transformers 5.24, torchvision backend
only). The pixels are checked bit for bit against the pinned torch reference through the
goldens (``tests/goldens/torch/gemma4_unified.json``, by ``test_torch_family_goldens.py``);
here: the expanded prompt against ``Gemma4UnifiedProcessor`` with a tokenizer holding the
special tokens at their published ids, its ``_get_num_multimodal_tokens``, config detection
(``image_processor_type`` and ``config.json`` ``model_type``), the settings refused and the
``do_resize``-off rules.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from support.gemma4_tokens import BOI, EOI, IMAGE, gemma4_tokenizer

from smg_grpc_proto.engines import VisionModel, expand_placeholders
from smg_grpc_proto.errors import ImageShapeError, ProcessorConfigError
from smg_grpc_proto.vision import ImageProcessor

pytest.importorskip("transformers", reason="the reference is transformers")
pytest.importorskip("PIL", reason="the processor takes PIL images")

from PIL import Image


def _processor(outputs: dict[str, Any], budget: int = 280) -> Any:
    """``Gemma4UnifiedProcessor`` whose image processor (torchvision-only, so a stand-in here)
    hands back our outputs (whose bit-exactness the goldens cover) and carries the class's
    geometry (the class defaults, ``budget`` soft tokens) for ``_get_num_multimodal_tokens``;
    the video processor (torch-only) is unused for images, so none is given."""
    from transformers import BatchFeature
    from transformers.image_processing_utils import BaseImageProcessor
    from transformers.models.gemma4_unified.feature_extraction_gemma4_unified import (
        Gemma4UnifiedAudioFeatureExtractor,
    )
    from transformers.models.gemma4_unified.processing_gemma4_unified import (
        Gemma4UnifiedProcessor,
    )

    class Outputs(BaseImageProcessor):  # type: ignore[misc]
        model_input_names: ClassVar[list[str]] = ["pixel_values"]
        patch_size = 16
        pooling_kernel_size = 3
        max_soft_tokens = budget

        def __call__(self, images: Any, **kwargs: Any) -> Any:
            return BatchFeature(outputs)

        preprocess = __call__

    class StandIns(Gemma4UnifiedProcessor):  # type: ignore[misc]
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name in ("video_processor", "image_processor"):
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return StandIns(
        feature_extractor=Gemma4UnifiedAudioFeatureExtractor(),
        image_processor=Outputs(),
        tokenizer=gemma4_tokenizer(),
        video_processor=None,
    )


@pytest.mark.parametrize(
    "sizes",
    [[(1, 1)], [(480, 640)], [(3, 900)], [(1080, 1920), (20, 30), (5000, 1)]],
    ids=["tiny", "photo", "strip", "3-images"],
)
@pytest.mark.parametrize("budget", [70, 280, 1120])
def test_input_ids_equal_gemma4_unified_processor(
    sizes: list[tuple[int, int]], budget: int
) -> None:
    rng = np.random.default_rng(len(sizes) + budget)
    arrays = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    model = VisionModel.for_family("gemma4_unified", config={"max_soft_tokens": budget})
    media = model.prepare(arrays)
    out = media.output.tensors()
    assert out["pixel_values"].shape == (len(sizes), budget, 48 * 48 * 3)
    processor = _processor(
        {
            "pixel_values": out["pixel_values"],
            "image_position_ids": out["image_position_ids"],
            "num_soft_tokens_per_image": out["num_soft_tokens_per_image"].tolist(),
        },
        budget,
    )
    text = "describe " + " and ".join(["<|image|>"] * len(sizes)) + " compare"
    images = [Image.new("RGB", (w, h)) for h, w in sizes]
    want = processor(text=text, images=images, return_tensors=None)["input_ids"][0]
    prompt = gemma4_tokenizer()(text)["input_ids"]
    ids, ranges = expand_placeholders(prompt, [media])
    assert ids.tolist() == list(want)
    counts = processor._get_num_multimodal_tokens(image_sizes=sizes)["num_image_tokens"]
    assert list(media.token_counts) == counts
    for (offset, length), n in zip(ranges[0], counts, strict=True):
        assert length == n + 2
        assert ids[offset] == BOI
        assert ids[offset + length - 1] == EOI


def test_for_family_uses_the_published_ids() -> None:
    model = VisionModel.for_family("gemma4_unified")
    assert model.image_token_id == IMAGE
    assert dict(model.token_ids) == {"<|image>": BOI, "<image|>": EOI, "<|image|>": IMAGE}
    media = model.prepare([np.zeros((1000, 1000, 3), np.uint8)])
    ids, _ = expand_placeholders([IMAGE], [media])
    assert ids.tolist() == [BOI, *[IMAGE] * 256, EOI]


@pytest.mark.parametrize(
    ("preprocessor", "model_type"),
    [
        ({"image_processor_type": "Gemma4UnifiedImageProcessor"}, "gemma4_unified"),
        ({"image_processor_type": "Gemma4UnifiedImageProcessor"}, None),
        # The model type names the family over a config without the class.
        ({}, "gemma4_unified"),
    ],
)
def test_from_pretrained(
    tmp_path: Path, preprocessor: dict[str, Any], model_type: str | None
) -> None:
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({**preprocessor, "max_soft_tokens": 560, "patch_size": 16, "size": None})
    )
    config: dict[str, Any] = {"image_token_id": 7, "boi_token_id": 8}
    if model_type is not None:
        config["model_type"] = model_type
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = VisionModel.from_pretrained(tmp_path)
    assert model.family == "gemma4_unified"
    assert model.image_token_id == 7
    media = model.prepare([np.zeros((100, 100, 3), np.uint8)])
    assert media.output.tensors()["pixel_values"].shape == (1, 560, 6912)
    ids, _ = expand_placeholders([7], [media])
    # a square at 560 soft tokens: 23 x 23 blocks of 48 px = 529 soft tokens
    assert ids.tolist() == [BOI, *[7] * 529, EOI]


def test_merged_layout_on_whole_kernels() -> None:
    """``do_resize`` off on whole 48-pixel kernels: each merged patch is the kernel's block,
    row by row, channels-last, rescaled in float32; positions are the kernel's ``(x, y)``."""
    rng = np.random.default_rng(4)
    array = rng.integers(0, 256, (96, 144, 3), dtype=np.uint8)
    out = ImageProcessor("gemma4_unified", {"do_resize": False, "max_soft_tokens": 70})([array])
    assert out.pixel_values is not None
    pv = out.pixel_values
    assert pv.shape == (1, 70, 6912)
    scale = np.float32(1 / 255)
    blocks = [
        array[ky * 48 : (ky + 1) * 48, kx * 48 : (kx + 1) * 48].reshape(-1)
        for ky in range(2)
        for kx in range(3)
    ]
    want = np.stack(blocks).astype(np.float32) * scale
    assert np.array_equal(pv[0, :6], want)
    assert not pv[0, 6:].any()
    positions = out.tensors()["image_position_ids"][0]
    assert positions[:6].tolist() == [[0, 0], [1, 0], [2, 0], [0, 1], [1, 1], [2, 1]]
    assert (positions[6:] == -1).all()
    assert out.num_image_tokens == (6,)


def test_no_resize_refusals() -> None:
    ours = ImageProcessor("gemma4_unified", {"do_resize": False})
    with pytest.raises(ImageShapeError, match="pooling_kernel_size \\* patch_size = 48"):
        ours([np.zeros((32, 48, 3), np.uint8)])
    with pytest.raises(ImageShapeError, match="at most max_soft_tokens = 70"):
        ImageProcessor("gemma4_unified", {"do_resize": False, "max_soft_tokens": 70})(
            [np.zeros((480, 480, 3), np.uint8)]
        )


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"max_soft_tokens": 100}, "max_soft_tokens"),
        ({"max_soft_tokens": 280.0}, "max_soft_tokens"),
        ({"patch_size": 0}, "patch_size"),
        ({"resample": 0}, "resample"),
        ({"resample": 1}, "resample"),
        ({"do_rescale": False, "do_normalize": False}, "do_rescale"),
        ({"do_normalize": True, "image_std": [1.0, 0.0, 1.0]}, "image_std"),
    ],
)
def test_config_errors(config: dict[str, Any], key: str) -> None:
    with pytest.raises(ProcessorConfigError, match=key):
        ImageProcessor("gemma4_unified", config)


def test_videos_are_refused() -> None:
    frames = [np.zeros((32, 32, 3), np.uint8)] * 2
    with pytest.raises(ProcessorConfigError, match="video"):
        ImageProcessor.for_family("gemma4_unified")(videos=[frames])


def test_threads_give_the_same_bytes() -> None:
    """A mixed batch on 1 and 4 threads (images in parallel, or one image's resize split)."""
    rng = np.random.default_rng(8)
    sizes = [(480, 640), (1, 5000), (333, 257), (1080, 1920), (47, 48)]
    arrays = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    one = ImageProcessor("gemma4_unified", {"max_soft_tokens": 560}, threads=1)(arrays)
    four = ImageProcessor("gemma4_unified", {"max_soft_tokens": 560}, threads=4)(arrays)
    single = ImageProcessor("gemma4_unified", {"max_soft_tokens": 560}, threads=4)(arrays[3:4])
    assert one.pixel_values is not None
    assert four.pixel_values is not None
    assert single.pixel_values is not None
    assert one.pixel_values.tobytes() == four.pixel_values.tobytes()
    assert single.pixel_values.tobytes() == one.pixel_values[3:4].tobytes()
    assert one.num_image_tokens == four.num_image_tokens
