"""A draft taught one skill (recipes/skill_draft.py) and shipped as its blocks alone
(gguf_edit.strip_embedding / graft_embedding): the exchanges it learns are exactly what eval and
arbiter training give the target, a few real training steps lower its loss on them, and the
grafted model is the trained one, byte for byte in every tensor."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cospec_local import Engine, _cospec
from cospec_local.evaluation.task_eval import task_prompt
from cospec_local.formats.gguf_edit import graft_embedding
from cospec_local.models import resolve_model
from cospec_local.tasks import load_task

ROWS = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b), "solution": f"{a} + {b} = {a + b}"}
        for a in range(11, 41) for b in (12, 27, 35)]


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("skill") / "sums.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_an_exchange_is_the_eval_prompt_then_the_solution_and_end_of_turn(task_file):
    from cospec_local.recipes.skill_draft import exchange_tokens

    problem = load_task(task_file, "train")[0]
    with Engine("smollm2-135m", n_ctx=256, n_threads=1) as engine:
        tokens, prompt_len = exchange_tokens(engine, problem.prompt, problem.solution)
        prompt, _ = task_prompt(engine, problem, as_chat=True)
        assert tokens[:prompt_len] == prompt  # what the target reads in `eval --chat`
        assert engine.is_eog(tokens[-1]) and not any(engine.is_eog(t) for t in tokens[prompt_len:-1])
        assert engine.detokenize(tokens[prompt_len:-1]) == problem.solution


@pytest.mark.slow
def test_training_writes_a_draft_whose_blocks_graft_back_exactly(task_file, tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "cospec_local.recipes.skill_draft", "--out", str(out), "--task",
                           str(task_file), "--steps", "6", "--batch", "8", "--dev-problems", "8", "--lr", "1e-3",
                           "--threads", "1", "--precision", "float32", "--device", "cpu"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    log = json.loads((out / "skill_log.json").read_text())
    train = log["train"]
    assert train["steps"] == 6 and train["solutions"] == len(load_task(task_file, "train"))
    assert train["best_dev_token_accuracy"] > train["initial_dev_token_accuracy"]  # it learned something
    draft, blocks = out / "draft.gguf", out / "blocks.gguf"
    assert blocks.stat().st_size < draft.stat().st_size / 3  # the embedding is most of the file
    target = resolve_model("smollm2-135m")
    grafted = graft_embedding(blocks, target, tmp_path / "grafted.gguf")
    assert _cospec.model_fingerprint(str(grafted)) == _cospec.model_fingerprint(str(draft))
    with Engine(target, grafted, n_ctx=256, n_threads=1) as engine:  # the engine's vocabulary check passes
        assert engine.has_draft and engine.generate("Hi", mode="draft-only", max_tokens=4).stats.predicted_n > 0
    # Another model's embedding is refused, and nothing is written.
    with pytest.raises(ValueError, match="does not hold the embedding"):
        graft_embedding(blocks, resolve_model("demo-target"), tmp_path / "wrong.gguf")
    assert not (tmp_path / "wrong.gguf").exists()
    with pytest.raises(ValueError, match="records no embedding"):
        graft_embedding(draft, target, tmp_path / "wrong.gguf")


@pytest.mark.slow
def test_a_task_without_worked_solutions_is_refused(tmp_path):
    path = tmp_path / "bare.jsonl"
    path.write_text("".join(json.dumps({"prompt": r["prompt"], "answer": r["answer"]}) + "\n" for r in ROWS))
    done = subprocess.run([sys.executable, "-m", "cospec_local.recipes.skill_draft", "--out", str(tmp_path / "run"),
                           "--task", str(path), "--steps", "1", "--device", "cpu"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "no worked solution" in done.stderr
    assert not (tmp_path / "run" / "draft_blocks.pt").exists()


@pytest.mark.slow
def test_the_shipped_arithmetic_arbiter_stays_out_of_general_chat():
    """SmolLM2 with its arithmetic draft and arbiter: general chat prompts get the target's own
    greedy reply, the domain gate abstaining; an arithmetic question is admitted
    (bench/chat_identity.py measures 100 prompts)."""
    from cospec_local.params import GenerationParams

    prompts = Path(__file__).parents[1].joinpath("bench", "heldout_chat_prompts.txt").read_text().splitlines()[:5]
    params = GenerationParams(temperature=0.0, max_tokens=32, repeat_penalty=1.0)
    with Engine("smollm2-135m", "smollm2-135m-arith-draft", n_ctx=512, n_threads=2) as engine:
        for prompt in prompts:
            tokens = engine.render_chat([{"role": "user", "content": prompt}])
            engine.reset()
            target = engine.generate(tokens, params, mode="target-only")
            engine.reset()
            cospec = engine.generate(tokens, params, arbiter="smollm2-arith")
            assert cospec.stats.arbiter_abstained and cospec.tokens == target.tokens, prompt
        engine.reset()
        sum_prompt = engine.render_chat([{"role": "user", "content": "What is 47 + 38?"}])
        assert not engine.generate(sum_prompt, params, arbiter="smollm2-arith").stats.arbiter_abstained


@pytest.mark.slow
def test_policy_states_through_the_chat_template():
    """collect --policy --chat: the arbiter's own run on a chat-rendered problem, its states'
    contexts starting with that prompt, the run deciding exactly as the engine does natively."""
    from cospec_local.params import GenerationParams
    from cospec_local.train.rollout import RolloutWorker, WorkerConfig
    from cospec_local.train.states import TRAINING_SOURCES

    path = Path(__file__).parents[1] / "cospec_local" / "data" / "smollm2-arith" / "arithmetic.jsonl"
    worker = RolloutWorker(WorkerConfig("smollm2-135m", "smollm2-135m-arith-draft", 2, 40, chat=True))
    try:
        states = 0
        for problem in load_task(path, "train", 4):
            got = worker.policy_states(problem, "smollm2-arith", "train")
            prompt, stop = task_prompt(worker.engine, problem, as_chat=True)
            worker.engine.reset()
            native = worker.engine.generate(prompt, GenerationParams(max_tokens=40, spec_type=TRAINING_SOURCES),
                                            arbiter="smollm2-arith", stop=stop)
            assert got.tokens == len(native.tokens) and len(got.states) == len(native.decisions)
            assert got.summary() == {"problem_id": problem.id, "family": problem.family, "split": "train",
                                     "correct": got.correct, "tokens": got.tokens, "states": len(got.states)}
            for st in got.states:
                assert list(st.state.context[:len(prompt)]) == prompt
            states += len(got.states)
        assert states > 0
    finally:
        worker.close()
