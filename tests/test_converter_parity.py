"""The demo-model toolchain end to end: a SentencePiece tokenizer trained on made-up arithmetic,
tiny random LlamaForCausalLM models (grouped-query attention), their GGUF conversion, and parity
of the GGUF in llama.cpp with the torch model: same token ids, same logits.

The engine's logits come from a recording arbiter: the draft is a second random model, so most
blocks have a mismatch and the arbiter sees the target's verification logits; row i of
`target_logits` follows the tokens `context + draft[:i]`.

Tolerances: the engine keeps its KV cache in F16 (llama.cpp's default), which alone puts about
1e-3 of relative error on the logits; with an F32 cache and no flash attention (checked through
llama-cpp-python below) the F32 file matches torch to better than 1e-6. A Q8_0 file is compared with
the torch model whose matrices went through the same Q8_0 round trip, so the layout of the
quantised blocks is checked bit for bit on the tensors; its logits are looser because ggml also
rounds the activations to Q8_0 in those matrix products.
"""
from __future__ import annotations

import copy
import random

import gguf
import numpy as np
import pytest
import torch

from cospec_local.recipes.demo_models import build_model, llama_config, save_model
from cospec_local.formats.llama_gguf_writer import convert, main as convert_main, permute_qk
from cospec_local.formats.spm_tokenizer import BOS_ID, EOS_ID, UNK_ID, gguf_vocab, load_tokenizer, read_pieces, train_tokenizer
from cospec_local import Engine, arbiter_from_function
from cospec_local.arbiter.catalog import DEMO_ARBITERS_DIR
from quantization import q8_0_roundtrip

torch.set_num_threads(1)

DIM, N_LAYERS, N_HEADS, N_KV_HEADS, FFN, MAX_LEN = 64, 2, 4, 2, 128, 256
INIT = 0.05  # spreads the random logits over a few units, so argmax is meaningful
K = 4
TEXTS = [
    "Question: what is 17 * 23?\nAnswer: 17 * 23 = 391\n#### 391",
    "#### 42",
    "a\nb\n\nc",
    "  two  spaces, trailing \n",
    "0123456789 9876543210",
    "héllo ✓ {x} [y] <z>",
    "Answer: 1000 - 1 = 999\n####",
]
# Errors relative to the largest |logit| of the reference.
REL_TOL_ENGINE = 5e-3     # F16 KV cache (measured about 1e-3)
REL_TOL_EXACT = 1e-4      # F32 KV cache, no flash attention (measured about 1e-6)
REL_TOL_Q8 = 0.05         # Q8_0 file against the Q8_0-rounded model (measured about 2e-2)
REL_TOL_Q8_FLOAT = 0.1    # Q8_0 file against the unquantised model (measured about 3e-2)


def arithmetic_corpus(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b, op = rng.randint(0, 999), rng.randint(0, 999), rng.choice("+-*")
        r = a + b if op == "+" else a - b if op == "-" else a * b
        out.append(f"Question: what is {a} {op} {b}?\nAnswer: {a} {op} {b} = {r}\n#### {r}")
    return out


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    """Tokenizer, target (saved to a folder) and draft (in memory), converted to f32 and q8_0."""
    d = tmp_path_factory.mktemp("demo")
    tok = train_tokenizer(arithmetic_corpus(300), d / "tokenizer.model", vocab_size=512)
    sp = load_tokenizer(tok)
    cfg = llama_config(sp.vocab_size(), DIM, N_LAYERS, N_HEADS, N_KV_HEADS, FFN, MAX_LEN, initializer_range=INIT)
    target, draft = build_model(cfg, seed=1), build_model(cfg, seed=2)
    save_model(target, d / "target-hf", tokenizer_model=tok)
    files = {}
    for t in ("f32", "q8_0"):
        files["target", t] = convert(d / "target-hf", None, d / f"target-{t}.gguf", t)  # from the folder
        files["draft", t] = convert(draft, tok, d / f"draft-{t}.gguf", t)            # from the model object
    return dict(dir=d, tok=tok, sp=sp, cfg=cfg, target=target, files=files)


def torch_logits(model, tokens) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([list(tokens)], dtype=torch.long)).logits[0].float().numpy()


def engine_blocks(target_path, draft_path, prompts, sp):
    """(context, draft, target_logits) of every block with a mismatch, from the engine."""
    blocks = []

    def record(block):
        blocks.append((np.array(block["context"]), np.array(block["draft"]), np.array(block["target_logits"])))
        return [False] * len(block["draft"])

    with Engine(target_path, draft_path, n_ctx=MAX_LEN, n_threads=1) as engine:
        for text in prompts:
            engine.generate(sp.encode(text, add_bos=True), mode="speculative", max_tokens=3 * (K + 1), draft_max=K,
                            adaptive_draft=False, arbiter=arbiter_from_function(record))
    return blocks


