"""The families whose anchor becomes a run of one token (Qwen2/2.5/3-VL, Qwen3.5, LLaVA-1.5,
LLaVA-NeXT, the CLIP and SigLIP towers): ``expand_placeholders`` gives exactly the ``input_ids``
of the model's transformers processor for the same text and images.

The processors are transformers' own classes with a tokenizer built here holding each model's
special tokens at their published ids (no hub access). Their image processor is a stand-in that
hands back our processor's outputs — whose bit-exactness with transformers tests/vision covers —
so the comparison is of the prompt expansion alone. Images of several shapes (a landscape photo
size, a portrait strip, a tiny square) and several per prompt.

The tiled families are compared with their processors in their own files
(``test_llama4_engines.py``, ``test_gemma3_pixtral_engines.py``, ``test_phi_engines.py``, …).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest
from PIL import Image

from smg_grpc_proto.engines import VisionModel, expand_placeholders

# Qwen2/2.5/3-VL (Qwen/Qwen2-VL-7B-Instruct's added tokens).
QWEN = {"<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|image_pad|>": 151655}
QWEN["<|video_pad|>"] = 151656
# Qwen3.5 (transformers 5.24 Qwen3_5Config: vision start/end 248053/248054, image 248056,
# video 248057).
QWEN35 = {"<|vision_start|>": 248053, "<|vision_end|>": 248054, "<|image_pad|>": 248056}
QWEN35["<|video_pad|>"] = 248057
SHAPES = [(300, 500), (900, 400), (40, 40)]


def _tokenizer(special: dict[str, int]) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "describe": 1, "and": 2, "compare": 3, **special}
    backend = Tokenizer(models.WordLevel(vocab, "<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", additional_special_tokens=list(special)
    )


def _stand_in(base: type, outputs: dict[str, Any], **attributes: Any) -> Any:
    """An instance of transformers' image processor class ``base`` (its attributes, e.g.
    ``merge_size``) whose call returns ``outputs``."""
    from transformers import BatchFeature

    class Outputs(base):  # type: ignore[misc,valid-type]
        model_input_names: ClassVar[list[str]] = list(outputs)

        def __call__(self, images: Any = None, **kwargs: Any) -> Any:
            return BatchFeature(outputs)

        preprocess = __call__

    return Outputs(**attributes)


def _outputs(media: Any) -> dict[str, Any]:
    return {k: np.asarray(v) for k, v in media.output.tensors().items()}


def _case(family: str, media: Any) -> tuple[Any, str, dict[str, int]]:
    """transformers' processor for ``family`` (stand-in image processor), the text of one image
    as the chat template writes it, and the special tokens."""
    import transformers as tf

    outputs = _outputs(media)
    if family in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"):
        special = QWEN35 if family == "qwen3_5" else QWEN
        base = tf.Qwen2VLImageProcessorPil
        cls = {
            "qwen2_vl": tf.Qwen2VLProcessor,
            "qwen2_5_vl": tf.Qwen2_5_VLProcessor,
            "qwen3_vl": tf.Qwen3VLProcessor,
            "qwen3_5": tf.Qwen3VLProcessor,  # Qwen3.5 uses Qwen3-VL's processor class
        }[family]
        merge = 2
        image = _stand_in(base, outputs, merge_size=merge)
        tokenizer = _tokenizer(special)
        processor = cls(image_processor=image, tokenizer=tokenizer, video_processor=None)
        return processor, "<|vision_start|> <|image_pad|> <|vision_end|>", special
    # LLaVA-1.5 and the CLIP / SigLIP towers: LlavaProcessor with the tower's settings;
    # LLaVA-NeXT: LlavaNextProcessor (anyres features).
    tokens = VisionModel.for_family(family).processor.vision_tokens  # type: ignore[arg-type]
    assert tokens is not None
    special = {"<image>": VisionModel.for_family(family).image_token_id}  # type: ignore[arg-type]
    tokenizer = _tokenizer(special)
    strategy = tokens.vision_feature_select_strategy
    if family == "llava_next":
        config = VisionModel.for_family(family).processor.config  # type: ignore[arg-type]
        image = _stand_in(
            tf.LlavaNextImageProcessorPil,
            outputs,
            image_grid_pinpoints=config["image_grid_pinpoints"],
            crop_size=config["crop_size"],
            size=config["size"],
        )
        processor = tf.LlavaNextProcessor(
            image_processor=image,
            tokenizer=tokenizer,
            patch_size=tokens.patch_size,
            vision_feature_select_strategy=strategy,
            num_additional_image_tokens=tokens.num_additional_image_tokens,
        )
    else:
        image = _stand_in(tf.CLIPImageProcessorPil, outputs)
        processor = tf.LlavaProcessor(
            image_processor=image,
            tokenizer=tokenizer,
            patch_size=tokens.patch_size,
            vision_feature_select_strategy=strategy,
            num_additional_image_tokens=tokens.num_additional_image_tokens,
        )
    return processor, "<image>", special


FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "llava", "llava_next", "clip"]
FAMILIES += ["siglip"]


@pytest.fixture(autouse=True)
def _no_video_processor(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Qwen processors also take a video processor, whose classes need torchvision (absent
    here); images need none, so the class check accepts ``video_processor=None``."""
    from transformers import processing_utils

    check = processing_utils.ProcessorMixin.check_argument_for_proper_class

    def lenient(self: Any, name: str, argument: Any) -> Any:
        if argument is None and name == "video_processor":
            return type(None)
        return check(self, name, argument)

    monkeypatch.setattr(processing_utils.ProcessorMixin, "check_argument_for_proper_class", lenient)


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("family", FAMILIES)
def test_input_ids_equal_the_transformers_processor(family: str, n: int) -> None:
    rng = np.random.default_rng(n)
    arrays = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in SHAPES[:n]]
    model = VisionModel.for_family(family)  # type: ignore[arg-type]
    media = model.prepare(arrays)
    processor, image_text, special = _case(family, media)
    text = "describe " + " and ".join([image_text] * n) + " compare"
    images = [Image.fromarray(a) for a in arrays]
    want = list(processor(text=text, images=images)["input_ids"][0])
    prompt = _tokenizer(special)(text)["input_ids"]
    assert prompt.count(media.anchor) == n  # one anchor per image before expansion
    ids, ranges = expand_placeholders(prompt, [media])
    assert ids.tolist() == want
    # each range is exactly the item's run of the embedding token
    for (offset, length), count in zip(ranges[0], media.token_counts, strict=True):
        assert length == count
        assert set(ids[offset : offset + length].tolist()) == {media.token_id}
    assert len(want) - len(prompt) == sum(media.token_counts) - n
