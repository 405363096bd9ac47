"""Load a llama-architecture GGUF (any type the gguf package dequantizes: F32, F16, Q8_0, Q4_1,
...) as a float32 Hugging Face LlamaForCausalLM, optionally only its first blocks.

    from cospec_local.formats.gguf_llama_reader import load_llama_gguf
    model = load_llama_gguf(find_smollm2_gguf(), n_layers=2)  # SmolLM2's embedding + first 2 blocks

The inverse of cospec_local.formats.llama_gguf_writer: Q/K rows go back from llama.cpp's NORM rope order to
Hugging Face's rotate-half order. Used to start a draft from its target's own weights; the
weights are the dequantized ones, i.e. exactly what llama.cpp computes with.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .llama_gguf_writer import _LAYER_TENSORS

_HF_OF_GGUF = {v: k for k, v in _LAYER_TENSORS.items()}


def unpermute_qk(weights: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama_to_gguf.permute_qk."""
    return (weights.reshape(n_head, weights.shape[0] // n_head // 2, 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


def gguf_llama_config(reader, n_layers: int | None = None):
    """The LlamaConfig of a llama GGUF (vocabulary ids from its tokenizer metadata)."""
    from transformers import LlamaConfig

    def get(key, default=None):
        field = reader.get_field(key)
        return field.contents() if field is not None else default

    if get("general.architecture") != "llama":
        raise ValueError(f"not a llama GGUF: architecture {get('general.architecture')!r}")
    total = int(get("llama.block_count"))
    n_layers = total if n_layers is None else n_layers
    if not 1 <= n_layers <= total:
        raise ValueError(f"n_layers must be in [1, {total}], not {n_layers}")
    dim, n_head = int(get("llama.embedding_length")), int(get("llama.attention.head_count"))
    names = {t.name for t in reader.tensors}
    n_vocab = len(reader.get_field("tokenizer.ggml.tokens").data)
    return LlamaConfig(
        vocab_size=n_vocab, hidden_size=dim, intermediate_size=int(get("llama.feed_forward_length")),
        num_hidden_layers=n_layers, num_attention_heads=n_head,
        num_key_value_heads=int(get("llama.attention.head_count_kv", n_head)),
        head_dim=int(get("llama.attention.key_length", dim // n_head)),
        max_position_embeddings=int(get("llama.context_length", 2048)),
        rms_norm_eps=float(get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_parameters={"rope_type": "default", "rope_theta": float(get("llama.rope.freq_base", 10000.0))},
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=get("tokenizer.ggml.bos_token_id"), eos_token_id=get("tokenizer.ggml.eos_token_id"),
        hidden_act="silu", attention_bias=False, mlp_bias=False,
    )


def load_llama_gguf(path: str | os.PathLike, n_layers: int | None = None):
    """A float32 LlamaForCausalLM with the (dequantized) weights of `path`'s embedding, first
    `n_layers` blocks (default: all), final norm and output head."""
    import gguf
    import torch
    from transformers import LlamaForCausalLM

    reader = gguf.GGUFReader(Path(path), "r")
    cfg = gguf_llama_config(reader, n_layers)
    state = {}
    for t in reader.tensors:
        parts = t.name.split(".")
        if parts[0] == "blk":
            layer = int(parts[1])
            if layer >= cfg.num_hidden_layers:
                continue
            name = f"model.layers.{layer}.{_HF_OF_GGUF['.'.join(parts[2:])]}"
        else:
            name = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                    "output.weight": "lm_head.weight"}.get(t.name)
            if name is None:
                continue  # e.g. rope_freqs: not part of a default-rope llama
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        if name.endswith("q_proj.weight"):
            w = unpermute_qk(w, cfg.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            w = unpermute_qk(w, cfg.num_key_value_heads)
        state[name] = torch.from_numpy(np.ascontiguousarray(w))
    model = LlamaForCausalLM(cfg).to(torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{path}: missing {missing[:4]}, unexpected {unexpected[:4]}")
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model.eval()
