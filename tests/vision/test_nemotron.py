"""Nemotron-H-Omni (``nemotron_h_omni``): the pixels are torch-exact against the committed goldens
(``tests/goldens/torch/nemotron_h_omni.json``, checked by ``test_torch_family_goldens.py``);
here, what needs no torch: the expanded prompt equals ``NemotronH_Omni_Reasoning_V3Processor``'s
(``<img>`` + ``<image>`` * ``h * w // merge ** 2`` + ``</img>`` per image), the released
checkpoints' ``preprocessor_config.json`` keys, and what is refused (videos, unported steps).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")

from smg_grpc_proto import vision
from smg_grpc_proto.engines import VisionModel, expand_placeholders
from smg_grpc_proto.errors import ProcessorConfigError

# <image> / <img> / </img>: the published ids (reserved slots 18 - 20 renamed by the Omni
# tokenizer), which our defaults must equal: for_family() below passes no tokenizer.
SPECIAL = {"<image>": 18, "<img>": 19, "</img>": 20, "<video>": 21, "<so_embedding>": 22}
IMAGE, START, END = SPECIAL["<image>"], SPECIAL["<img>"], SPECIAL["</img>"]
VOCAB = {"<pad>": 0, "<unk>": 3, "describe": 1000, "and": 1001, "compare": 1002}


def _tokenizer() -> Any:
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({**VOCAB, **SPECIAL}, "<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\s]+"), behavior="removed", invert=True)
    backend.add_special_tokens(list(SPECIAL))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        pad_token="<pad>",
        additional_special_tokens=list(SPECIAL),
    )


def _processor(outputs: dict[str, Any], downsample_ratio: float) -> Any:
    """The transformers processor, its image processor handing back our outputs (the image
    processor class itself needs torch; the processor only reads ``image_grid_hw`` and
    ``downsample_ratio`` from it)."""
    from transformers import BatchFeature
    from transformers.models.nemotron_h_omni.processing_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3Processor,
    )

    class Outputs:
        model_input_names: list[str] = ["pixel_values", "image_grid_hw"]  # noqa: RUF012

        def __init__(self) -> None:
            self.downsample_ratio = downsample_ratio

        def __call__(self, images: Any, **kwargs: Any) -> Any:
            return BatchFeature(outputs)

    class ImagesOnly(NemotronH_Omni_Reasoning_V3Processor):
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            return None

    return ImagesOnly(
        image_processor=Outputs(),
        video_processor=None,
        tokenizer=_tokenizer(),
        feature_extractor=None,
    )


@pytest.mark.parametrize(
    "sizes",
    [[(1, 1)], [(480, 640)], [(5, 3000)], [(1080, 1920), (20, 30), (600, 512)]],
    ids=["tiny", "photo", "strip", "3-images"],
)
@pytest.mark.parametrize("config", [{}, {"downsample_ratio": 0.25, "max_model_len": 300}])
def test_input_ids_equal_the_processor(
    sizes: list[tuple[int, int]], config: dict[str, Any]
) -> None:
    rng = np.random.default_rng(len(sizes))
    arrays = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    media = VisionModel.for_family("nemotron_h_omni", config=config).prepare(arrays)
    out = media.output.tensors()
    grid = out["image_grid_hw"]
    processor = _processor(
        {"pixel_values": out["pixel_values"], "image_grid_hw": grid},
        config.get("downsample_ratio", 0.5),
    )
    text = "describe " + " and ".join(["<image>"] * len(sizes)) + " compare"
    want = processor(text=text, images=arrays, return_tensors=None)["input_ids"][0]
    prompt = _tokenizer()(text)["input_ids"]
    ids, ranges = expand_placeholders(prompt, [media])
    assert ids.tolist() == list(want)
    merge = round(1 / config.get("downsample_ratio", 0.5))
    counts = [int(h * w) // merge**2 for h, w in grid.tolist()]
    assert list(media.token_counts) == counts
    for (offset, length), n in zip(ranges[0], counts, strict=True):
        assert length == n + 2
        assert ids[offset] == START
        assert ids[offset + length - 1] == END
    # each image owns h*w rows of pixel_values, in order
    assert out["pixel_values"].shape[0] == int((grid[:, 0] * grid[:, 1]).sum())


def test_released_preprocessor_config(tmp_path: Path) -> None:
    """``norm_mean``/``norm_std`` stand in for absent ``image_mean``/``image_std`` and
    ``_downsample_factor`` is dropped, as the class's ``__init__`` does."""
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "NemotronH_Omni_Reasoning_V3ImageProcessor",
                "norm_mean": [0.5, 0.25, 0.125],
                "norm_std": [0.2, 0.3, 0.4],
                "_downsample_factor": 2,
                "max_num_patches": 4096,
            }
        )
    )
    processor = vision.ImageProcessor.from_pretrained(tmp_path)
    assert processor.family == "nemotron_h_omni"
    assert list(processor.config["image_mean"]) == [0.5, 0.25, 0.125]
    assert list(processor.config["image_std"]) == [0.2, 0.3, 0.4]
    assert processor.config["max_num_patches"] == 4096


@pytest.mark.parametrize("model_type", ["nemotron_h_omni", "NemotronH_Nano_Omni_Reasoning_V3"])
def test_model_type_names_the_family(tmp_path: Path, model_type: str) -> None:
    """transformers' model type, and the released checkpoints' (the SMG gateway's)."""
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"patch_size": 16}))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    assert vision.ImageProcessor.from_pretrained(tmp_path).family == "nemotron_h_omni"


def test_refused() -> None:
    processor = vision.ImageProcessor.for_family("nemotron_h_omni")
    frame = np.zeros((32, 32, 3), np.uint8)
    with pytest.raises(ProcessorConfigError):
        processor(videos=[[frame, frame]])
    for config in ({"do_normalize": False}, {"resample": 1}, {"downsample_ratio": 4.0}):
        with pytest.raises(ProcessorConfigError):
            vision.ImageProcessor("nemotron_h_omni", config)
    # an image too thin for any grid (1 x 4097 patches scaled into 1024: 0 rows), where
    # transformers divides by zero: ours is a ValueError naming the grid
    small = vision.ImageProcessor(
        "nemotron_h_omni", {"min_num_patches": 64, "max_num_patches": 1024}
    )
    with pytest.raises(ValueError, match="patch grid"):
        small([np.zeros((1, 65536, 3), np.uint8)])
