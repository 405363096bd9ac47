"""llama.cpp's head drafters in the loop: an EAGLE-3 head opened as the draft and the MTP layers a
Qwen3.5 target carries (tiny random ones from cospec_local/formats/tiny_models.py, converted by
llama.cpp's own converter). Their blocks are verified losslessly: greedy output is target-only's
whatever the head proposes, across block lengths, prompts that reuse the cache, and a hybrid
target's rollbacks."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cospec_local import Engine
from cospec_local.arbiter.callbacks import arbiter_from_function
from cospec_local.errors import InvalidArgumentError
from cospec_local.formats import tiny_models

REPO = Path(__file__).resolve().parents[1]
# test_model_zoo.py's prompt: batched verification meets no near tie on it with these models.
ZOO_PROMPT = ("Speculative decoding lets a small draft model propose a block of tokens that the large target "
              "model checks in one batched pass; where they disagree, the target's token is taken and the block "
              "ends. The text here only has to be long enough to pass a short sliding window.")
# The zoo's prompt, then one that extends it (the head's cache is reused), one that leaves it (both
# start over) and one after a call without the head (which the head did not hear).
PROMPTS = [ZOO_PROMPT, ZOO_PROMPT + " It", ZOO_PROMPT[:80], ZOO_PROMPT + " It then goes on."]
N_PREDICT = 40


@pytest.fixture(scope="module")
def models() -> dict[str, Path]:
    return tiny_models.build(["llama", "llama-eagle3", "qwen35", "qwen35-mtp", "qwen35-eagle3", "llama-dflash"],
                             tiny_models.cache_dir(REPO))


def check_lossless(engine: Engine, control: Engine, spec_type: str, restores: bool) -> None:
    """Greedy output with the head is target-only's for every prompt and block length. `control`
    (the same target with a draft model) shows first that batched verification meets no near tie
    on these prompts, so a difference is the head's doing."""
    for i, prompt in enumerate(PROMPTS):
        reference = control.generate(prompt, max_tokens=N_PREDICT, mode="target-only")
        assert len(set(reference.tokens)) > 5
        assert control.generate(prompt, max_tokens=N_PREDICT, spec_type="draft", draft_max=4,
                                adaptive_draft=False).tokens == reference.tokens, "a near tie: pick another prompt"
        if i == len(PROMPTS) - 1:
            engine.generate(prompt, max_tokens=8, mode="target-only")  # a call the head does not hear
        for k in (1, 4, 8):
            result = engine.generate(prompt, max_tokens=N_PREDICT, spec_type=spec_type, draft_max=k,
                                     adaptive_draft=False)
            assert result.tokens == reference.tokens, f"prompt {i}, K={k}"
            s = result.stats
            assert s.blocks_head > 0 and s.draft_n_head > 0 and s.blocks_head == s.blocks, f"prompt {i}, K={k}"
            assert s.draft_n_matched_head <= s.draft_n_head
            assert set(result.provenance) <= {"head", "fallback", "bonus", "target"}
            if restores:
                assert s.restored > 0, f"prompt {i}, K={k}"


def check_beside_a_keeping_arbiter(engine: Engine) -> None:
    """Beside an arbiter that keeps every mismatch it decides, a head is a lookup's peer: its
    matches stand, and at its mismatch the draft model drafts the position for the arbiter, so no
    target token ever replaces a draft token."""
    keep_all = arbiter_from_function(lambda block: np.ones(len(block["draft"])), name="keep-all")
    kept = engine.generate(ZOO_PROMPT, max_tokens=N_PREDICT, spec_type="head,draft", arbiter=keep_all, draft_max=4,
                           adaptive_draft=False)
    assert kept.stats.blocks_head > 0 and kept.stats.target_fallbacks == 0
    assert kept.decisions and all(d.keep for d in kept.decisions)
    assert kept.stats.arbiter_keeps == len(kept.decisions)


def check_beside_a_draft_model(engine: Engine, reference: list[int]) -> None:
    """A head beside a draft model (-mh): lossless with either drafting, and beside a keeping arbiter."""
    both = engine.generate(ZOO_PROMPT, max_tokens=N_PREDICT, spec_type="head,draft", draft_max=4, adaptive_draft=False)
    assert both.tokens == reference and both.stats.blocks_head > 0
    check_beside_a_keeping_arbiter(engine)


