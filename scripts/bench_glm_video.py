#!/usr/bin/env python3
"""GLM videos benchmark: ours against transformers 5.24.0's ``Glm4vVideoProcessor`` and
``Glm5NextVideoProcessor`` (torchvision only; ``Glm46VVideoProcessor`` processes frames with
GLM-4.1V's code), side by side, one thread (``torch.set_num_threads(1)``, the process pinned to
one core; ours ``threads=1``).

Cases: 8 frames of 512x600 (crops of ``grace_hopper.jpg``) and 16 frames of 720x1280 noise,
from decoded frames (uint8 tensors for the references, numpy arrays for us) and from JPEG bytes
per frame (``torchvision.io.decode_jpeg`` for the references, ours decoding them). Outputs are
checked to be byte-identical first. Runs in the torch reference venv with our package importable,
e.g. the worktree's build::

    PYTHONPATH=src SMG_TEST_CACHE=/work/main/.cache /work/torchenv/bin/python \\
        scripts/bench_glm_video.py
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

from benchkit import cpu_model, time_op  # noqa: E402


def main() -> None:
    import numpy as np
    import torch
    import torchvision
    from PIL import Image
    from support.images import real_photos
    from transformers.models.glm4v.video_processing_glm4v import Glm4vVideoProcessor
    from transformers.models.glm5_next.video_processing_glm5_next import Glm5NextVideoProcessor

    from smg_grpc_proto.vision import ImageProcessor

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    with Image.open(real_photos()["grace_hopper.jpg"]) as im:
        photo = np.asarray(im.convert("RGB"))
    rng = np.random.default_rng(0)
    videos = {
        "8 x 512x600": [np.ascontiguousarray(photo[i : i + 512, i : i + 400]) for i in range(8)],
        "16 x 720x1280": list(rng.integers(0, 256, (16, 720, 1280, 3), dtype=np.uint8)),
    }
    print(f"{cpu_model()}, one thread")
    print(f"{'family':10} {'video':14} {'input':8} {'theirs ms':>10} {'ours ms':>8} {'x':>6}")
    for family, cls in (("glm4v", Glm4vVideoProcessor), ("glm5_next", Glm5NextVideoProcessor)):
        reference = cls()
        ours = ImageProcessor(family, threads=1)
        for name, frames in videos.items():
            blobs = []
            for f in frames:
                buffer = io.BytesIO()
                Image.fromarray(f).save(buffer, format="JPEG", quality=90)
                blobs.append(buffer.getvalue())
            stacked = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).contiguous()

            def theirs_decoded(stacked: Any = stacked, reference: Any = reference) -> Any:
                return reference(
                    videos=[stacked],
                    do_sample_frames=False,
                    input_data_format="channels_first",
                    return_tensors="pt",
                )

            def theirs_bytes(blobs: list[bytes] = blobs, reference: Any = reference) -> Any:
                decoded = torch.stack(
                    [
                        torchvision.io.decode_jpeg(
                            torch.frombuffer(bytearray(b), dtype=torch.uint8)
                        )
                        for b in blobs
                    ]
                )
                return reference(
                    videos=[decoded],
                    do_sample_frames=False,
                    input_data_format="channels_first",
                    return_tensors="pt",
                )

            want = theirs_decoded()["pixel_values_videos"].numpy()
            got = ours(videos=[frames]).pixel_values_videos
            if want.tobytes() != np.ascontiguousarray(got).tobytes():
                raise SystemExit(f"{family} {name}: ours and the reference differ")
            for label, theirs, mine in (
                ("decoded", theirs_decoded, lambda f=frames, o=ours: o(videos=[f])),
                ("bytes", theirs_bytes, lambda b=blobs, o=ours: o(videos=[b])),
            ):
                t, m = time_op(theirs, 3), time_op(mine, 3)
                print(
                    f"{family:10} {name:14} {label:8} {t * 1e3:10.1f} {m * 1e3:8.1f} {t / m:6.1f}"
                )


if __name__ == "__main__":
    main()
