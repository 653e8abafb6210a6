"""Gemma 4 (``Gemma4ImageProcessorPil``, transformers 5.24): ``vision.ImageProcessor`` against
transformers, live and bit for bit — every input kind, the soft-token budgets, random shapes from
1 x 1 to strips, batches, options, configuration errors; and the expanded prompt against
``Gemma4Processor`` with a tokenizer holding Gemma 4's special tokens at their published ids.
The reference, the test images and the comparison: ``support/parity.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from support.gemma4_tokens import BOI, EOI, IMAGE, gemma4_tokenizer
from support.parity import (
    IMAGE_CASES,
    assert_matches,
    assert_same,
    check_batches,
    check_files,
    check_options,
    check_pil_inputs,
    check_raw_arrays,
    configs_of,
    reference_mark,
    run_hf,
)

from smg_grpc_proto.engines import VisionModel, expand_placeholders
from smg_grpc_proto.errors import ImageShapeError, ProcessorConfigError
from smg_grpc_proto.vision import ImageProcessor

pytest.importorskip("transformers", reason="the reference is transformers")
pytest.importorskip("PIL", reason="the reference resizer is Pillow")

from PIL import Image
from transformers import Gemma4ImageProcessorPil

pytestmark = reference_mark()


# ---- parity on every input kind (the checks are support.parity's) ------------------------


@pytest.mark.parametrize("config", ["gemma4-file"])
@pytest.mark.parametrize("name", IMAGE_CASES)
def test_files(corpus: dict[str, Path], config: str, name: str) -> None:
    """Encoded files: our decoder + processor vs ``load_image`` + the PIL backend."""
    check_files(corpus, config, name)


@pytest.mark.parametrize("config", ["gemma4-70", "gemma4-1120"])
@pytest.mark.parametrize("name", IMAGE_CASES)
def test_budgets(corpus: dict[str, Path], config: str, name: str) -> None:
    """The smallest and largest soft-token budgets."""
    check_files(corpus, config, name)


@pytest.mark.parametrize("config", ["gemma4-defaults"])
@pytest.mark.parametrize("name", IMAGE_CASES)
def test_pil_inputs(corpus: dict[str, Path], config: str, name: str) -> None:
    """PIL images and encoded bytes with ``alpha="white"``."""
    check_pil_inputs(corpus, config, name)


@pytest.mark.parametrize("config", ["gemma4-file"])
@pytest.mark.parametrize("channels", [1, 2, 4])
def test_raw_arrays(config: str, channels: int) -> None:
    """1- and 4-channel arrays (transformers' ``convert_to_rgb`` for numpy)."""
    check_raw_arrays(config, channels)


@pytest.mark.parametrize("config", configs_of("gemma4"))
def test_batches(corpus: dict[str, Path], config: str) -> None:
    """Images of mixed sizes and kinds in one call (processed in parallel, in order)."""
    check_batches(corpus, config)


OPTIONS: list[dict[str, Any]] = [
    {"max_soft_tokens": 140},
    {"max_soft_tokens": 560, "resample": 2},  # bilinear
    {"resample": 1},  # lanczos
    {"resample": 0},  # nearest
    {"resample": 4, "max_soft_tokens": 70},  # box
    {"resample": 5},  # hamming
    {"patch_size": 14, "pooling_kernel_size": 2},
    {"patch_size": 8, "pooling_kernel_size": 1, "max_soft_tokens": 70},
    {"do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
    {"do_normalize": True, "image_mean": [0.1, 0.2, 0.3], "image_std": [2.0, 0.4, 0.9]},
    {"rescale_factor": 0.5},
    {"do_rescale": False},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda v: str(v))
def test_options(options: dict[str, Any]) -> None:
    """Other budgets, kernels, filters and switches, on a batch of two sizes."""
    check_options("gemma4", options)


# ---- random shapes: 1 x 1, strips, exact sizes, large ---------------------------------------

SIZES = [
    (1, 1),
    (1, 2),
    (2, 1),
    (1, 5000),
    (5000, 1),
    (3, 900),
    (7, 10000),
    (10, 200),
    (47, 48),
    (48, 48),
    (768, 768),  # exactly the default's size: no resize
    (767, 769),
    (480, 640),
    (1080, 1920),
    (333, 257),
    (4000, 30),
]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("budget", [70, 280, 1120])
def test_random_shapes(size: tuple[int, int], budget: int) -> None:
    h, w = size
    rng = np.random.default_rng(h * 7919 + w + budget)
    array = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    ref = run_hf(
        Gemma4ImageProcessorPil(max_soft_tokens=budget),
        [array],
        input_data_format="channels_last",
    )
    ours = ImageProcessor("gemma4", {"max_soft_tokens": budget})([array])
    assert_matches(ours, ref, f"{h}x{w} at {budget}")
    assert ours.num_image_tokens == tuple(int(n) for n in ref["num_soft_tokens_per_image"])


def test_random_batch() -> None:
    rng = np.random.default_rng(5)
    arrays = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in SIZES[::2]]
    ref = run_hf(Gemma4ImageProcessorPil(), arrays, input_data_format="channels_last")
    for threads in (1, 4):
        assert_matches(ImageProcessor.for_family("gemma4")(arrays, threads=threads), ref, "batch")


def test_no_resize() -> None:
    """``do_resize`` off: an image whose sides are patch multiples is patched as it is; any
    other is refused (transformers' reshape fails on it), as is one beyond the budget."""
    rng = np.random.default_rng(9)
    array = rng.integers(0, 256, (96, 160, 3), dtype=np.uint8)
    ref = run_hf(
        Gemma4ImageProcessorPil(do_resize=False), [array], input_data_format="channels_last"
    )
    ours = ImageProcessor("gemma4", {"do_resize": False})
    assert_matches(ours([array]), ref, "do_resize off")
    with pytest.raises(ImageShapeError, match="divisible by patch_size 16"):
        ours([array[:95]])
    with pytest.raises(ImageShapeError, match="at most 630 patches"):
        ImageProcessor("gemma4", {"do_resize": False, "max_soft_tokens": 70})(
            [np.zeros((640, 640, 3), np.uint8)]
        )


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("max_soft_tokens", 100),
        ("max_soft_tokens", 0),
        ("max_soft_tokens", 280.0),
        ("patch_size", 0),
        ("pooling_kernel_size", -3),
        ("patch_size", "16"),
    ],
)
def test_config_errors(key: str, value: Any) -> None:
    with pytest.raises(ProcessorConfigError, match=key):
        ImageProcessor("gemma4", {key: value})


