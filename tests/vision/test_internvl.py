"""InternVL (``GotOcr2ImageProcessorPil`` as ``InternVLProcessor`` runs it):
``vision.ImageProcessor`` against transformers, live and bit for bit — every input kind and
option, tiles and thumbnail, ``num_patches`` and token counts, configuration errors, the CLI.
The reference, the test images and the comparison: ``support/parity.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.parity import (
    CLIP_MEAN,
    CLIP_STD,
    IMAGE_CASES,
    INTERNVL_HUB,
    assert_matches,
    assert_same,
    check_batches,
    check_files,
    check_options,
    check_pil_inputs,
    check_raw_arrays,
    configs_of,
    encode,
    hf_load,
    hf_processor,
    internvl_hf,
    internvl_processor_defaults,
    our_processor,
    pattern,
    reference_mark,
    run_hf,
)

from smg_grpc_proto.errors import (
    BatchShapeError,
    ProcessorConfigError,
)
from smg_grpc_proto.vision import ImageProcessor

pytest.importorskip("transformers", reason="the reference is transformers")
pytest.importorskip("PIL", reason="the reference resizer is Pillow")

from PIL import Image
from transformers import GotOcr2ImageProcessorPil
from transformers.image_utils import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from transformers.models.internvl.processing_internvl import InternVLProcessor

pytestmark = reference_mark()


# ---- parity on every input kind (the checks are support.parity's) ------------------------


@pytest.mark.parametrize("config", configs_of("internvl"))
@pytest.mark.parametrize("name", IMAGE_CASES)
def test_files(corpus: dict[str, Path], config: str, name: str) -> None:
    """Encoded files: our decoder + processor vs ``load_image`` + the PIL backend."""
    check_files(corpus, config, name)


@pytest.mark.parametrize("config", ["internvl-defaults"])
@pytest.mark.parametrize("name", IMAGE_CASES)
def test_pil_inputs(corpus: dict[str, Path], config: str, name: str) -> None:
    """PIL images and encoded bytes with ``alpha="white"``."""
    check_pil_inputs(corpus, config, name)


@pytest.mark.parametrize("config", ["internvl-defaults"])
@pytest.mark.parametrize("channels", [1, 2, 4])
def test_raw_arrays(config: str, channels: int) -> None:
    """1- and 4-channel arrays (transformers' ``convert_to_rgb`` for numpy)."""
    check_raw_arrays(config, channels)


@pytest.mark.slow
@pytest.mark.parametrize("config", configs_of("internvl"))
def test_batches(corpus: dict[str, Path], config: str) -> None:
    """Images of mixed sizes and kinds in one call (processed in parallel, in order)."""
    check_batches(corpus, config)


OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("internvl", {"size": {"height": 224, "width": 224}}),
    ("internvl", {"size": 100}),  # an int is {"height": 100, "width": 100} here
    ("internvl", {"size": [120, 200]}),  # non-square tiles
    ("internvl", {"resample": 0, "size": 64}),  # nearest
    ("internvl", {"resample": 1, "size": 96}),  # lanczos
    ("internvl", {"resample": 2, "size": 128}),  # bilinear
    ("internvl", {"resample": 4, "size": {"height": 50, "width": 70}}),  # box
    ("internvl", {"resample": 5, "size": 130}),  # hamming
    ("internvl", {"do_resize": False}),  # tiling resizes anyway
    ("internvl", {"do_resize": False, "crop_to_patches": False}),
    ("internvl", {"crop_to_patches": False}),
    ("internvl", {"crop_to_patches": False, "size": [150, 90]}),
    ("internvl", {"crop_to_patches": False, "size": 300}),
    ("internvl", {"do_normalize": False, "size": 64}),
    ("internvl", {"do_rescale": False, "do_normalize": False, "size": 64}),
    (
        "internvl",
        {"rescale_factor": 0.5, "image_mean": [0.1, 0.2, 0.3], "image_std": [2.0, 0.4, 0.9]},
    ),
    ("internvl", {"image_mean": CLIP_MEAN, "image_std": CLIP_STD, "size": 384}),  # the class's
    ("internvl", {"min_patches": 4, "size": 64}),
    ("internvl", {"min_patches": 6, "max_patches": 6, "size": 64}),
    ("internvl", {"min_patches": 5, "max_patches": 3, "size": 64}),  # no grid: 1 x 1
    ("internvl", {"max_patches": 1}),  # no tiling
    ("internvl", {"max_patches": 2, "size": 80}),
    ("internvl", {"max_patches": 6, "size": 50}),
    ("internvl", {"max_patches": 40, "size": 32}),
    ("internvl", {"min_patches": 2, "max_patches": 24, "size": [30, 60]}),
]


