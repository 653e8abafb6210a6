"""Engine side, engine-independent: what a decoder returns, and the checks every decoder runs.

:class:`DecodedBatch` is one batch of media of one modality as the engine's model consumes it:
whole tensors by model argument name, how each splits into items (batched / flat / shared, the
vLLM ``MultiModalFieldConfig`` rules), and :class:`DecodedItem` views per item with its
placeholder range, embed mask and content hash.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from smg_grpc_proto.errors import MultimodalError, MultimodalLayoutError, PlaceholderError

__all__ = ["DecodedBatch", "DecodedItem", "Layout", "Modality"]

Modality = Literal["image", "video", "audio"]
Layout = Literal["batched", "flat", "shared"]

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
GRID_KEYS = ("image_grid_thw", "video_grid_thw", "grid_thws")


@dataclass(frozen=True)
class DecodedItem:
    """One media item: its slice of every tensor (views of the received bytes)."""

    index: int
    modality: Modality
    tensors: Mapping[str, npt.NDArray[Any]]
    placeholders: tuple[tuple[int, int], ...]
    """``(offset, length)`` of each of the item's placeholder runs in ``input_ids`` (one for
    vLLM and SGLang; TokenSpeed items may have several)."""
    embed_mask: npt.NDArray[np.bool_] | None
    """Which positions of the runs (concatenated) take encoder embeddings; ``None`` = all."""
    content_hash: str | None
    """Hex digest (vLLM: blake3 hex; TokenSpeed: the 32 raw bytes as hex); ``None`` if unset."""

    @property
    def placeholder(self) -> tuple[int, int]:
        """The first placeholder run (the only one outside TokenSpeed)."""
        return self.placeholders[0]


@dataclass(frozen=True)
class DecodedBatch:
    """One batch of one modality, ready for the model."""

    modality: Modality
    tensors: Mapping[str, npt.NDArray[Any]]
    """Whole tensors by the model's argument name (VIDEO: ``pixel_values_videos``)."""
    layout: Mapping[str, Layout]
    sizes: Mapping[str, tuple[int, ...]]
    """Rows per item of each ``flat`` tensor."""
    items: tuple[DecodedItem, ...]
    im_token_id: int | None
    keep_on_cpu: frozenset[str]
    wire_dtypes: Mapping[str, str] = field(default_factory=dict)
    """Each tensor's dtype on the wire (``bfloat16`` arrays are float32 here when ml_dtypes is
    not installed; :meth:`torch` turns them back into ``torch.bfloat16``)."""

    @property
    def placeholders(self) -> tuple[tuple[int, int], ...]:
        """Every item's placeholder runs, in item order."""
        return tuple(r for item in self.items for r in item.placeholders)

    @property
    def hashes(self) -> tuple[str | None, ...]:
        return tuple(item.content_hash for item in self.items)

    def torch(self) -> dict[str, Any]:
        """The whole tensors as torch tensors sharing their memory; wire ``bfloat16`` comes
        back as ``torch.bfloat16`` (exactly, and without a copy when ml_dtypes is installed)."""
        return {
            name: to_torch(array, bfloat16=self.wire_dtypes.get(name) == "bfloat16")
            for name, array in self.tensors.items()
        }


def to_torch(array: npt.NDArray[Any], *, bfloat16: bool = False) -> Any:
    """A torch tensor over ``array``'s memory (read-only arrays are shared, not copied).
    ``bfloat16``: the values are bfloat16 on the wire; a float32 widening (no ml_dtypes) is
    narrowed back, which is exact."""
    import warnings

    import torch

    native_bf16 = array.dtype.name == "bfloat16"
    source = array.view(np.uint16) if native_bf16 else array
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns on read-only memory
        tensor = torch.from_numpy(source)
    if native_bf16:
        return tensor.view(torch.bfloat16)
    if bfloat16 and tensor.dtype == torch.float32:
        return tensor.to(torch.bfloat16)
    return tensor


