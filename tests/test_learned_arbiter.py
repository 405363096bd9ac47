"""Learned arbiters end to end: the torch models, their export (LoRA adapter GGUF, head GGUF,
head.onnx), native execution inside the engine, and the bundled demo arbiters.

Parity, as the engine runs them:
- hidden states of the LoRA arbiter's hybrid-mask pass, llama.cpp vs torch, f32 weights: <= 1e-3;
- the head under ONNX Runtime vs torch: <= 1e-5; the native head vs ONNX Runtime likewise;
- P(keep) of the shipped (Q8_0 draft) arbiters, torch vs native, on recorded states: >= 99% of
  decisions the same at the threshold.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFValueType
from gguf_corpus import with_kv

from cospec_local.arbiter.file_format import write_arbiter
from cospec_local.errors import ArbiterSettingsWarning
from cospec_local.formats.llama_gguf_writer import convert
from cospec_local import AdapterError, ArbiterDraftError, ArbiterError, Engine, GenerationParams, InvalidArgumentError, NoDraftError, _cospec
from cospec_local.arbiter.catalog import NAMED_ARBITERS
from cospec_local.arbiter.callbacks import onnx_head
from cospec_local.formats.gguf_edit import open_gguf, rewrite_gguf
from cospec_local.models import DEMO_DIR, demo_checkpoint, demo_model
from cospec_local.params import DEFAULTS
from cospec_local.tasks import FAMILY_STOPS, load_task
from cospec_local.train.arbiter_model import (FeaturesArbiter, LoraArbiter, load_arbiter, load_draft_backbone,
                                              make_batch)
from cospec_local.train.branch_oracle import BranchOracle
from cospec_local.train.collect import Collector
from cospec_local.train.states import TRAINING_SOURCES, DecisionState, branch_label

torch.set_num_threads(1)  # before torch's first op: llama.cpp in this process stays fast


@pytest.fixture(scope="module")
def demo_engine():
    # Uncalibrated, as the training side runs: the collector's blocks are then the same on any machine.
    with Engine.open_default(n_ctx=1024, n_threads=1, calibration=None) as engine:
        yield engine


@pytest.fixture(scope="module")
def labelled(demo_engine):
    """Labelled states recorded by the branch-oracle collector on a few dev problems."""
    collector = Collector(demo_engine, GenerationParams(max_tokens=200, spec_type=TRAINING_SOURCES))
    out = []
    for problem in load_task("arith", "dev", 16) + load_task("pyfunc", "dev", 8):
        out += collector.problem(problem, "dev")[1]
    assert len(out) >= 8
    return out


@pytest.fixture(scope="module")
def states(labelled) -> list[DecisionState]:
    return [s.state for s in labelled]


@pytest.fixture(scope="module")
def f32_draft(tmp_path_factory):
    path = tmp_path_factory.mktemp("draft") / "demo-draft-f32.gguf"
    return convert(demo_checkpoint("draft"), DEMO_DIR / "tokenizer.model", path, "f32")


def random_lora_arbiter(draft_gguf, seed=0, lora_context="draft") -> LoraArbiter:
    torch.manual_seed(seed)
    model = LoraArbiter(load_draft_backbone(draft_gguf), lora_context=lora_context)
    for name, p in model.named_parameters():
        if "lora_B" in name:  # PEFT starts B at zero: a no-op adapter would check nothing
            torch.nn.init.normal_(p, std=0.05)
    return model.eval()


def export(model, folder, draft_gguf, threshold=0.5):
    extra = model.export_args() if model.kind == "lora" else {}
    return write_arbiter(folder, kind=model.kind, head=model.head, draft_gguf=draft_gguf, threshold=threshold,
                         name=f"test-{model.kind}", **extra)


def block_of(engine, state: DecisionState, logits=True) -> dict:
    """The block a state was decided on, its logits rebuilt by teacher forcing."""
    ctx, draft, target = state.context, state.draft, state.target
    n, k = len(ctx), len(draft)
    b = {"draft": np.array(draft, np.int32), "target": np.array(target, np.int32),
         "mismatch": np.array(state.mismatch, np.uint8), "context": np.array(ctx, np.int32)}
    if logits:
        b["target_logits"] = engine.score(ctx + draft, "target")[n - 1:n + k]
        b["draft_logits"] = engine.score(ctx + draft, "draft")[n - 1:n - 1 + k]
    else:
        b["target_logits"] = np.zeros((k + 1, engine.n_vocab), np.float32)
        b["draft_logits"] = np.zeros((k, engine.n_vocab), np.float32)
    return b


def documented_defaults(struct: str) -> dict:
    """Field -> the default that native/include/cospec.h's comments give for it ("(default 8)",
    "(...; default on)"), read from the comment on the field's line, its continuation lines, and
    the block comment just above it."""
    header = (Path(__file__).resolve().parents[1] / "native" / "include" / "cospec.h").read_text()
    body = re.search(rf"struct {struct} {{\n(.*?)\n}};", header, re.S).group(1)
    words = {"on": True, "true": True, "off": False, "false": False}
    comments, above, last = {}, [], None
    for line in body.splitlines():
        field = re.match(r"\s*[\w\s*]+?\b(\w+);\s*(?://(.*))?$", line)
        if field:
            last = field.group(1)
            comments[last] = " ".join(above + [field.group(2) or ""])
            above = []
        elif re.match(r" {4}//", line):  # a block comment at the fields' indentation: the next field's
            above.append(line)
        elif line.strip().startswith("//") and last:  # indented further: the last field's comment goes on
            comments[last] += " " + line
    out = {}
    for name, text in comments.items():
        m = re.search(r"\bdefault (-?[\w.]+)", text)
        if m:
            value = m.group(1)
            out[name] = words.get(value, value if value.isalpha() else float(value))
    return out


def test_native_defaults_are_the_ones_the_header_documents():
    """The C defaults as the extension reads them, against the values the header's comments
    promise (an independent source: a changed default must change its documentation too), and
    the Python API's defaults against the same documented values."""
    generate = documented_defaults("cospec_generate_params")
    assert {"n_predict", "n_draft", "adaptive_draft", "repeat_last_n", "sample_arbiter", "mode"} <= set(generate)
    native = _cospec.GenerateParams()
    assert generate.pop("mode") == "speculative" and native.mode == _cospec.MODE_SPECULATIVE
    assert {name: getattr(native, name) for name in generate} == pytest.approx(generate)
    fly = documented_defaults("cospec_fly_params")
    assert set(fly) == {"window", "entropy_threshold"}
    assert {name: _cospec.FLY_DEFAULTS[name] for name in fly} == pytest.approx(fly)
    learned = documented_defaults("cospec_learned_arbiter_params")
    assert learned["fold_adapter"] is True and learned["use_gate"] is True and learned["threshold"] == -1
    assert {name: _cospec.LEARNED_ARBITER_DEFAULTS[name] for name in ("fold_adapter", "use_gate")} == \
        {"fold_adapter": True, "use_gate": True}
    python = {"max_tokens": "n_predict", "draft_max": "n_draft", "adaptive_draft": "adaptive_draft",
              "repeat_last_n": "repeat_last_n", "sample_arbiter": "sample_arbiter"}
    assert {p: getattr(DEFAULTS, p) for p in python} == {p: generate[c] for p, c in python.items()}
    assert (DEFAULTS.fly_window, DEFAULTS.fly_entropy, DEFAULTS.arbiter_gate) == \
        pytest.approx((fly["window"], fly["entropy_threshold"], learned["use_gate"]))


