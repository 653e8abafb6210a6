"""The ``smg-proto`` command: argument parsing only; the work is done by the library modules.

    smg-proto compat --against smg-grpc-proto==0.4.28 --level wire-json --format github
    smg-proto preprocess photos/ --family qwen2_vl --out pixels.safetensors
    smg-proto demo [IMAGE ...]

Each subcommand registers itself through a ``add_<name>_parser`` function that sets its
``handler``; add new subcommands the same way in :func:`build_parser`.
Exit codes: 0 success (compatible), 1 breaking changes found, 2 usage or input error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from smg_grpc_proto._families import FAMILIES
from smg_grpc_proto.compat import CompatError, check, load_schema
from smg_grpc_proto.compat._model import LEVELS
from smg_grpc_proto.compat.config import CompatConfig, find_config, load_config
from smg_grpc_proto.compat.report import FORMATS, Report, path_prefix, render
from smg_grpc_proto.compat.sources import find_protos, packaged_descriptors, schema_dir

EXIT_OK, EXIT_BREAKING, EXIT_ERROR = 0, 1, 2

# `preprocess` imports smg_grpc_proto.vision (the native module) only when it runs, so that
# `compat` stays pure Python: the families come from the generated, pure-Python
# smg_grpc_proto._families (scripts/gen_families.py); EXPORT_FORMATS mirrors
# vision._export.FORMATS (tests/vision/test_preprocess_cli.py checks that they agree).
PREPROCESS_FAMILIES = FAMILIES
EXPORT_FORMATS = ("safetensors", "npz")

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="smg-proto",
        description="Tools for the smg-grpc-proto schemas.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_compat_parser(commands)
    add_preprocess_parser(commands)
    add_demo_parser(commands)
    return parser


def add_compat_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "compat",
        help="check the schemas for breaking changes against a reference (buf's rules)",
        description=(
            "Compare the current schemas (the protos/ directory here, --protos DIR, or the "
            "installed package's descriptors) with a reference and report breaking changes with "
            "buf's rule ids. Exit code 0: compatible, 1: breaking, 2: usage or input error."
        ),
    )
    p.add_argument(
        "--against",
        required=True,
        metavar="REF",
        help="the reference: a directory of .proto files, a FileDescriptorSet (.binpb/.pb), "
        "a wheel (.whl), a requirement such as smg-grpc-proto==0.4.28, or a git revision",
    )
    p.add_argument(
        "--level",
        choices=LEVELS,
        default="wire",
        help="strictness, as buf's categories: wire ⊂ wire-json ⊂ package ⊂ file "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="text, json, or github (GitHub Actions annotations) (default: %(default)s)",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="TOML file with ignore / ignore_only / except (default: [tool.smg-proto.compat] "
        "of the pyproject.toml next to the protos directory)",
    )
    p.add_argument(
        "--protos",
        metavar="DIR",
        help="the current schema directory (default: ./protos, else the installed package)",
    )
    p.set_defaults(handler=run_compat)


def run_compat(args: argparse.Namespace) -> int:
    protos = schema_dir(Path(args.protos)) if args.protos else find_protos()
    current = load_schema(protos) if protos is not None else packaged_descriptors()
    against = load_schema(args.against, repo=protos)
    config: CompatConfig | None
    if args.config:
        config = load_config(Path(args.config))
    else:
        config = find_config(protos) if protos is not None else None
    findings = check(
        current, against, level=args.level, ignore=config.as_ignore() if config else None
    )
    prefix = path_prefix(protos, repository_relative=args.format == "github")
    report = Report(findings, args.level, args.against, prefix)
    sys.stdout.write(render(report, args.format))
    return EXIT_BREAKING if findings else EXIT_OK


def add_preprocess_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "preprocess",
        help="run an image processor over images and write the tensors (safetensors or npz)",
        description=(
            "Run smg_grpc_proto.vision.ImageProcessor over the images (a directory expands to "
            "its image files, sorted) and write pixel_values, the side tensors and "
            "num_image_tokens to --out. Exit code 0: written, 2: usage or input error."
        ),
    )
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files or directories")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", metavar="FILE", help="a transformers preprocessor_config.json")
    source.add_argument(
        "--model-dir",
        metavar="DIR",
        help="a local model directory holding preprocessor_config.json",
    )
    source.add_argument(
        "--family",
        metavar="NAME",
        help="a model family's defaults: " + ", ".join(PREPROCESS_FAMILIES),
    )
    p.add_argument("--out", required=True, metavar="FILE", help="the output file")
    p.add_argument(
        "--format",
        choices=EXPORT_FORMATS,
        default=None,
        help="output format (default: npz for a .npz file, else safetensors)",
    )
    p.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="worker threads (default: every core the work pays for)",
    )
    p.add_argument(
        "--progress",
        action="store_true",
        default=None,
        help="draw the progress bar on stderr even when it is not a terminal",
    )
    p.set_defaults(handler=run_preprocess)


def run_preprocess(args: argparse.Namespace) -> int:
    from smg_grpc_proto.errors import NativeCoreUnavailableError
    from smg_grpc_proto.vision import _cli

    try:
        _cli.run(
            args.images,
            out=args.out,
            format=args.format,
            config=args.config,
            model_dir=args.model_dir,
            family=args.family,
            threads=args.threads,
            progress=args.progress,
        )
    except (_cli.PreprocessError, NativeCoreUnavailableError) as exc:
        print(f"smg-proto preprocess: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def add_demo_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "demo",
        help="a photo through the Qwen2-VL vLLM contract over loopback gRPC, timed",
        description=(
            "Start the reference vLLM servicer on 127.0.0.1, preprocess the bundled photo (or "
            "IMAGE files) for Qwen2-VL in Rust, send the request inline and through shared "
            "memory, and print what the engine decoded with each stage's time next to "
            "transformers' processor + naive protobuf. Exit 1 if any check fails."
        ),
    )
    p.add_argument("images", nargs="*", type=Path, metavar="IMAGE", help="encoded image files")
    p.add_argument("--repeat", type=int, default=5, help="timed runs per stage (median)")
    p.set_defaults(handler=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    from smg_grpc_proto import demo
    from smg_grpc_proto.errors import SmgProtoError

    if args.repeat < 1:
        print("smg-proto demo: error: --repeat must be at least 1", file=sys.stderr)
        return EXIT_ERROR
    try:
        return demo.main(args.images, repeat=args.repeat)
    except (OSError, SmgProtoError) as exc:
        print(f"smg-proto demo: error: {exc}", file=sys.stderr)
        return EXIT_ERROR


def main(argv: list[str] | None = None) -> int:
    """Run ``smg-proto``; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help exits 0, usage errors exit 2
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    handler: Handler = args.handler
    try:
        return handler(args)
    except CompatError as exc:
        print(f"smg-proto {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"smg-proto {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