def compare(blocks, reference_model) -> dict:
    """Largest |logit difference| relative to the largest |logit|, and how often the argmax agrees
    (and, where not, how far the engine's pick is below the reference's best)."""
    worst_rel, agree, total, worst_gap = 0.0, 0, 0, 0.0
    for ctx, draft, got in blocks:
        ref = torch_logits(reference_model, np.concatenate([ctx, draft]))[len(ctx) - 1:len(ctx) + len(draft)]
        assert got.shape == ref.shape
        worst_rel = max(worst_rel, float(np.abs(got - ref).max() / np.abs(ref).max()))
        pick = got.argmax(-1)
        agree += int((pick == ref.argmax(-1)).sum())
        total += len(pick)
        gap = ref.max(-1) - ref[np.arange(len(pick)), pick]
        worst_gap = max(worst_gap, float((gap / np.abs(ref).max(-1)).max()))
    return dict(rel=worst_rel, agree=agree, total=total, gap=worst_gap)


# ------------------------------------------------------------------ tokenizer


@pytest.mark.slow
def test_tokenizer_pieces(art):
    sp = art["sp"]
    pieces = read_pieces(art["tok"])
    assert len(pieces) == sp.vocab_size()
    for i, (piece, score, _) in enumerate(pieces):
        assert piece == sp.IdToPiece(i) and score == pytest.approx(sp.GetScore(i))
    assert (sp.IdToPiece(UNK_ID), sp.IdToPiece(BOS_ID), sp.IdToPiece(EOS_ID)) == ("<unk>", "<s>", "</s>")
    assert sum(sp.IsByte(i) for i in range(sp.vocab_size())) == 256
    # split_digits: no piece holds two digits, and every digit is in the vocabulary
    assert all(sum(c.isdigit() for c in p) <= 1 for p, _, k in pieces if k != gguf.TokenType.BYTE)
    assert all(sp.PieceToId(c) != UNK_ID for c in "0123456789")
    assert [sp.IdToPiece(i) for i in sp.encode("12\n3")] == ["▁", "1", "2", "\n", "3"]
    for text in TEXTS:
        assert sp.decode(sp.encode(text)) == text
    # a model vocabulary larger than the tokenizer's is padded with unused tokens
    n = sp.vocab_size()
    tokens, scores, types = gguf_vocab(art["tok"], n + 2)
    assert tokens[n:] == [f"[PAD{n}]".encode(), f"[PAD{n + 1}]".encode()]
    assert types[n:] == [gguf.TokenType.UNUSED] * 2 and types[:n] == [k for _, _, k in pieces]


