# syntax=docker/dockerfile:1
#
# headwise images (README.md, "Deploy"):
#   docker build -t headwise:gpu .                 # default target: gpu (the last stage)
#   docker build -t headwise:cpu --target cpu .
#
#   export  python:3.11-slim + CPU torch: runs `headwise export` once, at build time
#   cpu     python:3.11-slim + onnxruntime       + the bundle; no torch
#   gpu     CUDA 13 / cuDNN 9 runtime + onnxruntime-gpu + the bundle; no torch
#
# Every install step is docker/install.sh, which CI runs as well (tests/deploy), since CI
# cannot build images. The serving stages copy a finished virtualenv from a build stage.

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
COPY docker/install.sh /src/docker/
COPY models/ /src/models/
COPY export/ /src/export/
COPY service/ /src/service/

# ---- export: the default model -> /bundle (fp32 + fp16 for the GPU + int8 for the CPU) -------
FROM ${PYTHON_IMAGE} AS export
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
COPY --from=source /src /src
RUN /src/docker/install.sh export /opt/export \
    && /opt/export/bin/headwise export --out /bundle --fp16 --int8

# ---- cpu: onnxruntime, no torch ---------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS cpu-build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=source /src /src
RUN /src/docker/install.sh cpu /opt/headwise

FROM ${PYTHON_IMAGE} AS cpu
RUN groupadd --system --gid 10001 headwise \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin headwise
COPY --from=cpu-build /opt/headwise /opt/headwise
COPY --from=export /bundle /bundle
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
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=source /src /src
RUN ORT_GPU_VERSION=${ORT_GPU_VERSION} /src/docker/install.sh gpu /opt/headwise

FROM gpu-base AS gpu
RUN groupadd --system --gid 10001 headwise \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin headwise
COPY --from=gpu-build /opt/headwise /opt/headwise
COPY --from=export /bundle /bundle
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
