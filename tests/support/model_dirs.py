"""Weight-less model directories, one per vision family, that the SMG gateway (smg 1.13.0) serves
and that transformers 5 and our ``VisionModel.from_pretrained`` load.

Each directory holds ``config.json`` (the published model type, architecture and token ids),
``preprocessor_config.json`` (the published values; LLaVA also ``processor_config.json``),
``generation_config.json``, and a tiny byte-level BPE tokenizer (``tokenizer.json``, trained on
a short corpus) that carries the model's special tokens at their real published ids, with
``tokenizer_config.json`` holding a chat template written after the published one.

The special tokens sit in the BPE vocabulary itself at their ids (the vocabulary is sparse;
the trained pieces are numbered around them) and are listed again as added tokens, so that
``tokenizers`` keeps every id as written. The trained pieces decode to text: serve the toy
engine with ``token_low=TOKEN_LOW, token_high=TOKEN_HIGH``.

The directory name is the served model name, which the gateway matches against its patterns
(``Family.name``): its plain-LLaVA image processor is found only by a model id containing
``llava-1.5``, its Qwen2.5-VL spec only by an id containing "qwen" and "vl".

What smg 1.13.0 needs of the template (crates/multimodal/src/registry/): one anchor per
image, images before the text parts (``MediaPartOrder::MediaFirst``), image parts rendered
from ``{"type": "image"}``. Its anchor is the published one except for Qwen2-VL and
Qwen2.5-VL, whose spec (``qwen_vl.rs``) anchors on the literal token ``<image>`` — not in the
published vocabularies, so these directories add it (``Family.gateway_tokens``) and their
template renders it where the published template renders ``<|image_pad|>``
(``Family.anchor``).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

#: Generated ids inside this range decode to real BPE pieces of every family's tokenizer.
TOKEN_LOW, TOKEN_HIGH = 256, 520
TRAINED_VOCAB = 2000

CORPUS = """The quick brown fox jumps over the lazy dog. A picture is worth a thousand words.
Hello, world! What is in this image? Describe the image in detail. The image shows a red
square on a white background with a blue circle. There is a cat sitting on a mat. Numbers:
0 1 2 3 4 5 6 7 8 9 10 100 1000. Colors: red green blue yellow black white orange purple.
You are a helpful assistant. The user asked a question and the assistant answered it.
Once upon a time there was a small model that could not see, but it could count tokens.
Vision language models read images as patches; each patch becomes a token after merging.
Compare these two pictures. USER: ASSISTANT: [INST] [/INST] user assistant system
"""

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


# -- chat templates (own Jinja, after the published ones) ---------------------------------------
# Newlines come only from string literals so that whitespace control cannot eat them. IMAGE is
# replaced by the anchor markup of the family.
def _chatml(image: str) -> str:
    return (
        "{%- for message in messages -%}"
        "{%- if loop.first and message['role'] != 'system' -%}"
        "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' -}}"
        "{%- endif -%}"
        "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
        "{%- if message['content'] is string -%}{{- message['content'] -}}"
        "{%- else -%}{%- for content in message['content'] -%}"
        "{%- if content['type'] in ('image', 'image_url') -%}{{- '" + image + "' -}}"
        "{%- elif 'text' in content -%}{{- content['text'] -}}"
        "{%- endif -%}{%- endfor -%}{%- endif -%}"
        "{{- '<|im_end|>\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    )


# llava-hf/llava-1.5-7b-hf: "USER: <image>\n... ASSISTANT:", images first.
LLAVA_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] != 'system' -%}{{- message['role'].upper() + ': ' -}}{%- endif -%}"
    "{%- if message['content'] is string -%}{{- message['content'] + ' ' -}}"
    "{%- else -%}{%- for content in message['content'] -%}"
    "{%- if content['type'] in ('image', 'image_url') -%}{{- '<image>\\n' -}}"
    "{%- elif 'text' in content -%}{{- content['text'] + ' ' -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'ASSISTANT:' -}}{%- endif -%}"
)

# llava-hf/llava-v1.6-mistral-7b-hf: "[INST] <image>\n... [/INST]".
MISTRAL_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{{- '[INST] ' -}}{%- endif -%}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for content in message['content'] -%}"
    "{%- if content['type'] in ('image', 'image_url') -%}{{- '<image>\\n' -}}"
    "{%- elif 'text' in content -%}{{- content['text'] -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- if message['role'] == 'user' -%}{{- ' [/INST]' -}}{%- else -%}{{- eos_token -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)

# meta-llama/Llama-4-Scout-17B-16E-Instruct: header tokens, <|image|> per image.
LLAMA4_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|header_start|>' + message['role'] + '<|header_end|>\\n\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for content in message['content'] -%}"
    "{%- if content['type'] in ('image', 'image_url') -%}{{- '<|image|>' -}}"
    "{%- elif 'text' in content -%}{{- content['text'] -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|eot|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|header_start|>assistant<|header_end|>\\n\\n' -}}"
    "{%- endif -%}"
)

# microsoft/Phi-3-vision-128k-instruct: <|user|>\n<|image_1|>\n...<|end|>\n<|assistant|>\n;
# smg's Phi-3-V spec anchors on <|image|> (vLLM's id 32044), which this template renders.
PHI3V_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|' + message['role'] + '|>\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for content in message['content'] -%}"
    "{%- if content['type'] in ('image', 'image_url') -%}{{- '<|image|>\\n' -}}"
    "{%- elif 'text' in content -%}{{- content['text'] -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)

# GLM-5-next: each image as <|begin_of_image|><|image|><|end_of_image|> where authored (smg's
# glm53_flash spec: MediaPartOrder::Authored, anchor <|image|>). The role markers are plain text
# here: the published chat tokens' ids are not in transformers' config (only the vision ones
# and the pad token are).
GLM5_NEXT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- message['role'] + ': ' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for content in message['content'] -%}"
    "{%- if content['type'] in ('image', 'image_url') -%}"
    "{{- '<|begin_of_image|><|image|><|end_of_image|>' -}}"
    "{%- elif 'text' in content -%}{{- content['text'] -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'assistant: ' -}}{%- endif -%}"
)


# Inkling: the checkpoint's template writes <|content_image|> before each image's one soft
# placeholder (smg 1.13's inkling spec says so; InklingProcessor expands the placeholder only).
INKLING_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- message['role'] + ': ' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for content in message['content'] -%}"
    "{%- if content['type'] in ('image', 'image_url') -%}"
    "{{- '<|content_image|><|unused_200054|>' -}}"
    "{%- elif 'text' in content -%}{{- content['text'] -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'assistant: ' -}}{%- endif -%}"
)


# -- the families -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Family:
    """One family's directory: what it holds and how its prompt anchors images."""

    family: str
    """The family (``FAMILIES`` key). Our processor family is the same but for LLaVA-1.5, whose
    checkpoints ship a ``CLIPImageProcessor`` (our ``clip`` family with LLaVA's token rule)."""
    name: str
    """Directory / served model name (the gateway matches model ids by substring)."""
    specials: tuple[tuple[str, int], ...]
    """The published special tokens at their published ids."""
    config: dict[str, Any]
    preprocessor: dict[str, Any]
    template: str
    anchor: str
    """The published template's (and transformers processor's) image token."""
    gateway_anchor: str
    """What this directory's template renders once per image (smg's placeholder token)."""
    tokenizer_extra: dict[str, Any] = field(default_factory=dict)
    """bos/eos/pad/unk tokens and tokenizer class for ``tokenizer_config.json``."""
    gateway_tokens: tuple[tuple[str, int], ...] = ()
    """Tokens smg needs that the published vocabulary lacks (Qwen2-VL's ``<image>``)."""
    processor_config: dict[str, Any] | None = None
    generation: dict[str, Any] = field(default_factory=dict)

    @property
    def added(self) -> tuple[tuple[str, int], ...]:
        return self.specials + self.gateway_tokens

    def token(self, content: str) -> int:
        return dict(self.added)[content]


