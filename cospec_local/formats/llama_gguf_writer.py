"""Convert a Hugging Face LlamaForCausalLM (folder or in-memory model) plus a SentencePiece
tokenizer into a llama-architecture GGUF that llama.cpp loads.

    python -m converters.llama_to_gguf HF_DIR TOKENIZER.model OUT.gguf --type q8_0

Follows llama.cpp's convert_hf_to_gguf.py for `LlamaForCausalLM` (conversion/llama.py and
conversion/base.py): the same metadata keys, the same tensor names, the Q/K row permutation
that turns Hugging Face's rotate-half rotary layout into llama.cpp's adjacent-pair (NORM)
one, 1-D tensors and norms kept F32, and a fall-back to F16 for a matrix whose rows do not
split into Q8_0 blocks of 32. With tied embeddings no `output.weight` is written: llama.cpp
then uses `token_embd.weight` for the output projection.

Supported: rope_type "default" (no scaling), no attention or MLP biases.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import gguf
import numpy as np

from .spm_tokenizer import add_vocab_to_gguf
from ..command_line import REQUIRED, option, parse_config

log = logging.getLogger(__name__)

OUT_TYPES = {
    "f32": (gguf.LlamaFileType.ALL_F32, gguf.GGMLQuantizationType.F32),
    "f16": (gguf.LlamaFileType.MOSTLY_F16, gguf.GGMLQuantizationType.F16),
    "q8_0": (gguf.LlamaFileType.MOSTLY_Q8_0, gguf.GGMLQuantizationType.Q8_0),
}

# Hugging Face names (after "model.layers.N.") -> GGUF names (after "blk.N.").
_LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def permute_qk(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute`: within each head, rows (i, i + d/2) that Hugging Face's
    rotate-half rotary pairs become rows (2i, 2i + 1), the pairs of llama.cpp's NORM rope."""
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


def _config_dict(config: Any) -> dict:
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def _rope_theta(cfg: dict) -> float:
    rope = cfg.get("rope_parameters") or {}
    if "full_attention" in rope:
        rope = rope["full_attention"]
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    scaling = cfg.get("rope_scaling")
    if rope_type != "default" or (scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default")):
        raise NotImplementedError(f"only rope_type 'default' is supported, not {rope_type!r} / {scaling!r}")
    return float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def _state_from_dir(model_dir: Path) -> tuple[dict, Iterator[tuple[str, np.ndarray]]]:
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"no config.json in {model_dir}")
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    elif (model_dir / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"no model.safetensors in {model_dir} (save with safe_serialization=True)")

    def tensors() -> Iterator[tuple[str, np.ndarray]]:
        from safetensors import safe_open
        import torch  # bfloat16 checkpoints need torch to read

        for name in files:
            with safe_open(str(model_dir / name), framework="pt") as f:
                for key in f.keys():
                    yield key, f.get_tensor(key).to(torch.float32).numpy()

    return cfg, tensors()


def _state_from_model(model: Any) -> tuple[dict, Iterator[tuple[str, np.ndarray]]]:
    cfg = _config_dict(model.config)

    def tensors() -> Iterator[tuple[str, np.ndarray]]:
        for key, value in model.state_dict().items():
            yield key, value.detach().to("cpu").float().numpy()

    return cfg, tensors()


def _gguf_name(hf_name: str, tied: bool) -> str | None:
    """The GGUF tensor name of a Hugging Face one; None for a tensor that is not written."""
    if hf_name.endswith(".rotary_emb.inv_freq"):
        return None
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return None if tied else "output.weight"
    parts = hf_name.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[2].isdecimal() and parts[3] in _LAYER_TENSORS:
        return f"blk.{int(parts[2])}.{_LAYER_TENSORS[parts[3]]}"
    raise ValueError(f"unexpected tensor {hf_name!r}: not a plain LlamaForCausalLM weight")


