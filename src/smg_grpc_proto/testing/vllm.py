"""Reference vLLM servicer (``vllm.grpc.engine.VllmEngine``) over the toy model.

What it shows an engine maintainer:

* ``Generate`` receives a :class:`~smg_grpc_proto.tensors.TensorMessage` (register with
  :func:`add_to_server`), decodes ``mm_inputs``/``extra_mm_inputs`` with
  :func:`smg_grpc_proto.engines.vllm.decode_mm_inputs` in a worker thread — inline tensors are
  zero-copy views of the received bytes, shared-memory ones are mapped and unlinked, remote
  (NIXL) ones are pulled with the servicer's ``puller`` — and turns every decoding error into
  ``INVALID_ARGUMENT`` with the decoder's message (a remote payload that cannot be pulled:
  ``UNAVAILABLE``).
* Disaggregated prefill/decode as vLLM's servicer takes it: malformed KV transfer params are
  refused, and a decode-side batch without ``pixel_values`` is accepted exactly when the
  request carries KV transfer params (the toy model has no KV to receive: its output follows
  the placeholders, hashes and side tensors the batch does carry).
* Responses follow vLLM's servicer: no request id; with ``stream=true`` one chunk per token
  whose ``completion_tokens`` is that chunk's count (a delta), then a ``complete`` repeating
  only the last chunk's tokens; with ``stream=false`` a single ``complete`` with every token.
* ``Abort`` ends the stream promptly with ``finish_reason="abort"`` (the contract lists it).
* ``GetServerInfo`` reports ``shm_namespace_id`` so a gateway in ``auto`` mode can use shm.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc.aio

from smg_grpc_proto import shm
from smg_grpc_proto.engines import DecodedBatch
from smg_grpc_proto.engines import vllm as adapter
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc
from smg_grpc_proto.tensors import ShmRead, TensorMessage
from smg_grpc_proto.testing._base import Context, RejectedRequest, ToyEngineCore, add_service
from smg_grpc_proto.testing._toy import mm_digest

if TYPE_CHECKING:
    from smg_grpc_proto.remote import RemotePuller

__all__ = ["SERVICE", "VllmToyServicer", "add_to_server"]

SERVICE = pb.DESCRIPTOR.services_by_name["VllmEngine"]


class VllmToyServicer(ToyEngineCore, pb_grpc.VllmEngineServicer):
    """The toy model behind the vLLM contract."""

    async def Generate(
        self,
        request: pb.GenerateRequest | TensorMessage[pb.GenerateRequest] | RejectedRequest,
        context: Context,
    ) -> AsyncIterator[pb.GenerateResponse]:
        received, message = await self.unwrap(context, request, pb.GenerateRequest)
        if message.WhichOneof("input") != "tokenized":
            await self.invalid(
                context,
                "tokenized is not set: the toy engine has no tokenizer, send token ids "
                f"(got {message.WhichOneof('input') or 'no input'})",
            )
        params = message.sampling_params
        prompt, max_tokens = await self.check_generate(
            context, message.tokenized.input_ids, params, "max_tokens", n=None
        )
        merge_size = self.model.merge_size
        digest = await self.decode(
            context,
            message.request_id,
            lambda: _decode(received, merge_size, self.shm_read, self.puller),
            mm_digest,
        )
        output = self.model.generate(
            prompt, digest, max_tokens=max_tokens, ignore_eos=params.ignore_eos
        )
        run = await self.begin(context, message.request_id, len(prompt))
        try:
            emitted: list[int] = []
            async for token in self.produce(run, output):
                emitted.append(token)
                if message.stream:
                    yield pb.GenerateResponse(
                        chunk=pb.GenerateStreamChunk(
                            token_ids=[token], prompt_tokens=len(prompt), completion_tokens=1
                        )
                    )
            if run.aborted.is_set():
                finish, ids = "abort", ([] if message.stream else emitted)
            else:
                finish, ids = output.finish_reason, (emitted[-1:] if message.stream else emitted)
            yield pb.GenerateResponse(
                complete=pb.GenerateComplete(
                    output_ids=ids,
                    finish_reason=finish,
                    prompt_tokens=len(prompt),
                    completion_tokens=len(ids),
                )
            )
        finally:
            self.end(run)

    async def Embed(self, request: pb.EmbedRequest, context: Context) -> pb.EmbedResponse:
        if not request.HasField("tokenized"):
            await self.invalid(context, "tokenized is required for Embed")
        ids = await self.check_prompt(context, request.tokenized.input_ids, "tokenized.input_ids")
        vector = self.model.embed(ids)
        return pb.EmbedResponse(embedding=vector, prompt_tokens=len(ids), embedding_dim=len(vector))

    async def HealthCheck(
        self, request: pb.HealthCheckRequest, context: Context
    ) -> pb.HealthCheckResponse:
        return pb.HealthCheckResponse(healthy=True, message="ok")

    async def Abort(self, request: pb.AbortRequest, context: Context) -> pb.AbortResponse:
        self.abort_ids(list(request.request_ids))
        return pb.AbortResponse()

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: Context
    ) -> pb.GetModelInfoResponse:
        m = self.model
        return pb.GetModelInfoResponse(
            model_path=m.model_path,
            is_generation=True,
            max_context_length=m.max_context_length,
            vocab_size=m.vocab_size,
            supports_vision=m.supports_vision,
            served_model_name=m.served_model_name,
            tokenizer_path=str(m.model_dir) if m.model_dir is not None else "",
            model_type=m.model_type,
            architectures=m.architectures,
            eos_token_ids=m.eos_token_ids,
            pad_token_id=m.pad_token_id,
            bos_token_id=m.bos_token_id,
            max_req_input_len=m.max_context_length - 1,
        )

    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: Context
    ) -> pb.GetServerInfoResponse:
        return pb.GetServerInfoResponse(
            active_requests=self.active_requests,
            last_receive_timestamp=self.last_receive,
            uptime_seconds=self.uptime(),
            server_type="vllm-grpc",
            data_parallel_size=1,
            shm_namespace_id=shm.namespace_id(),
            max_num_seqs=256,
            model_dtype="torch.float32",
            multimodal_encoder_dtype="float32",
        )

    async def GetLoads(self, request: pb.GetLoadsRequest, context: Context) -> pb.GetLoadsResponse:
        loads = []
        if not request.HasField("dp_rank") or request.dp_rank == 0:
            active = self.active_requests
            loads.append(
                pb.SchedulerLoad(
                    dp_rank=0,
                    num_running_reqs=active,
                    num_total_reqs=active,
                    max_running_requests=256,
                )
            )
        return pb.GetLoadsResponse(
            timestamp=self.timestamp(), version="toy", dp_rank_count=len(loads), loads=loads
        )


def _decode(
    received: pb.GenerateRequest | TensorMessage[pb.GenerateRequest],
    merge_size: int | None,
    shm_read: ShmRead | None,
    puller: RemotePuller | None = None,
) -> tuple[DecodedBatch, ...]:
    """The request's batches; its KV transfer params checked as vLLM's servicer checks them
    (after decoding, so the request's shared-memory segments are consumed either way)."""
    batches = adapter.decode_mm_inputs(
        received, merge_size=merge_size, shm_read=shm_read, puller=puller
    )
    adapter.kv_transfer_params(received)
    return batches


def add_to_server(servicer: VllmToyServicer, server: grpc.aio.Server) -> None:
    """Register ``servicer`` like ``add_VllmEngineServicer_to_server``, except that
    ``Generate`` receives a :class:`~smg_grpc_proto.tensors.TensorMessage` (zero-copy tensors)
    or, for bytes the tensor codec refuses, a :class:`RejectedRequest`."""
    add_service(server, servicer, SERVICE, tensor_methods=("Generate",))