QWEN2_SPECIALS = (
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
)
# Qwen2.5-VL and Qwen3-VL add the tool and FIM tokens after <|video_pad|>.
QWEN25_SPECIALS = (
    *QWEN2_SPECIALS,
    ("<tool_call>", 151657),
    ("</tool_call>", 151658),
    ("<|fim_prefix|>", 151659),
    ("<|fim_middle|>", 151660),
    ("<|fim_suffix|>", 151661),
    ("<|fim_pad|>", 151662),
    ("<|repo_name|>", 151663),
    ("<|file_sep|>", 151664),
)
# Qwen3.5 (transformers' Qwen3_5Config defaults; the published tokenizer_config.json).
QWEN35_SPECIALS = (
    ("<|endoftext|>", 248044),
    ("<|im_start|>", 248045),
    ("<|im_end|>", 248046),
    ("<|vision_start|>", 248053),
    ("<|vision_end|>", 248054),
    ("<|vision_pad|>", 248055),
    ("<|image_pad|>", 248056),
    ("<|video_pad|>", 248057),
)
LLAMA_SPECIALS = (("<unk>", 0), ("<s>", 1), ("</s>", 2), ("<image>", 32000), ("<pad>", 32001))
# Llama 4 Scout/Maverick (the text tokens from 200000, the vision tokens from 200080).
LLAMA4_SPECIALS = (
    ("<|begin_of_text|>", 200000),
    ("<|end_of_text|>", 200001),
    ("<|header_start|>", 200005),
    ("<|header_end|>", 200006),
    ("<|eot|>", 200008),
    ("<|image_start|>", 200080),
    ("<|image_end|>", 200081),
    ("<|tile_x_separator|>", 200084),
    ("<|tile_y_separator|>", 200085),
    ("<|image|>", 200090),
    ("<|patch|>", 200092),
)
# Gemma 4: Gemma4Config's defaults (transformers 5.24) for the media tokens; <pad> 0, <eos> 1,
# <bos> 2 are Gemma4TextConfig's pad/eos/bos ids; the turn markers are Gemma 3's published
# <start_of_turn> 105 / <end_of_turn> 106 (any ids serve the agreement: both sides read them
# from this tokenizer).
GEMMA4_SPECIALS = (
    ("<pad>", 0),
    ("<eos>", 1),
    ("<bos>", 2),
    ("<unk>", 3),
    ("<start_of_turn>", 105),
    ("<end_of_turn>", 106),
    ("<|image>", 255999),
    ("<|audio>", 256000),
    ("<|image|>", 258880),
    ("<|audio|>", 258881),
    ("<image|>", 258882),
    ("<audio|>", 258883),
    ("<|video|>", 258884),
)
PHI3_SPECIALS = (
    ("<unk>", 0),
    ("<s>", 1),
    ("</s>", 2),
    ("<|endoftext|>", 32000),
    ("<|assistant|>", 32001),
    ("<|system|>", 32006),
    ("<|end|>", 32007),
    ("<|user|>", 32010),
    ("<|image|>", 32044),
)

