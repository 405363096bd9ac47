"""Supervised warm-up of the two learned arbiters on branch-oracle states (collect.py).

    python -m cospec_local.train.warmup --data runs/arbiter-data --out runs/arbiters

Both arbiters learn P(keep) at the decision states of the given folders (plain speculative
decoding's first mismatches, or every mismatch an arbiter met, from collect --policy) from the
decisive states (exactly one branch ends right) with class-balanced binary cross-entropy; ties are left out (either decision
gives the same answer there). The checkpoint of the epoch with the lowest dev loss is kept. The
keep threshold is then chosen on the dev states to maximise (right keeps - wrong keeps): a right
keep recovers an answer only the draft gets, a wrong one loses an answer the target gets. Reported
on the dev split: precision and recall of "keep" on decisive states, and the share of all states
(ties included) each arbiter keeps.

Writes OUT/features and OUT/lora (the arbiter folders the engine loads; cospec_local/arbiter/file_format.py)
and OUT/warmup_log.json. Run data collection first, in its own process (collect.py).

A second round trains on the first round's states together with those its arbiter meets as it
runs (DAgger's aggregation): mismatches after kept tokens, labelled with that arbiter's own
continuations.

    python -m cospec_local.train.collect --out runs/policy-data --policy runs/arbiters/lora
    python -m cospec_local.train.warmup --data runs/arbiter-data,runs/policy-data --out runs/arbiters-2
"""
from __future__ import annotations

import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..arbiter.file_format import FEATURES, LORA
from ..command_line import comma_list, option, parse_config
from .states import LabelledState

# The features arbiter trains on all its states at once: a batch size no data set reaches.
FULL_BATCH = 1 << 30


@dataclass
class WarmupConfig:
    """Supervised warm-up of the features and LoRA arbiters on branch-oracle states."""

    data: str = option(None, "Folders written by cospec_local.train.collect (states.jsonl, manifest.json), "
                             "comma-separated: e.g. plain speculative decoding's states and those an earlier "
                             "arbiter met (collect --policy), trained on together.")
    out: Path = option(None, "Folder for the arbiters (features/, lora/) and warmup_log.json.")
    draft: str = option("demo-draft", "The draft GGUF the states were collected with (named model or path); the "
                                      "arbiters are bound to its fingerprint.", ("-md", "--model-draft"))
    arbiters: str = option("features,lora", "Which arbiters to train.")
    families: str = option("", "Train (and choose the threshold) on these task families only, comma-separated, e.g. "
                               "arith for an arbiter whose transfer to pyfunc is measured (default: every family "
                               "collected).")
    name: str = option("", "Name recorded in the arbiters, with the kind after it (default: the draft's file name).")
    seed: int = option(0, "Seed of initialisation and data order.")
    threads: int = option(2, "torch threads.")
    device: str = option("auto", "Where to train: auto (a CUDA device where torch sees one, else the CPU), cpu or "
                                 "cuda[:N].")
    head_hidden: int = option(64, "Width of the head's hidden layer.")
    head_layers: int = option(2, "Linear layers of the head.")
    n_features: int = option(0, "Block features the heads read: the first N of the engine's (16: the block alone; "
                                "22: with ranks, the reply so far and the next position); 0: all the engine gives.")
    features_epochs: int = option(200, "Epochs of the features arbiter (full batch).")
    features_lr: float = option(3e-3, "Learning rate of the features arbiter.")
    lora_rank: int = option(8, "LoRA rank r.")
    lora_alpha: float = option(16.0, "LoRA alpha (scale alpha / r, as PEFT and llama.cpp apply it).")
    lora_context: str = option("draft", "Where the LoRA adapter applies: 'draft' = on the block's region only, the "
                                        "prompt and verified text read by the draft alone, whose cached keys and "
                                        "values the engine reuses; 'adapter' = on the text too, which the engine "
                                        "then reads a second time with the adapter.")
    lora_epochs: int = option(12, "Epochs of the LoRA arbiter.")
    lora_lr: float = option(1e-3, "Learning rate of the LoRA arbiter (adapter and head).")
    batch_size: int = option(16, "States per step of the LoRA arbiter.")
    weight_decay: float = option(0.01, "AdamW weight decay.")
    min_threshold: float = option(0.5, "Lowest keep threshold the dev search may choose.")
    lora_from_features: bool = option(False, "Start the LoRA arbiter's head as the features arbiter trained just "
                                             "before it (its hidden-state inputs at weight 0, the adapter at 0: "
                                             "the same P(keep)), so that training adds to what the features "
                                             "tell. Needs --arbiters features,lora.")


