#!/bin/bash
# bench/device/site.sh: what a lent machine lacks to run bench.runtimes and bench.streams, packed
# into .devbench/ (ignored by git; name it in the device tool's `carry`). That machine's image has
# Python 3.12 with numpy, tokenizers, onnx, onnxruntime, httpx, uvloop and psutil, and reaches no
# registry: the service's other packages travel as one archive, OpenVINO stripped to its CPU
# plugin and ONNX reader (59 MB of wheel -> 24 MB with the rest), and the bundle's encoder packed
# with int8-rounded weights (bench/device/pack.py). Then, there: bash bench/device/run.sh STEPS
set -euo pipefail
bundle=${1:-bundles/bench}; out=.devbench; wheels=$(mktemp -d); site=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 -d "$wheels" \
  openvino==2026.4.1 openvino-telemetry fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 \
  pydantic-core==2.50.5 pydantic-settings==2.16.3 uvicorn==0.55.0 httptools==0.9.0 orjson==3.13.0 \
  python-dotenv annotated-types typing-inspection typing-extensions opentelemetry-api \
  importlib-metadata zipp anyio annotated-doc
for w in "$wheels"/*.whl; do unzip -qo "$w" -d "$site"; done
libs=$site/openvino/libs
rm -f "$libs"/libopenvino_intel_{gpu,npu}_plugin.so "$libs"/cache.json \
  "$libs"/libopenvino_{tensorflow,pytorch,paddle,gguf,tensorflow_lite,jax}_frontend.so*
rm -rf "$site"/openvino/include "$site"/openvino/frontend/{pytorch,tensorflow,paddle,jax,tensorflow_lite}
find "$site" -name '*.pyi' -delete
mkdir -p "$out"
tar -cJf "$out/site.tar.xz" -C "$site" .
.venv/bin/python -m bench.device.pack "$bundle" "$out/pack"
rm -rf "$wheels" "$site"
du -sh "$out"
