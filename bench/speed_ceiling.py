"""The fastest a draft model's blocks can be on a calibrated pair: for each chance `a` that a
draft token goes on (matched, or kept by an arbiter), the block length K that gives the most
tokens per target step, and that many tokens per step (= tokens/s over target-only).

A block of K draft tokens costs the draft's first call, K - 1 further draft steps and one verify
of K + 1 tokens, all in target steps as the calibration measured them on this machine; it emits
1 + a + ... + a^K tokens on average (a rejected mismatch emits the target's token, a block that
survives whole earns the bonus token). The n-gram drafter's blocks are not counted: they cost
no draft call and go wherever the text repeats itself.

    python bench/speed_ceiling.py CALIBRATION.json [--acceptance 0.5,0.6,...] [--goal 1.5]

CALIBRATION.json: a file `cospec-local calibrate --json` names (the store keeps one per pair and
machine).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cospec_local import calibration as calibration_store


def tokens_per_step(numbers: dict, a: float, k: int) -> float:
    verify = numbers["verify"]  # verify[n - 1]: n tokens at once
    cost = numbers["draft_first"] + (k - 1) * numbers["draft_step"] + verify[k]
    return sum(a ** i for i in range(k + 1)) / cost


def best_block(numbers: dict, a: float) -> tuple[float, int]:
    k_max = len(numbers["verify"]) - 1
    return max((tokens_per_step(numbers, a, k), k) for k in range(1, k_max + 1))


def acceptance_for(numbers: dict, goal: float) -> float | None:
    """The least acceptance (to 0.005) at which some block length reaches `goal` tokens per step."""
    for step in range(0, 201):
        a = step / 200
        if best_block(numbers, a)[0] >= goal:
            return a
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("calibration", type=Path)
    ap.add_argument("--acceptance", default="0.5,0.6,0.7,0.8,0.9,0.95")
    ap.add_argument("--goal", type=float, default=1.5, help="tokens/s over target-only to find the acceptance for")
    a = ap.parse_args(argv)
    stored = calibration_store.read(a.calibration)
    numbers = stored.numbers
    pair = stored.pair
    if not pair.get("draft"):
        sys.exit(f"{a.calibration}: no draft model was calibrated")
    print(f"{pair['target']['file']} <- {pair['draft']['file']} on {stored.machine.get('cpu', '?')}, "
          f"{stored.machine.get('n_threads')} threads (calibration {stored.id}, {stored.measured_at})")
    print(f"a target step {numbers['target_step_ms']:.1f} ms; verifying 2 / 4 / 8 tokens "
          f"{numbers['verify'][1]:.2f} / {numbers['verify'][3]:.2f} / {numbers['verify'][7]:.2f} steps; "
          f"a draft step {numbers['draft_step']:.3f}, a block's first {numbers['draft_first']:.3f}")
    rows = []
    for a_text in a.acceptance.split(","):
        acc = float(a_text)
        speed, k = best_block(numbers, acc)
        rows.append({"acceptance": acc, "best_k": k, "speed": speed})
        print(f"  acceptance {acc:.2f}: at most {speed:.2f}x target-only (K = {k})")
    needed = acceptance_for(numbers, a.goal)
    print(f"{a.goal}x needs an acceptance of {needed:.3f}" if needed is not None else
          f"{a.goal}x is out of reach at any acceptance")
    print(json.dumps({"calibration": str(a.calibration), "id": stored.id, "rows": rows,
                      "goal": a.goal, "acceptance_for_goal": needed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
