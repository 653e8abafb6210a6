"""Engine side, engine-independent: what a decoder returns, and the checks every decoder runs.

:class:`DecodedBatch` is one batch of media of one modality as the engine's model consumes it:
whole tensors by model argument name, how each splits into items (batched / flat / shared, the
vLLM ``MultiModalFieldConfig`` rules), and :class:`DecodedItem` views per item with its
placeholder range, embed mask and content hash.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn

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
    pixels: bool = True
    """``False``: the batch carries no encoder input (vLLM: no ``pixel_values``) — the decode
    side of a disaggregated prefill/decode request, whose KV comes from the prefill worker.
    ``tensors`` then holds only the side tensors (grid, sizes; none for a hashes-only batch)
    and the items keep their placeholders, embed masks and hashes."""

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
    groups: Sequence[tuple[str, Sequence[tuple[int, int]]]],
    n_ids: int,
    ids: npt.NDArray[Any] | None = None,
    tokens: Collection[int] = (),
) -> None:
    """Every range of every group non-empty, inside ``input_ids`` and disjoint from every other
    range of any group; ``groups`` are ``(field, ranges)`` pairs (one per batch or item).

    Two ranges may share one boundary token when it takes no embedding (given ``ids`` and the
    embedding ``tokens``): vLLM's Gemma 3 processor reports adjacent images that way, their
    newlines merged into one token that belongs to both replacements.

    Costs O(n log n) in the number of ranges: their count is bounded by ``n_ids`` first (disjoint
    non-empty ranges cannot outnumber the tokens), then one sort finds any overlap.
    """
    total = sum(len(ranges) for _, ranges in groups)
    if total == 0:
        return
    check_range_count(groups[0][0] if len(groups) == 1 else "placeholders", total, n_ids)
    if total <= _FEW_RANGES:
        _check_few(groups, n_ids, ids, tokens)
        return
    offsets = np.fromiter((r[0] for _, ranges in groups for r in ranges), np.int64, total)
    lengths = np.fromiter((r[1] for _, ranges in groups for r in ranges), np.int64, total)
    ends = offsets + lengths  # each < 2**33: no overflow
    bad = np.flatnonzero(lengths <= 0)
    if bad.size:
        i = int(bad[0])
        name = _range_name(groups, i)
        raise PlaceholderError(
            f"{name}.length is {int(lengths[i])}: a placeholder range needs at least one token",
            field=f"{name}.length",
            actual=int(lengths[i]),
        )
    bad = np.flatnonzero(ends > n_ids)
    if bad.size:
        i = int(bad[0])
        name = _range_name(groups, i)
        raise PlaceholderError(
            f"{name} = [{int(offsets[i])}, {int(ends[i])}) reaches past the end of input_ids "
            f"({n_ids} tokens)",
            field=name,
            expected=n_ids,
            actual=int(ends[i]),
        )
    order = np.argsort(offsets, kind="stable")
    # Sorted by start, a range overlaps an earlier one iff it starts before the furthest end so
    # far; a one-token overlap is a shared boundary token when it takes no embedding.
    reach = np.maximum.accumulate(ends[order])[:-1]
    overlap = reach - offsets[order[1:]]
    shared = overlap == 1
    if ids is not None and tokens and shared.any():
        at = offsets[order[1:]][shared]
        shared[shared] = ~np.isin(ids[at], np.fromiter(tokens, np.int64))
    else:
        shared[:] = False
    clash = np.flatnonzero((overlap > 0) & ~shared)
    if clash.size:
        a, b = int(order[clash[0]]), int(order[clash[0] + 1])
        first, second = (a, b) if a < b else (b, a)
        name = _range_name(groups, second)
        raise PlaceholderError(
            f"{name} = [{int(offsets[second])}, {int(ends[second])}) overlaps "
            f"{_range_name(groups, first)} = [{int(offsets[first])}, {int(ends[first])})",
            field=name,
            actual=[int(offsets[second]), int(lengths[second])],
        )


#: Up to this many ranges, :func:`check_placeholders` checks them with Python integers (a
#: handful of comparisons) instead of building arrays: same checks, same order, same errors.
_FEW_RANGES = 16


def _check_few(
    groups: Sequence[tuple[str, Sequence[tuple[int, int]]]],
    n_ids: int,
    ids: npt.NDArray[Any] | None,
    tokens: Collection[int],
) -> None:
    """:func:`check_placeholders` for a few ranges, without numpy (the same errors)."""
    flat = [(int(r[0]), int(r[1])) for _, ranges in groups for r in ranges]
    for i, (_, length) in enumerate(flat):
        if length <= 0:
            name = _range_name(groups, i)
            raise PlaceholderError(
                f"{name}.length is {length}: a placeholder range needs at least one token",
                field=f"{name}.length",
                actual=length,
            )
    for i, (offset, length) in enumerate(flat):
        if offset + length > n_ids:
            name = _range_name(groups, i)
            raise PlaceholderError(
                f"{name} = [{offset}, {offset + length}) reaches past the end of input_ids "
                f"({n_ids} tokens)",
                field=name,
                expected=n_ids,
                actual=offset + length,
            )
    if len(flat) < 2:
        return
    order = sorted(range(len(flat)), key=lambda k: flat[k][0])  # stable, as argsort's
    reach = flat[order[0]][0] + flat[order[0]][1]
    embedding = {int(t) for t in tokens}
    for j in range(1, len(order)):
        offset, length = flat[order[j]]
        overlap = reach - offset
        if overlap > 0 and not (
            overlap == 1 and ids is not None and embedding and int(ids[offset]) not in embedding
        ):
            a, b = order[j - 1], order[j]
            first, second = (a, b) if a < b else (b, a)
            name = _range_name(groups, second)
            f_off, f_len = flat[first]
            s_off, s_len = flat[second]
            raise PlaceholderError(
                f"{name} = [{s_off}, {s_off + s_len}) overlaps "
                f"{_range_name(groups, first)} = [{f_off}, {f_off + f_len})",
                field=name,
                actual=[s_off, s_len],
            )
        reach = max(reach, offset + length)


def check_range_count(field: str, count: int, n_ids: int) -> None:
    """Disjoint non-empty ranges cannot outnumber the tokens: the cheap check that runs before
    anything is built per range."""
    if count > n_ids:
        raise PlaceholderError(
            f"{field}: {count} placeholder ranges for {n_ids} tokens of input_ids; disjoint "
            "non-empty ranges cannot outnumber the tokens",
            field=field,
            expected=n_ids,
            actual=count,
        )


def _range_name(groups: Sequence[tuple[str, Sequence[tuple[int, int]]]], k: int) -> str:
    """``field[i]`` of the k-th range over all groups (computed only for the one reported)."""
    for name, ranges in groups:
        if k < len(ranges):
            return f"{name}[{k}]"
        k -= len(ranges)
    raise IndexError(k)


#: Up to this many ranges, :func:`embed_masks` compares each run on its own (about 1.2 µs a
#: range) instead of the whole prompt at once (9 to 12 µs, whatever the number of ranges).
_FEW_MASKS = 8


def embed_masks(
    ids: npt.NDArray[Any],
    ranges: Sequence[tuple[int, int]],
    token: int | None,
    field: str,
) -> list[npt.NDArray[np.bool_] | None]:
    """Per range, the positions holding ``token`` (``None`` when all do or no token is set).

    The ranges are checked (disjoint, inside ``ids``) beforehand, so the work is linear: a group
    with many ranges compares the whole prompt once; a group with few compares only its runs.
    """
    if token is None:
        return [None] * len(ranges)
    if not ranges:
        return []
    # Many ranges over a short prompt: one pass over the whole prompt. A few ranges (a request
    # of one or a handful of images, whatever its prompt): a comparison per run, without the
    # dozen numpy calls of the whole-prompt pass (see _FEW_MASKS).
    if len(ranges) > _FEW_MASKS and len(ranges) * 64 >= ids.shape[0]:
        hit = ids == token
        counts = np.concatenate(([0], np.cumsum(hit, dtype=np.int64)))
        offsets = np.fromiter((r[0] for r in ranges), np.int64, len(ranges))
        lengths = np.fromiter((r[1] for r in ranges), np.int64, len(ranges))
        hits = counts[offsets + lengths] - counts[offsets]
        empty = np.flatnonzero(hits == 0)
        if empty.size:
            _no_token(field, int(empty[0]), ranges, token)
        full = (hits == lengths).tolist()
        return [
            None if full[i] else hit[offset : offset + length]
            for i, (offset, length) in enumerate(ranges)
        ]
    masks: list[npt.NDArray[np.bool_] | None] = []
    for i, (offset, length) in enumerate(ranges):
        mask = ids[offset : offset + length] == token
        n_hits = int(np.count_nonzero(mask))
        if n_hits == 0:
            _no_token(field, i, ranges, token)
        masks.append(None if n_hits == length else mask)
    return masks


def _no_token(field: str, i: int, ranges: Sequence[tuple[int, int]], token: int) -> NoReturn:
    offset, length = ranges[i]
    raise PlaceholderError(
        f"{field}[{i}] = [{offset}, {offset + length}) holds no placeholder token {token}",
        field=f"{field}[{i}]",
        expected=token,
        actual=0,
    )


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
        if not _HEX64.fullmatch(h):
            raise MultimodalError(
                f"{field}[{i}]: expected 64 lower-case hex characters (blake3), got "
                f"{h[:80]!r} ({len(h)} characters)",
                field=f"{field}[{i}]",
                expected=64,
                actual=len(h),
            )
    return list(hashes)


def sizes_of(array: npt.NDArray[Any], n: int, rows: int, field: str, key: str) -> tuple[int, ...]:
    """The per-item lengths in a sizes tensor: integers, one per item, summing to ``rows``.

    The arithmetic is exact (Python integers: no int64 wraparound); every size must lie in
    ``0..rows`` before they are summed."""
    if array.dtype.kind not in "iu":
        raise MultimodalLayoutError(
            f"{field}: the sizes tensor of {key!r} must be integer, got {array.dtype}",
            field=field,
            actual=str(array.dtype),
        )
    if array.size != n:
        raise MultimodalLayoutError(
            f"{field}: {array.size} sizes for {n} items",
            field=field,
            expected=n,
            actual=int(array.size),
        )
    values: list[int] = array.reshape(-1).tolist()
    for i, v in enumerate(values):
        if not 0 <= v <= rows:
            raise MultimodalLayoutError(
                f"{field}[{i}] = {v}: a size must lie in 0..{rows} ({key!r} has {rows} rows on "
                "dim 0)",
                field=f"{field}[{i}]",
                expected=f"0..{rows}",
                actual=v,
            )
    total = sum(values)
    if total != rows:
        raise MultimodalLayoutError(
            f"{field}: sizes sum to {total}, but {key!r} has {rows} rows on dim 0",
            field=field,
            expected=rows,
            actual=total,
        )
    return tuple(values)


def check_grid(
    grid: npt.NDArray[Any],
    n: int,
    field: str,
    patches: tuple[int, ...] | None,
    embeds: Sequence[int] | None,
    merge_size: int | None,
) -> list[tuple[int, int, int]]:
    """A ``[n, 3]`` integer grid agreeing with the rows per item and, given the merge size,
    divisible by it and agreeing with the number of embedding positions of each placeholder
    range. Returns the grid rows as exact integers."""
    if grid.dtype.kind not in "iu" or grid.ndim != 2 or grid.shape != (n, 3):
        raise MultimodalLayoutError(
            f"{field}: expected an integer [{n}, 3] grid, got {grid.dtype} {list(grid.shape)}",
            field=field,
            expected=[n, 3],
            actual=list(grid.shape),
        )
    rows: list[list[int]] = grid.tolist()  # exact, whatever the integer dtype
    for i, row in enumerate(rows):
        if min(row) < 1:
            raise MultimodalLayoutError(
                f"{field}[{i}] = {row}: grid values must be positive",
                field=f"{field}[{i}]",
                actual=row,
            )
    for i, (t, h, w) in enumerate(rows):
        if patches is not None and t * h * w != patches[i]:
            raise MultimodalLayoutError(
                f"{field}[{i}] = [{t}, {h}, {w}] means {t * h * w} patches, but the item has "
                f"{patches[i]} rows",
                field=f"{field}[{i}]",
                expected=t * h * w,
                actual=patches[i],
            )
        if merge_size is not None:
            if h % merge_size or w % merge_size:
                raise MultimodalLayoutError(
                    f"{field}[{i}] = [{t}, {h}, {w}]: height and width must be multiples of the "
                    f"merge size {merge_size}",
                    field=f"{field}[{i}]",
                    expected=merge_size,
                    actual=[t, h, w],
                )
            want = t * h * w // (merge_size * merge_size)
            if embeds is not None and embeds[i] != want:
                raise PlaceholderError(
                    f"item {i}: {embeds[i]} placeholder tokens, but grid [{t}, {h}, {w}] with "
                    f"merge size {merge_size} needs {want}",
                    field=f"{field}[{i}]",
                    expected=want,
                    actual=embeds[i],
                )
    return [(t, h, w) for t, h, w in rows]


def split(
    tensors: Mapping[str, npt.NDArray[Any]],
    layout: Mapping[str, Layout],
    sizes: Mapping[str, tuple[int, ...]],
    n: int,
) -> list[dict[str, npt.NDArray[Any]]]:
    """Per item, its slice of each tensor (views): batched -> ``[i:i+1]``, flat -> its rows,
    shared -> the whole tensor."""
    starts = {k: list(itertools.accumulate(v, initial=0)) for k, v in sizes.items()}
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


# The rows-per-item tensor of the tiled families in the contracts without layout keys (SGLang,
# TokenSpeed): the builders send it under this name whatever the engine model calls it.
SIZES_KEY = "patches_per_image"


def infer_layout(
    tensors: Mapping[str, npt.NDArray[Any]], primary: str, n: int, field: str
) -> tuple[dict[str, Layout], dict[str, tuple[int, ...]]]:
    """The batch layout of a contract without layout keys (SGLang, TokenSpeed items).

    The primary tensor is ``flat`` when the batch has a grid (``image_grid_thw`` /
    ``video_grid_thw``: rows per item ``t * h * w``) or a ``patches_per_image`` sizes tensor
    (the tiled families; then every side tensor whose dim 0 holds the same rows, and not one
    per item, is flat as well), else ``batched`` when its dim 0 has one entry per item; the
    other side tensors are ``batched`` when their dim 0 has ``n`` entries, else ``shared``.
    Returns the layout and the flat sizes.
    """
    layout: dict[str, Layout] = {}
    sizes: dict[str, tuple[int, ...]] = {}
    grid_key = next((k for k in GRID_KEYS if k in tensors), None)
    tiled: tuple[int, ...] | None = None
    if primary in tensors:
        array = tensors[primary]
        rows = first_dim(array, primary, f"{field}.{primary}")
        if grid_key is not None:
            grid = check_grid(tensors[grid_key], n, f"{field}.{grid_key}", None, None, None)
            per_item = tuple(t * h * w for t, h, w in grid)
            if sum(per_item) != rows:
                raise MultimodalLayoutError(
                    f"{field}.{grid_key}: the grids give {sum(per_item)} patches, but "
                    f"{primary!r} has {rows} rows",
                    field=f"{field}.{grid_key}",
                    expected=rows,
                    actual=sum(per_item),
                )
            layout[primary], sizes[primary] = "flat", per_item
        elif SIZES_KEY in tensors:
            sizes_field = f"{field}.model_specific_tensors[{SIZES_KEY}]"
            tiled = sizes_of(tensors[SIZES_KEY], n, rows, sizes_field, primary)
            layout[primary], sizes[primary] = "flat", tiled
        elif rows == n:
            layout[primary] = "batched"
        else:
            raise MultimodalLayoutError(
                f"{field}.{primary}: {rows} entries on dim 0 for {n} items, and no grid or "
                f"{SIZES_KEY} tensor says how they split",
                field=f"{field}.{primary}",
                expected=n,
                actual=rows,
            )
    for key, array in tensors.items():
        if key == primary:
            continue
        first = array.shape[0] if array.ndim > 0 else None
        if tiled is not None and first == sum(tiled) and first != n:
            layout[key], sizes[key] = "flat", tiled
        else:
            layout[key] = "batched" if first == n else "shared"
    return layout, sizes
