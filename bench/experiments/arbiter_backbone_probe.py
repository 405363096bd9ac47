"""Does a larger backbone tell right draft tokens from wrong ones better? Trains the LoRA arbiter's
warm-up (same data, epochs and seed) on each given backbone and scores it on dev states: the AUC
of P(keep) on decisive states, and the best (right keeps - wrong keeps) over thresholds. The
arbiters it trains are not exported (the engine runs an arbiter's LoRA on the draft only).

    python bench/experiments/arbiter_backbone_probe.py --train runs/policy-data-1 --dev runs/policy-data-1,runs/policy-data-2 \\
        --family arith demo-draft demo-target

With --eval, the dev states only choose the epoch (as in the warm-up) and the AUC is measured on
the states of each --eval file (e.g. held-out dev or test problems, written by
bench/arbiter_ceiling.py --states):

    python bench/experiments/arbiter_backbone_probe.py --train DATA --dev DATA --family arith,pyfunc --epochs 12 \\
        --eval held-arith.jsonl,test-arith.jsonl --seeds 0,1,2 demo-draft demo-target

torch only (no engine); about 2 min for the demo draft and 12 min for the demo target on 2 cores
(6 epochs of arith states).

Run 2026-12-01 (cospec_local/data/demo/HISTORY.md, "A second warm-up round on the arbiter's own
states": the first command) and 2026-12-02 with --eval and --seeds (bench/HISTORY.md, "What one
kept token could recover, and how well the arbiters rank": the second command).
Kept as the record of those measurements, frozen: it is not maintained or tested and may not run
against today's code.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from cospec_local.models import resolve_model
from cospec_local.train.arbiter_model import LoraArbiter, load_draft_backbone
from cospec_local.train.states import LabelledState
from cospec_local.train.warmup import WarmupConfig, load_states, predict, ranking_auc, train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("backbones", nargs="+", help="named models or GGUF files")
    ap.add_argument("--train", required=True, help="collect folders whose train states are trained on")
    ap.add_argument("--dev", required=True, help="collect folders whose decisive dev states are scored")
    ap.add_argument("--family", default="arith", help="task families trained on and scored, comma-separated")
    ap.add_argument("--eval", default="", help="state files (jsonl) to score instead of the dev states, comma-separated")
    ap.add_argument("--seeds", default="0", help="warm-up seeds, comma-separated")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    families = set(args.family.split(","))

    def states(folders: str, split: str) -> list[LabelledState]:
        return [s for f in folders.split(",") for s in load_states(Path(f))
                if s.family in families and s.split == split]

    train_states = states(args.train, "train")
    dev = [s for s in states(args.dev, "dev") if s.label >= 0]
    scored = {"dev": dev}
    for path in filter(None, args.eval.split(",")):
        lines = Path(path).read_text().splitlines()
        rows = [LabelledState.from_json(json.loads(line)) for line in lines if line.strip()]
        scored[Path(path).stem] = [s for s in rows if s.family in families and s.label >= 0]
    if args.eval:
        del scored["dev"]  # the dev states chose the epoch: they are not a measurement then
    for name in args.backbones:
        for seed in (int(x) for x in args.seeds.split(",")):
            t0 = time.time()
            cfg = WarmupConfig(seed=seed)
            torch.manual_seed(cfg.seed)
            model = LoraArbiter(load_draft_backbone(resolve_model(name)), cfg.lora_rank, cfg.lora_alpha, 0.0,
                                cfg.head_hidden, cfg.head_layers, cfg.lora_context)
            train(model, train_states, dev, cfg, epochs=args.epochs, lr=cfg.lora_lr, batch_size=cfg.batch_size,
                  with_tokens=True, log=[])
            result = {"backbone": name, "seed": seed, "train_states": len(train_states)}
            for label, group in scored.items():
                labels = [s.label for s in group]
                probs = predict(model, group, with_tokens=True)
                net = max(sum(1 if y == 1 else -1 for p, y in zip(probs, labels) if p >= t) for t in set(probs))
                result[label] = {"states": len(group), "keep_better": sum(labels), "auc": round(ranking_auc(probs, labels), 4),
                                 "best_net_keeps": net}
            result["seconds"] = round(time.time() - t0)
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
