"""``python -m smg_grpc_proto.testing``: serve a reference servicer until interrupted.

Prints ``listening on HOST:PORT`` (the bound port, also with ``--port 0``) on stdout once the
server accepts calls, then serves until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from smg_grpc_proto.channel import MAX_MESSAGE_BYTES
from smg_grpc_proto.testing._server import ENGINES, make_servicer, serve
from smg_grpc_proto.testing._toy import ToyModel

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m smg_grpc_proto.testing",
        description="Serve a deterministic toy engine behind one engine's gRPC contract.",
    )
    parser.add_argument("--engine", required=True, choices=ENGINES)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = any free port (default)")
    parser.add_argument(
        "--model-dir",
        type=Path,
        help="Hugging Face model directory: config.json facts and the tokenizer files served "
        "by GetTokenizer",
    )
    parser.add_argument("--served-model-name", help="name reported by GetModelInfo")
    parser.add_argument(
        "--token-delay", type=float, default=0.0, help="seconds before each generated token"
    )
    parser.add_argument("--token-low", type=int, help="lowest generated token id")
    parser.add_argument("--token-high", type=int, help="one past the highest generated token id")
    parser.add_argument("--max-message-bytes", type=int, default=MAX_MESSAGE_BYTES)
    return parser


def _model(args: argparse.Namespace) -> ToyModel:
    overrides: dict[str, Any] = {"token_delay_s": args.token_delay}
    if args.served_model_name:
        overrides["served_model_name"] = args.served_model_name
    if args.token_low is not None:
        overrides["token_low"] = args.token_low
    if args.token_high is not None:
        overrides["token_high"] = args.token_high
    if args.model_dir is not None:
        if not args.model_dir.is_dir():
            raise ValueError(f"--model-dir {args.model_dir}: not a directory")
        return ToyModel.from_dir(args.model_dir, **overrides)
    return ToyModel().with_options(**overrides)


async def _serve(args: argparse.Namespace, model: ToyModel) -> None:
    servicer = make_servicer(args.engine, model)
    server, port = await serve(
        args.engine, servicer, args.port, args.host, max_message_bytes=args.max_message_bytes
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"listening on {host}:{port}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop(1.0)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and serve until interrupted; returns the exit
    code (0 after SIGINT/SIGTERM, 2 for bad arguments)."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        model = _model(args)
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    try:
        asyncio.run(_serve(args, model))
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
