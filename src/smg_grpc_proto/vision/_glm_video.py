"""The video prompt of GLM-4.1V, GLM-4.6V and GLM-5-next, as their transformers processors write it.

``Glm4vProcessor.replace_video_token`` (and ``Glm46VProcessor``'s, ``Glm5NextProcessor``'s)
replaces the chat template's ``<|video|>`` (between ``<|begin_of_video|>`` and
``<|end_of_video|>``) by one block per frame group (``grid_t`` of ``video_grid_thw``)::

    <|begin_of_image|><|image|> x (grid_h * grid_w / merge_size**2)<|end_of_image|>TEXT

where ``TEXT`` is the group's timestamp: the first frame of every ``temporal_patch_size`` frames
(``metadata.timestamps[::2]``), ``frames_indices[i] / fps`` seconds, written as ``str(int(t))``
by GLM-4.1V and ``f"{t:.1f} seconds"`` by GLM-4.6V and GLM-5-next. The timestamps are the one
thing the frames do not carry: the processor reads them from the video's metadata, and without
it counts the frames it was given as ``0, 1, 2, ...`` at 24 fps (its fallback, with a warning).
We take the same two facts per video, :class:`GlmVideoMetadata`: the source frame rate and the
indices of the frames given (or, instead, the timestamps themselves).

The video's embedding positions are its ``<|image|>`` tokens (transformers tells them from an
image's by the surrounding ``<|begin_of_video|>`` … ``<|end_of_video|>``, its
``mm_token_type_ids``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from smg_grpc_proto.errors import MultimodalError

__all__ = [
    "GLM_VIDEO_FAMILIES",
    "GLM_VIDEO_TOKENS",
    "GlmVideoMetadata",
    "glm_sample_frames",
    "glm_video_replacement",
    "glm_video_text",
    "glm_video_timestamps",
]

GLM_VIDEO_FAMILIES = ("glm4v", "glm46v", "glm5_next")
"""The families whose videos take :class:`GlmVideoMetadata` and :func:`glm_video_replacement`."""

GLM_VIDEO_TOKENS: dict[str, dict[str, int]] = {
    # transformers 5.24 Glm4vConfig / Glm46VConfig / Glm5NextConfig image_start_token_id,
    # image_end_token_id (the published checkpoints' tokenizers agree)
    "glm4v": {"<|begin_of_image|>": 151339, "<|end_of_image|>": 151340},
    "glm46v": {"<|begin_of_image|>": 151339, "<|end_of_image|>": 151340},
    "glm5_next": {"<|begin_of_image|>": 154830, "<|end_of_image|>": 154831},
}
"""The special tokens of the video prompt besides ``<|image|>`` (the image token id)."""

FALLBACK_FPS = 24.0
"""``Glm4vProcessor.replace_video_token``'s frame rate when the metadata has none."""


@dataclass(frozen=True)
class GlmVideoMetadata:
    """What a GLM video prompt needs beyond the frames: ``transformers.video_utils.VideoMetadata``'s
    ``fps`` (frames per second of the source video) and ``frames_indices`` (the index in the
    source of each frame given), or ``timestamps`` (seconds, one per frame given) directly.
    ``None`` fields take the processor's fallbacks: 24 fps, frames ``0, 1, 2, ...``."""

    fps: float | None = None
    frames_indices: Sequence[int] | None = None
    timestamps: Sequence[float] | None = None

    @classmethod
    def of(cls, value: GlmVideoMetadata | Mapping[str, object] | None, at: str) -> GlmVideoMetadata:
        """From a :class:`GlmVideoMetadata`, a mapping with those keys (other
        ``VideoMetadata`` keys such as ``total_num_frames`` or ``duration`` are ignored: the
        prompt does not read them) or ``None``."""
        if value is None:
            return cls()
        if isinstance(value, GlmVideoMetadata):
            return value
        if not isinstance(value, Mapping):
            raise MultimodalError(
                f"{at}: expected a mapping (fps, frames_indices or timestamps), "
                f"got {type(value).__name__}",
                field=at,
            )
        fps = value.get("fps")
        if fps is not None and (
            isinstance(fps, bool)
            or not isinstance(fps, (int, float))
            or not math.isfinite(fps)
            or fps <= 0
        ):
            raise MultimodalError(f"{at}.fps: expected a positive number, got {fps!r}", field=at)
        indices = value.get("frames_indices")
        stamps = value.get("timestamps")
        if indices is not None and stamps is not None:
            raise MultimodalError(
                f"{at}: give frames_indices (with fps) or timestamps, not both", field=at
            )
        if stamps is not None and fps is not None:
            raise MultimodalError(
                f"{at}: timestamps already fix the seconds; fps is read only with frames_indices",
                field=at,
            )
        return cls(
            float(fps) if fps is not None else None,
            _numbers(indices, f"{at}.frames_indices", integer=True),  # type: ignore[arg-type]
            _numbers(stamps, f"{at}.timestamps", integer=False),
        )


