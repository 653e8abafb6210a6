"""Blocks with no AC coefficient (a DC symbol, then end of block), on both sides of the clamp:
flat tiles of every grey level and of saturated colours, at qualities whose quantizers put a
flat block's value past the sample range (a white block at quality 50 comes out of the IDCT at
256 and is clamped; at 75 it is exactly 255), with and without restart markers. The images are
large enough (256 blocks or more) for the Huffman decoder to build its whole-symbol tables.
Each file decodes to Pillow's pixels."""

from __future__ import annotations

import numpy as np
import pytest

PIL = pytest.importorskip("PIL", reason="the reference decoder is Pillow")
from PIL import Image  # noqa: E402
from support.decode_cases import encode, reference  # noqa: E402

from smg_grpc_proto import vision  # noqa: E402

QUALITIES = (1, 5, 10, 25, 50, 75, 90, 95, 100)


def _grey_tiles() -> Image.Image:
    """One 8 x 8 tile per grey level, 0 to 255, then the same reversed (128 x 256, 512 blocks)."""
    levels = np.arange(256, dtype=np.uint8).reshape(16, 16)
    tiles = np.kron(levels, np.ones((8, 8), np.uint8))
    return Image.fromarray(np.concatenate([tiles, tiles[::-1, ::-1]], axis=0))


def _colour_tiles() -> Image.Image:
    """16 x 16 tiles (one MCU of 4:2:0) of the corners of the colour cube and values next to
    them, then one noisy tile (blocks that keep AC terms); rows of them, every other one
    mirrored (224 x 128: 672 blocks at 4:2:0)."""
    rng = np.random.default_rng(7)
    corners = [(r, g, b) for r in (0, 255) for g in (0, 255) for b in (0, 255)]
    near = [(1, 254, 128), (254, 1, 2), (3, 3, 252), (128, 128, 128), (250, 250, 250)]
    tiles = [np.full((16, 16, 3), c, np.uint8) for c in corners + near]
    tiles.append(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8))
    row = np.concatenate(tiles, axis=1)
    return Image.fromarray(np.concatenate([row, row[:, ::-1]] * 4, axis=0))


@pytest.mark.parametrize("quality", QUALITIES)
def test_flat_grey_blocks_decode_to_pillows_pixels(quality: int) -> None:
    data = encode(_grey_tiles(), "JPEG", quality=quality)
    np.testing.assert_array_equal(vision.decode(data, threads=1), reference(data))


@pytest.mark.parametrize("subsampling", [0, 1, 2])
@pytest.mark.parametrize("quality", QUALITIES)
def test_flat_colour_blocks_decode_to_pillows_pixels(quality: int, subsampling: int) -> None:
    data = encode(_colour_tiles(), "JPEG", quality=quality, subsampling=subsampling)
    np.testing.assert_array_equal(vision.decode(data, threads=1), reference(data))


def test_restart_markers_and_flat_blocks_decode_to_pillows_pixels() -> None:
    """Restart intervals: the decoder runs two intervals in turn, flat blocks in both."""
    image = _colour_tiles().resize((448, 256), Image.Resampling.NEAREST)
    for quality in (50, 75, 95):
        data = encode(image, "JPEG", quality=quality, restart_marker_blocks=4)
        np.testing.assert_array_equal(vision.decode(data, threads=1), reference(data))
