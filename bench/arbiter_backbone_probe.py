"""Does a larger backbone tell right draft tokens from wrong ones better? Trains the LoRA arbiter's
warm-up (same data, epochs and seed) on each given backbone and scores it on dev states: the AUC
of P(keep) on decisive states, and the best (right keeps - wrong keeps) over thresholds. The
arbiters it trains are not exported (the engine runs an arbiter's LoRA on the draft only).

    python bench/arbiter_backbone_probe.py --train runs/policy-data-1 --dev runs/policy-data-1,runs/policy-data-2 \\
        --family arith demo-draft demo-target

torch only (no engine); about 2 min for the demo draft and 12 min for the demo target on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from cospec_local.models import resolve_model
from cospec_local.train.arbiter_model import LoraArbiter, load_draft_backbone, make_batch
from cospec_local.train.warmup import WarmupConfig, load_states, predict, train


def auc(probs: list[float], labels: list[int]) -> float:
    pos = [p for p, y in zip(probs, labels) if y == 1]
    neg = [p for p, y in zip(probs, labels) if y == 0]
    return sum((a > b) + 0.5 * (a == b) for a in pos for b in neg) / (len(pos) * len(neg))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("backbones", nargs="+", help="named models or GGUF files")
    ap.add_argument("--train", required=True, help="collect folders whose train states are trained on")
    ap.add_argument("--dev", required=True, help="collect folders whose decisive dev states are scored")
    ap.add_argument("--family", default="arith")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    def states(folders: str, split: str) -> list[dict]:
        return [s for f in folders.split(",") for s in load_states(Path(f))
                if s["family"] == args.family and s["split"] == split]

    train_states = states(args.train, "train")
    dev = [s for s in states(args.dev, "dev") if s["label"] >= 0]
    labels = [s["label"] for s in dev]
    cfg = WarmupConfig()
    for name in args.backbones:
        t0 = time.time()
        torch.manual_seed(cfg.seed)
        model = LoraArbiter(load_draft_backbone(resolve_model(name)), cfg.lora_rank, cfg.lora_alpha, 0.0,
                            cfg.head_hidden, cfg.head_layers, cfg.lora_context)
        train(model, train_states, dev, cfg, args.epochs, cfg.lora_lr, cfg.batch_size, True, [])
        probs = predict(model, dev, make_batch, True)
        net = max(sum(1 if y == 1 else -1 for p, y in zip(probs, labels) if p >= t) for t in set(probs))
        print(json.dumps({"backbone": name, "train_states": len(train_states), "dev_states": len(dev),
                          "keep_better": sum(labels), "auc": round(auc(probs, labels), 4), "best_net_keeps": net,
                          "seconds": round(time.time() - t0)}), flush=True)


if __name__ == "__main__":
    main()