# Gemma's turns; one <|image|> per image where the user wrote it (smg's Gemma 4 spec renders the
# parts in the order authored).
GEMMA4_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) -}}"
    "{{- '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for content in message['content'] -%}"
    "{%- if content['type'] in ('image', 'image_url') -%}{{- '<|image|>' -}}"
    "{%- elif 'text' in content -%}{{- content['text'] -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)

_QWEN_TOKENIZER = {
    "bos_token": None,
    "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>",
    "unk_token": None,
    "tokenizer_class": "Qwen2Tokenizer",
}
_LLAMA_TOKENIZER = {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "pad_token": "<pad>",
    "unk_token": "<unk>",
    "tokenizer_class": "LlamaTokenizer",
}


def _text(vocab: int, bos: int, eos: int, **extra: Any) -> dict[str, Any]:
    return {
        "vocab_size": vocab,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "bos_token_id": bos,
        "eos_token_id": eos,
        **extra,
    }


QWEN2_PREPROCESSOR = {  # Qwen/Qwen2-VL-7B-Instruct (Qwen2.5-VL has the same values)
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2VLProcessor",
    "do_resize": True,
    "do_rescale": True,
    "do_normalize": True,
    "do_convert_rgb": True,
    "rescale_factor": 1 / 255,
    "image_mean": CLIP_MEAN,
    "image_std": CLIP_STD,
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "resample": 3,
}
QWEN3_PREPROCESSOR = {  # Qwen/Qwen3-VL-*, Qwen/Qwen3.5-*
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessorFast",
}


def _qwen_vision(patch: int) -> dict[str, Any]:
    return {
        "depth": 1,
        "hidden_size": 64,
        "num_heads": 2,
        "in_channels": 3,
        "in_chans": 3,
        "spatial_merge_size": 2,
        "patch_size": patch,
        "spatial_patch_size": patch,
        "temporal_patch_size": 2,
    }


def _qwen2(model_type: str, arch: str, vision_token_id: int) -> dict[str, Any]:
    text = _text(151936, 151643, 151645, rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]})
    return {
        "architectures": [arch],
        "model_type": model_type,
        **text,
        "image_token_id": 151655,
        "video_token_id": 151656,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "vision_token_id": vision_token_id,
        "text_config": {"model_type": f"{model_type}_text", **text},
        "vision_config": {"model_type": model_type, **_qwen_vision(14)},
    }


def _qwen3(model_type: str, arch: str, ids: dict[str, int], vocab: int) -> dict[str, Any]:
    text = _text(vocab, ids["bos"], ids["eos"])
    return {
        "architectures": [arch],
        "model_type": model_type,
        "image_token_id": ids["image"],
        "video_token_id": ids["video"],
        "vision_start_token_id": ids["start"],
        "vision_end_token_id": ids["end"],
        "text_config": {"model_type": f"{model_type}_text", **text},
        "vision_config": {"model_type": model_type, **_qwen_vision(16)},
    }


