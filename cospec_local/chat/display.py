"""How generations look on a terminal: provenance colours and the stats line
(shared by `cospec-local generate` and the chat REPL)."""
from __future__ import annotations

from ..generation import Generation

# ANSI colours for --color: which tokens came from the draft.
COLORS = {"match": "\x1b[32m", "kept": "\x1b[35;1m", "ngram": "\x1b[36m", "head": "\x1b[34m"}
RESET = "\x1b[0m"


def colored(text: str, provenance: str, color: bool) -> str:
    if not color or provenance not in COLORS or not text:
        return text
    return COLORS[provenance] + text + RESET


def stats_line(result: Generation) -> str:
    s = result.stats
    line = f"[{s.predicted_n} tokens, {s.predicted_per_second:.1f} tok/s, {result.mode}"
    if result.arbiter is not None:
        line += f", arbiter {result.arbiter}"
    if s.blocks:
        line += (f" | drafted {s.draft_n}, accepted {s.draft_n_accepted} ({100 * s.acceptance_rate:.0f}%),"
                 f" arbiter keeps {s.arbiter_keeps}, {s.mean_accepted_per_block:.2f} per block")
        if s.blocks_ngram:
            line += f"; n-gram drafted {s.draft_n_ngram}, accepted {s.draft_n_matched_ngram}"
        if s.blocks_head:
            line += f"; head drafted {s.draft_n_head}, accepted {s.draft_n_matched_head}"
    return line + f", stop: {result.stop_reason}]"


# Below this share of the generated tokens drafted, the tuner has all but switched the draft off.
DRAFT_OFF_SHARE = 0.25
DRAFT_OFF_MIN_TOKENS = 16  # too short a reply to tell


def other_vocab_note(engine) -> str | None:
    """Where the draft's vocabulary is not the target's, the one-line note that it drafts through
    text (said once, when the engine loads), else None."""
    difference = engine.vocab_difference
    if difference is None:
        return None
    return (f"the draft's vocabulary is not the target's ({difference}): it drafts text, re-encoded into the "
            "target's tokens (with the target arbiter every token is the target's choice in its verify pass: the "
            "target's output under batched-verification numerics, which can break a near-tie otherwise than "
            "target-only's one-token steps; docs/lossless-output.md)")


def draft_off_note(result: Generation) -> str | None:
    """A plain-words note where the draft model's tuner all but switched it off (it agrees with the
    target too rarely to pay), else None. Tokens the n-gram drafter settled are left out: where it
    drafts, the draft model is not asked."""
    s = result.stats
    model_drafted = s.draft_n - s.draft_n_ngram
    rest = s.predicted_n - s.draft_n_matched_ngram - s.blocks_ngram  # tokens not settled by n-gram blocks
    if result.mode != "speculative" or not result.used_draft_model or rest < DRAFT_OFF_MIN_TOKENS:
        return None
    if model_drafted >= DRAFT_OFF_SHARE * rest:
        return None
    alone = "with the n-gram drafter" if s.blocks_ngram else "almost alone"
    return (f"(the draft agrees with the target too rarely here: the draft model drafted {model_drafted} tokens for "
            f"{rest}, so the target is decoding {alone}; a draft closer to the target speeds it up)")


def abstained_note(result: Generation) -> str | None:
    """Where the learned arbiter's domain gate refused the prompt, say so in plain words."""
    if not result.stats.arbiter_abstained:
        return None
    return (f"(arbiter {result.arbiter} abstained: this prompt is unlike the tasks it was trained on, so the reply "
            f"is the target's own, as with plain speculative decoding)")


def model_summary(path) -> str:
    """' (llama, 30 layers, 86.4 MB, Q4_1)' from the file's header; '' where it cannot be read."""
    from pathlib import Path

    from ..models import describe_gguf

    try:
        d = describe_gguf(Path(path))
    except (OSError, ValueError):
        return ""
    parts = [d["architecture"], f"{d['layers']} layers" if d["layers"] else None, f"{d['size_mb']} MB",
             d["quantization"]]
    return " (" + ", ".join(str(p) for p in parts if p) + ")"
