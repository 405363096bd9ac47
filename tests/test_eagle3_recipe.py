"""EAGLE-3 heads made here. The recipe end to end on the zoo's tiny llama: its stages (the
target's replies, its hidden states, training-time-test training, the vendored converter) write
a GGUF that llama.cpp opens as an `eagle3` model and that holds exactly the weights trained. And
the shipped SmolLM2 head: the engine runs what the recipe trains, since at K = 1 a head block is
accepted exactly where the torch head's first step, on the target's own hidden states, predicts
the target's token."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from cospec_local import Engine
from cospec_local.formats import tiny_models
from cospec_local.recipes import eagle3_head

REPO = Path(__file__).resolve().parents[1]


def test_the_recipe_writes_the_head_it_trained_for_the_engine(tmp_path):
    import torch

    target = tiny_models.build(["llama"], tiny_models.cache_dir(REPO))["llama"]
    eagle3_head.main(["--out", str(tmp_path), "-m", str(target), "--stages", "generate,features,train,gguf",
                      "--layers", "1,2,3", "--train-prompts", "16", "--max-new", "24", "--gen-batch", "16",
                      "--draft-vocab", "512", "--ttt-steps", "2", "--epochs", "1", "--batch", "4",
                      "--outtype", "f32", "--threads", "1", "--name", "tiny-eagle3"])
    log = json.loads((tmp_path / "eagle3_log.json").read_text())
    assert log["train"]["steps"] > 0 and log["features"]["layers"] == [1, 2, 3]
    saved = torch.load(tmp_path / "head_best.pt", weights_only=False)
    head, config, vocab = eagle3_head.load_head_gguf(tmp_path / "tiny-eagle3-f32.gguf")
    # The converter's file, read back, is the trained head: weights (q/k back in rotate-half
    # order), draft vocabulary, target layers.
    assert np.array_equal(vocab, saved["vocab"])
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    for name, w in saved["head"].items():
        assert torch.allclose(head.state_dict()[name], w), name
    with Engine(target, tmp_path / "tiny-eagle3-f32.gguf", n_ctx=512, n_threads=1, calibration=None) as engine:
        assert engine.head == "eagle3"
        prompt = engine.render_chat([{"role": "user", "content": "Write a short poem about rivers."}])
        plain = engine.generate(prompt, max_tokens=24, mode="target-only")
        drafted = engine.generate(prompt, max_tokens=24, spec_type="draft-eagle3", draft_max=3, adaptive_draft=False)
        assert drafted.tokens == plain.tokens and drafted.stats.blocks_head > 0


def test_the_shipped_smollm2_head_drafts_in_the_engine_what_it_computes_in_torch():
    from cospec_local.models import resolve_model

    smollm2, head_path = resolve_model("smollm2-135m"), resolve_model("smollm2-135m-eagle3")
    head, config, vocab = eagle3_head.load_head_gguf(head_path)
    checked = agreed = accepted = 0
    with Engine(smollm2, head_path, n_ctx=1024, n_threads=2, calibration=None) as engine:
        for p in ("Tell me something surprising about tornadoes.", "Write a limerick about hot air balloons."):
            prompt = engine.render_chat([{"role": "user", "content": p}])
            plain = engine.generate(prompt, max_tokens=64, mode="target-only")
            r = engine.generate(prompt, max_tokens=64, spec_type="draft-eagle3", draft_max=1, adaptive_draft=False)
            assert r.tokens == plain.tokens
            seq = prompt + r.tokens
            pred = eagle3_head.first_step_predictions(smollm2, head, config, vocab, seq)
            # Walk the blocks as the engine did: a step whose first input is seq[n] drafts seq[n + 1]
            # from chain n - 1; accepted, the target's bonus token follows and the next step starts 2 on.
            n, i = len(prompt), 1
            while i < len(r.tokens) - 1:
                expect, got = pred[n - 1] == seq[n + 1], r.provenance[i] == "head"
                checked += 1
                agreed += expect == got
                accepted += got
                n, i = (n + 2, i + 2) if got else (n + 1, i + 1)
    assert checked > 60 and accepted > 10
    # Q8_0 weights and the Q4_1 target's arithmetic against float32 torch: a near-tie may go either way.
    assert agreed / checked >= 0.95, f"{agreed} of {checked} blocks as the torch head predicts"
