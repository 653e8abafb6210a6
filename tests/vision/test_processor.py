"""``vision.ImageProcessor`` across families, against transformers (``support/parity.py``):
large outputs written with streaming stores into recycled buffers, configuration round trips and
errors, one error class per native error kind, bad inputs, that the comparison does fail on a
one-ulp or pass-order difference, and the outputs in a ``TensorMessage``."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from support.parity import (
    CLIP_MEAN,
    assert_matches,
    assert_same,
    hf_load,
    hf_processor,
    our_processor,
    pattern,
    reference_mark,
    run_hf,
)

from smg_grpc_proto import _native
from smg_grpc_proto.errors import (
    IMAGE_PROCESSING_ERRORS,
    AspectRatioError,
    ImageProcessingError,
    ProcessorConfigError,
    TruncatedImageError,
)
from smg_grpc_proto.vision import ImageProcessor, buffer_cache

pytest.importorskip("transformers", reason="the reference is transformers")
pytest.importorskip("PIL", reason="the reference resizer is Pillow")

from PIL import Image

pytestmark = reference_mark()


# ---- large outputs ------------------------------------------------------------------------


@pytest.mark.slow
def test_large_outputs_streamed_and_recycled() -> None:
    """Outputs above 8 MiB are written with streaming stores into buffers recycled from earlier
    calls (stale values from another batch in them): every call still equals transformers, and
    so does a call with recycling off."""
    arrays = [pattern(1500, 2000, 1), pattern(700, 900, 2), pattern(1200, 1600, 3)]
    hf = hf_processor("qwen2-defaults")
    ref = run_hf(hf, [Image.fromarray(a) for a in arrays])
    ref_reversed = run_hf(hf, [Image.fromarray(a) for a in arrays[::-1]])
    assert ref["pixel_values"].nbytes > 8 << 20
    ours = our_processor("qwen2-defaults")
    previous = buffer_cache().limit
    try:
        buffer_cache(256 << 20)
        for round_ in range(3):
            for threads in (1, None):
                assert_matches(ours(arrays, threads=threads), ref, f"round {round_}")
                assert_matches(ours(arrays[::-1], threads=threads), ref_reversed, "reversed")
        # Dropped outputs (and the batch's resized images) are kept for the next call.
        out = ours(arrays)
        held_while_alive = buffer_cache().held
        del out
        assert buffer_cache().held >= held_while_alive + ref["pixel_values"].nbytes
        # Recycling off frees everything and changes no value.
        assert buffer_cache(0) == (256 << 20, 0)
        assert_matches(ours(arrays), ref, "recycling off")
        assert buffer_cache().held == 0
    finally:
        buffer_cache(previous)
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="limit"):
            buffer_cache(bad)  # type: ignore[arg-type]


# ---- configuration ----------------------------------------------------------------------


def test_config_round_trip_and_errors() -> None:
    for family in _native.processor_families():
        p = ImageProcessor.for_family(family)  # type: ignore[arg-type]
        assert ImageProcessor(family, p.config).config == p.config  # type: ignore[arg-type]
    with pytest.raises(ProcessorConfigError, match="family") as err:
        ImageProcessor("florence2", {})  # type: ignore[arg-type]
    assert err.value.field == "family"
    with pytest.raises(ProcessorConfigError, match="patch_size"):
        ImageProcessor("qwen2_vl", {"patch_size": 0})
    assert {"internvl", "idefics3", "smolvlm"} <= set(_native.processor_families())
    with pytest.raises(ProcessorConfigError, match="size"):
        ImageProcessor("clip", {"size": {"height": 10}})
    with pytest.raises(ProcessorConfigError, match="image_mean"):
        ImageProcessor("siglip", {"image_mean": [0.5, 0.5]})
    with pytest.raises(ProcessorConfigError, match="resample"):
        ImageProcessor("clip", {"resample": 7})
    with pytest.raises(ProcessorConfigError, match="crop_size"):
        ImageProcessor("siglip", {"do_center_crop": True})


def test_error_classes_cover_every_native_kind() -> None:
    """One Python class per Rust ``ProcessorError`` variant (``decode`` raises the decoding
    errors), and they pickle."""
    kinds = _native.processor_error_kinds()
    missing = sorted(set(kinds) - set(IMAGE_PROCESSING_ERRORS) - {"decode"})
    assert not missing, f"add to smg_grpc_proto.errors.IMAGE_PROCESSING_ERRORS: {missing}"
    assert sorted(IMAGE_PROCESSING_ERRORS) == sorted(set(kinds) - {"decode"})
    with pytest.raises(ImageProcessingError) as caught:
        ImageProcessor.for_family("qwen2_vl")(pattern(1, 300, 1))
    exc = caught.value
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is AspectRatioError
    assert str(again) == str(exc)
    assert (again.field, again.expected, again.actual, again.index) == (
        exc.field,
        exc.expected,
        exc.actual,
        exc.index,
    )


def test_bad_inputs(corpus: dict[str, Path]) -> None:
    ours = ImageProcessor.for_family("clip")
    data = corpus["grace_hopper.jpg"].read_bytes()
    with pytest.raises(TruncatedImageError, match="image 1"):
        ours([data, data[: len(data) // 3]])
    with pytest.raises(TypeError, match="uint8"):
        ours(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(ValueError, match="channels"):
        ours(np.zeros((4, 4, 2), np.uint8))
    with pytest.raises(TypeError, match="PIL image"):
        ours(3.5)
    with pytest.raises(ValueError, match="images"):
        ours()
    # Non-contiguous arrays are copied, not refused.
    photo = np.asarray(hf_load(corpus["grace_hopper.jpg"]))
    flipped = photo[:, ::-1]
    ref = run_hf(hf_processor("clip-defaults"), np.ascontiguousarray(flipped))
    assert_matches(ours(flipped), ref, "non-contiguous")


# ---- the tests can fail -------------------------------------------------------------------


def test_a_wrong_mean_is_caught(corpus: dict[str, Path]) -> None:
    """One float32 ulp off in one channel's mean: the comparison must see it."""
    path = str(corpus["grace_hopper.jpg"])
    ref = run_hf(hf_processor("qwen2-defaults"), hf_load(path))
    mean = list(CLIP_MEAN)
    mean[1] = float(np.nextafter(np.float32(mean[1]), np.float32(1)))
    wrong = ImageProcessor("qwen2_vl", {"image_mean": mean})(path)
    with pytest.raises(AssertionError, match="values differ"):
        assert_matches(wrong, ref, "off-by-one mean")