_CLIP_TOWER = {"model_type": "clip_vision_model", "image_size": 336, "patch_size": 14}
_LLAVA_PROCESSOR = {  # llava-hf processor_config.json
    "patch_size": 14,
    "vision_feature_select_strategy": "default",
    "num_additional_image_tokens": 1,
}
LLAVA_PREPROCESSOR = {  # llava-hf/llava-1.5-7b-hf
    "crop_size": {"height": 336, "width": 336},
    "do_center_crop": True,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": CLIP_MEAN,
    "image_std": CLIP_STD,
    "image_processor_type": "CLIPImageProcessor",
    "processor_class": "LlavaProcessor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"shortest_edge": 336},
}
PINPOINTS = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]
LLAVA_NEXT_PREPROCESSOR = {  # llava-hf/llava-v1.6-mistral-7b-hf
    "crop_size": {"height": 336, "width": 336},
    "do_center_crop": True,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_grid_pinpoints": PINPOINTS,
    "image_mean": CLIP_MEAN,
    "image_std": CLIP_STD,
    "image_processor_type": "LlavaNextImageProcessor",
    "processor_class": "LlavaNextProcessor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"shortest_edge": 336},
}
LLAMA4_PREPROCESSOR = {  # meta-llama/Llama-4-Scout-17B-16E-Instruct
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "image_processor_type": "Llama4ImageProcessorFast",
    "max_patches": 16,
    "processor_class": "Llama4Processor",
    "resample": 2,
    "rescale_factor": 0.00392156862745098,
    "resize_to_max_canvas": False,
    "size": {"height": 336, "width": 336},
}
GEMMA4_PREPROCESSOR = {  # Gemma4ImageProcessor's defaults, as the published file writes them
    "do_convert_rgb": True,
    "do_normalize": False,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.0, 0.0, 0.0],
    "image_std": [1.0, 1.0, 1.0],
    "image_processor_type": "Gemma4ImageProcessor",
    "max_soft_tokens": 280,
    "patch_size": 16,
    "pooling_kernel_size": 3,
    "processor_class": "Gemma4Processor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
}
GEMMA4_UNIFIED_PREPROCESSOR = {  # Gemma4UnifiedImageProcessor's defaults (Gemma 4's)
    **GEMMA4_PREPROCESSOR,
    "image_processor_type": "Gemma4UnifiedImageProcessor",
    "processor_class": "Gemma4UnifiedProcessor",
}
PHI3V_PREPROCESSOR = {  # microsoft/Phi-3-vision-128k-instruct
    "do_convert_rgb": True,
    "image_mean": CLIP_MEAN,
    "image_std": CLIP_STD,
    "image_processor_type": "Phi3VImageProcessor",
    "num_crops": 16,
    "num_img_tokens": 144,
    "processor_class": "Phi3VProcessor",
}
GLM5_NEXT_PREPROCESSOR = {  # Glm5NextImageProcessor's class values, as a file would carry them
    "image_processor_type": "Glm5NextImageProcessor",
    "processor_class": "Glm5NextProcessor",
    "do_resize": True,
    "do_rescale": True,
    "do_normalize": True,
    "do_convert_rgb": True,
    "resample": 3,
    "image_mean": CLIP_MEAN,
    "image_std": CLIP_STD,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "patch_expand_factor": 1,
    "min_image_tokens": 16,
    "max_image_tokens": 8000,
}
# transformers 5.24 Glm5NextConfig: image 154854, video 154855, begin/end of image 154830/154831,
# begin/end of video 154832/154833; Glm5NextTextConfig pad 154820, vocabulary 154880.
# Kimi-K2.5 (moonshotai/Kimi-K2.5): its preprocessor_config.json names only remote code and
# nests every setting in media_proc_cfg (transformers' Kimi_K25ImageProcessor defaults).
KIMI_K25_PREPROCESSOR = {
    "auto_map": {
        "AutoImageProcessor": "kimi_k25_vision_processing.KimiK25VisionProcessor",
        "AutoProcessor": "kimi_k25_processor.KimiK25Processor",
    },
    "media_proc_cfg": {
        "in_patch_limit": 16384,
        "patch_size": 14,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "merge_kernel_size": 2,
        "fixed_output_tokens": None,
        "patch_limit_on_one_side": 512,
        "in_patch_limit_each_frame": 4096,
        "in_patch_limit_video": None,
        "sample_fps": 2.0,
        "max_num_frames_each_video": None,
        "temporal_merge_kernel_size": 4,
        "timestamp_mode": "hh:mm:ss.fff",
        "config_type": "media_proc_cfg",
    },
}
# Kimi-K2.5's BOS/EOS and media tokens (Kimi_K25Config: image 163605, media begin/end 163602 and
# 163604; <|media_content|> between them).
KIMI_K25_SPECIALS = (
    ("[BOS]", 163584),
    ("[EOS]", 163585),
    ("<|media_begin|>", 163602),
    ("<|media_content|>", 163603),
    ("<|media_end|>", 163604),
    ("<|media_pad|>", 163605),
)
# Kimi-K2.5's chat template writes each image as
# <|media_begin|>image<|media_content|><|media_pad|><|media_end|> (vLLM's placeholder string for
# the model too); the role markers are plain text here.
KIMI_K25_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- message['role'] + ': ' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for content in message['content'] -%}"
    "{%- if content['type'] in ('image', 'image_url') -%}"
    "{{- '<|media_begin|>image<|media_content|><|media_pad|><|media_end|>' -}}"
    "{%- elif 'text' in content -%}{{- content['text'] -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'assistant: ' -}}{%- endif -%}"
)

GLM5_NEXT_SPECIALS = (
    ("<|endoftext|>", 154820),
    ("<|begin_of_image|>", 154830),
    ("<|end_of_image|>", 154831),
    ("<|begin_of_video|>", 154832),
    ("<|end_of_video|>", 154833),
    ("<|image|>", 154854),
    ("<|video|>", 154855),
)

INKLING_PREPROCESSOR = {  # InklingImageProcessor's class values, as a file would carry them
    "image_processor_type": "InklingImageProcessor",
    "processor_class": "InklingProcessor",
    "do_convert_rgb": True,
    "do_rescale": True,
    "do_normalize": True,
    "resample": 1,
    "image_mean": CLIP_MEAN,
    "image_std": CLIP_STD,
    "size": {"height": 40, "width": 40},
    "rescale_image_max_upscaled_long_edge": 2048,
}
# transformers 5.24 InklingConfig: image 200054, audio 200053, image/audio bos 200005/200020;
# InklingTextConfig bos 1, eos 2.
INKLING_SPECIALS = (
    ("<s>", 1),
    ("</s>", 2),
    ("<|content_image|>", 200005),
    ("<|content_audio_input|>", 200020),
    ("<|unused_200053|>", 200053),
    ("<|unused_200054|>", 200054),
)

_QWEN_GEN = {"bos_token_id": 151643, "pad_token_id": 151643, "eos_token_id": [151645, 151643]}


def qwen2_vl(vision_token_id: int = 151654, name: str = "Qwen2-VL-tiny") -> Family:
    """Qwen2-VL. Published configs say ``vision_token_id`` 151654 (``<|vision_pad|>``); smg
    expands its ``<image>`` anchor into that id (see test_gateway.py)."""
    return Family(
        "qwen2_vl",
        name,
        QWEN2_SPECIALS,
        _qwen2("qwen2_vl", "Qwen2VLForConditionalGeneration", vision_token_id),
        QWEN2_PREPROCESSOR,
        _chatml("<|vision_start|><image><|vision_end|>"),
        "<|image_pad|>",
        "<image>",
        _QWEN_TOKENIZER,
        (("<image>", 151657),),
        generation=_QWEN_GEN,
    )