def test_collector_reject_branch_is_the_recorded_run(demo_engine, labelled):
    """The collector scores the reject branch with the recorded run's own answer: greedy
    speculative decoding is lossless, so continuing after the target's token gives that run."""
    problems = {p.id: p for p in load_task("arith", "dev", 16) + load_task("pyfunc", "dev", 8)}
    for s in labelled[:6]:
        problem = problems[s.problem_id]
        stops = tuple(FAMILY_STOPS[problem.family])
        full = demo_engine.generate(problem.prompt, max_tokens=200, stop=stops).text
        i = s.position
        prefix = s.state.context + s.state.draft[:i] + [s.state.target[i]]
        generated = prefix[s.prompt_len:]
        cont = demo_engine.generate(prefix, max_tokens=200 - len(generated), stop=stops).text
        assert BranchOracle(demo_engine, problem, 200).text_of(generated) + cont == full
        assert s.label in (-1, 0, 1) and (s.label == -1) == (s.keep_correct == s.reject_correct)


def test_branch_oracle_labels_a_decision_by_both_completed_branches(demo_engine, labelled):
    """The one labeller of both collection paths: a branch is the tokens generated before the
    decision, the block's accepted draft tokens, then the choice, continued by whatever the caller
    passes. Continued by the target, the reject branch is the recorded run's answer (which
    collect.py takes for it without generating it again) and the keep branch is the stored keep
    completion, so both outcomes, and the label, are the collected ones. A choice that ends the
    answer (end of generation, no tokens left) is never continued."""
    problems = {p.id: p for p in load_task("arith", "dev", 16) + load_task("pyfunc", "dev", 8)}
    eog = next(t for t in range(demo_engine.n_vocab) if demo_engine.is_eog(t))

    def never(tokens, left):
        raise AssertionError("a branch the choice ended was continued")

    labels = set()
    for s in labelled[:8]:
        problem = problems[s.problem_id]
        oracle = BranchOracle(demo_engine, problem, 200)
        state, i = s.state, s.position
        full = demo_engine.generate(problem.prompt, max_tokens=200, stop=oracle.stops)

        def target_continues(tokens, left):
            return demo_engine.generate(tokens, max_tokens=left, stop=oracle.stops).text

        reject = oracle.branch(state, i, keep=False)
        assert reject.answer == list(full.tokens[:len(reject.answer)]) and reject.answer[-1] == state.target[i]
        assert reject.text == full.text[:len(reject.text)] and reject.left == 200 - len(reject.answer)
        assert oracle.complete(state, i, False, target_continues) == full.text
        keep = oracle.complete(state, i, True, target_continues)
        assert keep == s.keep_completion
        assert (oracle.is_right(keep), oracle.is_right(full.text)) == (s.keep_correct, s.reject_correct)
        assert s.label == branch_label(s.keep_correct, s.reject_correct)
        labels.add(s.label)

        ending = DecisionState(state.context, state.draft, state.target[:i] + [eog] + state.target[i + 1:],
                               state.mismatch, state.features)
        assert oracle.branch(ending, i, keep=False).ended
        assert oracle.complete(ending, i, False, never) == oracle.text_of(reject.answer[:-1])
        no_room = BranchOracle(demo_engine, problem, len(reject.answer))
        assert no_room.complete(state, i, False, never) == reject.text
    assert branch_label(True, False) == 1 and branch_label(False, True) == 0
    assert branch_label(True, True) == branch_label(False, False) == -1
    assert len(labels) >= 2


def test_collector_shows_observers_every_decided_block(demo_engine):
    """Collector(observe=...) sees each block the recorded run decides on, while the draft's
    cache holds its context: a draft-reading arbiter scores it there as the generation would."""
    seen = []
    collector = Collector(demo_engine, GenerationParams(max_tokens=200, spec_type=TRAINING_SOURCES),
                          observe=lambda block: seen.append((block["context"].tolist(), block["draft"].tolist(),
                                                             demo_engine.arbiter("demo-lora").score(block))))
    states = []
    for problem in load_task("arith", "dev", 6):
        states += collector.problem(problem, "dev")[1]
    assert states and len(seen) >= len(states)
    scored = {(tuple(c), tuple(d)): p for c, d, p in seen}
    for s in states:
        p = scored[(tuple(s.state.context), tuple(s.state.draft))]
        assert 0.0 < p[s.position] < 1.0  # a mismatch the arbiter scored


