"""Pixtral (``PixtralImageProcessorPil``): ``vision.ImageProcessor`` against transformers,
live and bit for bit — every input kind and option, sizes, padding, spatial merge and
``PixtralProcessor``'s token counts, configuration errors, the CLI. The reference, the test
images and the comparison: ``support/parity.py``.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from support.parity import (
    CONFIGS,
    IMAGE_CASES,
    META,
    PIXTRAL_1540,
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
    our_processor,
    pattern,
    reference_mark,
    run_hf,
)

from smg_grpc_proto.errors import (
    BatchShapeError,
    ImageShapeError,
    ProcessorConfigError,
)
from smg_grpc_proto.vision import ImageProcessor

pytest.importorskip("transformers", reason="the reference is transformers")
pytest.importorskip("PIL", reason="the reference resizer is Pillow")

from PIL import Image
from transformers import PixtralImageProcessorPil

pytestmark = reference_mark()


# ---- parity on every input kind (the checks are support.parity's) ------------------------


@pytest.mark.parametrize("config", configs_of("pixtral"))
@pytest.mark.parametrize("name", IMAGE_CASES)
def test_files(corpus: dict[str, Path], config: str, name: str) -> None:
    """Encoded files: our decoder + processor vs ``load_image`` + the PIL backend."""
    check_files(corpus, config, name)


@pytest.mark.parametrize("config", ["pixtral-defaults"])
@pytest.mark.parametrize("name", IMAGE_CASES)
def test_pil_inputs(corpus: dict[str, Path], config: str, name: str) -> None:
    """PIL images and encoded bytes with ``alpha="white"``."""
    check_pil_inputs(corpus, config, name)


@pytest.mark.parametrize("config", ["pixtral-1540"])
@pytest.mark.parametrize("channels", [1, 2, 4])
def test_raw_arrays(config: str, channels: int) -> None:
    """1- and 4-channel arrays (transformers' ``convert_to_rgb`` for numpy)."""
    check_raw_arrays(config, channels)


@pytest.mark.slow
@pytest.mark.parametrize("config", configs_of("pixtral"))
def test_batches(corpus: dict[str, Path], config: str) -> None:
    """Images of mixed sizes and kinds in one call (processed in parallel, in order)."""
    check_batches(corpus, config)


OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("pixtral", {"size": {"longest_edge": 512}}),
    ("pixtral", {"size": {"longest_edge": 200}, "patch_size": 14}),
    ("pixtral", {"size": {"longest_edge": 150}, "patch_size": {"height": 14, "width": 16}}),
    ("pixtral", {"size": {"height": 100, "width": 230}}),  # separate bounds
    ("pixtral", {"size": 128}),  # an int is {"height": 128, "width": 128} here
    ("pixtral", {"size": [90, 120], "patch_size": 8}),
    ("pixtral", {"size": {"shortest_edge": 10, "longest_edge": 180}}),  # shortest unused
    ("pixtral", {"do_resize": False}),
    ("pixtral", {"do_normalize": False}),
    ("pixtral", {"do_rescale": False, "do_normalize": False}),
    (
        "pixtral",
        {"rescale_factor": 0.5, "image_mean": [0.1, 0.2, 0.3], "image_std": [2.0, 0.4, 0.9]},
    ),
    ("pixtral", {"do_rescale": False, "image_mean": [100.0, 110.0, 120.0], "image_std": 50.0}),
    ("pixtral", {"resample": 2, "size": {"longest_edge": 100}}),  # bilinear
    ("pixtral", {"resample": 1, "size": {"longest_edge": 170}}),  # lanczos
    ("pixtral", {"resample": 0}),  # nearest
    ("pixtral", {"do_center_crop": True, "crop_size": 120}),
    ("pixtral", {"do_center_crop": True, "crop_size": {"height": 300, "width": 90}}),  # padded
]


@pytest.mark.parametrize(("family", "options"), OPTIONS, ids=lambda v: str(v))
def test_options(family: str, options: dict[str, Any]) -> None:
    """Other filters, sizes, crops, paddings and switches, on a batch of two sizes."""
    check_options(family, options)


# ---- Pixtral details: sizes, padding, spatial merge, tokens --------------------------------

PIXTRAL_CONFIGS = ("pixtral-defaults", "pixtral-1540")
# (height, width): tiny, thin, exact patch multiples, just below / at / above the longest edge.
PIXTRAL_SIZES = [
    (1, 1),
    (2, 2000),
    (2000, 2),
    (15, 17),
    (16, 16),
    (32, 48),
    (14, 28),
    (1008, 1024),
    (1023, 1023),
    (1024, 1024),
    (1025, 1025),
    (1024, 1025),
    (1040, 16),
    (1539, 1541),
    (1500, 2000),
    (3000, 500),
]


def _pixtral_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in META}