def qwen2_5_vl() -> Family:
    return Family(
        "qwen2_5_vl",
        "Qwen2.5-VL-tiny",
        QWEN25_SPECIALS,
        _qwen2("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", 151654),
        {**QWEN2_PREPROCESSOR, "processor_class": "Qwen2_5_VLProcessor"},
        _chatml("<|vision_start|><image><|vision_end|>"),
        "<|image_pad|>",
        "<image>",
        _QWEN_TOKENIZER,
        (("<image>", 151665),),  # the first id after the published added tokens
        generation=_QWEN_GEN,
    )


def qwen3_vl() -> Family:
    ids = {"bos": 151643, "eos": 151645, "image": 151655, "video": 151656}
    return Family(
        "qwen3_vl",
        "Qwen3-VL-tiny",
        QWEN25_SPECIALS,
        _qwen3(
            "qwen3_vl",
            "Qwen3VLForConditionalGeneration",
            {**ids, "start": 151652, "end": 151653},
            151936,
        ),
        QWEN3_PREPROCESSOR,
        _chatml("<|vision_start|><|image_pad|><|vision_end|>"),
        "<|image_pad|>",
        "<|image_pad|>",
        _QWEN_TOKENIZER,
        generation=_QWEN_GEN,
    )


def qwen3_5() -> Family:
    ids = {"bos": 248044, "eos": 248046, "image": 248056, "video": 248057}
    return Family(
        "qwen3_5",
        "Qwen3.5-tiny",
        QWEN35_SPECIALS,
        _qwen3(
            "qwen3_5",
            "Qwen3_5ForConditionalGeneration",
            {**ids, "start": 248053, "end": 248054},
            248320,
        ),
        QWEN3_PREPROCESSOR,
        _chatml("<|vision_start|><|image_pad|><|vision_end|>"),
        "<|image_pad|>",
        "<|image_pad|>",
        _QWEN_TOKENIZER,
        generation={"bos_token_id": 248044, "pad_token_id": 248044, "eos_token_id": [248046]},
    )


# Qwen3-Omni: Qwen2.5's specials plus the audio tokens (Qwen/Qwen3-Omni-30B-A3B-Instruct's
# tokenizer_config.json).
QWEN3_OMNI_SPECIALS = (
    *QWEN25_SPECIALS,
    ("<|audio_start|>", 151669),
    ("<|audio_end|>", 151670),
    ("<|audio_pad|>", 151675),
)
QWEN3_OMNI_PREPROCESSOR = {  # Qwen/Qwen3-Omni-30B-A3B-Instruct (image and audio halves)
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen3OmniMoeProcessor",
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "feature_extractor_type": "WhisperFeatureExtractor",
    "feature_size": 128,
    "sampling_rate": 16000,
    "hop_length": 160,
    "n_fft": 400,
    "chunk_length": 300,
    "n_samples": 4800000,
    "nb_max_frames": 30000,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "dither": 0.0,
}


