"""The domain gate: built from training prompts' bigrams, its threshold set on dev prompts; on the
demo pair it admits the training tasks' held-out prompts and refuses the unseen listops family and
general chat."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cospec_local import Engine
from cospec_local.arbiter.domain_gate import DEV_QUANTILE, MARGIN, build_gate, coverage, pair_keys
from cospec_local.tasks import load_task

CHAT_PROMPTS = Path(__file__).resolve().parent.parent / "bench" / "heldout_chat_prompts.txt"


def test_coverage_counts_the_prompts_known_pairs():
    keys = np.unique(pair_keys([1, 2, 3, 4], 10))  # pairs 1-2, 2-3, 3-4
    assert coverage([1, 2, 3, 4], keys, 10) == 1.0
    assert coverage([1, 2, 5, 3, 4], keys, 10) == 0.5  # 1-2 and 3-4 known, 2-5 and 5-3 not
    assert coverage([4, 3, 2, 1], keys, 10) == 0.0  # the same tokens in another order
    assert coverage([7], keys, 10) == 1.0  # nothing to judge
    assert coverage([9, 9], keys, 10) == 0.0  # past the largest key


def test_threshold_sits_below_the_dev_prompts():
    train = [[1, 2, 3, 4, 5]] * 3
    dev = [[1, 2, 3, 4, 5]] * 98 + [[1, 2, 3, 9]] + [[9, 8]]  # coverages 1.0 (98), 2/3, 0
    gate = build_gate(train, dev, 10)
    assert gate.bigrams.tolist() == [[1, 2], [2, 3], [3, 4], [4, 5]]
    expected = max(0.0, float(np.quantile([1.0] * 98 + [2 / 3, 0.0], DEV_QUANTILE)) - MARGIN)
    assert gate.threshold == pytest.approx(expected) and 0.0 < gate.threshold < 2 / 3
    assert gate.admits([1, 2, 3]) and not gate.admits([5, 4, 3, 2, 1])
    with pytest.raises(ValueError, match="nothing to build"):
        build_gate([[1]], dev, 10)
    with pytest.raises(ValueError, match="no dev prompts"):
        build_gate(train, [], 10)


@pytest.fixture(scope="module")
def demo_gate():
    with Engine("demo-target", "demo-draft", n_ctx=512, n_threads=1) as engine:
        def tokens(prompts):
            return [engine.tokenize(p) for p in prompts]

        train = tokens([p.prompt for f in ("arith", "pyfunc") for p in load_task(f, "train", 1000)])
        dev = tokens([p.prompt for f in ("arith", "pyfunc") for p in load_task(f, "dev", 200)])
        held_out = {f: tokens([p.prompt for p in load_task(f, "test", 200)]) for f in ("arith", "pyfunc", "listops")}
        held_out["chat"] = tokens([line for line in CHAT_PROMPTS.read_text().splitlines() if line.strip()])
        return build_gate(train, dev, engine.n_vocab), held_out


def test_demo_gate_admits_its_tasks_and_refuses_others(demo_gate):
    gate, held_out = demo_gate
    admitted = {name: sum(gate.admits(t) for t in prompts) / len(prompts) for name, prompts in held_out.items()}
    assert admitted["arith"] >= 0.99 and admitted["pyfunc"] >= 0.97
    assert admitted["listops"] == 0.0 and admitted["chat"] == 0.0


def gate_tensor(folder: Path, name: str) -> np.ndarray | None:
    """An arbiter.gguf's tensor `name` as stored (None where it has none)."""
    import gguf

    from cospec_local.arbiter.file_format import ARBITER_FILE

    found = next((t for t in gguf.GGUFReader(folder / ARBITER_FILE, "r").tensors if t.name == name), None)
    return None if found is None else np.array(found.data)


def with_gate_tensor(source: Path, out: Path, name: str, data: np.ndarray) -> Path:
    """A copy of the arbiter.gguf in `source`, in the folder `out`, whose tensor `name` (added or
    replacing its own) holds `data`: a crafted gate, for the load checks."""
    import gguf

    from cospec_local.arbiter.file_format import ARBITER_FILE
    from cospec_local.formats.gguf_edit import rewrite_gguf

    out.mkdir()
    rewrite_gguf(gguf.GGUFReader(source / ARBITER_FILE, "r"), out / ARBITER_FILE, keep_tensor=lambda t: t != name,
                 add_tensors=[(name, np.ascontiguousarray(data), None)])
    return out


# ---------------------------------------------------------------- the engine's gate

@pytest.fixture(scope="module")
def engine():
    with Engine("demo-target", "demo-draft", n_ctx=1024, n_threads=1) as e:
        yield e