@pytest.mark.parametrize(("family", "options"), OPTIONS, ids=lambda v: str(v))
def test_options(family: str, options: dict[str, Any]) -> None:
    """Other filters, sizes, crops, paddings and switches, on a batch of two sizes."""
    check_options(family, options)


# ---- InternVL details: tiles, thumbnail, num_patches, tokens ------------------------------

INTERNVL_CONFIGS = ("internvl-defaults", "internvl-single")
# (height, width): tiny, thin, exact tile multiples, ties of the grid choice (a square image
# goes to 2 x 2 once it covers half of 4 tiles, 634² > 0.5·448²·4 > 633², to 3 x 3 past 950;
# 2:1 to 4 x 2 past 633 x 1266), near-squares, and photos' shapes.
INTERNVL_SIZES = [
    (1, 1),
    (1, 3000),
    (3000, 1),
    (2, 2000),
    (448, 448),
    (448, 896),
    (896, 448),
    (1344, 1344),
    (448, 5376),
    (5376, 448),
    (633, 633),
    (634, 634),
    (950, 950),
    (951, 951),
    (633, 1266),
    (634, 1268),
    (447, 449),
    (1023, 1025),
    (10, 20),
    (500, 1500),
    (1500, 2000),
    (1080, 1920),
]


def _internvl_token_count(ref: Any, index: int, image_seq_length: int) -> int:
    """``InternVLProcessor.replace_image_token`` run on transformers' own output, on a
    processor given just the attributes the method reads (its ``__init__`` needs a real
    tokenizer)."""
    processor = InternVLProcessor.__new__(InternVLProcessor)
    processor.image_seq_length = image_seq_length
    processor.start_image_token = "<img>"
    processor.end_image_token = "</img>"
    processor.image_token = "<IMG_CONTEXT>"
    text = processor.replace_image_token({"num_patches": ref["num_patches"].tolist()}, index)
    assert text.startswith("<img>")
    assert text.endswith("</img>")
    return int(text.count("<IMG_CONTEXT>"))


@pytest.mark.slow
@pytest.mark.parametrize(("height", "width"), INTERNVL_SIZES)
def test_internvl_sizes(height: int, width: int) -> None:
    """Odd sizes, as arrays and as PNG bytes, tiled and not, with transformers' ``num_patches``
    and ``InternVLProcessor``'s token count."""
    array = pattern(height, width, 51)
    png = encode(Image.fromarray(array), "PNG")
    for config in INTERNVL_CONFIGS:
        ref = run_hf(hf_processor(config), array, input_data_format="channels_last")
        ours = our_processor(config)
        out = ours(array)
        assert_matches(out, ref, f"{config} {height}x{width} array")
        assert_matches(ours(png), ref, f"{config} {height}x{width} bytes")
        assert out.num_image_tokens == (_internvl_token_count(ref, 0, 256),)


def test_internvl_grid_ties() -> None:
    """The grid choice and its tie-breaking, against transformers' function, over many
    shapes, tile sizes and tile ranges (through the tiles each image gets)."""
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import (
        get_optimal_tiled_canvas,
    )

    cases = [
        ((h, w), (t, t), lo, hi)
        for h, w in [(633, 633), (634, 634), (3, 1), (1, 3), (7, 5), (600, 599), (30, 90)]
        for t in (448, 16)
        for lo, hi in [(1, 12), (2, 6), (3, 40), (1, 2)]
    ]
    for (h, w), (th, tw), lo, hi in cases:
        cols, rows = get_optimal_tiled_canvas((h, w), (th, tw), lo, hi)
        tiles = cols * rows
        out = ImageProcessor(
            "internvl", {"size": {"height": th, "width": tw}, "min_patches": lo, "max_patches": hi}
        )(pattern(h, w, 52))
        assert out.num_patches is not None
        assert out.num_patches.tolist() == [tiles + (tiles > 1)], (h, w, th, lo, hi)