def check_placeholders(
    ranges: Sequence[tuple[int, int]], n_ids: int, field: str, taken: list[tuple[int, int, str]]
) -> None:
    """Every range non-empty, inside ``input_ids`` and disjoint from every other range."""
    for i, (offset, length) in enumerate(ranges):
        name = f"{field}[{i}]"
        if length <= 0:
            raise PlaceholderError(
                f"{name}.length is {length}: a placeholder range needs at least one token",
                field=f"{name}.length",
                actual=length,
            )
        if offset + length > n_ids:
            raise PlaceholderError(
                f"{name} = [{offset}, {offset + length}) reaches past the end of input_ids "
                f"({n_ids} tokens)",
                field=name,
                expected=n_ids,
                actual=offset + length,
            )
        for start, other_len, other in taken:
            if offset < start + other_len and start < offset + length:
                raise PlaceholderError(
                    f"{name} = [{offset}, {offset + length}) overlaps {other} = "
                    f"[{start}, {start + other_len})",
                    field=name,
                    actual=[offset, length],
                )
        taken.append((offset, length, name))


def embed_masks(
    ids: npt.NDArray[Any],
    ranges: Sequence[tuple[int, int]],
    token: int | None,
    field: str,
) -> list[npt.NDArray[np.bool_] | None]:
    """Per range, the positions holding ``token`` (``None`` when all do or no token is set)."""
    masks: list[npt.NDArray[np.bool_] | None] = []
    for i, (offset, length) in enumerate(ranges):
        if token is None:
            masks.append(None)
            continue
        mask = ids[offset : offset + length] == token
        hits = int(mask.sum())
        if hits == 0:
            raise PlaceholderError(
                f"{field}[{i}] = [{offset}, {offset + length}) holds no placeholder token {token}",
                field=f"{field}[{i}]",
                expected=token,
                actual=0,
            )
        masks.append(None if hits == length else mask)
    return masks


def check_hashes(hashes: Sequence[str], n: int, field: str) -> list[str | None]:
    if not hashes:
        return [None] * n
    if len(hashes) != n:
        raise MultimodalError(
            f"{field}: {len(hashes)} hashes for {n} items",
            field=field,
            expected=n,
            actual=len(hashes),
        )
    for i, h in enumerate(hashes):
        if not _HEX64.match(h):
            raise MultimodalError(
                f"{field}[{i}]: expected 64 lower-case hex characters (blake3), got "
                f"{h[:80]!r} ({len(h)} characters)",
                field=f"{field}[{i}]",
                expected=64,
                actual=len(h),
            )
    return list(hashes)


def sizes_of(array: npt.NDArray[Any], n: int, rows: int, field: str, key: str) -> tuple[int, ...]:
    """The per-item lengths in a sizes tensor: integers, one per item, summing to ``rows``."""
    if array.dtype.kind not in "iu":
        raise MultimodalLayoutError(
            f"{field}: the sizes tensor of {key!r} must be integer, got {array.dtype}",
            field=field,
            actual=str(array.dtype),
        )
    flat = array.reshape(-1).astype(np.int64)
    if flat.shape[0] != n:
        raise MultimodalLayoutError(
            f"{field}: {flat.shape[0]} sizes for {n} items",
            field=field,
            expected=n,
            actual=int(flat.shape[0]),
        )
    if flat.size and int(flat.min()) < 0:
        raise MultimodalLayoutError(
            f"{field}: negative size {int(flat.min())}", field=field, actual=int(flat.min())
        )
    total = int(flat.sum())
    if total != rows:
        raise MultimodalLayoutError(
            f"{field}: sizes sum to {total}, but {key!r} has {rows} rows on dim 0",
            field=field,
            expected=rows,
            actual=total,
        )
    return tuple(int(v) for v in flat.tolist())


def check_grid(
    grid: npt.NDArray[Any],
    n: int,
    field: str,
    patches: tuple[int, ...] | None,
    embeds: Sequence[int] | None,
    merge_size: int | None,
) -> None:
    """A ``[n, 3]`` integer grid agreeing with the rows per item and, given the merge size,
    with the number of embedding positions of each placeholder range."""
    if grid.dtype.kind not in "iu" or grid.ndim != 2 or grid.shape != (n, 3):
        raise MultimodalLayoutError(
            f"{field}: expected an integer [{n}, 3] grid, got {grid.dtype} {list(grid.shape)}",
            field=field,
            expected=[n, 3],
            actual=list(grid.shape),
        )
    rows = grid.astype(np.int64)
    if rows.size and int(rows.min()) < 1:
        raise MultimodalLayoutError(
            f"{field}: grid values must be positive, got {int(rows.min())}",
            field=field,
            actual=int(rows.min()),
        )
    for i, (t, h, w) in enumerate(rows.tolist()):
        if patches is not None and t * h * w != patches[i]:
            raise MultimodalLayoutError(
                f"{field}[{i}] = [{t}, {h}, {w}] means {t * h * w} patches, but the item has "
                f"{patches[i]} rows",
                field=f"{field}[{i}]",
                expected=t * h * w,
                actual=patches[i],
            )
        if merge_size is not None and embeds is not None:
            want = t * h * w // (merge_size * merge_size)
            if embeds[i] != want:
                raise PlaceholderError(
                    f"item {i}: {embeds[i]} placeholder tokens, but grid [{t}, {h}, {w}] with "
                    f"merge size {merge_size} needs {want}",
                    field=f"{field}[{i}]",
                    expected=want,
                    actual=embeds[i],
                )


