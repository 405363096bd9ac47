"""Tiny random models of every architecture family llama.cpp runs, made in seconds from
transformers configs by llama.cpp's own converter (`convert_hf_to_gguf.py`, vendored in
llama-cpp-python's sdist; `./install.sh` unpacks it into .venv/src/llama.cpp).

Every model gets SmolLM2's vocabulary (its GGUF tokenizer keys copied in place of the converter's
vocabulary step), so any two of them, and SmolLM2 itself, make a draft/target pair. Weights are
random: outputs are noise, but each architecture's real graph, memory kind (attention, sliding
window, recurrent, hybrid) and rollback path run. The zoo test and the rollback benchmark use them.

More names are llama.cpp's own speculative heads, tiny and random the same way: `qwen35-mtp`
(the zoo's qwen35 with one multi-token-prediction layer, for llama.cpp's MTP drafter), and
`llama-eagle3` and `qwen35-eagle3` (EAGLE-3 heads for the zoo's llama and hybrid qwen35, which
llama.cpp loads as its own `eagle3` model), and `llama-dflash` (a DFlash drafter for llama, its
`dflash` model).

    python -m cospec_local.formats.tiny_models --out DIR [NAME ...]     # default: every name

Runs torch: keep it out of a process that decodes with llama.cpp (call `build` from elsewhere;
it starts this module as a child process).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from ..command_line import REQUIRED, option, parse_config

# Small enough to build and run in a second or two each, large enough for every layer kind:
# hidden 64, 4 layers (two of each kind in the hybrids), 4 heads of 16, 2 KV heads.
HIDDEN = 64
LAYERS = 4
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16
FFN = 128
CONTEXT = 4096
SLIDING_WINDOW = 32  # gemma3 and gpt-oss: short, so a test's prompt runs past it
# Weights this wide (transformers initialises with 0.02) make the next token depend on the context,
# so a random model writes varied text instead of one token over and over, and two of them disagree.
INIT_STD = 0.3


def _common(vocab: int) -> dict:
    return dict(vocab_size=vocab, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                num_key_value_heads=KV_HEADS, intermediate_size=FFN, max_position_embeddings=CONTEXT,
                tie_word_embeddings=False, initializer_range=INIT_STD, bos_token_id=1, eos_token_id=2, pad_token_id=None)


def _config(name: str, vocab: int):
    """The transformers config of one zoo model."""
    import transformers as tf

    c = _common(vocab)
    attn_mamba = ["mamba", "attention", "mamba", "attention"]
    if name == "llama":
        return tf.LlamaConfig(**c)
    if name == "qwen2":
        return tf.Qwen2Config(**c)
    if name == "qwen3":
        return tf.Qwen3Config(**c, head_dim=HEAD_DIM)
    if name == "qwen3moe":
        return tf.Qwen3MoeConfig(**c, head_dim=HEAD_DIM, num_experts=4, num_experts_per_tok=2,
                                 moe_intermediate_size=64, decoder_sparse_step=1, mlp_only_layers=[])
    if name == "gemma3":
        return tf.Gemma3TextConfig(**c, head_dim=HEAD_DIM, query_pre_attn_scalar=HEAD_DIM, sliding_window=SLIDING_WINDOW,
                                   layer_types=["sliding_attention", "sliding_attention", "sliding_attention",
                                                "full_attention"])
    if name == "phi3":
        return tf.Phi3Config(**c)
    if name == "gptoss":
        return tf.GptOssConfig(**c, head_dim=HEAD_DIM, num_local_experts=4, num_experts_per_tok=2,
                               sliding_window=SLIDING_WINDOW,
                               layer_types=["sliding_attention", "full_attention"] * (LAYERS // 2))
    if name == "mamba2":
        return tf.Mamba2Config(vocab_size=vocab, hidden_size=HIDDEN, num_hidden_layers=LAYERS, expand=2,
                               num_heads=2 * HIDDEN // HEAD_DIM, head_dim=HEAD_DIM, n_groups=1, state_size=16,
                               conv_kernel=4, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if name == "lfm2":
        return tf.Lfm2Config(**c, layer_types=["conv", "full_attention", "conv", "full_attention"])
    if name == "falconh1":
        return tf.FalconH1Config(**c, head_dim=HEAD_DIM, mamba_d_ssm=2 * HIDDEN, mamba_n_heads=2 * HIDDEN // HEAD_DIM,
                                 mamba_d_head=HEAD_DIM, mamba_d_state=16, mamba_d_conv=4, mamba_n_groups=1,
                                 mamba_expand=2)
    if name == "granitehybrid":
        return tf.GraniteMoeHybridConfig(**c, layer_types=attn_mamba, num_local_experts=0, num_experts_per_tok=0,
                                         shared_intermediate_size=FFN, mamba_n_heads=2 * HIDDEN // HEAD_DIM,
                                         mamba_d_head=HEAD_DIM, mamba_d_state=16, mamba_d_conv=4, mamba_n_groups=1,
                                         mamba_expand=2)
    if name == "qwen35":
        # mRoPE sections count rotary pairs: half the head's 16 rotary dimensions.
        return tf.Qwen3_5TextConfig(**c, head_dim=HEAD_DIM, linear_num_key_heads=2, linear_num_value_heads=4,
                                    linear_key_head_dim=HEAD_DIM, linear_value_head_dim=HEAD_DIM,
                                    linear_conv_kernel_dim=4,
                                    layer_types=["linear_attention", "full_attention"] * (LAYERS // 2),
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                     "partial_rotary_factor": 1.0, "mrope_section": [3, 3, 2]})
    if name in ("nemotronh", "nemotronhmoe"):
        last = "mlp" if name == "nemotronh" else "moe"
        return tf.NemotronHConfig(**c, head_dim=HEAD_DIM, layers_block_type=["mamba", "attention", "mamba", last],
                                  mamba_num_heads=8, mamba_head_dim=HEAD_DIM, ssm_state_size=16, n_groups=1,
                                  conv_kernel=4, expand=2, n_routed_experts=4, num_experts_per_tok=2,
                                  moe_intermediate_size=64, moe_shared_expert_intermediate_size=64, n_group=1,
                                  topk_group=1)
    if name == "jamba":
        return tf.JambaConfig(**c, num_experts=4, num_experts_per_tok=2, attn_layer_period=2, attn_layer_offset=1,
                              expert_layer_period=2, expert_layer_offset=1, mamba_d_state=16, mamba_d_conv=4,
                              mamba_expand=2, use_mamba_kernels=False)
    raise KeyError(name)


def _older_layer_names(name: str, config: dict) -> dict:
    """The model's settings (config.json as the converter loads it) in the names the converter reads. transformers 5.25 writes hybrids'
    layer kinds as "linear_attention" / "full_attention"; the converter's Granite and dense
    Nemotron-H paths look for the older names and, not finding them, write files whose layers are
    all of one kind (which llama.cpp then refuses)."""
    if name == "granitehybrid":
        config["layer_types"] = ["attention" if t == "full_attention" else "mamba" for t in config["layer_types"]]
    if name == "nemotronh":
        kinds = {"linear_attention": "M", "mamba": "M", "full_attention": "*", "attention": "*", "mlp": "-"}
        config["hybrid_override_pattern"] = "".join(kinds[t] for t in config.pop("layers_block_type"))
        config["num_hidden_layers"] = len(config["hybrid_override_pattern"])
        # The converter reads these keys' presence as "mixture of experts" (transformers writes its
        # defaults), and writes an expert count that makes llama.cpp abort on a dense file.
        for key in ("num_experts_per_tok", "n_routed_experts", "n_group", "topk_group"):
            config.pop(key, None)
    return config


# name: (what it stands for, its memory kind in llama.cpp)
ARCHITECTURES = {
    "llama": "attention",
    "qwen2": "attention",
    "qwen3": "attention",
    "qwen3moe": "attention, mixture of experts",
    "gemma3": "attention with a sliding window",
    "phi3": "attention",
    "gptoss": "attention with a sliding window, mixture of experts",
    "mamba2": "recurrent",
    "lfm2": "hybrid: convolution and attention",
    "falconh1": "hybrid: attention and Mamba-2 in every layer",
    "granitehybrid": "hybrid: Mamba-2 and attention layers",
    "qwen35": "hybrid: gated delta-net and attention",
    "nemotronh": "hybrid: Mamba-2, attention and MLP layers",
    "nemotronhmoe": "hybrid: Mamba-2, attention and mixture-of-experts layers",
    "jamba": "hybrid: Mamba and attention layers, mixture of experts",
}


# name: (the zoo model it drafts for, what it is)
HEAD_DRAFTERS = {
    "qwen35-mtp": ("qwen35", "qwen35 (the same trunk, byte for byte) with one multi-token-prediction layer"),
    "llama-eagle3": ("llama", "an EAGLE-3 head for llama: one decoder layer fed by three of llama's layers"),
    "qwen35-eagle3": ("qwen35", "an EAGLE-3 head for the hybrid qwen35, fed by three of its layers (both kinds)"),
    "llama-dflash": ("llama", "a DFlash block-diffusion drafter for llama: one Qwen3 layer over three of llama's "
                              "layers, drafting a block of 3 from mask tokens in one pass"),
}
# The target layers whose inputs an EAGLE-3 head reads: llama.cpp takes exactly three, each below the
# target's layer count (the count itself would mean its last hidden state). Low, middle and high, as
# trained heads pick them; the converter's default for 4 layers, [2, 2, 1], repeats one.
EAGLE3_TARGET_LAYERS = [1, 2, 3]
# DFlash: its trained block (the anchor and block - 1 mask positions, drafted in one pass), and the
# token it reads as a mask (SmolLM2's last; DFlash's releases add one of their own).
DFLASH_BLOCK = 4
DFLASH_MASK_TOKEN = -1  # from the end of the vocabulary


def vocabulary_source() -> Path:
    """The GGUF whose tokenizer every zoo model gets: SmolLM2's."""
    from cospec_local.model_paths import find_smollm2_gguf

    return find_smollm2_gguf()