def load_states(folder: Path) -> list[LabelledState]:
    return [LabelledState.from_json(json.loads(line))
            for line in (folder / "states.jsonl").read_text().splitlines() if line.strip()]


def choose_threshold(probs: list[float], labels: list[int], floor: float) -> float:
    """The threshold maximising right keeps minus wrong keeps on decisive states (ties broken
    towards the higher threshold: fewer keeps for the same net gain)."""
    best, best_gain = 1.0, 0
    for t in sorted({p for p in probs if p >= floor} | {floor}, reverse=True):
        gain = sum((1 if y == 1 else -1) for p, y in zip(probs, labels) if p >= t)
        if gain > best_gain:
            best, best_gain = t, gain
    return float(best)


def ranking_auc(probs: list[float], labels: list[int]) -> float:
    """How well P(keep) ranks keep-better states (label 1) above reject-better ones (label 0):
    the share of such pairs in the right order, ties counting half (0.5 = no better than chance)."""
    pos = [p for p, y in zip(probs, labels) if y == 1]
    neg = [p for p, y in zip(probs, labels) if y == 0]
    return sum((a > b) + 0.5 * (a == b) for a in pos for b in neg) / max(1, len(pos) * len(neg))


def report(probs_all: list[float], states: list[LabelledState], threshold: float) -> dict:
    keep = [p >= threshold for p in probs_all]
    decisive = [(k, s.label) for k, s in zip(keep, states) if s.label >= 0]
    tp = sum(1 for k, y in decisive if k and y == 1)
    fp = sum(1 for k, y in decisive if k and y == 0)
    fn = sum(1 for k, y in decisive if not k and y == 1)
    return {"threshold": threshold, "states": len(states), "decisive": len(decisive),
            "keep_better": sum(1 for _, y in decisive if y == 1),
            "precision": tp / (tp + fp) if tp + fp else None, "recall": tp / (tp + fn) if tp + fn else None,
            "right_keeps": tp, "wrong_keeps": fp, "keep_share": sum(keep) / len(keep) if keep else 0.0}


def labelled_batch(states: list[LabelledState], with_tokens: bool):
    """The batch scoring each state's labelled position."""
    from .arbiter_model import make_batch

    return make_batch([s.state for s in states], [[s.position] for s in states], with_tokens=with_tokens)


def predict(model, states: list[LabelledState], with_tokens: bool, batch_size: int = 64) -> list[float]:
    """P(keep) at each state's labelled position."""
    import torch

    out = []
    model.eval()
    with torch.no_grad():
        for i in range(0, len(states), batch_size):
            out += torch.sigmoid(model(labelled_batch(states[i:i + batch_size], with_tokens))).tolist()
    return out


def start_from_features(head, features_head) -> None:
    """Give a LoRA arbiter's head (inputs: h(d_i), h(t_i), features) the features arbiter's
    function: its layers on the feature columns, zeros on the hidden-state columns. The first
    layer's weights and bias absorb any difference between the two heads' input standardisations."""
    import torch

    n = features_head.in_mean.numel()
    with torch.no_grad():
        first, source = head.layers[0], features_head.layers[0]
        first.weight.zero_()
        first.weight[:, -n:] = source.weight * features_head.in_scale / head.in_scale[-n:]
        first.bias.copy_(source.bias + (source.weight * features_head.in_scale) @ (head.in_mean[-n:] - features_head.in_mean))
        for layer, src in zip(head.layers[1:], features_head.layers[1:]):
            layer.weight.copy_(src.weight)
            layer.bias.copy_(src.bias)