@pytest.mark.parametrize("lora_context", ["draft", "adapter"])
@pytest.mark.slow
def test_lora_hidden_states_match_torch(f32_draft, states, tmp_path, lora_context):
    """The engine's region pass (prefix causal, region one non-causal batch) is the torch model's
    hybrid mask: same hidden states for every d_i and t_i of real blocks, with the adapter on the
    region only (the prefix's keys and values copied from the draft's cache) or on the prefix too."""
    model = random_lora_arbiter(f32_draft, lora_context=lora_context)
    folder = export(model, tmp_path / "lora", f32_draft)
    with Engine(demo_model("target"), f32_draft, n_ctx=1024, n_threads=1) as engine:
        arbiter = engine.arbiter(str(folder))
        d = model.n_embd
        worst = 0.0
        for s in states[:10]:
            k = len(s.draft)
            native = arbiter.head_inputs(block_of(engine, s, logits=False))
            with torch.no_grad():
                h = model.hidden(make_batch([s], [list(range(k))]))[0].numpy()
            n = len(s.context)
            worst = max(worst, np.abs(native[:, :d] - h[n:n + 2 * k:2]).max(),
                        np.abs(native[:, d:2 * d] - h[n + 1:n + 2 * k:2]).max())
        # "draft" reads the draft's cache, F16 as the engine's contexts keep it: 3.4-7.9e-3 on the
        # states of different collections, and 1.8e-5 with both caches in F32 (measured); the
        # arbiter's own context is F32.
        assert worst <= (1e-2 if lora_context == "draft" else 1e-3), worst
        # The region attends both ways: changing the last target token moves the first draft token's state.
        s = states[0]
        b = block_of(engine, s, logits=False)
        before = arbiter.head_inputs(b)[0, :d].copy()
        b["target"] = b["target"].copy()
        b["target"][len(s.draft) - 1] = (b["target"][len(s.draft) - 1] + 7) % 500
        assert np.abs(arbiter.head_inputs(b)[0, :d] - before).max() > 1e-3
        # ... and the region leaves no trace: the original block scores as before.
        assert np.allclose(arbiter.head_inputs(block_of(engine, s, logits=False))[0, :d], before, atol=1e-6)


@pytest.mark.parametrize("lora_context", ["draft", "adapter"])
@pytest.mark.slow
def test_folded_adapter_reads_what_the_adapter_does(f32_draft, states, tmp_path, lora_context):
    """By default a LoRA arbiter runs a private copy of its (small) draft with the adapter folded
    into the weights, W + s BA in F32, instead of applying the adapter at every decode. With an
    F32 draft the two are the same function: hidden states within float rounding (two separate
    contexts, so not bit for bit)."""
    folder = export(random_lora_arbiter(f32_draft, seed=4, lora_context=lora_context), tmp_path / "lora", f32_draft)
    with Engine(demo_model("target"), f32_draft, n_ctx=1024, n_threads=1) as engine:
        folded = engine.arbiter(str(folder))
        at_decode = _cospec.Arbiter.load(engine._native, str(folder), fold_adapter=False)
        assert folded.meta("adapter_use") == "folded" and at_decode.meta("adapter_use") == "decode"
        worst = 0.0
        for s in states[:10]:
            b = block_of(engine, s)
            worst = max(worst, np.abs(folded.head_inputs(b) - at_decode.head_inputs(b)).max())
        # The arbiter's own F32 cache ("adapter"): 4.8e-6 here (measured). Region keys and values in
        # F16 beside the draft's cache ("draft"): one F16 rounding apart, 5.9e-4 on states up to 17.
        assert 0.0 < worst <= (2e-3 if lora_context == "draft" else 1e-4), worst
        at_decode.close()


def test_no_fold_where_llama_cpp_scales_the_weight_first(f32_draft, states, tmp_path):
    """A per-tensor weight scale (`blk.N.attn_q.scale`, loaded by llama.cpp for every architecture)
    multiplies W x before llama.cpp adds the adapter's term; a fold would scale B A too. Such a
    draft runs the adapter at decode, with the same result as asking for that."""
    reader = open_gguf(f32_draft)
    scaled = rewrite_gguf(reader, tmp_path / "draft-scaled.gguf",
                          add_tensors=[("blk.0.attn_q.scale", np.array([1.5], np.float32), None)])
    folder = export(random_lora_arbiter(f32_draft, seed=4), tmp_path / "lora", scaled)
    with Engine(demo_model("target"), str(scaled), n_ctx=1024, n_threads=1) as engine:
        default = engine.arbiter(str(folder))
        at_decode = _cospec.Arbiter.load(engine._native, str(folder), fold_adapter=False)
        assert default.meta("adapter_use") == "decode"
        for s in states[:3]:
            b = block_of(engine, s)
            np.testing.assert_array_equal(default.head_inputs(b), at_decode.head_inputs(b))
        at_decode.close()
        assert engine.generate(load_task("arith", "test", 1)[0].prompt, arbiter=str(folder), max_tokens=20).tokens


@pytest.mark.parametrize("change", ["a weight", "a metadata value"])
def test_no_fold_of_a_draft_file_changed_since_the_engine_read_it(f32_draft, states, tmp_path, change):
    """The fold reads the draft file again. Replaced since the engine loaded it (same shapes, one
    weight or one hyperparameter changed), it is not the model the engine runs: its tensors'
    fingerprint or its metadata's hash differs, so the adapter applies at decode to the draft the
    engine holds, as if nothing had been replaced."""
    draft = tmp_path / "draft.gguf"
    shutil.copyfile(f32_draft, draft)
    folder = export(random_lora_arbiter(f32_draft, seed=4), tmp_path / "lora", f32_draft)
    with Engine(demo_model("target"), str(draft), n_ctx=1024, n_threads=1) as engine:
        before = engine.arbiter(str(folder))
        assert before.meta("adapter_use") == "folded"
        changed = tmp_path / "changed.gguf"
        reader = open_gguf(draft)
        if change == "a weight":
            norm = next(t for t in reader.tensors if t.name == "output_norm.weight")
            data = bytearray(draft.read_bytes())
            np.frombuffer(data, np.float32, count=1, offset=int(norm.data_offset))[0] += 0.5
            changed.write_bytes(bytes(data))
        else:  # the tensors byte for byte, the norm's epsilon 100 times larger
            eps_key = "llama.attention.layer_norm_rms_epsilon"
            assert eps_key in reader.fields
            rewrite_gguf(reader, changed, kv_edit=lambda key, value: value * 100 if key == eps_key else value)
        del reader
        changed.replace(draft)
        after = _cospec.Arbiter.load(engine._native, str(folder))  # engine.arbiter would reuse `before`
        assert after.meta("adapter_use") == "decode"
        for s in states[:3]:
            b = block_of(engine, s)
            assert np.abs(before.head_inputs(b) - after.head_inputs(b)).max() <= 2e-3
        after.close()


