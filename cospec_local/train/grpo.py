"""GRPO for a learned arbiter, on full CoSpec rollouts of the native engine.

    python -m cospec_local.train.grpo --init cospec_local/data/demo/arbiters/lora --out runs/grpo-lora
    torchrun --nproc-per-node 4 -m cospec_local.train.grpo --init ... --out ...    # several processes

Each step (GRPOTrainer.train_step):
1. draw `prompts_per_step` training problems (from those where draft and target disagree at least
   once under plain speculative decoding: the others give the arbiter no decision to make);
2. roll each out `group_size` times in the rollout workers (rollout.py: their own processes, one
   engine each, no torch), the arbiter's decisions drawn from Bernoulli(P(keep)) with recorded seeds;
3. score the answers, shape the rewards and normalise the advantages within each prompt's group
   (rewards.py);
4. update the policy on the recorded decision states: the clipped ratio objective over decisions
   (PPO / GRPO), an optional exact Bernoulli KL term to the initial (warm-up) arbiter, gradients
   through the LoRA adapter and head only (the head alone for the `features` arbiter). The ratio's
   old probabilities are recomputed in torch; the engine's own P(keep) (quantized draft) enters as
   a truncated importance weight, as TRL does for rollouts from another engine.

Every `eval_every` steps the policy decides by threshold on the dev problems (only those where the
walk reaches a mismatch are generated again: the others give no decision and keep the target's
answer); the best dev accuracy is kept as OUT/best (an arbiter folder the engine loads), and its
keep threshold is finally chosen on dev from `sweep`. OUT/log.jsonl has one
line per step, OUT/curves.png the curves, OUT/checkpoint.pt the resume point (rerun the same
command to go on; the run's progress is a RunState). Under torchrun every process runs its own rollout workers on its share of the
prompts, the rollouts are gathered, and DistributedDataParallel averages the update's gradients.
"""
from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..arbiter.file_format import FEATURES, LORA, read_gate
from ..tasks import load_task
from ..tasks.base import stable_int
from ..command_line import comma_list, option, parse_config
from .rewards import RewardConfig, group_advantages, rollout_reward
from .rollout import (Branched, BranchedState, BranchesTask, DecidedBlock, GreedyTask, Rollout, RolloutPool,
                      RolloutsTask, ScreenTask, Screening, Task, WorkerConfig)
from .states import DecisionState


@dataclass
class GRPOConfig:
    """GRPO training of a learned arbiter (features or LoRA) on full CoSpec rollouts."""

    init: Path = option(None, "Arbiter folder to start from (a warm-up arbiter); its kind (features or lora) is "
                              "the kind trained, and it is the KL reference.")
    out: Path = option(None, "Output folder: log.jsonl, curves.png, checkpoint.pt, best/ (the trained arbiter).")
    target: str = option("demo-target", "Target model (named or GGUF path).", ("-m", "--model"))
    draft: str = option("demo-draft", "Draft model (named or GGUF path): the one the arbiter was made for.",
                        ("-md", "--model-draft"))
    families: str = option("arith,pyfunc", "Task families to train on (comma-separated).")
    pool: int = option(3000, "Training problems per family screened for mismatches (the prompt pool).")
    pool_from: Path | None = option(None, "Reuse the prompt pool another run screened (its pool.json) instead of "
                                          "screening again; it must be for the same models, families and sizes.")
    steps: int = option(60, "GRPO steps.")
    prune_after: int = option(0, "Leave out of later steps a prompt whose group came out all right or all wrong "
                                 "this many times (it teaches nothing; DAPO's dynamic sampling, cheaply); 0: never.")
    prompts_per_step: int = option(32, "Prompts per step (over all processes).")
    group_size: int = option(8, "Rollouts per prompt (G).")
    credit: str = option("rollout", "What a decision is credited with: rollout (the advantage of its whole "
                                    "rollout within the prompt's group) or state (both choices tried at single "
                                    "decision states of a policy rollout and continued by the policy: the "
                                    "difference of their outcomes).")
    states_per_prompt: int = option(2, "credit=state: decision states per prompt's rollout.")
    continuations: int = option(2, "credit=state: continuations of each choice at a state (the same seeds for "
                                   "both choices, so their difference is paired).")
    greedy_continuations: bool = option(False, "credit=state: continue each choice once, deciding by the policy's "
                                               "threshold as it is used, instead of sampling its decisions.")
    explore_temperature: float = option(1.0, "Rollouts draw decisions from sigmoid(logit(P(keep)) / this): above 1, "
                                             "decisions the policy is sure of are tried the other way more often "
                                             "(the importance weight corrects the update for it).")
    epochs: int = option(2, "Passes over each step's decisions (mu).")
    minibatch: int = option(64, "Blocks per optimizer step.")
    lr: float = option(5e-4, "AdamW learning rate.")
    weight_decay: float = option(0.0, "AdamW weight decay.")
    clip_eps: float = option(0.2, "Clip range of the probability ratio.")
    beta: float = option(0.02, "Weight of the KL term to the initial arbiter (0: none).")
    is_cap: float = option(2.0, "Cap of the importance weight between torch's and the engine's P(decision).")
    max_grad_norm: float = option(1.0, "Gradient norm clip.")
    span_bonus: float = option(RewardConfig.span_bonus, "Correct rollouts: reward 1 + this x the share of tokens "
                                                        "kept at or after a kept mismatch.")
    risk_prob: float = option(RewardConfig.risk_prob, "Wrong rollouts: a kept draft token below this target "
                                                      "probability is a risky keep.")
    risk_penalty: float = option(RewardConfig.risk_penalty, "Wrong rollouts: penalty per risky keep "
                                                            "(averaged over decisions).")
    fallback_penalty: float = option(RewardConfig.fallback_penalty, "Wrong rollouts: penalty per rejected "
                                                                    "mismatch (averaged over decisions).")
    std_floor: float = option(RewardConfig.std_floor, "Floor of the group's reward std in the advantage.")
    threshold: float | None = option(None, "Keep threshold of the exported arbiter, for dev evaluation and use "
                                           "(default: the initial arbiter's own).")
    sweep: str = option("0.3,0.4,0.5,0.6,0.7,0.8", "After training, the best policy's dev accuracy at these keep "
                                                  "thresholds; the best ships (ties: the higher). Empty: keep "
                                                  "--threshold.")
    dev: int = option(150, "Dev problems per family for the dev accuracy.")
    eval_every: int = option(5, "Evaluate on dev every this many steps (and at the first and last).")
    max_tokens: int = option(256, "Most tokens per answer.")
    workers: int = option(1, "Rollout worker processes (per training process).")
    threads: int = option(2, "CPU threads: torch's in the update, split among the rollout workers.")
    seed: int = option(0, "Seed of prompt order, rollouts and initialisation.")