def llama_cpp_source() -> Path:
    """llama.cpp's source tree as llama-cpp-python's sdist vendors it."""
    root = Path(os.environ.get("COSPEC_LLAMA_CPP_SRC", Path(sys.prefix) / "src" / "llama.cpp"))
    if not (root / "convert_hf_to_gguf.py").is_file():
        raise FileNotFoundError(f"llama.cpp's source is not at {root}: ./install.sh unpacks it there "
                                "(or set COSPEC_LLAMA_CPP_SRC to a llama.cpp checkout of the pinned version)")
    return root


def cache_dir(checkout: Path) -> Path:
    """Where a checkout keeps the zoo it built: under .cache, by a key of this builder's source, so
    the tests and benchmarks share one build until the builder changes."""
    import hashlib

    key = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    return Path(checkout) / ".cache" / "tiny-models" / key


def build(names: list[str], out: Path, vocab: Path | None = None, timeout: float = 600.0) -> dict[str, Path]:
    """Make the named zoo models under out (NAME.gguf), in a child process; returns their paths.
    A model already there is kept. vocab: the GGUF whose tokenizer they get (default SmolLM2's)."""
    out = Path(out)
    missing = [n for n in names if not (out / f"{n}.gguf").is_file()]
    if missing:
        cmd = [sys.executable, "-m", "cospec_local.formats.tiny_models", "--out", str(out), *missing]
        if vocab is not None:
            cmd += ["--vocab", str(vocab)]
        done = subprocess.run(cmd, timeout=timeout, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"making tiny models failed:\n{done.stderr[-3000:]}")
    return {n: out / f"{n}.gguf" for n in names}


