#!/usr/bin/env python3
"""Write ``tests/goldens/torch/alpha/inkling.json``: Inkling and Inkling2 on inputs with alpha,
which the shared torch inputs (RGB arrays) do not have. Run in the torch reference venv (see
``scripts/gen_torch_goldens.py``); never imports smg_grpc_proto.

- RGBA ``uint8`` arrays (as CHW tensors): ``InklingImageProcessor`` composites them onto white
  in ``float32`` (the torchvision backend's ``convert_to_rgb``), ``Inkling2ImageProcessor`` onto
  its 8-pixel checkerboard of 204/153.
- Encoded files opened with Pillow (``Image.open``, no EXIF transpose), given as PIL images:
  Inkling2 keeps their alpha (``convert("RGBA" if has_transparency_data else "RGB")``) — RGBA,
  LA, palette with per-index alphas, palette with one transparent index, RGB and L with a
  transparent colour (PNG ``tRNS``), GIF transparency, WebP with alpha, and an opaque JPEG;
  Inkling composites a PIL image onto white (``convert_to_rgb``).

The inputs travel inside the file (raw array bytes or the encoded file, base64), so the test
needs no generator of its own; ``tests/vision/test_inkling.py`` checks every case.
"""

from __future__ import annotations

import base64
import io
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from torch_goldens import common  # noqa: E402
from transformers import Inkling2ImageProcessor, InklingImageProcessor  # noqa: E402

OUT = ROOT / "tests" / "goldens" / "torch" / "alpha" / "inkling.json"


def _rgba(h: int, w: int, seed: int) -> np.ndarray:
    """Noise colours with an alpha that sweeps 0..255 and hits both ends exactly."""
    rng = np.random.default_rng(seed)
    rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    alpha = ((np.arange(h)[:, None] * 7 + np.arange(w)[None, :] * 13) % 256).astype(np.uint8)
    alpha[0, 0], alpha[-1, -1] = 0, 255
    return np.ascontiguousarray(np.dstack([rgb, alpha]))


def _encode(image: Image.Image, fmt: str, **params: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **params)
    return buf.getvalue()


def _files() -> list[tuple[str, bytes]]:
    rgba = Image.fromarray(_rgba(45, 83, 1), "RGBA")
    gray = Image.fromarray(np.random.default_rng(2).integers(0, 256, (37, 50), dtype=np.uint8))
    la = Image.merge("LA", (gray, gray.transpose(Image.Transpose.FLIP_LEFT_RIGHT)))
    palette = rgba.convert("RGB").quantize(64)
    alphas = bytes((i * 37) % 256 for i in range(64))
    rgb = Image.fromarray(np.random.default_rng(3).integers(0, 4, (41, 40, 3), dtype=np.uint8) * 85)
    return [
        ("rgba.png", _encode(rgba, "PNG")),
        ("la.png", _encode(la, "PNG")),
        ("palette_alphas.png", _encode(palette, "PNG", transparency=alphas)),
        ("palette_index.png", _encode(palette, "PNG", transparency=5)),
        ("rgb_trns.png", _encode(rgb, "PNG", transparency=(85, 170, 0))),
        ("l_trns.png", _encode(gray, "PNG", transparency=200)),
        ("palette.gif", _encode(palette, "GIF", transparency=3)),
        ("rgba.webp", _encode(rgba, "WEBP", lossless=True)),
        ("opaque.jpg", _encode(rgba.convert("RGB"), "JPEG", quality=90)),
    ]


def _counts(family: str, feature: Any) -> list[int]:
    if family == "inkling":
        return [int(n) for n in feature["num_patches"]]
    return [int(t * h * w) for t, h, w in feature["image_grid_thw"].tolist()]


OUTPUTS = {
    "inkling": {"pixel_values": "pixel_values", "num_patches": "num_patches"},
    "inkling2": {"pixel_values": "pixel_values", "image_grid_thw": "image_grid_thw"},
}
CLASSES = {"inkling": InklingImageProcessor, "inkling2": Inkling2ImageProcessor}


def _record(family: str, feature: Any) -> list[dict[str, Any]]:
    out = [common.tensor_record(k, torch.as_tensor(feature[k])) for k, _ in OUTPUTS[family].items()]
    out.append(common.values_record("num_image_tokens", _counts(family, feature)))
    return out


def main() -> int:
    common.check_versions()
    torch.set_num_threads(1)
    cases: list[dict[str, Any]] = []
    arrays = [_rgba(57, 100, 4), _rgba(1, 1, 5), _rgba(9, 200, 6), _rgba(80, 120, 7)]
    for family, cls in CLASSES.items():
        for a in arrays:
            h, w = a.shape[:2]
            feature = cls()([common.chw(a)], return_tensors="pt")
            cases.append(
                {
                    "id": f"{family}/array-rgba-{h}x{w}",
                    "family": family,
                    "array": {"shape": list(a.shape), "data": base64.b64encode(a).decode()},
                    "outputs": _record(family, feature),
                }
            )
        batch = cls()([common.chw(a) for a in arrays], return_tensors="pt")
        cases.append(
            {
                "id": f"{family}/array-rgba-batch",
                "family": family,
                "arrays": [
                    {"shape": list(a.shape), "data": base64.b64encode(a).decode()} for a in arrays
                ],
                "outputs": _record(family, batch),
            }
        )
    for name, data in _files():
        for family, cls in CLASSES.items():
            with Image.open(io.BytesIO(data)) as image:
                image.load()
                feature = cls()([image], return_tensors="pt")
            cases.append(
                {
                    "id": f"{family}/file-{name}",
                    "family": family,
                    "file": base64.b64encode(data).decode(),
                    "outputs": _record(family, feature),
                }
            )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"versions": common.versions(), "cases": cases}, indent=1) + "\n")
    print(f"wrote {OUT}: {len(cases)} cases")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
