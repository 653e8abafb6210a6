"""Gateway side, engine-independent: media in, tensors + token counts + content hashes out.

:class:`VisionModel` pairs an :class:`~smg_grpc_proto.vision.ImageProcessor` with the model's
placeholder token ids (from ``config.json``); :meth:`VisionModel.prepare` runs the processor and
returns :class:`PreparedMedia`: the tensors, the per-item placeholder counts (the model's rule),
the per-item blake3 content hashes and the per-item layout every engine builder needs.
:func:`expand_placeholders` turns a prompt with one anchor token per item into the expanded
``input_ids`` and the placeholder ranges.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from smg_grpc_proto import _core
from smg_grpc_proto._core import native as _native
from smg_grpc_proto.errors import (
    MultimodalError,
    MultimodalLayoutError,
    PlaceholderError,
)
from smg_grpc_proto.vision import DeferredOutput, ImageProcessor, ProcessorOutput
from smg_grpc_proto.vision._config import Family
from smg_grpc_proto.vision._glm_video import (
    GLM_VIDEO_FAMILIES,
    GLM_VIDEO_TOKENS,
    GlmVideoMetadata,
    glm_video_replacement,
    glm_video_timestamps,
)
from smg_grpc_proto.vision._inputs import flatten_images, flatten_videos, to_native
from smg_grpc_proto.vision._processor import TENSOR_NAMES
from smg_grpc_proto.vision._tokens import VisionTokens

if TYPE_CHECKING:
    from smg_grpc_proto._native import PendingTensor

__all__ = [
    "Modality",
    "PreparedMedia",
    "VisionModel",
    "content_hash",
    "expand_placeholders",
    "image_format",
    "placeholder_ranges",
]

Modality = Literal["image", "video"]
Layout = Literal["batched", "flat", "shared"]

_HASH_DOMAIN = b"smg-grpc-proto/media/v1\x00"

_VIDEO_NAMES = frozenset(("pixel_values_videos", "video_grid_thw", "video_second_per_grid"))
#: The tensors of each modality (by transformers' name), fixed: looked up on every request.
_MODALITY_NAMES: dict[str, frozenset[str]] = {
    "video": _VIDEO_NAMES,
    "image": frozenset(n for n in TENSOR_NAMES if n not in _VIDEO_NAMES),
}


def _published(processor: ImageProcessor) -> tuple[int | None, int | None, VisionTokens | None]:
    """The family's published checkpoints (the Rust family's ``Hf.published``): image and video
    token ids and the CLIP-like tower's token rule; ``None`` each where there is none."""
    published = processor._native.published()
    if published is None:
        return None, None, None
    tower = published["vision_tokens"]
    return (
        published["image"],
        published["video"],
        VisionTokens(*tower) if tower is not None else None,
    )


@functools.cache
def _native_of(family: str) -> _native.Preprocessor | None:
    """The native preprocessor of one of our families at its class defaults (what its rules
    are read from); ``None`` for a name that is not one of ours."""
    try:
        return ImageProcessor(family)._native  # type: ignore[arg-type]
    except (MultimodalError, ValueError):
        return None


@functools.cache  # fixed per family: asked on every request
def _structured(family: str) -> bool:
    """Whether one of our families' image anchor becomes more than a run of one token."""
    native = _native_of(family)
    return native is not None and native.replacement_spec() is not None


def _unsampled_shape(name: str, shape: list[int]) -> list[int]:
    """``shape`` without its leading sample dimension, which must be 1 (and not the only one)."""
    if len(shape) < 2 or shape[0] != 1:
        raise MultimodalLayoutError(
            f"{name}: shape {shape}, expected a leading sample dimension of 1",
            field=name,
            expected=1,
            actual=shape[0] if shape else 0,
        )
    return shape[1:]


@functools.cache  # fixed per family: asked on every request
def _count_tensor(family: str) -> str | None:
    """The per-image placeholder count tensor the family's engine model takes as an input
    (Phi-4-multimodal ``num_img_tokens``), from the Rust family; ``None`` for other families and
    names that are not one of ours."""
    native = _native_of(family)
    published = native.published() if native is not None else None
    return published["count_tensor"] if published is not None else None


def _tokenizer_of(directory: Path) -> Callable[[str], Sequence[int]] | None:
    """The model's ``tokenizer.json`` as a function of a text piece (no special tokens added),
    when the ``tokenizers`` library is importable and the file is a whole tokenizer."""
    path = directory / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(path))
    except Exception:  # not importable, or not a complete tokenizer.json
        return None

    def tokenize(text: str) -> list[int]:
        return [int(i) for i in tokenizer.encode(text, add_special_tokens=False).ids]

    return tokenize


TokenIds = Mapping[str, int | Sequence[int]]
"""Token ids by name: one id, or the ids of a text piece the tokenizer writes as several."""


def _tokenized(directory: Path, names: Sequence[str]) -> dict[str, int | tuple[int, ...]]:
    """``names`` as the model's ``tokenizer.json`` encodes them (no special tokens added), when
    the ``tokenizers`` library is importable and the file is a whole tokenizer; else nothing."""
    path = directory / "tokenizer.json"
    if not names or not path.is_file():
        return {}
    try:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(path))
    except Exception:  # not importable, or not a complete tokenizer.json
        return {}
    out: dict[str, int | tuple[int, ...]] = {}
    for name in names:
        ids = tuple(int(i) for i in tokenizer.encode(name, add_special_tokens=False).ids)
        if ids:
            out[name] = ids[0] if len(ids) == 1 else ids
    return out


def _id_pairs(names: Sequence[str], ids: TokenIds) -> list[tuple[str, int]]:
    """``(name, id)`` pairs for the native replacement, a text piece's ids in order."""
    pairs: list[tuple[str, int]] = []
    for name in names:
        value = ids.get(name)
        if isinstance(value, int):
            pairs.append((name, value))
        elif value is not None:
            pairs.extend((name, int(v)) for v in value)
    return pairs


def _join_table(pieces: Sequence[str], ids: TokenIds) -> tuple[tuple[int, int, int], ...]:
    """Every ``(left, right, merged)`` of the join ``pieces`` that have one id each: ``left``'s
    text followed by ``right``'s is ``merged``'s text (the tokenizer writes the pair as it)."""
    single: dict[str, int] = {}
    for piece in pieces:
        value = ids.get(piece)
        if isinstance(value, int):
            single[piece] = value
    return tuple(
        (left_id, right_id, single[left + right])
        for left, left_id in single.items()
        for right, right_id in single.items()
        if left + right in single
    )


def _added_tokens(directory: Path, names: Sequence[str]) -> dict[str, int]:
    """The ids of ``names`` among the tokenizer's added tokens: ``tokenizer.json``'s
    ``added_tokens`` and ``tokenizer_config.json``'s ``added_tokens_decoder`` (the first wins)."""
    found: dict[str, int] = {}
    wanted = set(names)
    for file, key in (("tokenizer.json", "added_tokens"), ("tokenizer_config.json", "decoder")):
        path = directory / file
        if not path.is_file():
            continue
        with open(path, encoding="utf-8") as f:
            loaded = json.load(f)
        if not isinstance(loaded, dict):
            continue
        entries: list[tuple[Any, Any]] = []
        if key == "added_tokens" and isinstance(loaded.get("added_tokens"), list):
            entries = [
                (t.get("content"), t.get("id"))
                for t in loaded["added_tokens"]
                if isinstance(t, dict)
            ]
        elif key == "decoder" and isinstance(loaded.get("added_tokens_decoder"), dict):
            for index, t in loaded["added_tokens_decoder"].items():
                content = t.get("content") if isinstance(t, dict) else None
                entries.append((content, int(index) if str(index).isdigit() else None))
        for content, token_id in entries:
            if (
                content in wanted
                and content not in found
                and isinstance(token_id, int)
                and not isinstance(token_id, bool)
                and token_id >= 0
            ):
                found[content] = token_id
    missing = [n for n in names if n not in found]
    if missing:
        found.update(_vocab_tokens(directory / "tokenizer.json", missing))
    return found


