# Everyday targets. `make serve` and `make test` install what they need first.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install serve test test-fast bench check clean prometheus docs

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# --no-compile: pip would write bytecode for every file of torch, vLLM and transformers
	# (about 55 s here); Python writes it on first import for the modules that are used
	$(BIN)/pip install -q --no-compile -e '.[cpu,test]'
	# PyPI's torchvision/torchaudio/torchcodec break `import vllm` beside torch+cpu
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec || true
	$(BIN)/python -c "import vllm, engine_patches; print('vllm', vllm.__version__)"
	touch $(STAMP)

install: $(STAMP)

serve: install
	$(BIN)/opsctl serve

# Debian's prometheus (the console's --prometheus tests, the rules' promtool tests),
# prometheus-alertmanager (the alerts e2e) and prometheus-blackbox-exporter (the canary's
# tests): installed when missing and we are root; else their tests fail and say so
prometheus:
	@{ test -x /usr/bin/prometheus && test -x /usr/bin/prometheus-alertmanager \
	  && test -x /usr/bin/prometheus-blackbox-exporter; } \
	  || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	  --no-install-recommends prometheus prometheus-alertmanager \
	  prometheus-blackbox-exporter >/dev/null; } \
	  || echo "prometheus/alertmanager/blackbox exporter not installed (needs root and apt-get): their tests will fail" >&2

# Two tiers (tests/tiers.sh): every test without an engine on $(WORKERS) pytest-xdist
# workers first (a broken tree fails in minutes), then the engine tests one engine at a
# time (cheap modules first: tests/conftest.py orders them); each stops at its first
# failure, and the run ends with its engine starts and their seconds.
# 6 fast-tier workers: its tests mostly wait on subprocesses and sockets (fresh clone:
# 183 s with 4, 148 s with 6; 8 were no faster than 6 here)
WORKERS ?= 6
test: install prometheus
	bash tests/tiers.sh $(BIN)/python $(WORKERS)

# The inner loop: every test but those that start a real engine (under 3 minutes)
test-fast: install prometheus
	bash tests/tiers.sh $(BIN)/python $(WORKERS) fast

bench: install
	for f in benchmarks/*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

check: install
	$(BIN)/ruff check opsctl engine_patches tests benchmarks
	$(BIN)/ruff format --check opsctl engine_patches tests benchmarks
	$(BIN)/mypy opsctl/domain opsctl/suite/*/judge*.py opsctl/stacks/judge*.py opsctl/serve/judge*.py opsctl/console/judge*.py engine_patches

# docs/reference.md from every command's --help, and the README's pictures (docs/screens/)
docs: install
	$(BIN)/python docs/make_reference.py
	$(BIN)/python docs/screens/make.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
