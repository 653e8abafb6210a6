"""GLM-4.1V, GLM-4.6V (``Glm4vImageProcessorPil``, ``Glm46VImageProcessorPil``) and GLM-5-next
(``Glm5NextImageProcessorPil``): ``vision.ImageProcessor`` against transformers 5.24, live and
bit for bit — every input kind of the shared corpus, random shapes from 1x1 to 200:1 strips,
options, GLM-4.1V's aspect-ratio error, configuration errors — and the token counts and
expanded ``input_ids`` of transformers' ``Glm4vProcessor`` / ``Glm46VProcessor`` /
``Glm5NextProcessor`` (their real image processors; a tokenizer built here with each model's
special tokens at its published ids). Videos: ``test_glm_video.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.parity import (
    IMAGE_CASES,
    assert_matches,
    check_batches,
    check_files,
    check_options,
    check_pil_inputs,
    check_raw_arrays,
    configs_of,
    hf_classes,
    hf_processor,
    our_processor,
    pattern,
    reference_mark,
    run_hf,
)

from smg_grpc_proto.engines import VisionModel, expand_placeholders
from smg_grpc_proto.errors import AspectRatioError, ProcessorConfigError, SmgProtoError
from smg_grpc_proto.vision import ImageProcessor

pytest.importorskip("transformers", reason="the reference is transformers")
pytest.importorskip("PIL", reason="the reference resizer is Pillow")

pytestmark = reference_mark()

FAMILIES = ("glm4v", "glm46v", "glm5_next")
CONFIGS = configs_of(*FAMILIES)


# ---- parity on every input kind (the checks are support.parity's) ------------------------


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("name", IMAGE_CASES)
def test_files(corpus: dict[str, Path], config: str, name: str) -> None:
    """Encoded files: our decoder + processor vs ``load_image`` + the PIL backend."""
    check_files(corpus, config, name)


@pytest.mark.parametrize("config", ["glm4v-hub", "glm5_next-small"])
@pytest.mark.parametrize("name", IMAGE_CASES)
def test_pil_inputs(corpus: dict[str, Path], config: str, name: str) -> None:
    """PIL images and encoded bytes with ``alpha="white"``."""
    check_pil_inputs(corpus, config, name)


@pytest.mark.parametrize("config", ["glm4v-defaults", "glm5_next-defaults"])
@pytest.mark.parametrize("channels", [1, 2, 4])
def test_raw_arrays(config: str, channels: int) -> None:
    check_raw_arrays(config, channels)


@pytest.mark.parametrize("config", CONFIGS)
def test_batches(corpus: dict[str, Path], config: str) -> None:
    check_batches(corpus, config)


OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("glm4v", {"resample": 2, "size": {"shortest_edge": 20000, "longest_edge": 60000}}),
    ("glm4v", {"patch_size": 8, "merge_size": 3, "temporal_patch_size": 3}),
    ("glm4v", {"do_normalize": False}),
    ("glm4v", {"do_rescale": False, "do_normalize": False}),
    ("glm4v", {"do_resize": False}),
    ("glm46v", {"size": {"shortest_edge": 200_000, "longest_edge": 400_000}}),
    ("glm5_next", {"min_image_tokens": 200, "max_image_tokens": 210}),
    ("glm5_next", {"min_image_tokens": 1, "max_image_tokens": 1}),
    ("glm5_next", {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 1}),
    ("glm5_next", {"resample": 1, "do_normalize": False}),
    ("glm5_next", {"do_resize": False}),
]


@pytest.mark.parametrize(("family", "options"), OPTIONS, ids=lambda v: str(v))
def test_options(family: str, options: dict[str, Any]) -> None:
    """Other filters, budgets, patch sizes and switches, on a batch of two sizes."""
    check_options(family, options)


def _shapes() -> list[tuple[int, int]]:
    rng = np.random.default_rng(22)
    fixed = [(1, 1), (1, 2), (2, 1), (3, 600), (600, 3), (10, 10), (27, 27), (28, 28)]
    fixed += [(29, 100), (5, 999), (2, 300), (20, 4000), (1000, 3000), (4000, 3000), (56, 11200)]
    return fixed + [(int(h), int(w)) for h, w in rng.integers(1, 1400, (24, 2))]


SHAPES = _shapes()


@pytest.mark.parametrize(
    ("family", "options"),
    [
        ("glm4v", {}),
        ("glm46v", {}),
        ("glm5_next", {}),
        ("glm5_next", {"min_image_tokens": 64, "max_image_tokens": 300}),
    ],
    ids=str,
)
def test_random_shapes(family: str, options: dict[str, Any]) -> None:
    """Every shape, one at a time: the same tensors, or the same refusal (GLM-4.1V's 200:1
    limit, checked after it scales a side under 28 pixels up)."""
    hf = hf_classes()[family](**options)
    ours = ImageProcessor(family, options)  # type: ignore[arg-type]
    for index, (height, width) in enumerate(SHAPES):
        array = pattern(height, width, index)
        try:
            ref = run_hf(hf, array, input_data_format="channels_last")
        except ValueError as error:
            message = f"image 0: {error}"
        else:
            assert_matches(ours(array), ref, f"{family} {options} {height}x{width}")
            continue
        with pytest.raises(AspectRatioError) as ours_error:
            ours(array)
        assert str(ours_error.value) == message


@pytest.mark.parametrize(("height", "width"), [(1, 300), (300, 1), (3, 601), (27, 5600)])
def test_aspect_ratio_error(height: int, width: int) -> None:
    """Beyond 200:1 (of the size scaled up to 28 px), transformers' message after "image N:"."""
    array = pattern(height, width, 3)
    with pytest.raises(ValueError, match="aspect ratio") as hf_error:
        run_hf(hf_processor("glm4v-defaults"), array, input_data_format="channels_last")
    with pytest.raises(AspectRatioError) as ours:
        our_processor("glm4v-defaults")([pattern(40, 40, 1), array])
    assert str(ours.value) == f"image 1: {hf_error.value}"
    assert isinstance(ours.value, SmgProtoError)
    assert ours.value.index == 1