def test_gguf_metadata_and_tensors(art):
    sp = art["sp"]
    for t, matrix in (("f32", gguf.GGMLQuantizationType.F32), ("q8_0", gguf.GGMLQuantizationType.Q8_0)):
        reader = gguf.GGUFReader(art["files"]["target", t])

        def value(key):
            return reader.get_field(key).contents()

        assert value("general.architecture") == "llama"
        assert value("tokenizer.ggml.model") == "llama"
        tokens = value("tokenizer.ggml.tokens")
        types = value("tokenizer.ggml.token_type")
        assert tokens == [sp.IdToPiece(i) for i in range(sp.vocab_size())]
        assert types[:3] == [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
        assert sum(x == gguf.TokenType.BYTE for x in types) == 256 and "<0x0A>" in tokens
        assert (value("tokenizer.ggml.bos_token_id"), value("tokenizer.ggml.eos_token_id"),
                value("tokenizer.ggml.unknown_token_id")) == (BOS_ID, EOS_ID, UNK_ID)
        assert value("tokenizer.ggml.add_bos_token") is True and value("tokenizer.ggml.add_eos_token") is False
        assert value("llama.attention.head_count") == N_HEADS and value("llama.attention.head_count_kv") == N_KV_HEADS
        assert value("llama.block_count") == N_LAYERS and value("llama.rope.dimension_count") == DIM // N_HEADS
        assert value("llama.vocab_size") == sp.vocab_size()
        kinds = {tensor.name: tensor.tensor_type for tensor in reader.tensors}
        assert len(kinds) == 3 + 9 * N_LAYERS
        for name, kind in kinds.items():
            assert kind == (gguf.GGMLQuantizationType.F32 if name.endswith("_norm.weight") else matrix), name


def test_tokenization_matches_sentencepiece(art):
    sp = art["sp"]
    with Engine(art["files"]["target", "f32"], n_ctx=MAX_LEN, n_threads=1) as engine:
        for text in TEXTS:
            assert engine.tokenize(text, add_special=True) == [BOS_ID] + sp.encode(text), text
            assert engine.tokenize(text, add_special=False) == sp.encode(text), text


def test_line_split_tokenizer_matches_sentencepiece(art, tmp_path):
    """Trained on single lines, "\n" is never in a piece: it is the byte token <0x0A>."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(arithmetic_corpus(300)) + "\n", encoding="utf-8")
    tok = train_tokenizer(corpus, tmp_path / "lines.model", vocab_size=512, split_lines=True)
    sp = load_tokenizer(tok)
    assert not any("\n" in p for p, _, _ in read_pieces(tok))
    assert [sp.IdToPiece(i) for i in sp.encode("12\n3")] == ["▁", "1", "2", "<0x0A>", "3"]
    model = build_model(llama_config(sp.vocab_size(), DIM, 1, N_HEADS, N_KV_HEADS, FFN, MAX_LEN), seed=4)
    out = convert(model, tok, tmp_path / "lines.gguf")
    with Engine(out, n_ctx=MAX_LEN, n_threads=1) as engine:
        for text in TEXTS:
            assert sp.decode(sp.encode(text)) == text
            assert engine.tokenize(text, add_special=True) == [BOS_ID] + sp.encode(text), text


# ------------------------------------------------------------------ logits


def test_f32_logits_match_torch(art):
    files = art["files"]
    blocks = engine_blocks(files["target", "f32"], files["draft", "f32"], TEXTS, art["sp"])
    assert len(blocks) >= len(TEXTS)
    stats = compare(blocks, art["target"])
    print(f"\nf32 via engine: {stats}")
    assert stats["rel"] < REL_TOL_ENGINE
    assert stats["gap"] < 2 * REL_TOL_ENGINE  # a differing argmax is a near tie
    assert stats["agree"] >= 0.95 * stats["total"]


def test_q8_0_logits_match_torch(art):
    files = art["files"]
    blocks = engine_blocks(files["target", "q8_0"], files["draft", "q8_0"], TEXTS, art["sp"])
    assert len(blocks) >= len(TEXTS)
    same_weights = compare(blocks, q8_0_roundtrip(art["target"]))
    float_model = compare(blocks, art["target"])
    print(f"\nq8_0 via engine: against Q8_0 weights {same_weights}, against float weights {float_model}")
    # ggml also rounds the activations to Q8_0 blocks in these matmuls, hence the looser bounds
    assert same_weights["rel"] < REL_TOL_Q8
    assert same_weights["gap"] < REL_TOL_Q8
    assert same_weights["agree"] >= 0.9 * same_weights["total"]
    assert float_model["rel"] < REL_TOL_Q8_FLOAT
    assert float_model["agree"] >= 0.8 * float_model["total"]


@pytest.mark.parametrize("out_type", ["f32", "q8_0"])
def test_gguf_tensors_equal_torch_weights(art, out_type):
    """Every tensor in the file, dequantised, is the torch weight (Q/K rows permuted for NORM
    rope), bit for bit: through a Q8_0 round trip for the q8_0 file."""
    model = art["target"] if out_type == "f32" else q8_0_roundtrip(art["target"])
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    reader = gguf.GGUFReader(art["files"]["target", out_type])
    hf = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
    layer = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    for tensor in reader.tensors:
        parts = tensor.name.removesuffix(".weight").split(".")
        name = hf[parts[0]] if len(parts) == 1 else f"model.layers.{parts[1]}.{layer[parts[2]]}"
        want = weights[name + ".weight"]
        if parts[-1] == "attn_q":
            want = permute_qk(want, N_HEADS)
        elif parts[-1] == "attn_k":
            want = permute_qk(want, N_KV_HEADS)
        got = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(want.shape)
        assert np.array_equal(got, want), tensor.name


def test_f32_logits_exact_with_f32_kv_cache(art):
    """The conversion itself is exact: with an F32 KV cache llama.cpp reproduces torch."""
    import llama_cpp

    tokens = [BOS_ID] + art["sp"].encode(TEXTS[0])
    llm = llama_cpp.Llama(str(art["files"]["target", "f32"]), n_ctx=MAX_LEN, n_threads=1, logits_all=True,
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, flash_attn=False,
                          verbose=False)
    try:
        llm.eval(tokens)
        got = np.array(llm.scores[:len(tokens)])
    finally:
        llm.close()
    ref = torch_logits(art["target"], tokens)
    rel = float(np.abs(got - ref).max() / np.abs(ref).max())
    print(f"\nf32, F32 KV cache: rel {rel:.2e}")
    assert rel < REL_TOL_EXACT
    assert (got.argmax(-1) == ref.argmax(-1)).all()


def test_tied_embeddings_and_cli(art, tmp_path):
    """A model with tied embeddings has no output.weight; llama.cpp reuses token_embd."""
    sp = art["sp"]
    cfg = llama_config(sp.vocab_size(), DIM, 1, N_HEADS, 1, FFN, MAX_LEN, initializer_range=INIT, tie_embeddings=True)
    tied = build_model(cfg, seed=3)
    save_model(tied, tmp_path / "tied-hf")
    out = tmp_path / "tied.gguf"
    convert_main([str(tmp_path / "tied-hf"), str(art["tok"]), str(out), "--type", "f32"])
    names = {t.name for t in gguf.GGUFReader(out).tensors}
    assert "output.weight" not in names and "token_embd.weight" in names
    blocks = engine_blocks(out, art["files"]["draft", "f32"], TEXTS[:3], sp)
    assert blocks
    stats = compare(blocks, tied)
    print(f"\ntied f32 via engine: {stats}")
    assert stats["rel"] < REL_TOL_ENGINE


def test_convert_rejects_bad_input(art, tmp_path):
    with pytest.raises(ValueError, match="out_type"):
        convert(art["target"], art["tok"], tmp_path / "x.gguf", "q4_0")
    with pytest.raises(FileNotFoundError):
        convert(tmp_path, art["tok"], tmp_path / "x.gguf")
    small = copy.deepcopy(art["cfg"])
    small.vocab_size = art["sp"].vocab_size() - 1
    with pytest.raises(ValueError, match="vocab_size"):
        convert(build_model(small), art["tok"], tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


def run_entry_point(*args: str) -> str:
    """`python -m converters.NAME ...` in a fresh interpreter, as a user runs it."""
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.slow
def test_entry_points_convert_both_ways(art, tmp_path):
    """converters.llama_to_gguf writes the same tensors as the library call, and
    converters.gguf_to_torch reads them back into a folder whose weights equal the torch model's."""
    from safetensors.numpy import load_file

    out = tmp_path / "target.gguf"
    run_entry_point("converters.llama_to_gguf", str(art["dir"] / "target-hf"), str(art["tok"]), str(out), "--type", "f32")
    library = {t.name: np.array(t.data) for t in gguf.GGUFReader(art["files"]["target", "f32"]).tensors}
    written = {t.name: np.array(t.data) for t in gguf.GGUFReader(out).tensors}
    assert written.keys() == library.keys()
    assert all(np.array_equal(written[k], library[k]) for k in library)
    run_entry_point("converters.gguf_to_torch", str(out), str(tmp_path / "back"))
    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    expected = {k: v.detach().numpy() for k, v in art["target"].state_dict().items()}
    assert back.keys() == expected.keys()
    assert max(float(np.abs(back[k] - expected[k]).max()) for k in expected) < 1e-6


@pytest.mark.slow
def test_arbiter_export_entry_point_writes_the_head_as_onnx(tmp_path):
    """converters.arbiter_export rebuilds head.onnx from arbiter.gguf, and the engine's ONNX head
    then gives the shipped arbiter's native P(keep)."""
    import shutil

    import onnxruntime

    from cospec_local.arbiter.file_format import ONNX_FILE, read_bundle

    folder = tmp_path / "features"
    shutil.copytree(DEMO_ARBITERS_DIR / "features", folder)
    (folder / ONNX_FILE).unlink()
    printed = run_entry_point("converters.arbiter_export", str(folder), "-md", "demo-draft")
    assert "P(keep) within" in printed
    head = read_bundle(folder).head
    rows = np.random.default_rng(0).normal(size=(32, head["head.in_mean"].size)).astype(np.float32)
    h = (rows - head["head.in_mean"]) * head["head.in_scale"]
    for i in range(len([k for k in head if k.endswith(".weight")])):
        h = h @ head[f"head.{i}.weight"].T + head[f"head.{i}.bias"]
        h = np.maximum(h, 0) if f"head.{i + 1}.weight" in head else h
    expected = 1 / (1 + np.exp(-h.reshape(-1)))
    session = onnxruntime.InferenceSession(str(folder / ONNX_FILE), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: rows})[0].reshape(-1)
    assert np.abs(got - expected).max() < 1e-5