def _pixtral_replace_image_token() -> Any:
    """``PixtralProcessor.replace_image_token`` from the installed transformers. Its module
    imports torch (absent here), so the method's source is compiled on its own."""
    spec = importlib.util.find_spec("transformers.models.pixtral")
    assert spec is not None
    assert spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / "processing_pixtral.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "PixtralProcessor")
    fn = next(
        n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "replace_image_token"
    )
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), namespace)
    return namespace["replace_image_token"]


def _pixtral_token_count(ref: Any, index: int, patch_size: int, merge: int) -> int:
    """``PixtralProcessor.replace_image_token`` run on transformers' own output."""
    fake = SimpleNamespace(
        patch_size=patch_size,
        spatial_merge_size=merge,
        image_token="[IMG]",
        image_break_token="[IMG_BREAK]",
        image_end_token="[IMG_END]",
    )
    text = _pixtral_replace_image_token()(fake, ref, index)
    return int(text.count("[IMG"))


@pytest.mark.slow
@pytest.mark.parametrize(("height", "width"), PIXTRAL_SIZES)
def test_pixtral_sizes(height: int, width: int) -> None:
    """Odd sizes, as arrays and as PNG bytes, with the default and the 1540 / patch-14 config."""
    array = pattern(height, width, 31)
    png = encode(Image.fromarray(array), "PNG")
    for config in PIXTRAL_CONFIGS:
        ref = run_hf(hf_processor(config), array, input_data_format="channels_last")
        ours = our_processor(config)
        assert_matches(ours(array), ref, f"{config} {height}x{width} array")
        assert_matches(ours(png), ref, f"{config} {height}x{width} bytes")
        patch = ours.config["patch_size"]["height"]
        assert ours(array).num_image_tokens == (_pixtral_token_count(ref, 0, patch, 1),)


@pytest.mark.parametrize(("height", "width"), [(1, 2000), (2000, 1), (1, 1100), (3, 5000)])
def test_pixtral_side_floored_to_zero(height: int, width: int) -> None:
    """A side that ``floor(side / ratio)`` makes 0: transformers fails, we say why."""
    array = pattern(height, width, 32)
    with pytest.raises(ValueError, match="Size must contain"):  # it asks for a size of 0
        run_hf(hf_processor("pixtral-defaults"), array, input_data_format="channels_last")
    ours = our_processor("pixtral-defaults")
    with pytest.raises(ImageShapeError, match="resized size") as caught:
        ours([pattern(40, 40, 1), array])
    assert caught.value.index == 1
    assert caught.value.field == "resized size"


@pytest.mark.slow
@pytest.mark.parametrize("merge", [1, 2])
@pytest.mark.parametrize("config", PIXTRAL_CONFIGS)
def test_pixtral_batches_and_tokens(corpus: dict[str, Path], config: str, merge: int) -> None:
    """A batch of mixed sizes and kinds, padded to the largest; with ``spatial_merge_size``
    the sizes are those ``PixtralProcessor`` gets (it calls the image processor with
    ``patch_size * spatial_merge_size``) and the token counts its ``replace_image_token``'s."""
    names = ["grace_hopper.jpg", "wide-3x600.png", "rgba.png", "tall-3000x500.jpg", "exif6.jpg"]
    loaded = [hf_load(corpus[n]) for n in names]
    family, raw = CONFIGS[config]
    hf = hf_processor(config)
    patch = int(hf.patch_size["height"])
    ref = run_hf(hf, loaded, patch_size=patch * merge) if merge > 1 else run_hf(hf, loaded)
    ours = ImageProcessor(family, {**(raw or {}), "spatial_merge_size": merge})  # type: ignore[arg-type]
    paths = [str(corpus[n]) for n in names]
    out = ours(paths)
    assert_matches(out, ref, f"{config} merge {merge} batch")
    assert set(out.tensors()) == {"pixel_values", "image_sizes"}
    mixed: list[Any] = [corpus[names[0]].read_bytes(), np.asarray(loaded[1]), loaded[2], *paths[3:]]
    assert_matches(ours(mixed, threads=1), ref, f"{config} merge {merge} mixed inputs")
    want = tuple(_pixtral_token_count(ref, i, patch, merge) for i in range(len(names)))
    assert out.num_image_tokens == want