def convert(model: str | os.PathLike | Any, tokenizer_model: str | os.PathLike | None, out_path: str | os.PathLike,
            out_type: str = "f32", name: str | None = None, chat_template: str | None = None) -> Path:
    """Write `model` (a Hugging Face folder or a LlamaForCausalLM instance) with the vocabulary
    of `tokenizer_model` (a SentencePiece .model; None: the folder's tokenizer.model) as a GGUF
    of type `out_type` ("f32", "f16" or "q8_0"), with `chat_template` (Jinja) if given."""
    if out_type not in OUT_TYPES:
        raise ValueError(f"out_type must be one of {', '.join(OUT_TYPES)}, not {out_type!r}")
    file_type, matrix_type = OUT_TYPES[out_type]
    if isinstance(model, (str, os.PathLike)):
        model_dir = Path(model)
        cfg, tensors = _state_from_dir(model_dir)
        name = name or model_dir.name
        if tokenizer_model is None:
            tokenizer_model = model_dir / "tokenizer.model"
    else:
        cfg, tensors = _state_from_model(model)
        name = name or "cospec-demo"
        if tokenizer_model is None:
            raise ValueError("tokenizer_model is needed with an in-memory model")

    archs = cfg.get("architectures") or ["LlamaForCausalLM"]
    if cfg.get("model_type", "llama") != "llama" or archs[0] != "LlamaForCausalLM":
        raise ValueError(f"not a LlamaForCausalLM: model_type={cfg.get('model_type')!r}, architectures={archs}")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise NotImplementedError("attention or MLP biases are not supported")
    if cfg.get("hidden_act", "silu") != "silu":
        raise NotImplementedError(f"hidden_act {cfg['hidden_act']!r} is not supported (llama uses silu)")
    n_embd = int(cfg["hidden_size"])
    n_head = int(cfg["num_attention_heads"])
    n_head_kv = int(cfg.get("num_key_value_heads") or n_head)
    head_dim = int(cfg.get("head_dim") or n_embd // n_head)
    n_layer = int(cfg["num_hidden_layers"])
    n_vocab = int(cfg["vocab_size"])
    tied = bool(cfg.get("tie_word_embeddings", False))

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(out_path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name)
    writer.add_block_count(n_layer)
    writer.add_context_length(int(cfg["max_position_embeddings"]))
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(int(cfg["intermediate_size"]))
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_freq_base(_rope_theta(cfg))
    writer.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    if head_dim != n_embd // n_head:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_vocab_size(n_vocab)
    writer.add_rope_dimension_count(head_dim)
    writer.add_file_type(file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_vocab_to_gguf(writer, tokenizer_model, n_vocab)
    if chat_template:
        writer.add_chat_template(chat_template)

    written: set[str] = set()
    for hf_name, data in tensors:
        new_name = _gguf_name(hf_name, tied)
        if new_name is None:
            continue
        if new_name.endswith("attn_q.weight"):
            data = permute_qk(data, n_head)
        elif new_name.endswith("attn_k.weight"):
            data = permute_qk(data, n_head_kv)
        qtype = gguf.GGMLQuantizationType.F32 if data.ndim <= 1 or new_name.endswith("_norm.weight") else matrix_type
        try:
            raw = gguf.quants.quantize(data, qtype)
        except gguf.QuantError as exc:
            log.warning("%s: %s, falling back to F16", new_name, exc)
            qtype = gguf.GGMLQuantizationType.F16
            raw = gguf.quants.quantize(data, qtype)
        writer.add_tensor(new_name, raw, raw_dtype=qtype)
        written.add(new_name)

    expected = {"token_embd.weight", "output_norm.weight"} | ({"output.weight"} if not tied else set())
    expected |= {f"blk.{i}.{t}" for i in range(n_layer) for t in _LAYER_TENSORS.values()}
    if missing := sorted(expected - written):  # nothing is on disk before write_header_to_file
        raise ValueError(f"the model lacks tensors: {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}")

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


@dataclass
class LlamaToGGUFConfig:
    model_dir: Path = option(REQUIRED, "Hugging Face folder (config.json, model.safetensors)", positional=True)
    tokenizer: Path = option(REQUIRED, "SentencePiece .model file", positional=True)
    out: Path = option(REQUIRED, "output GGUF", positional=True)
    out_type: str = option("f32", "type of the weight matrices (norms stay f32)", ("--type",),
                           choices=tuple(sorted(OUT_TYPES)))
    name: str | None = option(None, "general.name (default: the folder's name)")


def main(argv: list[str] | None = None) -> None:
    args = parse_config(LlamaToGGUFConfig, argv, __doc__.split("\n\n")[0])
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    out = convert(args.model_dir, args.tokenizer, args.out, args.out_type, args.name)
    print(f"wrote {out} ({out.stat().st_size / 2**20:.2f} MiB, {args.out_type})")


if __name__ == "__main__":
    main()
