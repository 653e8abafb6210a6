"""Every family with a PIL reference, byte for byte with transformers on 32 real photographs
(Grace Hopper, 12 camera photos among Pillow 13.0.0's test images, 19 of scikit-image 0.26.0's
bundled photographs: ``support.images.real_photos``), from the encoded file and from the
decoded array. One configuration per family (the published checkpoint's where the corpus has
one, tiling on). The torch-only families (Llama 4, Phi-4-multimodal, Phi-3-vision) are compared
with their committed goldens instead (``test_torch_goldens.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.images import real_photos
from support.parity import (
    CONFIGS,
    assert_matches,
    hf_load,
    hf_processor,
    our_processor,
    reference_mark,
    run_hf,
)

pytest.importorskip("transformers", reason="the reference is transformers")

pytestmark = [
    reference_mark(),
    pytest.mark.slow,
    # Pillow's sugarshack photo has a malformed MPO header, read as a plain JPEG (both sides)
    pytest.mark.filterwarnings("ignore:Image appears to be a malformed MPO file:UserWarning"),
]

# One configuration per family: the published checkpoint's settings where the corpus has them,
# with the tiling variants (pan-and-scan, InternVL tiles, Idefics3 splitting) on.
PHOTO_CONFIGS = [
    "qwen2-hub",
    "qwen3-hub",
    "clip-336",
    "llava-pad-336",
    "siglip-384",
    "llava_next-336",
    "pixtral-1540",
    "gemma3-pas",
    "internvl-defaults",
    "idefics3-defaults",
    "smolvlm-hub",
    "qwen3_omni-hub",
    "gemma4-defaults",
    "mllama-hub",
    "glm4v-hub",
    "glm46v-defaults",
    "glm5_next-defaults",
]
# A new family's configurations join in support.parity.CONFIGS; each must be listed here.
PHOTO_FAMILIES = {CONFIGS[name][0] for name in PHOTO_CONFIGS}


def test_every_pil_family_is_covered() -> None:
    assert {family for family, _ in CONFIGS.values()} <= PHOTO_FAMILIES | {"qwen2_5_vl"}


@pytest.fixture(scope="module")
def photos() -> dict[str, Path]:
    found = real_photos()
    assert len(found) >= 30
    return found


def test_the_corpus_is_real_photographs(photos: dict[str, Path]) -> None:
    from PIL import Image

    sizes = set()
    for path in photos.values():
        with Image.open(path) as im:
            assert min(im.size) >= 100, path  # photographs, not icons
            sizes.add(im.size)
    assert len(sizes) >= 20  # distinct shapes, from 128 x 128 to 2000 x 1072


@pytest.mark.parametrize("config", PHOTO_CONFIGS)
def test_every_photo_matches_transformers(config: str, photos: dict[str, Path]) -> None:
    from transformers.image_transforms import convert_to_rgb

    hf = hf_processor(config)
    ours = our_processor(config)
    for name, path in photos.items():
        loaded = hf_load(path)
        ref = run_hf(hf, loaded)
        assert_matches(ours(str(path)), ref, f"{config} {name} file")
        decoded = convert_to_rgb(loaded, return_numpy=True)
        assert_matches(ours(decoded), ref, f"{config} {name} array")
