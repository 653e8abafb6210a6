"""Gemma 4's special tokens at their published ids and a word-level tokenizer holding them: what
the Gemma 4 and Gemma 4 unified tests give transformers' processors (both models' configs have
the same default ids)."""

from __future__ import annotations

from typing import Any

# Gemma4Config's / Gemma4UnifiedConfig's defaults (transformers 5.24): boi 255999, eoi 258882,
# image 258880, video 258884; the audio tokens, which the processors' __init__ looks up, at theirs.
SPECIAL = {
    "<|image>": 255_999,
    "<image|>": 258_882,
    "<|image|>": 258_880,
    "<|video|>": 258_884,
    "<|audio|>": 258_881,
    "<|audio>": 256_000,
    "<audio|>": 258_883,
}
BOI, EOI, IMAGE = SPECIAL["<|image>"], SPECIAL["<image|>"], SPECIAL["<|image|>"]
VOCAB = {"<pad>": 0, "<unk>": 3, "describe": 1000, "and": 1001, "compare": 1002}


def gemma4_tokenizer() -> Any:
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
        extra_special_tokens={
            "boi_token": "<|image>",
            "eoi_token": "<image|>",
            "image_token": "<|image|>",
            "audio_token": "<|audio|>",
            "boa_token": "<|audio>",
            "eoa_token": "<audio|>",
        },
    )