def _byte_level(text: str) -> str:
    """``text`` as a byte-level BPE vocabulary spells it (GPT-2's ``bytes_to_unicode``:
    printable bytes stand for themselves, the others map to U+0100 upwards in byte order)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(0x100 + extra)
            extra += 1
    return "".join(table[b] for b in text.encode("utf-8"))


def _vocab_tokens(path: Path, names: Sequence[str]) -> dict[str, int]:
    """The ids of ``names`` that are ordinary tokens of a byte-level BPE ``tokenizer.json``
    (replacement pieces that are text, such as Idefics3's ``\n\n`` or ``_col``)."""
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        loaded = json.load(f)
    model = loaded.get("model") if isinstance(loaded, dict) else None
    if not isinstance(model, dict) or model.get("type", "BPE") != "BPE":
        return {}
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        return {}
    found: dict[str, int] = {}
    for name in names:
        token_id = vocab.get(_byte_level(name))
        if isinstance(token_id, int) and not isinstance(token_id, bool) and token_id >= 0:
            found[name] = token_id
    return found


def _config_int(config: Mapping[str, Any], *names: str) -> int | None:
    # Qwen3-Omni keeps its token ids in ``thinker_config`` (the model the media go to).
    for source in (config, config.get("text_config") or {}, config.get("thinker_config") or {}):
        for name in names:
            value = source.get(name) if isinstance(source, Mapping) else None
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return value
    return None


@dataclass(frozen=True)
class VisionModel:
    """A vision-language model as the gateway sees it: its image processor and the token ids
    that stand for its media in the prompt.

    ``image_token_id`` is the token whose positions take the image embeddings: for most
    families also the anchor the chat template writes once per image (Qwen ``<|image_pad|>``
    151655, LLaVA ``<image>`` 32000) and the token the expanded run is made of;
    ``video_token_id`` the same for videos (Qwen ``<|video_pad|>`` 151656).

    A family whose anchor becomes more than a run of one token (Llama 4: ``<|image|>`` becomes
    ``<|image_start|>``, the tiles' ``<|patch|>`` runs and separators, ``<|image|>``, the global
    tile's run, ``<|image_end|>``) writes its replacement with ``token_ids`` (its special tokens
    by name; the rule is the Rust family's, ``replacement_spec``); ``image_token_id`` is then
    the embedding token (Llama 4 ``<|patch|>``, ``config.json``'s ``image_token_index``).
    """

    processor: ImageProcessor
    image_token_id: int
    video_token_id: int | None = None
    model_type: str = ""
    token_ids: TokenIds = field(default_factory=dict)
    """The special tokens (and text pieces) the family's prompt replacement is written with,
    by name; a text piece the tokenizer writes as several tokens maps to their ids in order."""
    tokenize: Callable[[str], Sequence[int]] | None = field(default=None, compare=False, repr=False)
    """The model's tokenizer on a text piece (no special tokens added), for replacement text
    that depends on the item (GLM's video timestamps) and is not in :attr:`token_ids`;
    :meth:`from_pretrained` reads it from ``tokenizer.json`` when ``tokenizers`` is importable."""

    @classmethod
    def from_pretrained(cls, model_dir: str | os.PathLike[str], **kwargs: Any) -> VisionModel:
        """From a local model directory: ``preprocessor_config.json`` (and
        ``processor_config.json``) for the processor, ``config.json`` for the token ids.
        ``kwargs`` go to :class:`~smg_grpc_proto.vision.ImageProcessor`."""
        directory = Path(model_dir)
        processor = ImageProcessor.from_pretrained(directory, **kwargs)
        spec = processor._native.replacement_spec()
        image_default, video_default, tower = _published(processor)
        if processor.vision_tokens is None and tower is not None:
            kwargs["vision_tokens"] = tower
            processor = ImageProcessor.from_pretrained(directory, **kwargs)
        config: dict[str, Any] = {}
        if (directory / "config.json").is_file():
            with open(directory / "config.json", encoding="utf-8") as f:
                loaded = json.load(f)
            if isinstance(loaded, dict):
                config = loaded
        defaults = (image_default, video_default)
        named: dict[str, int | Sequence[int]] = {}
        if spec is not None:
            names = [*spec["tokens"], *(j for j in spec["joins"] if j not in spec["tokens"])]
            named = {**_added_tokens(directory, names)}
            # text pieces (Gemma 3's "\n\n", its pan-and-scan text) as the tokenizer writes them
            named.update(_tokenized(directory, [t for t in names if t not in named]))
            fallback = spec["defaults"]
            named.update({t: fallback[t] for t in names if t not in named and t in fallback})
            # the anchor and embedding tokens are needed always; another piece only when a
            # replacement uses it (Gemma 3's pan-and-scan text), and the error then names it
            missing = [t for t in (spec["anchor"], spec["embed"]) if t not in named]
            if missing:
                raise MultimodalError(
                    f"{directory}: the tokenizer (tokenizer.json added_tokens, "
                    f"tokenizer_config.json added_tokens_decoder) has no id for {missing}",
                    field="token_ids",
                )
            embed = named[spec["embed"]]
            if isinstance(embed, int):
                defaults = (embed, None)
        # media_placeholder_token_id: Kimi-K2.5's published config.json (its <|media_pad|>)
        image = _config_int(
            config, "image_token_id", "image_token_index", "media_placeholder_token_id"
        )
        image = image if image is not None else defaults[0]
        if image is None:
            raise MultimodalError(
                f"{directory / 'config.json'}: no image_token_id or image_token_index, and "
                f"family {processor.family!r} has no default; pass image_token_id",
                field="image_token_id",
            )
        video = _config_int(config, "video_token_id", "video_token_index")
        if spec is not None:
            named[spec["embed"]] = image  # config.json's image token is the embedding token
        tokenize = None
        if processor.family in GLM_VIDEO_FAMILIES:
            # the video prompt's tokens: the published ids, config.json's, the tokenizer's
            glm = dict(GLM_VIDEO_TOKENS[processor.family])
            for name, key in (
                ("<|begin_of_image|>", "image_start_token_id"),
                ("<|end_of_image|>", "image_end_token_id"),
            ):
                value = _config_int(config, key)
                if value is not None:
                    glm[name] = value
            glm["<|image|>"] = image
            glm.update(_added_tokens(directory, list(glm)))
            named.update(glm)
            tokenize = _tokenizer_of(directory)
        return cls(
            processor,
            image,
            video if video is not None else defaults[1],
            str(config.get("model_type", "")),
            named,
            tokenize,
        )

    @classmethod
    def for_family(
        cls,
        family: Family,
        *,
        config: Mapping[str, Any] | None = None,
        image_token_id: int | None = None,
        video_token_id: int | None = None,
        token_ids: TokenIds | None = None,
        tokenize: Callable[[str], Sequence[int]] | None = None,
        **kwargs: Any,
    ) -> VisionModel:
        """The family's class defaults and, unless given, its published checkpoints' token ids
        (Qwen2/2.5/3-VL 151655/151656, Qwen3.5 248056/248057, LLaVA and LLaVA-NeXT 32000,
        Phi-4-multimodal 200010, Phi-3-vision 32044; a family with a replacement rule takes its
        ``token_ids`` from the Rust family's ``replacement_spec`` defaults, e.g. Llama 4
        Scout/Maverick's ``<|image_start|>`` 200080 … ``<|patch|>`` 200092) and, for LLaVA and
        LLaVA-NeXT, their vision tower's token rule (patch 14, one CLS token dropped). A bare
        tower counts as its canonical VLM: CLIP as LLaVA-1.5's (``<image>`` 32000, the CLS
        dropped), SigLIP as PaliGemma's (``<image>`` 257152, every patch a token). ``config``
        overrides transformers config keys; ``kwargs`` go to
        :class:`~smg_grpc_proto.vision.ImageProcessor`."""
        processor = ImageProcessor(family, config, **kwargs)
        image_default, video_default, tower = _published(processor)
        if tower is not None and "vision_tokens" not in kwargs:
            processor = ImageProcessor(family, config, vision_tokens=tower, **kwargs)
        spec = processor._native.replacement_spec()
        defaults = (image_default, video_default)
        named: dict[str, int | Sequence[int]] = {}
        if spec is not None:
            named = {**spec["defaults"], **(token_ids or {})}
            if image_token_id is not None:
                named[spec["embed"]] = image_token_id
            # a piece without a published id (Gemma 3's pan-and-scan text) is needed only when a
            # replacement uses it, and the error then names it
            missing = [t for t in (spec["anchor"], spec["embed"]) if t not in named]
            if missing:
                raise MultimodalError(
                    f"family {family!r}: no id for {missing}; pass token_ids", field="token_ids"
                )
            embed = named[spec["embed"]]
            if isinstance(embed, int):
                defaults = (embed, None)
        image = image_token_id if image_token_id is not None else defaults[0]
        if image is None:
            raise MultimodalError(
                f"family {family!r} has no default image token id; pass image_token_id",
                field="image_token_id",
            )
        video = video_token_id if video_token_id is not None else defaults[1]
        if family in GLM_VIDEO_FAMILIES:
            named = {**GLM_VIDEO_TOKENS[family], "<|image|>": image, **(token_ids or {})}
        return cls(processor, image, video, family, named, tokenize)

    @property
    def family(self) -> Family:
        return self.processor.family

    def prepare(
        self,
        images: Any = None,
        *,
        videos: Any = None,
        video_metadata: Sequence[GlmVideoMetadata | Mapping[str, Any] | None] | None = None,
        threads: int | None = None,
    ) -> PreparedMedia:
        """Process ``images`` (one or a list: encoded bytes, paths, ``uint8`` arrays, PIL
        images) or ``videos`` (Qwen, GLM: lists of frames, already sampled) — one modality per
        call. ``video_metadata`` (GLM only: one entry per video, see
        :class:`~smg_grpc_proto.vision.GlmVideoMetadata`) gives the frames' timestamps the
        GLM video prompt writes."""
        if (images is None) == (videos is None):
            raise MultimodalError(
                "prepare() takes images or videos (one modality per call)", field="images"
            )
        if video_metadata is not None and (videos is None or self.family not in GLM_VIDEO_FAMILIES):
            raise MultimodalError(
                f"{self.family}: video_metadata is read only with GLM videos "
                f"({', '.join(GLM_VIDEO_FAMILIES)})",
                field="video_metadata",
            )
        if images is not None:
            items: list[Any] = [
                to_native(x, f"images[{i}]") for i, x in enumerate(flatten_images(images))
            ]
            output = self.processor.deferred(items, threads=threads)
            counts = output.ready.num_image_tokens
            modality: Modality = "image"
            token = self.image_token_id
            digests = self._digests("image", [[x] for x in items], threads)
            raw = tuple(x if isinstance(x, bytes) else None for x in items)
        else:
            if self.video_token_id is None:
                raise MultimodalError(
                    f"{self.family}: no video token id; this model takes no videos",
                    field="video_token_id",
                )
            clips = [
                [to_native(f, f"videos[{v}][{i}]") for i, f in enumerate(frames)]
                for v, frames in enumerate(flatten_videos(videos))
            ]
            output = self.processor.deferred(videos=clips, threads=threads)
            counts = output.ready.num_video_tokens
            modality = "video"
            token = self.video_token_id
            digests = self._digests("video", clips, threads)
            raw = tuple(None for _ in clips)
        if counts is None:
            raise MultimodalError(
                f"{self.family}: the placeholder count per image depends on the vision tower; "
                "give the processor VisionTokens (processor_config.json)",
                field="vision_tokens",
            )
        if modality == "video" and self.family in GLM_VIDEO_FAMILIES:
            structure = self._glm_video(output.ready, [len(c) for c in clips], video_metadata)
            token = self.image_token_id  # the frames' embeddings go to their <|image|> runs
        else:
            structure = self._structure(output.ready, modality, len(digests))
        return PreparedMedia(
            processed=output,
            modality=modality,
            token_id=token,
            token_counts=structure.pop("token_counts", tuple(counts)),
            hashes=digests,
            family=self.family,
            encoded=raw,
            **structure,
        )

    def wrap(
        self,
        output: ProcessorOutput,
        *,
        modality: Modality = "image",
        video_metadata: Sequence[GlmVideoMetadata | Mapping[str, Any] | None] | None = None,
    ) -> PreparedMedia:
        """A :class:`PreparedMedia` for a :class:`ProcessorOutput` made elsewhere with this
        model's processor settings: its items hashed from their tensors (as
        :meth:`PreparedMedia.from_output` does), and this model's prompt replacement and layout
        — what a family with a structured replacement (Llama 4, the tiled families, GLM videos:
        ``video_metadata`` as for :meth:`prepare`) needs."""
        counts = output.num_video_tokens if modality == "video" else output.num_image_tokens
        if counts is None:
            raise MultimodalError(
                "the output carries no placeholder counts (a CLIP-like tower without "
                "VisionTokens); use PreparedMedia.from_output(..., token_counts=...)",
                field="output",
            )
        token = self.video_token_id if modality == "video" else self.image_token_id
        if token is None:
            raise MultimodalError(
                f"{self.family}: no video token id; this model takes no videos",
                field="video_token_id",
            )
        if modality == "video" and self.family in GLM_VIDEO_FAMILIES:
            structure = self._glm_video(output, None, video_metadata)
            token = self.image_token_id
        elif video_metadata is not None:
            raise MultimodalError(
                f"{self.family}: video_metadata is read only with GLM videos "
                f"({', '.join(GLM_VIDEO_FAMILIES)})",
                field="video_metadata",
            )
        else:
            structure = self._structure(output, modality, len(counts))
        counted = structure.pop("token_counts", tuple(int(c) for c in counts))
        return PreparedMedia._hashed(output, modality, token, counted, self.family, structure)

    def _glm_video(
        self,
        ready: ProcessorOutput,
        frames: Sequence[int] | None,
        metadata: Sequence[GlmVideoMetadata | Mapping[str, Any] | None] | None,
    ) -> dict[str, Any]:
        """The :class:`PreparedMedia` fields of GLM videos: each video's ``<|video|>`` anchor
        becomes its frame groups (``Glm4vProcessor.replace_video_token``), whose ``<|image|>``
        runs take the embeddings; ``frames`` is the frame count per video (``None``, for an
        output made elsewhere: the metadata's count, else ``2 · grid_t``, which gives the same
        fallback timestamps as the odd count ``2 · grid_t - 1``)."""
        if ready.video_grid_thw is None:
            raise MultimodalError(f"{self.family}: no video_grid_thw output", field="output")
        grids = np.asarray(ready.video_grid_thw).reshape(-1, 3).tolist()
        if metadata is not None and len(metadata) != len(grids):
            raise MultimodalError(
                f"video_metadata: one entry per video ({len(grids)}), got {len(metadata)}",
                field="video_metadata",
            )
        merge = self.processor.config.get("merge_size", 2)
        replacements = []
        for v, grid in enumerate(grids):
            meta = GlmVideoMetadata.of(
                metadata[v] if metadata is not None else None, f"video_metadata[{v}]"
            )
            if frames is not None:
                n = frames[v]
            elif meta.timestamps is not None:
                n = len(meta.timestamps)
            elif meta.frames_indices is not None:
                n = len(meta.frames_indices)
            else:
                n = 2 * int(grid[0])
            stamps = glm_video_timestamps(n, int(grid[0]), meta)
            replacements.append(
                glm_video_replacement(
                    self.family,
                    grid,
                    stamps,
                    self.token_ids,
                    self.tokenize,
                    merge_size=int(merge),
                )
            )
        if self.video_token_id is None:
            raise MultimodalError(
                f"{self.family}: no video token id (<|video|>, the prompt's anchor)",
                field="video_token_id",
            )
        return {
            "token_counts": tuple(int(e.sum()) for _, e in replacements),
            "anchor_id": self.video_token_id,
            "replacements": tuple(replacements),
        }

    def _structure(self, ready: ProcessorOutput, modality: Modality, n: int) -> dict[str, Any]:
        """For a family with a structured replacement, the :class:`PreparedMedia` fields that
        carry it (the replacements, the items' rows, the layout, the joins; ``token_counts``
        become the embedding positions); empty otherwise."""
        spec = self.processor._native.replacement_spec() if modality == "image" else None
        if spec is None:
            return {}
        grids = []
        for name in spec["grid"]:
            values = getattr(ready, name, None)
            if values is None:
                raise MultimodalError(f"{self.family}: no {name} output", field=name)
            grids.append(np.asarray(values).reshape(n, -1))
        ids = {**self.token_ids, spec["embed"]: self.image_token_id}
        named_anchor = ids.get(spec["anchor"])
        pairs = _id_pairs(spec["tokens"], ids)
        made = [
            self.processor._native.prompt_replacement([int(v) for v in row], pairs)
            for row in np.concatenate(grids, axis=1).tolist()
        ]
        replacements = tuple(
            (np.asarray(t, dtype=np.uint32), np.asarray(e, dtype=np.bool_)) for t, e, _ in made
        )
        return {
            "token_counts": tuple(int(e.sum()) for _, e in replacements),
            "anchor_id": named_anchor if isinstance(named_anchor, int) else None,
            "replacements": replacements,
            "item_rows": tuple(r for _, _, r in made) if spec["flat"] else (),
            "flat_names": tuple(spec["flat"]),
            "sizes_key": spec["sizes"] if spec["flat"] else None,
            "per_sample": bool(spec["per_sample"]),
            "joins": _join_table(spec["joins"], ids),
        }

    @functools.cached_property
    def _parameters(self) -> bytes:
        """The preprocessing parameters every item digest covers (fixed per model)."""
        params = {
            "family": self.family,
            "config": self.processor.config,
            "apply_exif": self.processor.apply_exif,
            "alpha": self.processor.alpha,
        }
        return json.dumps(params, sort_keys=True, separators=(",", ":"), default=str).encode()

    def _framed(self, kind: str, parts: Sequence[Any]) -> list[bytes | npt.NDArray[Any]]:
        """What an item's digest covers: the preprocessing parameters and its raw content."""
        framed: list[bytes | npt.NDArray[Any]] = [_HASH_DOMAIN, self._parameters, kind.encode()]
        for part in parts:
            if isinstance(part, bytes):
                framed += [b"bytes", part]
            else:
                array = np.ascontiguousarray(part)
                framed += [f"array:{array.dtype.str}:{list(array.shape)}".encode(), array]
        return framed

    def _digest(self, kind: str, parts: Sequence[Any]) -> bytes:
        """BLAKE3 over the preprocessing parameters and the item's raw content, so a changed
        configuration never reuses a cached encoder output."""
        return _native.media_digest(self._framed(kind, parts))

    def _digests(
        self, kind: str, items: Sequence[Sequence[Any]], threads: int | None
    ) -> tuple[bytes, ...]:
        """:meth:`_digest` of each item, on the batch's threads (GIL released): not one after
        the other on the calling thread while the other cores wait."""
        n_threads = threads if threads is not None else (self.processor.threads or 0)
        framed = [self._framed(kind, parts) for parts in items]
        return tuple(_native.media_digests(framed, n_threads))


@dataclass(frozen=True)
class PreparedMedia:
    """The media of one modality, processed and ready for any engine's request builder.

    From :meth:`VisionModel.prepare`, a Qwen batch's ``pixel_values`` are not written yet
    (:class:`~smg_grpc_proto.vision.DeferredOutput`): the builders have them written straight
    into the serialized request or the shared-memory segment, once. Reading :attr:`output` (or
    :meth:`tensors`, :attr:`primary`, :meth:`item_tensors`) writes them into an array, once.
    """

    processed: ProcessorOutput | DeferredOutput
    """The processor's output, or its deferred output (see :attr:`output`)."""
    modality: Modality
    token_id: int
    """The placeholder token: the prompt's anchor per item and the token of its expanded run."""
    token_counts: tuple[int, ...]
    """Placeholder tokens per item (the model's rule)."""
    hashes: tuple[bytes, ...]
    """32-byte blake3 digest per item (content and preprocessing parameters)."""
    family: str
    encoded: tuple[bytes | None, ...] = ()
    """The encoded file per item when the input was one (TensorRT-LLM, SGLang's image_data)."""
    anchor_id: int | None = None
    """The prompt's anchor per item when it is not :attr:`token_id` (Llama 4 ``<|image|>``)."""
    replacements: tuple[tuple[npt.NDArray[np.uint32], npt.NDArray[np.bool_]], ...] = ()
    """Per item, the tokens its anchor becomes and which of them take embeddings, when that is
    more than a run of :attr:`token_id` (Llama 4); empty otherwise. :attr:`token_counts` are
    then the embedding positions per item."""
    item_rows: tuple[int, ...] = ()
    """Per item, its rows of the :attr:`flat_names` tensors when they are not one per item and
    no grid gives them (Llama 4: its tiles, plus the global tile); they travel as the sizes
    tensor :attr:`sizes_name`."""
    flat_names: tuple[str, ...] = ()
    """The tensors whose dim 0 concatenates the items' :attr:`item_rows` (Llama 4:
    ``pixel_values``; Idefics3: ``pixel_values`` and ``pixel_attention_mask``)."""
    sizes_key: str | None = None
    """The engine model's name for the rows-per-item tensor of :attr:`flat_names` (vLLM Llama 4
    ``patches_per_image``); ``None``: ``patches_per_image`` / ``patches_per_video``."""
    per_sample: bool = False
    """The processor's tensors carry a leading sample dimension of 1 (Idefics3, SmolVLM) that
    engines do not take: :meth:`tensors` drops it."""
    joins: tuple[tuple[int, int, int], ...] = ()
    """``(left, right, merged)`` token ids: where a replacement meets the prompt (or the next
    replacement), ``left`` followed by ``right`` is written as the one token ``merged``, as the
    processor's tokenizer writes their text (Gemma 3: ``"\\n"`` 107 + ``"\\n\\n"`` 108 →
    ``"\\n\\n\\n"`` 109); from the family's ``joins`` pieces. Empty for most families."""

    @classmethod
    def from_output(
        cls,
        output: ProcessorOutput,
        *,
        token_id: int,
        family: str,
        modality: Modality = "image",
        token_counts: Sequence[int] | None = None,
    ) -> PreparedMedia:
        """Wrap a :class:`ProcessorOutput` made elsewhere; items are hashed from their tensors
        (which already reflect every preprocessing parameter). For a family whose anchor becomes
        more than a run of one token (Llama 4, the tiled families) use
        :meth:`VisionModel.wrap`, which knows the model's replacement."""
        if modality == "image" and _structured(family):
            raise MultimodalError(
                f"{family}: its prompt replacement is more than a run of {token_id}; wrap the "
                "output with VisionModel.wrap(output), which writes the model's replacement",
                field="family",
            )
        counts = token_counts or (
            output.num_video_tokens if modality == "video" else output.num_image_tokens
        )
        if counts is None:
            raise MultimodalError(
                "token_counts: the output carries no placeholder counts; pass them",
                field="token_counts",
            )
        return cls._hashed(output, modality, token_id, tuple(int(c) for c in counts), family, {})

    @classmethod
    def _hashed(
        cls,
        output: ProcessorOutput,
        modality: Modality,
        token_id: int,
        counts: tuple[int, ...],
        family: str,
        structure: Mapping[str, Any],
    ) -> PreparedMedia:
        """The media with each item hashed from its tensors."""
        media = cls(output, modality, token_id, counts, (), family, **structure)
        digests = []
        for i in range(media.count):
            framed: list[bytes | npt.NDArray[Any]] = [_HASH_DOMAIN, b"tensors", family.encode()]
            for name, array in sorted(media.item_tensors(i).items()):
                contiguous = np.ascontiguousarray(array)
                framed += [f"{name}:{contiguous.dtype.str}:{list(contiguous.shape)}".encode()]
                framed += [contiguous]
            digests.append(_native.media_digest(framed))
        object.__setattr__(media, "hashes", tuple(digests))
        return media

    def __post_init__(self) -> None:
        if self.flat_names and not self.item_rows:
            raise MultimodalLayoutError(
                "item_rows: flat tensors need their rows per item",
                field="item_rows",
                expected=len(self.token_counts),
                actual=0,
            )
        wire = self.wire_tensors()
        primary = wire.get(self.primary_name)
        if primary is None:
            raise MultimodalError(
                f"the processor output has no {self.modality} tensors", field="output"
            )
        n = len(self.token_counts)
        for name, values in (("replacements", self.replacements), ("item_rows", self.item_rows)):
            if values and len(values) != n:
                raise MultimodalLayoutError(
                    f"{name}: {len(values)} entries for {n} items",
                    field=name,
                    expected=n,
                    actual=len(values),
                )
        layout = self.layout_of(wire)
        for name, array in wire.items():
            if layout[name] == "batched" and array.shape[0] != n:
                raise MultimodalLayoutError(
                    f"{name}: dim 0 is {array.shape[0]}, expected one entry per item ({n})",
                    field=name,
                    expected=n,
                    actual=int(array.shape[0]),
                )
        sizes = self.flat_sizes()
        for name, array in wire.items():
            if layout[name] == "flat" and sum(sizes) != array.shape[0]:
                raise MultimodalLayoutError(
                    f"{name}: {array.shape[0]} rows, but the items' sizes give {sum(sizes)}",
                    field=name,
                    expected=sum(sizes),
                    actual=int(array.shape[0]),
                )

    # -- the tensors, by transformers' names --------------------------------------------------
    @functools.cached_property
    def output(self) -> ProcessorOutput:
        """The complete processor output (a deferred tensor is written into an array, once)."""
        processed = self.processed
        if isinstance(processed, DeferredOutput):
            return processed.materialize()
        return processed

    @property
    def _ready(self) -> ProcessorOutput:
        """The output's computed tensors (without the deferred ones)."""
        if "output" in self.__dict__:  # materialized already
            return self.output
        processed = self.processed
        return processed.ready if isinstance(processed, DeferredOutput) else processed

    def wire_tensors(
        self, sizes_name: str | None = None
    ) -> dict[str, npt.NDArray[Any] | PendingTensor]:
        """:meth:`tensors` as the builders attach them: a tensor not written yet stays a
        :class:`~smg_grpc_proto._native.PendingTensor` (shape, dtype, written on serializing)."""
        processed = self.processed
        if "output" in self.__dict__ or not isinstance(processed, DeferredOutput):
            return dict(self.tensors(sizes_name))
        computed = {k: v for k, v in processed.ready.tensors().items() if k in self._names}
        pending = {
            k: self._unsampled_pending(k, v)
            for k, v in processed.pending.items()
            if k in self._names
        }
        return {**pending, **self._unsampled(computed), **self._sizes_tensor(sizes_name)}

    def _unsampled_pending(self, name: str, tensor: PendingTensor) -> PendingTensor:
        """A pending tensor without its leading sample dimension of 1 when :attr:`per_sample`
        (a view of the same values, see :meth:`_unsampled`)."""
        if not self.per_sample:
            return tensor
        return tensor.reshaped(_unsampled_shape(name, list(tensor.shape)))

    def _unsampled(self, tensors: dict[str, npt.NDArray[Any]]) -> dict[str, npt.NDArray[Any]]:
        """``tensors`` without the leading sample dimension of 1 when :attr:`per_sample`."""
        if not self.per_sample:
            return tensors
        out: dict[str, npt.NDArray[Any]] = {}
        for name, array in tensors.items():
            _unsampled_shape(name, [int(n) for n in array.shape])
            out[name] = array[0]
        return out

    def _sizes_tensor(self, sizes_name: str | None = None) -> dict[str, npt.NDArray[np.int64]]:
        """The rows-per-item tensor (one entry per item) when :attr:`item_rows` are set, under
        ``sizes_name`` (default :attr:`sizes_name`), and the per-item placeholder counts of a
        model that takes them as a tensor (Phi-4-multimodal's ``num_img_tokens``)."""
        counts = _count_tensor(self.family) if self.modality == "image" else None
        extra = {counts: np.asarray(self.token_counts, dtype=np.int64)} if counts else {}
        if not self.item_rows:
            return extra
        name = sizes_name or self.sizes_name
        sizes = np.asarray(self.item_rows, dtype=np.int64)
        own = self._ready.tensors().get(name)
        if own is not None and name in self._names:
            if not np.array_equal(np.asarray(own).reshape(-1), sizes):
                raise MultimodalLayoutError(
                    f"{name}: the output's {own.reshape(-1).tolist()} are not the items' rows "
                    f"{list(self.item_rows)}",
                    field=name,
                    expected=list(self.item_rows),
                    actual=own.reshape(-1).tolist(),
                )
            return extra
        return {**extra, name: sizes}

    @property
    def sizes_name(self) -> str:
        """The sizes tensor of the flat tensors (vLLM's ``flat_keys`` value): the engine model's
        name for it, else ``patches_per_image`` / ``patches_per_video``."""
        if self.sizes_key is not None:
            return self.sizes_key
        return "patches_per_video" if self.modality == "video" else "patches_per_image"

    @property
    def anchor(self) -> int:
        """The token the prompt holds once per item before expansion."""
        return self.token_id if self.anchor_id is None else self.anchor_id

    @property
    def _names(self) -> frozenset[str]:
        return _MODALITY_NAMES[self.modality]

    @property
    def count(self) -> int:
        return len(self.token_counts)

    @property
    def hex_hashes(self) -> tuple[str, ...]:
        return tuple(h.hex() for h in self.hashes)

    @property
    def primary_name(self) -> str:
        """The encoder input's name: ``pixel_values`` (``pixel_values_videos`` for videos;
        Phi-4-multimodal ``image_pixel_values``)."""
        if self.modality == "video":
            return "pixel_values_videos"
        if getattr(self._ready, "image_pixel_values", None) is not None:
            return "image_pixel_values"
        return "pixel_values"

    @property
    def grid_name(self) -> str | None:
        name = "video_grid_thw" if self.modality == "video" else "image_grid_thw"
        return name if getattr(self._ready, name) is not None else None

    @property
    def primary(self) -> npt.NDArray[Any] | None:
        value: npt.NDArray[Any] | None = getattr(self.output, self.primary_name)
        return value

    def tensors(self, sizes_name: str | None = None) -> dict[str, npt.NDArray[Any]]:
        """The primary tensor and its side tensors for this modality, without a per-sample
        dimension (:attr:`per_sample`), and the sizes tensor (under ``sizes_name``, default
        :attr:`sizes_name`) when :attr:`item_rows` are set."""
        named = {k: v for k, v in self.output.tensors().items() if k in self._names}
        return {**self._unsampled(named), **self._sizes_tensor(sizes_name)}

    def _flat(self) -> frozenset[str]:
        if self.item_rows:
            return frozenset(self.flat_names or (self.primary_name,))
        return frozenset((self.primary_name,)) if self.grid_name is not None else frozenset()

    def layout(self) -> dict[str, Layout]:
        """How each tensor splits into items: Qwen's patches are flat (rows per item from the
        grid), the tiled families' :attr:`flat_names` too (rows per item from
        :attr:`item_rows`); everything else has one entry per item on dim 0."""
        return self.layout_of(self.wire_tensors())

    def layout_of(self, names: Iterable[str]) -> dict[str, Layout]:
        """:meth:`layout` for the tensors ``names`` (the keys of a :meth:`wire_tensors` result
        already at hand: computed once per request instead of again)."""
        flat = self._flat()
        return {name: ("flat" if name in flat else "batched") for name in names}

    def flat_sizes(self) -> tuple[int, ...]:
        """Rows of the flat tensors per item (Qwen: ``t * h * w`` of each grid row; tiled
        families: :attr:`item_rows`)."""
        if self.item_rows:
            return self.item_rows
        grid = self.grid_name
        if grid is None:
            return tuple(1 for _ in range(self.count))
        rows = getattr(self._ready, grid)
        return tuple(int(t) * int(h) * int(w) for t, h, w in rows.tolist())

    def item_tensors(
        self, index: int, sizes_name: str | None = None
    ) -> dict[str, npt.NDArray[Any]]:
        """Item ``index``'s slice of every tensor (views, no copy); batched tensors keep a
        leading dimension of 1."""
        if not 0 <= index < self.count:
            raise IndexError(f"item {index} of {self.count}")
        flat = self._flat()
        out: dict[str, npt.NDArray[Any]] = {}
        starts = np.concatenate([[0], np.cumsum(self.flat_sizes())])
        for name, array in self.tensors(sizes_name).items():
            if name in flat:
                out[name] = array[int(starts[index]) : int(starts[index + 1])]
            else:
                out[name] = array[index : index + 1]
        return out


def expand_placeholders(
    input_ids: Sequence[int] | npt.NDArray[Any],
    media: Sequence[PreparedMedia],
) -> tuple[npt.NDArray[np.uint32], list[list[tuple[int, int]]]]:
    """Replace each item's anchor token by its run of placeholder tokens (or, for a family with
    a replacement rule, by its :attr:`PreparedMedia.replacements` tokens).

    The prompt must hold exactly one anchor (:attr:`PreparedMedia.anchor`) per item of each
    media, in item order. Returns the expanded ids and, per media, one ``(offset, length)``
    range per item covering exactly the run (Qwen's ``<|vision_start|>``/``<|vision_end|>``
    stay outside it) or the whole replacement (Llama 4: ``<|image_start|>`` … ``<|image_end|>``,
    as vLLM's ``PlaceholderRange``; its embed mask is the ``<|patch|>`` positions).

    A family with joins (Gemma 3) has the pieces at its replacements' edges merged with the
    prompt's neighbouring tokens, as its processor's tokenizer writes the substituted text
    (``"\\n"`` + ``"\\n\\n"`` → ``"\\n\\n\\n"``; two adjacent images' ``"\\n\\n"`` +
    ``"\\n\\n"`` → ``"\\n\\n\\n\\n"``); its ranges keep the replacement's length and start
    at the token holding its first token (vLLM's), so adjacent images' ranges share one token.
    """
    ids, repeats, positions = _anchor_runs(input_ids, media)
    return _expand(ids, repeats, positions, media)


def _anchor_runs(
    input_ids: Sequence[int] | npt.NDArray[Any],
    media: Sequence[PreparedMedia],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], list[npt.NDArray[np.intp]]]:
    """The checked prompt (int64), each token's run length (1, or the item's token count at an
    anchor) and each media's anchor positions: :func:`expand_placeholders`' checks."""
    listed = _listed_ids(input_ids)
    if listed is not None:
        ids = listed  # every id an int within uint32: the checks below hold
    else:
        ids = _integer_array(input_ids).astype(np.int64, copy=False)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) > 0xFFFFFFFF):
            raise PlaceholderError(
                "input_ids: token ids must fit in uint32",
                field="input_ids",
                actual=[int(ids.min()), int(ids.max())],
            )
    repeats = np.ones(ids.shape[0], dtype=np.int64)
    positions: list[npt.NDArray[np.intp]] = []
    seen: dict[int, int] = {}
    for m, item in enumerate(media):
        anchor = item.anchor
        if anchor in seen:
            raise PlaceholderError(
                f"media[{m}] and media[{seen[anchor]}] share the placeholder token "
                f"{anchor}; pass the items of one modality as one PreparedMedia",
                field=f"media[{m}].token_id",
                actual=anchor,
            )
        seen[anchor] = m
        where = np.flatnonzero(ids == anchor)
        if where.shape[0] != item.count:
            raise PlaceholderError(
                f"input_ids hold {where.shape[0]} {item.modality} anchor token(s) "
                f"({anchor}) but media[{m}] has {item.count} item(s); the prompt needs "
                "exactly one anchor per item",
                field="input_ids",
                expected=item.count,
                actual=int(where.shape[0]),
            )
        if item.replacements:
            repeats[where] = [len(tokens) for tokens, _ in item.replacements]
        else:
            repeats[where] = np.asarray(item.token_counts, dtype=np.int64)
        positions.append(where)
    if positions and ids.size and int(repeats.min()) < 1:
        raise PlaceholderError("a token count below 1", field="token_counts")
    return ids, repeats, positions