@pytest.mark.slow
@pytest.mark.parametrize("config", INTERNVL_CONFIGS)
def test_internvl_batches_and_tokens(corpus: dict[str, Path], config: str) -> None:
    """A batch of mixed sizes and kinds: each image's tiles and thumbnail, in order."""
    names = [
        "grace_hopper.jpg",
        "wide-3x600.png",
        "rgba.png",
        "tall-3000x500.jpg",
        "big-1500x2000.jpg",
    ]
    loaded = [hf_load(corpus[n]) for n in names]
    ref = run_hf(hf_processor(config), loaded)
    ours = our_processor(config)
    paths = [str(corpus[n]) for n in names]
    out = ours(paths)
    assert_matches(out, ref, f"{config} batch")
    assert set(out.tensors()) == {"pixel_values", "num_patches"}
    mixed: list[Any] = [corpus[names[0]].read_bytes(), np.asarray(loaded[1]), loaded[2], *paths[3:]]
    assert_matches(ours(mixed, threads=1), ref, f"{config} mixed inputs")
    want = tuple(_internvl_token_count(ref, i, 256) for i in range(len(names)))
    assert out.num_image_tokens == want
    assert out.num_patches is not None
    if config == "internvl-defaults":
        assert int(out.num_patches.sum()) == out.pixel_values.shape[0]  # type: ignore[union-attr]
        assert min(out.num_patches.tolist()) >= 1
    else:
        assert out.num_patches.tolist() == [1] * len(names)


def test_internvl_resize_off() -> None:
    """``do_resize`` off without tiling: equal sizes stack, different ones cannot, in
    transformers or here."""
    same = [pattern(60, 150, 1), pattern(60, 150, 2)]
    options = {"do_resize": False, "crop_to_patches": False}
    ref = run_hf(internvl_hf(**options), same, input_data_format="channels_last")
    assert_matches(ImageProcessor("internvl", options)(same), ref, "no resize")
    mixed = [same[0], pattern(61, 150, 3)]
    with pytest.raises(ValueError, match="inhomogeneous"):
        run_hf(internvl_hf(**options), mixed, input_data_format="channels_last")
    with pytest.raises(BatchShapeError):
        ImageProcessor("internvl", options)(mixed)
    # Without tiling, any size dict (here the shortest edge) as PilBackend.resize reads it.
    edge = {"crop_to_patches": False, "size": {"shortest_edge": 200}}
    for image in (pattern(97, 244, 4), pattern(300, 30, 5)):
        ref = run_hf(internvl_hf(**edge), image, input_data_format="channels_last")
        assert_matches(ImageProcessor("internvl", edge)(image), ref, "shortest edge")


def test_internvl_from_pretrained(tmp_path: Path) -> None:
    """The family from every backend's class name; a file of InternVLProcessor's tiles (its
    crop_to_patches over the file's false); a model directory's processor_config.json supplies
    image_seq_length; a file read alone keeps its own crop_to_patches."""
    for suffix in ("", "Fast", "Pil"):
        ours = ImageProcessor.from_pretrained(
            {"image_processor_type": f"GotOcr2ImageProcessor{suffix}"}
        )
        assert ours.family == "internvl"
    hub = ImageProcessor.from_pretrained(INTERNVL_HUB)
    assert hub.config == ImageProcessor.for_family("internvl").config
    assert hub.config["crop_to_patches"] is internvl_processor_defaults()["crop_to_patches"]
    assert hub.config["image_mean"] == list(IMAGENET_DEFAULT_MEAN)
    assert hub.config["image_std"] == list(IMAGENET_DEFAULT_STD)
    # The class's own defaults differ from the published checkpoints' (documented).
    bare = GotOcr2ImageProcessorPil()
    assert (bare.size.height, bare.size.width) == (384, 384)
    assert bare.crop_to_patches is False
    assert (bare.min_patches, bare.max_patches, int(bare.resample)) == (1, 12, 3)
    assert list(bare.image_mean) == CLIP_MEAN
    # Keys GotOcr2ImageProcessorPil._preprocess ignores are ignored.
    ignored = ImageProcessor.from_pretrained(
        {**INTERNVL_HUB, "do_center_crop": True, "crop_size": 10, "do_pad": True}
    )
    assert ignored.config == hub.config
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({k: v for k, v in INTERNVL_HUB.items() if k != "processor_class"})
    )
    (tmp_path / "processor_config.json").write_text(
        json.dumps({"image_seq_length": 64, "processor_class": "InternVLProcessor"})
    )
    ours = ImageProcessor.from_pretrained(tmp_path)
    assert ours.config["image_seq_length"] == 64
    assert ours.config["crop_to_patches"] is True
    array = pattern(400, 1300, 53)
    ref = run_hf(internvl_hf(), array, input_data_format="channels_last")
    out = ours(array)
    assert_matches(out, ref, "model directory")
    assert out.num_patches is not None
    assert out.num_patches.tolist() == [4]  # 3 x 1 tiles and the thumbnail
    assert out.num_image_tokens == (_internvl_token_count(ref, 0, 64),) == (256,)
    # The preprocessor config alone, without InternVLProcessor: its own values.
    alone_config = {k: v for k, v in INTERNVL_HUB.items() if k != "processor_class"}
    alone = ImageProcessor.from_pretrained({**alone_config, "image_seq_length": 128})
    assert alone.config["crop_to_patches"] is False
    assert alone(array).num_image_tokens == (128,)


