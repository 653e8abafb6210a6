"""Reference SGLang servicer (``sglang.grpc.scheduler.SglangScheduler``) over the toy model.

Contract points it demonstrates:

* ``Generate`` decodes ``mm_inputs`` (inline ``pixel_values``, ``model_specific_tensors``,
  ``mm_placeholders``, ``im_token_id``) with ``smg_grpc_proto.engines.sglang.
  decode_mm_inputs``; a decoding error is ``INVALID_ARGUMENT`` naming the field.
* Every response echoes ``request_id``. Chunks carry the token delta and *running totals*
  (``completion_tokens`` counts all tokens so far, unlike vLLM). The ``complete`` message
  holds every token without streaming; with streaming the chunks are the source of the output
  and ``output_ids`` is left empty.
* ``finish_reason`` is ``"stop"`` (with ``matched_token_id`` = the EOS the toy model "emitted",
  stripped from the output as SGLang does), ``"length"`` or ``"abort"`` after ``Abort``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc.aio
from google.protobuf import struct_pb2, timestamp_pb2

from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc
from smg_grpc_proto.tensors import TensorMessage
from smg_grpc_proto.testing._base import Context, RejectedRequest, ToyEngineCore, add_service
from smg_grpc_proto.testing._toy import ToyModel, mm_digest

__all__ = ["SERVICE", "SglangToyServicer", "add_to_server"]

SERVICE = pb.DESCRIPTOR.services_by_name["SglangScheduler"]


class SglangToyServicer(ToyEngineCore, pb_grpc.SglangSchedulerServicer):
    """The toy model behind the SGLang contract."""

    def __init__(self, model: ToyModel | None = None, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self._adapters: dict[str, pb.LoadedLoRAAdapter] = {}

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
            adapter = await self.adapter(context, "sglang")
            digest = await self.decode(
                context, message.request_id, lambda: adapter.decode_mm_inputs(received), mm_digest
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
            finish = "abort" if run.aborted.is_set() else output.finish_reason
            complete = pb.GenerateComplete(
                output_ids=[] if message.stream else emitted,
                finish_reason=finish,
                prompt_tokens=len(prompt),
                completion_tokens=len(emitted),
            )
            if finish == "stop" and self.model.eos_token_ids:
                complete.matched_token_id = self.model.eos_token_ids[0]
            yield pb.GenerateResponse(request_id=rid, complete=complete)
        finally:
            self.end(run)

    async def Embed(self, request: pb.EmbedRequest, context: Context) -> pb.EmbedResponse:
        if not request.HasField("tokenized"):
            await self.invalid(context, "tokenized is required for Embed")
        ids = await self.check_prompt(context, request.tokenized.input_ids, "tokenized.input_ids")
        vector = self.model.embed(ids)
        return pb.EmbedResponse(embedding=vector, embedding_dim=len(vector), prompt_tokens=len(ids))

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
            is_generation=True,
            served_model_name=m.served_model_name,
            max_context_length=m.max_context_length,
            vocab_size=m.vocab_size,
            supports_vision=m.supports_vision,
            model_type=m.model_type,
            eos_token_ids=m.eos_token_ids,
            pad_token_id=m.pad_token_id,
            bos_token_id=m.bos_token_id,
            max_req_input_len=m.max_context_length - 1,
            architectures=m.architectures,
        )

    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: Context
    ) -> pb.GetServerInfoResponse:
        server_args = struct_pb2.Struct()
        server_args.update(
            {"model_path": self.model.model_path, "served_model_name": self.model.served_model_name}
        )
        scheduler_info = struct_pb2.Struct()
        scheduler_info.update({"max_running_requests": 256})
        start = timestamp_pb2.Timestamp()
        start.FromSeconds(int(self.started))
        return pb.GetServerInfoResponse(
            server_args=server_args,
            scheduler_info=scheduler_info,
            active_requests=self.active_requests,
            last_receive_timestamp=self.last_receive,
            uptime_seconds=self.uptime(),
            sglang_version="toy",
            server_type="grpc",
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
                )
            )
        return pb.GetLoadsResponse(
            timestamp=self.timestamp(),
            version="toy",
            dp_rank_count=len(loads),
            loads=loads,
            aggregate=pb.AggregateMetrics(
                total_running_reqs=active if loads else 0, total_reqs=active if loads else 0
            ),
        )

    # -- LoRA: bookkeeping only (the toy model has no weights) -----------------------------
    async def LoadLoRAAdapter(
        self, request: pb.LoadLoRAAdapterRequest, context: Context
    ) -> pb.LoadLoRAAdapterResponse:
        if not request.lora_name:
            await self.invalid(context, "lora_name is empty")
        lora_id = request.lora_id or request.lora_name
        self._adapters[lora_id] = pb.LoadedLoRAAdapter(
            lora_id=lora_id,
            lora_name=request.lora_name,
            lora_path=request.lora_path,
            pinned=request.pinned,
        )
        return pb.LoadLoRAAdapterResponse(
            success=True, message=f"loaded {lora_id!r}", loaded_lora_ids=sorted(self._adapters)
        )

    async def UnloadLoRAAdapter(
        self, request: pb.UnloadLoRAAdapterRequest, context: Context
    ) -> pb.UnloadLoRAAdapterResponse:
        lora_id = request.lora_id or next(
            (k for k, v in self._adapters.items() if v.lora_name == request.lora_name), ""
        )
        removed = self._adapters.pop(lora_id, None) is not None
        return pb.UnloadLoRAAdapterResponse(
            success=removed,
            message=f"unloaded {lora_id!r}" if removed else "no such adapter",
            loaded_lora_ids=sorted(self._adapters),
        )

    async def ListLoadedLoRAAdapters(
        self, request: pb.ListLoadedLoRAAdaptersRequest, context: Context
    ) -> pb.ListLoadedLoRAAdaptersResponse:
        return pb.ListLoadedLoRAAdaptersResponse(
            loaded_adapters=[self._adapters[k] for k in sorted(self._adapters)]
        )


def add_to_server(servicer: SglangToyServicer, server: grpc.aio.Server) -> None:
    """Register ``servicer`` with the zero-copy ``Generate`` deserializer (see
    :func:`smg_grpc_proto.testing.vllm.add_to_server`)."""
    add_service(server, servicer, SERVICE, tensor_methods=("Generate",))
