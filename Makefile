# Two entry points for a fresh machine: `make serve` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: serve test lint

# CPU torch comes from the wheel on local disk where there is no CUDA; with CUDA, pip picks torch.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	command -v nvidia-smi >/dev/null 2>&1 || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/lanes serve --drafter drafter/weights/smollm2-135m-instruct+ngram

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# two workers, a test file each at a time (module fixtures built once); one torch thread each
test: lint
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=30