def copy_vocabulary(writer, source: Path) -> None:
    """Write the tokenizer.* keys of source into writer, types kept."""
    import gguf

    reader = gguf.GGUFReader(source)
    for field in reader.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(field.name, field.contents(), vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(field.name, field.contents(), vtype)


def _random(shape: tuple[int, ...], generator):
    import torch

    return torch.randn(shape, generator=generator) * INIT_STD


def _add_mtp_layer(hf_dir: Path, seed: int) -> None:
    """Add one multi-token-prediction layer to a saved Qwen3.5 checkpoint, under the names Qwen's
    releases use (transformers has no MTP module and drops mtp.* on load). The converter maps them
    to blk.{n_layer}: a full-attention decoder layer plus nextn.eh_proj, enorm, hnorm and
    shared_head.norm."""
    import torch
    from safetensors.torch import load_file, save_file

    path = hf_dir / "model.safetensors"
    tensors = load_file(path)
    last = f"model.layers.{LAYERS - 1}."  # a full-attention layer: the MTP layer has its shapes
    shapes = {"mtp.layers.0." + k.removeprefix(last): tuple(t.shape) for k, t in tensors.items() if k.startswith(last)}
    shapes |= {"mtp.fc.weight": (HIDDEN, 2 * HIDDEN),  # [token embedding, target hidden state] -> hidden
               "mtp.pre_fc_norm_embedding.weight": (HIDDEN,), "mtp.pre_fc_norm_hidden.weight": (HIDDEN,),
               "mtp.norm.weight": (HIDDEN,)}
    generator = torch.Generator().manual_seed(seed)
    for key in sorted(shapes):
        # Qwen3.5's norms scale by 1 + weight (the converter adds the 1): zero, as transformers initialises them.
        tensors[key] = torch.zeros(shapes[key]) if len(shapes[key]) == 1 else _random(shapes[key], generator)
    save_file(tensors, path, metadata={"format": "pt"})
    config = json.loads((hf_dir / "config.json").read_text())
    config["mtp_num_hidden_layers"] = 1  # what the converter reads to count the layers as nextn
    (hf_dir / "config.json").write_text(json.dumps(config, indent=2))


def _write_eagle3_head(hf_dir: Path, n_vocab: int, seed: int) -> None:
    """An EAGLE-3 head checkpoint in the layout of the published ones (transformers has no EAGLE-3
    model): fc fuses three target hidden states, and one Llama decoder layer ("midlayer") attends
    over [token embedding, fused state], so its q/k/v read twice the hidden width. The draft
    vocabulary is the whole target's, so there is no d2t mapping."""
    import torch
    import transformers as tf
    from safetensors.torch import save_file

    hf_dir.mkdir(parents=True, exist_ok=True)
    config = tf.LlamaConfig(**{**_common(n_vocab), "num_hidden_layers": 1}).to_dict()
    config.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=n_vocab,
                  eagle_aux_hidden_state_layer_ids=EAGLE3_TARGET_LAYERS)
    (hf_dir / "config.json").write_text(json.dumps(config, indent=2))
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    shapes = {
        "fc.weight": (HIDDEN, len(EAGLE3_TARGET_LAYERS) * HIDDEN),
        "midlayer.input_layernorm.weight": (HIDDEN,),
        "midlayer.hidden_norm.weight": (HIDDEN,),
        "midlayer.self_attn.q_proj.weight": (q, 2 * HIDDEN),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * HIDDEN),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * HIDDEN),
        "midlayer.self_attn.o_proj.weight": (HIDDEN, q),
        "midlayer.post_attention_layernorm.weight": (HIDDEN,),
        "midlayer.mlp.gate_proj.weight": (FFN, HIDDEN),
        "midlayer.mlp.up_proj.weight": (FFN, HIDDEN),
        "midlayer.mlp.down_proj.weight": (HIDDEN, FFN),
        "norm.weight": (HIDDEN,),
        "lm_head.weight": (n_vocab, HIDDEN),  # its own, as trained heads have (else llama.cpp uses the target's)
    }
    generator = torch.Generator().manual_seed(seed)
    tensors = {k: torch.ones(s) if len(s) == 1 else _random(s, generator) for k, s in shapes.items()}
    save_file(tensors, hf_dir / "model.safetensors", metadata={"format": "pt"})


