#!/usr/bin/env bash
# Target-only tokens/s of a fresh `generate` process against llama-bench's tg128, both at their
# defaults (weight repacking on), same file and threads, alternating five times.
set -euo pipefail
G=$(.venv/bin/python -c "from cospec_local.models import resolve_model; print(resolve_model('gemma3-270m'))")
for i in 1 2 3 4 5; do
    build/llama-tools/llama-bench -m "$G" -p 0 -n 128 -t 2 -r 1 -o jsonl
    .venv/bin/cospec-local generate -m gemma3-270m --mode target-only -p "Once upon a time, in a small village by the sea," \
        -n 128 --ignore-eos -t 2 --json | .venv/bin/python -c "import json,sys; d=json.load(sys.stdin); print(json.dumps({'engine_tps': d['stats']['predicted_per_second'], 'n': d['stats']['predicted_n']}))"
done
