#!/usr/bin/env bash
# The engine built with AddressSanitizer + UndefinedBehaviorSanitizer, run over the corpus of
# corrupted model files and the test suite (llama.cpp itself stays the uninstrumented build that
# llama-cpp-python installed: instrumenting it too would mean rebuilding it, about 10 minutes more).
#
#   bash scripts/sanitize.sh [pytest args...]      (default: the whole test suite but the sandbox's)
#
# Swaps the installed extension for the sanitized one for the run and puts it back afterwards.
# Last result: bench/HISTORY.md, "Sanitizers".
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$PWD/.venv/bin/python"
B=build/sanitize
SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython_EXECUTABLE="$PY" -DPython_FIND_VIRTUALENV=ONLY \
    -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" \
    -DCMAKE_C_FLAGS="$SAN" -DCMAKE_CXX_FLAGS="$SAN" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$B" --target _cospec >/dev/null
SO=$("$PY" -c 'import cospec_local._cospec as c; print(c.__file__)')
cp "$SO" "$SO.unsanitized"
trap 'mv "$SO.unsanitized" "$SO"' EXIT
cp "$B"/_cospec*.so "$SO"
export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export COSPEC_CORPUS_MEMORY_LIMIT=0  # ASan reserves terabytes of address space: no RLIMIT_AS
"$PY" -c 'import cospec_local; print("sanitized:", cospec_local.native_version())'
"$PY" tests/gguf_corpus.py --out build/sanitize-corpus
"$PY" tests/gguf_corpus.py --out build/sanitize-corpus-arbiters --arbiters
# The sandbox tests run no engine code, and procps tools (pgrep) deadlock under the preloaded
# ASan runtime that every child process inherits: they run in the normal suite only.
if [ $# -eq 0 ]; then
    set -- tests --ignore=tests/test_sandbox.py --ignore=tests/test_sandbox_escapes.py
fi
"$PY" -m pytest -q -p no:cacheprovider "$@"