# ---------------------------------------------------------------- decisions to train on

@dataclass(frozen=True)
class UpdateItem:
    """Decisions at one state for the policy update: the actions taken at its decided positions,
    the probabilities they were taken with (the importance weight's denominator) and their advantage."""

    state: DecisionState
    positions: list[int]
    keep: list[float]         # the actions: 1.0 keep, 0.0 reject
    p_behaviour: list[float]  # P(keep) of the policy that acted
    advantage: float


def decision_items(rollouts: list[Rollout], advantages: list[float]) -> list[UpdateItem]:
    """One item per recorded block of a rollout with a non-zero advantage: the block's decisions,
    the engine's P(keep) and the rollout's advantage."""
    items = []
    for r, a in zip(rollouts, advantages):
        if a == 0.0:
            continue
        for b in r.blocks:
            items.append(UpdateItem(b.state, b.positions, keep=[float(k) for k in b.keep], p_behaviour=b.p_keep,
                                    advantage=a))
    return items


def state_items(results: list[Branched]) -> tuple[list[UpdateItem], dict]:
    """credit=state: two items per decision state whose choices ended differently, one per choice,
    with advantage +-(q_keep - q_reject) / 2 (the value of each choice over their mean). The
    surrogate weighs each item by the policy's P(choice) before the update (p_behaviour is set so
    that the importance weight is exactly that), so at the start of the update (ratio 1) the pair's
    gradient is (q_keep - q_reject) x grad P(keep): the policy gradient at that state, with the
    q's estimated by the continuations."""
    items = []
    states: list[BranchedState] = [s for r in results for s in r.states]
    for st in states:
        gap = st.q_keep - st.q_reject
        if gap == 0.0:
            continue
        for keep in (1.0, 0.0):
            items.append(UpdateItem(st.state, [st.position], keep=[keep], p_behaviour=[keep],
                                    advantage=gap / 2 if keep else -gap / 2))
    n_dec = sum(r.decisions for r in results)
    stats = {"correct": sum(r.correct for r in results) / max(1, len(results)),
             "keep_rate": sum(r.kept for r in results) / max(1, n_dec),
             "decisions_per_rollout": n_dec / max(1, len(results)), "states": len(states),
             "informative_states": sum(s.q_keep != s.q_reject for s in states),
             "keep_better": sum(s.q_keep > s.q_reject for s in states),
             "q_keep": sum(s.q_keep for s in states) / max(1, len(states)),
             "q_reject": sum(s.q_reject for s in states) / max(1, len(states))}
    stats["reward"] = stats["correct"]  # the log's and progress bar's reward: the rollouts' outcome
    return items, stats


