#!/usr/bin/env python3
"""Torch-only families benchmark: Llama 4, Phi-4-multimodal, Phi-3-vision, Gemma 4 unified,
MiniMax-M3-VL, Kimi-K2.5, Nemotron-H-Omni, Inkling and Inkling2
against their torch references, side by side in one run, one thread.

The references: transformers 5.24.0's torchvision classes ``Llama4ImageProcessor``,
``Phi4MultimodalImageProcessor``, ``Gemma4UnifiedImageProcessor``, ``MiniMaxM3VLImageProcessor``,
``Kimi_K25ImageProcessor`` and ``NemotronH_Omni_Reasoning_V3ImageProcessor`` (there is no PIL
class), and the hub's ``Phi3VImageProcessor`` as ``scripts/gen_torch_goldens.py`` transcribes it
(PIL + torchvision + torch). torch runs with one thread (``torch.set_num_threads(1)``) and each
child process is pinned to one core; ours is ``ImageProcessor.for_family(family, threads=1)``.
Inputs: decoded images (uint8 CHW tensors / PIL images for the references, numpy arrays for us)
and file bytes (``torchvision.io.decode_image`` to RGB with the EXIF orientation applied for the
torchvision classes, which is what their ``fetch_images`` does with a path — transformers'
``load_image_as_tensor`` — and ``Image.open`` for Phi-3), on real photos
(``benchkit.REAL_PHOTO_CASES``: JPEG and PNG, 0.26 to 2.1 MP, and a batch of 8). Outputs are
checked to be byte-identical first. Time: medians over ``--rounds`` fresh processes; peak memory:
the extra resident memory of one call in a fresh process. The bytes rows also show each side's
decoding alone and the *ceiling*: the reference's time over our decoder's, the speed-up we would
reach if everything after decoding cost nothing (both decoders are libjpeg-turbo for JPEG).

Needs torch, so it runs in the reference venv (``tests/goldens/torch/README.md``) with the
wheel installed there::

    python3 -m uv pip install --python /work/torchenv/bin/python dist/smg_grpc_proto-*.whl
    /work/torchenv/bin/python scripts/bench_torch_families.py --rounds 3
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
    REAL_PHOTO_CASES,
    cpu_model,
    decoding_cells,
    measure_peak,
    real_photo_cases,
    time_op,
)

FAMILIES = (
    "llama4",
    "phi4_multimodal",
    "phi3_v",
    "gemma4_unified",
    "minimax_m3_vl",
    "inkling",
    "inkling2",
    "kimi_k25",
    "nemotron_h_omni",
)
#: The torchvision families: transformers' class and the output compared.
TORCHVISION = {
    "llama4": ("Llama4ImageProcessor", "pixel_values"),
    "phi4_multimodal": ("Phi4MultimodalImageProcessor", "image_pixel_values"),
    "gemma4_unified": ("Gemma4UnifiedImageProcessor", "pixel_values"),
    "minimax_m3_vl": ("MiniMaxM3VLImageProcessor", "pixel_values"),
    "inkling": ("InklingImageProcessor", "pixel_values"),
    "inkling2": ("Inkling2ImageProcessor", "pixel_values"),
    "kimi_k25": ("Kimi_K25ImageProcessor", "pixel_values"),
    "nemotron_h_omni": ("NemotronH_Omni_Reasoning_V3ImageProcessor", "pixel_values"),
}
CASES = tuple(REAL_PHOTO_CASES)


def _same(reference: Any, ours: Any) -> bool:
    """Whether a torch tensor and our numpy array hold the same bytes (bfloat16 as its bits).

    Without ``ml_dtypes`` our bfloat16 outputs arrive widened to float32 (exactly); the
    reference's bfloat16 is then widened the same way, which keeps every bit.
    """
    import torch

    reference = reference.contiguous()
    if reference.dtype == torch.bfloat16:
        if ours.dtype.name == "bfloat16":
            reference, ours = reference.view(torch.int16), ours.view("int16")
        else:
            reference = reference.float()
    return bool(
        tuple(reference.shape) == ours.shape
        and reference.numpy().dtype == ours.dtype
        and reference.numpy().tobytes() == ours.tobytes()
    )


def ops(family: str, paths: list[Path]) -> dict[str, Callable[[], Any]]:
    import torch
    import torchvision
    import transformers
    from PIL import Image

    from smg_grpc_proto.vision import ImageProcessor, decode

    torch.set_num_threads(1)
    ours = ImageProcessor.for_family(family, threads=1)  # type: ignore[arg-type]
    blobs = [p.read_bytes() for p in paths]
    arrays = [decode(b) for b in blobs]
    tensors = [torch.from_numpy(a).permute(2, 0, 1).contiguous() for a in arrays]

    def tv_bytes() -> list[Any]:
        return [
            torchvision.io.decode_image(
                torch.frombuffer(bytearray(b), dtype=torch.uint8),
                mode=torchvision.io.ImageReadMode.RGB,
                apply_exif_orientation=True,
            )
            for b in blobs
        ]

    def pil_bytes() -> list[Any]:
        return [np_rgb(Image.open(io.BytesIO(b))) for b in blobs]

    if family == "phi3_v":
        from gen_torch_goldens import phi3v_preprocess

        def theirs_decoded() -> Any:
            return phi3v_preprocess(arrays, 16)[0]

        def theirs_bytes() -> Any:
            return phi3v_preprocess(pil_bytes(), 16)[0]

        check = (theirs_decoded(), ours(arrays).pixel_values)
    else:
        name, key = TORCHVISION[family]
        reference = getattr(transformers, name)()

        def theirs_decoded() -> Any:
            return reference(tensors, return_tensors="pt")

        def theirs_bytes() -> Any:
            return reference(tv_bytes(), return_tensors="pt")

        mine = ours(arrays)
        check = (theirs_decoded()[key], getattr(mine, key))
    if not _same(*check):
        raise SystemExit(f"{family}: ours and the reference differ")
    return {
        "theirs|decoded": theirs_decoded,
        "ours|decoded": lambda: ours(arrays),
        "theirs|bytes": theirs_bytes,
        "ours|bytes": lambda: ours(blobs),
        # The decoding alone, to show how much of the bytes row is the decoder's.
        "theirs|decode": pil_bytes if family == "phi3_v" else tv_bytes,
        "ours|decode": lambda: [decode(b) for b in blobs],
    }


def np_rgb(image: Any) -> Any:
    import numpy as np

    return np.asarray(image.convert("RGB"))


def child(spec: dict[str, Any]) -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    if "peak" in spec:
        case, key = spec["peak"]
        fn = ops(spec["family"], [Path(p) for p in spec["cases"][case]])[key]
        print(json.dumps({"peak": measure_peak(fn)}))
        return
    result = {}
    for case, paths in spec["cases"].items():
        for key, fn in ops(spec["family"], [Path(p) for p in paths]).items():
            result[f"{case}|{key}"] = time_op(fn, spec["repeat"])
    print(json.dumps(result))


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    if out.returncode != 0:
        raise SystemExit(f"{spec['family']}: child failed:\n{out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--families", nargs="*", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    import torch
    import transformers

    cases = real_photo_cases()
    chosen = {c: [str(p) for p in cases[c]] for c in CASES}
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; one pinned core per process")
    print(
        f"torch {torch.__version__} (1 thread, {torch.backends.cpu.get_cpu_capability()}), "
        f"transformers {transformers.__version__}"
    )
    print(f"rounds: {args.rounds} fresh processes, median of >= {args.repeat} calls\n")
    print(
        "| family | case | input | reference (ms) | ours (ms) | speed-up "
        "| peak MiB reference / ours | decode alone (ms) reference / ours | ceiling |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for family in args.families:
        spec: dict[str, Any] = {"family": family, "cases": chosen, "repeat": args.repeat}
        rounds = [run_child(spec) for _ in range(args.rounds)]
        for case in CASES:
            for inp in ("decoded", "bytes"):
                theirs = statistics.median(r[f"{case}|theirs|{inp}"] for r in rounds) * 1e3
                ours = statistics.median(r[f"{case}|ours|{inp}"] for r in rounds) * 1e3
                peaks = [
                    run_child({**spec, "peak": [case, f"{side}|{inp}"]})["peak"]
                    for side in ("theirs", "ours")
                ]
                decoding = decoding_cells(rounds, case, inp, theirs)
                print(
                    f"| {family} | {case} | {inp} | {theirs:.2f} | {ours:.2f} | "
                    f"**{theirs / ours:.1f}x** | {peaks[0]:.0f} / {peaks[1]:.0f} | {decoding} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