@pytest.mark.parametrize(
    ("family", "config", "field"),
    [
        ("glm4v", {"size": {"shortest_edge": 12544}}, "size"),
        ("glm4v", {"size": {"min_pixels": 1, "max_pixels": 2}}, "size"),
        ("glm46v", {"size": 300}, "size"),
        ("glm4v", {"patch_size": 0}, "patch_size"),
        ("glm5_next", {"min_image_tokens": 0}, "min_image_tokens"),
        ("glm5_next", {"max_image_tokens": -5}, "max_image_tokens"),
        ("glm5_next", {"max_image_tokens": 2**40}, "max_image_tokens"),
    ],
    ids=str,
)
def test_config_errors(family: str, config: dict[str, Any], field: str) -> None:
    """Values the class would reject or that we do not reproduce: refused, naming the key."""
    with pytest.raises(ProcessorConfigError) as error:
        ImageProcessor(family, config)  # type: ignore[arg-type]
    assert error.value.field.startswith(field)


def test_defaults_and_from_pretrained() -> None:
    """The class defaults, and a published-style file naming each class."""
    glm4v = ImageProcessor.for_family("glm4v").config
    assert glm4v["size"] == {"shortest_edge": 12544, "longest_edge": 11760000}
    assert (glm4v["patch_size"], glm4v["merge_size"], glm4v["temporal_patch_size"]) == (14, 2, 2)
    glm5 = ImageProcessor.for_family("glm5_next").config
    assert (glm5["min_image_tokens"], glm5["max_image_tokens"]) == (16, 8000)
    for cls, family in [
        ("Glm4vImageProcessor", "glm4v"),
        ("Glm46VImageProcessorPil", "glm46v"),
        ("Glm5NextImageProcessor", "glm5_next"),
    ]:
        assert ImageProcessor.from_pretrained({"image_processor_type": cls}).family == family


# ---- token counts and input_ids against transformers' processors ---------------------------