def test_pixtral_padding_switches() -> None:
    """``do_pad`` off: equal sizes stack, mixed sizes fail in both; ``do_resize`` off keeps the
    sizes (and still pads the batch)."""
    same = [pattern(100, 90, 1), pattern(100, 90, 2)]
    mixed = [pattern(100, 90, 3), pattern(33, 250, 4), pattern(7, 5, 5)]
    hf = PixtralImageProcessorPil(do_pad=False)
    ours = ImageProcessor("pixtral", {"do_pad": False})
    ref = run_hf(hf, same, input_data_format="channels_last")
    assert_matches(ours(same), ref, "no pad, same sizes")
    with pytest.raises(ValueError, match="inhomogeneous"):
        run_hf(hf, mixed, input_data_format="channels_last")
    with pytest.raises(BatchShapeError, match="do_pad"):
        ours(mixed)
    hf = PixtralImageProcessorPil(do_resize=False)
    ref = run_hf(hf, mixed, input_data_format="channels_last")
    out = ImageProcessor("pixtral", {"do_resize": False})(mixed)
    assert_matches(out, ref, "no resize")
    assert out.image_sizes is not None
    assert out.image_sizes.tolist() == [[100, 90], [33, 250], [7, 5]]
    assert out.num_image_tokens == (6 * 6, 2 * 16, 0)


def test_pixtral_from_pretrained(tmp_path: Path) -> None:
    """The family from every backend's class name; a model directory's processor_config.json
    supplies PixtralProcessor's patch size and spatial merge."""
    for suffix in ("", "Fast", "Pil"):
        ours = ImageProcessor.from_pretrained(
            {"image_processor_type": f"PixtralImageProcessor{suffix}"}
        )
        assert ours.family == "pixtral"
        assert ours.config["spatial_merge_size"] == 1
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(PIXTRAL_1540))
    (tmp_path / "processor_config.json").write_text(
        json.dumps(
            {"patch_size": 14, "spatial_merge_size": 2, "processor_class": "PixtralProcessor"}
        )
    )
    ours = ImageProcessor.from_pretrained(tmp_path)
    assert ours.config["patch_size"] == {"height": 14, "width": 14}
    assert ours.config["spatial_merge_size"] == 2
    array = pattern(1200, 1700, 33)
    hf = PixtralImageProcessorPil(**_pixtral_kwargs(PIXTRAL_1540))
    ref = run_hf(hf, array, input_data_format="channels_last", patch_size=28)
    out = ours(array)
    assert_matches(out, ref, "model directory")
    assert out.num_image_tokens == (_pixtral_token_count(ref, 0, 14, 2),)
    # The image processor alone (a dict, no processor_config.json) rounds to 14.
    alone = ImageProcessor.from_pretrained(PIXTRAL_1540)(array)
    assert_matches(alone, run_hf(hf, array, input_data_format="channels_last"), "alone")


PIXTRAL_BAD: list[tuple[dict[str, Any], str, bool]] = [
    # (config, the field named, whether transformers rejects it too)
    ({"size": {"shortest_edge": 100}}, "size", True),
    ({"size": {"longest_edge": 0}}, "size", True),
    ({"size": {"max_height": 100, "max_width": 100}}, "size", True),
    ({"size": {"longest_edge": 70000}}, "size", False),
    ({"patch_size": 0}, "patch_size", False),
    ({"patch_size": {"height": 0, "width": 16}}, "patch_size", True),
    ({"patch_size": {"height": 16}}, "patch_size", True),
    ({"patch_size": {"shortest_edge": 16}}, "patch_size", True),
    ({"patch_size": 2000}, "patch_size", False),
    ({"spatial_merge_size": 0}, "spatial_merge_size", False),
    ({"spatial_merge_size": 1.5}, "spatial_merge_size", False),
    ({"do_center_crop": True}, "crop_size", True),
    ({"do_pad": "yes"}, "do_pad", False),
    ({"resample": 9}, "resample", False),
    ({"image_std": [0.5, 0.5]}, "image_std", False),
    ({"do_center_crop": True, "crop_size": {"shortest_edge": 5}}, "crop_size", False),
]


@pytest.mark.parametrize(("config", "field", "hf_rejects"), PIXTRAL_BAD, ids=str)
def test_pixtral_config_errors(config: dict[str, Any], field: str, hf_rejects: bool) -> None:
    with pytest.raises(ProcessorConfigError) as caught:
        ImageProcessor("pixtral", config)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"config {field}:")
    if hf_rejects:
        with pytest.raises(ValueError, match=r"size|crop_size"):
            run_hf(
                PixtralImageProcessorPil(**config),
                pattern(40, 30, 1),
                input_data_format="channels_last",
            )


def test_pixtral_cli(corpus: dict[str, Path], tmp_path: Path) -> None:
    """``smg-proto preprocess --family pixtral`` writes transformers' tensors."""
    from smg_grpc_proto import cli

    names = ["grace_hopper.jpg", "odd-37x23.png", "small-50x80.png"]
    out = tmp_path / "pixtral.npz"
    paths = [str(corpus[n]) for n in names]
    assert cli.main(["preprocess", *paths, "--family", "pixtral", "--out", str(out)]) == 0
    ref = run_hf(hf_processor("pixtral-defaults"), [hf_load(p) for p in paths])
    with np.load(out) as written:
        for key in ("pixel_values", "image_sizes"):
            assert_same(written[key], ref[key], f"cli {key}")
