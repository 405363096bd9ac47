"""The domain gate: built from training prompts' bigrams, its threshold set on dev prompts; on the
demo pair it admits the training tasks' held-out prompts and refuses the unseen listops family and
general chat."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cospec_local import Engine
from cospec_local.domain_gate import DEV_QUANTILE, MARGIN, build_gate, coverage, pair_keys
from cospec_local.tasks import load_task

CHAT_PROMPTS = Path(__file__).resolve().parent.parent / "bench" / "heldout_chat_prompts.txt"


def test_coverage_counts_the_prompts_known_pairs():
    keys = np.unique(pair_keys([1, 2, 3, 4], 10))  # pairs 1-2, 2-3, 3-4
    assert coverage([1, 2, 3, 4], keys, 10) == 1.0
    assert coverage([1, 2, 5, 3, 4], keys, 10) == 0.5  # 1-2 and 3-4 known, 2-5 and 5-3 not
    assert coverage([4, 3, 2, 1], keys, 10) == 0.0  # the same tokens in another order
    assert coverage([7], keys, 10) == 1.0  # nothing to judge
    assert coverage([9, 9], keys, 10) == 0.0  # past the largest key


def test_threshold_sits_below_the_dev_prompts():
    train = [[1, 2, 3, 4, 5]] * 3
    dev = [[1, 2, 3, 4, 5]] * 98 + [[1, 2, 3, 9]] + [[9, 8]]  # coverages 1.0 (98), 2/3, 0
    gate = build_gate(train, dev, 10)
    assert gate.bigrams.tolist() == [[1, 2], [2, 3], [3, 4], [4, 5]]
    expected = max(0.0, float(np.quantile([1.0] * 98 + [2 / 3, 0.0], DEV_QUANTILE)) - MARGIN)
    assert gate.threshold == pytest.approx(expected) and 0.0 < gate.threshold < 2 / 3
    assert gate.admits([1, 2, 3]) and not gate.admits([5, 4, 3, 2, 1])
    with pytest.raises(ValueError, match="nothing to build"):
        build_gate([[1]], dev, 10)
    with pytest.raises(ValueError, match="no dev prompts"):
        build_gate(train, [], 10)


@pytest.fixture(scope="module")
def demo_gate():
    with Engine("demo-target", "demo-draft", n_ctx=512, n_threads=1) as engine:
        def tokens(prompts):
            return [engine.tokenize(p) for p in prompts]

        train = tokens([p.prompt for f in ("arith", "pyfunc") for p in load_task(f, "train", 1000)])
        dev = tokens([p.prompt for f in ("arith", "pyfunc") for p in load_task(f, "dev", 200)])
        held_out = {f: tokens([p.prompt for p in load_task(f, "test", 200)]) for f in ("arith", "pyfunc", "listops")}
        held_out["chat"] = tokens([line for line in CHAT_PROMPTS.read_text().splitlines() if line.strip()])
        return build_gate(train, dev, engine.n_vocab), held_out


def test_demo_gate_admits_its_tasks_and_refuses_others(demo_gate):
    gate, held_out = demo_gate
    admitted = {name: sum(gate.admits(t) for t in prompts) / len(prompts) for name, prompts in held_out.items()}
    assert admitted["arith"] >= 0.99 and admitted["pyfunc"] >= 0.97
    assert admitted["listops"] == 0.0 and admitted["chat"] == 0.0