def test_reference_refuses_the_same_budgets() -> None:
    with pytest.raises(ValueError, match="max_soft_tokens"):
        Gemma4ImageProcessorPil(max_soft_tokens=100)


def test_videos_are_refused() -> None:
    frames = [np.zeros((32, 32, 3), np.uint8)] * 2
    with pytest.raises(ProcessorConfigError, match="video"):
        ImageProcessor.for_family("gemma4")(videos=[frames])


def test_from_pretrained_file(tmp_path: Path) -> None:
    import json

    from support.parity import GEMMA4_FILE

    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({**GEMMA4_FILE, "max_soft_tokens": 560, "size": None})
    )
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "gemma4", "image_token_id": 7, "boi_token_id": 8})
    )
    model = VisionModel.from_pretrained(tmp_path)
    assert model.family == "gemma4"
    assert model.image_token_id == 7
    array = np.zeros((100, 100, 3), np.uint8)
    media = model.prepare([array])
    assert media.output.tensors()["pixel_values"].shape == (1, 560 * 9, 768)
    ids, _ = expand_placeholders([7], [media])
    # a square at 560 soft tokens: 23 x 23 blocks of 48 px = 529 soft tokens
    assert ids.tolist() == [BOI, *[7] * 529, EOI]


# ---- the expanded prompt is Gemma4Processor's ------------------------------------------------


