"""A pair's stored calibration: what it changes in a fresh process, the modes it makes
reproducible, the n-gram drafter beside a keeping arbiter, and the store as untrusted input."""
from __future__ import annotations

import json
import math
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cospec_local import Engine, GenerationParams, calibration
from cospec_local.params import CHAT_SAMPLING
from cospec_local.arbiter.callbacks import arbiter_from_function
from cospec_local.errors import CalibrationNotice, InvalidArgumentError

CLI = [sys.executable, "-m", "cospec_local.cli"]
# A demo-pair question whose worked answer copies numbers and phrases of the question.
ARITH = ("Chloe has 77 candles. Chloe gives 53 candles to Omar. Then Chloe buys 92 more candles. Chloe loses 85 "
         "of the candles. How many candles does Chloe have now?")
# A demo-pair prompt outside its tasks: the demo arbiters' gate refuses it.
LISTOPS = "[MAX 3 [MIN 4 7 ] 0 2 ]"


def run_cli(args, store: Path, extra_env=None, timeout=300) -> subprocess.CompletedProcess:
    env = {**os.environ, calibration.STORE_ENV: str(store), **(extra_env or {})}
    return subprocess.run(CLI + args, capture_output=True, text=True, env=env, timeout=timeout)


def generate_json(args, store: Path) -> tuple[dict, str]:
    done = run_cli(["generate", "--json", *args], store)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory):
    """A store holding the demo pair's full calibration (costs and acceptance), measured once."""
    store = tmp_path_factory.mktemp("calibration")
    done = run_cli(["calibrate", "--json", "--n-prompts", "4", "-n", "48"], store)
    assert done.returncode == 0, done.stderr
    stored = json.loads(done.stdout)
    assert Path(stored["path"]).parent == store
    assert 0 <= stored["numbers"]["draft_acceptance"] <= 1
    assert 0 <= stored["numbers"]["draft_acceptance_sampled"] <= 1
    return store


def test_calibrate_stores_costs_and_acceptance(demo_store):
    (path,) = demo_store.glob("demo-target*.json")
    stored = calibration.read(path)
    numbers = stored.numbers
    assert numbers["verify"][0] == 1.0
    assert all(b >= a for a, b in zip(numbers["verify"], numbers["verify"][1:]))  # a larger batch never costs less
    # Timings beside the other test worker are noisy (a 9-token batch has timed as one token); only the
    # largest batch, about 17 target steps on an idle machine, is held to costing more than one step.
    assert all(1.0 <= v < 1e4 for v in numbers["verify"][1:])
    assert numbers["verify"][-1] > 1.0
    assert 0 < numbers["draft_step"] < numbers["draft_first"] * 1.5 + 1
    measured = [a for a in numbers["ngram_acceptance"] if a >= 0]
    assert measured  # the arith answers repeat their questions
    assert measured == sorted(measured)  # a longer match is never taken to be refused more often
    assert stored.acceptance_on and stored.id == json.loads(path.read_text())["id"]


def test_a_fresh_process_drafts_from_its_first_block(demo_store, tmp_path):
    with_it, err = generate_json(["--chat", "-p", ARITH, "-n", "48", "--arbiter", "target"], demo_store)
    assert "calibration" not in err  # a stored one is taken silently
    assert with_it["calibration"] is not None
    assert with_it["provenance"][0] != "target"  # the first step is a block, no measuring plain steps
    # Without one, the first steps measure a plain step's cost; with none stored, the first process says so once.
    without, _ = generate_json(["--chat", "-p", ARITH, "-n", "48", "--arbiter", "target", "--calibration", "none"],
                               tmp_path)
    assert without["calibration"] is None and without["provenance"][0] == "target"
    first, err = generate_json(["--chat", "-p", ARITH, "-n", "48", "--arbiter", "target"], tmp_path)
    assert err.count("calibration of this pair on this machine: none is stored") == 1
    second, err = generate_json(["--chat", "-p", ARITH, "-n", "48", "--arbiter", "target"], tmp_path)
    assert "calibration" not in err and second["calibration"] == first["calibration"] is not None
    assert with_it["tokens"] == without["tokens"] == first["tokens"]  # greedy, lossless: the target's tokens
    # The first process measured a sample of the draft's acceptance beside the costs, greedy and sampled.
    (path,) = tmp_path.glob("demo-target*.json")
    sample = calibration.read(path)
    assert "acceptance only" in sample.acceptance_on
    assert 0 <= sample.numbers["draft_acceptance"] <= 1 and 0 <= sample.numbers["draft_acceptance_sampled"] <= 1
    assert all(a < 0 for a in sample.numbers["ngram_acceptance"])  # left to `calibrate`


