"""The domain gate: a learned arbiter abstains on prompts unlike those it was trained on.

An arbiter learns when the draft's token is worth keeping on its training tasks; elsewhere its
P(keep) means nothing, and keeping the draft's words there costs answers and time (its pass runs
at every mismatch). The gate decides once per generation, before any block, from the prompt's
tokens alone. On a prompt it refuses no mismatch is kept and the arbiter's pass never runs: the
target's own tokens, as plain speculative decoding gives them (the block lengths still come from
the timing-free tuner of learned-arbiter runs, so nothing depends on timing). Two kinds:

- ClassifierGate (what `arbiter train` and fit_gate.py build): logistic regression over the
  prompt's hashed token unigrams and bigrams, trained on the tasks' prompts against general chat
  and other task families, each in several formats. It reads the tasks' words, so it admits a
  task asked in other words or another chat format.
- EmbeddingGate (what `arbiter train` builds for the built-in short-answer mix): logistic
  regression over the draft's hidden state at the prompt's last token (Engine.prompt_embedding), trained
  on questions with short, checkable answers against general chat and long-form writing. It asks
  "is this such a question?", not "is this one of my tasks?", so it admits questions of families
  it never saw, where a classifier over hashed words scores them like chat
  (bench/gate_leave_family_out.py leaves one family out at a time: on SmolLM2-135M it admits
  63-83% of the left-out family's questions by format, 20-100% by family, and at most 1% of
  held-out chat and long-form prompts; record bench/gate_leave_family_out/smollm2).
- DomainGate (the demo arbiters'): the share of the prompt's adjacent token pairs (bigrams) found
  among the training prompts, its threshold set on dev prompts (their 1st percentile minus a
  margin). On the demo pair every dev prompt of the training tasks has a coverage of 0.93 or
  more, the unseen listops family at most 0.80 and general chat at most 0.56; but it admits only
  the training wording (a reworded question scores like chat).

Stored in arbiter.gguf (file_format.py); the engine (native/src/arbiter_file.cpp) computes the
same scores, and `coverage` / `ClassifierGate.score` here are its reference. Only numpy is imported.
"""
from __future__ import annotations

import math
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


# ---------------------------------------------------------------- a gate that learns the tasks' words

HASH_BITS = 18            # 262,144 buckets: 1 MiB of F32 weights
MAX_HASH_BITS = 24        # the engine's limit
_MUL_FIRST = 0x9E3779B97F4A7C15
_MUL_SECOND = 0xC2B2AE3D27D4EB4F
# The threshold sits this far (in log-odds) below the dev task prompts' 1st percentile, and never
# below even odds: where the tasks are told apart with room to spare (arithmetic questions score
# 0.999 and more), a family never seen in training that merely resembles them (listops, scored
# 0.1-0.998 by an arithmetic gate) is refused too.
DEV_LOGIT_MARGIN = 1.0
EPOCHS = 60
LEARNING_RATE = 0.5
L2 = 1e-4


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0  # exp(700) is near the double's limit


def hashed_features(tokens: Sequence[int], bits: int) -> np.ndarray:
    """The distinct buckets of a prompt's token unigrams and bigrams, sorted: a unigram t hashes
    (t + 1) * A, a bigram (s, t) (s + 1) * A + (t + 1) * B, modulo 2^64, keeping the top `bits`
    bits (native/src/arbiter_file.cpp computes the same)."""
    t = np.asarray(tokens, dtype=np.int64).astype(np.uint64) + np.uint64(1)
    with np.errstate(over="ignore"):
        keys = np.concatenate([t * np.uint64(_MUL_FIRST), t[:-1] * np.uint64(_MUL_FIRST) + t[1:] * np.uint64(_MUL_SECOND)])
    return np.unique(keys >> np.uint64(64 - bits)).astype(np.int64)


@dataclass
class ClassifierGate:
    """A domain gate that reads the prompt's words rather than its exact wording: logistic
    regression over hashed token unigrams and bigrams, trained on the arbiter's task prompts
    (positive) against prompts it must stay quiet on (general chat, other tasks), each rendered in
    several formats so that no format's markers carry the decision. Why: a bigram coverage of the
    training prompts abstains on every problem once the question is worded otherwise or carries an
    extra sentence (the Gemma 3 <- SmolLM2 arbiter: 0 of 314 reworded test questions admitted),
    while the tasks' own words ("capital", "plural", a quoted single word) survive rewording.

    Stored in arbiter.gguf as the tensor `gate.weights` (2^bits F32), `gate_bias`, `gate_hash_bits`,
    `gate_n_vocab` and `gate_threshold` (a probability)."""

    weights: np.ndarray  # (2^bits,) float32
    bias: float
    threshold: float
    n_vocab: int  # the target's: a gate read with another tokenizer's ids would mean nothing
    record: dict  # how it was trained and what it admits (for info.json)

    @property
    def bits(self) -> int:
        return int(len(self.weights)).bit_length() - 1

    def logit(self, tokens: Sequence[int]) -> float:
        z = float(self.bias)
        for w in self.weights[hashed_features(tokens, self.bits)]:  # in the engine's order: the same bits
            z += float(w)
        return z

    def score(self, tokens: Sequence[int]) -> float:
        """P(the prompt is one of the arbiter's tasks)."""
        if len(tokens) == 0:
            return 1.0
        return _sigmoid(self.logit(tokens))

    def admits(self, tokens: Sequence[int]) -> bool:
        return self.score(tokens) >= self.threshold


