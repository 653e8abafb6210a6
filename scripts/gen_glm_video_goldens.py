#!/usr/bin/env python3
"""Write ``tests/goldens/glm_video.json``: transformers' GLM video processors
(``Glm4vVideoProcessor``, ``Glm46VVideoProcessor``, ``Glm5NextVideoProcessor``: torchvision only,
there is no PIL video backend) on the videos of ``tests/support/glm_video_inputs.py`` — one per
real photo (32) and the odd shapes, a batch, and config variants — with frames passed already
sampled (``do_sample_frames=False``). ``tests/vision/test_glm_video.py`` checks ours against it
without torch.

Run it in the torch reference venv (torch 2.14.1, torchvision 0.29.1, transformers 5.24.0,
Pillow 13.0.0; see ``scripts/gen_torch_goldens.py``), after the test env has fetched the photos
into the cache::

    SMG_TEST_CACHE=/work/main/.cache /work/torchenv/bin/python scripts/gen_glm_video_goldens.py

Each case stores ``pixel_values_videos`` as shape, the sha256 of its float32 little-endian bytes
and 24 sampled values, ``video_grid_thw`` whole, and the processor's error text where it raises.
Never imports smg_grpc_proto.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402
import PIL  # noqa: E402
import torch  # noqa: E402
import torchvision  # noqa: E402
import transformers  # noqa: E402
from support.glm_video_inputs import videos  # noqa: E402
from support.images import real_photos  # noqa: E402
from transformers.models.glm4v.video_processing_glm4v import Glm4vVideoProcessor  # noqa: E402
from transformers.models.glm5_next.video_processing_glm5_next import (  # noqa: E402
    Glm5NextVideoProcessor,
)
from transformers.models.glm46v.video_processing_glm46v import Glm46VVideoProcessor  # noqa: E402

OUT = ROOT / "tests" / "goldens" / "glm_video.json"
PINNED = {"torch": "2.14.1", "torchvision": "0.29.1", "transformers": "5.24.0", "pillow": "13.0.0"}
CLASSES = {
    "glm4v": Glm4vVideoProcessor,
    "glm46v": Glm46VVideoProcessor,
    "glm5_next": Glm5NextVideoProcessor,
}
# transformers key -> ours (the video processor's bounds are our video_* keys)
OURS = {
    "size": "video_size",
    "min_image_tokens": "video_min_image_tokens",
    "max_image_tokens": "video_max_image_tokens",
    "resample": "resample",
}
N_SAMPLES = 24
# (total_num_frames, fps, duration or None, the call's fps or None): short, odd, long, very long
SAMPLING = [
    (1, 30.0, None, None),
    (7, 24.0, None, None),
    (90, 30.0, None, None),
    (91, 29.97, None, None),
    (300, 25.0, 12.0, None),
    (300, 25.0, None, 1.0),
    (1000, 10.0, None, 4.0),
    (3600, 2.0, None, None),
    (9000, 30.0, None, None),
    (20000, 5.0, None, None),
    (60000, 24.0, 2500.0, None),
    (40, 1.0, None, 0.5),
]


def _samples(n: int) -> list[int]:
    if n <= N_SAMPLES:
        return list(range(n))
    picks = {0, n - 1}
    for i in range(N_SAMPLES - 2):
        lo, hi = i * n // (N_SAMPLES - 2), (i + 1) * n // (N_SAMPLES - 2)
        picks.add(lo + (i * 2654435761 + 40503) % (hi - lo))
    return sorted(picks)


def _run(family: str, config: dict[str, Any], clips: list[np.ndarray]) -> dict[str, Any]:
    processor = CLASSES[family](**config)
    try:
        out = processor(
            videos=[torch.from_numpy(c).permute(0, 3, 1, 2).contiguous() for c in clips],
            do_sample_frames=False,
            input_data_format="channels_first",
            return_tensors="pt",
        )
    except Exception as exc:  # the reference refuses: ours must too
        return {"error": f"{type(exc).__name__}: {exc}"}
    pixels = out["pixel_values_videos"].contiguous()
    assert pixels.dtype == torch.float32
    flat = pixels.reshape(-1)
    return {
        "pixel_values_videos": {
            "shape": list(pixels.shape),
            "sha256": hashlib.sha256(pixels.numpy().tobytes()).hexdigest(),
            "samples": [[i, float(flat[i])] for i in _samples(flat.numel())],
        },
        "video_grid_thw": out["video_grid_thw"].tolist(),
    }


def main() -> None:
    found = {
        "torch": torch.__version__.split("+")[0],
        "torchvision": torchvision.__version__.split("+")[0],
        "transformers": transformers.__version__,
        "pillow": PIL.__version__,
    }
    if found != PINNED:
        raise SystemExit(f"the goldens need {PINNED}, this environment has {found}")
    all_videos = videos(real_photos())
    photos = [n for n in all_videos if n.startswith("photo_")]
    noise = [n for n in all_videos if not n.startswith("photo_")]
    variants: dict[str, list[dict[str, Any]]] = {
        "glm4v": [
            {"size": {"shortest_edge": 112 * 112, "longest_edge": 200_704}},
            {"size": {"shortest_edge": 200_000, "longest_edge": 28 * 28 * 2 * 30_000}},
            {"resample": 2},
        ],
        "glm46v": [{"size": {"shortest_edge": 112 * 112, "longest_edge": 200_704}}],
        "glm5_next": [
            {"min_image_tokens": 64, "max_image_tokens": 300},
            {"min_image_tokens": 2000, "max_image_tokens": 240_000},
            {"resample": 2},
        ],
    }
    cases: list[dict[str, Any]] = []

    def add(family: str, names: list[str], config: dict[str, Any]) -> None:
        tag = ",".join(f"{k}={v}" for k, v in config.items()) or "default"
        case = {
            "id": f"{family}/{'+'.join(names)}/{tag}",
            "family": family,
            "videos": names,
            "config": {OURS[k]: v for k, v in config.items()},
        }
        case.update(_run(family, config, [all_videos[n] for n in names]))
        cases.append(case)

    for family in CLASSES:
        for name in photos + noise:
            add(family, [name], {})
        add(family, ["photo_astronaut", "noise-3f-5x700", "photo_chelsea"], {})
        for config in variants[family]:
            for name in [*photos[:6], "noise-2f-1080x1920", "noise-4f-28x28"]:
                add(family, [name], config)
    # frame sampling (do_sample_frames=True): the indices each class's sample_frames picks
    from transformers.video_utils import VideoMetadata

    sampling = []
    for family, cls in CLASSES.items():
        for total, fps, duration, target in SAMPLING:
            meta = VideoMetadata(total_num_frames=total, fps=fps, duration=duration)
            kwargs = {} if target is None else {"fps": target}
            indices = cls().sample_frames(meta, **kwargs)
            sampling.append(
                {
                    "family": family,
                    "total_num_frames": total,
                    "fps": fps,
                    "duration": duration,
                    "target_fps": target,
                    "indices": [int(i) for i in indices],
                }
            )
    torch_info = {
        **found,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    OUT.write_text(
        json.dumps({"versions": torch_info, "cases": cases, "sampling": sampling}, indent=1) + "\n"
    )
    errors = sum("error" in c for c in cases)
    print(f"{OUT}: {len(cases)} cases ({errors} errors)")


if __name__ == "__main__":
    main()
