"""What a generation produced, in Python's terms: its text, tokens and their provenance, why it
stopped, its counters under llama-server's `timings` names, the arbiter's decisions, and the
tokens streamed one by one."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar

from . import _cospec

PROVENANCE = {
    _cospec.PROV_MATCH: "match",
    _cospec.PROV_KEPT: "kept",
    _cospec.PROV_FALLBACK: "fallback",
    _cospec.PROV_BONUS: "bonus",
    _cospec.PROV_TARGET: "target",
    _cospec.PROV_DRAFT: "draft",
    _cospec.PROV_NGRAM: "ngram",
    _cospec.PROV_HEAD: "head",
}
STOP_REASONS = {
    _cospec.STOP_EOG: "eog",
    _cospec.STOP_MAX_TOKENS: "max_tokens",
    _cospec.STOP_STRING: "stop_string",
    _cospec.STOP_CONTEXT_FULL: "context_full",
    _cospec.STOP_ABORTED: "aborted",
    _cospec.STOP_ERROR: "error",
}

# OpenAI's finish_reason for each stop reason.
FINISH_REASONS = {"eog": "stop", "stop_string": "stop", "max_tokens": "length", "context_full": "length",
                  "aborted": "abort", "error": "error"}

# cospec_stats (native/include/cospec.h) keeps C names; Python and every JSON output (`generate
# --json`, the server's `timings`, eval) use llama-server's `timings` names. The binding hands over
# the C names: this table is the one place that maps them.
NATIVE_STATS_NAMES = {
    "n_prompt": "prompt_n",
    "n_prompt_cached": "cache_n",
    "t_prompt_ms": "prompt_ms",
    "n_generated": "predicted_n",
    "t_generate_ms": "predicted_ms",
    "n_drafted": "draft_n",
    "n_accepted": "draft_n_matched",
    "n_blocks": "blocks",
    "n_kept": "arbiter_keeps",
    "n_fallback": "target_fallbacks",
    "n_bonus": "bonus",
    "n_plain": "plain",
    "n_arbiter_calls": "arbiter_calls",
    "t_arbiter_ms": "arbiter_ms",
    "t_draft_ms": "draft_ms",
    "t_verify_ms": "verify_ms",
    "t_sample_ms": "sample_ms",
    "arbiter_abstained": "arbiter_abstained",
    "n_target_decoded": "target_decoded",
    "n_draft_decoded": "draft_decoded",
    "n_restored": "restored",
    "n_blocks_ngram": "blocks_ngram",
    "n_drafted_ngram": "draft_n_ngram",
    "n_accepted_ngram": "draft_n_matched_ngram",
    "n_blocks_head": "blocks_head",
    "n_drafted_head": "draft_n_head",
    "n_accepted_head": "draft_n_matched_head",
}


@dataclass
class Stats:
    """Counters of one generation, under llama-server's `timings` names (the JSON keys of
    `to_json()`); cospec_stats in native/include/cospec.h documents each under its C name."""

    prompt_n: int = 0            # prompt tokens evaluated in this call (the last one included)
    cache_n: int = 0             # prompt tokens reused from the previous call's cache (prompt_n + cache_n: the prompt)
    prompt_ms: float = 0.0
    predicted_n: int = 0         # tokens generated
    predicted_ms: float = 0.0
    draft_n: int = 0             # draft tokens proposed
    draft_n_matched: int = 0     # emitted draft tokens that matched the target
    blocks: int = 0              # verification passes of the target over at least one draft token
    arbiter_keeps: int = 0       # emitted draft tokens kept by the arbiter at a mismatch
    target_fallbacks: int = 0    # target tokens emitted at a rejected mismatch
    bonus: int = 0               # target tokens emitted after a block survived whole
    plain: int = 0               # plain steps: target-only / draft-only, and speculative steps that drafted nothing
    arbiter_calls: int = 0       # blocks scored by the arbiter: those whose walk reached a mismatch
    arbiter_ms: float = 0.0
    draft_ms: float = 0.0        # inside draft-model llama_decode calls
    verify_ms: float = 0.0       # inside target-model llama_decode calls (verification or plain steps)
    sample_ms: float = 0.0       # choosing tokens from logits
    arbiter_abstained: bool = False  # the learned arbiter's domain gate refused the prompt
    target_decoded: int = 0      # tokens the target decoded after the prompt (verify batches, plain steps, catch-ups)
    draft_decoded: int = 0       # tokens the draft model decoded after the prompt
    restored: int = 0            # rollbacks of a recurrent or hybrid model's memory to its saved state
    blocks_ngram: int = 0        # of blocks: drafted by the n-gram drafter
    draft_n_ngram: int = 0       # of draft_n: proposed by the n-gram drafter
    draft_n_matched_ngram: int = 0  # of draft_n_matched: n-gram tokens the target agreed with
    blocks_head: int = 0         # of blocks: drafted by the head drafter (EAGLE-3, MTP)
    draft_n_head: int = 0        # of draft_n: proposed by the head drafter
    draft_n_matched_head: int = 0  # of draft_n_matched: head tokens the target agreed with

    # The derived values to_json() gives, each after the field named here.
    _JSON_DERIVED: ClassVar[dict[str, tuple[str, ...]]] = {
        "prompt_ms": ("prompt_per_token_ms", "prompt_per_second"),
        "predicted_ms": ("predicted_per_token_ms", "predicted_per_second"),
        "draft_n": ("draft_n_accepted",),
        "sample_ms": ("acceptance_rate", "mean_accepted_per_block"),
    }

    @classmethod
    def from_native(cls, raw: dict) -> Stats:
        """From the binding's dict of cospec_stats under its C names."""
        return cls(**{NATIVE_STATS_NAMES[k]: v for k, v in raw.items()})

    @property
    def prompt_per_token_ms(self) -> float:
        return self.prompt_ms / self.prompt_n if self.prompt_n else 0.0

    @property
    def prompt_per_second(self) -> float:
        return 1000.0 * self.prompt_n / self.prompt_ms if self.prompt_ms > 0 else 0.0

    @property
    def predicted_per_token_ms(self) -> float:
        return self.predicted_ms / self.predicted_n if self.predicted_n else 0.0

    @property
    def predicted_per_second(self) -> float:
        return 1000.0 * self.predicted_n / self.predicted_ms if self.predicted_ms > 0 else 0.0

    @property
    def draft_n_accepted(self) -> int:
        """Draft tokens that reached the output: matched or kept by the arbiter."""
        return self.draft_n_matched + self.arbiter_keeps

    @property
    def acceptance_rate(self) -> float:
        """Share of drafted tokens that reached the output (matched or kept)."""
        return self.draft_n_accepted / self.draft_n if self.draft_n else 0.0

    @property
    def mean_accepted_per_block(self) -> float:
        return self.draft_n_accepted / self.blocks if self.blocks else 0.0

    @property
    def overhead_fraction(self) -> float:
        """Share of generation time spent outside llama.cpp decode calls."""
        if self.predicted_ms <= 0:
            return 0.0
        inside = self.draft_ms + self.verify_ms
        return max(0.0, self.predicted_ms - inside) / self.predicted_ms

    def to_json(self) -> dict:
        """The fields (times rounded to the microsecond) and the derived values, under the same names."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = round(value, 3) if isinstance(value, float) else value
            for name in self._JSON_DERIVED.get(f.name, ()):
                out[name] = getattr(self, name)
        return out


@dataclass
class Decision:
    """An arbiter decision the walk through a block applied."""

    block: int        # block number in the generation
    position: int     # position in the block
    token_index: int  # index in Generation.tokens of the kept draft token or of the target's fallback
    p_keep: float
    keep: bool


@dataclass
class LogprobEntry:
    token: int
    logprob: float
    piece: bytes  # the token's text as the model writes it (maybe part of a UTF-8 character)


@dataclass
class TokenLogprobs:
    """A token's log-probability (log softmax of the chooser's logits at temperature 1, before
    penalty, sampling and grammar) and the likeliest tokens at its position, likeliest first."""

    token: int
    logprob: float
    piece: bytes
    top: list[LogprobEntry]


@dataclass
class Generation:
    """What one generation produced, and which mode and arbiter produced it."""

    text: str
    tokens: list[int]
    provenance: list[str]
    stop_reason: str
    stats: Stats
    mode: str
    arbiter: str | None = None  # the arbiter's name in speculative mode
    decisions: list[Decision] = field(default_factory=list)
    prompt_tokens: int = 0
    used_draft_model: bool = False  # the draft model was one of its draft sources
    # With params.logprobs: per token its own log-probability and the likeliest at its position.
    logprobs: list[TokenLogprobs] | None = None
    calibration: str | None = None  # the id of the engine's calibration (cospec_local.calibration), if any

    @property
    def label(self) -> str:
        """"target-only", "draft-only", or "speculative/ARBITER"."""
        return self.mode if self.arbiter is None else f"{self.mode}/{self.arbiter}"

    @property
    def finish_reason(self) -> str:
        return FINISH_REASONS.get(self.stop_reason, "stop")

    def to_json(self) -> dict:
        return {"text": self.text, "tokens": self.tokens, "provenance": self.provenance,
                "stop_reason": self.stop_reason, "mode": self.mode, "arbiter": self.arbiter,
                "decisions": [{"block": d.block, "position": d.position, "token_index": d.token_index,
                               "p_keep": round(d.p_keep, 6), "keep": d.keep} for d in self.decisions],
                "calibration": self.calibration, "stats": self.stats.to_json()}


@dataclass
class TokenEvent:
    """One streamed token. `text` is the newly safe text (may be empty);
    `token` is -1 for the final piece of held-back text."""

    token: int
    provenance: str
    text: str
    logprobs: TokenLogprobs | None = None  # with params.logprobs (not on the final piece)
