"""GRPO for a learned arbiter, on full CoSpec rollouts of the native engine.

    python -m cospec_local.train.grpo --init cospec_local/data/demo/arbiters/lora --out runs/grpo-lora
    torchrun --nproc-per-node 4 -m cospec_local.train.grpo --init ... --out ...    # several processes

Each step:
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
command to go on). Under torchrun every process runs its own rollout workers on its share of the
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
from dataclasses import asdict, dataclass
from pathlib import Path

from .config import comma_list, option, parse_config
from .rewards import RewardConfig, group_advantages, rollout_reward
from .rollout import BranchedState, DecidedBlock
from .states import DecisionState


@dataclass
class GRPOConfig:
    """GRPO training of a learned arbiter (features or LoRA) on full CoSpec rollouts."""

    init: Path = option(None, "Arbiter folder to start from (a warm-up arbiter); its kind (features or lora) is "
                              "the kind trained, and it is the KL reference.")
    out: Path = option(None, "Output folder: log.jsonl, curves.png, checkpoint.pt, best/ (the trained arbiter).")
    target: str = option("demo-target", "Target model (named or GGUF path).")
    draft: str = option("demo-draft", "Draft model (named or GGUF path): the one the arbiter was made for.")
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


def decision_items(rollouts: list[dict], advantages: list[float]) -> list[UpdateItem]:
    """One item per recorded block of a rollout with a non-zero advantage: the block's decisions,
    the engine's P(keep) and the rollout's advantage."""
    items = []
    for r, a in zip(rollouts, advantages):
        if a == 0.0:
            continue
        for b in r["blocks"]:
            items.append(UpdateItem(b.state, b.positions, keep=[float(k) for k in b.keep], p_behaviour=b.p_keep,
                                    advantage=a))
    return items


def state_items(results: list[dict]) -> tuple[list[UpdateItem], dict]:
    """credit=state: two items per decision state whose choices ended differently, one per choice,
    with advantage +-(q_keep - q_reject) / 2 (the value of each choice over their mean). The
    surrogate weighs each item by the policy's P(choice) before the update (p_behaviour is set so
    that the importance weight is exactly that), so at the start of the update (ratio 1) the pair's
    gradient is (q_keep - q_reject) x grad P(keep): the policy gradient at that state, with the
    q's estimated by the continuations."""
    items = []
    states: list[BranchedState] = [s for r in results for s in r["states"]]
    for st in states:
        gap = st.q_keep - st.q_reject
        if gap == 0.0:
            continue
        for keep in (1.0, 0.0):
            items.append(UpdateItem(st.state, [st.position], keep=[keep], p_behaviour=[keep],
                                    advantage=gap / 2 if keep else -gap / 2))
    n_dec = sum(r["decisions"] for r in results)
    stats = {"correct": sum(r["correct"] for r in results) / max(1, len(results)),
             "keep_rate": sum(r["kept"] for r in results) / max(1, n_dec),
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


def grpo_update(model, ref, items: list[UpdateItem], cfg: GRPOConfig, optimizer, with_tokens: bool, rank: int = 0,
                world: int = 1, train_model=None, step: int = 0) -> dict:
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

def score_groups(rollouts: list[dict], rc: RewardConfig) -> tuple[list[float], list[float], dict]:
    """Rewards and advantages of a step's rollouts (grouped by problem, in order)."""
    rewards = [rollout_reward(r["correct"], r["provenance"],
                              [{"keep": k, "p_target": p} for b in r["blocks"] for k, p in zip(b.keep, b.p_target)],
                              rc) for r in rollouts]
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(rollouts):
        groups.setdefault(r["problem_id"], []).append(i)
    advantages = [0.0] * len(rollouts)
    informative = mixed = 0
    for members in groups.values():
        adv = group_advantages([rewards[i] for i in members],
                               [sum(len(b.positions) for b in rollouts[i]["blocks"]) for i in members],
                               [rollouts[i]["correct"] for i in members], rc)
        informative += any(a != 0 for a in adv)
        outcomes = {rollouts[i]["correct"] for i in members}
        mixed += len(outcomes) == 2
        for i, a in zip(members, adv):
            advantages[i] = a
    n_dec = sum(len(b.positions) for r in rollouts for b in r["blocks"])
    n_keep = sum(sum(b.keep) for r in rollouts for b in r["blocks"])
    stats = {"reward": sum(rewards) / max(1, len(rewards)),
             "correct": sum(r["correct"] for r in rollouts) / max(1, len(rollouts)),
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
                  onnx: bool) -> Path:
    from cospec_local.arbiter_bundle import write_arbiter

    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    extra = {}
    if kind == "lora":
        extra = model.export_args()
    description = {"features": "MLP over the block's features, warm-up then GRPO on CoSpec rollouts",
                   "lora": "draft + LoRA adapter, head over hidden states and features, warm-up then GRPO on "
                           "CoSpec rollouts"}[kind]
    write_arbiter(tmp, kind=kind, head=model.head, draft_gguf=draft_gguf, threshold=threshold,
                  name=f"{draft_gguf.stem.split('-q')[0]}-{kind}", description=description, info=info, onnx=onnx,
                  verify_cost=getattr(model, "verify_cost", None), **extra)
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
    import torch
    from tqdm import tqdm

    from cospec_local import _cospec
    from cospec_local.models import resolve_model
    from cospec_local.tasks import load_task
    from cospec_local.tasks.base import stable_int

    from .arbiter_model import load_arbiter
    from .rollout import RolloutPool, WorkerConfig

    ddp = Distributed()
    rank, world = ddp.rank, ddp.world
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    draft = Path(resolve_model(cfg.draft))
    target = Path(resolve_model(cfg.target))
    init = Path(cfg.init)
    model = load_arbiter(init, draft)
    kind = model.kind
    if cfg.threshold is None:
        cfg.threshold = model.threshold
    with_tokens = kind == "lora"
    for name, p in model.named_parameters():  # the adapter and head train; the draft's weights stay
        p.requires_grad_(kind == "features" or "lora_" in name or name.startswith("head."))
    ref = load_arbiter(init, draft)
    for p in ref.parameters():
        p.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=cfg.lr, weight_decay=cfg.weight_decay)
    train_model = model
    if ddp.dist is not None:
        train_model = torch.nn.parallel.DistributedDataParallel(model)
    rc = RewardConfig(cfg.span_bonus, cfg.risk_prob, cfg.risk_penalty, cfg.fallback_penalty, cfg.std_floor)

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    config_record = {k: str(v) for k, v in asdict(cfg).items()}
    identity = {"target": target.name, "draft": draft.name, "draft_fingerprint": _cospec.model_fingerprint(str(draft)),
                "init": str(init), "kind": kind}
    checkpoint = out / "checkpoint.pt"
    state = {"step": 0, "log": [], "best": None, "pool": None, "dev_screen": None, "target_dev": None, "seconds": 0.0}
    if checkpoint.is_file():
        saved = torch.load(checkpoint, weights_only=False)
        changed = {k for k in config_record if saved["config"].get(k) != config_record[k]} - {"steps", "sweep"}
        if changed or saved["identity"] != identity:  # a run can be extended, or its threshold swept again
            sys.exit(f"{out} holds a run with other settings ({', '.join(sorted(changed)) or 'models'}); "
                     f"use another --out")
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state = saved["state"]
    families = comma_list(cfg.families)
    workers_threads = max(1, cfg.threads // cfg.workers)
    wcfg = WorkerConfig(str(target), str(draft), workers_threads, cfg.max_tokens)
    dev_problems = [p for f in families for p in load_task(f, "dev", cfg.dev)]
    t_start = time.time() - state["seconds"]
    def checkpoint_now() -> None:
        save_checkpoint(checkpoint, {"config": config_record, "identity": identity, "model": model.state_dict(),
                                     "optimizer": optimizer.state_dict(), "state": state})

    if rank == 0:  # the log is what the checkpoint holds: a step redone after a crash is not logged twice
        (out / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in state["log"]))

    with RolloutPool(wcfg, cfg.workers) as pool:
        def spread(tasks: list[tuple], desc: str | None = None) -> list:
            """Run this process's share of `tasks` and gather all results in task order."""
            mine = list(tqdm(pool.map(tasks[rank::world]), total=len(tasks[rank::world]), desc=desc, leave=False,
                             disable=desc is None or rank != 0, file=sys.stderr))
            parts = ddp.gather(mine)
            results = [None] * len(tasks)
            for r, part in enumerate(parts):
                results[r::world] = part
            return results

        pool_key = {"models": identity | {"init": None, "kind": None}, "families": families, "pool": cfg.pool,
                    "max_tokens": cfg.max_tokens}
        if state["pool"] is None and cfg.pool_from is not None:
            reused = json.loads(Path(cfg.pool_from).read_text())
            if reused["key"] != pool_key:
                sys.exit(f"{cfg.pool_from} was screened for other models or settings")
            state["pool"] = reused["ids"]
            if [s["problem_id"] for s in reused.get("dev_screen") or []] == [p.id for p in dev_problems]:
                state["dev_screen"] = reused["dev_screen"]
        if state["pool"] is None:  # screen the training problems once: which can give a decision
            problems = [p for f in families for p in load_task(f, "train", cfg.pool)]
            screened = spread([("screen", p) for p in problems], "screening the prompt pool")
            state["pool"] = [s["problem_id"] for s in screened if s["mismatches"] > 0]
        if state.get("dev_screen") is None:
            state["dev_screen"] = spread([("screen", p) for p in dev_problems], "screening the dev problems")
        dev_screen = {s["problem_id"]: s for s in state["dev_screen"]}
        state["target_dev"] = sum(s["target_correct"] for s in state["dev_screen"]) / len(dev_problems)
        if rank == 0:
            (out / "pool.json").write_text(json.dumps({"key": pool_key, "ids": state["pool"],
                                                       "dev_screen": state["dev_screen"]}))
        by_id = {p.id: p for f in families for p in load_task(f, "train", cfg.pool)}
        pool_problems = [by_id[i] for i in state["pool"]]
        if rank == 0:
            print(f"prompt pool: {len(pool_problems)} of {len(by_id)} training problems reach a mismatch; "
                  f"{sum(s['mismatches'] > 0 for s in state['dev_screen'])} of {len(dev_problems)} dev problems; "
                  f"target-only dev accuracy {state['target_dev']:.3f}", file=sys.stderr)

        policies = out / "policy" / f"rank{rank}"  # a folder per step: the workers reload a new path

        def fresh_policy(step: int) -> Path:
            shutil.rmtree(policies, ignore_errors=True)
            return export_policy(model, kind, policies / f"step-{step:05d}", draft, cfg.threshold, info(step, None),
                                 onnx=False)

        # Dev problems where the walk never reaches a mismatch give no arbiter a decision: their
        # answers are the target's. Only the others are generated again at each evaluation.
        dev_live = [p for p in dev_problems if dev_screen[p.id]["mismatches"] > 0]

        def dev_accuracy(folder: Path, threshold: float | None = None) -> dict:
            results = {r["problem_id"]: r for r in spread([("greedy", p, str(folder), threshold) for p in dev_live],
                                                          "dev")}
            correct = {p.id: results[p.id]["correct"] if p.id in results else dev_screen[p.id]["target_correct"]
                       for p in dev_problems}
            acc = {f: sum(correct[p.id] for p in dev_problems if p.family == f) /
                   max(1, sum(p.family == f for p in dev_problems)) for f in families}
            return {"dev_accuracy": sum(correct.values()) / len(dev_problems), "dev_by_family": acc,
                    "dev_keeps_per_problem": sum(r["kept"] for r in results.values()) / len(dev_problems)}

        def info(step: int, dev: dict | None) -> dict:
            return {"grpo": {"step": step, "dev": dev, "target_dev_accuracy": state["target_dev"]},
                    "config": config_record, "models": identity}

        bar = tqdm(range(state["step"], cfg.steps), initial=state["step"], total=cfg.steps, desc="GRPO",
                   unit="step", disable=rank != 0, file=sys.stderr)
        for step in bar:
            t0 = time.time()
            policy_dir = fresh_policy(step)
            record: dict = {"step": step}
            if step == 0 or step % cfg.eval_every == 0:
                record.update(dev_accuracy(policy_dir))
                if state["best"] is None or record["dev_accuracy"] > state["best"]["dev_accuracy"]:
                    state["best"] = {"step": step, "dev_accuracy": record["dev_accuracy"]}
                    if rank == 0:
                        export_policy(model, kind, out / "best", draft, cfg.threshold, info(step, record), onnx=True)
            t_eval = time.time() - t0
            rng = random.Random(stable_int("grpo-prompts", cfg.seed, step))
            uniform = state.setdefault("uniform", {})  # prompt id -> groups with one outcome only
            live = [p for p in pool_problems if not cfg.prune_after or uniform.get(p.id, 0) < cfg.prune_after]
            prompts = rng.sample(live, min(cfg.prompts_per_step, len(live)))
            if cfg.credit == "state":
                tasks = [("branches", p, str(policy_dir), stable_int("grpo-rollout", cfg.seed, step, p.id) % (1 << 63),
                          cfg.states_per_prompt, cfg.continuations, cfg.explore_temperature,
                          cfg.greedy_continuations) for p in prompts]
                results = spread(tasks, "decision states")
                t_rollout = time.time() - t0 - t_eval
                items, stats = state_items(results)
                for r in results:  # a prompt whose states never split teaches nothing
                    if all(st.q_keep == st.q_reject for st in r["states"]):
                        uniform[r["problem_id"]] = uniform.get(r["problem_id"], 0) + 1
            else:
                tasks = [("rollouts", p, str(policy_dir),
                          [stable_int("grpo-rollout", cfg.seed, step, p.id, g) % (1 << 63)
                           for g in range(cfg.group_size)], cfg.explore_temperature)
                         for p in prompts]
                rollouts = [r for group in spread(tasks, "rollouts") for r in group]
                t_rollout = time.time() - t0 - t_eval
                rewards, advantages, stats = score_groups(rollouts, rc)
                for p in prompts:
                    outcomes = {r["correct"] for r in rollouts if r["problem_id"] == p.id}
                    if len(outcomes) == 1:
                        uniform[p.id] = uniform.get(p.id, 0) + 1
                items = decision_items(rollouts, advantages)
            stats["live_prompts"] = len(live)
            update = grpo_update(model, ref, items, cfg, optimizer, with_tokens, rank, world, train_model, step)
            record.update(stats)
            record.update(update)
            record.update({"rollout_s": round(t_rollout, 1), "eval_s": round(t_eval, 1),
                           "update_s": round(time.time() - t0 - t_eval - t_rollout, 1)})
            state["log"].append(record)
            state["step"] = step + 1
            state["seconds"] = time.time() - t_start
            if rank == 0:
                bar.set_postfix(reward=f"{stats['reward']:.3f}", keep=f"{stats['keep_rate']:.2f}",
                                dev=record.get("dev_accuracy", "-"))
                with (out / "log.jsonl").open("a", encoding="utf-8") as f:
                    f.write(json.dumps(record) + "\n")
                checkpoint_now()
                plot_curves(state["log"], out / "curves.png", state["target_dev"])
            ddp.barrier()

        if state["log"] and not state["log"][-1].get("final"):  # the last policy's dev accuracy
            policy_dir = fresh_policy(cfg.steps)
            final = dev_accuracy(policy_dir)
            state["log"].append({"step": cfg.steps, **final, "final": True})
            if final["dev_accuracy"] > state["best"]["dev_accuracy"]:
                state["best"] = {"step": cfg.steps, "dev_accuracy": final["dev_accuracy"]}
                if rank == 0:
                    export_policy(model, kind, out / "best", draft, cfg.threshold, info(cfg.steps, final), onnx=True)
            if rank == 0:
                with (out / "log.jsonl").open("a", encoding="utf-8") as f:
                    f.write(json.dumps(state["log"][-1]) + "\n")
                checkpoint_now()
                plot_curves(state["log"], out / "curves.png", state["target_dev"])
        # The threshold the best policy ships with: its dev accuracy at each of the sweep's.
        thresholds = [float(t) for t in comma_list(cfg.sweep)]
        swept = state.get("sweep") or {}
        if thresholds and (swept.get("thresholds"), swept.get("best_step")) != (thresholds, state["best"]["step"]):
            ddp.barrier()  # rank 0 wrote best/
            best = load_arbiter(out / "best", draft)
            candidate = export_policy(best, kind, policies / "best", draft, cfg.threshold, {}, onnx=False)
            sweep = {t: dev_accuracy(candidate, t) for t in thresholds}
            chosen = max(thresholds, key=lambda t: (sweep[t]["dev_accuracy"], t))
            state["sweep"] = {"thresholds": thresholds, "best_step": state["best"]["step"], "chosen": chosen,
                              "dev": {str(t): r for t, r in sweep.items()}}
            if rank == 0:
                best_info = json.loads((out / "best" / "info.json").read_text())
                export_policy(best, kind, out / "best", draft, chosen,
                              {k: best_info[k] for k in ("grpo", "config", "models")} | {"sweep": state["sweep"]},
                              onnx=True)
                checkpoint_now()
    if rank == 0:
        summary = {"best": state["best"], "sweep": state.get("sweep"), "target_dev_accuracy": state["target_dev"], "steps": state["step"],
                   "wall_seconds": round(time.time() - t_start, 1), "identity": identity, "config": config_record}
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(json.dumps(summary["best"]), file=sys.stderr)
    ddp.close()


if __name__ == "__main__":
    main()
