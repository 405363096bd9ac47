"""The EAGLE-3 recipe end to end on the zoo's tiny llama: its stages (the target's replies, its
hidden states, training-time-test training, the vendored converter) make a head that llama.cpp
opens as an `eagle3` model, and the head the engine runs computes what the recipe trained: at
K = 1 a head block is accepted exactly where the trained head's first step, run in torch on the
target's own hidden states, predicts the target's token."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cospec_local import Engine
from cospec_local.formats import tiny_models

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from cospec_local.recipes import eagle3_head

    target = tiny_models.build(["llama"], tiny_models.cache_dir(REPO))["llama"]
    out = tmp_path_factory.mktemp("eagle3")
    eagle3_head.main(["--out", str(out), "-m", str(target), "--stages", "generate,features,train,gguf",
                      "--layers", "1,2,3", "--train-prompts", "48", "--max-new", "48", "--gen-batch", "48",
                      "--draft-vocab", "1024", "--ttt-steps", "2", "--epochs", "6", "--batch", "4", "--lr", "3e-3",
                      "--outtype", "f32", "--threads", "2", "--name", "tiny-eagle3"])
    return target, out, out / "tiny-eagle3-f32.gguf"


def torch_first_step(target: Path, out: Path, tokens: list[int]) -> np.ndarray:
    """The trained head's step-0 prediction at every chain p of `tokens` (the token at p + 2), in
    the target's vocabulary, from the target's hidden states as the recipe computes them."""
    import torch

    from cospec_local.formats.gguf_llama_reader import load_llama_gguf
    from cospec_local.recipes.eagle3_head import build_head

    saved = torch.load(out / "head_best.pt", weights_only=False)
    head = build_head(saved["config"], torch)
    head.load_state_dict(saved["head"])
    model = load_llama_gguf(target).eval()
    x = torch.tensor([tokens])
    with torch.no_grad():
        hs = model.model(input_ids=x, output_hidden_states=True).hidden_states
        f = torch.cat([hs[i] for i in saved["config"]["eagle_aux_hidden_state_layer_ids"]], -1)
        T = len(tokens) - 1
        g = head.fc(f[:, :T])
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))[None, None]
        o = head.step(model.model.embed_tokens(x[:, 1:]), g, 0, [], mask)
        pred = head.lm_head(head.norm(o)).argmax(-1)[0].numpy()
    return np.asarray(saved["vocab"])[pred]


def test_the_recipe_makes_a_head_the_engine_runs_as_trained(trained):
    target, out, head_gguf = trained
    log = json.loads((out / "eagle3_log.json").read_text())
    assert log["train"]["best_expected_length"] > 0 and log["gguf"]["bytes"] > 0
    with Engine(target, head_gguf, n_ctx=512, n_threads=1, calibration=None) as engine:
        assert engine.head == "eagle3"
        prompts = ["Write a short poem about rivers.", "Explain how a bicycle works."]
        checked = agreed = accepted = 0
        for p in prompts:
            prompt = engine.render_chat([{"role": "user", "content": p}])
            plain = engine.generate(prompt, max_tokens=40, mode="target-only")
            r = engine.generate(prompt, max_tokens=40, spec_type="draft-eagle3", draft_max=1, adaptive_draft=False)
            assert r.tokens == plain.tokens
            seq = prompt + r.tokens
            pred = torch_first_step(target, out, seq)
            # Walk the blocks as the engine did: at K = 1 each step drafts the token after its first
            # input seq[n] from chain n - 1; accepted, the bonus follows and the next step starts 2 on.
            n = len(prompt) - 1 + 1  # the first step's input is the first output token (after the prompt's prefill)
            i = 1
            while i < len(r.tokens) - 1 and n + 1 < len(seq):
                expect = pred[n - 1] == seq[n + 1]
                got = r.provenance[i] == "head"
                checked += 1
                agreed += expect == got
                accepted += got
                n, i = (n + 2, i + 2) if got else (n + 1, i + 1)
        assert checked > 20
        assert accepted > 0, "the trained head never matched the target: the check below would be vacuous"
        assert agreed / checked >= 0.95, f"{agreed} of {checked} blocks as the torch head predicts"