INTERNVL_BAD: list[tuple[dict[str, Any], str, type[BaseException] | None]] = [
    # (config, the field named, what transformers raises on it, if it does)
    ({"min_patches": 0}, "min_patches", None),  # transformers: as 1
    ({"min_patches": -3}, "min_patches", None),
    ({"min_patches": 1.5}, "min_patches", None),
    ({"min_patches": True}, "min_patches", None),
    ({"max_patches": 0}, "max_patches", None),  # transformers: silently no tiling
    ({"max_patches": -1}, "max_patches", None),
    # transformers: a TypeError from range(), unless its lru_cache already holds the grid of an
    # equal key with 12 (12.0 == 12 hashes alike), which this process's earlier cases do.
    ({"max_patches": 12.0}, "max_patches", None),
    ({"max_patches": 4097}, "max_patches", None),  # ours: at most 4096
    ({"crop_to_patches": "yes"}, "crop_to_patches", None),
    ({"crop_to_patches": 1}, "crop_to_patches", None),
    ({"image_seq_length": 0}, "image_seq_length", None),
    ({"image_seq_length": 1.5}, "image_seq_length", None),
    ({"size": {"height": 448}}, "size", ValueError),
    ({"size": {"shortest_edge": 448}}, "size", TypeError),  # tiles need height and width
    ({"size": {"height": 0, "width": 448}}, "size", ValueError),
    ({"size": {"height": 70000, "width": 448}}, "size", None),
    ({"resample": 9}, "resample", None),
    ({"image_mean": [0.5, 0.5]}, "image_mean", None),
    ({"rescale_factor": float("inf")}, "rescale_factor", None),
]


@pytest.mark.parametrize(("config", "field", "hf_error"), INTERNVL_BAD, ids=str)
def test_internvl_config_errors(
    config: dict[str, Any], field: str, hf_error: type[BaseException] | None
) -> None:
    with pytest.raises(ProcessorConfigError) as caught:
        ImageProcessor("internvl", config)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"config {field}:")
    if hf_error is not None:
        with pytest.raises(hf_error):
            run_hf(internvl_hf(**config), pattern(40, 130, 1), input_data_format="channels_last")


def test_internvl_cli(corpus: dict[str, Path], tmp_path: Path) -> None:
    """``smg-proto preprocess --family internvl`` writes transformers' tensors, num_patches
    too."""
    from smg_grpc_proto import cli

    names = ["grace_hopper.jpg", "odd-37x23.png", "small-50x80.png"]
    out = tmp_path / "internvl.npz"
    paths = [str(corpus[n]) for n in names]
    assert cli.main(["preprocess", *paths, "--family", "internvl", "--out", str(out)]) == 0
    ref = run_hf(hf_processor("internvl-defaults"), [hf_load(p) for p in paths])
    with np.load(out) as written:
        for key in ("pixel_values", "num_patches"):
            assert_same(written[key], ref[key], f"cli {key}")
