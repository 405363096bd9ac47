"""The domain gate: a learned arbiter abstains on prompts unlike those it was trained on.

An arbiter learns when the draft's token is worth keeping on its training tasks; elsewhere its
P(keep) means nothing, and keeping the draft's words there costs answers and time (its pass runs
at every mismatch). The gate decides once per generation, before any block, from the prompt's
tokens alone: the share of the prompt's adjacent token pairs (bigrams) that occur in the
training prompts. On a prompt below the arbiter's gate threshold no mismatch is kept and the
arbiter's pass never runs: the target's own tokens, as plain speculative decoding gives them (the
block lengths still come from the timing-free tuner of learned-arbiter runs, so nothing depends
on timing).

Why bigrams: on the demo pair, every dev prompt of the training tasks has a coverage of 0.93 or
more, the unseen listops family at most 0.80 and general chat prompts at most 0.56, while a
unigram likelihood ratio overlapped (listops scored above arithmetic: it shares the training
tasks' words and digits, not their word order). The threshold is set on dev prompts: their 1st
percentile minus a margin, so about 99% of in-domain prompts pass.

Stored in arbiter.gguf (file_format.py): the sorted unique bigrams as an I32 tensor
`gate.bigrams` (n, 2), the vocabulary size `gate_n_vocab` and `gate_threshold`. The engine
(native/src/learned_arbiter.cpp) computes the same coverage; `coverage` here is its reference.
Only numpy is imported.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

MARGIN = 0.05  # below the dev prompts' 1st percentile of coverage
DEV_QUANTILE = 0.01
MAX_BIGRAMS = 1 << 24  # the engine's MAX_GATE_BIGRAMS


@dataclass
class DomainGate:
    bigrams: np.ndarray  # (n, 2) int32, sorted by (first, second), unique
    n_vocab: int
    threshold: float
    dev_coverage: dict  # min, 1st percentile, median of the dev prompts' coverage (for the record)

    def keys(self) -> np.ndarray:
        return self.bigrams[:, 0].astype(np.int64) * self.n_vocab + self.bigrams[:, 1]

    def coverage(self, tokens: Sequence[int]) -> float:
        return coverage(tokens, self.keys(), self.n_vocab)

    def admits(self, tokens: Sequence[int]) -> bool:
        return self.coverage(tokens) >= self.threshold


def pair_keys(tokens: Sequence[int], n_vocab: int) -> np.ndarray:
    t = np.asarray(tokens, dtype=np.int64)
    return t[:-1] * n_vocab + t[1:]


def coverage(tokens: Sequence[int], sorted_keys: np.ndarray, n_vocab: int) -> float:
    """The share of the prompt's adjacent token pairs found among the training prompts' pairs
    (1.0 for a prompt of fewer than two tokens: nothing to judge)."""
    if len(tokens) < 2:
        return 1.0
    t = np.asarray(tokens, dtype=np.int64)
    inside = (t[:-1] >= 0) & (t[:-1] < n_vocab) & (t[1:] >= 0) & (t[1:] < n_vocab)  # as the engine: others unseen
    keys = np.where(inside, pair_keys(tokens, n_vocab), -1)
    at = np.searchsorted(sorted_keys, keys)
    found = inside & (at < len(sorted_keys)) & (sorted_keys[np.minimum(at, len(sorted_keys) - 1)] == keys)
    return float(found.mean())


def build_gate(train_prompts: Iterable[Sequence[int]], dev_prompts: Iterable[Sequence[int]], n_vocab: int) -> DomainGate:
    """A gate from the training prompts' token ids, its threshold set on the dev prompts'."""
    keys = np.unique(np.concatenate([pair_keys(t, n_vocab) for t in train_prompts if len(t) >= 2] or
                                    [np.zeros(0, np.int64)]))
    if len(keys) == 0:
        raise ValueError("no training prompt has two tokens: nothing to build a domain gate from")
    if len(keys) > MAX_BIGRAMS:
        raise ValueError(f"{len(keys)} distinct bigrams in the training prompts: more than a gate holds ({MAX_BIGRAMS})")
    if n_vocab > np.iinfo(np.int32).max:
        raise ValueError(f"a vocabulary of {n_vocab} tokens does not fit the gate's 32-bit token ids")
    bigrams = np.stack([keys // n_vocab, keys % n_vocab], axis=1).astype(np.int32)
    dev = np.array([coverage(t, keys, n_vocab) for t in dev_prompts])
    if len(dev) == 0:
        raise ValueError("no dev prompts to set the domain gate's threshold on")
    low = float(np.quantile(dev, DEV_QUANTILE))
    threshold = float(np.float32(max(0.0, low - MARGIN)))  # as stored (F32): Python and the engine agree at the edge
    return DomainGate(bigrams, n_vocab, threshold,
                      {"prompts": len(dev), "min": float(dev.min()), "p01": low, "median": float(np.median(dev))})
