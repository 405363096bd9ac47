"""The arbiter models in torch, mirroring what the engine runs.

- `Head`: standardise the input, then Linear (ReLU Linear)* -> one logit; P(keep) = sigmoid.
  The engine's native head and head.onnx compute exactly this.
- `FeaturesArbiter`: the head over a block position's features (cospec_block_features).
- `LoraArbiter`: the draft's own backbone with a PEFT LoRA adapter. Its input is the prompt and
  verified prefix (causal) followed by a region [d_1, t_1, d_2, t_2, ...] of the draft block and
  the target's tokens, d_i and t_i both at position n + i - 1, attended both ways inside the
  region; the region never shows to the prefix. The head reads [h(d_i), h(t_i), features_i].
  Where the adapter applies is the arbiter's `lora_context`:
  - "draft" (new arbiters): the prefix is read by the draft alone, the adapter acts on the region
    only. In llama.cpp the prefix's keys and values are then the draft's own, copied from the
    cache it decoded them into, and only the region is decoded with the adapter.
  - "adapter": the prefix too is read with the adapter, in a context of the arbiter's own that
    decodes the whole text a second time (the first arbiters).
  Either way the region is one batch with causal attention off (native/src/learned_arbiter.cpp).

The backbone is the draft GGUF itself, dequantized (cospec_local.formats.gguf_llama_reader), so the adapter
is trained on the weights llama.cpp computes with.
"""
from __future__ import annotations

import warnings

from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..arbiter.file_format import FEATURES, LORA, LORA_CONTEXTS
from .states import DecisionState

N_FEATURES = 22  # cospec_block_features (COSPEC_N_FEATURES); checked against the extension at run time
BLOCK_FEATURES = 16  # the first 16: the block alone (the rest read ranks, the reply so far, the next position)
# The draft's projections that get a LoRA adapter (Hugging Face names), and llama.cpp's names for them.
LORA_TARGETS = {
    "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
    "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down",
}


def lora_base_name(module_name: str) -> str:
    """llama.cpp's name of the weight a PEFT LoRA module adapts (...layers.3.self_attn.q_proj -> blk.3.attn_q.weight)."""
    layer = int(module_name.split("layers.")[1].split(".")[0])
    return f"blk.{layer}.{LORA_TARGETS[module_name.rsplit('.', 1)[1]]}.weight"