def test_shipped_lora_arbiter_folded_decides_as_at_decode(demo_engine, states):
    """The bundled LoRA arbiter on its Q8_0 draft: the folded copy computes in F32 where llama.cpp
    applies the adapter beside Q8_0 products, so P(keep) moves a little, decisions hardly."""
    folded = demo_engine.arbiter("demo-lora")
    at_decode = _cospec.Arbiter.load(demo_engine._native, str(NAMED_ARBITERS["demo-lora"].path), fold_adapter=False)
    assert folded.meta("adapter_use") == "folded"
    same = total = 0
    worst = 0.0
    for s in states:
        b = block_of(demo_engine, s)
        p_folded, p_decode = folded.score(b), at_decode.score(b)
        for i in np.flatnonzero(b["mismatch"]):
            same += (p_folded[i] >= folded.threshold) == (p_decode[i] >= folded.threshold)
            total += 1
            worst = max(worst, abs(float(p_folded[i]) - float(p_decode[i])))
    at_decode.close()
    assert total >= 8 and same >= 0.99 * total and worst <= 0.05, (same, total, worst)


def test_onnx_head_matches_torch_and_native(tmp_path, demo_engine, states):
    torch.manual_seed(1)
    model = FeaturesArbiter()
    for p in model.head.parameters():
        torch.nn.init.normal_(p, std=0.3)
    folder = export(model, tmp_path / "features", demo_model("draft"))
    rows = np.random.default_rng(0).normal(0, 3, (64, _cospec.N_FEATURES)).astype(np.float32)
    with torch.no_grad():
        expected = torch.sigmoid(model.head(torch.from_numpy(rows))).numpy()
    assert np.abs(onnx_head(folder)(rows) - expected).max() <= 1e-5
    native = demo_engine.arbiter(str(folder))
    via_onnx = demo_engine.arbiter(str(folder), head="onnx")
    for s in states[:8]:
        b = block_of(demo_engine, s)
        p_native, p_onnx = native.score(b), via_onnx.score(b)
        assert np.abs(p_native - p_onnx).max() <= 1e-5
        feats = native.head_inputs(b)
        assert np.allclose(feats, _cospec.block_features(b))  # the features arbiter reads exactly the features
        with torch.no_grad():
            p_torch = torch.sigmoid(model.head(torch.from_numpy(feats))).numpy()
        mismatch = b["mismatch"].astype(bool)
        assert np.abs(p_native[mismatch] - p_torch[mismatch]).max() <= 1e-5
        assert (p_native[~mismatch] == 0).all()
    prompt = load_task("arith", "test", 1)[0].prompt
    a = demo_engine.generate(prompt, arbiter=str(folder), max_tokens=120)
    b = demo_engine.generate(prompt, arbiter=str(folder), arbiter_head="onnx", max_tokens=120)
    assert a.tokens == b.tokens and [d.keep for d in a.decisions] == [d.keep for d in b.decisions]
    assert np.allclose([d.p_keep for d in a.decisions], [d.p_keep for d in b.decisions], atol=1e-5)


@pytest.mark.slow
def test_lora_head_can_start_as_the_features_arbiter(demo_engine, states, tmp_path):
    """warmup --lora-from-features: a LoRA arbiter whose head starts from a features arbiter's
    (its own input standardisation kept) scores every mismatch as that arbiter does, natively."""
    from cospec_local.train.warmup import start_from_features

    torch.manual_seed(2)
    features = FeaturesArbiter()
    for p in features.head.parameters():
        torch.nn.init.normal_(p, std=0.3)
    features.head.in_mean.normal_(0, 1)
    features.head.in_scale.uniform_(0.5, 2)
    lora = LoraArbiter(load_draft_backbone(demo_model("draft"))).eval()  # PEFT's B = 0: the draft's own states
    lora.head.in_mean.normal_(0, 1)  # another standardisation than the features arbiter's
    lora.head.in_scale.uniform_(0.5, 2)
    start_from_features(lora.head, features.head)
    a = demo_engine.arbiter(str(export(features, tmp_path / "features", demo_model("draft"))))
    b = demo_engine.arbiter(str(export(lora, tmp_path / "lora", demo_model("draft"))))
    compared = 0
    for s in states[:8]:
        block = block_of(demo_engine, s)
        mismatch = block["mismatch"].astype(bool)
        p_features, p_lora = a.score(block)[mismatch], b.score(block)[mismatch]
        assert np.abs(p_features - p_lora).max() <= 1e-5, (p_features, p_lora)
        compared += int(mismatch.sum())
    assert compared >= 8


@pytest.mark.parametrize("name", ["demo-features", "demo-lora"])
def test_shipped_arbiter_matches_its_torch_model(demo_engine, states, name):
    """The bundled arbiter (Q8_0 draft) decides like its torch model on recorded states."""
    folder = NAMED_ARBITERS[name].path
    model = load_arbiter(folder, demo_model("draft"))
    arbiter = demo_engine.arbiter(name)
    same = total = 0
    for s in states:
        b = block_of(demo_engine, s)
        native_p = arbiter.score(b)
        inputs = arbiter.head_inputs(b)
        k = len(s.draft)
        with torch.no_grad():
            if model.kind == "lora":
                batch = make_batch([s], [list(range(k))])
                batch.features = torch.from_numpy(inputs[:, -model.n_features:])
                torch_p = torch.sigmoid(model(batch)).numpy()
            else:
                torch_p = torch.sigmoid(model.head(torch.from_numpy(inputs))).numpy()
        for i in np.flatnonzero(b["mismatch"]):
            same += (native_p[i] >= arbiter.threshold) == (torch_p[i] >= arbiter.threshold)
            total += 1
    assert total >= 8 and same >= 0.99 * total, (same, total)


