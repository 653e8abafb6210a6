"""A batch on several threads is the batch on one: the largest images are handed out first
(parallel::costliest_first), but outputs stay in input order and the first bad image by index is
the one reported."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from support.images import grace_hopper

from smg_grpc_proto.engines import VisionModel
from smg_grpc_proto.errors import SmgProtoError


def _png(width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


@pytest.mark.parametrize("family", ["qwen2_vl", "llava_next"])
def test_threads_give_the_same_batch_in_input_order(family: str) -> None:
    # small first, the largest last: the largest is processed first on two threads
    files = [_png(64, 48, 1), grace_hopper(), _png(90, 300, 2), _png(900, 700, 3)]
    model = VisionModel.for_family(family)
    one = model.prepare(files, threads=1)
    two = model.prepare(files, threads=2)
    assert one.token_counts == two.token_counts
    for name, array in one.tensors().items():
        np.testing.assert_array_equal(two.tensors()[name], array, err_msg=name)


def test_the_first_bad_image_by_index_is_reported() -> None:
    files = [grace_hopper(), b"not an image", b"nor this one", _png(900, 700, 3)]
    model = VisionModel.for_family("qwen2_vl")
    for threads in (1, 2):
        with pytest.raises(SmgProtoError, match="image 1: cannot identify the image format"):
            model.prepare(files, threads=threads)
