# syntax=docker/dockerfile:1
#
# headwise images (README.md, "Deploy"):
#   docker build -t headwise:gpu .                      # default target: gpu (the last stage)
#   docker build -t headwise:cpu --target cpu .
#   docker build -t headwise:export --target export .   # exports any model to a mounted folder
#   docker build -t headwise:cpu --target cpu --build-arg MODEL=BAAI/bge-small-en-v1.5 .
#
#   export  python:3.11-slim + CPU torch + the exporter: `headwise export` as its entrypoint
#   bundle  the export image run once at build time: MODEL (empty: the default model) -> /bundle
#   cpu     python:3.11-slim + onnxruntime + openvino + the bundle; no torch
#   gpu     CUDA 13 / cuDNN 9 runtime + onnxruntime-gpu + the bundle; no torch
#
# The serving images serve /bundle, baked in from MODEL; a bundle mounted at run time (a volume
# the export image wrote, or one exported elsewhere) replaces it: see README.md, "Serve your model".
#
# Where packages come from is up to the builder (README.md, "Behind a mirror or a proxy"):
#   TORCH_INDEX_URL  torch's index (default PyTorch's CPU index; empty: pip's own configuration)
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST, PIP_FIND_LINKS, PIP_CERT, PIP_CONSTRAINT
#                    pip's settings, for the install steps only (not kept in the images);
#   a pip.conf as a build secret: --secret id=pip.conf,src=PATH (credentials stay out of layers);
#   HTTP_PROXY, HTTPS_PROXY, NO_PROXY: the builders' predefined build arguments.
#
# Every install step is docker/install.sh, which CI runs as well (tests/deploy); `make image-test`
# builds and runs the images with podman.

# onnxruntime-gpu on PyPI: 1.19-1.26 are built for CUDA 12.x + cuDNN 9, 1.27 onwards for CUDA
# 13.x + cuDNN 9 (1.31.1: CUDA 13.0). A build runs on any runtime of the same CUDA major (NVIDIA
# minor-version compatibility), so the base is CUDA 13.0 + cuDNN 9, Ubuntu 24.04. The host needs
# an NVIDIA driver >= 580 (R580) for CUDA 13. For a fleet on an older driver (CUDA 12, >= 525):
#   --build-arg CUDA_IMAGE=nvidia/cuda:12.9.1-cudnn-runtime-ubuntu24.04 --build-arg ORT_GPU_VERSION=1.26.0
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04
ARG PYTHON_IMAGE=python:3.11-slim

# ---- the sources every install needs (and nothing else: .dockerignore keeps the context small)
FROM scratch AS source
COPY pyproject.toml README.md /src/
COPY docker/install.sh docker/export.sh /src/docker/
COPY models/ /src/models/
COPY export/ /src/export/
COPY service/ /src/service/

# ---- export: CPU torch + the exporter; writes a bundle for any model into a mounted folder ------
#   docker run --rm -v headwise-models:/models -e MODEL=ID_OR_DIR [-e REVISION=REV] headwise:export
FROM ${PYTHON_IMAGE} AS export
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ARG PIP_FIND_LINKS
ARG PIP_CERT
ARG PIP_CONSTRAINT
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
COPY --from=source /src /src
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf \
    TORCH_INDEX_URL=${TORCH_INDEX_URL} /src/docker/install.sh export /opt/export \
    && install -m 0755 /src/docker/export.sh /opt/export/bin/headwise-export \
    && rm -rf /src \
    && groupadd --system --gid 10001 headwise \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin headwise \
    && install -d -o 10001 -g 10001 /models
# HOME and the Hub's cache in /tmp: the user has no home, and the root filesystem may be read-only.
ENV PATH=/opt/export/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    HF_HOME=/tmp/huggingface
USER 10001:10001
ENTRYPOINT ["headwise-export"]
CMD ["--out", "/models/bundle", "--fp16", "--int8"]

# ---- bundle: the export image, run at build time on MODEL (a Hub id; empty: the default model)
FROM export AS bundle
ARG MODEL=
ARG REVISION=
RUN MODEL=${MODEL} REVISION=${REVISION} headwise-export --out /models/bundle --fp16 --int8

# ---- cpu: onnxruntime, no torch ---------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS cpu-build
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ARG PIP_FIND_LINKS
ARG PIP_CERT
ARG PIP_CONSTRAINT
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=source /src /src
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf \
    /src/docker/install.sh cpu /opt/headwise

FROM ${PYTHON_IMAGE} AS cpu
RUN groupadd --system --gid 10001 headwise \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin headwise
COPY --from=cpu-build /opt/headwise /opt/headwise
COPY --from=bundle /models/bundle /bundle
COPY docker/healthcheck.py /opt/headwise/healthcheck.py
ENV PATH=/opt/headwise/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HEADWISE_HOST=0.0.0.0 \
    HEADWISE_PORT=8000 \
    HEADWISE_BUNDLE=/bundle \
    HEADWISE_DEVICE=cpu
USER 10001:10001
EXPOSE 8000
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python", "/opt/headwise/healthcheck.py"]
ENTRYPOINT ["headwise", "serve"]

# ---- gpu: CUDA + cuDNN runtime, onnxruntime-gpu, no torch ---------------------------------------
FROM ${CUDA_IMAGE} AS gpu-base
# Ubuntu's python3 (3.12 on 24.04); versions are the distribution's, fixed by the pinned base tag.
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*

FROM gpu-base AS gpu-build
ARG ORT_GPU_VERSION=1.31.1
# Empty on the CUDA base. "cuda,cudnn" on a base without CUDA: onnxruntime-gpu's extras bring
# the CUDA runtime and cuDNN as pip wheels (nvidia-*), about 3 GB more.
ARG ORT_GPU_EXTRAS=
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ARG PIP_FIND_LINKS
ARG PIP_CERT
ARG PIP_CONSTRAINT
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=source /src /src
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf \
    ORT_GPU_VERSION=${ORT_GPU_VERSION} ORT_GPU_EXTRAS=${ORT_GPU_EXTRAS} \
    /src/docker/install.sh gpu /opt/headwise

FROM gpu-base AS gpu
RUN groupadd --system --gid 10001 headwise \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin headwise
COPY --from=gpu-build /opt/headwise /opt/headwise
# With ORT_GPU_EXTRAS the CUDA runtime and cuDNN are pip wheels (site-packages/nvidia/*/lib), where
# the dynamic loader does not look: ldconfig learns their folders. None on the CUDA base.
RUN find /opt/headwise -path '*/site-packages/nvidia/*/lib' -type d > /etc/ld.so.conf.d/headwise-nvidia.conf \
    && ldconfig
COPY --from=bundle /models/bundle /bundle
COPY docker/healthcheck.py /opt/headwise/healthcheck.py
ENV PATH=/opt/headwise/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HEADWISE_HOST=0.0.0.0 \
    HEADWISE_PORT=8000 \
    HEADWISE_BUNDLE=/bundle \
    HEADWISE_DEVICE=auto
USER 10001:10001
EXPOSE 8000
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python", "/opt/headwise/healthcheck.py"]
ENTRYPOINT ["headwise", "serve"]