@pytest.mark.parametrize("name", ["demo-features", "demo-lora"])
def test_shipped_arbiter_runs_and_records_decisions(demo_engine, name):
    prompts = [p.prompt for p in load_task("arith", "test", 6)]
    n_decisions = 0
    for prompt in prompts:
        r = demo_engine.generate(prompt, arbiter=name, max_tokens=160, stop="\n\n")
        assert r.label == f"speculative/{name}"
        assert [d.token_index for d in r.decisions if d.keep] == [i for i, p in enumerate(r.provenance) if p == "kept"]
        assert all(0.0 <= d.p_keep <= 1.0 for d in r.decisions)
        again = demo_engine.generate(prompt, arbiter=name, max_tokens=160, stop="\n\n")
        assert again.tokens == r.tokens and again.decisions == r.decisions
        n_decisions += len(r.decisions)
    assert n_decisions > 0


@pytest.mark.slow
def test_draft_context_arbiter_reads_the_drafts_cache(demo_engine, tmp_path):
    """A lora_context "draft" arbiter takes the block's context from the draft's cache. In a
    generation the draft holds it already; a block scored afterwards, with the draft's cache moved
    to other text, is read by the draft first. P(keep) is the same either way (and from a user
    arbiter's callback inside the generation, as the training side records blocks), and a later
    generation is unchanged (the draft's record of its cache stayed true)."""
    from cospec_local import arbiter_from_function

    folder = export(random_lora_arbiter(demo_model("draft"), seed=3), tmp_path / "lora", demo_model("draft"))
    lora = demo_engine.arbiter(str(folder))
    assert lora.meta("lora_context") == "draft"
    problems = load_task("arith", "dev", 8)
    runs = [demo_engine.generate(p.prompt, arbiter=lora, max_tokens=160, stop=FAMILY_STOPS["arith"])
            for p in problems]
    assert sum(len(r.decisions) for r in runs) >= 4

    # The same generations again, by a function arbiter that replays their verdicts and keeps the blocks.
    blocks, nested = [], []
    for problem, run in zip(problems, runs):
        by_block = {}
        for d in run.decisions:
            by_block.setdefault(d.block, {})[d.position] = d.p_keep

        def replay(block, by_block=by_block):
            # (copied: the engine reuses its arrays; the numbers say where the reply stands)
            blocks.append({k: np.array(v, copy=True) if isinstance(v, np.ndarray) else v
                           for k, v in block.items() if v is not None})
            nested.append(lora.score(blocks[-1]))
            p = np.zeros(block["n_draft"], dtype=np.float32)
            for pos, p_keep in by_block.get(int(block["index"]), {}).items():
                p[pos] = p_keep
            return p

        again = demo_engine.generate(problem.prompt, arbiter=arbiter_from_function(replay, "replay"),
                                     max_tokens=160, stop=FAMILY_STOPS["arith"])
        assert again.tokens == run.tokens

    # Move the draft's cache to other text, then score every recorded block on its own.
    demo_engine.score(demo_engine.tokenize(load_task("pyfunc", "dev", 1)[0].prompt), "draft")
    standalone = [lora.score(b) for b in blocks]  # one block per arbiter call, in order
    in_generation = [[(d.position, d.p_keep) for d in r.decisions if d.block == index]
                     for r in runs for index in sorted({d.block for d in r.decisions})]
    assert len(in_generation) == len(standalone) == len(nested)
    assert all(nested[j][pos] == p for j, ds in enumerate(in_generation) for pos, p in ds)  # the same path
    worst = max(abs(standalone[j][pos] - p) for j, ds in enumerate(in_generation) for pos, p in ds)
    assert worst <= 1e-4, worst
    after = [demo_engine.generate(p.prompt, arbiter=lora, max_tokens=160, stop=FAMILY_STOPS["arith"]) for p in problems]
    assert [r.tokens for r in after] == [r.tokens for r in runs]
    assert np.allclose([d.p_keep for r in after for d in r.decisions], [d.p_keep for r in runs for d in r.decisions],
                       atol=1e-4)


def test_arbiter_is_asked_only_where_the_walk_reaches_a_mismatch(demo_engine):
    """A block whose output ends before its first mismatch (end of generation, a stop string)
    needs no verdict: the arbiter is not called for it, and every call is a block that decided.
    On these problems the answer often ends inside a block whose draft runs on and disagrees."""
    from cospec_local import arbiter_from_function

    called = []

    def reject_all(block):
        called.append(int(block["index"]))
        return np.zeros(block["n_draft"], dtype=np.float32)

    rejecter = arbiter_from_function(reject_all, "reject-all")
    n_calls = 0
    for problem in load_task("arith", "dev", 6) + load_task("pyfunc", "dev", 6):
        called.clear()
        stops = FAMILY_STOPS[problem.family]
        r = demo_engine.generate(problem.prompt, arbiter=rejecter, max_tokens=200, stop=stops)
        assert called == sorted({d.block for d in r.decisions}), problem.id
        assert r.stats.arbiter_calls == len(called)
        # the same tokens as the target arbiter, which never asks (greedy: rejecting is lossless)
        assert r.tokens == demo_engine.generate(problem.prompt, max_tokens=200, stop=stops).tokens
        n_calls += len(called)
    assert n_calls > 0