def train(model, train_states: list[LabelledState], dev_states: list[LabelledState], cfg: WarmupConfig, *,
          epochs: int, lr: float, batch_size: int, with_tokens: bool, log: list, start_head=None) -> None:
    """Class-balanced BCE on decisive states; keeps the weights of the best dev epoch (with
    start_head, the starting point is a candidate too). Appends each epoch's losses to `log`."""
    import copy

    import torch
    from tqdm import tqdm

    decisive = [s for s in train_states if s.label >= 0]
    dev_decisive = [s for s in dev_states if s.label >= 0]
    device = next(model.parameters()).device
    labels = torch.tensor([float(s.label) for s in decisive], device=device)
    n_pos = float(labels.sum())
    pos_weight = (len(decisive) - n_pos) / max(n_pos, 1.0)
    with torch.no_grad():  # standardise the head's inputs from the training states
        model.eval()
        inputs = torch.cat([model.head_inputs(labelled_batch(decisive[i:i + 64], with_tokens))
                            for i in range(0, len(decisive), 64)])
        model.head.standardise_from(inputs)
    if start_head is not None:
        start_from_features(model.head, start_head)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay)
    rng = random.Random(cfg.seed)
    best, best_loss = None, math.inf
    dev_labels = torch.tensor([float(s.label) for s in dev_decisive])
    dev_pos_weight = (len(dev_decisive) - float(dev_labels.sum())) / max(float(dev_labels.sum()), 1.0)
    def dev_loss_now() -> float:
        dev_probs = torch.tensor(predict(model, dev_decisive, with_tokens)).clamp(1e-6, 1 - 1e-6)
        return float(torch.nn.functional.binary_cross_entropy(
            dev_probs, dev_labels, weight=torch.where(dev_labels > 0, dev_pos_weight, 1.0)))

    if start_head is not None:
        best_loss, best = dev_loss_now(), copy.deepcopy(model.state_dict())
        log.append({"arbiter": model.kind, "epoch": -1, "dev_loss": best_loss})
    for epoch in tqdm(range(epochs), desc=f"warm-up {model.kind}", unit="epoch", file=sys.stderr):
        model.train()
        order = list(range(len(decisive)))
        rng.shuffle(order)
        total = 0.0
        for i in range(0, len(order), batch_size):
            idx = order[i:i + batch_size]
            logits = model(labelled_batch([decisive[j] for j in idx], with_tokens))
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                logits, labels[idx], pos_weight=torch.tensor(pos_weight, device=device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        dev_loss = dev_loss_now()
        log.append({"arbiter": model.kind, "epoch": epoch, "train_loss": total / len(decisive), "dev_loss": dev_loss})
        if dev_loss < best_loss:
            best_loss, best = dev_loss, copy.deepcopy(model.state_dict())
    model.load_state_dict(best)
    model.eval()


def collected_verify_cost(manifest: dict) -> float:
    """The verify cost of the length model the states' blocks were drafted under. The arbiter
    carries it, so that the engine drafts its blocks the same way. (Folders collected before
    collect.py recorded it ran under the default.)"""
    from .. import _cospec

    if "verify_cost" in manifest:
        return float(manifest["verify_cost"])
    value = float(manifest["params"].get("verify_cost", -1.0))
    return value if value >= 0 else float(_cospec.DEFAULT_VERIFY_COST)


def domain_gate(folders: list[Path], manifests: list[dict], families: set[str]):
    """The arbiters' domain gate (arbiter/domain_gate.py) from the prompts the states were collected on:
    bigrams of the train problems' prompts, threshold from the dev problems'. Folders that do not
    record their prompts (collected before they did, or by --policy, on the same problems) add
    none; with none recorded at all the arbiters get no gate and decide on every prompt."""
    from cospec_local.arbiter.domain_gate import build_gate

    prompts = {"train": [], "dev": []}
    n_vocab = None
    for folder, manifest in zip(folders, manifests):
        rows = [json.loads(line) for line in (folder / "problems.jsonl").read_text().splitlines() if line.strip()]
        if "n_vocab" not in manifest or any("prompt_tokens" not in r for r in rows):
            continue
        n_vocab = int(manifest["n_vocab"])  # one target for every folder (checked before)
        for r in rows:
            if not families or r["family"] in families:
                prompts[r["split"]].append(r["prompt_tokens"])
    if not prompts["train"] or not prompts["dev"]:
        print(f"note: {', '.join(map(str, folders))} record no prompts: the arbiters get no domain gate and decide "
              f"on every prompt", file=sys.stderr)
        return None
    gate = build_gate(prompts["train"], prompts["dev"], n_vocab)
    print(f"domain gate: {len(gate.bigrams)} bigrams of {len(prompts['train'])} train prompts; threshold "
          f"{gate.threshold:.3f} (dev prompts' coverage: {json.dumps(gate.dev_coverage)})", file=sys.stderr)
    return gate


def load_collected(folders: list[Path], draft: Path) -> tuple[list[dict], list]:
    """The manifests and states of collected folders, refused unless all were collected with this
    draft, one target, the same settings and the same verify cost."""
    from cospec_local import _cospec

    manifests, states = [], []
    for folder in folders:
        manifest = json.loads((folder / "manifest.json").read_text())
        if manifest["draft_fingerprint"] != _cospec.model_fingerprint(str(draft)):
            sys.exit(f"{folder} was collected with another draft than {draft}")
        if manifests:  # settings added to the engine since an older folder was collected take their defaults
            first = manifests[0]
            shared = first["params"].keys() & manifest["params"].keys()
            if manifest["target"] != first["target"] or any(manifest["params"][k] != first["params"][k] for k in shared):
                sys.exit(f"{folder} was collected with another target or settings than {folders[0]}")
        if manifests and collected_verify_cost(manifest) != collected_verify_cost(manifests[0]):
            sys.exit(f"{folder} was drafted under another verify cost than {folders[0]}")
        manifests.append(manifest)
        states += load_states(folder)
    return manifests, states


def split_states(states: list, families: set[str], folders: list[Path]) -> tuple[list, list]:
    """The train and dev states of the chosen families; refused where a split has no decisive state."""
    if families:
        unknown = families - {s.family for s in states}
        if unknown:
            sys.exit(f"no states of {', '.join(sorted(unknown))} in {', '.join(map(str, folders))}")
        states = [s for s in states if s.family in families]
    train_states = [s for s in states if s.split == "train"]
    dev_states = [s for s in states if s.split == "dev"]
    for split, split_states in (("train", train_states), ("dev", dev_states)):
        if not any(s.label >= 0 for s in split_states):
            sys.exit(f"no decisive {split} states in {', '.join(map(str, folders))} (a state is decisive where exactly "
                     f"one of keeping and rejecting the draft's token ends right): nothing to learn a keep decision "
                     f"from; collect more problems, or tasks where the draft is right where the target is not")
    return train_states, dev_states


def feature_count(cfg: WarmupConfig, states: list) -> int:
    """How many block features the heads read: cfg.n_features (0: all the engine gives), no more than
    the states hold (states collected by an older engine hold fewer)."""
    from cospec_local import _cospec

    want = cfg.n_features or _cospec.N_FEATURES
    if not 0 < want <= _cospec.N_FEATURES:
        sys.exit(f"--n-features must be 1..{_cospec.N_FEATURES} (0: all)")
    held = min((len(s.state.features[0]) for s in states if s.state.features), default=want)
    if held < want:
        sys.exit(f"the training states hold {held} block features, {want} are asked for: they were collected by an "
                 f"older engine; collect them again, or pass --n-features {held}")
    return want


def fit_arbiter(kind: str, cfg: WarmupConfig, draft: Path, train_states: list, dev_states: list, device, log: list,
                trained: dict):
    """One arbiter of `kind` fitted on the train states; returns it and what its file needs besides
    the head (the LoRA arbiter's adapter settings)."""
    import torch

    from .arbiter_model import FeaturesArbiter, LoraArbiter, load_draft_backbone

    torch.manual_seed(cfg.seed)
    n_features = feature_count(cfg, train_states)
    if kind == FEATURES:
        model = FeaturesArbiter(cfg.head_hidden, cfg.head_layers, n_features).to(device)
        train(model, train_states, dev_states, cfg, epochs=cfg.features_epochs, lr=cfg.features_lr,
              batch_size=FULL_BATCH, with_tokens=False, log=log)
        return model, {}
    if kind == LORA:
        model = LoraArbiter(load_draft_backbone(draft), cfg.lora_rank, cfg.lora_alpha, 0.0, cfg.head_hidden,
                            cfg.head_layers, cfg.lora_context, n_features).to(device)
        start = trained[FEATURES].head if cfg.lora_from_features else None
        train(model, train_states, dev_states, cfg, epochs=cfg.lora_epochs, lr=cfg.lora_lr,
              batch_size=cfg.batch_size, with_tokens=True, log=log, start_head=start)
        return model, model.export_args()
    sys.exit(f"unknown arbiter {kind!r}")


def measure(model, kind: str, cfg: WarmupConfig, train_states: list, dev_states: list, wall: float) -> tuple[float, dict]:
    """The keep threshold chosen on the dev states, and the arbiter's decisions measured at it."""
    with_tokens = kind == LORA
    dev_probs = predict(model, dev_states, with_tokens)
    dev_decisive = [(p, s.label) for p, s in zip(dev_probs, dev_states) if s.label >= 0]
    threshold = choose_threshold([p for p, _ in dev_decisive], [y for _, y in dev_decisive], cfg.min_threshold)
    return threshold, {"dev": report(dev_probs, dev_states, threshold), "dev_at_0.5": report(dev_probs, dev_states, 0.5),
                       "train": report(predict(model, train_states, with_tokens), train_states, threshold),
                       "train_seconds": round(wall, 1)}


def arbiter_name(kind: str, cfg: WarmupConfig, draft: Path, manifests: list[dict], families: set[str]) -> tuple[str, str]:
    """The arbiter's name and description: its kind, the states it learned from, its families."""
    name = f"{cfg.name or Path(draft).stem.split('-q')[0]}-{kind}"
    description = {FEATURES: "MLP over the block's features, warm-up on branch-oracle labels",
                   LORA: "draft + LoRA adapter, head over hidden states and features, warm-up on "
                         "branch-oracle labels"}[kind]
    sources = [("plain speculative decoding's states", any("policy" not in m for m in manifests)),
               ("those an earlier arbiter met", any("policy" in m for m in manifests))]
    if sources[1][1]:
        description += f" ({' and '.join(label for label, present in sources if present)})"
    if families:
        description += f" ({', '.join(sorted(families))} only)"
        name += "-" + "-".join(sorted(families))
    return name, description


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(WarmupConfig, argv, __doc__.split("\n\n")[0])
    if cfg.data is None or cfg.out is None:
        sys.exit("--data and --out are required")
    if cfg.lora_from_features and comma_list(cfg.arbiters) != [FEATURES, LORA]:
        sys.exit("--lora-from-features needs --arbiters features,lora")
    import torch

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    from cospec_local import _cospec
    from cospec_local.arbiter.file_format import TRAINED_UNDER, write_arbiter
    from cospec_local.models import resolve_model

    from .arbiter_model import N_FEATURES
    from .device import resolve_device

    assert N_FEATURES == _cospec.N_FEATURES
    device = resolve_device(cfg.device)  # refused before anything is written
    draft = resolve_model(cfg.draft)
    folders = [Path(f) for f in comma_list(cfg.data)]
    manifests, states = load_collected(folders, draft)
    families = set(comma_list(cfg.families))
    train_states, dev_states = split_states(states, families, folders)
    gate = domain_gate(folders, manifests, families)
    cfg.out.mkdir(parents=True, exist_ok=True)
    collected = manifests[0]
    trained_under = {key: collected["params"][key] for key in TRAINED_UNDER if key in collected["params"]}
    target = ({"fingerprint": collected["target_fingerprint"], "file": collected["target"]["file"]}
              if "target_fingerprint" in collected else None)  # (folders collected before it was recorded)
    log: list = []
    results = {"config": {k: str(v) for k, v in asdict(cfg).items()}, "data": manifests,
               "train_states": len(train_states), "train_decisive": sum(s.label >= 0 for s in train_states),
               "train_keep_better": sum(s.label == 1 for s in train_states), "arbiters": {}}
    trained = {}
    for kind in comma_list(cfg.arbiters):
        t0 = time.time()
        model, extra = fit_arbiter(kind, cfg, draft, train_states, dev_states, device, log, trained)
        trained[kind] = model
        threshold, measured = measure(model, kind, cfg, train_states, dev_states, time.time() - t0)
        results["arbiters"][kind] = measured
        info = {"warmup": measured, "data": {"draft": collected["draft"], "target": collected["target"],
                                             "policies": [m["policy"] for m in manifests if "policy" in m],
                                             "train_states": results["train_states"],
                                             "families": sorted(families) or "all"},
                "config": results["config"]}
        name, description = arbiter_name(kind, cfg, draft, manifests, families)
        if threshold >= 1.0:
            print(f"note: {kind}: no keep threshold gains on the dev states; this arbiter never keeps a draft token "
                  f"(it learned nothing that beats the target here)", file=sys.stderr)
        model.to("cpu")  # the files and head.onnx are written from CPU tensors
        write_arbiter(cfg.out / kind, kind=kind, head=model.head, draft_gguf=draft, threshold=threshold, name=name,
                      description=description, info=info, verify_cost=collected_verify_cost(collected),
                      trained_under=trained_under, gate=gate, target=target, **extra)
        print(f"{kind}: {json.dumps(measured['dev'])}", file=sys.stderr)
    results["log"] = log
    (cfg.out / "warmup_log.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