def _processor(outputs: dict[str, Any]) -> Any:
    """``Gemma4Processor`` whose image processor hands back our outputs (whose bit-exactness the
    tests above cover); its video processor is torch-only and unused for images, so none is
    given (the class check for it needs torch)."""
    from transformers import BatchFeature
    from transformers.models.gemma4.feature_extraction_gemma4 import (
        Gemma4AudioFeatureExtractor,
    )
    from transformers.models.gemma4.processing_gemma4 import Gemma4Processor

    class Outputs(Gemma4ImageProcessorPil):
        model_input_names: ClassVar[list[str]] = ["pixel_values"]

        def __call__(self, images: Any, **kwargs: Any) -> Any:
            return BatchFeature(outputs)

        preprocess = __call__

    class WithoutVideo(Gemma4Processor):
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return WithoutVideo(
        feature_extractor=Gemma4AudioFeatureExtractor(),
        image_processor=Outputs(),
        tokenizer=gemma4_tokenizer(),
        video_processor=None,
    )


@pytest.mark.parametrize(
    "sizes",
    [[(1, 1)], [(480, 640)], [(3, 900)], [(1080, 1920), (20, 30), (5000, 1)]],
    ids=["tiny", "photo", "strip", "3-images"],
)
@pytest.mark.parametrize("budget", [70, 280])
def test_input_ids_equal_gemma4_processor(sizes: list[tuple[int, int]], budget: int) -> None:
    rng = np.random.default_rng(len(sizes) + budget)
    arrays = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    media = VisionModel.for_family("gemma4", config={"max_soft_tokens": budget}).prepare(arrays)
    out = media.output.tensors()
    processor = _processor(
        {
            "pixel_values": out["pixel_values"],
            "image_position_ids": out["image_position_ids"],
            "num_soft_tokens_per_image": out["num_soft_tokens_per_image"].tolist(),
        }
    )
    text = "describe " + " and ".join(["<|image|>"] * len(sizes)) + " compare"
    images = [Image.new("RGB", (w, h)) for h, w in sizes]
    want = processor(text=text, images=images, return_tensors=None)["input_ids"][0]
    prompt = gemma4_tokenizer()(text)["input_ids"]
    ids, ranges = expand_placeholders(prompt, [media])
    assert ids.tolist() == list(want)
    # the token counts are transformers' own _get_num_multimodal_tokens
    counts = processor._get_num_multimodal_tokens(
        image_sizes=sizes, images_kwargs={"max_soft_tokens": budget}
    )["num_image_tokens"]
    assert list(media.token_counts) == counts
    for (offset, length), n in zip(ranges[0], counts, strict=True):
        assert length == n + 2
        assert ids[offset] == BOI
        assert ids[offset + length - 1] == EOI


def test_for_family_uses_the_published_ids() -> None:
    model = VisionModel.for_family("gemma4")
    assert model.image_token_id == IMAGE
    assert dict(model.token_ids) == {"<|image>": BOI, "<image|>": EOI, "<|image|>": IMAGE}
    media = model.prepare([np.zeros((1000, 1000, 3), np.uint8)])
    ids, _ = expand_placeholders([IMAGE], [media])
    assert ids.tolist() == [BOI, *[IMAGE] * 256, EOI]
    (tokens, embed) = media.replacements[0]
    assert embed.tolist() == [False, *[True] * 256, False]
    assert tokens.tolist() == ids.tolist()


def test_assert_same_catches_a_changed_value() -> None:
    """The comparison used above fails on one changed patch value."""
    ours = ImageProcessor.for_family("gemma4")([np.full((50, 50, 3), 7, np.uint8)])
    assert ours.pixel_values is not None
    changed = ours.pixel_values.copy()
    changed[0, 0, 0] += 1e-3
    with pytest.raises(AssertionError, match="1 of"):
        assert_same(ours.pixel_values, changed, "pixel_values")
