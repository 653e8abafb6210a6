"""The weight-less model directories of support/model_dirs.py (which the gateway tests serve):
every special token at its published id for both tokenizer libraries, one anchor per image in
the rendered chat, and ``VisionModel.from_pretrained`` reading the published token ids."""

from __future__ import annotations

from pathlib import Path

import jinja2
import numpy as np
import pytest
from support.model_dirs import FAMILIES, write_model_dir
from tokenizers import Tokenizer

from smg_grpc_proto.engines import VisionModel

#: The embedding token each family's published config names (``image_token_id`` /
#: ``image_token_index``), and the anchor id our prompt holds once per image.
PUBLISHED = {
    "qwen2_vl": (151655, 151655),
    "qwen2_5_vl": (151655, 151655),
    "qwen3_vl": (151655, 151655),
    "qwen3_5": (248056, 248056),
    "llava": (32000, 32000),
    "llava_next": (32000, 32000),
    "llama4": (200092, 200090),  # <|patch|>, anchored on <|image|>
    "gemma4": (258880, 258880),  # <|image|>, wrapped in <|image> ... <image|>
    "gemma4_unified": (258880, 258880),  # as Gemma 4
}


@pytest.mark.parametrize("key", list(FAMILIES))
def test_special_tokens_keep_their_ids(key: str, tmp_path: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    family = FAMILIES[key]()
    directory = write_model_dir(family, tmp_path / family.name)
    ours = Tokenizer.from_file(str(directory / "tokenizer.json"))
    theirs = PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"))
    for content, token_id in family.added:
        assert ours.token_to_id(content) == token_id
        assert theirs.convert_tokens_to_ids(content) == token_id
        # a special token is one token in running text, never split into pieces
        assert ours.encode(f"a{content}b", add_special_tokens=False).ids.count(token_id) == 1
    messages = [
        {"role": "user", "content": [{"type": "image"}] * 2 + [{"type": "text", "text": "Hi"}]}
    ]
    extra = family.tokenizer_extra
    text = (
        jinja2.Environment()
        .from_string(family.template)
        .render(
            messages=messages,
            add_generation_prompt=True,
            bos_token=extra.get("bos_token") or "",
            eos_token=extra.get("eos_token") or "",
        )
    )
    anchor = family.token(family.gateway_anchor)
    assert ours.encode(text, add_special_tokens=False).ids.count(anchor) == 2


@pytest.mark.parametrize("key", list(PUBLISHED))
def test_vision_model_reads_the_published_ids(key: str, tmp_path: Path) -> None:
    family = FAMILIES[key]()
    directory = write_model_dir(family, tmp_path / family.name)
    model = VisionModel.from_pretrained(directory)
    media = model.prepare([np.zeros((300, 400, 3), np.uint8)])
    assert (media.token_id, media.anchor) == PUBLISHED[key]
    assert media.anchor == family.token(family.anchor)