def policy_probs(model, items: list[UpdateItem] | list[DecidedBlock], with_tokens: bool):
    """P(keep) at every decided position of the items, concatenated in item order."""
    import torch

    from .arbiter_model import make_batch

    return torch.sigmoid(model(make_batch([it.state for it in items], [it.positions for it in items],
                                          with_tokens=with_tokens)))


def grpo_loss(p_new, actions, advantages, p_old, p_ref, weights, clip_eps: float, beta: float,
              normalizer: float | None = None):
    """Clipped surrogate plus beta x KL(pi || ref) (exact for Bernoulli decisions), summed over the
    decisions and divided by `normalizer` (default: their number, i.e. the mean). Returns (loss, stats)."""
    import torch

    normalizer = float(len(p_new)) if normalizer is None else normalizer
    eps = 1e-6
    p_new = p_new.clamp(eps, 1 - eps)
    logp = torch.where(actions > 0.5, p_new.log(), (1 - p_new).log())
    logp_old = torch.where(actions > 0.5, p_old.clamp(eps, 1 - eps).log(), (1 - p_old).clamp(eps, 1).log())
    ratio = (logp - logp_old).exp()
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps)
    surrogate = torch.minimum(ratio * advantages, clipped * advantages)
    loss = -(weights * surrogate).sum() / normalizer
    kl = torch.zeros(())
    if beta > 0:
        q = p_ref.clamp(eps, 1 - eps)
        kl_each = p_new * (p_new / q).log() + (1 - p_new) * ((1 - p_new) / (1 - q)).log()
        kl = kl_each.mean()
        loss = loss + beta * kl_each.sum() / normalizer
    stats = {"clip_fraction": float(((ratio - clipped).abs() > 1e-9).float().mean()), "kl": float(kl.detach())}
    return loss, stats


def grpo_update(model, ref, items: list[UpdateItem], cfg: GRPOConfig, optimizer, *, with_tokens: bool,
                rank: int = 0, world: int = 1, train_model=None, step: int = 0) -> dict:
    """Policy update on one step's items (identical on every process; each trains on its share of
    every minibatch). `train_model` is the DDP wrapper of `model` under torchrun. Each minibatch's
    loss is its mean over all of its decisions, whatever the number of processes: a process divides
    its sum by the minibatch's decision count / world, and DDP averages over the world."""
    import torch

    train_model = train_model or model
    n = len(items)
    if n == 0:
        return {"loss": 0.0, "clip_fraction": 0.0, "kl": 0.0, "grad_norm": 0.0, "decisions": 0}
    model.eval()
    with torch.no_grad():  # the ratio's denominator: this policy before the update, in torch
        chunks = [items[i:i + 64] for i in range(0, n, 64)]
        p_old = [policy_probs(model, c, with_tokens) for c in chunks]
        p_ref = [policy_probs(ref, c, with_tokens) for c in chunks] if cfg.beta > 0 else p_old
    offsets, n_decisions = [], 0
    for it in items:
        offsets.append(n_decisions)
        n_decisions += len(it.positions)
    p_old, p_ref = torch.cat(p_old), torch.cat(p_ref)
    trainable = [p for p in model.parameters() if p.requires_grad]
    rng = random.Random(cfg.seed * 1_000_003 + step)
    per_step = cfg.minibatch * world
    n_batches = math.ceil(n / per_step)
    totals = {"loss": 0.0, "clip_fraction": 0.0, "kl": 0.0, "grad_norm": 0.0}
    n_opt = 0
    model.train()
    for _ in range(cfg.epochs):
        order = list(range(n))
        rng.shuffle(order)
        for b in range(n_batches):
            minibatch = order[b * per_step:(b + 1) * per_step]
            mine = minibatch[rank::world]
            normalizer = sum(len(items[i].positions) for i in minibatch) / world
            live = 1.0
            if not mine:  # every process takes part in every optimizer step (DDP all-reduces)
                mine, live = [order[0]], 0.0
            sel = [items[i] for i in mine]
            idx = torch.tensor([offsets[i] + j for i in mine for j in range(len(items[i].positions))])
            actions = torch.tensor([a for it in sel for a in it.keep])
            adv = torch.tensor([it.advantage for it in sel for _ in it.positions])
            behaviour = torch.tensor([p for it in sel for p in it.p_behaviour]).clamp(1e-6, 1 - 1e-6)
            old = p_old[idx]
            # Truncated importance weight: torch's P(action) before the update over the engine's.
            p_act_old = torch.where(actions > 0.5, old, 1 - old)
            p_act_beh = torch.where(actions > 0.5, behaviour, 1 - behaviour)
            weights = (p_act_old / p_act_beh).clamp(max=cfg.is_cap)
            p_new = policy_probs(train_model, sel, with_tokens)
            loss, stats = grpo_loss(p_new, actions, adv, old, p_ref[idx], weights, cfg.clip_eps, cfg.beta, normalizer)
            optimizer.zero_grad()
            (loss * live).backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(trainable, cfg.max_grad_norm)
            optimizer.step()
            totals["loss"] += float(loss.detach())
            totals["clip_fraction"] += stats["clip_fraction"]
            totals["kl"] += stats["kl"]
            totals["grad_norm"] += float(grad_norm)
            n_opt += 1
    model.eval()
    out = {k: v / max(n_opt, 1) for k, v in totals.items()}
    out["decisions"] = n_decisions
    return out


