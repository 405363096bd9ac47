"""The bundled demo pair (cospec_local/data/demo): the files are what the recipe says they are,
llama.cpp runs them as torch does, and the pair has the properties the defaults rely on.

The accuracy bars themselves (>= 500 test problems per family) are measured by `cospec-local
eval` and recorded in cospec_local/data/demo/README.md; the checks here are the fast ones.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest

from cospec_local import Engine
from cospec_local.tasks import FAMILY_STOPS
from cospec_local.models import DEFAULT_DRAFT, DEFAULT_TARGET, DEMO_DIR, demo_checkpoint, demo_model
from cospec_local.tasks import load_task, score

torch = pytest.importorskip("torch")
from cospec_local.formats.llama_gguf_writer import convert  # noqa: E402  (needs the train extra, as torch does)
from cospec_local.formats.spm_tokenizer import load_tokenizer  # noqa: E402
from cospec_local.recipes.demo_pair import Arch, per_token_flops  # noqa: E402
from quantization import q8_0_roundtrip  # noqa: E402

torch.set_num_threads(1)


def test_the_default_engine_opens_the_shipped_pair_the_training_log_records():
    """With no model named, the engine opens the demo GGUFs that train_log.json records as each
    model's chosen conversion (the draft: its last specialisation stage), at the recorded sizes,
    with the bundled SentencePiece vocabulary. (The CLI's use of the default pair, its task
    prompts and chat banner, is checked by the `generate --chat`, `bench` and `chat` tests.)"""
    log = json.loads((DEMO_DIR / "train_log.json").read_text())
    recorded = {"target": log["gguf"]["target"], "draft": log["draft_specialised"]["stages"][-1]["gguf"]}
    sp = load_tokenizer(DEMO_DIR / "tokenizer.model")
    text = load_task("arith", "test", limit=1)[0].prompt + "\n"
    with Engine.open_default(n_ctx=256, n_threads=1) as engine:
        for role, path in (("target", engine.target_path), ("draft", engine.draft_path)):
            chosen = recorded[role][recorded[role]["chosen"]]
            assert os.path.dirname(path) == str(DEMO_DIR) and os.path.basename(path) == chosen["path"], role
            assert os.path.getsize(path) == chosen["bytes"], role
        assert engine.n_vocab == log["tokenizer"]["vocab_size"] == sp.vocab_size()
        assert engine.tokenize(text) == sp.encode(text, add_bos=True)


def _config(role: str) -> dict:
    return json.loads((demo_checkpoint(role) / "config.json").read_text())


def test_draft_costs_at_most_an_eighth_of_the_target():
    t, d = _config("target"), _config("draft")
    assert t["vocab_size"] == d["vocab_size"]
    ratio = per_token_flops(Arch.from_config(d), d["vocab_size"]) / per_token_flops(Arch.from_config(t), t["vocab_size"])
    assert ratio <= 1 / 8, ratio


@pytest.mark.parametrize("role", ["target", "draft"])
def test_committed_gguf_is_the_conversion_of_the_checkpoint(role, tmp_path):
    """Converting the committed safetensors again gives the committed GGUF's tensors bit for bit,
    with the committed tokenizer and the task chat template."""
    committed = demo_model(role)
    out_type = committed.stem.rsplit("-", 1)[1]
    again = convert(demo_checkpoint(role), DEMO_DIR / "tokenizer.model", tmp_path / committed.name, out_type)
    a, b = gguf.GGUFReader(committed), gguf.GGUFReader(again)
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
    for x, y in zip(a.tensors, b.tensors):
        assert x.tensor_type == y.tensor_type and np.array_equal(x.data, y.data), x.name
    tokens = a.get_field("tokenizer.ggml.tokens")
    assert [bytes(tokens.parts[i]) for i in tokens.data] == \
        [bytes(b.get_field("tokenizer.ggml.tokens").parts[i]) for i in b.get_field("tokenizer.ggml.tokens").data]
    template = a.get_field("tokenizer.chat_template")
    assert template is not None and "messages" in template.contents()


def _torch_model(role: str):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(demo_checkpoint(role), dtype=torch.float32).eval()


@pytest.mark.parametrize("role", ["target", "draft"])
def test_llama_cpp_logits_match_torch_on_task_prompts(role):
    """Logits of every position in llama.cpp (Engine.score) against the torch checkpoint after
    the same Q8_0 rounding of its matrices, on real test prompts and the model's own answers."""
    sp = load_tokenizer(DEMO_DIR / "tokenizer.model")
    prompts = [p.prompt + "\n" for p in load_task("arith", "test", limit=3) + load_task("pyfunc", "test", limit=3)]
    model = q8_0_roundtrip(_torch_model(role))
    worst, agree, total = 0.0, 0, 0
    with Engine(demo_model(role), n_ctx=512, n_threads=1) as engine:
        for text in prompts:
            tokens = engine.tokenize(text)
            assert tokens == sp.encode(text, add_bos=True)  # llama.cpp tokenizes as SentencePiece does
            seq = tokens + engine.generate(tokens, mode="target-only", max_tokens=48).tokens
            got = engine.score(seq)
            with torch.no_grad():
                ref = model(torch.tensor([seq])).logits[0].numpy()
            worst = max(worst, float(np.abs(got - ref).max() / np.abs(ref).max()))
            agree += int((got.argmax(-1) == ref.argmax(-1)).sum())
            total += len(seq)
    print(f"\n{role}: {total} positions, worst relative logit error {worst:.2e}, argmax agreement {agree}/{total}")
    assert worst < 0.05  # ggml also rounds activations to Q8_0 in these products (see test_converter_parity)
    assert agree >= 0.97 * total


