"""How the bundled models were made (install with the `train` extra); training an arbiter is
cospec_local.train.

    python -m cospec_local.recipes.demo_pair ...      the demo pair, from scratch (demo_models.py: its models)
    python -m cospec_local.recipes.distill_draft ...  SmolLM2's distilled draft (distill_prompts.py: its prompts)
    python -m cospec_local.recipes.skill_draft ...    that draft taught one skill (arithmetic blocks)

Like training, each runs the native engine in a process of its own where it must decode.
"""
