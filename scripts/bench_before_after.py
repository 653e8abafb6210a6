#!/usr/bin/env python3
"""Before/after benchmark of our hot paths: two installations side by side in one run.

    python scripts/bench_before_after.py --before /path/to/old/python [--after python3]
        [--rounds 5] [--repeat 9]

``--before`` and ``--after`` are Python interpreters with different builds of the package
installed (e.g. a venv holding the previous release's wheel). Each round runs, in a fresh
process per interpreter and alternating which goes first, the timed stages of our side of

* ``bench_engines.py`` — image bytes -> vLLM engine tensors for Qwen2-VL (its stages: decode,
  processor, build, serialize, parse, whole path) on the synthetic JPEGs of
  ``bench_vision.write_images`` at 512 x 600, 1280 x 960 and a batch of 8, one core;
* ``bench_tensors.py`` — encode and decode of a vLLM request carrying a 1 and 25 MiB float32
  tensor (and f32 -> bf16), and the shared-memory round trip (``pack(transport="shm")`` +
  ``unpack``);
* ``vision.decode`` of PNG files: the bundled photo (Grace Hopper, 512 x 600) re-encoded as RGB,
  RGBA and palette PNGs, and scaled to 1280 x 960; Pillow's decode of the same files
  (``Image.open`` + ``convert("RGB")``) is timed in the same processes for reference;
* the same stages as ``bench_engines.py`` on requests of 1, 8 and 32 small images: thumbnails
  of the corpus's real photos (long side 128 px, Pillow's LANCZOS; JPEG quality 90 for the
  JPEG photos, PNG for the PNG ones), where what each request costs beyond the pixels
  (hashing, building, parsing, checking) is most of the time;
* ``vllm.generate_request`` of one image with a prompt of 500 to 32 000 tokens given as a list
  of Python ints (random ids below Qwen2-VL's vocabulary size, the image's anchor last), and,
  timed in the same processes for reference, protobuf's own ``extend`` of the expanded ids into
  an empty request.

``--only thumbnails,PNG`` runs the cases whose names start with one of the given prefixes.

Figures are medians over the rounds of each child's median of ``--repeat`` calls; the table
gives before, after and after/before (below 1.00 = faster now). Only our code is timed: the
references do not change between the two installations.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

ENGINE_CASES = ("512x600", "1280x960", "batch of 8")
TENSOR_SIZES = (1, 25)
THUMBNAIL_COUNTS = (1, 8, 32)
PROMPT_TOKENS = (500, 2000, 8000, 32000)


def child(spec: dict[str, Any]) -> None:
    from benchkit import time_op

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    out: dict[str, float] = {}
    if spec["kind"] == "engines":
        from bench_engines import STAGES, pipeline

        files = [Path(p).read_bytes() for p in spec["paths"]]
        ops = pipeline("ours", files)
        for stage in STAGES:
            out[stage] = time_op(ops[stage], spec["repeat"])
    elif spec["kind"] == "png":
        from PIL import Image

        from smg_grpc_proto import vision

        files = [Path(p).read_bytes() for p in spec["paths"]]
        out["ours"] = sum(time_op(lambda d=d: vision.decode(d), spec["repeat"]) for d in files)
        out["Pillow"] = sum(
            time_op(lambda d=d: Image.open(io.BytesIO(d)).convert("RGB").load(), spec["repeat"])
            for d in files
        )
    elif spec["kind"] == "prompt":
        import numpy as np

        from smg_grpc_proto.engines import VisionModel
        from smg_grpc_proto.engines import vllm as adapter
        from smg_grpc_proto.generated import vllm_engine_pb2 as pb

        model = VisionModel.for_family("qwen2_vl")
        media = model.prepare([Path(spec["paths"][0]).read_bytes()], threads=1)
        rng = np.random.default_rng(spec["tokens"])
        prompt = [*rng.integers(0, 150_000, spec["tokens"]).tolist(), media.anchor]
        out["generate_request"] = time_op(
            lambda: adapter.generate_request("b", prompt, media), spec["repeat"]
        )
        expanded = list(adapter.generate_request("b", prompt, media).message.tokenized.input_ids)

        def plain() -> None:
            pb.GenerateRequest(request_id="b").tokenized.input_ids.extend(expanded)

        out["protobuf extend (reference)"] = time_op(plain, spec["repeat"])
    else:
        from bench_tensors import ops as tensor_ops

        from smg_grpc_proto import tensors, vllm_engine_pb2

        for bf16 in (False, True):
            fns = tensor_ops(spec["mib"], bf16)
            suffix = " f32->bf16" if bf16 else ""
            out["encode" + suffix] = time_op(fns["encode/ours"], spec["repeat"])
            out["decode" + suffix] = time_op(fns["decode/ours"], spec["repeat"])
        import numpy as np

        array = np.ones(spec["mib"] * 2**18, np.float32)

        def round_trip() -> None:
            td = tensors.pack(array, vllm_engine_pb2.TensorData, transport="shm")
            tensors.unpack(td)

        out["shm pack + unpack"] = time_op(round_trip, spec["repeat"])
    print(json.dumps(out))


def run(python: str, spec: dict[str, Any]) -> dict[str, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(
        [python, __file__, "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        cwd=ROOT / "scripts",
    )
    if result.returncode != 0:
        raise SystemExit(f"{python} failed: {result.stderr[-3000:]}")
    figures: dict[str, float] = json.loads(result.stdout.strip().splitlines()[-1])
    return figures


def write_pngs(directory: Path, photo: Path) -> dict[str, Path]:
    """The photo as PNGs of the common kinds, at its size and at 1280 x 960."""
    from PIL import Image

    source = Image.open(photo).convert("RGB")
    out = {}
    for size in (source.size, (1280, 960)):
        image = source if size == source.size else source.resize(size, Image.Resampling.LANCZOS)
        label = f"{size[0]}x{size[1]}"
        variants = {
            "RGB": image,
            "RGBA": Image.merge("RGBA", (*image.split(), image.convert("L"))),
            "palette": image.quantize(256),
        }
        for kind, variant in variants.items():
            path = directory / f"photo_{label}_{kind}.png"
            variant.save(path, optimize=False)
            out[f"{label} {kind}"] = path
    return out


def write_thumbnails(directory: Path, counts: tuple[int, ...]) -> dict[str, list[Path]]:
    """Requests of ``counts`` small images: the corpus's real photos scaled to a long side of
    128 px, each kept in its own format (JPEG quality 90 or PNG), taken in turn."""
    from benchkit import real_photo_cases
    from PIL import Image

    sources = sorted({p for paths in real_photo_cases().values() for p in paths})
    thumbs = []
    for photo in sources:
        image = Image.open(photo).convert("RGB")
        image.thumbnail((128, 128), Image.Resampling.LANCZOS)
        jpeg = photo.suffix.lower() in (".jpg", ".jpeg")
        path = directory / f"thumb_{photo.stem}.{'jpg' if jpeg else 'png'}"
        image.save(path, **({"quality": 90} if jpeg else {}))
        thumbs.append(path)
    return {f"thumbnails x{n}": [thumbs[i % len(thumbs)] for i in range(n)] for n in counts}


def version(python: str) -> str:
    code = "import smg_grpc_proto, os; print(os.path.dirname(smg_grpc_proto.__file__))"
    return subprocess.run(
        [python, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="interpreter with the old build (required)")
    parser.add_argument("--after", default=sys.executable, help="interpreter with the new build")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--only", help="comma-separated prefixes of the cases to run")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    if not args.before:
        parser.error("--before is required")
    from bench_engines import machine
    from bench_vision import write_images

    directory = Path(tempfile.mkdtemp(prefix="bench-before-after-"))
    cases = write_images(directory)
    pngs = write_pngs(directory, cases["512x600"][0])
    specs: list[tuple[str, dict[str, Any]]] = [
        (name, {"kind": "engines", "paths": [str(p) for p in cases[name]], "repeat": args.repeat})
        for name in ENGINE_CASES
    ]
    specs += [
        (f"{mib} MiB", {"kind": "tensors", "mib": mib, "repeat": args.repeat})
        for mib in TENSOR_SIZES
    ]
    specs += [
        (f"PNG {name}", {"kind": "png", "paths": [str(path)], "repeat": args.repeat})
        for name, path in pngs.items()
    ]
    specs += [
        (name, {"kind": "engines", "paths": [str(p) for p in paths], "repeat": args.repeat})
        for name, paths in write_thumbnails(directory, THUMBNAIL_COUNTS).items()
    ]
    specs += [
        (
            f"prompt {tokens}",
            {
                "kind": "prompt",
                "paths": [str(cases["512x600"][0])],
                "tokens": tokens,
                "repeat": args.repeat,
            },
        )
        for tokens in PROMPT_TOKENS
    ]
    if args.only:
        prefixes = tuple(p.strip() for p in args.only.split(",") if p.strip())
        specs = [(name, spec) for name, spec in specs if name.startswith(prefixes)]
    print(f"machine: {machine()}")
    print(f"before: {version(args.before)}\nafter: {version(args.after)}")
    print(f"{args.rounds} rounds, alternating order, fresh processes, one core\n")
    print("| case | stage | before (ms) | after (ms) | after / before |")
    print("|---|---|---:|---:|---:|")
    for name, spec in specs:
        rounds: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        for r in range(args.rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for which in order:
                rounds[which].append(run(getattr(args, which), spec))
        for stage in rounds["before"][0]:
            before = statistics.median(x[stage] for x in rounds["before"]) * 1e3
            after = statistics.median(x[stage] for x in rounds["after"]) * 1e3
            print(f"| {name} | {stage} | {before:.3f} | {after:.3f} | {after / before:.2f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
