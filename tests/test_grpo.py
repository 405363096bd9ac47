"""GRPO for the learned arbiters: rewards and advantages on constructed rollouts (values computed
by hand), rollouts of the real engine (seeded, recorded as the engine decided), the direction of a
policy update, and the trainer end to end (single process, resume, and under torchrun)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)  # before torch's first op: llama.cpp in this process stays fast

from cospec_local import Engine  # noqa: E402
from cospec_local.arbiter.catalog import NAMED_ARBITERS  # noqa: E402
from cospec_local.models import resolve_model  # noqa: E402
from cospec_local.tasks import load_task  # noqa: E402
from cospec_local.train.grpo import (GRPOConfig, UpdateItem, decision_items, grpo_update,  # noqa: E402
                                     policy_probs, score_groups, state_items)
from cospec_local.train.rewards import RewardConfig, group_advantages, rollout_reward, span_after_keeps  # noqa: E402
from cospec_local.train.rollout import (Branched, BranchedState, DecidedBlock, Rollout, RolloutWorker,  # noqa: E402
                                        WorkerConfig)
from cospec_local.train.states import DecisionState  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- rewards (hand-computed)

def test_span_after_keeps_counts_the_kept_run_of_its_block():
    prov = ["match", "kept", "match", "match", "fallback", "match", "kept", "bonus", "match", "target"]
    # block 1: kept + 2 matches; block 2 (match, kept, bonus): the kept token only
    assert span_after_keeps(prov) == 4
    assert span_after_keeps(["match", "match", "bonus"]) == 0


def test_rollout_reward_values():
    rc = RewardConfig(span_bonus=0.5, risk_prob=0.05, risk_penalty=0.5, fallback_penalty=0.25)
    prov = ["match"] * 5 + ["kept", "match", "match"] + ["fallback", "match"]  # 3 of 10 tokens after a keep
    assert rollout_reward(True, prov, [{"keep": True, "p_target": 0.3}], rc) == pytest.approx(1.15)
    assert rollout_reward(True, ["match", "bonus"], [], rc) == 1.0
    wrong = [{"keep": True, "p_target": 0.01}, {"keep": True, "p_target": 0.5}, {"keep": False, "p_target": 0.2}]
    # (0.5 risky keep + 0 + 0.25 fallback) / 3 decisions
    assert rollout_reward(False, prov, wrong, rc) == pytest.approx(-0.25)
    assert rollout_reward(False, prov, [], rc) == 0.0


def test_group_advantages_values():
    rc = RewardConfig(std_floor=0.5)
    # mean 0.25, std 0.433 < floor 0.5: (1 - 0.25) / 0.5 = 1.5 and -0.5; masses 1.5 = 3 x 0.5, balanced already
    assert group_advantages([1, 0, 0, 0], [1, 1, 1, 1], [True, False, False, False], rc) == pytest.approx(
        [1.5, -0.5, -0.5, -0.5])
    # the second rollout made 3 decisions: negative mass 2.5 vs positive 1.5; both rescaled to 2.0
    adv = group_advantages([1, 0, 0, 0], [1, 3, 1, 1], [True, False, False, False], rc)
    assert adv == pytest.approx([2.0, -0.4, -0.4, -0.4])
    assert adv[0] * 1 == pytest.approx(-sum(a * n for a, n in zip(adv[1:], [3, 1, 1])))
    # same rewards: nothing to learn
    assert group_advantages([1, 1, 1], [2, 1, 1], [True] * 3, rc) == [0.0, 0.0, 0.0]
    # all right, shaping only: (R - mean) / floor, no rescaling (not a mixed group)
    assert group_advantages([1.1, 1.0], [1, 1], [True, True], rc) == pytest.approx([0.1, -0.1])
    # std above the floor: plain z-scores
    assert group_advantages([2.0, 0.0], [1, 1], [True, False], rc) == pytest.approx([1.0, -1.0])
    # equal up to float noise: zeros, not 1e-16s that would count as signal
    assert group_advantages([1.15] * 8, [1] * 8, [True] * 8, rc) == [0.0] * 8
    # mixed group: a penalty-free wrong answer above the mean is not reinforced. mean -0.25, std 0.5:
    # z = 2.5, 0.5, -0.5 x 6 -> the wrong 0.5 becomes 0; masses (x2 decisions) 5 vs 6 -> both 5.5
    assert group_advantages([1, 0] + [-0.5] * 6, [2] * 8, [True] + [False] * 7, rc) == pytest.approx(
        [2.75, 0.0] + [-5.5 / 12] * 6)


def test_grpo_loss_values():
    """Hand-computed: the clipped surrogate, the importance weights and the Bernoulli KL."""
    from cospec_local.train.grpo import grpo_loss

    p_old = torch.tensor([0.5, 0.5, 0.5])
    actions = torch.tensor([1.0, 1.0, 0.0])
    adv = torch.tensor([1.0, -1.0, 1.0])
    ones = torch.ones(3)
    # unchanged policy: ratio 1, loss = -mean(w * A) = -(1 - 1 + 1) / 3
    loss, stats = grpo_loss(p_old.clone(), actions, adv, p_old, p_old, ones, 0.2, 0.0)
    assert float(loss) == pytest.approx(-1 / 3) and stats["clip_fraction"] == 0
    # P(keep) 0.75: ratios 1.5, 1.5, 0.5. Clipped to 1.2, 1.2 (A < 0 keeps the unclipped 1.5: min), 0.8 (A > 0: min
    # is the unclipped 0.5): surrogates 1.2, -1.5, 0.5
    p_new = torch.tensor([0.75, 0.75, 0.75])
    loss, _ = grpo_loss(p_new, actions, adv, p_old, p_old, ones, 0.2, 0.0)
    assert float(loss) == pytest.approx(-(1.2 - 1.5 + 0.5) / 3)
    weights = torch.tensor([2.0, 1.0, 1.0])
    loss, _ = grpo_loss(p_new, actions, adv, p_old, p_old, weights, 0.2, 0.0)
    assert float(loss) == pytest.approx(-(2.4 - 1.5 + 0.5) / 3)
    # KL(0.5 || 0.25) = 0.5 ln 2 + 0.5 ln(2/3) = 0.143841
    _, stats = grpo_loss(torch.tensor([0.5]), torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([0.5]),
                         torch.tensor([0.25]), torch.ones(1), 0.2, 1.0)
    assert stats["kl"] == pytest.approx(0.5 * np.log(2) + 0.5 * np.log(2 / 3), abs=1e-5)
    # summed and divided by a given count (DDP: the whole minibatch's decisions / world)
    loss_sum, _ = grpo_loss(p_old.clone(), actions, adv, p_old, p_old, ones, 0.2, 0.0, normalizer=1.0)
    assert float(loss_sum) == pytest.approx(-1.0)


def test_score_groups_groups_by_problem():
    def rollout(pid, correct, keeps):
        k = len(keeps)
        state = DecisionState(context=[1, 2], draft=[3] * k, target=[4] * (k + 1), mismatch=[1] * k,
                              features=[[0.0] * 16] * k)
        return Rollout(pid, "arith", seed=0, correct=correct, text="", provenance=["match"] * 4,
                       blocks=[DecidedBlock(state, positions=list(range(k)), keep=keeps, p_keep=[0.6] * k,
                                            p_target=[0.5] * k)])

    rollouts = [rollout("a", True, [True]), rollout("a", False, [False]), rollout("b", True, [True]),
                rollout("b", True, [True])]
    rewards, adv, stats = score_groups(rollouts, RewardConfig())
    assert rewards == pytest.approx([1.0, -0.25, 1.0, 1.0])
    assert adv[2:] == [0.0, 0.0] and adv[0] > 0 > adv[1]
    assert stats["mixed_groups"] == 1 and stats["informative_groups"] == 1 and stats["keep_rate"] == 0.75
    items = decision_items(rollouts, adv)
    assert len(items) == 2 and [it.advantage for it in items] == adv[:2]


def test_state_items_values():
    """credit=state: a state whose choices ended differently gives one item per choice, advantage
    +-(q_keep - q_reject) / 2, weighted by the policy's P(choice) (p_behaviour 1 for the choice
    taken); a state whose choices ended alike gives nothing."""
    def state(q_keep, q_reject, position=1):
        block = DecisionState(context=[1, 2], draft=[3, 5], target=[3, 6, 7], mismatch=[0, 1],
                              features=[[0.0] * 16] * 2)
        return BranchedState(block, position, p_keep=0.7, kept=True, q_keep=q_keep, q_reject=q_reject)

    results = [Branched("a", "arith", 0, correct=True, decisions=3, kept=2, states=[state(1.0, 0.5), state(0.5, 0.5)]),
               Branched("b", "arith", 0, correct=False, decisions=1, kept=0, states=[state(0.0, 1.0)])]
    items, stats = state_items(results)
    assert [(it.keep, it.p_behaviour, it.advantage) for it in items] == [
        ([1.0], [1.0], 0.25), ([0.0], [0.0], -0.25), ([1.0], [1.0], -0.5), ([0.0], [0.0], 0.5)]
    assert all(it.positions == [1] for it in items)
    assert stats["states"] == 3 and stats["informative_states"] == 2 and stats["keep_better"] == 1
    assert stats["keep_rate"] == 0.5 and stats["correct"] == 0.5
    assert stats["q_keep"] == pytest.approx(0.5) and stats["q_reject"] == pytest.approx(2 / 3)


class OneLogitPolicy(torch.nn.Module):
    """A policy whose P(keep) is sigmoid(logit) at every decision: grpo_update's gradients and
    steps are then computable by hand."""

    def __init__(self, p_keep: float):
        super().__init__()
        self.logit = torch.nn.Parameter(torch.logit(torch.tensor(p_keep, dtype=torch.float64)).float())

    def forward(self, batch):
        return self.logit.expand(len(batch.features))


def one_sgd_step(items, p_keep: float, is_cap: float = 100.0):
    """grpo_update on the items: one epoch, one minibatch, plain SGD with learning rate 1, no KL
    and no gradient clipping, so the logit moves by exactly -d(loss)/d(logit)."""
    policy = OneLogitPolicy(p_keep)
    before = float(policy.logit.detach())
    cfg = GRPOConfig(epochs=1, minibatch=64, beta=0.0, clip_eps=0.2, is_cap=is_cap, max_grad_norm=1e9)
    stats = grpo_update(policy, policy, items, cfg, torch.optim.SGD(policy.parameters(), lr=1.0), with_tokens=False)
    return stats, float(policy.logit.detach()) - before


def test_grpo_update_gives_a_state_pair_the_policy_gradient_at_its_state():
    """The two items of a state, weighted by grpo_update's importance weight (P(choice) before
    the update over p_behaviour, here 1 for the choice made), move P(keep) by the policy
    gradient: d(-loss)/dP(keep) = (q_keep - q_reject) / (2 decisions) at ratio 1."""
    block = DecisionState(context=[1], draft=[3], target=[4, 5], mismatch=[1], features=[[0.0] * 16])
    items, _ = state_items([Branched("a", "arith", 0, correct=True, decisions=1, kept=1, states=[
        BranchedState(block, 0, p_keep=0.3, kept=True, q_keep=1.0, q_reject=0.25)])])
    stats, step = one_sgd_step(items, p_keep=0.3)
    # weights 0.3 (keep) and 0.7 (reject), advantages +-0.375, mean over 2 decisions:
    # loss = -(0.3 * 0.375 - 0.7 * 0.375) / 2; the logit's step = (1 - 0.25) / 2 x dP/dlogit (0.3 x 0.7)
    assert stats["decisions"] == 2
    assert stats["loss"] == pytest.approx(0.075, rel=1e-4)
    assert step == pytest.approx(0.375 * 0.21, rel=1e-4)  # unweighted: 0.375 x (1/0.3 + 1/0.7) / 2 x 0.21


def test_grpo_update_truncates_the_importance_weight_at_is_cap():
    """Rollout decisions taken with the engine's P(keep): the weight P_torch(choice) /
    P_engine(choice) is capped at is_cap. At P(keep) 0.5: a keep the engine made with 0.25 weighs
    min(2, 1.5), a reject it made with P(keep) 0.2 weighs 0.5 / 0.8."""
    block = DecisionState(context=[1], draft=[3], target=[4, 5], mismatch=[1], features=[[0.0] * 16])
    items = [UpdateItem(block, [0], keep=[1.0], p_behaviour=[0.25], advantage=1.0),
             UpdateItem(block, [0], keep=[0.0], p_behaviour=[0.2], advantage=-0.5)]
    stats, step = one_sgd_step(items, p_keep=0.5, is_cap=1.5)
    w_keep, w_reject = 1.5, 0.625
    assert stats["loss"] == pytest.approx(-(w_keep * 1.0 + w_reject * -0.5) / 2, rel=1e-5)
    # d(ratio)/d(logit) at ratio 1: 1 - P(keep) for a keep, -P(keep) for a reject
    assert step == pytest.approx((w_keep * 1.0 * 0.5 + w_reject * -0.5 * -0.5) / 2, rel=1e-5)


# ---------------------------------------------------------------- rollouts of the engine

@pytest.fixture(scope="module")
def worker():
    w = RolloutWorker(WorkerConfig(str(resolve_model("demo-target")), str(resolve_model("demo-draft")), 2, 256))
    yield w
    w.close()


@pytest.fixture(scope="module")
def mismatch_problems(worker):
    """Training problems where the demo pair disagrees at least once."""
    problems = [p for f in ("arith", "pyfunc") for p in load_task(f, "train", 40)]
    found = [p for p in problems if worker.screen(p).mismatches > 0]
    assert len(found) >= 6
    return found[:6]


def lenient_features_arbiter(tmp_path: Path) -> Path:
    """The bundled features arbiter with its last bias raised: P(keep) well inside (0, 1), so that
    sampled decisions go both ways."""
    from cospec_local.arbiter.file_format import write_arbiter
    from cospec_local.train.arbiter_model import load_arbiter

    draft = resolve_model("demo-draft")
    model = load_arbiter(NAMED_ARBITERS["demo-features"].path, draft)
    with torch.no_grad():
        model.head.layers[-1].bias += 2.0
    return write_arbiter(tmp_path / "lenient", kind="features", head=model.head, draft_gguf=draft, threshold=0.5,
                         name="lenient", onnx=False)


@pytest.fixture(scope="module")
def recorded(worker, mismatch_problems, tmp_path_factory):
    folder = lenient_features_arbiter(tmp_path_factory.mktemp("arbiter"))
    runs = {p.id: worker.rollouts(p, str(folder), [11, 12, 13, 11]) for p in mismatch_problems}
    return folder, runs


@pytest.mark.slow
def test_rollouts_are_seeded_and_recorded_as_decided(worker, mismatch_problems, recorded):
    folder, runs = recorded
    n_keep = n_reject = 0
    for problem in mismatch_problems:
        rollouts = runs[problem.id]
        assert rollouts[0] == rollouts[3]  # same seed, same arbiter: the same rollout
        prompt = worker.engine.tokenize(problem.prompt)
        for r in rollouts:
            # the rollout's text is what the engine generates with these decisions
            assert r.problem_id == problem.id and len(r.provenance) > 0
            for b in r.blocks:
                s = b.state
                n_ctx = len(s.context)
                assert s.context[:len(prompt)] == prompt
                assert len(s.features) == len(s.draft) and len(s.target) == len(s.draft) + 1
                for j, keep, p, pt in zip(b.positions, b.keep, b.p_keep, b.p_target):
                    assert s.draft[j] != s.target[j] and 0 < p < 1
                    assert n_ctx + j >= len(prompt)
                    n_keep += keep
                    n_reject += not keep
    assert n_keep > 0 and n_reject > 0  # P(keep) inside (0, 1): both decisions drawn
    assert any(runs[p.id][0] != runs[p.id][1] for p in mismatch_problems)  # seeds matter


@pytest.mark.slow
def test_branches_try_both_choices_at_decision_states(worker, mismatch_problems, recorded):
    """credit=state: the states are decisions of a policy rollout (mismatches), each choice is
    continued and scored, and the same seed gives the same states and outcomes."""
    folder, _ = recorded
    n_states = 0
    for problem in mismatch_problems:
        first = worker.branches(problem, str(folder), 5, 2, 2)
        assert worker.branches(problem, str(folder), 5, 2, 2) == first
        assert len(first.states) == min(2, first.decisions)
        for st in first.states:
            j = st.position
            assert st.state.draft[j] != st.state.target[j]  # a decision is made at a mismatch
            assert st.q_keep in (0.0, 0.5, 1.0) and st.q_reject in (0.0, 0.5, 1.0)
            assert 0.0 < st.p_keep < 1.0
        n_states += len(first.states)
    assert n_states >= 3


@pytest.mark.parametrize("arbiter", ["lenient-features", "demo-lora"])
@pytest.mark.slow
def test_policy_states_are_the_policys_own_decisions_with_both_branches_scored(worker, mismatch_problems, recorded,
                                                                               arbiter):
    """collect --policy: the run decides as the arbiter does natively (same tokens and answer), its
    states are its decisions at mismatches, each branch starts from the tokens generated before the
    decision, and the choice the run took, continued by the policy, mostly ends as the run did (a
    re-read prefix can round differently in Q8_0's batched product, so not always)."""
    folder = str(recorded[0]) if arbiter == "lenient-features" else arbiter
    threshold = worker.engine.arbiter(folder).threshold
    states, same_as_run = [], []
    for problem in mismatch_problems:
        got = worker.policy_states(problem, folder, "train")
        assert worker.policy_states(problem, folder, "train") == got
        native = worker.greedy(problem, folder)
        assert got.tokens == native.tokens and got.correct == native.correct
        assert len(got.states) == native.decisions
        n_prompt = len(worker.engine.tokenize(problem.prompt))
        for st in got.states:
            j = st.position
            assert st.state.draft[j] != st.state.target[j] and st.state.mismatch[j] == 1
            assert st.kept == (st.p_keep >= threshold)
            assert st.token_index == len(st.state.context) - n_prompt + j  # the branch prefix: block context + d_<j
            taken = st.keep_correct if st.kept else st.reject_correct
            same_as_run.append(taken == got.correct)
        states += got.states
    assert len(states) >= 3
    if arbiter == "lenient-features":  # P(keep) well inside (0, 1): both choices are taken
        assert any(s.kept for s in states) and not all(s.kept for s in states)
    assert sum(same_as_run) >= 0.8 * len(same_as_run)


@pytest.mark.slow
def test_recorded_blocks_give_the_engines_probabilities(worker, recorded):
    """The recorded state reproduces P(keep) when scored again: what the update trains on is what
    the engine decided on."""
    from cospec_local.train.arbiter_model import load_arbiter

    folder, runs = recorded
    model = load_arbiter(folder, resolve_model("demo-draft"))
    blocks = [b for rs in runs.values() for r in rs for b in r.blocks]
    assert blocks
    with torch.no_grad():
        p = policy_probs(model, blocks, with_tokens=False).numpy()
    engine_p = np.array([x for b in blocks for x in b.p_keep])
    assert np.abs(p - engine_p).max() < 1e-4


# ---------------------------------------------------------------- the update's direction

def constructed_items(runs: dict, keep: float, advantage: float) -> list[UpdateItem]:
    """Every recorded decision state, with one action and one advantage for all of them."""
    return [UpdateItem(b.state, b.positions, keep=[keep] * len(b.positions), p_behaviour=b.p_keep,
                       advantage=advantage) for rs in runs.values() for b in rs[0].blocks]


@pytest.mark.parametrize("kind", ["features", "lora"])
@pytest.mark.parametrize("action,advantage,keep_is_right", [(1.0, 1.0, True), (1.0, -1.0, False),
                                                             (0.0, 1.0, False), (0.0, -1.0, True)])
def test_update_moves_p_keep_towards_the_rewarded_decision(recorded, kind, action, advantage, keep_is_right):
    """A batch where keeping was always right (kept and rewarded, or rejected and punished) raises
    P(keep) on its states; one where keeping was always wrong lowers it."""
    from cospec_local.train.arbiter_model import load_arbiter

    _, runs = recorded
    model = load_arbiter(NAMED_ARBITERS[f"demo-{kind}"].path, resolve_model("demo-draft"))
    ref = load_arbiter(NAMED_ARBITERS[f"demo-{kind}"].path, resolve_model("demo-draft"))
    items = constructed_items(runs, keep=action, advantage=advantage)
    with_tokens = kind == "lora"
    cfg = GRPOConfig(epochs=2, minibatch=8, lr=1e-3, beta=0.02)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    with torch.no_grad():
        before = policy_probs(model, items, with_tokens)
    stats = grpo_update(model, ref, items, cfg, optimizer, with_tokens=with_tokens)
    with torch.no_grad():
        after = policy_probs(model, items, with_tokens)
    assert stats["decisions"] == len(before)
    moved = (torch.logit(after) - torch.logit(before)).mean().item()  # logits: no saturation near 0 or 1
    assert (moved > 0.05) if keep_is_right else (moved < -0.05), moved
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    if kind == "lora":  # the draft's own weights never train
        assert frozen and all("lora_" not in n and not n.startswith("head.") for n in frozen)


# ---------------------------------------------------------------- the trainer

def run_trainer(out: Path, *extra: str, launcher: tuple[str, ...] = (sys.executable, "-m")) -> subprocess.CompletedProcess:
    args = [*launcher, "cospec_local.train.grpo", "--init", str(NAMED_ARBITERS["demo-features"].path),
            "--out", str(out), "--pool", "30", "--dev", "8", "--prompts-per-step", "4", "--group-size", "4",
            "--eval-every", "1", "--threads", "1", "--sweep", "0.5,0.9", *extra]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)