def _numbers(value: object, at: str, *, integer: bool) -> tuple[float, ...] | None:
    if value is None:
        return None
    array = np.asarray(value)
    kind = "integers" if integer else "numbers"
    ok = array.ndim == 1 and (
        np.issubdtype(array.dtype, np.integer)
        if integer
        else np.issubdtype(array.dtype, np.number) and not np.issubdtype(array.dtype, np.bool_)
    )
    if not ok or (not integer and not np.all(np.isfinite(array))):
        raise MultimodalError(f"{at}: expected a 1-D sequence of {kind}", field=at)
    if integer and array.size and int(array.min()) < 0:
        raise MultimodalError(f"{at}: frame indices must be >= 0", field=at)
    return tuple(int(v) if integer else float(v) for v in array.tolist())


def glm_video_timestamps(
    num_frames: int, grid_t: int, metadata: GlmVideoMetadata | None = None
) -> list[float]:
    """The timestamp (seconds) of each of a video's ``grid_t`` frame groups, as
    ``Glm4vProcessor.replace_video_token`` takes them: every second frame's
    ``frames_indices[i] / fps`` (``num_frames`` frames given, 24 fps and ``0, 1, ...`` when the
    metadata lacks them), the first ``grid_t``, the last repeated when fewer."""
    meta = metadata or GlmVideoMetadata()
    if meta.timestamps is not None:
        stamps = list(meta.timestamps)
        if len(stamps) != num_frames:
            raise MultimodalError(
                f"video_metadata.timestamps: one per frame given ({num_frames}), got {len(stamps)}",
                field="video_metadata",
            )
    else:
        indices = list(meta.frames_indices) if meta.frames_indices is not None else None
        if indices is None:
            indices = list(range(num_frames))
        elif len(indices) != num_frames:
            raise MultimodalError(
                f"video_metadata.frames_indices: one per frame given ({num_frames}), "
                f"got {len(indices)}",
                field="video_metadata",
            )
        fps = meta.fps if meta.fps is not None else FALLBACK_FPS
        stamps = [i / fps for i in indices]
    selected = stamps[::2][:grid_t]
    while len(selected) < grid_t:
        selected.append(selected[-1] if selected else 0)
    return selected


def _stamp_text(family: str, seconds: float) -> str:
    if family == "glm4v":
        return str(int(seconds))
    if family in ("glm46v", "glm5_next"):
        return f"{seconds:.1f} seconds"
    raise MultimodalError(
        f"{family!r} has no GLM video prompt (one of {', '.join(GLM_VIDEO_FAMILIES)})",
        field="family",
    )


def glm_video_text(
    family: str,
    grid: Sequence[int],
    timestamps: Sequence[float],
    *,
    merge_size: int = 2,
    image_token: str = "<|image|>",
) -> str:
    """The text ``family``'s processor writes for one video's ``<|video|>``: per frame group,
    ``<|begin_of_image|>``, ``grid_h * grid_w / merge_size**2`` image tokens,
    ``<|end_of_image|>`` and the group's timestamp text (``grid`` is the video's
    ``video_grid_thw`` row, ``timestamps`` from :func:`glm_video_timestamps`)."""
    grid_t, per_group = _groups(grid, merge_size, timestamps)
    return "".join(
        f"<|begin_of_image|>{image_token * per_group}<|end_of_image|>{_stamp_text(family, t)}"
        for t in timestamps[:grid_t]
    )


def _groups(grid: Sequence[int], merge_size: int, timestamps: Sequence[float]) -> tuple[int, int]:
    if len(grid) != 3 or min(grid) < 1:
        raise MultimodalError(
            f"video_grid_thw row: expected 3 positive integers, got {list(grid)}",
            field="video_grid_thw",
        )
    grid_t, grid_h, grid_w = (int(v) for v in grid)
    if len(timestamps) != grid_t:
        raise MultimodalError(
            f"timestamps: one per frame group ({grid_t}), got {len(timestamps)}",
            field="timestamps",
        )
    return grid_t, grid_h * grid_w // merge_size**2