def test_engine_coverage_equals_the_reference(engine):
    """The native gate computes domain_gate.coverage on the shipped arbiter's own bigrams."""
    from cospec_local.arbiter.file_format import read_bundle
    from cospec_local.arbiter.catalog import resolve_arbiter_path

    gate = read_bundle(resolve_arbiter_path("demo-features")).gate
    arbiter = engine.arbiter("demo-features")
    prompts = [p.prompt for f in ("arith", "pyfunc", "listops") for p in load_task(f, "test", 40)]
    prompts += [line for line in CHAT_PROMPTS.read_text().splitlines() if line.strip()]
    for text in prompts:
        tokens = engine.tokenize(text)
        assert arbiter.gate_coverage(tokens) == pytest.approx(gate.coverage(tokens), abs=1e-6)
        assert arbiter.admits(tokens) == gate.admits(tokens)
    assert float(arbiter.meta("gate_threshold")) == pytest.approx(gate.threshold)


@pytest.mark.parametrize("name", ["demo-lora", "demo-features"])
def test_shipped_arbiters_abstain_outside_their_tasks(engine, name):
    """On an unseen family the arbiter is never asked and keeps nothing: the tokens are plain
    speculative decoding's; its own tasks' prompts are all admitted."""
    for problem in load_task("listops", "test", 3):
        engine.reset()
        gated = engine.generate(problem.prompt, arbiter=name, max_tokens=96, stop=("\n\n",))
        engine.reset()
        plain = engine.generate(problem.prompt, arbiter="target", max_tokens=96, stop=("\n\n",))
        assert gated.stats.arbiter_abstained and gated.stats.arbiter_keeps == 0 and gated.stats.arbiter_calls == 0
        assert gated.tokens == plain.tokens
    arbiter = engine.arbiter(name)
    assert all(arbiter.admits(engine.tokenize(p.prompt)) for f in ("arith", "pyfunc") for p in load_task(f, "test", 200))


def test_gate_off_decides_every_prompt(engine):
    """--no-arbiter-gate: the same listops prompts meet the arbiter, which keeps draft tokens there
    (what the gate prevents)."""
    kept = calls = 0
    for problem in load_task("listops", "test", 3):
        engine.reset()
        run = engine.generate(problem.prompt, arbiter="demo-lora", arbiter_gate=False, max_tokens=96, stop=("\n\n",))
        assert not run.stats.arbiter_abstained
        kept += run.stats.arbiter_keeps
        calls += run.stats.arbiter_calls
    assert calls > 0 and kept > 0


def keeps_per_1000(engine, name: str, family: str, n: int) -> float:
    kept = tokens = 0
    for problem in load_task(family, "test", n):
        engine.reset()
        run = engine.generate(problem.prompt, arbiter=name, max_tokens=256, stop=("\n\n",))
        kept += run.stats.arbiter_keeps
        tokens += run.stats.predicted_n
    return 1000 * kept / max(tokens, 1)


@pytest.mark.parametrize("name", ["demo-lora", "demo-features"])
def test_out_of_domain_keep_rate_is_not_above_the_in_domain_one(engine, name):
    """The shipped arbiter keeps no more draft tokens per 1,000 on listops (never trained on) than
    on arith (trained on); without the gate demo-lora kept 190 per 1,000 on listops against 1.8 on
    arith (bench/demo_pair_eval, 500 problems each)."""
    assert keeps_per_1000(engine, name, "listops", 12) <= keeps_per_1000(engine, name, "arith", 12)


@pytest.mark.parametrize("change, message", [
    (lambda ids: ids[::-1], "not sorted and unique"),
    (lambda ids: np.concatenate([ids, ids[-1:]]), "not sorted and unique"),
    (lambda ids: np.concatenate([ids, [[0, 1 << 20]]]).astype(np.int32), "outside the vocabulary"),
    (lambda ids: ids[:, :1].copy(), "must be I32 pairs"),
])
def test_a_corrupt_gate_is_refused_at_load(engine, tmp_path, change, message):
    from cospec_local.arbiter.file_format import GATE_TENSOR
    from cospec_local.arbiter.catalog import resolve_arbiter_path
    from cospec_local.errors import ArbiterError

    source = resolve_arbiter_path("demo-features")
    ids = gate_tensor(source, GATE_TENSOR).astype(np.int32).reshape(-1, 2)
    folder = with_gate_tensor(source, tmp_path / "bad-gate", GATE_TENSOR, change(ids))
    with pytest.raises(ArbiterError, match=message):
        engine.arbiter(str(folder))