class Head(nn.Module):
    def __init__(self, n_in: int, hidden: int = 64, n_layers: int = 2):
        super().__init__()
        self.register_buffer("in_mean", torch.zeros(n_in))
        self.register_buffer("in_scale", torch.ones(n_in))
        widths = [n_in] + [hidden] * (n_layers - 1) + [1]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))

    def standardise_from(self, x: torch.Tensor) -> None:
        """Set the input standardisation from training inputs (constant columns keep scale 1)."""
        mean, std = x.mean(0), x.std(0)
        self.in_mean.copy_(mean)
        self.in_scale.copy_(torch.where(std > 1e-6, 1.0 / std.clamp_min(1e-6), torch.ones_like(std)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of P(keep), shape (N,)."""
        h = (x - self.in_mean) * self.in_scale
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i + 1 < len(self.layers):
                h = torch.relu(h)
        return h.squeeze(-1)


class FeaturesArbiter(nn.Module):
    kind = FEATURES

    def __init__(self, hidden: int = 64, n_layers: int = 2, n_features: int = N_FEATURES):
        super().__init__()
        self.n_features = n_features  # it reads the first n_features of each row (its file records them)
        self.head = Head(n_features, hidden, n_layers)

    def head_inputs(self, batch: "Batch") -> torch.Tensor:
        return batch.to(self.head.in_mean.device).features[:, :self.n_features]

    def forward(self, batch: "Batch") -> torch.Tensor:
        return self.head(self.head_inputs(batch))


@dataclass
class Batch:
    """Decision states ready for a forward pass: one row per (state, block position) to score."""

    features: torch.Tensor            # (N, N_FEATURES)
    input_ids: torch.Tensor | None = None     # (B, L) prefix + region, right-padded
    position_ids: torch.Tensor | None = None  # (B, L)
    mask: torch.Tensor | None = None          # (B, 1, L, L) additive attention mask
    region: torch.Tensor | None = None        # (B, L, 1) 1.0 on region tokens, 0.0 on prefix and padding
    rows: torch.Tensor | None = None          # (N,) which sequence each scored position is in
    d_index: torch.Tensor | None = None       # (N,) index of d_i in its sequence
    t_index: torch.Tensor | None = None       # (N,) index of t_i

    def to(self, device) -> "Batch":
        """The batch on `device` (itself where it is there already)."""
        return Batch(**{f.name: None if getattr(self, f.name) is None else getattr(self, f.name).to(device)
                        for f in fields(self)})


def hybrid_mask(n_prefix: int, n_region: int, length: int) -> torch.Tensor:
    """Allowed attention (True) of one sequence: causal over the prefix, the region sees the whole
    prefix and the whole region, the prefix never sees the region; padding sees and is seen by nothing
    (its rows attend to the first token only, to keep softmax finite)."""
    n = n_prefix + n_region
    allowed = torch.zeros(length, length, dtype=torch.bool)
    allowed[:n_prefix, :n_prefix] = torch.ones(n_prefix, n_prefix, dtype=torch.bool).tril()
    allowed[n_prefix:n, :n] = True
    allowed[n:, 0] = True
    return allowed


def make_batch(states: list[DecisionState], positions: list[list[int]], with_tokens: bool = True,
               pad_id: int = 0) -> Batch:
    """A Batch scoring the block positions `positions[j]` of state j (one row each, in order).
    Without tokens it holds the features only (all the features arbiter reads)."""
    feats = [s.features[i] for s, ps in zip(states, positions) for i in ps]
    batch = Batch(features=torch.tensor(np.asarray(feats, dtype=np.float32)))
    if not with_tokens:
        return batch
    seqs, pos, spans = [], [], []
    for s in states:
        ctx, draft, target = s.context, s.draft, s.target
        k, n = len(draft), len(ctx)
        region = [tok for pair in zip(draft, target[:k]) for tok in pair]
        seqs.append(ctx + region)
        pos.append(list(range(n)) + [n + i // 2 for i in range(2 * k)])
        spans.append((n, 2 * k))
    length = max(len(x) for x in seqs)
    ids = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(seqs), length), dtype=torch.long)
    allowed = torch.zeros((len(seqs), 1, length, length), dtype=torch.bool)
    region = torch.zeros((len(seqs), length, 1), dtype=torch.float32)
    for b, (seq, p, (n, r)) in enumerate(zip(seqs, pos, spans)):
        ids[b, :len(seq)] = torch.tensor(seq)
        position_ids[b, :len(p)] = torch.tensor(p)
        allowed[b, 0] = hybrid_mask(n, r, length)
        region[b, n:n + r] = 1.0
    mask = torch.zeros(allowed.shape, dtype=torch.float32).masked_fill(~allowed, torch.finfo(torch.float32).min)
    rows = [b for b, ps in enumerate(positions) for _ in ps]
    d_index = [spans[b][0] + 2 * i for b, ps in enumerate(positions) for i in ps]
    batch.input_ids, batch.position_ids, batch.mask, batch.region = ids, position_ids, mask, region
    batch.rows, batch.d_index = torch.tensor(rows), torch.tensor(d_index)
    batch.t_index = batch.d_index + 1
    return batch


def load_draft_backbone(draft: str | Path):
    """The draft's transformer (embedding, blocks, final norm) in float32: from its GGUF
    (dequantized: the weights llama.cpp computes with, what an arbiter should be trained on), or
    from a Hugging Face folder (config.json + model.safetensors, e.g. the demo checkpoints)."""
    if Path(draft).is_dir():
        from transformers import LlamaForCausalLM

        model = LlamaForCausalLM.from_pretrained(draft, torch_dtype=torch.float32)
    else:
        from cospec_local.formats.gguf_llama_reader import load_llama_gguf

        model = load_llama_gguf(draft)
    backbone = model.model
    backbone.config._attn_implementation = "sdpa"
    return backbone


class LoraArbiter(nn.Module):
    kind = LORA

    def __init__(self, backbone, rank: int = 8, alpha: float = 16.0, dropout: float = 0.0, hidden: int = 64,
                 n_layers: int = 2, lora_context: str = "draft", n_features: int = N_FEATURES):
        super().__init__()
        from peft import LoraConfig, get_peft_model

        if lora_context not in LORA_CONTEXTS:
            raise ValueError(f"lora_context must be one of {LORA_CONTEXTS}, not {lora_context!r}")
        for p in backbone.parameters():
            p.requires_grad_(False)
        config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(LORA_TARGETS),
                            bias="none")
        with warnings.catch_warnings():
            # peft reads the model's `is_gradient_checkpointing`, which transformers 5 deprecates in a
            # FutureWarning that would reach every training run's output; nothing here to change.
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            self.backbone = get_peft_model(backbone, config)
        self.n_embd = backbone.config.hidden_size
        self.rank, self.alpha = rank, alpha
        self.lora_context = lora_context
        self.n_features = n_features
        self.head = Head(2 * self.n_embd + n_features, hidden, n_layers)
        # With lora_context "draft", every adapter's output is multiplied by the batch's region
        # mask, so the prefix is read by the draft alone, exactly (its delta is 0, its gradient too).
        self._gate: torch.Tensor | None = None
        if lora_context == "draft":
            for module in self.backbone.modules():
                if hasattr(module, "lora_B") and "default" in getattr(module, "lora_B", {}):
                    module.lora_B["default"].register_forward_hook(self._gate_adapter)

    def _gate_adapter(self, module, inputs, output):
        return output if self._gate is None else output * self._gate

    def hidden(self, batch: Batch) -> torch.Tensor:
        """Final-norm hidden states (B, L, n_embd), what llama.cpp returns as embeddings."""
        self._gate = batch.region if self.lora_context == "draft" else None
        try:
            out = self.backbone(input_ids=batch.input_ids, position_ids=batch.position_ids,
                                attention_mask=batch.mask, use_cache=False)
        finally:
            self._gate = None
        return out.last_hidden_state

    def export_args(self) -> dict:
        """write_arbiter's arguments for this arbiter's adapter."""
        return dict(lora=self.lora_weights(), lora_alpha=self.alpha, n_embd=self.n_embd,
                    lora_context=self.lora_context)

    def head_inputs(self, batch: Batch) -> torch.Tensor:
        batch = batch.to(self.head.in_mean.device)  # batches are made on the CPU; the model may be on a GPU
        h = self.hidden(batch)
        return torch.cat([h[batch.rows, batch.d_index], h[batch.rows, batch.t_index],
                          batch.features[:, :self.n_features]], dim=-1)

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.head(self.head_inputs(batch))

    def lora_weights(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """{llama.cpp tensor name: (A (r, n_in), B (n_out, r))} in Hugging Face's row order."""
        out = {}
        for name, module in self.backbone.named_modules():
            if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
                a = module.lora_A["default"].weight.detach().cpu().numpy().astype(np.float32)
                b = module.lora_B["default"].weight.detach().cpu().numpy().astype(np.float32)
                out[lora_base_name(name)] = (a, b)
        return out


def load_arbiter(folder: str | Path, draft_gguf: str | Path):
    """An exported arbiter folder back in torch (to check parity, or to go on training it):
    the head from arbiter.gguf and, for `lora`, the adapter from adapter.gguf on the draft."""
    from ..arbiter.file_format import read_bundle

    bundle = read_bundle(folder, draft_gguf)
    tensors = bundle.head
    n_layers = int(bundle.meta["head_layers"])
    hidden = tensors["head.0.weight"].shape[0] if n_layers > 1 else 1
    n_features = int(bundle.meta.get("n_features", BLOCK_FEATURES))
    if bundle.kind == FEATURES:
        model = FeaturesArbiter(hidden, n_layers, n_features)
    else:
        rank = next(iter(bundle.lora.values()))[0].shape[0]
        model = LoraArbiter(load_draft_backbone(draft_gguf), rank, bundle.lora_alpha, 0.0, hidden, n_layers,
                            bundle.lora_context, n_features)
        for name, module in model.backbone.named_modules():
            if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
                a, b = bundle.lora[lora_base_name(name)]
                module.lora_A["default"].weight.data = torch.from_numpy(np.ascontiguousarray(a))
                module.lora_B["default"].weight.data = torch.from_numpy(np.ascontiguousarray(b))
    head = model.head
    head.in_mean.copy_(torch.from_numpy(tensors["head.in_mean"]))
    head.in_scale.copy_(torch.from_numpy(tensors["head.in_scale"]))
    for i, layer in enumerate(head.layers):
        layer.weight.data = torch.from_numpy(tensors[f"head.{i}.weight"])
        layer.bias.data = torch.from_numpy(tensors[f"head.{i}.bias"])
    model.threshold = bundle.threshold
    model.verify_cost = bundle.verify_cost  # the schedule it was trained under
    return model.eval()
