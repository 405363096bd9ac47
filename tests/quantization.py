"""Torch-side view of GGUF quantization, for logit parity tests."""
from __future__ import annotations

import copy

import gguf
import torch


def q8_0_roundtrip(model):
    """A copy of `model` whose matrices are what a Q8_0 file stores (quantised, dequantised)."""
    q = copy.deepcopy(model)
    with torch.no_grad():
        for p in q.parameters():
            if p.ndim == 2:
                w = p.detach().numpy()
                raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
                p.copy_(torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0).reshape(w.shape)))
    return q
