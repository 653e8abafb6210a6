"""MiniMax-M3-VL (``minimax_m3_vl``): the configuration as ``MiniMaxM3VLImageProcessor.__init__``
reads it, the model types that name it, and what is refused. Its pixels are checked bit for bit
against transformers' torchvision class by the torch goldens
(``tests/goldens/torch/minimax_m3_vl.json``, ``tests/vision/test_torch_family_goldens.py``); its
prompt replacement and engines by ``tests/engines/test_minimax_m3_vl_engines.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from smg_grpc_proto import _native
from smg_grpc_proto.errors import ProcessorConfigError
from smg_grpc_proto.vision import ImageProcessor

DEFAULT_SIZE = {"shortest_edge": 3136, "longest_edge": 451584}
# What the published MiniMax-M3 preprocessor_config.json holds (its bounds, the SMG gateway's
# documented 4·28² … 576·28²; size [672, 672], which the class replaces by its default).
PUBLISHED = {
    "image_processor_type": "MiniMaxM3VLImageProcessor",
    "processor_class": "MiniMaxM3VLProcessor",
    "size": [672, 672],
    "min_pixels": 3136,
    "max_pixels": 451584,
    "patch_size": 14,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
}


def test_defaults_and_the_published_file(tmp_path: Path) -> None:
    defaults = ImageProcessor.for_family("minimax_m3_vl").config
    assert defaults["size"] == DEFAULT_SIZE
    assert (defaults["patch_size"], defaults["merge_size"], defaults["temporal_patch_size"]) == (
        14,
        2,
        2,
    )
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(PUBLISHED))
    processor = ImageProcessor.from_pretrained(tmp_path)
    assert processor.family == "minimax_m3_vl"
    assert processor.config == defaults
    for name in ("MiniMaxM3VLImageProcessor", "MiniMaxM3VLImageProcessorFast"):
        assert ImageProcessor.from_pretrained({"image_processor_type": name}).family == (
            "minimax_m3_vl"
        )


@pytest.mark.parametrize(
    ("config", "size"),
    [
        ({"size": [672, 672]}, DEFAULT_SIZE),
        (
            {"size": [672, 672], "max_pixels": 1_003_520},
            {**DEFAULT_SIZE, "longest_edge": 1_003_520},
        ),
        ({"min_pixels": 50_176}, {**DEFAULT_SIZE, "shortest_edge": 50_176}),
        (
            {"size": {"shortest_edge": 100, "longest_edge": 200}, "max_pixels": 300},
            {"shortest_edge": 100, "longest_edge": 300},
        ),
        (
            {"size": {"shortest_edge": 100}, "max_pixels": 300},
            {"shortest_edge": 100, "longest_edge": 300},
        ),
    ],
)
def test_size_as_init_reads_it(config: dict[str, Any], size: dict[str, int]) -> None:
    processor = ImageProcessor.from_pretrained(
        {"image_processor_type": "MiniMaxM3VLImageProcessor", **config}
    )
    assert processor.config["size"] == size


@pytest.mark.parametrize("model_type", ["minimax_m3_vl", "minimax_m3"])
def test_model_types(model_type: str) -> None:
    """transformers' model type, and the name the SMG gateway (1.13) registers MiniMax-M3 under."""
    assert _native.family_of_model_type(model_type) == "minimax_m3_vl"
    assert ImageProcessor.from_pretrained({"model_type": model_type}).family == "minimax_m3_vl"


@pytest.mark.parametrize(
    ("config", "field"),
    [
        # transformers' resize needs both bounds: a partial size raises there
        ({"size": {"shortest_edge": 200_704}}, "size"),
        # any other list is a height/width size (or, with min/max_pixels, a TypeError)
        ({"size": [448, 448]}, "size"),
        # only the fused rescale-and-normalize path and torch's bilinear/bicubic are ported
        ({"do_normalize": False}, "do_normalize"),
        ({"do_rescale": False}, "do_rescale"),
        ({"resample": 1}, "resample"),
        ({"patch_size": 0}, "patch_size"),
    ],
)
def test_config_errors(config: dict[str, Any], field: str) -> None:
    with pytest.raises(ProcessorConfigError) as error:
        ImageProcessor("minimax_m3_vl", config)
    assert error.value.field.startswith(field)


def test_videos_are_refused() -> None:
    """MiniMaxM3VLVideoProcessor (chunked grids, per-frame timestamp text) is not reproduced."""
    frames = [np.zeros((56, 56, 3), np.uint8)] * 2
    with pytest.raises(ProcessorConfigError, match="MiniMaxM3VLVideoProcessor") as error:
        ImageProcessor.for_family("minimax_m3_vl")(videos=[frames])
    assert error.value.field == "videos"


def test_aspect_ratio_and_do_resize_errors() -> None:
    """transformers' smart_resize refuses more than 200:1; with do_resize off the sides must be
    multiples of patch_size x merge_size (its reshape fails otherwise)."""
    with pytest.raises(ValueError, match="200"):
        ImageProcessor.for_family("minimax_m3_vl")(np.zeros((1, 201, 3), np.uint8))
    with pytest.raises(ValueError, match="multiple of patch_size x merge_size"):
        ImageProcessor("minimax_m3_vl", {"do_resize": False})(np.zeros((41, 56, 3), np.uint8))
    out = ImageProcessor("minimax_m3_vl", {"do_resize": False})(np.zeros((28, 56, 3), np.uint8))
    assert out.image_grid_thw is not None
    assert out.image_grid_thw.tolist() == [[1, 2, 4]]
