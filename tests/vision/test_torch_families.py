"""Llama 4, Phi-4-multimodal and Phi-3-vision beyond the goldens: configuration errors naming
the field, inputs the references refuse, ``from_pretrained``, bfloat16 without ml_dtypes, the
CLI, thread-count independence. Pixel exactness is ``test_torch_goldens.py``'s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from smg_grpc_proto import cli, vision
from smg_grpc_proto.errors import ImageShapeError, ProcessorConfigError

ROOT = Path(__file__).resolve().parents[2]
PHOTO = ROOT / "src" / "smg_grpc_proto" / "data" / "grace_hopper.jpg"


@pytest.mark.parametrize(
    ("family", "config", "field"),
    [
        ("llama4", {"size": {"height": 336, "width": 448}}, "size"),
        ("llama4", {"max_patches": 0}, "max_patches"),
        ("llama4", {"resample": 1}, "resample"),
        ("llama4", {"do_rescale": False}, "do_rescale"),
        ("llama4", {"do_normalize": False}, "do_normalize"),
        ("llama4", {"do_resize": False}, "do_resize"),
        ("llama4", {"image_std": [0.5, 0.0, 0.5]}, "image_std"),
        ("llama4", {"pixel_shuffle_ratio": 0.0}, "pixel_shuffle_ratio"),
        ("phi4_multimodal", {"size": {"height": 448, "width": 336}}, "size"),
        ("phi4_multimodal", {"resample": 2}, "resample"),
        ("phi4_multimodal", {"patch_size": 500}, "patch_size"),
        ("phi4_multimodal", {"dynamic_hd": 0}, "dynamic_hd"),
        ("phi3_v", {"num_crops": 0}, "num_crops"),
        ("phi3_v", {"image_std": 0.0}, "image_std"),
    ],
)
def test_config_errors_name_the_field(family: str, config: dict[str, Any], field: str) -> None:
    with pytest.raises(ProcessorConfigError, match=field) as err:
        vision.ImageProcessor(family, config)  # type: ignore[arg-type]
    assert err.value.field == field


def test_phi3_takes_only_its_hub_keys() -> None:
    # The hub class has no resize/rescale switches: such keys in a config change nothing.
    plain = vision.ImageProcessor("phi3_v", {"num_crops": 4})
    extra = vision.ImageProcessor("phi3_v", {"num_crops": 4, "do_normalize": False, "size": 7})
    image = vision.decode(PHOTO)
    assert plain([image]).pixel_values.tobytes() == extra([image]).pixel_values.tobytes()
    assert plain.config["num_crops"] == 4


@pytest.mark.parametrize(
    ("family", "config", "shape"),
    [
        ("phi4_multimodal", {}, (1, 700)),
        ("phi4_multimodal", {}, (3000, 5)),
        ("phi3_v", {"num_crops": 1}, (700, 1)),
    ],
)
def test_thin_images_are_refused_with_the_numbers(
    family: str, config: dict[str, Any], shape: tuple[int, int]
) -> None:
    proc = vision.ImageProcessor(family, config)  # type: ignore[arg-type]
    image = np.full((*shape, 3), 128, np.uint8)
    with pytest.raises(ImageShapeError) as err:
        proc([vision.decode(PHOTO), image])
    assert err.value.index == 1
    assert f"{shape[0]}x{shape[1]}" in str(err.value)


def test_llama4_from_pretrained_directory(tmp_path: Path) -> None:
    """A model directory: the image processor's keys from preprocessor_config.json, the token
    count's from Llama4Processor's processor_config.json."""
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "Llama4ImageProcessorFast",
                "max_patches": 4,
                "resample": 2,
                "size": {"height": 336, "width": 336},
                "resize_to_max_canvas": False,
            }
        )
    )
    (tmp_path / "processor_config.json").write_text(
        json.dumps({"patch_size": 28, "pixel_shuffle_ratio": 0.5})
    )
    proc = vision.ImageProcessor.from_pretrained(tmp_path)
    assert proc.family == "llama4"
    out = proc([PHOTO])
    assert out.aspect_ratios is not None
    assert out.aspect_ratios.tolist() == [[2, 2]]
    # (336 // 28)² // 4 = 36 per tile; 4 tiles and the global tile.
    assert out.num_image_tokens == (36 * 5,)
    default = vision.ImageProcessor.for_family("llama4")([PHOTO])
    assert default.num_image_tokens == (144 * 5,)


def test_phi_families_from_their_class_names() -> None:
    phi4 = vision.ImageProcessor.from_pretrained(
        {"image_processor_type": "Phi4MultimodalImageProcessor", "dynamic_hd": 4}
    )
    assert (phi4.family, phi4.config["dynamic_hd"]) == ("phi4_multimodal", 4)
    phi3 = vision.ImageProcessor.from_pretrained(
        {"image_processor_type": "Phi3VImageProcessor", "num_crops": 4}
    )
    out = phi3([PHOTO])
    assert out.pixel_values is not None
    assert out.pixel_values.shape == (1, 5, 3, 336, 336)


def test_outputs_by_transformers_names() -> None:
    out = vision.ImageProcessor.for_family("phi4_multimodal")([PHOTO, PHOTO])
    assert set(out.tensors()) == {"image_pixel_values", "image_sizes", "image_attention_mask"}
    assert out.image_pixel_values is not None
    assert out.image_attention_mask is not None
    assert out.image_pixel_values.shape == (2, 5, 3, 448, 448)
    assert out.image_attention_mask.dtype == np.float32
    llama = vision.ImageProcessor.for_family("llama4")([PHOTO])
    assert set(llama.tensors()) == {"pixel_values", "aspect_ratios"}
    assert llama.pixel_values is not None
    assert llama.pixel_values.dtype.name == "bfloat16"


def test_results_do_not_depend_on_threads() -> None:
    images = [PHOTO, np.full((50, 900, 3), 7, np.uint8), PHOTO.read_bytes()]
    for family in ("llama4", "phi4_multimodal", "phi3_v"):
        one = vision.ImageProcessor.for_family(family, threads=1)(images)  # type: ignore[arg-type]
        two = vision.ImageProcessor.for_family(family, threads=2)(images)  # type: ignore[arg-type]
        for name, tensor in one.tensors().items():
            assert tensor.tobytes() == two.tensors()[name].tobytes(), (family, name)
        assert one.num_image_tokens == two.num_image_tokens


def test_llama4_bfloat16_outputs_are_recycled_without_changing_a_value() -> None:
    """A dropped Llama 4 ``pixel_values`` (bfloat16) is kept for the next call, whose values
    are written over the stale ones of another batch: every call gives the same bits, with
    recycling on or off."""
    rng = np.random.default_rng(7)
    batch_a = [rng.integers(0, 256, (900, 1300, 3), dtype=np.uint8) for _ in range(3)]
    batch_b = [rng.integers(0, 256, (1000, 700, 3), dtype=np.uint8) for _ in range(3)]
    ours = vision.ImageProcessor.for_family("llama4")

    def bits(images: list[np.ndarray]) -> bytes:
        out = ours(images).pixel_values
        assert out is not None
        return out.tobytes()

    previous = vision.buffer_cache().limit
    try:
        vision.buffer_cache(256 << 20)
        want = bits(batch_a)
        out = ours(batch_b)
        held_while_alive = vision.buffer_cache().held
        assert out.pixel_values is not None
        nbytes = out.pixel_values.nbytes
        assert nbytes >= 1 << 20
        del out
        assert vision.buffer_cache().held >= held_while_alive + nbytes
        for _ in range(3):
            assert bits(batch_a) == want
        assert vision.buffer_cache(0).held == 0
        assert bits(batch_a) == want
    finally:
        vision.buffer_cache(previous)


def test_bfloat16_without_ml_dtypes_widens_exactly(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['ml_dtypes'] = None\n"
        "import numpy as np\n"
        "from smg_grpc_proto import vision\n"
        f"out = vision.ImageProcessor.for_family('llama4')([{str(PHOTO)!r}])\n"
        "pv = out.pixel_values\n"
        "assert pv.dtype == np.float32, pv.dtype\n"
        "bits = pv.view(np.uint32)\n"
        "assert not (bits & 0xFFFF).any()\n"
        "np.save(sys.argv[1], (bits >> 16).astype(np.uint16))\n"
    )
    path = tmp_path / "bf16_bits.npy"
    run = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    with_ml_dtypes = vision.ImageProcessor.for_family("llama4")([PHOTO]).pixel_values
    assert with_ml_dtypes is not None
    assert np.array_equal(np.load(path), with_ml_dtypes.view(np.uint16))


def test_cli_writes_bfloat16(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    from safetensors.numpy import load_file

    st, npz = tmp_path / "l4.safetensors", tmp_path / "l4.npz"
    for out in (st, npz):
        assert cli.main(["preprocess", str(PHOTO), "--family", "llama4", "--out", str(out)]) == 0
    ref = vision.ImageProcessor.for_family("llama4")([PHOTO]).pixel_values
    assert ref is not None
    written = load_file(str(st))["pixel_values"]
    assert written.dtype.name == "bfloat16"
    assert written.view(np.uint16).tobytes() == ref.view(np.uint16).tobytes()
    with np.load(npz) as f:
        assert f["pixel_values"].dtype == np.float32
        assert np.array_equal(f["pixel_values"], ref.astype(np.float32))


@pytest.mark.slow
def test_random_shapes_give_outputs_or_clear_errors() -> None:
    """Sizes from 1 pixel to extreme strips: every call returns the documented shapes or raises
    an ImageProcessingError (never a crash), and token counts are positive."""
    from smg_grpc_proto.errors import ImageProcessingError

    rng = np.random.default_rng(11)
    shapes = [(1, 1), (1, 2000), (2000, 1), (9, 2500), (335, 337), (337, 335)]
    shapes += [tuple(int(v) for v in rng.integers(1, 1500, 2)) for _ in range(24)]
    procs = {
        f: vision.ImageProcessor.for_family(f) for f in ("llama4", "phi4_multimodal", "phi3_v")
    }
    fields: list[str | None] = []
    for h, w in shapes:
        image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        for family, proc in procs.items():
            try:
                out = proc([image])
            except ImageProcessingError as exc:
                fields.append(exc.field)
                continue
            assert out.num_image_tokens is not None
            assert all(n > 0 for n in out.num_image_tokens), (family, h, w)
            pixels = out.image_pixel_values if family == "phi4_multimodal" else out.pixel_values
            assert pixels is not None
            assert pixels.shape[-2:] in ((336, 336), (448, 448)), (family, h, w)
    # The strips are refused (Phi-4: too thin), naming the image.
    assert fields
    assert all(field == "image" for field in fields), fields