@pytest.mark.slow
def test_pair_solves_tasks_and_sps_is_lossless():
    """On 24 arith and 8 pyfunc test problems: the target solves most, sps writes exactly the
    target's text, and the draft, weaker, still solves some (speeds are measured in bench/)."""
    problems = load_task("arith", "test", limit=24) + load_task("pyfunc", "test", limit=8)
    with Engine(DEFAULT_TARGET, DEFAULT_DRAFT, n_ctx=1024, n_threads=1) as engine:
        solved, draft_solved = 0, 0
        for p in problems:
            stop = FAMILY_STOPS[p.family]
            target = engine.generate(p.prompt, mode="target-only", max_tokens=200, stop=stop)
            sps = engine.generate(p.prompt, mode="speculative", max_tokens=200, stop=stop)
            draft = engine.generate(p.prompt, mode="draft-only", max_tokens=200, stop=stop)
            assert sps.text == target.text, p.id
            solved += score(p, target.text)
            draft_solved += score(p, draft.text)
    assert solved >= 0.6 * len(problems), solved
    assert 0.2 * len(problems) <= draft_solved, draft_solved


def test_chat_cli_answers_a_task_prompt_with_the_default_pair(tmp_path):
    """`generate --chat` with no model flags: the demo template sends the question and the
    newline, and the default pair answers in the trained format."""
    problem = load_task("arith", "test", limit=1)[0]
    out = subprocess.run([sys.executable, "-m", "cospec_local.cli", "generate", "--chat", "-p", problem.prompt,
                          "-n", "200", "-t", "1", "--json"], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, COSPEC_LOCAL_CACHE=str(tmp_path)))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert "####" in result["text"]
    assert result["stats"]["draft_n"] > 0
    from cospec_local.arbiter.catalog import NAMED_ARBITERS

    # no --arbiter: the bundled arbiter made for the demo draft decides (listed first for it)
    assert result["arbiter"] == next(a.name for a in NAMED_ARBITERS.values() if a.draft == "demo-draft")


def test_bench_uses_task_prompts_for_the_default_pair(tmp_path):
    out = subprocess.run([sys.executable, "-m", "cospec_local.cli", "bench", "--runs", "target-only,sps", "-n", "16",
                          "--n-prompts", "2", "--draft-max", "4", "-t", "1", "--json"], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, COSPEC_LOCAL_CACHE=str(tmp_path)))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["prompts"] == 2 and report["target"].endswith(".gguf")
    sps = next(r for r in report["results"] if r["run"] == "sps")
    assert sps["prompts_identical_to_target"] == 2
    assert sps["acceptance_rate"] > 0.3  # the demo draft agrees with its target on task text
