"""Rewards and advantages of GRPO rollouts (pure Python: no torch, no engine).

A rollout is one full CoSpec generation for a prompt, its arbiter decisions drawn from
Bernoulli(P(keep)). Its reward follows the method's shaping (docs: utility, not fidelity):

- correct answer: 1 + span_bonus * rho, where rho is the share of the generated tokens that are
  draft tokens emitted at or after a kept mismatch in the same block (the kept token and the
  accepted run behind it). Among right answers, the one that kept useful draft runs is better.
- wrong answer: minus the mean over its decisions of
    risk_penalty      for a kept draft token the target gave probability < risk_prob, and
    fallback_penalty  for a rejected mismatch (its target fallback then ended wrong too):
  falling back is not a free, safe default; keeping what the target found very unlikely costs most.

Advantages are normalised within each prompt's group: A = (R - mean) / max(std, std_floor). The
floor keeps shaping alone (groups whose rollouts all succeed, or all fail) from being blown up to
the size of a success signal when the rewards differ by a few hundredths. In groups that mix right
and wrong answers, no wrong rollout keeps a positive advantage (a penalty-free wrong answer can sit
above a mean that penalised ones pull down), and the positive and the negative side are then
rescaled so that their magnitudes,
weighted by each rollout's number of decisions (the policy loss sums over decisions), are equal:
a group with one right rollout among eight pushes as hard towards it as away from the others.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class RewardConfig:
    span_bonus: float = 0.5
    risk_prob: float = 0.05
    risk_penalty: float = 0.5
    fallback_penalty: float = 0.25
    std_floor: float = 0.5


def span_after_keeps(provenance: Sequence[str]) -> int:
    """Draft tokens emitted at or after a kept mismatch within the same block. A block ends with
    the target's fallback or bonus token; plain target steps are blocks of their own."""
    n, after_keep = 0, False
    for p in provenance:
        if p == "kept":
            after_keep = True
            n += 1
        elif p == "match":
            n += after_keep
        else:  # fallback, bonus, target: the block is over
            after_keep = False
    return n


def rollout_reward(correct: bool, provenance: Sequence[str], decisions: Sequence[dict],
                   cfg: RewardConfig = RewardConfig()) -> float:
    """`decisions`: dicts with `keep` (bool) and `p_target` (the target's probability of the draft
    token at that position, temperature 1)."""
    if correct:
        rho = span_after_keeps(provenance) / max(1, len(provenance))
        return 1.0 + cfg.span_bonus * rho
    if not decisions:
        return 0.0
    penalty = sum(cfg.risk_penalty if d["keep"] and d["p_target"] < cfg.risk_prob else 0.0 for d in decisions)
    penalty += sum(cfg.fallback_penalty for d in decisions if not d["keep"])
    return -penalty / len(decisions)


def group_advantages(rewards: Sequence[float], n_decisions: Sequence[int], correct: Sequence[bool],
                     cfg: RewardConfig = RewardConfig()) -> list[float]:
    """One advantage per rollout of a prompt's group (see the module's docstring)."""
    g = len(rewards)
    if g == 0:
        return []
    if max(rewards) - min(rewards) < 1e-9:  # one reward (up to float noise): nothing to learn
        return [0.0] * g
    mean = sum(rewards) / g
    std = (sum((r - mean) ** 2 for r in rewards) / g) ** 0.5
    adv = [(r - mean) / max(std, cfg.std_floor) for r in rewards]
    if any(correct) and not all(correct):
        # The outcome comes first: no wrong answer is reinforced beside a right one.
        adv = [min(a, 0.0) if not c else a for a, c in zip(adv, correct)]
        pos = sum(a * n for a, n in zip(adv, n_decisions) if a > 0)
        neg = sum(-a * n for a, n in zip(adv, n_decisions) if a < 0)
        if pos > 0 and neg > 0:
            half = (pos + neg) / 2
            adv = [a * (half / pos) if a > 0 else a * (half / neg) for a in adv]
    return adv