def test_sampled_decisions_follow_the_seed(demo_engine, tmp_path):
    """With sample_arbiter each decision is Bernoulli(P(keep)) from the generation's seed."""
    seen = []

    def half(block):
        return np.where(block["mismatch"], 0.5, 0.0)

    from cospec_local import arbiter_from_function

    coin = arbiter_from_function(half, "coin")
    # a problem where the walk meets at least two mismatches
    prompt = next(p.prompt for p in load_task("arith", "test", 40)
                  if len(demo_engine.generate(p.prompt, arbiter=coin, max_tokens=120, adaptive_draft=False,
                                              sample_arbiter=True, seed=0).decisions) >= 2)
    runs = {seed: demo_engine.generate(prompt, arbiter=coin, sample_arbiter=True, seed=seed, max_tokens=120,
                                       adaptive_draft=False) for seed in range(8)}
    again = demo_engine.generate(prompt, arbiter=coin, sample_arbiter=True, seed=3, max_tokens=120,
                                 adaptive_draft=False)
    assert again.tokens == runs[3].tokens and again.decisions == runs[3].decisions
    keeps = [d.keep for r in runs.values() for d in r.decisions]
    seen.extend(keeps)
    assert 0 < sum(seen) < len(seen), "P = 0.5 must sometimes keep and sometimes not"
    assert len({tuple(r.tokens) for r in runs.values()}) > 1
    # thresholded (the default), P = 0.5 keeps every mismatch: the coin's threshold is 0.5
    kept = demo_engine.generate(prompt, arbiter=coin, max_tokens=120, adaptive_draft=False)
    assert kept.decisions and all(d.keep for d in kept.decisions)


@pytest.mark.slow
def test_bad_arbiter_files_are_clear_errors(demo_engine, f32_draft, tmp_path):
    good = export(random_lora_arbiter(demo_model("draft")), tmp_path / "good", demo_model("draft"))
    assert demo_engine.arbiter(str(good)).name == "test-lora"

    # made for another draft: the fingerprint differs
    with Engine(demo_model("target"), f32_draft, n_ctx=512, n_threads=1) as other:
        with pytest.raises(ArbiterDraftError, match="made for another draft") as error:
            other.arbiter(str(good))
        assert error.value.status_name == "arbiter_draft"  # the native status name, not a text match
        with pytest.raises(ArbiterError, match=r"made for another draft(.|\n)*\nfix: --arbiter auto, target, fly, aasd "
                                               r"\(those fit this draft\), or train one for this pair"):
            other.arbiter("demo-lora")
        assert other.generate("Hi", max_tokens=3, ignore_eos=True).tokens

    def variant(name, change):
        folder = shutil.copytree(good, tmp_path / name)
        change(folder)
        return str(folder)

    truncated = variant("truncated", lambda f: (f / "arbiter.gguf").write_bytes((f / "arbiter.gguf").read_bytes()[:900]))
    garbage = variant("garbage", lambda f: (f / "arbiter.gguf").write_bytes(b"GGUF" + b"\xff" * 400))
    no_adapter = variant("no-adapter", lambda f: (f / "adapter.gguf").unlink())
    cut_adapter = variant("cut-adapter", lambda f: (f / "adapter.gguf").write_bytes(
        (f / "adapter.gguf").read_bytes()[:-1000]))
    for path, pattern in [(truncated, "truncated|corrupt"), (garbage, "corrupt|truncated"),
                          (no_adapter, "file not found"), (cut_adapter, "truncated|corrupt"),
                          (str(tmp_path / "missing"), r"no arbiter .*missing.*a name that fits this draft \(auto, target, fly, "
                                                      r"aasd, demo-lora, demo-features;"),
                          (str(tmp_path), "holds arbiters in .*no-adapter/.*: pass one of those folders"),
                          (demo_model("draft"), "not an arbiter")]:
        with pytest.raises(ArbiterError, match=pattern):
            demo_engine.arbiter(path)

    # adapter metadata of the wrong type: llama.cpp's typed getters would abort the process
    for key, value, vtype in [("adapter.lora.alpha", "16", GGUFValueType.STRING),
                              ("general.type", 1, GGUFValueType.UINT32),
                              ("adapter.type", 1.0, GGUFValueType.FLOAT32)]:
        folder = variant(f"adapter-{key}", lambda f: None)
        with_kv(good / "adapter.gguf", Path(folder) / "adapter.gguf", key, value, vtype)
        with pytest.raises(ArbiterError, match=f"{key} must be a"):
            demo_engine.arbiter(folder)

    # n_features beyond what this engine gives (an arbiter from a newer engine), or not a whole number
    for value, vtype in [(_cospec.N_FEATURES + 1, GGUFValueType.UINT32), (0, GGUFValueType.UINT32),
                         ("many", GGUFValueType.STRING)]:
        folder = variant(f"n-features-{value}", lambda f: None)
        with_kv(good / "arbiter.gguf", Path(folder) / "arbiter.gguf", "cospec.arbiter.n_features", value, vtype)
        with pytest.raises(ArbiterError, match=r"n_features must be a whole number in \[1, "):
            demo_engine.arbiter(folder)

    # a LoRA whose shapes do not fit the draft: llama.cpp refuses it, the engine says so
    wrong = random_lora_arbiter(demo_model("draft"))
    weights = {name: (np.zeros((8, a.shape[1] * 2), np.float32), b) for name, (a, b) in wrong.lora_weights().items()}
    folder = write_arbiter(tmp_path / "wrong-shape", kind="lora", head=wrong.head, draft_gguf=demo_model("draft"),
                           threshold=0.5, name="wrong", lora=weights, lora_alpha=16.0, n_embd=wrong.n_embd)
    with pytest.raises(AdapterError, match="does not fit the draft"):
        demo_engine.arbiter(str(folder))
    with pytest.raises(InvalidArgumentError):
        demo_engine.generate("Hi", arbiter=str(good), arbiter_threshold=2.0)
    with Engine(demo_model("target"), n_ctx=256) as target_only:
        with pytest.raises(NoDraftError):
            target_only.arbiter(str(good))
    assert demo_engine.generate(load_task("arith", "test", 1)[0].prompt, arbiter=str(good), max_tokens=40).tokens


