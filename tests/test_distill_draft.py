"""Draft distillation's generate stage: an interrupted run resumes from its saved batches and
ends with the same data as an uninterrupted one (the demo target stands in for SmolLM2: same
code path, seconds instead of minutes)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from cospec_local.models import resolve_model  # noqa: E402
from cospec_local.recipes.distill_draft import generate_data, load_generator  # noqa: E402

PROMPTS = ["12 + 30 =", "def add(a, b):", "7 * 8 =", "91 - 45 =", "def neg(x):", "3 + 4 ="]


class Interrupted(Exception):
    pass


def interrupt_at_call(model, call: int) -> None:
    """Make the model's `call`-th generate (counting from 1) raise Interrupted, as a Ctrl-C there
    would; the calls before it run as usual. `del model.generate` undoes it."""
    real_generate, calls = model.generate, []

    def generate(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise Interrupted
        return real_generate(*args, **kwargs)

    model.generate = generate


def _arrays(out: Path) -> dict:
    with np.load(out / "distill_data.npz") as npz:
        return {k: npz[k] for k in npz.files}


def test_generate_resumes_from_saved_batches(tmp_path):
    target = resolve_model("demo-target")
    model = load_generator(target, "float32")

    whole = tmp_path / "whole"
    whole.mkdir()
    first = generate_data(target, model, PROMPTS, max_new=6, batch=2, out=whole)
    assert first["answer_tokens"] > 0 and first["reused_answer_tokens"] == 0
    assert not (whole / "generate_parts").exists()

    # Stopped during its second batch: the first is on disk, no data file yet.
    cut = tmp_path / "cut"
    cut.mkdir()
    interrupt_at_call(model, 2)
    with pytest.raises(Interrupted):
        generate_data(target, model, PROMPTS, max_new=6, batch=2, out=cut)
    del model.generate
    assert sorted(p.name for p in (cut / "generate_parts").iterdir()) == ["batch-00000.npz"]
    assert not (cut / "distill_data.npz").exists()

    resumed = generate_data(target, model, PROMPTS, max_new=6, batch=2, out=cut)
    assert 0 < resumed["reused_answer_tokens"] < resumed["answer_tokens"] == first["answer_tokens"]
    a, b = _arrays(whole), _arrays(cut)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("change", ["answer length", "precision", "target"])
def test_saved_batches_of_other_settings_are_not_reused(tmp_path, change):
    target = resolve_model("demo-target")
    model = load_generator(target, "float32")
    interrupt_at_call(model, 2)
    with pytest.raises(Interrupted):
        generate_data(target, model, PROMPTS, max_new=6, batch=2, out=tmp_path)
    del model.generate
    assert (tmp_path / "generate_parts" / "batch-00000.npz").exists()
    max_new = 3 if change == "answer length" else 6
    if change == "precision":
        model = load_generator(target, "bf16")
    elif change == "target":  # the demo draft shares the target's tokenizer: the same prompt tokens
        target = resolve_model("demo-draft")
        model = load_generator(target, "float32")
    other = generate_data(target, model, PROMPTS, max_new=max_new, batch=2, out=tmp_path)
    assert other["reused_answer_tokens"] == 0
    assert 0 < other["answer_tokens"] == len(_arrays(tmp_path)["top_i"]) <= max_new * len(PROMPTS)


def test_training_goes_on_from_init_and_rejects_blocks_of_another_shape(tmp_path):
    from cospec_local.recipes.distill_draft import train_draft

    target = resolve_model("demo-target")
    prompts = PROMPTS + [f"{a} + {b} =" for a, b in ((5, 9), (40, 2), (17, 17), (8, 60), (23, 11), (6, 6))] * 2
    generate_data(target, load_generator(target, "float32"), prompts, max_new=6, batch=6, out=tmp_path)
    first = train_draft(target, 1, tmp_path, epochs=4.0, lr=3e-3, batch=2, seed=0, precision="float32")
    assert first["best_dev_agreement"] > first["initial_dev_agreement"]
    saved = tmp_path / "first_blocks.pt"
    (tmp_path / "draft_blocks.pt").rename(saved)

    # Same seed, same dev split: the second run starts exactly at the first one's kept blocks. Its
    # learning rate is far too high, so no step beats them on dev and they must come out unchanged.
    second = train_draft(target, 1, tmp_path, epochs=2.0, lr=0.05, batch=2, seed=0, precision="float32", init=saved)
    assert second["initial_dev_agreement"] == first["best_dev_agreement"] == second["best_dev_agreement"]
    assert min(point["dev_agreement"] for point in second["curve"]) < second["initial_dev_agreement"]
    kept, started = torch.load(tmp_path / "draft_blocks.pt"), torch.load(saved)
    assert kept.keys() == started.keys() and all(torch.equal(kept[k], started[k]) for k in kept)

    with pytest.raises(SystemExit, match="does not fit a 2-block draft"):
        train_draft(target, 2, tmp_path, epochs=1.0, lr=1e-3, batch=2, seed=0, precision="float32", init=saved)


@pytest.mark.slow
def test_self_written_prompts_resume_and_skip_known_ones(tmp_path):
    from cospec_local.recipes.distill_draft import self_prompts

    target = resolve_model("demo-target")  # it writes arithmetic, not questions: the same code path
    model = load_generator(target, "float32")
    whole, _ = self_prompts(target, model, 10, seed=3, batch=4, exclude=[])
    assert len(whole) == 10 == len({p.lower() for p in whole})

    progress = tmp_path / "progress.json"
    interrupt_at_call(model, 3)
    with pytest.raises(Interrupted):
        self_prompts(target, model, 10, seed=3, batch=4, exclude=[], progress=progress)
    del model.generate
    assert 0 < len(json.loads(progress.read_text())["kept"]) < 10
    resumed, log = self_prompts(target, model, 10, seed=3, batch=4, exclude=[], progress=progress)
    assert resumed == whole and log["sampled"] > 8

    # An earlier data set's prompts are not asked again: the same seed would write them first.
    # (The progress saved above, made without them, is not taken up.)
    known = whole[:3]
    again, _ = self_prompts(target, model, 10, seed=3, batch=4, exclude=[], known=known, progress=progress)
    assert len(again) == 10 and not {p.lower() for p in known} & {p.lower() for p in again}
    assert again[:7] == whole[3:]


def test_training_takes_several_data_sets(tmp_path):
    from cospec_local.recipes.distill_draft import train_draft

    target = resolve_model("demo-target")
    model = load_generator(target, "float32")
    first, second = tmp_path / "first", tmp_path / "second"
    for out, prompts in ((first, PROMPTS * 2), (second, [f"{a} - {b} =" for a in (50, 71, 93) for b in (4, 18, 26, 7)])):
        out.mkdir()
        generate_data(target, model, prompts, max_new=4, batch=6, out=out)
    # The first set's prompts were drawn with seed 0 (what its generate stage records).
    (first / "distill_prompts.json").write_text(json.dumps({"recipe": {"seed": 0}, "prompts": PROMPTS * 2}))
    alone = train_draft(target, 1, first, epochs=1.0, lr=1e-3, batch=4, seed=0, precision="float32")
    both = train_draft(target, 1, second, epochs=1.0, lr=1e-3, batch=4, seed=1, precision="float32", more_data=[first])
    # 8 dev sequences from each set (at least 8 per set), the rest trained on ...
    assert (alone["sequences"], alone["dev_sequences"]) == (4, 8)
    assert (both["sequences"], both["dev_sequences"]) == (4 + 4, 16)
    # ... and the first set's dev split is the one it had alone, though another seed trains now.
    assert both["dev_digests"][1] == alone["dev_digests"][0]
    other_seed = train_draft(target, 1, second, epochs=0.5, lr=1e-3, batch=4, seed=0, precision="float32")
    assert other_seed["dev_digests"][0] != both["dev_digests"][0]  # a set made without a record: the training seed


def test_device_choice_is_checked_and_recorded(tmp_path):
    """`--device auto` runs where torch can (here the CPU); a device torch cannot see is refused
    before any work, and what made the data (the device too) is saved with every batch."""
    from cospec_local.recipes.distill_draft import main, made_by, resolve_device

    auto = resolve_device("auto")
    assert auto.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    for wrong in ("meta", "gpu0"):
        with pytest.raises(SystemExit, match="must be auto, cpu or cuda"):
            resolve_device(wrong)
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="sees no CUDA device"):
            main(["--out", str(tmp_path / "never"), "--device", "cuda", "--stages", "train"])
        assert not (tmp_path / "never").exists()
    target = resolve_model("demo-target")
    model = load_generator(target, "float32", resolve_device("cpu"))
    assert made_by(target, model)["device"] == "cpu"
    interrupt_at_call(model, 2)  # the first batch is saved, the second never comes
    with pytest.raises(Interrupted):
        generate_data(target, model, PROMPTS[:4], max_new=4, batch=2, out=tmp_path)
    with np.load(tmp_path / "generate_parts" / "batch-00000.npz") as saved:
        assert saved["device"].item() == "cpu" and saved["dtype"].item() == "torch.float32"
