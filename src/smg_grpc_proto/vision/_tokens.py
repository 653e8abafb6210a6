"""How many placeholder tokens each image takes in the prompt, as transformers' processors count.

* Qwen families: ``grid_h * grid_w // merge_size**2`` (``image_grid_thw``, ``video_grid_thw``
  with ``grid_t`` too) — always known.
* CLIP/LLaVA-1.5/SigLIP and LLaVA-NeXT: depends on the vision tower, not on the image processor
  (``LlavaProcessor``/``LlavaNextProcessor``'s ``patch_size``, ``num_additional_image_tokens``
  and ``vision_feature_select_strategy``, stored in a model's ``processor_config.json``), so it
  is counted only when :class:`VisionTokens` is given.
* Pixtral: ``PixtralProcessor`` expands ``[IMG]`` into one ``[IMG]`` per patch of a row and an
  ``[IMG_BREAK]`` after each row, the last break becoming ``[IMG_END]``: ``rows * (cols + 1)``
  with ``rows = height // P`` and ``cols = width // P`` of the processed ``image_sizes`` and
  ``P = patch_size * spatial_merge_size`` — always known, since ``spatial_merge_size`` is a key
  of the Pixtral configuration (1 for Pixtral-12B, 2 for Mistral-Small-3.1).
* Gemma 3: ``Gemma3Processor.replace_image_token`` writes one full image sequence
  (``<start_of_image>``, ``image_seq_length`` image tokens, ``<end_of_image>``) for the image
  and one more per pan-and-scan crop: ``(1 + num_crops) * image_seq_length`` image tokens (the
  ``<image_soft_token>`` the model fills; the begin/end markers and the text around the crops
  are not counted). ``image_seq_length`` (256 for the published checkpoints, the model config's
  ``mm_tokens_per_image``) is a key of the Gemma 3 configuration, so the count is always known.
* InternVL: ``InternVLProcessor.replace_image_token`` writes ``<img>``, ``image_seq_length *
  num_patches`` ``<IMG_CONTEXT>`` tokens and ``</img>``: ``num_patches * image_seq_length``
  image tokens (the markers not counted; ``_get_num_multimodal_tokens`` adds 2 for them).
  ``image_seq_length`` (``InternVLProcessor``'s default and the published checkpoints' 256) is
  a key of the InternVL configuration.
* Idefics3 and SmolVLM: ``get_image_prompt_string`` writes ``image_seq_len`` ``<image>``
  tokens per tile and as many for the global image: ``(rows * cols + 1) * image_seq_len``
  for a split image, ``image_seq_len`` for an unsplit one (``rows == cols == 0``). Only the
  ``<image>`` tokens are counted, not ``<fake_token_around_image>``, ``<row_r_col_c>``,
  ``<global-img>`` or the newlines around them. ``image_seq_len`` (169 by default, from the
  directory's ``processor_config.json`` with ``from_pretrained``) is a key of the
  configuration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "VisionTokens",
    "gemma3_tokens",
    "idefics3_tokens",
    "internvl_tokens",
    "llava_next_tokens",
    "llava_tokens",
    "pixtral_tokens",
]


@dataclass(frozen=True)
class VisionTokens:
    """The processor settings that turn a processed image into a token count."""

    patch_size: int
    """The vision tower's patch size (14 for the CLIP ViT-L/14 of LLaVA)."""
    num_additional_image_tokens: int = 0
    """Extra embeddings per image (1 for a CLS token)."""
    vision_feature_select_strategy: str | None = None
    """``"default"`` drops one token (the CLS); ``"full"`` keeps them all."""

    @classmethod
    def from_processor_config(cls, config: Mapping[str, Any]) -> VisionTokens | None:
        """From a ``processor_config.json`` (None when it names no ``patch_size``)."""
        patch = config.get("patch_size")
        if not isinstance(patch, int) or isinstance(patch, bool) or patch < 1:
            return None
        extra = config.get("num_additional_image_tokens") or 0
        strategy = config.get("vision_feature_select_strategy")
        return cls(patch, int(extra), strategy if isinstance(strategy, str) else None)

    def _adjust(self, count: int) -> int:
        return count - 1 if self.vision_feature_select_strategy == "default" else count