def test_an_eagle3_head_drafts_for_its_target_losslessly(models):
    with Engine(models["llama"], models["llama-eagle3"], n_ctx=512, n_threads=1, calibration=None) as engine, \
            Engine(models["llama"], models["qwen35"], n_ctx=512, n_threads=1, calibration=None) as control:
        assert engine.head == "eagle3" and not engine.has_draft and control.head is None
        check_lossless(engine, control, "draft-eagle3", restores=False)
        # Sampled, a call's block lengths come from fixed costs and its own counts: its seed gives its tokens.
        sampled = [engine.generate(ZOO_PROMPT, max_tokens=N_PREDICT, spec_type="draft-eagle3", temperature=0.8,
                                   draft_max=4, adaptive_draft=False, seed=7) for _ in range(2)]
        assert sampled[0].tokens == sampled[1].tokens and sampled[0].stats.blocks_head > 0
        # auto takes the head where the engine has one
        auto = engine.generate(ZOO_PROMPT, max_tokens=N_PREDICT, draft_max=4, adaptive_draft=False)
        assert auto.stats.blocks_head > 0
        with pytest.raises(InvalidArgumentError, match="mtp head drafter, but this engine has the eagle3 one"):
            engine.generate(ZOO_PROMPT, max_tokens=8, spec_type="draft-mtp")


def test_an_eagle3_head_drafts_for_a_hybrid_target_losslessly(models):
    """Qwen3.5's recurrent layers cannot be cut back: a refused block restores the target's saved
    state and decodes the kept tokens again, which the head has heard and must not hear twice."""
    with Engine(models["qwen35"], models["qwen35-eagle3"], n_ctx=512, n_threads=1, calibration=None) as engine, \
            Engine(models["qwen35"], models["llama"], n_ctx=512, n_threads=1, calibration=None) as control:
        assert engine.head == "eagle3" and not engine.has_draft
        check_lossless(engine, control, "draft-eagle3", restores=True)
    # A head file given to a target that carries MTP layers wins over them (they stay unloaded).
    with Engine(models["qwen35-mtp"], None, head=models["qwen35-eagle3"], n_ctx=512, n_threads=1,
                calibration=None) as engine:
        assert engine.head == "eagle3" and engine.head_file == str(models["qwen35-eagle3"])
        assert engine.generate(ZOO_PROMPT, max_tokens=16, spec_type="draft-eagle3", draft_max=4,
                               adaptive_draft=False).stats.blocks_head > 0


def test_a_dflash_drafter_drafts_its_block_for_its_target_losslessly(models):
    """llama.cpp's DFlash drafter (-md, its `dflash` model) drafts a block from mask tokens in one
    pass over a cache of the target's hidden states, which a cut back (a prompt that leaves the
    last one) trims; at most its trained block less the anchor a call, whatever K asks."""
    with Engine(models["llama"], models["llama-dflash"], n_ctx=512, n_threads=1, calibration=None) as engine, \
            Engine(models["llama"], models["qwen35"], n_ctx=512, n_threads=1, calibration=None) as control:
        assert engine.head == "dflash" and not engine.has_draft
        check_lossless(engine, control, "draft-dflash", restores=False)
        long = engine.generate(ZOO_PROMPT, max_tokens=N_PREDICT, spec_type="draft-dflash", draft_max=8,
                               adaptive_draft=False)
        assert long.stats.blocks_head > 0
        assert long.stats.draft_n_head <= (tiny_models.DFLASH_BLOCK - 1) * long.stats.blocks_head
        with pytest.raises(InvalidArgumentError, match="eagle3 head drafter, but this engine has the dflash one"):
            engine.generate(ZOO_PROMPT, max_tokens=8, spec_type="draft-eagle3")
        reference = control.generate(ZOO_PROMPT, max_tokens=N_PREDICT, mode="target-only").tokens
    # Beside a draft model (-mh): lossless, and beside an arbiter that keeps every mismatch the
    # draft model drafts each position the arbiter decides.
    with Engine(models["llama"], models["qwen35"], head=models["llama-dflash"], n_ctx=512, n_threads=1,
                calibration=None) as both:
        assert both.head == "dflash" and both.has_draft
        check_beside_a_draft_model(both, reference)


def test_a_dspark_drafter_is_refused_by_name(models, tmp_path):
    """DSpark (DFlash's variant with a Markov head) is a dflash file llama.cpp drafts another way:
    refused at load rather than run as DFlash, one position off."""
    import gguf
    from gguf_corpus import with_kv

    dspark = with_kv(models["llama-dflash"], tmp_path / "dspark.gguf", "dflash.hyper_connection.count", 4,
                     gguf.GGUFValueType.UINT32)
    with pytest.raises(InvalidArgumentError, match="a DSpark drafter .* is not supported"):
        Engine(models["llama"], dspark, n_ctx=512, n_threads=1, calibration=None)


