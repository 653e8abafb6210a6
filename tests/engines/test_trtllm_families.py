"""TensorRT-LLM for the families of the issue-22 model wave whose checkpoints its PyTorch backend
serves with an input processor of its own (``tensorrt_llm/_torch/models``, read 2026-12): the
builder sends the encoded files and the prompt *unexpanded*, one anchor token per image, which
that processor expands and preprocesses itself. Each anchor must be the token the processor
looks for in ``prompt_token_ids``; those ids are written here from TensorRT-LLM's sources (not
from our family table), so that a change on either side shows.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from PIL import Image

from smg_grpc_proto import tensors
from smg_grpc_proto.engines import VisionModel
from smg_grpc_proto.engines import trtllm as trt_adapter
from smg_grpc_proto.errors import PlaceholderError

#: The image token id each TensorRT-LLM input processor expands in a token-id prompt.
TRTLLM_ANCHORS = {
    # modeling_kimi_k25.py (model_type kimi_k25): KimiK25InputProcessor replaces every
    # config.media_placeholder_token_id (<|media_pad|>) by one token per merged patch.
    "kimi_k25": 163605,
    # modeling_minimaxm3.py (model_type minimax_m3_vl): MiniMaxM3VLInputProcessor's token-id fast
    # path (expand_prompt_token_ids_for_mm) takes one config.image_token_index (]<]image[>[) per
    # image, without the vision start/end tokens, and writes start + run + end itself.
    "minimax_m3_vl": 200025,
    # modeling_gemma4_unified.py (model_type gemma4_unified): Gemma4UnifiedInputProcessor (as
    # Gemma 4's) with the placeholder <|image|>.
    "gemma4_unified": 258880,
    # modeling_inkling.py (model_type inkling_mm_model) with modeling_inkling_multimodal.py:
    # InklingInputProcessor expands the one <|unused_200054|> (DEFAULT_IMAGE_TOKEN_ID, or
    # config.image_token_id) per image into one token per patch.
    "inkling": 200054,
    # modeling_nemotron_nano.py (model type NemotronH_Nano_Omni_Reasoning_V3, in _arch_index.py's
    # MULTIMODAL_MODEL_TYPE_TO_MODULE): <image>, the checkpoints' img_context_token_id.
    "nemotron_h_omni": 18,
}


def _png(seed: int, height: int, width: int) -> bytes:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(
        buffer, format="PNG"
    )
    return buffer.getvalue()


def _wire(request: tensors.TensorMessage[Any]) -> tensors.TensorMessage[Any]:
    return tensors.parse(tensors.serialize(request), type(request.message))


@pytest.mark.parametrize("family", sorted(TRTLLM_ANCHORS))
def test_files_and_unexpanded_prompt_round_trip(family: str) -> None:
    files = [_png(1, 300, 500), _png(2, 90, 40)]
    media = VisionModel.for_family(family).prepare(files)  # type: ignore[arg-type]
    anchor = TRTLLM_ANCHORS[family]
    assert media.anchor == media.token_id == anchor
    prompt = [1, 7, anchor, 100, anchor, 101, 2]
    request = trt_adapter.generate_request("r", prompt, media, max_tokens=8)
    assert list(request.message.tokenized.input_token_ids) == prompt  # not expanded
    received = _wire(request)
    assert trt_adapter.decode_mm_inputs(received, image_token_id=anchor) == tuple(files)
    # one anchor per file, on both sides
    with pytest.raises(PlaceholderError, match=rf"holds 1 image anchor token\(s\) \({anchor}\)"):
        trt_adapter.generate_request("r", prompt[:3], media, max_tokens=8)
    short = received.to_message()
    del short.tokenized.input_token_ids[2]
    with pytest.raises(PlaceholderError, match=rf"holds 1 image anchor token\(s\) \({anchor}\)"):
        trt_adapter.decode_mm_inputs(short, image_token_id=anchor)