def read_log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_trainer_runs_resumes_and_writes_a_loadable_arbiter(tmp_path):
    out = tmp_path / "grpo"
    first = run_trainer(out, "--steps", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    log = read_log(out)
    assert [r["step"] for r in log] == [0, 1] and log[-1]["final"]
    for key in ("reward", "keep_rate", "correct", "loss", "rollout_s", "dev_accuracy"):
        assert key in log[0]
    assert (out / "curves.png").stat().st_size > 0
    # extended by one step: continues from the checkpoint
    second = run_trainer(out, "--steps", "2")
    assert second.returncode == 0, second.stderr[-3000:]
    log = read_log(out)
    assert [r["step"] for r in log] == [0, 1, 1, 2] and "reward" in log[2]
    # other settings in the same folder are refused
    other = run_trainer(out, "--steps", "2", "--lr", "0.1")
    assert other.returncode != 0 and "lr" in other.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["best"]["dev_accuracy"] == max(r["dev_accuracy"] for r in log)
    with Engine("demo-target", "demo-draft", n_ctx=512) as engine:
        run = engine.generate(load_task("arith", "test", 1)[0].prompt, arbiter=str(out / "best"), max_tokens=32)
        assert run.arbiter and run.tokens
    info = json.loads((out / "best" / "info.json").read_text())
    assert info["grpo"]["step"] == summary["best"]["step"] and info["models"]["draft"] == "demo-draft-q8_0.gguf"
    # the shipped threshold: the sweep's best dev accuracy (ties: the higher threshold)
    sweep = summary["sweep"]
    assert sweep["thresholds"] == [0.5, 0.9] and info["threshold"] == sweep["chosen"]
    accuracy = {float(t): r["dev_accuracy"] for t, r in sweep["dev"].items()}
    assert accuracy[sweep["chosen"]] == max(accuracy.values())
    # dev accuracy generates again only the problems that reach a mismatch: the same as all of them
    from cospec_local.tasks import FAMILY_STOPS, score

    dev = [p for f in ("arith", "pyfunc") for p in load_task(f, "dev", 8)]
    with Engine("demo-target", "demo-draft", n_ctx=1024) as engine:
        solved = 0
        for p in dev:
            engine.reset()
            text = engine.generate(p.prompt, arbiter=str(out / "best"), max_tokens=256,
                                   stop=tuple(FAMILY_STOPS[p.family])).text
            solved += score(p, text)
    assert solved / len(dev) == pytest.approx(accuracy[sweep["chosen"]])


@pytest.mark.slow
def test_trainer_under_torchrun_with_two_processes(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed beside this Python")
    out = tmp_path / "ddp"
    done = run_trainer(out, "--steps", "2", "--prune-after", "1",
                       launcher=(str(torchrun), "--nproc-per-node", "2", "--master-port",
                                 str(29500 + os.getpid() % 1000), "-m"))
    assert done.returncode == 0, done.stderr[-3000:]
    log = read_log(out)
    assert [r["step"] for r in log] == [0, 1, 2]
    assert log[0]["groups"] == 4  # both processes' rollouts, gathered
    # prompts whose group had one outcome leave the pool
    uniform = log[0]["groups"] - log[0]["mixed_groups"]
    assert log[1]["live_prompts"] == log[0]["live_prompts"] - uniform