def _burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        x += 1


@pytest.mark.slow
@pytest.mark.parametrize("settings", [
    ["-m", "demo-target", "-md", "demo-draft", "--arbiter", "demo-lora", "--chat", "-p", ARITH, "-n", "96"],
    ["-m", "demo-target", "-md", "demo-draft", "--arbiter", "demo-lora", "--chat", "-p", ARITH, "-n", "96",
     "--temp", "0.8", "--top-k", "40", "--top-p", "0.95", "--min-p", "0.05", "--repeat-penalty", "1.1", "-s", "11"],
    ["-m", "smollm2-135m", "-md", "smollm2-135m-draft", "--chat", "-p",
     "Rewrite in the past tense: I walk to the market, buy bread and talk to the baker.", "-n", "64",
     "--temp", "0.8", "--top-k", "40", "--top-p", "0.95", "--min-p", "0.05", "--repeat-penalty", "1.1", "-s", "5"],
], ids=["keeping-arbiter", "keeping-arbiter-sampled", "sampled-chat"])
def test_the_same_seed_gives_the_same_tokens_in_two_processes_under_load(settings, demo_store):
    quiet, _ = generate_json(settings, demo_store)
    # The second process shares the CPUs with two busy ones: its timings differ, its tokens must not.
    burners = [multiprocessing.Process(target=_burn, args=(60,)) for _ in range(2)]
    for b in burners:
        b.start()
    try:
        loaded, _ = generate_json(settings, demo_store)
    finally:
        for b in burners:
            b.terminate()
            b.join()
    assert loaded["tokens"] == quiet["tokens"]
    assert loaded["provenance"] == quiet["provenance"]
    assert loaded["stats"]["blocks"] == quiet["stats"]["blocks"]
    assert loaded["calibration"] == quiet["calibration"] is not None


@pytest.fixture(scope="module")
def demo_engine(demo_store):
    os.environ[calibration.STORE_ENV], saved = str(demo_store), os.environ[calibration.STORE_ENV]
    try:
        engine = Engine("demo-target", "demo-draft")
    finally:
        os.environ[calibration.STORE_ENV] = saved
    assert engine.calibration is not None and engine.calibration.acceptance_on
    yield engine
    engine.close()


def test_ngram_blocks_beside_a_keeping_arbiter_leave_its_mismatches_to_the_draft_model(demo_engine):
    """With an arbiter that keeps every mismatch it decides, no target token ever replaces a draft
    token: an n-gram block's mismatch emits nothing, and the draft model's token there is kept.
    (Fixed lengths: every n-gram proposal is verified, where adaptive ones leave most of this
    pair's steps to its draft, which agrees more often than short matches do.)"""
    keep_all = arbiter_from_function(lambda block: np.ones(len(block["draft"])), name="keep-all")
    prompt = demo_engine.render_chat([{"role": "user", "content": ARITH}])
    result = demo_engine.generate(prompt, max_tokens=120, arbiter=keep_all, adaptive_draft=False)
    assert result.stats.blocks_ngram > 0 and result.stats.draft_n_matched_ngram > 0
    assert result.stats.target_fallbacks == 0
    assert result.decisions and all(d.keep for d in result.decisions)
    assert result.stats.arbiter_keeps == len(result.decisions)
    # With the target arbiter the same n-gram proposals meet the target's tokens at their mismatches.
    lossless = demo_engine.generate(prompt, max_tokens=120, arbiter="target", adaptive_draft=False)
    assert lossless.stats.blocks_ngram > 0 and lossless.stats.target_fallbacks > 0


def test_an_abstaining_arbiter_runs_as_sps(demo_engine):
    prompt = demo_engine.render_chat([{"role": "user", "content": LISTOPS + " " + LISTOPS}])
    for sampling in ({}, {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.1,
                          "seed": 3}):
        demo_engine.reset()
        gated = demo_engine.generate(prompt, max_tokens=64, arbiter="demo-lora", **sampling)
        demo_engine.reset()
        sps = demo_engine.generate(prompt, max_tokens=64, arbiter="target", **sampling)
        assert gated.stats.arbiter_abstained and gated.stats.arbiter_keeps == 0
        assert gated.tokens == sps.tokens
        if sampling:  # both timing-free: the same blocks, from the same sources
            assert (gated.stats.blocks, gated.stats.blocks_ngram, gated.stats.draft_n) == \
                   (sps.stats.blocks, sps.stats.blocks_ngram, sps.stats.draft_n)


