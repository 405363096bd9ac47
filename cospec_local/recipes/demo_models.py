"""Small Hugging Face LlamaForCausalLM models for the project's own demo pair.

    from cospec_local.recipes.demo_models import llama_config, build_model, save_model
    cfg = llama_config(vocab_size=512, dim=256, n_layers=6, n_heads=8, n_kv_heads=4, ffn_dim=768, max_len=1024)
    save_model(build_model(cfg, seed=0), "models/demo-target", tokenizer_model="models/tokenizer.model")

The models are plain LlamaForCausalLM (RMSNorm, SwiGLU, RoPE, grouped-query attention),
the architecture llama.cpp runs as `llama`; cospec_local.formats.llama_gguf_writer writes them as GGUF.
Needs torch and transformers (the `train` extra).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..formats.spm_tokenizer import BOS_ID, EOS_ID


def llama_config(vocab_size: int, dim: int, n_layers: int, n_heads: int, n_kv_heads: int, ffn_dim: int, max_len: int, *,
                 rope_theta: float = 10000.0, rms_norm_eps: float = 1e-5, tie_embeddings: bool = False,
                 initializer_range: float = 0.02, head_dim: int | None = None):
    """A LlamaConfig; `head_dim` defaults to dim // n_heads. For Q8_0 files, `dim` and
    `ffn_dim` must be multiples of 32 (the Q8_0 block), or those weights stay F16."""
    from transformers import LlamaConfig

    if dim % n_heads:
        raise ValueError(f"dim {dim} is not a multiple of n_heads {n_heads}")
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads {n_heads} is not a multiple of n_kv_heads {n_kv_heads}")
    head_dim = head_dim or dim // n_heads
    if head_dim % 2:
        raise ValueError(f"head_dim {head_dim} must be even for rotary embeddings")
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=dim, intermediate_size=ffn_dim, num_hidden_layers=n_layers,
        num_attention_heads=n_heads, num_key_value_heads=n_kv_heads, head_dim=head_dim,
        max_position_embeddings=max_len, rms_norm_eps=rms_norm_eps, initializer_range=initializer_range,
        rope_parameters={"rope_type": "default", "rope_theta": float(rope_theta)},
        tie_word_embeddings=tie_embeddings, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=None,
        hidden_act="silu", attention_bias=False, mlp_bias=False,
    )


def build_model(config, seed: int = 0):
    """A randomly initialised float32 LlamaForCausalLM (deterministic for a given seed)."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.eval()
    return model


def save_model(model, out_dir: str | os.PathLike, tokenizer_model: str | os.PathLike | None = None) -> Path:
    """Save as safetensors (config.json + model.safetensors), with the SentencePiece model
    copied in as tokenizer.model when given, so the folder is all the converter needs."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    if tokenizer_model is not None:
        shutil.copyfile(tokenizer_model, out_dir / "tokenizer.model")
    return out_dir