def _write_dflash_drafter(hf_dir: Path, n_vocab: int, seed: int) -> None:
    """A DFlash drafter checkpoint in the layout of the published ones (z-lab's; transformers has no
    DFlash model): Qwen3 decoder layers whose keys and values also come from the target's hidden
    states (fc fuses three layers, hidden_norm normalises them), sharing the target's embeddings and
    output head (it has none of its own). HF counts target layers from 0 at the output of the
    first; the converter writes them as llama.cpp's layer inputs (+1): EAGLE3_TARGET_LAYERS."""
    import torch
    import transformers as tf
    from safetensors.torch import save_file

    hf_dir.mkdir(parents=True, exist_ok=True)
    config = tf.Qwen3Config(**{**_common(n_vocab), "num_hidden_layers": 1}, head_dim=HEAD_DIM).to_dict()
    config.update(architectures=["DFlashDraftModel"],
                  dflash_config={"mask_token_id": n_vocab + DFLASH_MASK_TOKEN, "block_size": DFLASH_BLOCK,
                                 "target_layer_ids": [i - 1 for i in EAGLE3_TARGET_LAYERS]})
    (hf_dir / "config.json").write_text(json.dumps(config, indent=2))
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    layer = "model.layers.0."
    shapes = {
        "model.fc.weight": (HIDDEN, len(EAGLE3_TARGET_LAYERS) * HIDDEN),
        "model.hidden_norm.weight": (HIDDEN,),
        layer + "input_layernorm.weight": (HIDDEN,),
        layer + "self_attn.q_proj.weight": (q, HIDDEN),
        layer + "self_attn.k_proj.weight": (kv, HIDDEN),
        layer + "self_attn.v_proj.weight": (kv, HIDDEN),
        layer + "self_attn.o_proj.weight": (HIDDEN, q),
        layer + "self_attn.q_norm.weight": (HEAD_DIM,),
        layer + "self_attn.k_norm.weight": (HEAD_DIM,),
        layer + "post_attention_layernorm.weight": (HIDDEN,),
        layer + "mlp.gate_proj.weight": (FFN, HIDDEN),
        layer + "mlp.up_proj.weight": (FFN, HIDDEN),
        layer + "mlp.down_proj.weight": (HIDDEN, FFN),
        "model.norm.weight": (HIDDEN,),
    }
    generator = torch.Generator().manual_seed(seed)
    tensors = {k: torch.ones(s) if len(s) == 1 else _random(s, generator) for k, s in shapes.items()}
    save_file(tensors, hf_dir / "model.safetensors", metadata={"format": "pt"})


