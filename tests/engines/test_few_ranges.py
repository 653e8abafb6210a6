"""The few-ranges paths of ``check_placeholders`` (Python integers) and ``embed_masks`` (one
comparison per run) agree with the array paths (one pass over the prompt) on random inputs: the
same verdict, the same masks and the same error text."""

from __future__ import annotations

import random

import numpy as np
import pytest

from smg_grpc_proto.engines import _decoded
from smg_grpc_proto.errors import PlaceholderError


def _verdict(
    groups: list[tuple[str, list[tuple[int, int]]]], n: int, ids: object, tokens: list[int]
) -> str:
    try:
        _decoded.check_placeholders(groups, n, ids, tokens)  # type: ignore[arg-type]
    except PlaceholderError as exc:
        return f"{exc} | {exc.field} | {exc.actual}"
    return "ok"


@pytest.mark.parametrize("seed", range(8))
def test_few_ranges_path_matches_array_path(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    cases = []
    for _ in range(400):
        n = rng.randint(1, 40)
        ids = np.asarray([rng.choice([5, 7, 9]) for _ in range(n)], dtype=np.int64)
        groups = [
            (
                f"g{g}.mm_placeholders",
                [(rng.randint(0, n), rng.randint(-1, 6)) for _ in range(rng.randint(0, 4))],
            )
            for g in range(rng.randint(1, 3))
        ]
        tokens = rng.choice([[], [7], [7, 9]])
        use_ids = ids if rng.random() < 0.8 else None
        if sum(len(r) for _, r in groups) == 0 or sum(len(r) for _, r in groups) > n:
            continue
        cases.append((groups, n, use_ids, tokens))
    few = [_verdict(*case) for case in cases]
    monkeypatch.setattr(_decoded, "_FEW_RANGES", 0)
    many = [_verdict(*case) for case in cases]
    assert few == many
    for kind in ("ok", "overlaps", "past the end", "at least one"):
        assert any(kind in v for v in few), kind


@pytest.mark.parametrize("few", [16, 0])
def test_shared_boundary_token(few: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # ranges [0, 3) and [2, 5) share token 2: allowed when it takes no embedding (5 does not)
    monkeypatch.setattr(_decoded, "_FEW_RANGES", few)
    ids = np.asarray([7, 7, 5, 7, 7], dtype=np.int64)
    groups = [("mm.mm_placeholders", [(0, 3), (2, 3)])]
    assert _verdict(groups, 5, ids, [7]) == "ok"
    assert "overlaps" in _verdict(groups, 5, ids, [5])
    assert "overlaps" in _verdict(groups, 5, None, [7])


def _masks(ids: object, ranges: list[tuple[int, int]], token: int | None) -> object:
    try:
        masks = _decoded.embed_masks(ids, ranges, token, "mm.mm_placeholders")  # type: ignore[arg-type]
    except PlaceholderError as exc:
        return f"{exc} | {exc.field} | {exc.expected} | {exc.actual}"
    return [None if m is None else (m.dtype.name, m.tolist()) for m in masks]


@pytest.mark.parametrize("seed", range(4))
def test_embed_masks_per_run_matches_whole_prompt(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Disjoint ranges inside the prompt (as checked before embed_masks runs), over prompts short
    # enough that the whole-prompt pass would be chosen for any number of ranges.
    rng = random.Random(seed)
    cases = []
    for _ in range(300):
        n = rng.randint(1, 60)
        ids = np.asarray([rng.choice([5, 7, 7, 9]) for _ in range(n)], dtype=np.int64)
        cuts = sorted(rng.sample(range(n + 1), 2 * rng.randint(1, min(8, (n + 1) // 2))))
        ranges = [(a, b - a) for a, b in zip(cuts[::2], cuts[1::2], strict=True)]
        token = rng.choice([7, 7, 7, 5, None])
        cases.append((ids, ranges, token))
    monkeypatch.setattr(_decoded, "_FEW_MASKS", 1 << 30)
    per_run = [_masks(*case) for case in cases]
    monkeypatch.setattr(_decoded, "_FEW_MASKS", 0)
    whole = [_masks(*case) for case in cases]
    assert per_run == whole
    assert any(isinstance(v, str) and "holds no placeholder token" in v for v in per_run)
    assert any(isinstance(v, list) and None in v for v in per_run)
    assert any(isinstance(v, list) and any(m is not None for m in v) for v in per_run)
