#!/usr/bin/env python3
"""Write ``tests/goldens/torch/goldens.json``: the torch/torchvision references of the Llama 4,
Phi-4-multimodal and Phi-3-vision image processors and of two raw kernels, on the inputs of
``tests/support/torch_inputs.py``. ``tests/vision/test_torch_goldens.py`` checks our implementation
against the file without needing torch.

With ``--family NAME`` (repeatable, or ``all``) it writes ``tests/goldens/torch/NAME.json``
instead, from the cases of ``scripts/torch_goldens/NAME.py`` on those inputs plus the 32 real
photographs of ``support.images.real_photos()``; ``tests/vision/test_torch_family_goldens.py``
checks every such file (``scripts/torch_goldens/README.md``).

Run it in a separate venv holding the pinned reference (torch is too heavy for the test env)::

    python3 -m uv venv /work/torchenv
    python3 -m uv pip install --python /work/torchenv/bin/python \\
        torch==2.14.1 torchvision==0.29.1 transformers==5.24.0 pillow==13.0.0 numpy
    /work/torchenv/bin/python scripts/gen_torch_goldens.py

The venv has no pip, so the test images must already be in ``.cache/`` (the test env fetches
them: ``python3 -c "import sys; sys.path.insert(0, 'tests'); from support.images import
pillow_test_images, real_photos; pillow_test_images(); real_photos()"``). This script never
imports smg_grpc_proto.

Cases (``kind``):

- ``resize_u8``: ``torchvision.transforms.v2.functional.resize`` of a uint8 CHW tensor,
  bilinear or bicubic, ``antialias=True`` (torch's native uint8 kernel).
- ``interpolate_bicubic_f32``: ``torch.nn.functional.interpolate(mode="bicubic",
  align_corners=False)`` of the input as float32 ``(u8 / 255 - 0.5) / 0.5``.
- ``llama4``: ``transformers.Llama4ImageProcessor`` (torchvision backend), plus the number of
  ``<|patch|>`` tokens ``Llama4Processor`` writes per image.
- ``phi4_multimodal``: ``transformers.Phi4MultimodalImageProcessor``.
- ``phi3_v``: the hub's ``Phi3VImageProcessor`` (remote code of microsoft/Phi-3-vision-*, not in
  transformers), re-implemented below step by step with the same PIL/torchvision/torch calls.

Every output tensor is stored as shape, dtype, the sha256 of its C-contiguous little-endian bytes
(bfloat16: the bytes of ``t.view(torch.int16)``) and 24 sampled ``[flat_index, value]`` pairs;
small integer tensors whole. Processor errors are stored as ``"Type: message"``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torchvision.transforms as T  # noqa: E402
import torchvision.transforms.functional as F1  # noqa: E402
import torchvision.transforms.v2.functional as tvF  # noqa: E402
import transformers  # noqa: E402
from PIL import Image  # noqa: E402
from support.images import pillow_test_images, real_photos  # noqa: E402
from support.torch_inputs import photo_inputs, torch_inputs  # noqa: E402
from torch_goldens.common import (  # noqa: E402
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    check_versions,
    chw,
    error_text,
    sha256,
    tensor_bytes,
    tensor_record,
    values_record,
    versions,
)

OUT = ROOT / "tests" / "goldens" / "torch" / "goldens.json"


# ---------------------------------------------------------------------------------------------
# Kernels


def resize_targets(h: int, w: int) -> list[tuple[int, int]]:
    """Downscale by 1.5x, 3x, 7.3x, upscale 2x, one axis only (each way), 1x1 and the same size."""

    def down(n: int, f: float) -> int:
        return max(1, round(n / f))

    sizes = [
        (down(h, 1.5), down(w, 1.5)),
        (down(h, 3), down(w, 3)),
        (down(h, 7.3), down(w, 7.3)),
        (2 * h, 2 * w),
        (h, down(w, 2.5)),
        (3 * h, w),
        (1, 1),
        (h, w),
    ]
    return list(dict.fromkeys(sizes))


RESIZE_INPUTS = [
    "grace_hopper-600x512",
    "flower2-225x300",
    "hopper_jpg-128x128",
    "crop_e-449x447",
    "prime_photo-13x17",
    "pixel-1x1",
    "two_by_two-2x2",
    "row-1x700",
    "column-700x1",
    "checker1-64x64",
    "stripes_v3-337x500",
    "noise_small-31x47",
    "gradient-256x384",
    "impulse-41x41",
    "photo_resized-1080x1920",
]
RESIZE_BIG = ("photo_big-3024x4032", [(414, 552), (336, 448)])

INTERPOLATE_CASES = [
    ("grace_hopper-600x512", (336, 336)),
    ("grace_hopper-600x512", (448, 448)),
    ("grace_hopper-600x512", (224, 224)),
    ("grace_hopper-600x512", (1200, 1024)),
    ("hopper_jpg-128x128", (336, 336)),
    ("hopper_jpg-128x128", (448, 448)),
    ("flower-360x480", (336, 336)),
    ("flower-360x480", (240, 360)),
    ("flower-360x480", (200, 700)),
    ("checker1-64x64", (336, 336)),
    ("checker1-64x64", (17, 23)),
    ("stripes_v3-337x500", (336, 336)),
    ("noise-331x449", (448, 448)),
    ("noise-331x449", (100, 37)),
    ("pixel-1x1", (336, 336)),
    ("two_by_two-2x2", (448, 448)),
    ("crop_b-336x336", (336, 336)),
    ("crop_c-337x337", (336, 336)),
    ("photo_resized-1080x1920", (448, 448)),
    ("prime_photo-13x17", (336, 336)),
    ("impulse-41x41", (50, 97)),
    ("column-700x1", (336, 336)),
    ("white-29x23", (336, 336)),
]


def prep_f32(a: np.ndarray) -> torch.Tensor:
    """float32 CHW ``(u8 / 255 - 0.5) / 0.5``, each step a float32 torch op."""
    return chw(a).to(torch.float32).div(255).sub(0.5).div(0.5)


def resize_cases(inputs: dict[str, np.ndarray]) -> Iterable[dict[str, Any]]:
    plan = [(name, resize_targets(*inputs[name].shape[:2])) for name in RESIZE_INPUTS]
    plan.append((RESIZE_BIG[0], RESIZE_BIG[1]))
    modes = {
        "bilinear": tvF.InterpolationMode.BILINEAR,
        "bicubic": tvF.InterpolationMode.BICUBIC,
    }
    for name, sizes in plan:
        t = chw(inputs[name])
        for h, w in sizes:
            for mode, interpolation in modes.items():
                case: dict[str, Any] = {
                    "id": f"resize_u8/{name}/{h}x{w}-{mode}",
                    "kind": "resize_u8",
                    "input": name,
                    "config": {"size": [h, w], "interpolation": mode},
                }
                rgba = resize_rgba(t, [h, w], interpolation)
                try:
                    out = tvF.resize(t, [h, w], interpolation=interpolation, antialias=True)
                except RuntimeError as exc:
                    # torch 2.14.1's AVX uint8 kernel fails an internal assert packing a 1x1
                    # RGB output after a vertical pass; on RGBA it runs. The kernel unpacks
                    # RGB to 4 channels anyway, so the RGB answer is the RGBA one's first 3.
                    case["torch_error"] = error_text(exc).split(" at ")[0]
                    out = rgba
                else:
                    if not torch.equal(out, rgba):
                        raise SystemExit(f"{case['id']}: the RGBA route differs from RGB") from None
                case["outputs"] = [tensor_record("output", out)]
                yield case


def resize_rgba(t: torch.Tensor, size: list[int], interpolation: Any) -> torch.Tensor:
    """``tvF.resize`` of ``t`` with a zero 4th channel, cut back to 3 channels."""
    rgba = torch.cat([t, torch.zeros_like(t[:1])]).contiguous()
    out = tvF.resize(rgba, size, interpolation=interpolation, antialias=True)
    return out[:3].contiguous()


def interpolate_cases(inputs: dict[str, np.ndarray]) -> Iterable[dict[str, Any]]:
    for name, (h, w) in INTERPOLATE_CASES:
        x = prep_f32(inputs[name])
        out = torch.nn.functional.interpolate(
            x[None], size=(h, w), mode="bicubic", align_corners=False
        )[0]
        yield {
            "id": f"interpolate_bicubic_f32/{name}/{h}x{w}",
            "kind": "interpolate_bicubic_f32",
            "input": name,
            "config": {"size": [h, w], "prep": "u8/255-0.5/0.5"},
            "prep_sha256": sha256(tensor_bytes(x)),
            "outputs": [tensor_record("output", out)],
        }


# ---------------------------------------------------------------------------------------------
# Processors


def llama4_tokens(aspect_ratios: torch.Tensor) -> list[int]:
    """``<|patch|>`` tokens per image as ``Llama4Processor._prompt_split_image`` writes them:
    ``(336 // 14) ** 2 // 4 = 144`` per tile, and per global image when split into tiles."""
    per_chunk = (336 // 14) ** 2 // 4
    counts = []
    for rows, cols in aspect_ratios.tolist():
        counts.append(per_chunk * (rows * cols + 1) if rows * cols > 1 else per_chunk)
    return counts


def run_llama4(arrays: list[np.ndarray], config: dict[str, Any]) -> list[dict[str, Any]]:
    proc = transformers.Llama4ImageProcessor(**config)
    out = proc([chw(a) for a in arrays], return_tensors="pt")
    return [
        tensor_record("pixel_values", out["pixel_values"]),
        tensor_record("aspect_ratios", out["aspect_ratios"]),
        values_record("num_image_tokens", llama4_tokens(out["aspect_ratios"])),
    ]


def run_phi4(arrays: list[np.ndarray], config: dict[str, Any]) -> list[dict[str, Any]]:
    proc = transformers.Phi4MultimodalImageProcessor(**config)
    out = proc([chw(a) for a in arrays], return_tensors="pt")
    return [
        tensor_record("image_pixel_values", out["image_pixel_values"]),
        tensor_record("image_sizes", out["image_sizes"]),
        tensor_record("image_attention_mask", out["image_attention_mask"]),
        values_record("num_img_tokens", out["num_img_tokens"].tolist()),
    ]


def phi3v_hd_transform(img: Image.Image, num_crops: int) -> Image.Image:
    """The hub's ``HD_transform`` + ``padding_336``: fit the longer side to ``scale`` tiles of
    336 (as many as ``num_crops`` allows), Pillow bilinear, pad the shorter side with white to a
    multiple of 336 (centred, the extra pixel at the bottom), on the landscape orientation."""
    width, height = img.size
    transposed = False
    if width < height:
        img = img.transpose(Image.Transpose.TRANSPOSE)
        transposed = True
        width, height = img.size
    ratio = width / height
    scale = 1
    while scale * np.ceil(scale / ratio) <= num_crops:
        scale += 1
    scale -= 1
    new_w = int(scale * 336)
    new_h = int(new_w / ratio)
    img = F1.resize(img, [new_h, new_w])  # a PIL image: Image.resize(BILINEAR)

    width, height = img.size
    tar = int(np.ceil(height / 336) * 336)
    top = int((tar - height) / 2)
    bottom = tar - height - top
    img = F1.pad(img, [0, top, 0, bottom], fill=[255, 255, 255])
    if transposed:
        img = img.transpose(Image.Transpose.TRANSPOSE)
    return img


def phi3v_preprocess(
    arrays: list[np.ndarray], num_crops: int
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The hub's ``Phi3VImageProcessor.preprocess`` (``return_tensors="pt"``): pixel_values
    ``(B, num_crops + 1, 3, 336, 336)``, image_sizes ``(B, 2)`` and num_img_tokens."""
    to_tensor = T.Compose([T.ToTensor(), T.Normalize(OPENAI_CLIP_MEAN, OPENAI_CLIP_STD)])
    images = [Image.fromarray(np.array(a), "RGB").convert("RGB") for a in arrays]
    hd_images = [to_tensor(phi3v_hd_transform(im, num_crops)) for im in images]
    global_images = [
        torch.nn.functional.interpolate(im[None].float(), size=(336, 336), mode="bicubic").to(
            im.dtype
        )
        for im in hd_images
    ]
    shapes = [[im.size(1), im.size(2)] for im in hd_images]
    num_img_tokens = [
        int((h // 336 * w // 336 + 1) * 144 + 1 + (h // 336 + 1) * 12) for h, w in shapes
    ]
    crops = []
    for im, glob, (h, w) in zip(hd_images, global_images, shapes, strict=True):
        tiles = im.reshape(1, 3, h // 336, 336, w // 336, 336).permute(0, 2, 4, 1, 3, 5)
        tiles = tiles.reshape(-1, 3, 336, 336).contiguous()
        both = torch.cat([glob, tiles], dim=0)
        if both.shape[0] < num_crops + 1:
            pad = torch.zeros(num_crops + 1 - both.shape[0], 3, 336, 336, dtype=both.dtype)
            both = torch.cat([both, pad], dim=0)
        crops.append(both)
    return torch.stack(crops, dim=0), torch.tensor(shapes, dtype=torch.int64), num_img_tokens


def run_phi3v(arrays: list[np.ndarray], config: dict[str, Any]) -> list[dict[str, Any]]:
    pixel_values, image_sizes, num_img_tokens = phi3v_preprocess(arrays, config["num_crops"])
    return [
        tensor_record("pixel_values", pixel_values),
        tensor_record("image_sizes", image_sizes),
        values_record("num_img_tokens", num_img_tokens),
    ]


Runner = Callable[[list[np.ndarray], dict[str, Any]], list[dict[str, Any]]]
RUNNERS: dict[str, Runner] = {
    "llama4": run_llama4,
    "phi4_multimodal": run_phi4,
    "phi3_v": run_phi3v,
}


def _tag(config: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in config.items()) or "default"


def processor_plan(names: list[str]) -> list[tuple[str, list[str], dict[str, Any]]]:
    """``(kind, input names, config)``: every input with the defaults, then variants."""
    plan: list[tuple[str, list[str], dict[str, Any]]] = []
    for name in names:
        plan.append(("llama4", [name], {}))
    for name in [
        "grace_hopper-600x512",
        "flower-360x480",
        "row-1x700",
        "noise_small-31x47",
        "stripes_h5-1000x100",
        "photo_crop-1920x1080",
        "photo_big-3024x4032",
    ]:
        plan.append(("llama4", [name], {"max_patches": 4}))
    for name in [
        "grace_hopper-600x512",
        "hopper_jpg-128x128",
        "flower2-225x300",
        "pixel-1x1",
        "strip_wide-5x3000",
        "crop_e-449x447",
    ]:
        plan.append(("llama4", [name], {"resize_to_max_canvas": True}))
    for name in ["flower2-225x300", "prime_photo-13x17"]:
        plan.append(("llama4", [name], {"max_patches": 4, "resize_to_max_canvas": True}))
    plan.append(("llama4", ["grace_hopper-600x512", "pixel-1x1", "flower-360x480"], {}))
    plan.append(("llama4", ["hopper_jpg-128x128", "crop_b-336x336", "hopper_png-128x128"], {}))

    for name in names:
        plan.append(("phi4_multimodal", [name], {}))
    for name in [
        "grace_hopper-600x512",
        "flower-360x480",
        "xmp_test-1072x2000",
        "photo_crop-1920x1080",
        "stripes_v2-100x1000",
        "strip_wide-5x3000",
        "photo_square-1000x1000",  # more crops than 4: (1, 1) and (2, 2) tie, area picks (2, 2)
        "crop_e-449x447",
    ]:
        plan.append(("phi4_multimodal", [name], {"dynamic_hd": 4}))
    plan.append(("phi4_multimodal", ["grace_hopper-600x512", "flower2-225x300", "pixel-1x1"], {}))

    for name in names:
        plan.append(("phi3_v", [name], {"num_crops": 16}))
    for name in [
        "grace_hopper-600x512",
        "flower-360x480",
        "xmp_test-1072x2000",
        "photo_crop-1920x1080",
        "row-1x700",
    ]:
        plan.append(("phi3_v", [name], {"num_crops": 4}))
    for name in [
        "grace_hopper-600x512",
        "flower2-225x300",
        "pixel-1x1",
        "row-1x700",
        "column-700x1",
    ]:
        plan.append(("phi3_v", [name], {"num_crops": 1}))
    plan.append(
        (
            "phi3_v",
            ["grace_hopper-600x512", "flower2-225x300", "prime_photo-13x17"],
            {"num_crops": 16},
        )
    )
    return plan


def processor_cases(inputs: dict[str, np.ndarray]) -> Iterable[dict[str, Any]]:
    for kind, names, config in processor_plan(list(inputs)):
        case: dict[str, Any] = {
            "id": f"{kind}/{'+'.join(names)}/{_tag(config)}",
            "kind": kind,
            "input": names[0] if len(names) == 1 else names,
            "config": config,
        }
        try:
            case["outputs"] = RUNNERS[kind]([inputs[n] for n in names], config)
        except Exception as exc:  # the reference rejects the input: our side must too
            case["error"] = error_text(exc)
        yield case


# ---------------------------------------------------------------------------------------------


def family_cases(
    family: str, inputs: dict[str, np.ndarray], photos: dict[str, np.ndarray]
) -> Iterable[dict[str, Any]]:
    """The cases of ``scripts/torch_goldens/<family>.py``."""
    module = importlib.import_module(f"torch_goldens.{family}")
    if family != module.KIND:
        raise SystemExit(f"torch_goldens/{family}.py declares KIND {module.KIND!r}")
    yield from module.cases(inputs, photos)


def families() -> list[str]:
    """Every family with a generator module (``scripts/torch_goldens/*.py`` but ``common``)."""
    folder = ROOT / "scripts" / "torch_goldens"
    return sorted(p.stem for p in folder.glob("*.py") if p.stem not in ("common", "__init__"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--family",
        action="append",
        default=[],
        help="write tests/goldens/torch/FAMILY.json from scripts/torch_goldens/FAMILY.py "
        "(repeatable; 'all' for every family module); without it, goldens.json",
    )
    parser.add_argument("--out", type=Path, default=None, help=f"default: {OUT}")
    args = parser.parse_args(argv)
    selected = families() if "all" in args.family else args.family
    unknown = sorted(set(selected) - set(families()))
    if unknown:
        parser.error(f"no scripts/torch_goldens/<family>.py for {unknown}; have {families()}")
    if args.out is not None and len(selected) > 1:
        parser.error("--out names one file: give one --family")

    check_versions()
    torch.set_num_threads(1)
    start = time.perf_counter()
    try:
        pillow_dir = pillow_test_images()
        photo_files = real_photos() if selected else {}
    except RuntimeError as exc:
        raise SystemExit(
            f"{exc}\nfetch the test images with the test environment first (see the "
            "docstring of this script)"
        ) from None
    inputs = dict(torch_inputs(pillow_dir))
    if not selected:
        groups = [g(inputs) for g in (resize_cases, interpolate_cases, processor_cases)]
        write(args.out or OUT, inputs, groups, start)
        return 0
    photos = dict(photo_inputs(photo_files))
    for family in selected:
        out = args.out or OUT.with_name(f"{family}.json")
        write(out, {**inputs, **photos}, [family_cases(family, inputs, photos)], start)
    return 0


def write(
    out: Path,
    inputs: dict[str, np.ndarray],
    groups: list[Iterable[dict[str, Any]]],
    start: float,
) -> None:
    """Run the cases and write them with the versions and the hashes of the inputs they use."""
    cases: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    for group in groups:
        for case in group:
            cases.append(case)
            counts[case["kind"]] = counts.get(case["kind"], 0) + 1
            status = case.get("error", "ok")
            print(f"{time.perf_counter() - start:7.1f}s {case['id']}: {status}", file=sys.stderr)
    ids = [c["id"] for c in cases]
    if len(set(ids)) != len(ids):
        raise SystemExit("duplicate case ids")
    used = {n for c in cases for n in ([c["input"]] if isinstance(c["input"], str) else c["input"])}
    if out.name != OUT.name:  # a family file records only the inputs its cases use
        inputs = {name: a for name, a in inputs.items() if name in used}
    goldens = {
        "versions": versions(),
        "inputs": {
            name: {"shape": list(a.shape), "sha256": sha256(np.ascontiguousarray(a).tobytes())}
            for name, a in inputs.items()
        },
        "cases": cases,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(goldens, sort_keys=True, indent=1) + "\n"
    out.write_text(text)
    elapsed = time.perf_counter() - start
    summary = ", ".join(f"{k} {v}" for k, v in counts.items())
    errors = sum("error" in c for c in cases)
    print(
        f"wrote {out} ({len(text) / 1e6:.2f} MB): {len(cases)} cases ({summary}; "
        f"{errors} errors) in {elapsed:.1f}s",
        file=sys.stderr,
    )


if __name__ == "__main__":
    raise SystemExit(main())