def _integer_array(input_ids: Sequence[int] | npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``input_ids`` as a numpy array, refused unless 1-D and of an integer type (or empty)."""
    ids = np.asarray(input_ids)
    if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
        raise PlaceholderError(
            f"input_ids must be a 1-D sequence of integers, got shape {list(ids.shape)} "
            f"of {ids.dtype}",
            field="input_ids",
        )
    return ids


def _listed_ids(input_ids: Sequence[int] | npt.NDArray[Any]) -> npt.NDArray[np.int64] | None:
    """A list of Python ints, each within uint32, as int64, read by the native core in one pass
    (numpy's ``asarray`` discovers every item's type first: 670 against 130 µs for 32 000 ids);
    ``None`` for anything else, which :func:`_anchor_runs` checks the numpy way."""
    if type(input_ids) is not list or not _core.AVAILABLE:
        return None
    raw = _native.uint32_list(input_ids)
    return None if raw is None else np.frombuffer(raw, dtype="<u4").astype(np.int64)


def _expand(
    ids: npt.NDArray[np.int64],
    repeats: npt.NDArray[np.int64],
    positions: list[npt.NDArray[np.intp]],
    media: Sequence[PreparedMedia],
) -> tuple[npt.NDArray[np.uint32], list[list[tuple[int, int]]]]:
    # Narrowed before the repeat (the ids fit, `_anchor_runs` checked), so the expanded prompt
    # is written once, as uint32; each run's start, the sums of the runs before it.
    expanded = np.repeat(ids.astype(np.uint32), repeats)
    starts = np.zeros_like(repeats)
    np.cumsum(repeats[:-1], out=starts[1:])
    for item, where in zip(media, positions, strict=True):
        for (tokens, _), p in zip(item.replacements, where.tolist(), strict=False):
            begin = int(starts[p])
            expanded[begin : begin + tokens.shape[0]] = tokens
    ranges = [[(int(starts[p]), int(repeats[p])) for p in where.tolist()] for where in positions]
    edges: dict[int, dict[tuple[int, int], int]] = {}
    for item, spans in zip(media, ranges, strict=True):
        if item.joins and item.replacements:
            table = {(left, right): merged for left, right, merged in item.joins}
            for begin, length in spans:
                edges.setdefault(begin, table)
                edges.setdefault(begin + length, table)
    if not edges:
        return expanded, ranges
    return _join_edges(expanded, ranges, edges)


#: Up to this many prompt tokens (before expansion), :func:`expand_packed` writes the expanded
#: ids' wire bytes run by run in Python; a longer prompt is expanded with numpy and its varints
#: written by the native core (:func:`put_ids`), which is faster from about 150 tokens on
#: (measured from 17 to 8 000 tokens).
_FEW_IDS = 128


@functools.lru_cache(maxsize=1 << 16)
def _varint(value: int) -> bytes:
    """The protobuf varint of a non-negative ``value``."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def put_ids(message: Any, field: str, ids: npt.NDArray[np.uint32]) -> None:
    """Append ``ids`` (a ``uint32`` array, as :func:`expand_placeholders` returns them) to the
    ``repeated uint32`` field ``field`` of ``message`` (a request's ``tokenized``) as protobuf's
    own parser reads them: one packed record, its varints written by the native core
    (``_native.uint32_varints``), instead of one Python int per id handed to protobuf. Without
    the native core, ``extend``. Any other dtype is refused (a cast would wrap)."""
    if ids.dtype != np.uint32:
        raise TypeError(f"put_ids: ids must be a uint32 array, got {ids.dtype}")
    if not _core.AVAILABLE:
        getattr(message, field).extend(ids.tolist())
        return
    number = message.DESCRIPTOR.fields_by_name[field].number
    payload = _native.uint32_varints(np.ascontiguousarray(ids, dtype="<u4").tobytes())
    message.MergeFromString(_record(number, payload))


def _record(number: int, payload: bytes) -> bytes:
    """The wire record of the length-delimited field ``number`` holding ``payload`` (a packed
    ``repeated uint32``: tag, length, varints)."""
    # The length's varint without the id cache (a slot per prompt length would crowd it out).
    return _varint(number << 3 | 2) + _varint.__wrapped__(len(payload)) + payload


def expand_packed(
    input_ids: Sequence[int] | npt.NDArray[Any],
    media: Sequence[PreparedMedia],
    field_number: int,
) -> tuple[bytes | None, npt.NDArray[np.uint32] | None, list[list[tuple[int, int]]]]:
    """:func:`expand_placeholders` (the same checks and ranges) for a builder that writes the
    ids into a ``repeated uint32`` field numbered ``field_number``: for a short prompt whose items
    expand to runs of one token (no replacement rule, no joins) the field's packed wire bytes
    (tag, length, varints: one varint per prompt token, repeated over its run) to merge into the
    message, without a Python int per expanded token; else the expanded ids (``bytes`` is then
    ``None``). A list of ints is expanded by the native core whatever its length."""
    runs_of = None
    if not any(item.replacements or item.joins for item in media):
        native = _native_runs(input_ids, media, field_number)
        if native is not None:
            return native[0], None, native[1]
        runs_of = _few_runs(input_ids, media)
    if runs_of is None:
        ids, repeats, positions = _anchor_runs(input_ids, media)
        expanded, ranges = _expand(ids, repeats, positions, media)
        return None, expanded, ranges
    tokens, runs, anchors = runs_of
    starts: list[int] = []
    start = 0
    for run in runs:
        starts.append(start)
        start += run
    ranges = [[(starts[p], runs[p]) for p in where] for where in anchors]
    payload = b"".join([_varint(t) * r for t, r in zip(tokens, runs, strict=True)])
    return _record(field_number, payload), None, ranges


def put_prompt(
    tokenized: Any,
    field: str,
    input_ids: Sequence[int] | npt.NDArray[Any],
    media: Sequence[PreparedMedia],
) -> list[list[tuple[int, int]]]:
    """Write ``input_ids`` expanded for ``media`` (:func:`expand_placeholders`: the same checks,
    ids and ranges) into the ``repeated uint32`` field ``field`` of ``tokenized`` (a request's
    tokenized input, not set yet) and return the ranges: the packed record of
    :func:`expand_packed` merged as it is where there is one, else :func:`put_ids`."""
    number = tokenized.DESCRIPTOR.fields_by_name[field].number
    packed, ids, ranges = expand_packed(input_ids, media, number)
    if packed is not None:
        tokenized.MergeFromString(packed)  # parsed in C: no Python int per token
    else:
        assert ids is not None
        put_ids(tokenized, field, ids)
    return ranges


def _native_runs(
    input_ids: Sequence[int] | npt.NDArray[Any],
    media: Sequence[PreparedMedia],
    field_number: int,
) -> tuple[bytes, list[list[tuple[int, int]]]] | None:
    """For a list of ints, the packed record and ranges the native core expands it to (one pass
    over the list, one over the record: 32 000 ids in 0.23 ms, where numpy's path took about
    1 ms); ``None`` for anything else or anything it refuses, which the other paths then check
    and name."""
    if type(input_ids) is not list or not _core.AVAILABLE:
        return None
    anchors = [item.anchor for item in media]
    counts = [item.token_counts for item in media]
    return _native.packed_prompt(input_ids, anchors, counts, field_number)


def _few_runs(
    input_ids: Sequence[int] | npt.NDArray[Any], media: Sequence[PreparedMedia]
) -> tuple[list[int], list[int], list[list[int]]] | None:
    """For a short list of Python ints that :func:`_anchor_runs` accepts, its result as Python
    lists (tokens, runs, anchor positions per media), computed without numpy; ``None`` for
    anything else (other inputs, or any check failing: :func:`_anchor_runs` then raises its
    error)."""
    if type(input_ids) is not list or not 0 < len(input_ids) <= _FEW_IDS:
        return None
    tokens: list[int] = input_ids
    if any(type(t) is not int for t in tokens) or min(tokens) < 0 or max(tokens) > 0xFFFFFFFF:
        return None
    runs = [1] * len(tokens)
    anchors: list[list[int]] = []
    seen: set[int] = set()
    for item in media:
        anchor = item.anchor
        counts = item.token_counts
        where = [i for i, t in enumerate(tokens) if t == anchor]
        if anchor in seen or len(where) != len(counts) or any(c < 1 for c in counts):
            return None
        seen.add(anchor)
        for i, c in zip(where, counts, strict=True):
            runs[i] = int(c)
        anchors.append(where)
    return tokens, runs, anchors


def _join_edges(
    expanded: npt.NDArray[np.uint32],
    ranges: list[list[tuple[int, int]]],
    edges: Mapping[int, Mapping[tuple[int, int], int]],
) -> tuple[npt.NDArray[np.uint32], list[list[tuple[int, int]]]]:
    """Merge the tokens on both sides of each replacement edge (a position ``x``: between
    ``x - 1`` and ``x``) into one where the edge's table has the pair, left to right, so that a
    run of pieces across several edges (``"\\n\\n"`` + ``"\\n"`` + ``"\\n\\n"`` between two
    images) merges as far as the table goes, as the tokenizer writes the whole text.

    Each range then covers the tokens that hold its replacement, merged ones included: vLLM's
    Gemma 3 placeholders (``_find_mm_placeholders`` maps the range's start back to the merged
    token that holds the replacement's first token and keeps the replacement's length), so two
    adjacent images' ranges share the merged token between them."""
    n = expanded.shape[0]
    head = np.ones(n, dtype=np.bool_)
    value = expanded.astype(np.int64)
    owner: dict[int, int] = {}  # a merged position -> the head of its token
    for x in sorted(edges):
        if not 0 < x < n:
            continue
        left = owner.get(x - 1, x - 1)
        merged = edges[x].get((int(value[left]), int(value[x])))
        if merged is None:
            continue
        value[left] = merged
        head[x] = False
        owner[x] = left
    index = np.cumsum(head) - 1
    out: list[list[tuple[int, int]]] = []
    for spans in ranges:
        moved: list[tuple[int, int]] = []
        for begin, length in spans:
            first, last = int(index[begin]), int(index[begin + length - 1])
            if last - first + 1 != length:
                raise PlaceholderError(
                    f"the replacement at offset {begin} merges into {last - first + 1} tokens "
                    f"but has {length}; a join may only merge its edge tokens",
                    field="joins",
                    expected=length,
                    actual=last - first + 1,
                )
            moved.append((first, length))
        out.append(moved)
    return value[head].astype(np.uint32), out


def placeholder_ranges(
    input_ids: Sequence[int] | npt.NDArray[Any],
    media: Sequence[PreparedMedia],
) -> list[list[tuple[int, int]]]:
    """The placeholder ranges of an *expanded* prompt: the inverse of
    :func:`expand_placeholders`, for a request whose ``input_ids`` were expanded already.

    Per media, one ``(offset, length)`` per item: the item's run of ``token_counts[i]``
    consecutive ``token_id`` tokens, items in prompt order (for a family with a replacement
    rule, the next occurrence of the item's whole replacement, whose edge tokens may be merged
    with their neighbours by the family's joins). Any other number of placeholder
    tokens, or a run split by other tokens, is a :class:`PlaceholderError` naming the numbers.
    """
    ids = _integer_array(input_ids)
    out: list[list[tuple[int, int]]] = []
    seen: dict[int, int] = {}
    for m, item in enumerate(media):
        if item.token_id in seen:
            raise PlaceholderError(
                f"media[{m}] and media[{seen[item.token_id]}] share the placeholder token "
                f"{item.token_id}; pass the items of one modality as one PreparedMedia",
                field=f"media[{m}].token_id",
                actual=item.token_id,
            )
        seen[item.token_id] = m
        if item.replacements:
            out.append(_find_replacements(ids, item, m))
            continue
        where = np.flatnonzero(ids == item.token_id)
        total = sum(item.token_counts)
        if where.shape[0] != total:
            raise PlaceholderError(
                f"input_ids hold {where.shape[0]} {item.modality} placeholder token(s) "
                f"({item.token_id}) but media[{m}]'s {item.count} item(s) take {total}; the "
                "prompt must be expanded (expand_placeholders)",
                field="input_ids",
                expected=total,
                actual=int(where.shape[0]),
            )
        ranges: list[tuple[int, int]] = []
        start = 0
        for i, count in enumerate(item.token_counts):
            if count < 1:
                raise PlaceholderError(
                    f"media[{m}] item {i}: a token count below 1 ({count})",
                    field="token_counts",
                    actual=count,
                )
            run = where[start : start + count]
            offset = int(run[0])
            if int(run[-1]) - offset != count - 1:
                raise PlaceholderError(
                    f"media[{m}] item {i}: its {count} placeholder tokens ({item.token_id}) "
                    f"from offset {offset} are not one run (the last is at {int(run[-1])})",
                    field="input_ids",
                    expected=offset + count - 1,
                    actual=int(run[-1]),
                )
            ranges.append((offset, count))
            start += count
        out.append(ranges)
    return out


def _find_replacements(ids: npt.NDArray[Any], item: PreparedMedia, m: int) -> list[tuple[int, int]]:
    """Each item's whole replacement, in order, in an expanded prompt; the placeholder tokens
    outside them must be none."""
    ranges: list[tuple[int, int]] = []
    cursor = 0
    # a merged token at an edge holds the replacement's first (last) token at its end (start)
    holds_first: dict[int, set[int]] = {}
    holds_last: dict[int, set[int]] = {}
    for left, right, merged in item.joins:
        holds_first.setdefault(right, set()).add(merged)
        holds_last.setdefault(left, set()).add(merged)
    for i, (tokens, _) in enumerate(item.replacements):
        length = int(tokens.shape[0])
        first, last = int(tokens[0]), int(tokens[-1])
        firsts = [first, *holds_first.get(first, ())]
        lasts = [last, *holds_last.get(last, ())]
        starts = np.flatnonzero(np.isin(ids[cursor:], firsts)) + cursor
        hit = next(
            (
                int(s)
                for s in starts.tolist()
                if s + length <= ids.shape[0]
                and (
                    np.array_equal(ids[s : s + length], tokens)
                    or (
                        int(ids[s + length - 1]) in lasts
                        and np.array_equal(ids[s + 1 : s + length - 1], tokens[1:-1])
                    )
                )
            ),
            None,
        )
        if hit is None:
            raise PlaceholderError(
                f"media[{m}] item {i}: its {length}-token replacement does not occur in "
                f"input_ids from offset {cursor}; the prompt must be expanded "
                "(expand_placeholders) with the same images",
                field="input_ids",
                expected=length,
                actual=0,
            )
        ranges.append((hit, length))
        # a merged last token may hold the next replacement's first token as well
        cursor = hit + length - (int(ids[hit + length - 1]) != last)
    total = int(np.count_nonzero(ids == item.token_id))
    if total != sum(item.token_counts):
        raise PlaceholderError(
            f"input_ids hold {total} {item.modality} placeholder token(s) ({item.token_id}) "
            f"but media[{m}]'s {item.count} item(s) take {sum(item.token_counts)}",
            field="input_ids",
            expected=sum(item.token_counts),
            actual=total,
        )
    return ranges


def content_hash(hex_digest: str) -> bytes:
    """The 32-byte content hash of an item for contracts that carry bytes (TokenSpeed's
    ``MultimodalItem.content_hash``): the BLAKE3 of the item's hex digest
    (:attr:`PreparedMedia.hex_hashes`), the SMG gateway's derivation."""
    return _native.blake3(hex_digest.encode())


def image_format(data: bytes | bytearray | memoryview) -> str | None:
    """``"jpeg"``, ``"png"``, ``"gif"``, ``"bmp"`` or ``"webp"`` from the file's signature, as
    Pillow's plugins accept them (a bare DIB counts as BMP; WebP needs its ``VP8``/``VP8L``/
    ``VP8X`` chunk); ``None`` for anything else — the formats :func:`~smg_grpc_proto.vision.decode`
    decodes.

    This is the native decoder's own signature check (Rust ``decode::sniff``, exported as
    ``_native.image_format``) on the first 16 bytes, all any signature needs; nothing is
    decoded. Without the native core (the pure-Python wheel) its Python twin
    :func:`_sniff` answers, so the TensorRT-LLM adapter, which carries the encoded files, works
    there too (tests/test_pure.py compares the two)."""
    head = bytes(data[:16])
    return _native.image_format(head) if _core.AVAILABLE else _sniff(head)


_DIB_HEADER_SIZES = frozenset({12, 40, 52, 56, 64, 108, 124})


def _sniff(head: bytes) -> str | None:
    """Rust ``decode::sniff`` in Python: the formats Pillow's plugins accept by signature (a
    bare DIB, whose first little-endian u32 is a known info-header size, counts as BMP)."""
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    if head.startswith(b"BM") or (
        len(head) >= 4 and int.from_bytes(head[:4], "little") in _DIB_HEADER_SIZES
    ):
        return "bmp"
    if (
        len(head) >= 16
        and head.startswith(b"RIFF")
        and head[8:12] == b"WEBP"
        and head[12:16] in (b"VP8 ", b"VP8L", b"VP8X")
    ):
        return "webp"
    return None