def train_classifier_gate(positive: Sequence[Sequence[int]], negative: Sequence[Sequence[int]], n_vocab: int,
                          bits: int = HASH_BITS, dev: Sequence[Sequence[int]] = (), seed: int = 0) -> ClassifierGate:
    """Logistic regression by stochastic gradient descent (fixed order per seed: the same prompts
    give the same gate), the two classes weighted to count equally; its threshold from the dev task
    prompts (DEV_LOGIT_MARGIN below their 1st percentile, at least 0.5), 0.5 without any."""
    if not positive or not negative:
        raise ValueError("a classifier gate needs prompts of the arbiter's tasks and prompts to stay quiet on")
    if not 1 <= bits <= MAX_HASH_BITS:
        raise ValueError(f"hash bits must lie in [1, {MAX_HASH_BITS}]")
    rows = [hashed_features(t, bits) for t in positive] + [hashed_features(t, bits) for t in negative]
    y = np.array([1.0] * len(positive) + [0.0] * len(negative))
    sample_weight = np.where(y == 1, len(y) / (2 * len(positive)), len(y) / (2 * len(negative)))
    w = np.zeros(1 << bits)
    b = 0.0
    for epoch in range(EPOCHS):
        for i in np.random.default_rng(seed + epoch).permutation(len(y)):
            x = rows[i]
            z = b + w[x].sum()
            g = _sigmoid(z) - y[i]
            g *= sample_weight[i]
            w[x] -= LEARNING_RATE * (g + L2 * w[x])
            b -= 0.1 * LEARNING_RATE * g
    gate = ClassifierGate(w.astype(np.float32), float(np.float32(b)), 0.5, n_vocab, {})
    if len(dev):
        low = float(np.quantile([gate.logit(t) for t in dev], DEV_QUANTILE)) - DEV_LOGIT_MARGIN
        gate.threshold = float(np.float32(max(0.5, _sigmoid(low))))
    gate.record = {"kind": "classifier", "hash_bits": bits, "threshold": gate.threshold, "positive": len(positive),
                   "negative": len(negative),
                   "train_admitted": {"positive": float(np.mean([gate.admits(t) for t in positive])),
                                      "negative": float(np.mean([gate.admits(t) for t in negative]))}}
    return gate


@dataclass
class EmbeddingGate:
    """Logistic regression over the draft's L2-normalised hidden state at the prompt's last token
    (cospec_prompt_embedding: the model about to answer, in its own tokens of the prompt). Stored in arbiter.gguf
    as the tensor `gate.embedding` (n_embd F32), `gate_bias` and `gate_threshold` (a probability);
    the engine reads the prompt with the draft once more, in a context of its own, before the first
    block (a short question: a few milliseconds with a 135M draft)."""

    weights: np.ndarray  # (n_embd,) float32
    bias: float
    threshold: float
    record: dict

    def score(self, embedding: np.ndarray) -> float:
        z = float(self.bias) + float(np.dot(self.weights.astype(np.float64), np.asarray(embedding, dtype=np.float64)))
        return _sigmoid(z)

    def admits(self, embedding: np.ndarray) -> bool:
        return self.score(embedding) >= self.threshold


EMBEDDING_STEPS = 3000
EMBEDDING_L2 = 1e-3
# Of the prompts it must refuse, the share scoring above the threshold on its training data: none.
EMBEDDING_NEGATIVE_QUANTILE = 1.0


def train_embedding_gate(positive: np.ndarray, negative: np.ndarray, dev: np.ndarray | None = None) -> EmbeddingGate:
    """Full-batch gradient descent on the class-balanced logistic loss (no randomness: the same
    embeddings give the same gate). The threshold is the highest score of a training prompt it
    must refuse (every one of them is refused), at least 0.5."""
    positive, negative = np.asarray(positive, np.float64), np.asarray(negative, np.float64)
    if len(positive) == 0 or len(negative) == 0:
        raise ValueError("an embedding gate needs questions to admit and prompts to refuse")
    x = np.vstack([positive, negative])
    y = np.r_[np.ones(len(positive)), np.zeros(len(negative))]
    weight = np.where(y == 1, len(y) / (2 * len(positive)), len(y) / (2 * len(negative)))
    w, b = np.zeros(x.shape[1]), 0.0
    for _ in range(EMBEDDING_STEPS):
        z = np.clip(x @ w + b, -500, 500)
        g = (1.0 / (1.0 + np.exp(-z)) - y) * weight
        w -= x.T @ g / len(y) + EMBEDDING_L2 * w
        b -= g.mean()
    gate = EmbeddingGate(w.astype(np.float32), float(np.float32(b)), 0.5, {})
    refused = np.array([gate.score(e) for e in negative])
    gate.threshold = float(np.float32(max(0.5, np.quantile(refused, EMBEDDING_NEGATIVE_QUANTILE) + 1e-6)))
    gate.record = {"kind": "embedding", "threshold": gate.threshold, "positive": len(positive),
                   "negative": len(negative),
                   "train_admitted": {"positive": float(np.mean([gate.admits(e) for e in positive])),
                                      "negative": float(np.mean([gate.admits(e) for e in negative]))}}
    if dev is not None and len(dev):
        gate.record["dev_admitted"] = float(np.mean([gate.admits(e) for e in dev]))
    return gate
