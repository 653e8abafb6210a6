"""Reference TokenSpeed servicer (``tokenspeed.grpc.scheduler.TokenSpeedScheduler``) over the
toy model.

Contract points it demonstrates:

* ``Generate`` decodes the per-item ``mm_inputs.items`` (``encoder_input`` inline or shared
  memory, side tensors, placeholders, content hash) with ``smg_grpc_proto.engines.tokenspeed.
  decode_mm_inputs``; a decoding error is ``INVALID_ARGUMENT`` naming the field.
* ``TokenizedInput`` numbers ``input_ids=1`` (swapped relative to the other engines) — the
  generated classes take care of it.
* Responses echo ``request_id``; chunks carry the delta and the *cumulative*
  ``completion_tokens``; ``complete`` holds every token without streaming and repeats the last
  delta with streaming.
* Aborts end the stream with a non-OK status, as the contract says for this engine:
  ``CANCELLED`` after ``Abort``.
* ``GetServerInfo`` reports ``shm_namespace_id`` inside the ``scheduler_info`` Struct.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import grpc.aio
from google.protobuf import struct_pb2, timestamp_pb2

from smg_grpc_proto import shm
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import tokenspeed_scheduler_pb2 as pb
from smg_grpc_proto.generated import tokenspeed_scheduler_pb2_grpc as pb_grpc
from smg_grpc_proto.tensors import TensorMessage
from smg_grpc_proto.testing._base import Context, RejectedRequest, ToyEngineCore, add_service
from smg_grpc_proto.testing._toy import mm_digest

__all__ = ["SERVICE", "TokenSpeedToyServicer", "add_to_server"]

SERVICE = pb.DESCRIPTOR.services_by_name["TokenSpeedScheduler"]


class TokenSpeedToyServicer(ToyEngineCore, pb_grpc.TokenSpeedSchedulerServicer):
    """The toy model behind the TokenSpeed contract."""

    async def Generate(
        self,
        request: pb.GenerateRequest | TensorMessage[pb.GenerateRequest] | RejectedRequest,
        context: Context,
    ) -> AsyncIterator[pb.GenerateResponse]:
        received, message = await self.unwrap(context, request, pb.GenerateRequest)
        params = message.sampling_params
        prompt, max_tokens = await self.check_generate(
            context, message.tokenized.input_ids, params, "max_new_tokens", n=None
        )
        digest = b""
        if message.HasField("mm_inputs"):
            adapter = await self.adapter(context, "tokenspeed")
            digest = await self.decode(
                context,
                message.request_id,
                lambda: adapter.decode_mm_inputs(
                    received, shm_read=self.shm_read, puller=self.puller
                ),
                mm_digest,
            )
        output = self.model.generate(
            prompt, digest, max_tokens=max_tokens, ignore_eos=params.ignore_eos
        )
        rid = message.request_id
        run = await self.begin(context, rid, len(prompt))
        try:
            emitted: list[int] = []
            async for token in self.produce(run, output):
                emitted.append(token)
                if message.stream:
                    yield pb.GenerateResponse(
                        request_id=rid,
                        chunk=pb.GenerateStreamChunk(
                            token_ids=[token],
                            prompt_tokens=len(prompt),
                            completion_tokens=len(emitted),
                        ),
                    )
            if run.aborted.is_set():
                await context.abort(
                    grpc.StatusCode.CANCELLED,
                    f"request {rid!r} aborted after {len(emitted)} token(s)",
                )
            yield pb.GenerateResponse(
                request_id=rid,
                complete=pb.GenerateComplete(
                    output_ids=emitted[-1:] if message.stream else emitted,
                    finish_reason=output.finish_reason,
                    prompt_tokens=len(prompt),
                    completion_tokens=len(emitted),
                ),
            )
        finally:
            self.end(run)

    async def HealthCheck(
        self, request: pb.HealthCheckRequest, context: Context
    ) -> pb.HealthCheckResponse:
        return pb.HealthCheckResponse(healthy=True, message="ok")

    async def Abort(self, request: pb.AbortRequest, context: Context) -> pb.AbortResponse:
        found = self.abort_ids([request.request_id])
        if found:
            return pb.AbortResponse(success=True, message=f"aborted {request.request_id!r}")
        return pb.AbortResponse(success=False, message=f"{request.request_id!r} not in flight")

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: Context
    ) -> pb.GetModelInfoResponse:
        m = self.model
        return pb.GetModelInfoResponse(
            model_path=m.model_path,
            tokenizer_path=str(m.model_dir) if m.model_dir is not None else "",
            served_model_name=m.served_model_name,
            model_type=m.model_type,
            architectures=m.architectures,
            max_context_length=m.max_context_length,
            max_req_input_len=m.max_context_length - 1,
            vocab_size=m.vocab_size,
            eos_token_ids=m.eos_token_ids,
            pad_token_id=m.pad_token_id,
            bos_token_id=m.bos_token_id,
            supports_vision=m.supports_vision,
            supports_multimodal=m.supports_vision,
            supported_modalities=(
                [common_pb2.IMAGE, common_pb2.VIDEO] if m.supports_vision else []
            ),
            model_dtype="float32",
            multimodal_encoder_dtype="bfloat16",
        )

    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: Context
    ) -> pb.GetServerInfoResponse:
        server_args = struct_pb2.Struct()
        server_args.update({"model_path": self.model.model_path})
        scheduler_info = struct_pb2.Struct()
        scheduler_info.update({"shm_namespace_id": shm.namespace_id()})
        start = timestamp_pb2.Timestamp()
        start.FromSeconds(int(self.started))
        return pb.GetServerInfoResponse(
            server_args=server_args,
            scheduler_info=scheduler_info,
            active_requests=self.active_requests,
            uptime_seconds=self.uptime(),
            tokenspeed_version="toy",
            start_time=start,
        )

    async def GetLoads(self, request: pb.GetLoadsRequest, context: Context) -> pb.GetLoadsResponse:
        loads = []
        active = self.active_requests
        if not request.HasField("dp_rank") or request.dp_rank == 0:
            loads.append(
                pb.SchedulerLoad(
                    dp_rank=0,
                    num_running_reqs=active,
                    num_total_reqs=active,
                    max_running_requests=256,
                    active_token_usage=0.0,
                )
            )
        return pb.GetLoadsResponse(
            timestamp=self.timestamp(),
            version="tokenspeed",
            dp_rank_count=len(loads),
            loads=loads,
            aggregate=pb.AggregateMetrics(
                total_running_reqs=active if loads else 0, total_reqs=active if loads else 0
            ),
        )


def add_to_server(servicer: TokenSpeedToyServicer, server: grpc.aio.Server) -> None:
    """Register ``servicer`` with the zero-copy ``Generate`` deserializer (see
    :func:`smg_grpc_proto.testing.vllm.add_to_server`)."""
    add_service(server, servicer, SERVICE, tensor_methods=("Generate",))