# ---------------------------------------------------------------- the classifier gate

def test_hashed_features_are_the_distinct_buckets_of_unigrams_and_bigrams():
    from cospec_local.arbiter.domain_gate import hashed_features

    one = hashed_features([5, 7, 5, 7], 20)
    assert list(one) == sorted(set(one)) and len(one) <= 4  # 5, 7, 5-7, 7-5: repeats count once
    assert set(hashed_features([5, 7], 20)) <= set(one)
    assert len(hashed_features([3], 20)) == 1 and hashed_features([3, 4], 20).max() < (1 << 20)


def test_a_classifier_gate_learns_words_not_their_order():
    from cospec_local.arbiter.domain_gate import train_classifier_gate

    rng = np.random.default_rng(0)
    task_words, other_words, shared = [100, 101, 102], [200, 201, 202], list(range(10, 40))
    def prompts(words, n):
        return [list(rng.choice(shared, 5)) + [int(rng.choice(words))] + list(rng.choice(shared, 4)) for _ in range(n)]
    gate = train_classifier_gate(prompts(task_words, 200), prompts(other_words, 200), n_vocab=300, bits=12)
    assert gate.record["train_admitted"] == {"positive": 1.0, "negative": 0.0}
    # new sentences around a task word are admitted; the same sentences without one are not
    assert gate.admits([33, 12, 101, 17])
    assert not gate.admits([33, 12, 201, 17])
    with pytest.raises(ValueError, match="needs prompts"):
        train_classifier_gate([], prompts(other_words, 3), n_vocab=300)


@pytest.fixture(scope="module")
def classifier_demo_arbiter(engine, tmp_path_factory):
    """demo-features with a classifier gate: its tasks (arith, pyfunc) against general chat."""
    import shutil

    from cospec_local.arbiter.catalog import resolve_arbiter_path
    from cospec_local.arbiter.file_format import add_gate
    from cospec_local.recipes.distill_prompts import build_prompts
    from cospec_local.arbiter.domain_gate import train_classifier_gate

    folder = tmp_path_factory.mktemp("classifier") / "demo-features-classifier"
    shutil.copytree(resolve_arbiter_path("demo-features"), folder)
    positive = [engine.tokenize(p.prompt) for f in ("arith", "pyfunc") for p in load_task(f, "train", 150)]
    negative = [engine.tokenize(p) for p in build_prompts("train", 300, 0)]
    gate = train_classifier_gate(positive, negative, engine.n_vocab, bits=16)
    add_gate(folder, gate)
    return folder, gate


def test_engine_classifier_gate_equals_the_reference(engine, classifier_demo_arbiter):
    from cospec_local.arbiter.file_format import read_bundle

    folder, gate = classifier_demo_arbiter
    stored = read_bundle(folder).gate
    assert stored.bias == gate.bias and np.array_equal(stored.weights, gate.weights) and stored.bits == 16
    arbiter = engine.arbiter(str(folder))
    prompts = [p.prompt for f in ("arith", "pyfunc", "listops") for p in load_task(f, "test", 30)]
    prompts += [line for line in CHAT_PROMPTS.read_text().splitlines() if line.strip()]
    admitted = {}
    for text in prompts:
        tokens = engine.tokenize(text)
        assert arbiter.gate_coverage(tokens) == pytest.approx(gate.score(tokens), abs=1e-6)
        assert arbiter.admits(tokens) == gate.admits(tokens)
        admitted[text] = gate.admits(tokens)
    assert sum(admitted.values()) >= 55  # the 60 arith and pyfunc problems, nearly all
    assert not any(admitted[line] for line in CHAT_PROMPTS.read_text().splitlines() if line.strip())


@pytest.mark.parametrize("change, message", [
    (lambda w: w[:-1].copy(), "2\\^gate_hash_bits"),
    (lambda w: np.where(np.arange(len(w)) == 3, np.nan, w).astype(np.float32), "not a finite number"),
])
def test_a_corrupt_classifier_gate_is_refused_at_load(engine, classifier_demo_arbiter, tmp_path, change, message):
    from cospec_local.arbiter.file_format import CLASSIFIER_GATE_TENSOR
    from cospec_local.errors import ArbiterError

    folder, _ = classifier_demo_arbiter
    weights = gate_tensor(folder, CLASSIFIER_GATE_TENSOR).astype(np.float32)
    bad = with_gate_tensor(folder, tmp_path / "bad-classifier", CLASSIFIER_GATE_TENSOR, change(weights))
    with pytest.raises(ArbiterError, match=message):
        engine.arbiter(str(bad))


