# Every target sets up what it needs on a fresh machine: a virtual environment with torch,
# numpy, pytest, maturin and the linters (through uv, whose cache makes later set-ups fast), then the Rust
# extension built in release mode and installed in editable mode.

VENV    ?= .venv
PY      := $(VENV)/bin/python
DEPS    := $(VENV)/.deps-installed
# Real models the tests run against eager (tiny configs, nothing downloaded); expecttest for
# torch's own operator database (benchmarks/op_coverage.py); pytest-xdist for test-python's workers.
TEST_DEPS := "transformers>=4.55" torchvision timm expecttest "pytest-xdist>=3.6"
# test-python's worker processes: one per core, at most 4 (each imports torch and transformers,
# 1-2 GiB). A plain `pytest` stays one process.
TEST_WORKERS ?= $(shell python3 -c 'import os; print(min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 4))')
# Linters, bounded to a minor release so that a new release's checks do not fail a clean tree.
LINT_DEPS := "ruff>=0.17,<0.18" "mypy>=2.4,<2.5"
# zig links the release wheel against glibc 2.28 whatever the build machine's glibc (tested: 0.17.1).
WHEEL_DEPS := "ziglang>=0.13,<0.18"
RUST_TOOLS := $(VENV)/.rust-tools-installed
WHEEL_TOOLS := $(VENV)/.wheel-deps-installed
# The release wheel: the tag of torch's own Linux wheels (RHEL 8, Ubuntu 20.04 and later).
WHEEL_DIR ?= dist
MANYLINUX := manylinux_2_28
export VIRTUAL_ENV := $(abspath $(VENV))
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: all build wheel rust-crates lint test test-rust test-python demo bench bench-passes clean gpu-wheels

all: build

$(PY):
	python3 -m venv $(VENV)

$(DEPS): $(PY) pyproject.toml Makefile
	$(PY) -m pip install -q --upgrade uv
	$(VENV)/bin/uv pip install --python $(PY) "torch>=2.9" "optree>=0.13" numpy pytest "maturin>=1.9,<2" $(TEST_DEPS) $(LINT_DEPS)
	touch $(DEPS)

# clippy and rustfmt, where the toolchain comes from rustup (a distribution's cargo ships them).
$(RUST_TOOLS): $(PY)
	if command -v rustup >/dev/null; then rustup component add clippy rustfmt; fi
	touch $(RUST_TOOLS)

$(WHEEL_TOOLS): $(DEPS)
	$(VENV)/bin/uv pip install --python $(PY) $(WHEEL_DEPS)
	touch $(WHEEL_TOOLS)

build: $(DEPS)
	$(VENV)/bin/maturin develop --release --uv -q

# The crates a pass plugin builds against, as `cargo package` makes them for crates.io (workspace
# settings written into each Cargo.toml; it refuses, among others, an internal dependency without
# a version), unpacked into the package, whose wheel carries them (pyproject's include;
# thunder_rs.rust_crates_dir() and cargo_config() point a plugin's build at them). The folder
# crates/<name> is the package thunder_rs_<name>, unpacked into rust_crates/<name>.
RUST_CRATES := trace_ir passes plugin_abi
RUST_CRATES_DIR := python/thunder_rs/rust_crates
rust-crates:
	rm -rf $(RUST_CRATES_DIR) target/package/thunder_rs
	cargo package -q --no-verify --allow-dirty $(addprefix -p thunder_rs_,$(RUST_CRATES)) --target-dir target/package/thunder_rs
	for c in $(RUST_CRATES); do mkdir -p $(RUST_CRATES_DIR)/$$c && \
		tar -xzf target/package/thunder_rs/package/thunder_rs_$$c-*.crate --strip-components=1 -C $(RUST_CRATES_DIR)/$$c || exit 1; done

# Its own target directory, so that the zig-linked build and `make build`'s do not rebuild each other.
wheel: $(WHEEL_TOOLS) rust-crates
	$(VENV)/bin/maturin build --release --compatibility $(MANYLINUX) --zig --auditwheel check \
		--target-dir target/$(MANYLINUX) --out $(WHEEL_DIR)

# Static checks. stubtest imports the built extension; its config skips following imports (it
# compares names and signatures only, so torch's types add minutes and nothing checked).
lint: build $(RUST_TOOLS)
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m mypy.stubtest thunder_rs._core --mypy-config-file .ci/stubtest.ini
	$(VENV)/bin/mypy -p thunder_rs

# rust-crates: the crates still package (under a second).
test-rust: rust-crates
	cargo test --workspace --exclude thunder_rs_py

# loadfile: each test file runs whole in one worker, as it does alone (tests/test_ops.py's coverage
# check reads what the module's other tests reached; module fixtures are made once). loadgroup
# schedules thousands of one-test units in quadratic time (14,500 empty tests: 145 s against 65 s).
test-python: build
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test: build lint test-rust test-python

demo: build
	$(PY) examples/demo.py

bench: build
	$(PY) benchmarks/bench_forward.py
	$(PY) benchmarks/bench_train.py
	$(PY) benchmarks/host_overhead.py --quick --no-compile
	$(PY) benchmarks/import_time.py
	$(PY) benchmarks/dynamic_shapes.py

# What the GPU check carries (benchmarks/gpu_carry.py, ../shared/GPU.md), in gpu-carry/: the abi3
# thunder_rs wheel (manylinux_2_28 through zig, so that it loads wherever torch does; make wheel's
# build directory), nvFuser's wheel for torch 2.10 / CUDA 13 without its vendored NVRTC, and Lightning
# Thunder 0.2.6 with the requirements the GPU machine lacks. Prints its size: a GPU session carries
# 64 MiB with the working tree.
gpu-wheels: $(WHEEL_TOOLS) rust-crates
	rm -rf gpu-carry && mkdir -p gpu-carry
	$(VENV)/bin/maturin build --release -q --compatibility $(MANYLINUX) --zig --target-dir target/$(MANYLINUX) -o $(abspath gpu-carry)
	$(PY) benchmarks/gpu_check.py prepare gpu-carry
	du -sh gpu-carry

bench-passes:
	cargo run --release -p thunder_rs_passes --example pass_scaling

clean:
	cargo clean
	rm -rf $(VENV) $(RUST_CRATES_DIR)