def test_a_sampled_call_starts_from_the_sampled_acceptance(demo_engine):
    """Sampling draws the target's token, which matches the draft's less often than its likeliest
    one: a sampled call weighs its first blocks at the calibration's sampled acceptance."""
    measured = demo_engine.calibration
    prompt = demo_engine.render_chat([{"role": "user", "content": ARITH}])
    sampled = dict(CHAT_SAMPLING, seed=3, max_tokens=24, arbiter="target", spec_type="draft")
    firsts = {}
    try:
        for greedy_a, sampled_a in ((0.0, 0.99), (0.99, 0.0)):
            numbers = {**measured.numbers, "draft_acceptance": greedy_a, "draft_acceptance_sampled": sampled_a}
            demo_engine.set_calibration(calibration.Calibration(numbers, measured.pair, measured.machine))
            demo_engine.reset()
            result = demo_engine.generate(prompt, **sampled)
            firsts[sampled_a] = result.provenance[0]
    finally:
        demo_engine.set_calibration(measured)
    assert firsts[0.99] != "target"  # drafted from its first block
    assert firsts[0.0] == "target"  # plain steps where sampled blocks are measured to lose


def test_the_collector_refuses_a_calibrated_engine(demo_engine):
    """Training states are recorded in the pair's uncalibrated blocks, the same on every machine."""
    from cospec_local.train.collect import Collector

    with pytest.raises(ValueError, match="calibration=None"):
        Collector(demo_engine, GenerationParams(max_tokens=16))


# ---------------------------------------------------------------- the store as untrusted input

