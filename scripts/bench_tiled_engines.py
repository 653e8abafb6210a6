#!/usr/bin/env python3
"""Tiled families to an engine: image bytes -> vLLM engine tensors, ours and transformers +
plain protobuf side by side in one run, one thread, on real photos.

For each family (Llama 4 and the tiled PIL families) and case:

* **ours** — ``VisionModel.for_family(f).prepare(files, threads=1)`` (Rust: decode, tile,
  resize, normalise, BLAKE3), ``engines.vllm.generate_request`` + ``tensors.serialize``, then
  ``tensors.parse`` + ``engines.vllm.decode_mm_inputs`` (every field checked, zero-copy views);
* **plain** — ``Image.open`` + ``convert("RGB")`` + the transformers reference image processor
  (Llama 4: ``Llama4ImageProcessor``, torchvision, bfloat16; Idefics3:
  ``Idefics3ImageProcessorPil``; InternVL: ``GotOcr2ImageProcessorPil`` with
  ``crop_to_patches=True`` as ``InternVLProcessor`` calls it), then the naive protobuf encode
  (``tobytes()`` per tensor + ``SerializeToString()``, with the same metadata) and decode
  (``FromString`` + a writable copy per tensor).

Both paths are checked to give the engine the same pixel bytes before anything is timed. Each
round is a fresh process pinned to one core; figures are medians over ``--rounds`` rounds; peak
memory is the extra resident memory of one whole-path call in a fresh process.

Inputs are real photos: Grace Hopper (the bundled 512 x 600 JPEG) and camera photos among
Pillow 13.0.0's test images (``tests/support/images.py`` fetches its sdist into ``.cache/``).
Llama 4's reference needs torch and torchvision, so its rows come from a venv that has them::

    python scripts/bench_tiled_engines.py --families idefics3 internvl
    /work/torchenv/bin/python scripts/bench_tiled_engines.py --families llama4
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

from benchkit import cpu_model, measure_peak, time_op  # noqa: E402

FAMILIES = ("llama4", "idefics3", "internvl")
# Real photos: (case name, file names under Pillow's Tests/images; "grace_hopper.jpg" is ours).
CASES: dict[str, list[str]] = {
    "512x600 (Grace Hopper)": ["grace_hopper.jpg"],
    "640x480 (sugarshack)": ["sugarshack_bad_mpo_header.jpg"],
    "800x531 (exif_gps)": ["exif_gps_typeerror.jpg"],
    "2000x1072 (xmp_test)": ["xmp_test.jpg"],
    "batch of 4": [
        "grace_hopper.jpg",
        "sugarshack_bad_mpo_header.jpg",
        "exif_gps_typeerror.jpg",
        "flower2.jpg",
    ],
}
STAGES = ("preprocess", "encode", "decode", "total")


def photo_paths(names: list[str]) -> list[str]:
    from support.images import grace_hopper, pillow_test_images

    images = pillow_test_images()
    out = []
    for name in names:
        if name == "grace_hopper.jpg":
            path = Path(os.environ.get("TMPDIR", "/tmp")) / "bench-grace_hopper.jpg"
            path.write_bytes(grace_hopper())
            out.append(str(path))
        else:
            out.append(str(images / name))
    return out


def prompt(n: int, anchor: int) -> list[int]:
    ids = [1, 17]
    for k in range(n):
        ids += [anchor, 30 + k]
    return [*ids, 2]


def reference(family: str) -> Callable[[list[Any]], dict[str, Any]]:
    """The transformers image processor of ``family`` as a server would call it; returns numpy
    arrays (Llama 4's bfloat16 pixels as ``ml_dtypes.bfloat16``)."""
    if family == "llama4":
        import ml_dtypes
        import torch
        from transformers import Llama4ImageProcessor

        torch.set_num_threads(1)
        llama = Llama4ImageProcessor()

        def run_llama(images: list[Any]) -> dict[str, Any]:
            out = llama(images=images, return_tensors="pt")
            pixels = out["pixel_values"].contiguous()
            as_bf16 = pixels.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
            return {"pixel_values": as_bf16, "aspect_ratios": out["aspect_ratios"].numpy()}

        return run_llama
    if family == "idefics3":
        from transformers import Idefics3ImageProcessorPil

        idefics = Idefics3ImageProcessorPil()

        def run_idefics(images: list[Any]) -> dict[str, Any]:
            out = idefics(images=images, return_tensors="np", return_row_col_info=True)
            return {
                "pixel_values": out["pixel_values"][0],
                "pixel_attention_mask": out["pixel_attention_mask"][0],
            }

        return run_idefics
    from transformers import GotOcr2ImageProcessorPil

    # InternVL's published preprocessor_config.json (our family defaults) over GOT-OCR2's class
    # defaults: 448-px tiles, ImageNet mean/std, 1-12 patches.
    got = GotOcr2ImageProcessorPil(
        size={"height": 448, "width": 448},
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
        min_patches=1,
        max_patches=12,
    )

    def run_internvl(images: list[Any]) -> dict[str, Any]:
        out = got(images=images, return_tensors="np", crop_to_patches=True)
        return {"pixel_values": out["pixel_values"], "num_patches": out["num_patches"]}

    return run_internvl


def pipeline(impl: str, family: str, files: list[bytes]) -> dict[str, Callable[[], Any]]:
    """Zero-argument callables for each stage of ``impl`` on ``files`` (and the whole path)."""
    import numpy as np
    from PIL import Image

    from smg_grpc_proto import demo, tensors
    from smg_grpc_proto.engines import VisionModel
    from smg_grpc_proto.engines import vllm as adapter
    from smg_grpc_proto.generated import vllm_engine_pb2 as pb

    model = VisionModel.for_family(family)  # type: ignore[arg-type]
    media = model.prepare(files, threads=1)
    ids = prompt(len(files), media.anchor)
    if impl == "ours":
        data = tensors.serialize(adapter.generate_request("b", ids, media))

        def prepare() -> Any:
            return model.prepare(files, threads=1)

        def encode() -> bytes:
            return tensors.serialize(adapter.generate_request("b", ids, media))

        def decode() -> Any:
            return adapter.decode_mm_inputs(tensors.parse(data, pb.GenerateRequest))

        def total() -> Any:
            m = model.prepare(files, threads=1)
            wire = tensors.serialize(adapter.generate_request("b", ids, m))
            return adapter.decode_mm_inputs(tensors.parse(wire, pb.GenerateRequest))

        return {"preprocess": prepare, "encode": encode, "decode": decode, "total": total}

    meta = adapter.generate_request("m", ids, media).message
    expanded = list(meta.tokenized.input_ids)
    side = {k: v for k, v in media.tensors().items() if k != "pixel_values"}
    run = reference(family)

    def preprocess() -> dict[str, Any]:
        images = [Image.open(io.BytesIO(f)).convert("RGB") for f in files]
        return run(images)

    def arrays_of(out: dict[str, Any]) -> dict[str, Any]:
        # the sizes tensors the reference does not return (patches_per_image, …) come from the
        # metadata, as a Python gateway would compute them from the processor's outputs
        return {**side, **out}

    arrays = arrays_of(preprocess())
    data = demo.plain_encode("b", expanded, arrays, meta.mm_inputs)

    def plain_total() -> Any:
        wire = demo.plain_encode("b", expanded, arrays_of(preprocess()), meta.mm_inputs)
        return demo.plain_decode(wire)

    del np
    return {
        "preprocess": preprocess,
        "encode": lambda: demo.plain_encode("b", expanded, arrays, meta.mm_inputs),
        "decode": lambda: demo.plain_decode(data),
        "total": plain_total,
    }


def check_same(family: str, files: list[bytes]) -> None:
    """Both paths must hand the engine the same pixel bytes."""
    import numpy as np

    (batch,) = pipeline("ours", family, files)["total"]()
    ours = np.ascontiguousarray(batch.tensors["pixel_values"])
    plain = np.ascontiguousarray(pipeline("plain", family, files)["total"]()["pixel_values"])
    if ours.shape != plain.shape or ours.tobytes() != plain.tobytes():
        raise SystemExit(
            f"{family}: ours and plain differ: {ours.dtype}{ours.shape} {plain.dtype}{plain.shape}"
        )


def child(spec: dict[str, Any]) -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core: every thread shares it
    files = [Path(p).read_bytes() for p in spec["paths"]]
    family = spec["family"]
    if spec["mode"] == "time":
        check_same(family, files)
        result = {}
        for impl in ("ours", "plain"):
            ops = pipeline(impl, family, files)
            result[impl] = {stage: time_op(ops[stage], spec["repeat"]) for stage in STAGES}
    else:
        total = pipeline(spec["impl"], family, files)["total"]
        total()
        result = {"peak": measure_peak(total)}
    print(json.dumps(result))


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"child failed: {out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def machine() -> str:
    import numpy as np
    import PIL
    import transformers

    import smg_grpc_proto

    try:
        import torch

        extra = f", torch {torch.__version__}"
    except ImportError:
        extra = ""
    return (
        f"{cpu_model()}, {os.cpu_count()} cores; Linux {platform.release()}; Python "
        f"{platform.python_version()}, numpy {np.__version__}, Pillow {PIL.__version__}, "
        f"transformers {transformers.__version__}{extra}, smg-grpc-proto "
        f"{smg_grpc_proto.__version__} (native {smg_grpc_proto.build_info()['profile']})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--families", nargs="*", default=["idefics3", "internvl"], choices=FAMILIES)
    parser.add_argument("--repeat", type=int, default=5, help="timed calls per stage (at least)")
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per figure")
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    print(f"machine: {machine()}")
    print(f"rounds: {args.rounds} fresh processes, median of >= {args.repeat} calls each\n")
    header = "| family | case | stage | transformers + protobuf (ms) | ours (ms) | speed-up |"
    header += "" if args.no_memory else " peak MiB plain | peak MiB ours |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for family in args.families:
        for name in args.cases:
            paths = photo_paths(CASES[name])
            spec = {"mode": "time", "paths": paths, "repeat": args.repeat, "family": family}
            rounds = [run_child(spec) for _ in range(args.rounds)]
            fig = {
                impl: {s: statistics.median(r[impl][s] for r in rounds) for s in STAGES}
                for impl in ("ours", "plain")
            }
            peaks = (
                None
                if args.no_memory
                else [
                    run_child({"mode": "peak", "impl": i, "paths": paths, "family": family})["peak"]
                    for i in ("plain", "ours")
                ]
            )
            for stage in STAGES:
                plain, ours = fig["plain"][stage] * 1e3, fig["ours"][stage] * 1e3
                label = "**image bytes -> engine tensors**" if stage == "total" else stage
                row = f"| {family} | {name} | {label} | {plain:.2f} | {ours:.2f} | "
                row += f"**{plain / ours:.1f}x** |"
                if peaks is not None:
                    row += f" {peaks[0]:.0f} | {peaks[1]:.0f} |" if stage == "total" else " | |"
                print(row, flush=True)


if __name__ == "__main__":
    main()