def split(
    tensors: Mapping[str, npt.NDArray[Any]],
    layout: Mapping[str, Layout],
    sizes: Mapping[str, tuple[int, ...]],
    n: int,
) -> list[dict[str, npt.NDArray[Any]]]:
    """Per item, its slice of each tensor (views): batched -> ``[i:i+1]``, flat -> its rows,
    shared -> the whole tensor."""
    starts = {k: np.concatenate([[0], np.cumsum(v)]).tolist() for k, v in sizes.items()}
    items: list[dict[str, npt.NDArray[Any]]] = []
    for i in range(n):
        item: dict[str, npt.NDArray[Any]] = {}
        for name, array in tensors.items():
            kind = layout[name]
            if kind == "batched":
                item[name] = array[i : i + 1]
            elif kind == "flat":
                item[name] = array[starts[name][i] : starts[name][i + 1]]
            else:
                item[name] = array
        items.append(item)
    return items


def first_dim(array: npt.NDArray[Any], key: str, field: str) -> int:
    if array.ndim == 0:
        raise MultimodalLayoutError(
            f"{field}: {key!r} is a scalar; batched and flat tensors need a dim 0",
            field=field,
            actual=[],
        )
    return int(array.shape[0])


def infer_layout(
    tensors: Mapping[str, npt.NDArray[Any]], primary: str, n: int, field: str
) -> tuple[dict[str, Layout], dict[str, tuple[int, ...]]]:
    """The batch layout of a contract without layout keys (SGLang, TokenSpeed items).

    The primary tensor is ``flat`` when the batch has a grid (``image_grid_thw`` /
    ``video_grid_thw``: rows per item ``t * h * w``) or a ``patches_per_image`` sizes tensor,
    else ``batched`` when its dim 0 has one entry per item; side tensors are ``batched`` when
    their dim 0 has ``n`` entries, else ``shared``. Returns the layout and the flat sizes.
    """
    layout: dict[str, Layout] = {}
    sizes: dict[str, tuple[int, ...]] = {}
    grid_key = next((k for k in GRID_KEYS if k in tensors), None)
    if primary in tensors:
        array = tensors[primary]
        rows = first_dim(array, primary, f"{field}.{primary}")
        if grid_key is not None:
            check_grid(tensors[grid_key], n, f"{field}.{grid_key}", None, None, None)
            per_item = tuple(int(t) * int(h) * int(w) for t, h, w in tensors[grid_key].tolist())
            if sum(per_item) != rows:
                raise MultimodalLayoutError(
                    f"{field}.{grid_key}: the grids give {sum(per_item)} patches, but "
                    f"{primary!r} has {rows} rows",
                    field=f"{field}.{grid_key}",
                    expected=rows,
                    actual=sum(per_item),
                )
            layout[primary], sizes[primary] = "flat", per_item
        elif "patches_per_image" in tensors:
            sizes_field = f"{field}.model_specific_tensors[patches_per_image]"
            sizes[primary] = sizes_of(tensors["patches_per_image"], n, rows, sizes_field, primary)
            layout[primary] = "flat"
        elif rows == n:
            layout[primary] = "batched"
        else:
            raise MultimodalLayoutError(
                f"{field}.{primary}: {rows} entries on dim 0 for {n} items, and no grid or "
                "patches_per_image tensor says how they split",
                field=f"{field}.{primary}",
                expected=n,
                actual=rows,
            )
    for key, array in tensors.items():
        if key != primary:
            layout[key] = "batched" if array.ndim > 0 and array.shape[0] == n else "shared"
    return layout, sizes