# ---------------------------------------------------------------- rewards of a step

def score_groups(rollouts: list[Rollout], rc: RewardConfig) -> tuple[list[float], list[float], dict]:
    """Rewards and advantages of a step's rollouts (grouped by problem, in order)."""
    rewards = [rollout_reward(r.correct, r.provenance,
                              [{"keep": k, "p_target": p} for b in r.blocks for k, p in zip(b.keep, b.p_target)],
                              rc) for r in rollouts]
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(rollouts):
        groups.setdefault(r.problem_id, []).append(i)
    advantages = [0.0] * len(rollouts)
    informative = mixed = 0
    for members in groups.values():
        adv = group_advantages([rewards[i] for i in members],
                               [sum(len(b.positions) for b in rollouts[i].blocks) for i in members],
                               [rollouts[i].correct for i in members], rc)
        informative += any(a != 0 for a in adv)
        outcomes = {rollouts[i].correct for i in members}
        mixed += len(outcomes) == 2
        for i, a in zip(members, adv):
            advantages[i] = a
    n_dec = sum(len(b.positions) for r in rollouts for b in r.blocks)
    n_keep = sum(sum(b.keep) for r in rollouts for b in r.blocks)
    stats = {"reward": sum(rewards) / max(1, len(rewards)),
             "correct": sum(r.correct for r in rollouts) / max(1, len(rollouts)),
             "keep_rate": n_keep / max(1, n_dec), "decisions_per_rollout": n_dec / max(1, len(rollouts)),
             "groups": len(groups), "informative_groups": informative, "mixed_groups": mixed}
    return rewards, advantages, stats


# ---------------------------------------------------------------- the run

class Distributed:
    """torchrun's environment, or a single process."""

    def __init__(self):
        import torch.distributed as dist

        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.dist = dist if self.world > 1 else None
        if self.dist is not None:
            dist.init_process_group("gloo")

    def gather(self, obj) -> list:
        """Every process's `obj`, in rank order, on every process."""
        if self.dist is None:
            return [obj]
        out = [None] * self.world
        self.dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.dist is not None:
            self.dist.barrier()

    def close(self) -> None:
        if self.dist is not None:
            self.dist.destroy_process_group()


def export_policy(model, kind: str, folder: Path, draft_gguf: Path, threshold: float, info: dict,
                  onnx: bool, target: dict | None = None, gate=None) -> Path:
    """The policy as an arbiter folder, with the domain gate of the arbiter it started from."""
    from cospec_local.arbiter.file_format import write_arbiter

    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    extra = {}
    if kind == LORA:
        extra = model.export_args()
    description = {FEATURES: "MLP over the block's features, warm-up then GRPO on CoSpec rollouts",
                   LORA: "draft + LoRA adapter, head over hidden states and features, warm-up then GRPO on "
                           "CoSpec rollouts"}[kind]
    write_arbiter(tmp, kind=kind, head=model.head, draft_gguf=draft_gguf, threshold=threshold,
                  name=f"{draft_gguf.stem.split('-q')[0]}-{kind}", description=description, info=info, onnx=onnx,
                  verify_cost=getattr(model, "verify_cost", None), target=target, gate=gate, **extra)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def save_checkpoint(path: Path, payload: dict) -> None:
    import torch

    torch.save(payload, path.with_suffix(".tmp"))
    os.replace(path.with_suffix(".tmp"), path)


