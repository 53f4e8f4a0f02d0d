# Every target sets up what it needs on a fresh machine: a virtual environment with torch,
# numpy, pytest and maturin (through uv, whose cache makes later set-ups fast), then the Rust
# extension built in release mode and installed in editable mode.

VENV    ?= .venv
PY      := $(VENV)/bin/python
DEPS    := $(VENV)/.deps-installed
# Real models the tests run against eager (tiny configs, nothing downloaded); expecttest for
# torch's own operator database (benchmarks/op_coverage.py).
TEST_DEPS := "transformers>=4.55" torchvision expecttest
export VIRTUAL_ENV := $(abspath $(VENV))
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: all build test test-rust test-python demo bench bench-passes clean

all: build

$(PY):
	python3 -m venv $(VENV)

$(DEPS): $(PY) pyproject.toml
	$(PY) -m pip install -q --upgrade uv
	$(VENV)/bin/uv pip install --python $(PY) "torch>=2.9" "optree>=0.13" numpy pytest "maturin>=1.5,<2" $(TEST_DEPS)
	touch $(DEPS)

build: $(DEPS)
	$(VENV)/bin/maturin develop --release --uv -q

test-rust:
	cargo test --workspace --exclude thunder_rs_py

test-python: build
	$(PY) -m pytest -q

test: build test-rust test-python

demo: build
	$(PY) examples/demo.py

bench: build
	$(PY) benchmarks/bench_forward.py
	$(PY) benchmarks/bench_train.py

bench-passes:
	cargo run --release -p passes --example pass_scaling

clean:
	cargo clean
	rm -rf $(VENV)