# The model-specific tokens of its tokenizer_config.json (Qwen3OmniMoeProcessor reads them).
QWEN3_OMNI_TOKENS = {
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "audio_token": "<|audio_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}


def qwen3_omni_moe() -> Family:
    """Qwen3-Omni: the token ids live in ``thinker_config`` (the model the media go to)."""
    text = _text(152064, 151643, 151645)
    thinker = {
        "model_type": "qwen3_omni_moe_thinker",
        "image_token_id": 151655,
        "video_token_id": 151656,
        "audio_token_id": 151675,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "audio_start_token_id": 151669,
        "audio_end_token_id": 151670,
        "position_id_per_seconds": 13,
        "text_config": {"model_type": "qwen3_omni_moe_text", **text},
        "vision_config": {"model_type": "qwen3_omni_moe_vision_encoder", **_qwen_vision(16)},
        "audio_config": {"model_type": "qwen3_omni_moe_audio_encoder", "num_mel_bins": 128},
    }
    return Family(
        "qwen3_omni_moe",
        "Qwen3-Omni-tiny",
        QWEN3_OMNI_SPECIALS,
        {
            "architectures": ["Qwen3OmniMoeForConditionalGeneration"],
            "model_type": "qwen3_omni_moe",
            "enable_audio_output": False,
            "thinker_config": thinker,
        },
        QWEN3_OMNI_PREPROCESSOR,
        _chatml("<|vision_start|><|image_pad|><|vision_end|>"),
        "<|image_pad|>",
        "<|image_pad|>",
        {**_QWEN_TOKENIZER, **QWEN3_OMNI_TOKENS},
        generation={"bos_token_id": 151643, "pad_token_id": 151643, "eos_token_id": [151645]},
    )


def llava() -> Family:
    return Family(
        "llava",
        "llava-1.5-tiny",
        LLAMA_SPECIALS,
        {
            "architectures": ["LlavaForConditionalGeneration"],
            "model_type": "llava",
            "image_token_index": 32000,
            "pad_token_id": 32001,
            "vision_feature_layer": -2,
            "vision_feature_select_strategy": "default",
            "image_seq_length": 576,
            "text_config": {"model_type": "llama", **_text(32064, 1, 2)},
            "vision_config": _CLIP_TOWER,
        },
        LLAVA_PREPROCESSOR,
        LLAVA_TEMPLATE,
        "<image>",
        "<image>",
        _LLAMA_TOKENIZER,
        processor_config=_LLAVA_PROCESSOR,
        generation={"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 32001},
    )


def llava_next() -> Family:
    return Family(
        "llava_next",
        "llava-v1.6-tiny",
        LLAMA_SPECIALS,
        {
            "architectures": ["LlavaNextForConditionalGeneration"],
            "model_type": "llava_next",
            "image_token_index": 32000,
            "image_grid_pinpoints": PINPOINTS,
            "vision_feature_layer": -2,
            "vision_feature_select_strategy": "default",
            "image_seq_length": 576,
            "text_config": {"model_type": "mistral", **_text(32064, 1, 2)},
            "vision_config": _CLIP_TOWER,
        },
        LLAVA_NEXT_PREPROCESSOR,
        MISTRAL_TEMPLATE,
        "<image>",
        "<image>",
        _LLAMA_TOKENIZER,
        processor_config=_LLAVA_PROCESSOR,
        generation={"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 32001},
    )


def llama4() -> Family:
    return Family(
        "llama4",
        "Llama-4-tiny",
        LLAMA4_SPECIALS,
        {
            "architectures": ["Llama4ForConditionalGeneration"],
            "model_type": "llama4",
            "image_token_index": 200092,
            "boi_token_index": 200080,
            "eoi_token_index": 200081,
            "text_config": {"model_type": "llama4_text", **_text(202048, 200000, 200008)},
            "vision_config": {
                "model_type": "llama4_vision_model",
                "image_size": 336,
                "patch_size": 14,
                "pixel_shuffle_ratio": 0.5,
                "num_channels": 3,
            },
        },
        LLAMA4_PREPROCESSOR,
        LLAMA4_TEMPLATE,
        "<|image|>",
        "<|image|>",
        {
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot|>",
            "pad_token": "<|end_of_text|>",
            "unk_token": None,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
        generation={"bos_token_id": 200000, "eos_token_id": [200001, 200008]},
    )


def phi3_v() -> Family:
    return Family(
        "phi3_v",
        "Phi-3-vision-tiny",
        PHI3_SPECIALS,
        {
            "architectures": ["Phi3VForCausalLM"],
            "model_type": "phi3_v",
            **_text(32064, 1, 32000),
            "img_processor": {
                "image_dim_out": 1024,
                "model_name": "openai/clip-vit-large-patch14-336",
                "name": "clip_vision_model",
                "num_img_tokens": 144,
            },
        },
        PHI3V_PREPROCESSOR,
        PHI3V_TEMPLATE,
        "<|image|>",
        "<|image|>",
        {**_LLAMA_TOKENIZER, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
        generation={"bos_token_id": 1, "eos_token_id": [32000, 32001, 32007]},
    )


def gemma4() -> Family:
    return Family(
        "gemma4",
        "gemma-4-tiny",
        GEMMA4_SPECIALS,
        {
            "architectures": ["Gemma4ForConditionalGeneration"],
            "model_type": "gemma4",
            "boi_token_id": 255999,
            "eoi_token_id": 258882,
            "image_token_id": 258880,
            "video_token_id": 258884,
            "text_config": {"model_type": "gemma4_text", **_text(262144, 2, 1)},
            "vision_config": {
                "model_type": "gemma4_vision",
                "patch_size": 16,
                "pooling_kernel_size": 3,
                "default_output_length": 280,
            },
        },
        GEMMA4_PREPROCESSOR,
        GEMMA4_TEMPLATE,
        "<|image|>",
        "<|image|>",
        {
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
        generation={"bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0},
    )


def gemma4_unified() -> Family:
    """Gemma 4 unified: Gemma 4's tokens and template; Gemma4UnifiedConfig (its vision config
    has no tower, only the patch geometry and the embedder's sizes)."""
    base = gemma4()
    config = {
        **base.config,
        "architectures": ["Gemma4UnifiedForConditionalGeneration"],
        "model_type": "gemma4_unified",
        "text_config": {"model_type": "gemma4_unified_text", **_text(262144, 2, 1)},
        "vision_config": {
            "model_type": "gemma4_unified_vision",
            "patch_size": 16,
            "pooling_kernel_size": 3,
            "mm_embed_dim": 64,
            "mm_posemb_size": 1120,
        },
    }
    return replace(
        base,
        family="gemma4_unified",
        name="gemma-4-unified-tiny",
        config=config,
        preprocessor=GEMMA4_UNIFIED_PREPROCESSOR,
    )


def glm5_next() -> Family:
    return Family(
        "glm5_next",
        "GLM-5-next-tiny",
        GLM5_NEXT_SPECIALS,
        {
            "architectures": ["Glm5NextForConditionalGeneration"],
            "model_type": "glm5_next",
            **_text(154880, 154820, 154820),
            "image_token_id": 154854,
            "video_token_id": 154855,
            "image_start_token_id": 154830,
            "image_end_token_id": 154831,
            "video_start_token_id": 154832,
            "video_end_token_id": 154833,
            "text_config": {"model_type": "glm5_next_text", **_text(154880, 154820, 154820)},
            "vision_config": {
                "model_type": "glm5_next_vision",
                "patch_size": 14,
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
            },
        },
        GLM5_NEXT_PREPROCESSOR,
        GLM5_NEXT_TEMPLATE,
        "<|image|>",
        "<|image|>",
        {
            "bos_token": None,
            "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
        generation={"eos_token_id": [154820], "pad_token_id": 154820},
    )


MINIMAX_M3_TEMPLATE = (  # M3's template renders a bare ]<]image[>[ per image
    "{%- for message in messages -%}"
    "{{- ']~b]' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for content in message['content'] -%}"
    "{%- if content['type'] in ('image', 'image_url') -%}"
    "{{- ']<]image[>[' -}}"
    "{%- elif 'text' in content -%}{{- content['text'] -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '[e~[\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- ']~b]ai\\n' -}}{%- endif -%}"
)
MINIMAX_M3_SPECIALS = (  # the published MiniMax-M3 tokenizer's ids
    ("]~b]", 200019),
    ("[e~[", 200020),
    ("]<]image[>[", 200025),
    ("]<]video[>[", 200026),
    ("]<]start of image[>[", 200029),
    ("]<]end of image[>[", 200030),
    ("]<]start of video[>[", 200031),
    ("]<]end of video[>[", 200032),
    ("]~!b[", 200034),
)
MINIMAX_M3_PREPROCESSOR = {  # the published values (size [672, 672]: the class default)
    "image_processor_type": "MiniMaxM3VLImageProcessor",
    "processor_class": "MiniMaxM3VLProcessor",
    "do_resize": True,
    "do_rescale": True,
    "do_normalize": True,
    "do_convert_rgb": True,
    "resample": 3,
    "rescale_factor": 1 / 255,
    "image_mean": CLIP_MEAN,
    "image_std": CLIP_STD,
    "size": [672, 672],
    "min_pixels": 3136,
    "max_pixels": 451584,
    "patch_size": 14,
    "merge_size": 2,
    "temporal_patch_size": 2,
}


def minimax_m3_vl() -> Family:
    return Family(
        "minimax_m3_vl",
        "MiniMax-M3-tiny",
        MINIMAX_M3_SPECIALS,
        {
            "architectures": ["MiniMaxM3SparseForConditionalGeneration"],
            "model_type": "minimax_m3_vl",
            "image_token_index": 200025,
            "video_token_index": 200026,
            "text_config": {"model_type": "minimax_m3_vl_text", **_text(200064, 200034, 200020)},
            "vision_config": {
                "model_type": "minimax_m3_vl_vision",
                "patch_size": 14,
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
            },
        },
        MINIMAX_M3_PREPROCESSOR,
        MINIMAX_M3_TEMPLATE,
        "]<]image[>[",
        "]<]image[>[",
        {
            "bos_token": "]~!b[",
            "eos_token": "[e~[",
            "pad_token": None,
            "unk_token": None,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
        generation={"bos_token_id": 200034, "eos_token_id": 200020},
    )


def inkling() -> Family:
    return Family(
        "inkling",
        "Inkling-tiny",
        INKLING_SPECIALS,
        {
            "architectures": ["InklingForConditionalGeneration"],
            "model_type": "inkling_mm_model",
            **_text(200064, 1, 2),
            "image_token_id": 200054,
            "audio_token_id": 200053,
            "image_bos_token_id": 200005,
            "audio_bos_token_id": 200020,
            "text_config": {"model_type": "inkling_text", **_text(200064, 1, 2)},
            # smg enables images when the vision tower has a decoder_dmodel
            "vision_config": {"model_type": "inkling_vision", "decoder_dmodel": 64},
        },
        INKLING_PREPROCESSOR,
        INKLING_TEMPLATE,
        "<|unused_200054|>",
        "<|unused_200054|>",
        {
            "bos_token": "<s>",
            "eos_token": "</s>",
            "pad_token": None,
            "unk_token": None,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
        generation={"bos_token_id": 1, "eos_token_id": 2},
    )


def kimi_k25() -> Family:
    return Family(
        "kimi_k25",
        "Kimi-K2.5-tiny",
        KIMI_K25_SPECIALS,
        {
            "architectures": ["KimiK25ForConditionalGeneration"],
            "model_type": "kimi_k25",
            **_text(163840, 163584, 163585),
            "media_placeholder_token_id": 163605,
            "image_token_id": 163605,
            "text_config": {"model_type": "deepseek_v3", **_text(163840, 163584, 163585)},
            "vision_config": {
                "model_type": "kimi_k25_vision",
                "patch_size": 14,
                "merge_kernel_size": [2, 2],
            },
        },
        KIMI_K25_PREPROCESSOR,
        KIMI_K25_TEMPLATE,
        "<|media_pad|>",
        "<|media_pad|>",
        {
            "bos_token": "[BOS]",
            "eos_token": "[EOS]",
            "pad_token": "[EOS]",
            "unk_token": None,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
        generation={"bos_token_id": 163584, "eos_token_id": [163585], "pad_token_id": 163585},
    )


# Nemotron-H-Omni (Nemotron 3 Nano Omni): <image> is the checkpoints' img_context_token_id 18;
# <img> / </img> are the reserved slots 19 / 20 the Omni tokenizer renamed (our defaults: see
# rust/src/processors/nemotron.rs for the sources); the directory carries them and both sides read
# them from it.
NEMOTRON_OMNI_SPECIALS = (
    ("<unk>", 0),
    ("<s>", 1),
    ("</s>", 2),
    ("<|im_start|>", 10),
    ("<|im_end|>", 11),
    ("<image>", 18),
    ("<img>", 19),
    ("</img>", 20),
)
NEMOTRON_OMNI_PREPROCESSOR = {  # the released keys (norm_mean / norm_std) at the class values
    "image_processor_type": "NemotronH_Omni_Reasoning_V3ImageProcessor",
    "patch_size": 16,
    "downsample_ratio": 0.5,
    "min_num_patches": 1024,
    "max_num_patches": 13312,
    "norm_mean": CLIP_MEAN,
    "norm_std": CLIP_STD,
}


def nemotron_h_omni() -> Family:
    """The released checkpoints' model type, which smg 1.13.0's nemotron_omni spec matches; its
    config check wants the released vision values (patch 16, downsample 0.5, CLIP mean/std,
    1024 - 13312 patches, the video settings)."""
    text = _text(131072, 1, 11)
    return Family(
        "nemotron_h_omni",
        "Nemotron-3-Nano-Omni-tiny",
        NEMOTRON_OMNI_SPECIALS,
        {
            "architectures": ["NemotronH_Nano_Omni_Reasoning_V3"],
            "model_type": "NemotronH_Nano_Omni_Reasoning_V3",
            "patch_size": 16,
            "downsample_ratio": 0.5,
            "force_image_size": 512,
            "norm_mean": CLIP_MEAN,
            "norm_std": CLIP_STD,
            "img_context_token_id": 18,
            "img_context_token": "<image>",
            "img_start_token": "<img>",
            "img_end_token": "</img>",
            "sound_config": None,
            "vision_config": {
                "args": {"min_num_patches": 1024, "max_num_patches": 13312},
                "video_target_num_patches": 1024,
                "video_temporal_patch_size": 2,
                "video_maintain_aspect_ratio": True,
            },
            "llm_config": {"model_type": "nemotron_h", **text},
            "text_config": {"model_type": "nemotron_h", **text},
        },
        NEMOTRON_OMNI_PREPROCESSOR,
        _chatml("<image>"),
        "<image>",
        "<image>",
        {
            "bos_token": "<s>",
            "eos_token": "<|im_end|>",
            "pad_token": "</s>",
            "unk_token": "<unk>",
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
        generation={"bos_token_id": 1, "eos_token_id": [11], "pad_token_id": 2},
    )


#: Every family a directory can be written for, by our family name... and by the name the
#: agreement test uses (``llava`` for the LLaVA-1.5 checkpoint whose image processor is CLIP's).
FAMILIES = {
    "qwen2_vl": qwen2_vl,
    "qwen2_5_vl": qwen2_5_vl,
    "qwen3_vl": qwen3_vl,
    "qwen3_5": qwen3_5,
    "llava": llava,
    "llava_next": llava_next,
    "llama4": llama4,
    "phi3_v": phi3_v,
    "gemma4": gemma4,
    "gemma4_unified": gemma4_unified,
    "glm5_next": glm5_next,
    "qwen3_omni_moe": qwen3_omni_moe,
    "minimax_m3_vl": minimax_m3_vl,
    "inkling": inkling,
    "kimi_k25": kimi_k25,
    "nemotron_h_omni": nemotron_h_omni,
}


# -- the tokenizer ------------------------------------------------------------------------------
@functools.cache
def _trained() -> str:
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
    return tok.to_str()


def build_tokenizer(added: tuple[tuple[str, int], ...]) -> Tokenizer:
    """The trained byte-level BPE with ``added`` at their ids: in the (sparse) vocabulary and as
    special added tokens; the trained pieces take the ids left free, in their trained order."""
    data = json.loads(_trained())
    taken = {tid for _, tid in added}
    pieces = sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1])
    free = (i for i in range(len(pieces) + len(taken)) if i not in taken)
    vocab = {piece: next(free) for piece, _ in pieces}
    for content, tid in added:
        vocab[content] = tid
    data["model"]["vocab"] = vocab
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
        for content, tid in sorted(added, key=lambda a: a[1])
    ]
    tok = Tokenizer.from_str(json.dumps(data))
    for content, tid in added:
        assert tok.token_to_id(content) == tid, (content, tok.token_to_id(content), tid)
    return tok


def tokenizer_config(family: Family) -> dict[str, Any]:
    return {
        "add_bos_token": False,
        "add_eos_token": False,
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
            for content, tid in family.added
        },
        "clean_up_tokenization_spaces": False,
        "model_max_length": 32768,
        "split_special_tokens": False,
        **family.tokenizer_extra,
        "chat_template": family.template,
    }


def write_model_dir(family: Family | str, out: str | Path) -> Path:
    """Write ``family``'s directory (created if missing) into ``out`` and return its path."""
    spec = FAMILIES[family]() if isinstance(family, str) else family
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(spec.added).save(str(out / "tokenizer.json"))
    files: dict[str, Any] = {
        "tokenizer_config.json": tokenizer_config(spec),
        "config.json": {"torch_dtype": "bfloat16", "transformers_version": "4.45.0", **spec.config},
        "preprocessor_config.json": spec.preprocessor,
        "generation_config.json": {**spec.generation, "transformers_version": "4.45.0"},
    }
    if spec.processor_config is not None:
        files["processor_config.json"] = spec.processor_config
    for name, content in files.items():
        (out / name).write_text(json.dumps(content, indent=2))
    return out