def plot_curves(log: list[dict], path: Path, target_dev: float | None) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    steps_log = [r for r in log if "reward" in r]  # the last line may be a dev evaluation only
    steps = [r["step"] for r in steps_log]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot(steps, [r["reward"] for r in steps_log], label="mean reward")
    axes[0].plot(steps, [r["correct"] for r in steps_log], label="rollouts correct")
    axes[0].set_title("rollouts")
    axes[1].plot(steps, [r["keep_rate"] for r in steps_log], color="tab:green")
    axes[1].set_title("keep rate (sampled decisions)")
    dev = [(r["step"], r["dev_accuracy"]) for r in log if r.get("dev_accuracy") is not None]
    if dev:
        axes[2].plot(*zip(*dev), marker="o", label="arbiter (threshold)")
    if target_dev is not None:
        axes[2].axhline(target_dev, color="gray", linestyle="--", label="target only")
    axes[2].set_title("dev accuracy")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@dataclass
class RunState:
    """Where a run stands: what the checkpoint keeps besides the weights and the optimizer."""

    step: int = 0                                  # the next step to run
    log: list[dict] = field(default_factory=list)  # OUT/log.jsonl: one record per step, then the final evaluation
    best: dict | None = None                       # {"step", "dev_accuracy"} of the policy in OUT/best
    pool: list[str] | None = None                  # the training problems that reach a mismatch (ids)
    dev_screen: list[Screening] | None = None      # each dev problem's plain speculative run (RolloutWorker.screen)
    target_dev: float | None = None                # target-only dev accuracy
    seconds: float = 0.0                           # wall time of the run so far, over resumes
    uniform: dict[str, int] = field(default_factory=dict)  # prompt id -> its groups that came out all alike
    sweep: dict | None = None                      # the best policy's dev accuracy at each threshold of cfg.sweep

    def __post_init__(self):  # a checkpoint holds the screenings as dicts
        if self.dev_screen is not None:
            self.dev_screen = [s if isinstance(s, Screening) else Screening(**s) for s in self.dev_screen]