def _damaged(good: dict, how: str):
    data = json.loads(json.dumps(good))
    if how == "truncated":
        return json.dumps(data)[: len(json.dumps(data)) // 2]
    if how == "not-json":
        return "\x00\x01garbage"
    if how == "other-format":
        data["format"] = 99
    elif how == "other-version":
        data["numbers"]["version"] = 99
    elif how == "other-pair":
        data["pair"]["target"]["sha256_ends"] = "0" * 32
    elif how == "other-machine":
        data["machine"]["cpu"] = "another CPU"
    elif how == "nan":
        data["numbers"]["verify"][3] = float("nan")
        data.pop("id")
    elif how == "out-of-range":
        data["numbers"]["draft_acceptance"] = 7.0
        data.pop("id")
    elif how == "edited":
        data["numbers"]["draft_step"] = 0.001
    elif how == "short-list":
        data["numbers"]["verify"] = data["numbers"]["verify"][:5]
        data.pop("id")
    return json.dumps(data)


@pytest.mark.parametrize("how", ["truncated", "not-json", "other-format", "other-version", "other-pair",
                                 "other-machine", "nan", "out-of-range", "edited", "short-list"])
def test_an_unusable_stored_calibration_is_a_notice_and_a_fresh_one(how, demo_store, tmp_path):
    (good_path,) = demo_store.glob("demo-target*.json")
    good = json.loads(good_path.read_text())
    path = tmp_path / good_path.name
    path.write_text(_damaged(good, how))
    os.environ[calibration.STORE_ENV], saved = str(tmp_path), os.environ[calibration.STORE_ENV]
    try:
        with pytest.warns(CalibrationNotice, match="cannot be used") as notices:
            engine = Engine("demo-target", "demo-draft")
    finally:
        os.environ[calibration.STORE_ENV] = saved
    with engine:
        assert len(notices) == 1 and "\n" not in str(notices[0].message)
        assert engine.calibration is not None and engine.calibration.id != good["id"]
        assert engine.generate("[MAX 1 2 ]", max_tokens=8).calibration == engine.calibration.id
    fresh = calibration.read(path, engine.calibration_pair, engine.calibration_machine)  # rewritten, whole
    assert fresh.id == engine.calibration.id


def test_the_engine_refuses_numbers_out_of_range(demo_engine):
    numbers = dict(demo_engine.calibration.numbers)
    for key, value in (("target_step_ms", -1.0), ("draft_acceptance", 2.0), ("draft_acceptance_sampled", 1.5),
                       ("catch_up", math.inf)):
        with pytest.raises(InvalidArgumentError, match=key):
            demo_engine.set_calibration(calibration.Calibration({**numbers, key: value}, {}, {}))
    with pytest.raises(InvalidArgumentError, match="version"):
        demo_engine.set_calibration(calibration.Calibration({**numbers, "version": numbers["version"] + 1}, {}, {}))
    assert demo_engine.generate("[MAX 1 2 ]", max_tokens=4).calibration == demo_engine.calibration.id


def _writer(path: str, seed: int, rounds: int) -> None:
    base = calibration.read(path)
    for i in range(rounds):
        numbers = {**base.numbers, "draft_step": 0.01 * (1 + (seed * rounds + i) % 50)}
        calibration.write(calibration.Calibration(numbers, base.pair, base.machine, "now", "x"), path)


def test_two_processes_writing_at_once_leave_a_whole_file(demo_store, tmp_path):
    (good_path,) = demo_store.glob("demo-target*.json")
    path = tmp_path / "shared.json"
    path.write_text(good_path.read_text())
    writers = [multiprocessing.Process(target=_writer, args=(str(path), s, 200)) for s in range(2)]
    for w in writers:
        w.start()
    reads = 0
    while any(w.is_alive() for w in writers):
        calibration.read(path)  # never a partial file
        reads += 1
    for w in writers:
        w.join()
        assert w.exitcode == 0
    assert reads > 0
    assert calibration.read(path).numbers["draft_step"] > 0
    assert not list(tmp_path.glob("*.tmp"))


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_costs_timed_on_a_busy_machine_are_used_but_never_stored(tmp_path, monkeypatch):
    """Other work on every core while the costs are timed: they are timed again, and where the
    machine stays busy the engine uses them and stores nothing, saying so in one notice."""
    monkeypatch.setenv(calibration.STORE_ENV, str(tmp_path))
    monkeypatch.setenv(calibration.MAX_LOAD_ENV, "0.05")
    spinners = [multiprocessing.Process(target=_spin, args=(120,)) for _ in range(len(os.sched_getaffinity(0)))]
    for s in spinners:
        s.start()
    try:
        with pytest.warns(CalibrationNotice) as notices:
            engine = Engine("demo-target", "demo-draft", n_threads=1)
    finally:
        for s in spinners:
            s.terminate()
            s.join()
    with engine:
        assert engine.calibration is not None and engine.calibration.busy
        assert engine.calibration.other_load > 0.05
        assert any("not stored" in str(n.message) and "other work took" in str(n.message) for n in notices)
        assert not list(tmp_path.glob("*.json"))
        # timed under the limit, it is stored (a limit the other test worker's load stays under)
        monkeypatch.setenv(calibration.MAX_LOAD_ENV, "1.0")
        quiet = engine.calibrate(["[MAX 1 2 ]"], max_tokens=8)
    assert not quiet.busy and len(list(tmp_path.glob("*.json"))) == 1


def test_the_store_keeps_the_calibrations_used_last_and_clears(demo_store, tmp_path, monkeypatch):
    monkeypatch.setenv(calibration.STORE_ENV, str(tmp_path))
    (good_path,) = demo_store.glob("demo-target*.json")
    base = calibration.read(good_path)
    paths = []
    for i in range(calibration.MAX_STORED + 5):
        path = tmp_path / f"pair-{i}.json"
        calibration.write(calibration.Calibration(base.numbers, base.pair, base.machine, "now"), path)
        os.utime(path, (1000 + i, 1000 + i))  # used in this order
        paths.append(path)
    kept = set(tmp_path.glob("*.json"))
    assert len(kept) == calibration.MAX_STORED and kept == set(paths[5:])  # the five used longest ago went
    calibration.read(paths[5])  # used again: now the newest
    calibration.write(calibration.Calibration(base.numbers, base.pair, base.machine, "now"), tmp_path / "new.json")
    kept = set(tmp_path.glob("*.json"))
    assert len(kept) == calibration.MAX_STORED and {paths[5], tmp_path / "new.json"} <= kept
    assert paths[6] not in kept
    done = run_cli(["calibrate", "--clear"], tmp_path)
    assert done.returncode == 0 and f"removed {calibration.MAX_STORED} stored calibrations" in done.stdout
    assert not list(tmp_path.glob("*.json"))