def test_the_mtp_layers_of_a_hybrid_target_draft_losslessly(models):
    with Engine(models["qwen35-mtp"], None, n_ctx=512, n_threads=1, calibration=None) as engine, \
            Engine(models["qwen35-mtp"], models["llama"], n_ctx=512, n_threads=1, calibration=None) as control:
        assert engine.head == "mtp" and not engine.has_draft and control.head == "mtp"
        check_lossless(engine, control, "draft-mtp", restores=True)
        check_beside_a_keeping_arbiter(control)  # the MTP head beside the draft model


def test_an_eagle3_head_and_a_draft_model_draft_in_one_engine(models):
    """A head given beside the draft model (`head=`, the CLI's -mh): greedy output stays
    target-only's with either drafting, and beside an arbiter that keeps every mismatch the head's
    matches stand while the draft model drafts each position the arbiter decides."""
    with Engine(models["llama"], models["qwen35"], head=models["llama-eagle3"], n_ctx=512, n_threads=1,
                calibration=None) as engine, \
            Engine(models["llama"], models["qwen35"], n_ctx=512, n_threads=1, calibration=None) as control:
        assert engine.head == "eagle3" and engine.has_draft and engine.head_file == str(models["llama-eagle3"])
        check_lossless(engine, control, "draft-eagle3", restores=False)
        check_beside_a_draft_model(engine, control.generate(ZOO_PROMPT, max_tokens=N_PREDICT, mode="target-only").tokens)


def test_a_head_in_the_heads_place_must_be_one(models, tmp_path):
    from cospec_local.errors import CospecError

    with pytest.raises(CospecError, match="is not a head drafter \\(an EAGLE-3 head or a DFlash drafter; its "
                                          "architecture is qwen35\\); a draft model goes in the draft's place"):
        Engine(models["llama"], None, head=models["qwen35"], n_ctx=512, n_threads=1, calibration=None)
    with pytest.raises(InvalidArgumentError, match="two head drafters were given"):
        Engine(models["llama"], models["llama-eagle3"], head=models["llama-eagle3"], n_ctx=512, n_threads=1,
               calibration=None)
    with pytest.raises(CospecError, match="head drafter.*(not found|does not exist|no such)"):
        Engine(models["llama"], None, head=tmp_path / "missing.gguf", n_ctx=512, n_threads=1, calibration=None)


def test_a_head_made_for_another_target_is_refused_at_load(models):
    from cospec_local.errors import CospecError
    from cospec_local.models import resolve_model

    # The zoo's head reads 64-wide hidden states; SmolLM2-135M's are 576 wide (llama.cpp would abort).
    with pytest.raises(CospecError, match="width 64, the target's are 576: a head made for another target"):
        Engine(resolve_model("smollm2-135m"), models["llama-eagle3"], n_ctx=512, n_threads=1, calibration=None)


@pytest.mark.parametrize("first_id", [49152, -1, "second"])
def test_a_head_whose_vocabulary_map_llama_cpp_would_scatter_out_of_range_is_refused(tmp_path, first_id):
    """llama.cpp scatters the head's logits by its d2t map unchecked: an id out of the target's
    vocabulary, or one named twice, is refused at load with what is wrong."""
    import shutil

    import gguf

    from cospec_local.errors import CospecError
    from cospec_local.models import resolve_model

    good = resolve_model("smollm2-135m-eagle3")
    bad = tmp_path / "head.gguf"
    shutil.copyfile(good, bad)
    d2t = next(t for t in gguf.GGUFReader(good).tensors if t.name == "d2t")
    value = int(np.asarray(d2t.data)[1]) if first_id == "second" else first_id
    with bad.open("r+b") as f:
        f.seek(d2t.data_offset)
        f.write(np.int64(value).tobytes())
    with pytest.raises(CospecError, match=f"d2t map names token {value} out of range or twice"):
        Engine(resolve_model("smollm2-135m"), bad, n_ctx=512, n_threads=1, calibration=None)


def test_an_engine_without_a_head_refuses_one(models):
    with Engine(models["llama"], None, n_ctx=512, n_threads=1, calibration=None) as engine:
        assert engine.head is None
        with pytest.raises(InvalidArgumentError, match="has none"):
            engine.generate(ZOO_PROMPT, max_tokens=8, spec_type="draft-eagle3")
        with pytest.raises(Exception, match="head drafter, but the engine has none"):
            engine.generate(ZOO_PROMPT, max_tokens=8, spec_type="head")


