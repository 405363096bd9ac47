"""How generations look on a terminal: provenance colours and the stats line
(shared by `cospec-local generate` and the chat REPL)."""
from __future__ import annotations

from .engine import Generation

# ANSI colours for --color: which tokens came from the draft.
COLORS = {"match": "\x1b[32m", "kept": "\x1b[35;1m"}
RESET = "\x1b[0m"


def colored(text: str, provenance: str, color: bool) -> str:
    if not color or provenance not in COLORS or not text:
        return text
    return COLORS[provenance] + text + RESET


def stats_line(result: Generation) -> str:
    s = result.stats
    line = f"[{s.n_generated} tokens, {s.tokens_per_second:.1f} tok/s, {result.mode}"
    if result.arbiter is not None:
        line += f", arbiter {result.arbiter}"
    if s.n_blocks:
        line += (f" | drafted {s.n_drafted}, accepted {s.n_accepted + s.n_kept} ({100 * s.acceptance_rate:.0f}%),"
                 f" arbiter keeps {s.n_kept}, {s.mean_accepted_per_block:.2f} per block")
    return line + f", stop: {result.stop_reason}]"
