#!/usr/bin/env bash
# GPU checks of speculation's real costs (bench/RESULTS.md), for the CUDA kit of the project's
# GPU notes: after its prepare.sh, `cp scripts/gpu_check.sh .gpu/check.sh`, then run the kit.
# $1: folder with proj/ (and optionally smollm2.gguf, SmolLM2-135M Q4_1) and bin/ (llama.cpp
# tools); $2: output folder. Each step has its own time limit; about 7 minutes in all. The verify-pass
# invariant test runs where pytest is installed (`pip download -d .gpu pytest` puts its wheels in the kit).
D=$1; O=$2
DT=$D/proj/cospec_local/data/demo/demo-target-q8_0.gguf; DD=$D/proj/cospec_local/data/demo/demo-draft-q8_0.gguf
SD=$(find $D/proj/cospec_local/data -name 'smollm2-135m-draft*.gguf' | head -1)
S=$D/smollm2.gguf; [ -f "$S" ] || S=$SD     # without SmolLM2 itself, its draft drafts for itself
BIG=$D/as8b.gguf                           # S's exact function at an 8B model's cost per token
CHAT=$D/proj/bench/heldout_chat_prompts.txt
CL="python3 -m cospec_local.cli"
step() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); echo "== $name"; timeout "$lim" "$@" > "$O/$name.out" 2> "$O/$name.err"; local rc=$?; echo "   rc=$rc $(( $(date +%s) - t0 )) s"; tail -25 "$O/$name.out"; [ $rc = 0 ] || tail -8 "$O/$name.err"; }
cd $D/proj
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv
if python3 -c "import pytest" 2>/dev/null; then   # emitted tokens are the verify pass's greedy choices
  step verify_invariant 120 python3 -m pytest -q -p no:cacheprovider tests/test_greedy_identity.py -k "verify_passs_choices and demo"
fi
step demo_fixed 90 $CL bench -m "$DT" -md "$DD" --draft-max 1,2,4 --modes target-only,sps -n 64 --repeat 2
step demo_adaptive 60 $CL bench -m "$DT" -md "$DD" --draft-max 8 --adaptive-draft --modes target-only,sps -n 64 --repeat 3
step smol_fixed 90 $CL bench -m "$S" -md "$SD" --chat --prompts "$CHAT" --draft-max 1,2,4 --modes target-only,sps -n 64
step smol_adaptive 60 $CL bench -m "$S" -md "$SD" --chat --prompts "$CHAT" --draft-max 8 --adaptive-draft --modes target-only,sps -n 64
step make_big 120 python3 bench/costly_target.py "$S" "$BIG" --size 8b
step big_fixed 120 $CL bench -m "$BIG" -md "$S" --draft-max 1,4,8,16 --modes target-only,sps -n 64
step big_adaptive 60 $CL bench -m "$BIG" -md "$S" --draft-max 16 --adaptive-draft --modes target-only,sps -n 64
# compare_llama_cpp_gpu.py is the kit's own (copied beside proj/ by its run.sh)
step loop_vs_llama 150 python3 $D/compare_llama_cpp_gpu.py --bin $D/bin --pairs "$S:$SD,$DT:$DD,$BIG:$S" --k 4 --runs 3 --ngl 99
echo ALL-DONE
