#!/usr/bin/env python3
"""Vision families benchmark: every family but Qwen2/2.5/3-VL against its transformers PIL backend
class, side by side in one run (those have their own, fuller benchmark: ``bench_vision.py``).

For each family, one child process pinned to one core times, on the same real photos
(``benchkit.REAL_PHOTO_CASES``: JPEG and PNG, 0.26 to 2.1 MP, and a batch of 8), the
transformers class (``*ImageProcessorPil``, transformers 5.24.0, Pillow 13) and ours
(``ImageProcessor.for_family(family, threads=1)``) on decoded input (PIL images / numpy arrays)
and from bytes (``Image.open`` + ``ImageOps.exif_transpose`` + ``convert("RGB")`` for transformers:
what its ``load_image`` does); figures are medians over ``--rounds`` fresh processes. The bytes
rows also show each side's decoding alone and the *ceiling*: the reference's time over our
decoder's, the speed-up we would reach if everything after decoding cost nothing. Both sides
use the same configuration (the class defaults, except Gemma 3 at its published 896 x 896,
InternVL's published tiling configuration and Qwen3-Omni's published preprocessor config); the
outputs are checked to be byte-identical first.

    python scripts/bench_families.py --rounds 3
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from benchkit import (  # noqa: E402
    CLOCKS,
    REAL_PHOTO_CASES,
    cpu_model,
    decoding_cells,
    real_photo_cases,
    time_op,
)

# family -> (transformers class, its kwargs)
REFERENCES: dict[str, tuple[str, dict[str, Any]]] = {
    "clip": ("CLIPImageProcessorPil", {}),
    "llava": ("LlavaImageProcessorPil", {}),
    "siglip": ("SiglipImageProcessorPil", {}),
    "llava_next": ("LlavaNextImageProcessorPil", {}),
    "pixtral": ("PixtralImageProcessorPil", {}),
    "gemma3": ("Gemma3ImageProcessorPil", {"size": {"height": 896, "width": 896}}),
    "gemma4": ("Gemma4ImageProcessorPil", {}),
    "idefics3": ("Idefics3ImageProcessorPil", {}),
    "smolvlm": ("SmolVLMImageProcessorPil", {}),
    # InternVL's published configuration of GOT-OCR 2's processor (tiling on, as the processor
    # passes it), as ImageProcessor.for_family("internvl") uses it
    "internvl": (
        "GotOcr2ImageProcessorPil",
        {
            "size": {"height": 448, "width": 448},
            "crop_to_patches": True,
            "min_patches": 1,
            "max_patches": 12,
            "image_mean": [0.485, 0.456, 0.406],
            "image_std": [0.229, 0.224, 0.225],
        },
    ),
    # Llama 3.2 Vision's published configuration (tiles of 560, CLIP mean/std), given to ours
    # as well (CONFIGURED)
    "mllama": (
        "MllamaImageProcessorPil",
        {
            "size": {"height": 560, "width": 560},
            "max_image_tiles": 4,
            "resample": 2,
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711],
        },
    ),
    # GLM-4.1V / GLM-4.6V (one algorithm) and GLM-5-next at their class defaults
    "glm4v": ("Glm4vImageProcessorPil", {}),
    "glm5_next": ("Glm5NextImageProcessorPil", {}),
}
# Families whose reference kwargs are not ImageProcessor.for_family's defaults: ours gets them
# as its configuration.
CONFIGURED = {"mllama"}
# Qwen/Qwen3-Omni-30B-A3B-*'s preprocessor_config.json, as ImageProcessor.for_family uses it
REFERENCES["qwen3_omni_moe"] = (
    "Qwen2VLImageProcessorPil",
    {
        "patch_size": 16,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "min_pixels": 3136,
        "max_pixels": 12845056,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    },
)
CASES = tuple(REAL_PHOTO_CASES)


def ops(family: str, paths: list[Path]) -> dict[str, Callable[[], Any]]:
    import transformers
    from PIL import Image, ImageOps

    from smg_grpc_proto.vision import ImageProcessor, decode

    name, kwargs = REFERENCES[family]
    reference = getattr(transformers, name)(**kwargs)
    config = kwargs if family in CONFIGURED else None
    ours = ImageProcessor(family, config, threads=1)  # type: ignore[arg-type]
    blobs = [p.read_bytes() for p in paths]
    pil = [Image.open(io.BytesIO(b)).convert("RGB") for b in blobs]
    arrays = [decode(b) for b in blobs]
    theirs = reference(images=pil, return_tensors="np")["pixel_values"]
    mine = ours(arrays).pixel_values
    if mine is None or theirs.shape != mine.shape or theirs.tobytes() != mine.tobytes():
        raise SystemExit(f"{family}: ours and {name} differ")

    def pil_bytes() -> list[Any]:
        return [ImageOps.exif_transpose(Image.open(io.BytesIO(b))).convert("RGB") for b in blobs]

    return {
        "theirs|decoded": lambda: reference(images=pil, return_tensors="np"),
        "ours|decoded": lambda: ours(arrays),
        "theirs|bytes": lambda: reference(images=pil_bytes(), return_tensors="np"),
        "ours|bytes": lambda: ours(blobs),
        # The decoding alone, to show how much of the bytes row is the decoder's.
        "theirs|decode": pil_bytes,
        "ours|decode": lambda: [decode(b) for b in blobs],
    }


def child(spec: dict[str, Any]) -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    result = {}
    for case, paths in spec["cases"].items():
        for key, fn in ops(spec["family"], [Path(p) for p in paths]).items():
            result[f"{case}|{key}"] = time_op(fn, spec["repeat"], clock=CLOCKS[spec["clock"]])
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--families", nargs="*", default=list(REFERENCES), choices=REFERENCES)
    parser.add_argument(
        "--clock",
        choices=tuple(CLOCKS),
        default="wall",
        help="wall time, or process CPU time (steadier on a loaded machine; one thread only)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    cases = real_photo_cases()
    chosen = {c: [str(p) for p in cases[c]] for c in CASES}
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; one pinned core per process")
    print(
        f"rounds: {args.rounds} fresh processes, median of >= {args.repeat} calls; "
        f"clock: {args.clock}\n"
    )
    print(
        "| family | case | input | transformers PIL (ms) | ours (ms) | speed-up "
        "| decode alone (ms) Pillow / ours | ceiling |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for family in args.families:
        spec = {"family": family, "cases": chosen, "repeat": args.repeat, "clock": args.clock}
        rounds = []
        for _ in range(args.rounds):
            out = subprocess.run(
                [sys.executable, __file__, "--child", json.dumps(spec)],
                capture_output=True,
                text=True,
                check=False,
                env=dict(os.environ, OMP_NUM_THREADS="1"),
            )
            if out.returncode != 0:
                raise SystemExit(f"{family}: child failed:\n{out.stderr[-2000:]}")
            rounds.append(json.loads(out.stdout.strip().splitlines()[-1]))
        for case in CASES:
            for inp in ("decoded", "bytes"):
                theirs = statistics.median(r[f"{case}|theirs|{inp}"] for r in rounds) * 1e3
                ours = statistics.median(r[f"{case}|ours|{inp}"] for r in rounds) * 1e3
                decoding = decoding_cells(rounds, case, inp, theirs)
                print(
                    f"| {family} | {case} | {inp} | {theirs:.2f} | {ours:.2f} | "
                    f"**{theirs / ours:.1f}x** | {decoding} |"
                )


if __name__ == "__main__":
    main()