def _convert(name: str, out: Path, vocab_source: Path, n_vocab: int) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    import conversion  # llama.cpp's converter package (sys.path set by main)
    import gguf

    hf_dir = out / f".{name}-hf"
    target_dir = None
    if name.endswith(("-eagle3", "-dflash")):
        # The converter reads the target's sizes and layer count from its config.json; no weights needed.
        target_dir = out / f".{name}-target"
        _config(HEAD_DRAFTERS[name][0], n_vocab).save_pretrained(target_dir)
        write = _write_eagle3_head if name.endswith("-eagle3") else _write_dflash_drafter
        write(hf_dir, n_vocab, sum(map(ord, name)))
    else:
        base = HEAD_DRAFTERS[name][0] if name in HEAD_DRAFTERS else name
        torch.manual_seed(sum(map(ord, base)))  # qwen35-mtp's trunk is qwen35's
        config = _config(base, n_vocab)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.save_pretrained(hf_dir)
        if name == "qwen35-mtp":
            _add_mtp_layer(hf_dir, sum(map(ord, name)))
    if name == "gemma3":
        # Gemma's converter cuts the embedding to the tokenizer's size, which it counts in tokenizer.json.
        (hf_dir / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {f"t{i}": i for i in range(n_vocab)}},
                                                           "added_tokens": []}))
    hparams = _older_layer_names(name, conversion.ModelBase.load_hparams(hf_dir, False))
    model_class = conversion.get_model_class(conversion.get_model_architecture(hparams, conversion.ModelType.TEXT))
    if getattr(model_class, "supports_mtp_export", False):
        # A class setting, kept between models: only qwen35-mtp has multi-token-prediction layers.
        model_class.no_mtp = name != "qwen35-mtp"
    target = out / f"{name}.gguf"
    partial = out / f".{name}.gguf.partial"
    # A model name with "phi3" in it changes how llama.cpp reads the vocabulary.
    instance = model_class(hf_dir, gguf.LlamaFileType.MOSTLY_F16, partial, hparams=hparams, model_name="tiny random model",
                           target_model_dir=target_dir)
    # SmolLM2's vocabulary in place of the converter's tokenizer step: no tokenizer files needed,
    # and every zoo model pairs with every other.
    instance.set_vocab = lambda: copy_vocabulary(instance.gguf_writer, vocab_source)
    if name.endswith("-dflash"):  # what DFlash's own vocabulary step adds
        instance.set_vocab = lambda: (copy_vocabulary(instance.gguf_writer, vocab_source),
                                      instance.gguf_writer.add_mask_token_id(n_vocab + DFLASH_MASK_TOKEN))
    instance.write()
    partial.replace(target)
    shutil.rmtree(hf_dir)
    if target_dir is not None:
        shutil.rmtree(target_dir)
    return target


@dataclass
class TinyModelsConfig:
    out: Path = option(REQUIRED, "folder of the models")
    vocab: Path | None = option(None, "the GGUF whose tokenizer the models get (default: SmolLM2's)")
    names: list[str] = option([], f"models (default: all of {', '.join([*ARCHITECTURES, *HEAD_DRAFTERS])})",
                              positional=True)


def main(argv=None) -> None:
    a = parse_config(TinyModelsConfig, argv, __doc__.split("\n\n")[0])
    known = [*ARCHITECTURES, *HEAD_DRAFTERS]
    names = a.names or known
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown: {', '.join(unknown)}; known: {', '.join(known)}")
    src = llama_cpp_source()
    sys.path.insert(0, str(src / "gguf-py"))  # the converter's own gguf-py, before any installed one
    sys.path.insert(0, str(src))
    import logging

    logging.basicConfig(level=logging.WARNING)
    vocab_source = a.vocab or vocabulary_source()
    import gguf

    n_vocab = len(gguf.GGUFReader(vocab_source).fields["tokenizer.ggml.tokens"].data)
    a.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        print(_convert(name, a.out, vocab_source, n_vocab), flush=True)


if __name__ == "__main__":
    main()