def test_pass_order_and_alpha_are_caught(corpus: dict[str, Path]) -> None:
    """Pillow 12's pass order on a resize Pillow 13 runs vertically first, and compositing
    alpha where transformers' loader drops it, both differ from the reference."""
    path = str(corpus["tall-3000x500.jpg"])
    ref = run_hf(hf_processor("qwen2-defaults"), hf_load(path))
    assert_matches(ImageProcessor("qwen2_vl")(path), ref, "pillow13")
    with pytest.raises(AssertionError, match="values differ"):
        assert_matches(ImageProcessor("qwen2_vl", {"pass_order": "pillow12"})(path), ref, "")
    rgba = str(corpus["rgba.png"])
    ref = run_hf(hf_processor("clip-defaults"), hf_load(rgba))
    with pytest.raises(AssertionError, match="values differ"):
        assert_matches(ImageProcessor("clip", alpha="white")(rgba), ref, "alpha")


def test_tensor_message(corpus: dict[str, Path]) -> None:
    """The outputs go into a vLLM request through ``tensors.TensorMessage``."""
    from smg_grpc_proto import tensors, vllm_engine_pb2

    out = ImageProcessor.for_family("qwen2_vl")(str(corpus["grace_hopper.jpg"]))
    message = tensors.TensorMessage(vllm_engine_pb2.GenerateRequest(request_id="r"))
    out.attach(message)
    parsed = tensors.parse(tensors.serialize(message), vllm_engine_pb2.GenerateRequest)
    assert_same(parsed["mm_inputs.pixel_values"], out.pixel_values, "pixel_values")
    assert_same(
        parsed["mm_inputs.model_specific_tensors[image_grid_thw]"], out.image_grid_thw, "grid"
    )
    assert set(out.tensors()) == {"pixel_values", "image_grid_thw"}