def test_two_gates_in_one_file_are_refused(engine, classifier_demo_arbiter, tmp_path):
    from cospec_local.arbiter.catalog import resolve_arbiter_path
    from cospec_local.arbiter.file_format import GATE_TENSOR
    from cospec_local.errors import ArbiterError

    folder, _ = classifier_demo_arbiter
    bigrams = gate_tensor(resolve_arbiter_path("demo-features"), GATE_TENSOR).astype(np.int32).reshape(-1, 2)
    bad = with_gate_tensor(folder, tmp_path / "two-gates", GATE_TENSOR, bigrams)
    with pytest.raises(ArbiterError, match="two domain gates"):
        engine.arbiter(str(bad))


def test_the_gemma_arbiter_admits_its_tasks_asked_otherwise_and_refuses_listops_and_chat():
    """The shipped gemma3-smollm2-words gate, through the engine, in Gemma 3's own turn format (its
    training rendered none of it): most test questions reworded apart from its training prompts
    (bench/headroom/make_reworded_tasks.py) pass (57, 84 and 67% measured; the coverage gate it
    replaced admitted none); listops and general chat do not."""
    from cospec_local.tasks.benchmarks import read_jsonl

    tasks = Path(__file__).resolve().parent.parent / "bench" / "headroom" / "tasks"
    with Engine("gemma3-270m", "smollm2-135m", n_ctx=1024, n_threads=1, calibration=None) as gemma:
        arbiter = gemma.arbiter("gemma3-smollm2-words")

        def admitted(prompts):
            return sum(arbiter.admits(gemma.render_chat([{"role": "user", "content": p}])) for p in prompts) / len(prompts)

        for task in ("capitals", "antonyms", "plurals"):
            reworded = [row["prompt"] for row in read_jsonl(tasks / f"{task}-reworded-test.jsonl")]
            assert admitted(reworded) >= 0.5, task
        assert admitted([p.prompt for p in load_task("listops", "test", 40)]) == 0.0
        assert admitted([line for line in CHAT_PROMPTS.read_text().splitlines() if line.strip()]) == 0.0


# ---------------------------------------------------------------- the checkable-answer (embedding) gate

LEFT_OUT = "past-tense"  # a family the gate below never sees


@pytest.fixture(scope="module")
def smollm2():
    with Engine("smollm2-135m", "smollm2-135m", n_ctx=512, n_threads=1, calibration=None) as engine:
        yield engine


@pytest.fixture(scope="module")
def checkable_gate(smollm2):
    """A checkable-answer gate trained on every short-answer family but LEFT_OUT (and arithmetic),
    few questions each, against general chat and long-form writing."""
    from cospec_local.tasks import SHORT_ANSWER_FAMILIES
    from cospec_local.train.fit_gate import general_gate, general_negatives

    tasks = [f.name for f in SHORT_ANSWER_FAMILIES if f.name != LEFT_OUT] + ["arith"]
    return general_gate(smollm2, tasks, general_negatives(smollm2, 100), train=20, dev=6)


def test_a_prompt_embedding_is_the_drafts_normalised_reading(smollm2):
    from cospec_local import InvalidArgumentError, NoDraftError

    a = smollm2.prompt_embedding("What is the capital of Peru?")
    assert a.shape == (576,) and np.linalg.norm(a) == pytest.approx(1.0, abs=1e-5)
    assert np.array_equal(a, smollm2.prompt_embedding("What is the capital of Peru?"))  # the same every time
    assert not np.allclose(a, smollm2.prompt_embedding("Write a poem about the sea."))
    assert not np.any(smollm2.prompt_embedding([]))  # nothing read: the zero vector
    with pytest.raises(InvalidArgumentError, match="outside the target's vocabulary"):
        smollm2.prompt_embedding([1 << 24])
    with Engine("smollm2-135m", n_ctx=256, n_threads=1, calibration=None) as alone:
        with pytest.raises(NoDraftError):
            alone.prompt_embedding("Hi")