def test_an_arbiter_drafts_under_the_verify_cost_it_was_trained_under(tmp_path):
    """arbiter.gguf's verify_cost sets the timing-free length model of calls that leave it at its
    default: the blocks are those of an explicit setting of the same value, not of the default's.
    A value out of range is refused when the arbiter loads. (Without a calibration, so that the
    arbiter without a recorded cost drafts under the pair's parameter ratio, as the other does.)"""
    from cospec_local.train.warmup import collected_verify_cost

    with Engine.open_default(n_ctx=1024, n_threads=1, calibration=None) as demo_engine:
        _check_trained_verify_cost(demo_engine, tmp_path, collected_verify_cost)


def _check_trained_verify_cost(demo_engine, tmp_path, collected_verify_cost):
    torch.manual_seed(2)
    model = FeaturesArbiter()
    for p in model.head.parameters():
        torch.nn.init.normal_(p, std=0.3)

    def folder(name, verify_cost):
        return str(write_arbiter(tmp_path / name, kind="features", head=model.head, draft_gguf=demo_model("draft"),
                                 threshold=0.5, name=name, verify_cost=verify_cost, onnx=False))

    # 0.6: blocks of about 3 tokens; the default (0.25) drafts the full 8 on these answers
    carried, plain = folder("carried", 0.6), folder("plain", None)
    assert demo_engine.arbiter(carried).meta("verify_cost") is not None
    differs = 0
    for problem in load_task("pyfunc", "test", 4):
        # (the draft model's blocks alone: the n-gram drafter's lengths are not the arbiter's)
        run = lambda arbiter, **kw: demo_engine.generate(problem.prompt, arbiter=arbiter, max_tokens=160,  # noqa: E731
                                                         spec_type="draft", **kw)
        a, b = run(carried), run(plain, verify_cost=0.6)
        assert a.tokens == b.tokens and a.stats.blocks == b.stats.blocks
        assert [(d.block, d.position) for d in a.decisions] == [(d.block, d.position) for d in b.decisions]
        differs += run(plain).stats.blocks != a.stats.blocks  # the default's blocks: 0.25
    assert differs > 0
    # an explicit setting still wins over the arbiter's
    prompt = load_task("pyfunc", "test", 1)[0].prompt
    assert (demo_engine.generate(prompt, arbiter=carried, max_tokens=160, verify_cost=0.25, spec_type="draft").stats.blocks ==
            demo_engine.generate(prompt, arbiter=plain, max_tokens=160, spec_type="draft").stats.blocks)
    with pytest.raises(ArbiterError, match="verify_cost"):
        demo_engine.arbiter(folder("bad", 1000.0))
    # what the warm-up writes: the collection's verify cost, the default for folders that predate it
    assert collected_verify_cost({"verify_cost": 0.1, "params": {"verify_cost": -1.0}}) == 0.1
    assert collected_verify_cost({"params": {"verify_cost": 0.3}}) == pytest.approx(0.3)
    assert collected_verify_cost({"params": {}}) == pytest.approx(_cospec.DEFAULT_VERIFY_COST)


def test_a_call_at_the_default_block_length_drafts_the_arbiters_own(demo_engine, tmp_path):
    """arbiter.gguf's draft_max is the longest block of calls that leave --draft-max at its default;
    an explicit one wins, with the warning that the arbiter never saw such blocks."""
    torch.manual_seed(3)
    model = FeaturesArbiter()
    folder = str(write_arbiter(tmp_path / "short", kind="features", head=model.head, draft_gguf=demo_model("draft"),
                               threshold=0.5, name="short", trained_under={"draft_max": 3}, onnx=False))
    prompt = load_task("pyfunc", "test", 1)[0].prompt
    own = demo_engine.generate(prompt, arbiter=folder, max_tokens=96, spec_type="draft", adaptive_draft=False)
    assert own.stats.blocks > 0 and own.stats.draft_n <= 3 * own.stats.blocks
    with pytest.warns(ArbiterSettingsWarning, match="blocks of up to 3"):
        longer = demo_engine.generate(prompt, arbiter=folder, max_tokens=96, spec_type="draft", adaptive_draft=False,
                                      draft_max=6)
    assert longer.stats.draft_n > 3 * longer.stats.blocks


def test_arbiter_is_closed_with_its_engine(f32_draft, tmp_path):
    folder = export(random_lora_arbiter(f32_draft), tmp_path / "lora", f32_draft)
    engine = Engine(demo_model("target"), f32_draft, n_ctx=512, n_threads=1)
    arbiter = engine.arbiter(str(folder))
    engine.close()
    assert arbiter.closed
    with pytest.raises(_cospec.CospecError, match="closed"):
        arbiter.score({"draft": [1], "target": [1, 2], "target_logits": np.zeros((2, 512), np.float32)})


@pytest.mark.parametrize("name", sorted(NAMED_ARBITERS))
@pytest.mark.slow
def test_shipped_arbiter_reproduces_its_reference_generations(demo_engine, f32_draft, name):
    """Each bundled arbiter ships with the generations it made on the first test problems of each
    family (cospec_local/train/ship_arbiter.py): the same text, tokens, provenance and decisions here, and
    the bundle refuses a draft it was not trained for. Where CPU kernels of another family round a
    near-tie otherwise, the bundle keeps that family's references too (reference.avx2.jsonl); they
    run llama.cpp's plain kernels (REFERENCE_REPACK), as they were recorded."""
    from cospec_local.arbiter.file_format import REFERENCE_REPACK, reference_file
    from cospec_local.train.ship_arbiter import reference_runs

    named = NAMED_ARBITERS[name]
    folder = named.path
    recorded = [json.loads(line) for line in reference_file(folder, _cospec.system_info()).read_text().splitlines()]
    n = len(recorded) // len(named.reference_tasks)
    assert n >= 5 and any("kept" in r["provenance"] for r in recorded)
    if named.target == "demo-target":
        assert reference_runs(demo_engine, str(folder), named.reference_tasks, n) == recorded
    else:
        template = named.chat_template.read_text(encoding="utf-8") if named.chat_template else None
        with Engine(named.target, named.draft, n_ctx=1024, n_threads=2, chat_template=template,
                    repack=REFERENCE_REPACK) as engine:
            assert reference_runs(engine, str(folder), named.reference_tasks, n, named.reference_max_tokens,
                                  chat=named.reference_chat) == recorded
    with Engine(demo_model("target"), f32_draft, n_ctx=512, n_threads=1) as other:
        with pytest.raises(ArbiterError, match="made for another draft"):
            other.generate("1 + 1 =", arbiter=str(folder), max_tokens=4)