class GRPOTrainer:
    """One training process (of `world` under torchrun): the policy, its reference, the rollout
    workers, and the run's state. `train` runs it to the end, resuming from OUT/checkpoint.pt."""

    def __init__(self, cfg: GRPOConfig):
        import torch

        from cospec_local import _cospec
        from cospec_local.models import resolve_model

        from .arbiter_model import load_arbiter

        self.cfg = cfg
        self.ddp = Distributed()
        self.rank, self.world = self.ddp.rank, self.ddp.world
        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.draft = Path(resolve_model(cfg.draft))
        target = Path(resolve_model(cfg.target))
        init = Path(cfg.init)

        # The policy trains its LoRA adapter and head (the features arbiter: its head); the
        # reference, the initial arbiter, stays as it is for the KL term.
        self.model = load_arbiter(init, self.draft)
        self.kind = self.model.kind
        if cfg.threshold is None:
            cfg.threshold = self.model.threshold
        self.with_tokens = self.kind == LORA
        for name, p in self.model.named_parameters():
            p.requires_grad_(self.kind == FEATURES or "lora_" in name or name.startswith("head."))
        self.ref = load_arbiter(init, self.draft)
        self.gate = read_gate(init)
        for p in self.ref.parameters():
            p.requires_grad_(False)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.train_model = self.model
        if self.ddp.dist is not None:
            self.train_model = torch.nn.parallel.DistributedDataParallel(self.model)
        self.rewards = RewardConfig(cfg.span_bonus, cfg.risk_prob, cfg.risk_penalty, cfg.fallback_penalty,
                                    cfg.std_floor)

        self.out = Path(cfg.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.config_record = {k: str(v) for k, v in asdict(cfg).items()}
        self.target_record = {"fingerprint": _cospec.model_fingerprint(str(target)), "file": Path(target).name}
        self.identity = {"target": target.name, "draft": self.draft.name,
                         "draft_fingerprint": _cospec.model_fingerprint(str(self.draft)), "init": str(init),
                         "kind": self.kind}
        self.checkpoint_path = self.out / "checkpoint.pt"
        self.run = self.resume()
        self.families = comma_list(cfg.families)
        self.worker_config = WorkerConfig(str(target), str(self.draft), max(1, cfg.threads // cfg.workers),
                                          cfg.max_tokens)
        self.dev_problems = [p for f in self.families for p in load_task(f, "dev", cfg.dev)]
        self.train_problems = [p for f in self.families for p in load_task(f, "train", cfg.pool)]
        self.policies = self.out / "policy" / f"rank{self.rank}"  # a folder per step: the workers reload a new path
        self.t_start = time.time() - self.run.seconds
        self.pool: RolloutPool | None = None

    # ------------------------------------------------------------ the run

    def train(self) -> None:
        from tqdm import tqdm

        if self.rank == 0:  # the log is what the checkpoint holds: a step redone after a crash is not logged twice
            (self.out / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in self.run.log))
        with RolloutPool(self.worker_config, self.cfg.workers) as pool:
            self.pool = pool
            self.screen_problems()
            bar = tqdm(range(self.run.step, self.cfg.steps), initial=self.run.step, total=self.cfg.steps,
                       desc="GRPO", unit="step", disable=self.rank != 0, file=sys.stderr)
            for step in bar:
                record = self.train_step(step)
                bar.set_postfix(reward=f"{record['reward']:.3f}", keep=f"{record['keep_rate']:.2f}",
                                dev=record.get("dev_accuracy", "-"))
            if self.run.log and not self.run.log[-1].get("final"):
                self.evaluate_last_policy()
            self.sweep_threshold()
        self.write_summary()
        self.ddp.close()

    def train_step(self, step: int) -> dict:
        """Evaluate (every eval_every steps), roll out, credit the decisions, update the policy, log."""
        cfg = self.cfg
        t0 = time.time()
        policy = self.export_step_policy(step)
        record: dict = {"step": step}
        if step == 0 or step % cfg.eval_every == 0:
            record.update(self.dev_accuracy(policy))
            self.keep_if_best(step, record)
        t_eval = time.time() - t0
        prompts, n_live = self.draw_prompts(step)
        credit = self.credit_states if cfg.credit == "state" else self.credit_rollouts
        items, stats = credit(step, prompts, policy)
        t_rollout = time.time() - t0 - t_eval
        stats["live_prompts"] = n_live
        update = grpo_update(self.model, self.ref, items, cfg, self.optimizer, with_tokens=self.with_tokens,
                             rank=self.rank, world=self.world, train_model=self.train_model, step=step)
        record.update(stats)
        record.update(update)
        record.update({"rollout_s": round(t_rollout, 1), "eval_s": round(t_eval, 1),
                       "update_s": round(time.time() - t0 - t_eval - t_rollout, 1)})
        self.run.step = step + 1
        self.log(record)
        return record

    def credit_rollouts(self, step: int, prompts: list, policy: Path) -> tuple[list[UpdateItem], dict]:
        """credit=rollout: `group_size` rollouts per prompt; each decision is credited with its
        rollout's advantage within the prompt's group."""
        cfg = self.cfg
        groups = self.spread([RolloutsTask(p, str(policy), [self.rollout_seed(step, p.id, g)
                                                            for g in range(cfg.group_size)], cfg.explore_temperature)
                              for p in prompts], "rollouts")
        rollouts = [r for group in groups for r in group]
        _, advantages, stats = score_groups(rollouts, self.rewards)
        for group in groups:  # a prompt whose rollouts all ended alike teaches nothing
            if len({r.correct for r in group}) == 1:
                self.count_uniform(group[0].problem_id)
        return decision_items(rollouts, advantages), stats

    def credit_states(self, step: int, prompts: list, policy: Path) -> tuple[list[UpdateItem], dict]:
        """credit=state: one rollout per prompt, both choices tried at some of its decisions and
        continued by the policy; each such decision is credited with the difference of the outcomes."""
        cfg = self.cfg
        results = self.spread([BranchesTask(p, str(policy), self.rollout_seed(step, p.id), cfg.states_per_prompt,
                                            cfg.continuations, cfg.explore_temperature, cfg.greedy_continuations)
                               for p in prompts], "decision states")
        for r in results:  # a prompt whose states never split teaches nothing
            if all(st.q_keep == st.q_reject for st in r.states):
                self.count_uniform(r.problem_id)
        return state_items(results)

    def evaluate_last_policy(self) -> None:
        """The dev accuracy of the policy after the last step (the evaluations ran before steps)."""
        final = self.dev_accuracy(self.export_step_policy(self.cfg.steps))
        self.keep_if_best(self.cfg.steps, final)
        self.log({"step": self.cfg.steps, **final, "final": True})

    def sweep_threshold(self) -> None:
        """The threshold the best policy ships with: the best of its dev accuracies at cfg.sweep's
        thresholds (ties: the higher). Done once per best policy and list of thresholds."""
        from .arbiter_model import load_arbiter

        thresholds = [float(t) for t in comma_list(self.cfg.sweep)]
        done = self.run.sweep or {}
        if not thresholds or (done.get("thresholds"), done.get("best_step")) == (thresholds, self.run.best["step"]):
            return
        self.ddp.barrier()  # rank 0 wrote best/
        best = load_arbiter(self.out / "best", self.draft)
        candidate = export_policy(best, self.kind, self.policies / "best", self.draft, self.cfg.threshold, {},
                                  onnx=False, target=self.target_record, gate=self.gate)
        dev = {t: self.dev_accuracy(candidate, t) for t in thresholds}
        chosen = max(thresholds, key=lambda t: (dev[t]["dev_accuracy"], t))
        self.run.sweep = {"thresholds": thresholds, "best_step": self.run.best["step"], "chosen": chosen,
                          "dev": {str(t): r for t, r in dev.items()}}
        if self.rank == 0:
            best_info = json.loads((self.out / "best" / "info.json").read_text())
            export_policy(best, self.kind, self.out / "best", self.draft, chosen,
                          {k: best_info[k] for k in ("grpo", "config", "models")} | {"sweep": self.run.sweep},
                          onnx=True, target=self.target_record, gate=self.gate)
            self.save_checkpoint()

    def write_summary(self) -> None:
        if self.rank != 0:
            return
        summary = {"best": self.run.best, "sweep": self.run.sweep, "target_dev_accuracy": self.run.target_dev,
                   "steps": self.run.step, "wall_seconds": round(time.time() - self.t_start, 1),
                   "identity": self.identity, "config": self.config_record}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(json.dumps(summary["best"]), file=sys.stderr)

    # ------------------------------------------------------------ prompts

    def screen_problems(self) -> None:
        """Once per run (or reused from --pool-from): which training problems reach a mismatch under
        plain speculative decoding (the prompt pool), and each dev problem's plain run."""
        cfg, run = self.cfg, self.run
        pool_key = {"models": self.identity | {"init": None, "kind": None}, "families": self.families,
                    "pool": cfg.pool, "max_tokens": cfg.max_tokens}
        if run.pool is None and cfg.pool_from is not None:
            reused = json.loads(Path(cfg.pool_from).read_text())
            if reused["key"] != pool_key:
                sys.exit(f"{cfg.pool_from} was screened for other models or settings")
            run.pool = reused["ids"]
            reused_dev = [Screening(**s) for s in reused.get("dev_screen") or []]
            if [s.problem_id for s in reused_dev] == [p.id for p in self.dev_problems]:
                run.dev_screen = reused_dev
        if run.pool is None:
            screened = self.spread([ScreenTask(p) for p in self.train_problems], "screening the prompt pool")
            run.pool = [s.problem_id for s in screened if s.mismatches > 0]
        if run.dev_screen is None:
            run.dev_screen = self.spread([ScreenTask(p) for p in self.dev_problems], "screening the dev problems")
        self.dev_screen = {s.problem_id: s for s in run.dev_screen}
        run.target_dev = sum(s.target_correct for s in run.dev_screen) / len(self.dev_problems)
        by_id = {p.id: p for p in self.train_problems}
        self.pool_problems = [by_id[i] for i in run.pool]
        # Dev problems where the walk never reaches a mismatch give no arbiter a decision: their
        # answers are the target's. Only the others are generated again at each evaluation.
        self.dev_live = [p for p in self.dev_problems if self.dev_screen[p.id].mismatches > 0]
        if self.rank == 0:
            (self.out / "pool.json").write_text(json.dumps({"key": pool_key, "ids": run.pool,
                                                            "dev_screen": [asdict(s) for s in run.dev_screen]}))
            print(f"prompt pool: {len(self.pool_problems)} of {len(by_id)} training problems reach a mismatch; "
                  f"{len(self.dev_live)} of {len(self.dev_problems)} dev problems; "
                  f"target-only dev accuracy {run.target_dev:.3f}", file=sys.stderr)

    def draw_prompts(self, step: int) -> tuple[list, int]:
        """The step's prompts (the same on every process), and how many the pool had left to draw from."""
        prune_after = self.cfg.prune_after
        live = [p for p in self.pool_problems if not prune_after or self.run.uniform.get(p.id, 0) < prune_after]
        rng = random.Random(stable_int("grpo-prompts", self.cfg.seed, step))
        return rng.sample(live, min(self.cfg.prompts_per_step, len(live))), len(live)

    def rollout_seed(self, step: int, *key) -> int:
        return stable_int("grpo-rollout", self.cfg.seed, step, *key) % (1 << 63)

    def count_uniform(self, problem_id: str) -> None:
        self.run.uniform[problem_id] = self.run.uniform.get(problem_id, 0) + 1

    # ------------------------------------------------------------ workers, policies, evaluation

    def spread(self, tasks: list[Task], desc: str | None = None) -> list:
        """Run this process's share of `tasks` in its workers and gather all results in task order."""
        from tqdm import tqdm

        mine = tasks[self.rank::self.world]
        done = list(tqdm(self.pool.map(mine), total=len(mine), desc=desc, leave=False,
                         disable=desc is None or self.rank != 0, file=sys.stderr))
        results = [None] * len(tasks)
        for r, part in enumerate(self.ddp.gather(done)):
            results[r::self.world] = part
        return results

    def export_step_policy(self, step: int) -> Path:
        """The policy as the workers load it, in a new folder (a worker reloads only a new path)."""
        shutil.rmtree(self.policies, ignore_errors=True)
        return export_policy(self.model, self.kind, self.policies / f"step-{step:05d}", self.draft, self.cfg.threshold,
                             self.arbiter_info(step, None), onnx=False, target=self.target_record, gate=self.gate)

    def arbiter_info(self, step: int, dev: dict | None) -> dict:
        return {"grpo": {"step": step, "dev": dev, "target_dev_accuracy": self.run.target_dev},
                "config": self.config_record, "models": self.identity}

    def dev_accuracy(self, folder: Path, threshold: float | None = None) -> dict:
        """The arbiter in `folder`, deciding by its threshold (or `threshold`), on the dev problems."""
        results = {r.problem_id: r for r in self.spread([GreedyTask(p, str(folder), threshold)
                                                            for p in self.dev_live], "dev")}
        correct = {p.id: results[p.id].correct if p.id in results else self.dev_screen[p.id].target_correct
                   for p in self.dev_problems}
        by_family = {f: sum(correct[p.id] for p in self.dev_problems if p.family == f) /
                     max(1, sum(p.family == f for p in self.dev_problems)) for f in self.families}
        return {"dev_accuracy": sum(correct.values()) / len(self.dev_problems), "dev_by_family": by_family,
                "dev_keeps_per_problem": sum(r.kept for r in results.values()) / len(self.dev_problems)}

    def keep_if_best(self, step: int, dev: dict) -> None:
        """The policy becomes OUT/best when its dev accuracy is the run's highest so far."""
        if self.run.best is None or dev["dev_accuracy"] > self.run.best["dev_accuracy"]:
            self.run.best = {"step": step, "dev_accuracy": dev["dev_accuracy"]}
            if self.rank == 0:
                export_policy(self.model, self.kind, self.out / "best", self.draft, self.cfg.threshold,
                              self.arbiter_info(step, dev), onnx=True, target=self.target_record, gate=self.gate)

    # ------------------------------------------------------------ checkpoint and log

    def resume(self) -> RunState:
        """The state of the run in OUT, the policy and optimizer restored from its checkpoint, or a new run."""
        import torch

        if not self.checkpoint_path.is_file():
            return RunState()
        saved = torch.load(self.checkpoint_path, weights_only=False)
        changed = {k for k, v in self.config_record.items() if saved["config"].get(k) != v} - {"steps", "sweep"}
        if changed or saved["identity"] != self.identity:  # a run can be extended, or its threshold swept again
            sys.exit(f"{self.out} holds a run with other settings ({', '.join(sorted(changed)) or 'models'}); "
                     f"use another --out")
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        return RunState(**saved["state"])

    def save_checkpoint(self) -> None:
        save_checkpoint(self.checkpoint_path, {"config": self.config_record, "identity": self.identity,
                                               "model": self.model.state_dict(),
                                               "optimizer": self.optimizer.state_dict(), "state": asdict(self.run)})

    def log(self, record: dict) -> None:
        """Append a record to the log (rank 0 writes it, checkpoints and plots); every process waits here."""
        self.run.log.append(record)
        self.run.seconds = time.time() - self.t_start
        if self.rank == 0:
            with (self.out / "log.jsonl").open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            self.save_checkpoint()
            plot_curves(self.run.log, self.out / "curves.png", self.run.target_dev)
        self.ddp.barrier()


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(GRPOConfig, argv, __doc__.split("\n\n")[0])
    if cfg.init is None or cfg.out is None:
        sys.exit("--init and --out are required")
    for name, low in (("steps", 1), ("eval_every", 1), ("dev", 1), ("minibatch", 1), ("group_size", 2),
                      ("prompts_per_step", 1), ("epochs", 1), ("pool", 1), ("workers", 1), ("threads", 1),
                      ("states_per_prompt", 1), ("continuations", 1)):
        if getattr(cfg, name) < low:
            sys.exit(f"--{name.replace('_', '-')} must be at least {low}")
    if cfg.credit not in ("rollout", "state"):
        sys.exit(f"--credit must be rollout or state, not {cfg.credit!r}")
    GRPOTrainer(cfg).train()


if __name__ == "__main__":
    main()