@pytest.mark.slow
def test_the_checkable_gate_admits_a_family_it_never_saw_and_refuses_chat_and_long_form(smollm2, checkable_gate):
    """Questions of the left-out family, in three formats, mostly pass; held-out general chat (the
    project's own prompts, and templates and topics no gate trained on) and long-form writing do not."""
    from cospec_local.train.fit_gate import embeddings, held_out_quiet_prompts, in_each_format, task_questions

    gate = checkable_gate
    assert gate.record["train_admitted"]["negative"] == 0.0 and gate.record["dev_admitted"] >= 0.7
    by_format = in_each_format(smollm2, task_questions(LEFT_OUT, "test", 20))
    for fmt in ("raw", "question", "chat"):
        admitted = np.mean([gate.admits(e) for e in embeddings(smollm2, by_format[fmt])])
        assert admitted >= 0.6, (fmt, admitted)  # (85, 80 and 90% measured)
    quiet = held_out_quiet_prompts(30)
    quiet["ours"] = [line for line in CHAT_PROMPTS.read_text().splitlines() if line.strip()]
    for kind, prompts in quiet.items():
        for fmt in ("raw", "chat"):
            admitted = np.mean([gate.admits(e) for e in embeddings(smollm2, in_each_format(smollm2, prompts)[fmt])])
            assert admitted <= 0.05, (kind, fmt, admitted)


@pytest.fixture(scope="module")
def checkable_arbiter(smollm2, checkable_gate, tmp_path_factory):
    """A features arbiter for SmolLM2 (an untrained head at threshold 0: it keeps whatever it is asked
    about) behind the checkable gate."""
    torch = pytest.importorskip("torch")
    from cospec_local.arbiter.file_format import add_gate, write_arbiter
    from cospec_local.models import resolve_model
    from cospec_local.train.arbiter_model import FeaturesArbiter

    torch.manual_seed(0)
    folder = write_arbiter(tmp_path_factory.mktemp("checkable") / "arbiter", kind="features",
                           head=FeaturesArbiter().head, draft_gguf=resolve_model("smollm2-135m"), threshold=0.0,
                           name="test-checkable", onnx=False)
    add_gate(folder, checkable_gate)
    return folder


@pytest.mark.slow
def test_engine_embedding_gate_equals_the_reference(smollm2, checkable_gate, checkable_arbiter):
    from cospec_local.arbiter.file_format import read_bundle

    stored = read_bundle(checkable_arbiter).gate
    assert stored.bias == checkable_gate.bias and np.array_equal(stored.weights, checkable_gate.weights)
    arbiter = smollm2.arbiter(str(checkable_arbiter))
    prompts = [p.prompt for p in load_task(LEFT_OUT, "test", 8)] + \
        [line for line in CHAT_PROMPTS.read_text().splitlines() if line.strip()][:8]
    for text in prompts:
        tokens = smollm2.tokenize(text)
        expected = checkable_gate.score(smollm2.prompt_embedding(tokens))
        assert arbiter.gate_coverage(tokens) == pytest.approx(expected, abs=1e-5)
        if abs(expected - checkable_gate.threshold) > 1e-4:  # (not at a near-tie of float rounding)
            assert arbiter.admits(tokens) == checkable_gate.admits(smollm2.prompt_embedding(tokens))
    # In a generation: a refused prompt is plain speculative decoding (no decision), an admitted one
    # is decided (this head keeps every mismatch it is asked about).
    chat = smollm2.render_chat([{"role": "user", "content": "Write a short story about a lighthouse keeper."}])
    assert not arbiter.admits(chat)
    refused = smollm2.generate(chat, arbiter=arbiter, max_tokens=24)
    assert refused.decisions == [] and refused.tokens == smollm2.generate(chat, mode="target-only", max_tokens=24).tokens


@pytest.mark.slow
@pytest.mark.parametrize("change, message", [
    (lambda w: w[:-1].copy(), "embedding gate reads hidden states of width 575"),
    (lambda w: np.where(np.arange(len(w)) == 3, np.inf, w).astype(np.float32), "not a finite number"),
])
def test_a_corrupt_embedding_gate_is_refused_at_load(smollm2, checkable_arbiter, tmp_path, change, message):
    from cospec_local.arbiter.file_format import EMBEDDING_GATE_TENSOR
    from cospec_local.errors import ArbiterError

    weights = gate_tensor(checkable_arbiter, EMBEDDING_GATE_TENSOR).astype(np.float32)
    bad = with_gate_tensor(checkable_arbiter, tmp_path / "bad-embedding", EMBEDDING_GATE_TENSOR, change(weights))
    with pytest.raises(ArbiterError, match=message):
        smollm2.arbiter(str(bad))


@pytest.mark.slow
def test_an_embedding_gate_beside_another_is_refused(smollm2, checkable_arbiter, tmp_path):
    from cospec_local.arbiter.file_format import CLASSIFIER_GATE_TENSOR
    from cospec_local.errors import ArbiterError

    bad = with_gate_tensor(checkable_arbiter, tmp_path / "two", CLASSIFIER_GATE_TENSOR, np.zeros(1 << 8, np.float32))
    with pytest.raises(ArbiterError, match="two domain gates"):
        smollm2.arbiter(str(bad))
