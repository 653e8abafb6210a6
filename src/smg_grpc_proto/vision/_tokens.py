"""The vision-tower settings some families count their placeholder tokens with.

Every family counts its tokens natively, in its own Rust module (``rust/src/processors/``), as
its transformers processor writes them into the prompt; the counts come back with the tensors
(``ProcessorOutput.num_image_tokens``, ``num_video_tokens``). For CLIP, LLaVA-1.5, SigLIP and
LLaVA-NeXT the count depends on the vision tower rather than on the image processor
(``LlavaProcessor``/``LlavaNextProcessor``'s ``patch_size``, ``num_additional_image_tokens`` and
``vision_feature_select_strategy``, stored in a model's ``processor_config.json``), so it is
counted only when :class:`VisionTokens` is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["VisionTokens"]


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

    def native(self) -> tuple[int, int, str | None]:
        """The settings as the native ``Preprocessor`` takes them."""
        return (
            self.patch_size,
            self.num_additional_image_tokens,
            self.vision_feature_select_strategy,
        )