def test_making_a_lora_arbiter_warns_of_nothing(f32_draft):
    """peft asks the model a property transformers deprecates: no FutureWarning reaches a training
    run's output."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        random_lora_arbiter(f32_draft)
    assert not [w for w in caught if issubclass(w.category, FutureWarning)], [str(w.message) for w in caught]


def test_an_arbiter_of_another_format_version_or_without_its_lora_context_is_refused(demo_engine, tmp_path):
    """The engine and the package read one format version (the C header's); a LoRA arbiter's file
    must say where its adapter applies. Either fault is a clear error, never a guess."""
    import shutil

    import gguf

    from cospec_local.arbiter.file_format import ARBITER_FILE, FORMAT_VERSION, KEY, read_meta
    from cospec_local.formats.gguf_edit import rewrite_gguf

    assert FORMAT_VERSION == _cospec.ARBITER_FORMAT_VERSION == 2
    for name in NAMED_ARBITERS:  # the shipped files are of this version
        assert int(read_meta(NAMED_ARBITERS[name].path)["version"]) == FORMAT_VERSION, name

    def copy_with(name: str, edit) -> Path:
        folder = tmp_path / name
        shutil.copytree(NAMED_ARBITERS["demo-lora"].path, folder)
        (folder / ARBITER_FILE).unlink()
        reader = gguf.GGUFReader(NAMED_ARBITERS["demo-lora"].path / ARBITER_FILE, "r")
        rewrite_gguf(reader, folder / ARBITER_FILE, kv_edit=edit)
        return folder

    older = copy_with("older", lambda key, value: 1 if key == KEY + "version" else value)
    with pytest.raises(ArbiterError, match="format version 1.*reads version 2; train the arbiter again"):
        demo_engine.arbiter(str(older))
    with pytest.raises(ValueError, match="format version 1, this package reads version 2"):
        read_meta(older)
    unsaid = copy_with("no-context", lambda key, value: None if key == KEY + "lora_context" else value)
    with pytest.raises(ArbiterError, match="lora_context"):
        demo_engine.arbiter(str(unsaid))


def _log_softmax(rows: np.ndarray) -> np.ndarray:
    m = rows.max(-1, keepdims=True)
    return rows - m - np.log(np.exp(rows - m).sum(-1, keepdims=True))


def test_features_of_ranks_the_reply_and_the_next_position(demo_engine):
    """The features appended after the first 16, from the blocks a generation hands an arbiter,
    against numpy: the tokens each model ranks above the other's token, where the block sits in the
    reply, the reply's agreement before it, and the target one position on. A head of the first 16
    (files from before these features) reads exactly those 16."""
    from cospec_local import arbiter_from_function

    seen = []

    def record(block):
        seen.append({k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in block.items()})
        return [0.0] * block["n_draft"]

    problem = load_task("arith", "dev", 1)[0]
    prompt = demo_engine.tokenize(problem.prompt)
    run = demo_engine.generate(problem.prompt, arbiter=arbiter_from_function(record, "records"),
                               max_tokens=160, stop=FAMILY_STOPS["arith"])
    assert len(seen) >= 2
    names = list(_cospec.FEATURE_NAMES)
    col = {name: names.index(name) for name in names[16:]}
    drafted_before = mismatched_before = 0
    for block in seen:
        k, tl, dl = block["n_draft"], block["target_logits"], block["draft_logits"]
        assert block["n_prompt"] == len(prompt) and block["n_context"] >= len(prompt)
        assert block["reply_drafted"] >= drafted_before and block["reply_agreed"] <= block["reply_drafted"]
        assert block["reply_drafted"] - block["reply_agreed"] >= mismatched_before  # every earlier mismatch counted
        drafted_before += k
        mismatched_before += int(block["mismatch"].sum())
        f = _cospec.block_features(block)
        draft, target = block["draft"], block["target"]
        for i in range(k):
            assert f[i, col["target_rank_draft"]] == pytest.approx(np.log2(1 + (tl[i] > tl[i, draft[i]]).sum()))
            assert f[i, col["draft_rank_target"]] == pytest.approx(np.log2(1 + (dl[i] > dl[i, target[i]]).sum()))
            reply_before = block["n_context"] - block["n_prompt"] + i
            assert f[i, col["reply_position"]] == pytest.approx(np.log2(1 + reply_before))
            agreement = (block["reply_agreed"] + 1) / (block["reply_drafted"] + 2)
            assert f[i, col["reply_agreement"]] == pytest.approx(agreement)
            nxt = _log_softmax(tl[i + 1].astype(np.float64))
            assert f[i, col["target_entropy_next"]] == pytest.approx(-(np.exp(nxt) * nxt).sum(), abs=1e-3)
            follower = draft[i + 1] if i + 1 < k else target[k]
            assert f[i, col["target_logp_next"]] == pytest.approx(max(nxt[follower], -30.0), abs=1e-3)
    assert seen[-1]["reply_drafted"] > 0 and len(run.tokens) > seen[-1]["n_context"] - len(prompt)

    # A head over the first 16 features (as every arbiter file before them): its file says 16, and
    # the engine feeds it exactly those.
    torch.manual_seed(2)
    old = FeaturesArbiter(n_features=16)
    for p in old.head.parameters():
        torch.nn.init.normal_(p, std=0.3)
    with torch.no_grad():
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            arbiter = demo_engine.arbiter(str(export(old, Path(tmp) / "sixteen", demo_model("draft"))))
            assert arbiter.meta("n_features") == "16"
            for block in seen[:4]:
                inputs = arbiter.head_inputs(block)
                assert inputs.shape == (block["n_draft"], 16)
                np.testing.assert_array_equal(inputs, _cospec.block_features(block)[:, :16])
