"""A weight-less Qwen2-VL model directory that the SMG gateway (smg 1.13.0) serves and that
transformers 5 loads: a tiny byte-level BPE tokenizer with the Qwen2 special tokens at their
real ids, a Qwen2-VL chat template, config, preprocessor and generation configs.

What smg 1.13.0 needs of such a directory (found by running it; see docs/engines.md):

* a chat template (here in ``tokenizer_config.json``); image parts reach it as
  ``{"type": "image"}``, all images before the text parts;
* the literal token ``<image>`` in the vocabulary, rendered once per image: the gateway's
  Qwen-VL spec (chosen by ``model_type == "qwen2_vl"``) replaces each ``<image>`` by the image's
  run of ``config.json``'s ``vision_token_id`` and sends that id as ``im_token_id``. Published
  Qwen2-VL configs say 151654 (``<|vision_pad|>``); vLLM's Qwen2-VL merges embeddings at
  ``<|image_pad|>`` (151655), so this directory says 151655;
* ``preprocessor_config.json`` (without it the gateway falls back to other defaults).

The vocabulary is padded with filler tokens up to id 151642 so that the added special tokens
land on their real ids (``tokenizers`` numbers added tokens after the base vocabulary). Real BPE
pieces are ids 0..~520: serve the toy engine with ``token_low=256, token_high=520`` so that its
output decodes to text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

#: Generated ids inside this range decode to real BPE pieces of the tiny tokenizer.
TOKEN_LOW, TOKEN_HIGH = 256, 520

SPECIALS = [
    ("<|endoftext|>", 151643),
    ("<|im_start|>", 151644),
    ("<|im_end|>", 151645),
    ("<|object_ref_start|>", 151646),
    ("<|object_ref_end|>", 151647),
    ("<|box_start|>", 151648),
    ("<|box_end|>", 151649),
    ("<|quad_start|>", 151650),
    ("<|quad_end|>", 151651),
    ("<|vision_start|>", 151652),
    ("<|vision_end|>", 151653),
    ("<|vision_pad|>", 151654),
    ("<|image_pad|>", 151655),
    ("<|video_pad|>", 151656),
]
# smg 1.13.0's Qwen2-VL spec (llm_multimodal::registry::qwen_vl::QwenVLVisionSpec, matched by
# model_type == "qwen2_vl" or a model id containing "qwen" and "vl") anchors each image on the
# literal token "<image>": it must be in the vocabulary, the chat template must render exactly
# one per image, and the gateway replaces it with N copies of config.json's vision_token_id.
IMAGE_ANCHOR = ("<image>", 151657)
FIRST_SPECIAL = 151643
TRAINED_VOCAB = 2000  # real BPE entries (ids 0..~1999); the rest up to 151642 are fillers

CORPUS = """The quick brown fox jumps over the lazy dog. A picture is worth a thousand words.
Hello, world! What is in this image? Describe the image in detail. The image shows a red
square on a white background with a blue circle. There is a cat sitting on a mat. Numbers:
0 1 2 3 4 5 6 7 8 9 10 100 1000. Colors: red green blue yellow black white orange purple.
You are a helpful assistant. The user asked a question and the assistant answered it.
Once upon a time there was a small model that could not see, but it could count tokens.
Vision language models read images as patches; each patch becomes a token after merging.
"""

# Qwen2-VL style chat template (own Jinja). Renders <|im_start|>role\n...<|im_end|>\n, image
# parts as <|vision_start|><image><|vision_end|> (the gateway expands <image> to N x
# vision_token_id; a template rendering <|image_pad|> is refused with "rendered image anchor
# count mismatch"), video parts with <|video_pad|>, and
# <|im_start|>assistant\n with add_generation_prompt. Newlines are emitted only from string
# literals so that whitespace control ({%- -%}) cannot eat them.
CHAT_TEMPLATE = """\
{%- for message in messages -%}
  {%- if loop.first and message['role'] != 'system' -%}
    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' -}}
  {%- endif -%}
  {{- '<|im_start|>' + message['role'] + '\\n' -}}
  {%- if message['content'] is string -%}
    {{- message['content'] -}}
  {%- else -%}
    {%- for content in message['content'] -%}
      {%- if content['type'] in ('image', 'image_url') -%}
        {{- '<|vision_start|><image><|vision_end|>' -}}
      {%- elif content['type'] in ('video', 'video_url') -%}
        {{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
      {%- elif 'text' in content -%}
        {{- content['text'] -}}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
  {{- '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\\n' -}}
{%- endif -%}
"""

PREPROCESSOR_CONFIG = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2VLProcessor",
    "do_resize": True,
    "do_rescale": True,
    "do_normalize": True,
    "do_convert_rgb": True,
    "rescale_factor": 1 / 255,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "resample": 3,
}

TEXT = {
    "vocab_size": 151936,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},
}

CONFIG = {
    "architectures": ["Qwen2VLForConditionalGeneration"],
    "model_type": "qwen2_vl",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0",
    **TEXT,
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    # Real Qwen2-VL has vision_token_id 151654 (<|vision_pad|>); the smg 1.13.0 gateway sends
    # vision_token_id as im_token_id and as the expanded placeholder token, so 151655
    # (<|image_pad|>, what vLLM's Qwen2-VL expects) is used by default (see --vision-token-id).
    "vision_token_id": 151655,
    "text_config": {"model_type": "qwen2_vl_text", **TEXT},
    "vision_config": {
        "model_type": "qwen2_vl",
        "depth": 1,
        "embed_dim": 32,
        "hidden_size": 64,
        "mlp_ratio": 2,
        "num_heads": 2,
        "in_chans": 3,
        "in_channels": 3,
        "spatial_merge_size": 2,
        "patch_size": 14,
        "spatial_patch_size": 14,
        "temporal_patch_size": 2,
        "hidden_act": "quick_gelu",
    },
}

GENERATION_CONFIG = {
    "bos_token_id": 151643,
    "pad_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "temperature": 0.01,
    "top_p": 0.001,
    "top_k": 1,
    "transformers_version": "4.45.0",
}


def filler(i: int) -> str:
    # Byte-level alphabet chars only, so the ByteLevel decoder decodes fillers to " zfillN".
    return f"Ġzfill{i}"


def build_tokenizer(with_anchor: bool = True) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TRAINED_VOCAB,
        min_frequency=1,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS] * 4, trainer=trainer)
    data = json.loads(tok.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    n = len(vocab)
    for i in range(n, FIRST_SPECIAL):
        vocab[filler(i)] = i
    assert len(vocab) == FIRST_SPECIAL, len(vocab)
    data["added_tokens"] = [
        {
            "id": tid,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for content, tid in SPECIALS + ([IMAGE_ANCHOR] if with_anchor else [])
    ]
    tok = Tokenizer.from_str(json.dumps(data))
    for content, tid in SPECIALS + ([IMAGE_ANCHOR] if with_anchor else []):
        assert tok.token_to_id(content) == tid, (content, tok.token_to_id(content), tid)
    return tok


def tokenizer_config(include_template: bool, with_anchor: bool = True) -> dict[str, Any]:
    cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(tid): {
                "content": content,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for content, tid in SPECIALS + ([IMAGE_ANCHOR] if with_anchor else [])
        },
        "additional_special_tokens": [
            "<|im_start|>",
            "<|im_end|>",
            "<|object_ref_start|>",
            "<|object_ref_end|>",
            "<|box_start|>",
            "<|box_end|>",
            "<|quad_start|>",
            "<|quad_end|>",
            "<|vision_start|>",
            "<|vision_end|>",
            "<|vision_pad|>",
            "<|image_pad|>",
            "<|video_pad|>",
        ],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    if include_template:
        cfg["chat_template"] = CHAT_TEMPLATE
    return cfg


def write_model_dir(out: str | Path) -> Path:
    """Write the directory (created if missing) and return its path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(True), indent=2))
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2))
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2))
    (out / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2))
    return out