def glm_video_replacement(
    family: str,
    grid: Sequence[int],
    timestamps: Sequence[float],
    token_ids: Mapping[str, int | Sequence[int]],
    tokenize: Callable[[str], Sequence[int]] | None = None,
    *,
    merge_size: int = 2,
) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.bool_]]:
    """:func:`glm_video_text` as token ids, and which of them take the video's embeddings (the
    ``<|image|>`` runs). ``token_ids`` holds ``<|begin_of_image|>``, ``<|end_of_image|>`` and
    ``<|image|>``; each timestamp's text is looked up there first (a text piece maps to its ids)
    and else given to ``tokenize`` (the model's tokenizer, no special tokens added: the text
    sits between special tokens, so the tokenizer sees it alone)."""
    grid_t, per_group = _groups(grid, merge_size, timestamps)
    named = {}
    for name in ("<|begin_of_image|>", "<|end_of_image|>", "<|image|>"):
        value = token_ids.get(name)
        if not isinstance(value, int):
            raise MultimodalError(
                f"{family}: no token id for {name}; pass token_ids", field="token_ids"
            )
        named[name] = value
    tokens: list[int] = []
    embed: list[bool] = []
    for t in timestamps[:grid_t]:
        text = _stamp_text(family, t)
        piece = token_ids.get(text)
        if piece is None:
            if tokenize is None:
                raise MultimodalError(
                    f"{family}: the video timestamp text {text!r} needs the model's tokenizer "
                    "(VisionModel.from_pretrained with tokenizer.json, or tokenize=)",
                    field="tokenize",
                )
            piece = [int(i) for i in tokenize(text)]
        text_ids = [piece] if isinstance(piece, int) else [int(i) for i in piece]
        tokens += [named["<|begin_of_image|>"], *([named["<|image|>"]] * per_group)]
        tokens += [named["<|end_of_image|>"], *text_ids]
        embed += [False, *([True] * per_group), False, *([False] * len(text_ids))]
    return np.asarray(tokens, dtype=np.uint32), np.asarray(embed, dtype=np.bool_)


def glm_sample_frames(
    family: str,
    total_num_frames: int,
    fps: float,
    *,
    duration: float | None = None,
    target_fps: float | None = None,
) -> list[int]:
    """The indices of the frames ``family``'s video processor samples from a decoded video of
    ``total_num_frames`` frames at ``fps`` (its ``sample_frames``, the default
    ``do_sample_frames=True``; ``duration`` in seconds, by default ``round((total - 1) / fps) +
    1``; ``target_fps`` the call's ``fps``, by default the class's 2 — GLM-4.6V ignores it and
    picks its own by duration). Pass ``video[indices]`` as the frames and
    ``{"fps": fps, "frames_indices": indices}`` as the video's metadata: the same frames and
    timestamps as the processor sampling the whole video itself."""
    if total_num_frames < 1 or isinstance(total_num_frames, bool):
        raise MultimodalError(
            f"total_num_frames: expected a positive integer, got {total_num_frames!r}",
            field="total_num_frames",
        )
    if not (isinstance(fps, (int, float)) and math.isfinite(fps) and fps > 0):
        raise MultimodalError(f"fps: expected a positive number, got {fps!r}", field="fps")
    last = total_num_frames - 1
    seconds = duration or round(last / fps) + 1
    if family == "glm4v":
        wanted = target_fps if target_fps is not None else 2
        max_duration = 300
        if seconds <= max_duration:
            n = max(math.floor(seconds * wanted), 1)
            indices = [min(last, math.ceil(i * fps / wanted)) for i in range(n)]
        else:
            samples = int(max_duration * wanted)
            if samples >= total_num_frames:
                indices = list(range(total_num_frames))
            else:
                targets = np.linspace(0, seconds, samples, endpoint=True)
                indices = [min(last, math.ceil(t * fps)) for t in targets.tolist()]
    elif family in ("glm46v", "glm5_next"):
        if family == "glm46v":
            effective = min(seconds, 2400)
            wanted = 3 if effective <= 30 else 1 if effective <= 300 else 0.5
            extract = min(int(effective * wanted * 2), 640)  # temporal_patch_size 2
            step, stop = 1 / (2 * wanted), int(seconds)
        else:
            wanted = target_fps if target_fps is not None else 2
            extract = min(int(seconds * wanted), 2048)  # max_duration 0: no cap; max_frames
            step, stop = 1 / wanted, int(seconds)
        stamps = [i * (1 / fps) for i in range(total_num_frames)]
        if total_num_frames < extract:
            indices = np.linspace(0, last, extract, dtype=int).tolist()
        else:
            indices = []
            second: float = 0
            for index in range(total_num_frames):
                if stamps[index] >= second:
                    second += step
                    indices.append(index)
                    if second >= stop:
                        break
        if len(indices) < extract:
            start, end = (indices[0], indices[-1]) if indices else (0, max(last, 0))
            indices = np.linspace(start, end, extract, dtype=int).tolist()
        elif len(indices) > extract:
            indices = np.linspace(0, last, extract, dtype=int).tolist()
    else:
        _stamp_text(family, 0.0)  # raises: not a GLM family
        return []
    unique = list(dict.fromkeys(int(i) for i in indices))
    if len(unique) % 2:
        unique.append(unique[-1])
    return unique
