"""Reference TensorRT-LLM servicer (``trtllm.TrtllmService``) over the toy model.

Contract points it demonstrates:

* Multimodal requests carry encoded image files (``multimodal_input.image_data``), read with
  ``smg_grpc_proto.engines.trtllm.decode_mm_inputs``; the toy model folds the files' bytes into
  its output. A bad request is ``INVALID_ARGUMENT`` naming the field.
* ``max_tokens`` is a plain scalar that the gateway always sets; 0 is refused.
* Responses echo ``request_id``; chunks carry the delta with ``sequence_index`` and the
  cumulative ``completion_tokens``; ``complete.output_token_ids`` is always the whole output
  (cumulative, in both modes).
* Errors, aborts included, end the stream with a non-OK status: ``CANCELLED`` after ``Abort``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import grpc.aio

from smg_grpc_proto.generated import trtllm_service_pb2 as pb
from smg_grpc_proto.generated import trtllm_service_pb2_grpc as pb_grpc
from smg_grpc_proto.tensors import TensorMessage
from smg_grpc_proto.testing._base import Context, RejectedRequest, ToyEngineCore, add_service
from smg_grpc_proto.testing._toy import images_digest

__all__ = ["SERVICE", "TrtllmToyServicer", "add_to_server"]

SERVICE = pb.DESCRIPTOR.services_by_name["TrtllmService"]


class TrtllmToyServicer(ToyEngineCore, pb_grpc.TrtllmServiceServicer):
    """The toy model behind the TensorRT-LLM contract."""

    async def Generate(
        self,
        request: pb.GenerateRequest | TensorMessage[pb.GenerateRequest] | RejectedRequest,
        context: Context,
    ) -> AsyncIterator[pb.GenerateResponse]:
        received, message = await self.unwrap(context, request, pb.GenerateRequest)
        rid = message.request_id
        if not rid:
            await self.invalid(context, "request_id is empty; TensorRT-LLM requires one")
        prompt = await self.check_prompt(
            context, message.tokenized.input_token_ids, "tokenized.input_token_ids"
        )
        config = message.sampling_config
        n = max(config.num_return_sequences, config.beam_width)
        await self.check_sampling(
            context,
            n=n,
            n_field="sampling_config.num_return_sequences/beam_width",
            max_tokens=message.max_tokens,
            max_field="max_tokens",
        )
        digest = b""
        if message.HasField("multimodal_input"):
            adapter = await self.adapter(context, "trtllm")
            digest = await self.decode(
                context, rid, lambda: adapter.decode_mm_inputs(received), images_digest
            )
        output = self.model.generate(
            prompt, digest, max_tokens=message.max_tokens, ignore_eos=message.ignore_eos
        )
        run = await self.begin(context, rid, len(prompt))
        try:
            emitted: list[int] = []
            async for token in self.produce(run, output):
                emitted.append(token)
                if message.streaming:
                    yield pb.GenerateResponse(
                        request_id=rid,
                        chunk=pb.GenerateStreamChunk(
                            token_ids=[token],
                            sequence_index=0,
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
                    output_token_ids=emitted,
                    sequence_index=0,
                    finish_reason=output.finish_reason,
                    prompt_tokens=len(prompt),
                    completion_tokens=len(emitted),
                ),
            )
        finally:
            self.end(run)

    async def Embed(self, request: pb.EmbedRequest, context: Context) -> pb.EmbedResponse:
        if not request.HasField("tokenized"):
            await self.invalid(context, "tokenized is required for Embed")
        ids = await self.check_prompt(
            context, request.tokenized.input_token_ids, "tokenized.input_token_ids"
        )
        return pb.EmbedResponse(
            request_id=request.request_id, embedding=self.model.embed(ids), prompt_tokens=len(ids)
        )

    async def HealthCheck(
        self, request: pb.HealthCheckRequest, context: Context
    ) -> pb.HealthCheckResponse:
        return pb.HealthCheckResponse(status="OK")

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
            model_id=m.model_path,
            max_input_len=m.max_context_length - 1,
            max_seq_len=m.max_context_length,
            max_batch_size=256,
            vocab_size=m.vocab_size,
            supported_features=["multimodal"] if m.supports_vision else [],
        )

    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: Context
    ) -> pb.GetServerInfoResponse:
        return pb.GetServerInfoResponse(
            version="toy",
            backend="toy",
            tensor_parallel_size=1,
            pipeline_parallel_size=1,
            context_parallel_size=1,
            world_size=1,
        )


def add_to_server(servicer: TrtllmToyServicer, server: grpc.aio.Server) -> None:
    """Register ``servicer``. TensorRT-LLM requests carry no ``TensorData``; ``Generate`` still
    goes through the tensor codec's deserializer so every engine's handler sees the same
    request types."""
    add_service(server, servicer, SERVICE, tensor_methods=("Generate",))