# Glm4vConfig / Glm46VConfig / Glm5NextConfig (transformers 5.24): image 151343 / 154854,
# begin/end of image 151339/151340 / 154830/154831; begin/end of video (read by the processor's
# __init__) 151341/151342 (GLM-4.6V: 151361/151362) / 154832/154833.
SPECIAL = {
    "glm4v": {
        "<|image|>": 151343,
        "<|begin_of_image|>": 151339,
        "<|end_of_image|>": 151340,
        "<|begin_of_video|>": 151341,
        "<|end_of_video|>": 151342,
    },
    "glm46v": {
        "<|image|>": 151343,
        "<|begin_of_image|>": 151339,
        "<|end_of_image|>": 151340,
        "<|begin_of_video|>": 151361,
        "<|end_of_video|>": 151362,
    },
    "glm5_next": {
        "<|image|>": 154854,
        "<|begin_of_image|>": 154830,
        "<|end_of_image|>": 154831,
        "<|begin_of_video|>": 154832,
        "<|end_of_video|>": 154833,
    },
}


def _tokenizer(special: dict[str, int]) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "describe": 1, "and": 2, "compare": 3, **special}
    backend = Tokenizer(models.WordLevel(vocab, "<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", additional_special_tokens=list(special)
    )


@pytest.fixture
def _no_video_processor(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GLM processors also take a video processor, whose class needs torchvision (absent
    here); images need none, so the class check accepts ``video_processor=None``."""
    from transformers import processing_utils

    check = processing_utils.ProcessorMixin.check_argument_for_proper_class

    def lenient(self: Any, name: str, argument: Any) -> Any:
        if argument is None and name == "video_processor":
            return type(None)
        return check(self, name, argument)

    monkeypatch.setattr(processing_utils.ProcessorMixin, "check_argument_for_proper_class", lenient)


@pytest.mark.usefixtures("_no_video_processor")
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("family", FAMILIES)
def test_input_ids_equal_the_transformers_processor(family: str, n: int) -> None:
    import transformers as tf
    from PIL import Image

    processor_class = {
        "glm4v": tf.Glm4vProcessor,
        "glm46v": tf.Glm46VProcessor,
        "glm5_next": tf.Glm5NextProcessor,
    }[family]
    special = SPECIAL[family]
    rng = np.random.default_rng(n)
    shapes = [(300, 500), (900, 400), (20, 20)][:n]
    arrays = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in shapes]
    model = VisionModel.for_family(family)  # type: ignore[arg-type]
    assert model.image_token_id == special["<|image|>"]
    media = model.prepare(arrays)
    processor = processor_class(
        image_processor=hf_classes()[family](),
        tokenizer=_tokenizer(special),
        video_processor=None,
    )
    one = "<|begin_of_image|> <|image|> <|end_of_image|>"
    text = "describe " + " and ".join([one] * n) + " compare"
    images = [Image.fromarray(a) for a in arrays]
    out = processor(text=text, images=images, return_tensors="np")
    want = out["input_ids"][0].tolist()
    # the token counts are transformers' (grid / merge²) and the tensors its real processor's
    merge = 4
    assert list(media.token_counts) == [int(np.prod(g)) // merge for g in out["image_grid_thw"]]
    assert np.asarray(media.output.pixel_values).tobytes() == out["pixel_values"].tobytes()
    prompt = _tokenizer(special)(text)["input_ids"]
    ids, ranges = expand_placeholders(prompt, [media])
    assert ids.tolist() == want
    for (offset, length), count in zip(ranges[0], media.token_counts, strict=True):
        assert length == count
        assert set(ids[offset : offset + length].tolist()) == {special["<|image|>"]}
        assert ids[offset - 1] == special["<|begin_of_image|>"]
        assert ids[offset + length] == special["<|end_of_image|>"]


@pytest.mark.parametrize(
    ("model_type", "family"),
    [
        ("glm4v", "glm4v"),
        ("glm4v_moe", "glm4v"),
        ("glm46v", "glm46v"),
        ("glm5_next", "glm5_next"),
        ("glm53_flash", "glm5_next"),
    ],
)
def test_model_type_aliases(model_type: str, family: str) -> None:
    """The ``model_type``s the SMG gateway accepts for GLM name our families (a GLM-5.3-Flash
    directory whose preprocessor file names no class we know still loads)."""
    from smg_grpc_proto import _native

    assert _native.family_of_model_type(model_type) == family
    assert ImageProcessor.from_pretrained({"model_type": model_type}).family == family