def test_the_command_line_names_the_head_it_drafts_with(models):
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "cospec_local.cli", "generate", "-m", str(models["llama"]), "-md",
                          str(models["llama-eagle3"]), "-p", ZOO_PROMPT, "-n", "12", "--draft-max", "3", "-t", "1"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"draft:  {models['llama-eagle3']} (an EAGLE-3 head)" in out.stderr
    # Beside a draft model: -mh.
    both = ["generate", "-m", str(models["llama"]), "-md", str(models["qwen35"]), "-mh", str(models["llama-eagle3"]),
            "-p", ZOO_PROMPT, "-n", "12", "--draft-max", "3", "-t", "1", "--spec-type", "head,draft",
            "--calibration", "none"]
    out = subprocess.run([sys.executable, "-m", "cospec_local.cli", *both], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"draft:  {models['qwen35']}\nhead:   {models['llama-eagle3']} (an EAGLE-3 head)" in out.stderr
    out = subprocess.run([sys.executable, "-m", "cospec_local.cli", *both, "--json"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)
    assert record["models"]["draft"] == str(models["qwen35"])
    assert record["models"]["head"] == {"kind": "eagle3", "path": str(models["llama-eagle3"])}


def test_bench_measures_a_head_given_as_the_draft(models):
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "cospec_local.cli", "bench", "-m", str(models["llama"]), "-md",
                          str(models["llama-eagle3"]), "--prompts", str(REPO / "bench" / "heldout_chat_prompts.txt"),
                          "-n", "8", "--repeat", "1", "--draft-max", "2", "-t", "1", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    text = json.dumps(json.loads(out.stdout))
    for label in ("target-only", "ngram", "head", "sps"):
        assert f'"{label}"' in text, label


def test_sampled_head_blocks_keep_the_targets_distribution():
    """At temperature > 0 a head's token is accepted with the target's probability of it and a
    refusal samples the rest: the first two tokens are distributed as target-only's (SmolLM2 and
    the head trained for it, which proposes the second token every time)."""
    from collections import Counter

    from scipy.stats import chi2_contingency

    from cospec_local.models import resolve_model

    counts = {"target-only": Counter(), "speculative": Counter()}
    drafted = 0
    with Engine(resolve_model("smollm2-135m"), resolve_model("smollm2-135m-eagle3"), n_ctx=512, n_threads=2,
                calibration=None) as engine:
        prompt = engine.render_chat([{"role": "user", "content": "Name a colour."}])
        for mode, seeds in (("target-only", range(400)), ("speculative", range(10_000, 10_400))):
            for seed in seeds:
                r = engine.generate(prompt, mode=mode, spec_type="draft-eagle3", max_tokens=2, temperature=1.5,
                                    seed=seed, ignore_eos=True, draft_max=2, adaptive_draft=False)
                counts[mode][tuple(r.tokens)] += 1
                drafted += r.stats.draft_n_head > 0
    assert drafted > 350  # nearly every speculative run verified a head token
    a, b = counts["target-only"], counts["speculative"]
    assert len(a) >= 5, "the prompt should spread probability over several continuations"
    common = [k for k in set(a) | set(b) if a[k] + b[k] >= 10]
    rows = [[c[k] for k in common] + [sum(c.values()) - sum(c[k] for k in common)] for c in (a, b)]
    assert chi2_contingency(rows)[1] > 1e-3


def test_a_head_drafts_under_a_grammar_and_in_the_server(models):
    """Everything a block source has: under a grammar the head's blocks keep target-only's output
    (a proposal the grammar refuses is cut there), and `serve` with a head as -md drafts with it,
    counted under the head source in /metrics."""
    import re

    import httpx

    from cospec_local.server.process import ServerProcess

    grammar = 'root ::= [a-z ]+ "."'
    with Engine(models["llama"], models["llama-eagle3"], n_ctx=512, n_threads=1, calibration=None) as engine:
        for k in (1, 4):
            plain = engine.generate(ZOO_PROMPT, max_tokens=N_PREDICT, mode="target-only", grammar=grammar)
            headed = engine.generate(ZOO_PROMPT, max_tokens=N_PREDICT, spec_type="draft-eagle3", grammar=grammar,
                                     draft_max=k, adaptive_draft=False)
            assert re.fullmatch(r"[a-z ]+\.?", plain.text) and headed.tokens == plain.tokens, f"K={k}"
            assert headed.stats.blocks_head > 0
    server = ServerProcess("-m", str(models["llama"]), "-md", str(models["llama-eagle3"]), "-c", "512", "-t", "1",
                           "--calibration", "none", "--spec-type", "draft-eagle3", "--draft-max", "4")
    try:
        reply = httpx.post(server.api + "/completions", timeout=60,
                           json={"prompt": ZOO_PROMPT, "max_tokens": N_PREDICT, "temperature": 0}).json()
        assert reply["usage"]["completion_tokens"] == N_PREDICT
        _, text = server.get("/metrics")
        drafted = re.search(r'^cospec_draft_tokens_by_source_total\{source="head"\} (\S+)$', text.decode(), re.M)
        assert drafted and float(drafted.group(1)) > 0
    finally:
        server.stop()