def llava_tokens(height: int, width: int, vision: VisionTokens) -> int:
    """``LlavaProcessor``: tokens of a processed image of ``height x width``."""
    p = vision.patch_size
    return vision._adjust((height // p) * (width // p) + vision.num_additional_image_tokens)


def pixtral_tokens(height: int, width: int, patch_height: int, patch_width: int) -> int:
    """``PixtralProcessor.replace_image_token``: placeholders of a processed image of
    ``height x width`` with the (merged) patch ``patch_height x patch_width``."""
    rows, cols = height // patch_height, width // patch_width
    return rows * (cols + 1)


def gemma3_tokens(num_crops: int, image_seq_length: int) -> int:
    """``Gemma3Processor.replace_image_token``: image tokens of an image with ``num_crops``
    pan-and-scan crops."""
    return (1 + num_crops) * image_seq_length


def llama4_tokens(rows: int, cols: int, per_tile: int) -> int:
    """``<|patch|>`` tokens ``Llama4Processor`` writes for an image of ``rows x cols`` tiles:
    ``per_tile`` for each tile and for the global tile, which only a split image has."""
    return per_tile * (rows * cols + 1) if rows * cols > 1 else per_tile


def llama4_tokens_per_tile(tile: int, patch_size: int, pixel_shuffle_ratio: float) -> int:
    """``(tile // patch_size) ** 2 // round(1 / pixel_shuffle_ratio ** 2)`` (144 for Llama 4)."""
    downsample = round(1.0 / (pixel_shuffle_ratio**2))
    return (tile // patch_size) * (tile // patch_size) // downsample


def idefics3_tokens(rows: int, cols: int, image_seq_len: int) -> int:
    """``get_image_prompt_string`` of Idefics3/SmolVLM: ``<image>`` tokens of an image split
    into ``rows x cols`` tiles (0 x 0: not split), the global image included."""
    return (rows * cols + 1) * image_seq_len


def internvl_tokens(num_patches: int, image_seq_length: int) -> int:
    """``InternVLProcessor.replace_image_token``: ``<IMG_CONTEXT>`` tokens of an image with
    ``num_patches`` tiles (its thumbnail included)."""
    return num_patches * image_seq_length


def llava_next_tokens(
    orig_height: int,
    orig_width: int,
    height: int,
    width: int,
    pinpoints: Sequence[Sequence[int]],
    vision: VisionTokens,
) -> int:
    """``LlavaNextProcessor._get_number_of_features`` (then minus one for ``"default"``)."""
    best_h, best_w = _select_best_resolution(orig_height, orig_width, pinpoints)
    scale_height, scale_width = best_h // height, best_w // width
    patches_height = height // vision.patch_size
    patches_width = width // vision.patch_size
    current_height = patches_height * scale_height
    current_width = patches_width * scale_width
    original_aspect_ratio = orig_width / orig_height
    current_aspect_ratio = current_width / current_height
    if original_aspect_ratio > current_aspect_ratio:
        new_height = int(round(orig_height * (current_width / orig_width), 7))
        padding = (current_height - new_height) // 2
        current_height -= padding * 2
    else:
        new_width = int(round(orig_width * (current_height / orig_height), 7))
        padding = (current_width - new_width) // 2
        current_width -= padding * 2
    unpadded = current_height * current_width
    newline = current_height
    base = patches_height * patches_width + vision.num_additional_image_tokens
    return vision._adjust(unpadded + newline + base)


def _select_best_resolution(
    height: int, width: int, pinpoints: Sequence[Sequence[int]]
) -> tuple[int, int]:
    # transformers.image_processing_utils.select_best_resolution (the native code runs the same
    # arithmetic for the pixels; the token count only needs the winner).
    best = (int(pinpoints[0][0]), int(pinpoints[0][1]))
    max_effective = 0
    min_wasted = math.inf
    for ph, pw in pinpoints:
        scale = min(pw / width, ph / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        wasted = pw * ph - effective
        if effective > max_effective or (effective == max_effective and wasted < min_wasted):
            max_effective, min_wasted, best = effective, wasted, (int(ph), int(pw))
    return best
