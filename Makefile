# smg-grpc-proto developer commands. `make help` lists them; `make test` is exactly what CI runs.
PYTHON ?= python3
CARGO  ?= cargo
PIP    := $(PYTHON) -m pip
WHEEL_DIR := dist
# Release snapshots of the schema; the newest (by version number) is the compat reference.
RELEASES ?= protos/releases
LATEST_RELEASE = $(shell ls $(RELEASES) 2>/dev/null \
	| sed -n 's/^\([0-9]*\.[0-9]*\.[0-9]*\)\.binpb$$/\1/p' | sort -t. -k1,1n -k2,2n -k3,3n | tail -n 1)
RELEASE_ARGS ?=
# The contributor loop (`make dev`, `make check`): a virtualenv that sees the system's packages,
# with the extension built in place (editable: Python edits need no rebuild).
VENV ?= .venv
VPY  := $(VENV)/bin/python
# The fast test selection of `make check`; `make pytest` (CI) runs everything.
# maturin's flags for the native wheel (= NATIVE_WHEEL_FLAGS of scripts/release.py): zig, from the
# `ziglang` package of the test group, compiles the bundled C libraries and links against glibc
# 2.28, so the wheel is manylinux_2_28_x86_64 whatever this machine's glibc.
NATIVE_WHEEL_FLAGS := --zig --compatibility manylinux_2_28
FAST_TESTS ?= -m "not slow"
# torch for the tests that run a real peer needing it (tests/remote: the servicer's puller).
TORCH_VENV ?= $(or $(SMG_TEST_CACHE),.cache)/torch-venv

.DEFAULT_GOAL := test

.PHONY: pytest-fallback system-deps help deps wheel install demo gen gen-check compat lint typecheck rust-test pytest test \
	release clean dev check

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

system-deps: ## cmake, nasm (to build the bundled libjpeg-turbo), jpegtran (progressive JPEG tests); apt if missing
	@command -v cmake >/dev/null && command -v nasm >/dev/null && command -v jpegtran >/dev/null || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake nasm libjpeg-turbo-progs; }

# NIXL for tests/remote goes in with --no-deps: nixl-cu12 declares torch (and with it the CUDA
# wheels) although its host-memory API never imports it. Same version range as the [nixl] extra.
deps: system-deps ## install the test and lint tools (pip >= 25.1 for dependency groups)
	$(PIP) install --quiet --disable-pip-version-check "pip>=25.1"
	$(PIP) install --quiet --disable-pip-version-check --group test
	$(PIP) install --quiet --disable-pip-version-check --no-deps "nixl-cu12>=1.5,<2"
	@# smg-grpc-servicer's RdmaPixelPuller (a real peer of tests/remote) needs torch: its own venv,
	@# kept apart from the test environment (torch is not a dependency of ours).
	test -x $(TORCH_VENV)/bin/python || $(PYTHON) -m venv $(TORCH_VENV)
	$(PYTHON) -m uv pip install --quiet --python $(TORCH_VENV)/bin/python "torch==2.14.1" "numpy>=1.26"

wheel: system-deps ## build the abi3 wheel (manylinux_2_28: zig against glibc 2.28) into dist/
	rm -rf $(WHEEL_DIR)
	CARGO_ZIGBUILD_PYTHON_PATH="$$($(PYTHON) -c 'import sys; print(sys.executable)')" \
		$(PYTHON) -m maturin build --release --quiet $(NATIVE_WHEEL_FLAGS) --out $(WHEEL_DIR)

install: deps wheel ## build the wheel and install it (with the [dataclasses] extra)
	$(PIP) install --quiet --disable-pip-version-check --force-reinstall \
		"$$(ls $(WHEEL_DIR)/smg_grpc_proto-*.whl)[dataclasses]"

demo: install ## the main job: a photo -> Qwen2-VL -> vLLM request over loopback gRPC, timed
	$(PYTHON) -m smg_grpc_proto.cli demo

gen: ## regenerate stubs, shipped protos and dataclasses from protos/
	$(PYTHON) scripts/gen_stubs.py

gen-check: ## fail if the generated files are stale
	$(PYTHON) scripts/gen_stubs.py --check

compat: ## check protos/ against the last release (protos/releases/<latest>.binpb)
	@test -n "$(LATEST_RELEASE)" || { echo "no <X.Y.Z>.binpb in $(RELEASES)" >&2; exit 1; }
	$(PYTHON) -m smg_grpc_proto.cli compat --against $(RELEASES)/$(LATEST_RELEASE).binpb --protos protos

lint: ## ruff (check + format) on Python, fmt + clippy on Rust
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	cd rust && $(CARGO) fmt --check
	cd rust && $(CARGO) clippy --all-targets --features python --quiet -- -D warnings

typecheck: ## mypy --strict on the hand-written code and examples; stubtest on _native
	$(PYTHON) -m mypy
	cd /tmp && $(PYTHON) -m mypy.stubtest smg_grpc_proto._native

rust-test: ## the crate's own tests (no Python), and the fuzz targets still compile (they run on nightly)
	cd rust && $(CARGO) test --quiet
	cd rust/fuzz && CARGO_TARGET_DIR=../target $(CARGO) check --bins --quiet

pytest-fallback: ## the tensor tests again with the pure-numpy kernels (SMG_GRPC_PROTO_NATIVE=0)
	SMG_GRPC_PROTO_NATIVE=0 $(PYTHON) -m pytest -q -p no:cacheprovider tests/tensors/test_tensors.py \
		tests/tensors/test_tensor_frames.py tests/test_shm.py -k "not native and not gil"

pytest: ## the Python test suite against the installed wheel (no tests collected = failure)
	$(PYTHON) -m pytest; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

test: install compat lint typecheck rust-test pytest pytest-fallback ## everything CI runs

$(VPY):
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(VPY) -m pip install --quiet --disable-pip-version-check "pip>=25.1"
	$(VPY) -m pip install --quiet --disable-pip-version-check --group test
	@# maturin's entry point looks for its binary next to the running interpreter: its own copy.
	$(VPY) -m pip install --quiet --disable-pip-version-check --ignore-installed "maturin>=1.7,<2"

dev: system-deps $(VPY) ## contributor build: the extension in place in .venv ('fast' profile: seconds after an edit)
	VIRTUAL_ENV=$(abspath $(VENV)) $(VPY) -m maturin develop --profile fast --quiet --extras dataclasses

check: ## after `make dev`: lint, types and the fast tests in .venv (under two minutes)
	@test -x $(VPY) || { echo "run 'make dev' first" >&2; exit 1; }
	$(MAKE) --no-print-directory lint typecheck PYTHON=$(abspath $(VPY))
	$(VPY) -m pytest -q -p no:cacheprovider $(FAST_TESTS)

release: ## dry run of a release (RELEASE_ARGS="--bump minor", "--execute --repository-url URL")
	$(PYTHON) scripts/release.py $(RELEASE_ARGS)

clean: ## remove build outputs and caches
	rm -rf $(WHEEL_DIR) rust/target .pytest_cache .mypy_cache .ruff_cache .hypothesis
