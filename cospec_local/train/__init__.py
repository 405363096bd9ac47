"""Training the learned arbiter (install with the `train` extra).

    cospec-local arbiter train ...              the whole recipe for a user's pair and tasks (arbiter_recipe.py)
    python -m cospec_local.train.collect ...    branch-oracle states of the draft/target pair (engine only)
    python -m cospec_local.train.warmup ...     supervised warm-up of both arbiters, then export
    python -m cospec_local.train.grpo ...       the optional GRPO stage
    python -m cospec_local.train.fit_gate ...   a domain gate for an arbiter
    python -m cospec_local.train.ship_arbiter ...  an arbiter shipped with its reference generations

How the bundled models themselves were made is cospec_local.recipes.

Data collection runs the native engine in its own process: in a process where torch has run a
multi-threaded op, llama.cpp decodes about 8x slower (docs/python-api.md, "Threads"). Nothing
here imports torch at package import time.
"""
