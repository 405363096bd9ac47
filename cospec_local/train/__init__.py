"""Training: the bundled pairs' recipes and the learned arbiter (install with the `train` extra).

    python -m cospec_local.train.collect ...    branch-oracle states of the draft/target pair (engine only)
    python -m cospec_local.train.warmup ...     supervised warm-up of both arbiters, then export
    python -m cospec_local.train.demo_pair ...  the demo pair's recipe
    python -m cospec_local.train.distill_draft ...  SmolLM2's distilled draft

Data collection runs the native engine in its own process: in a process where torch has run a
multi-threaded op, llama.cpp decodes about 8x slower (docs/python-api.md, "Threads"). Nothing
here imports torch at package import time.
"""
