"""LLaVA-NeXT (``LlavaNextImageProcessorPil``): ``vision.ImageProcessor`` against
transformers, live and bit for bit, on every input kind and option; ``from_pretrained`` from a
dict, a file and a model directory, with ``LlavaNextProcessor``'s token counts. The reference,
the test images and the comparison: ``support/parity.py``.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.parity import (
    IMAGE_CASES,
    LLAVA_NEXT_336,
    LLAVA_PAD_336,
    check_batches,
    check_files,
    check_options,
    check_pil_inputs,
    configs_of,
    reference_mark,
)

from smg_grpc_proto.vision import ImageProcessor, VisionTokens

pytest.importorskip("transformers", reason="the reference is transformers")
pytest.importorskip("PIL", reason="the reference resizer is Pillow")

from transformers.models.llava_next.processing_llava_next import (
    LlavaNextProcessor,
)

pytestmark = reference_mark()


# ---- parity on every input kind (the checks are support.parity's) ------------------------


@pytest.mark.parametrize("config", configs_of("llava_next"))
@pytest.mark.parametrize("name", IMAGE_CASES)
def test_files(corpus: dict[str, Path], config: str, name: str) -> None:
    """Encoded files: our decoder + processor vs ``load_image`` + the PIL backend."""
    check_files(corpus, config, name)


@pytest.mark.parametrize("config", ["llava_next-336"])
@pytest.mark.parametrize("name", IMAGE_CASES)
def test_pil_inputs(corpus: dict[str, Path], config: str, name: str) -> None:
    """PIL images and encoded bytes with ``alpha="white"``."""
    check_pil_inputs(corpus, config, name)


@pytest.mark.slow
@pytest.mark.parametrize("config", configs_of("llava_next"))
def test_batches(corpus: dict[str, Path], config: str) -> None:
    """Images of mixed sizes and kinds in one call (processed in parallel, in order)."""
    check_batches(corpus, config)


OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("llava_next", {"image_grid_pinpoints": [[224, 448], [448, 224], [672, 672]]}),
    ("llava_next", {"size": {"height": 200, "width": 200}, "do_center_crop": False}),
]


@pytest.mark.parametrize(("family", "options"), OPTIONS, ids=lambda v: str(v))
def test_options(family: str, options: dict[str, Any]) -> None:
    """Other filters, sizes, crops, paddings and switches, on a batch of two sizes."""
    check_options(family, options)


# ---- configuration ----------------------------------------------------------------------


def test_from_pretrained_sources(tmp_path: Path, corpus: dict[str, Path]) -> None:
    """A dict, a JSON file and a model directory give the same processor; nothing downloads."""
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(LLAVA_NEXT_336))
    (tmp_path / "processor_config.json").write_text(
        json.dumps(
            {
                "patch_size": 14,
                "num_additional_image_tokens": 1,
                "vision_feature_select_strategy": "default",
                "processor_class": "LlavaNextProcessor",
            }
        )
    )
    from_dir = ImageProcessor.from_pretrained(tmp_path)
    from_file = ImageProcessor.from_pretrained(tmp_path / "preprocessor_config.json")
    from_dict = ImageProcessor.from_pretrained(LLAVA_NEXT_336)
    assert from_dir.config == from_file.config == from_dict.config
    assert from_dir.family == "llava_next"
    assert from_dict.config["size"] == {"shortest_edge": 336}
    with pytest.raises(FileNotFoundError, match="nothing is downloaded"):
        ImageProcessor.from_pretrained("llava-hf/llava-v1.6-mistral-7b-hf")
    with pytest.raises(ValueError, match="not supported"):
        ImageProcessor.from_pretrained({"image_processor_type": "BlipImageProcessor"})
    # Token counts as LlavaNextProcessor computes them.
    paths = [str(corpus[n]) for n in ("grace_hopper.jpg", "wide-3x600.png", "small-50x80.png")]
    out = from_dir(paths)
    assert out.image_sizes is not None
    assert out.num_image_tokens is not None
    fake = SimpleNamespace(
        image_processor=SimpleNamespace(
            image_grid_pinpoints=LLAVA_NEXT_336["image_grid_pinpoints"]
        ),
        patch_size=14,
        num_additional_image_tokens=1,
    )
    fake._get_unpadded_features = partial(LlavaNextProcessor._get_unpadded_features, fake)
    for (h, w), tokens in zip(out.image_sizes.tolist(), out.num_image_tokens, strict=True):
        want = LlavaNextProcessor._get_number_of_features(fake, h, w, 336, 336) - 1
        assert tokens == want
    assert from_dict(paths[0]).num_image_tokens is None  # no processor_config: unknown
    llava = ImageProcessor.from_pretrained(
        LLAVA_PAD_336, vision_tokens=VisionTokens(14, 1, "default")
    )
    assert llava(paths[:2]).num_image_tokens == (576, 576)
