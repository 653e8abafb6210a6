"""media_digests: a batch's digests on its threads are media_digest's, item by item."""

from __future__ import annotations

import numpy as np
import pytest

from smg_grpc_proto import _native
from smg_grpc_proto.errors import ImageTypeError

RNG = np.random.default_rng(7)


def _batch(sizes: list[int]) -> list[list[bytes | np.ndarray]]:
    return [
        [b"domain", RNG.integers(0, 256, size, dtype=np.uint8).tobytes(), np.arange(n % 7 + 1)]
        for n, size in enumerate(sizes)
    ]


@pytest.mark.parametrize("threads", [0, 1, 2, 3])
@pytest.mark.parametrize("sizes", [[10, 2000, 5], [300_000, 50, 900_000, 120_000, 1], []])
def test_same_digests_as_one_by_one(threads: int, sizes: list[int]) -> None:
    batch = _batch(sizes)
    expected = [_native.media_digest(parts) for parts in batch]
    assert _native.media_digests(batch, threads) == expected
    assert len(set(expected)) == len(expected)  # distinct items, distinct digests


def test_errors_name_the_item_and_part() -> None:
    with pytest.raises(ImageTypeError, match=r"batches\[1\]\[2\]: expected bytes") as info:
        _native.media_digests([[b"a"], [b"b", b"c", "text"]])  # type: ignore[list-item]
    assert info.value.field == "batches[1][2]"
    with pytest.raises(ImageTypeError, match=r"batches\[0\]: expected a list or tuple"):
        _native.media_digests([b"a"])  # type: ignore[list-item]
    with pytest.raises(ImageTypeError, match="batches: expected a list or tuple"):
        _native.media_digests(3)  # type: ignore[arg-type]
