"""llama.cpp's own flags and names, as its users type them: loading and cache settings that reach
llama.cpp (read back from its own log), the current --spec-draft-n-* spellings with a minimum
block length in the engine, llama.cpp's n-gram kinds, and Ollama's verbs."""
import re
import subprocess
import sys

import pytest

from cospec_local import Engine
from cospec_local.errors import InvalidArgumentError

CLI = [sys.executable, "-m", "cospec_local.cli"]
PAIR = ["-m", "smollm2-135m", "-md", "smollm2-135m-draft"]
PROMPT = "The three primary colours are red, yellow and blue. The three primary colours are"


def run_cli(*args, timeout=300):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def test_loading_and_cache_flags_reach_llama_cpp():
    out = run_cli("generate", *PAIR, "-p", "Hi", "-n", 4, "-t", 1, "--verbose", "-b", 64, "-ub", 32, "-ctk", "q8_0",
                  "-ctv", "q4_0", "-fa", "on", "-ctkd", "q5_1", "-ctvd", "f32", "--no-mmap", "-dev", "none",
                  "-devd", "none")
    assert out.returncode == 0, out.stderr[-2000:]
    log = out.stderr
    # target, then draft: each context with its batch sizes and cache types
    assert re.findall(r"n_batch\s+= (\d+)", log)[:2] == ["64", "64"]
    assert re.findall(r"n_ubatch\s+= (\d+)", log)[:2] == ["32", "32"]
    caches = re.findall(r"llama_kv_cache: size = .*K \((\w+)\):.*V \((\w+)\)", log)
    assert caches[:2] == [("q8_0", "q4_0"), ("q5_1", "f32")]
    assert log.count("(load_mode = none)") == 2
    out = run_cli("generate", "-m", "smollm2-135m", "-p", "Hi", "-n", 2, "-t", 1, "--verbose", "--mlock")
    assert "(load_mode = mmap+mlock)" in out.stderr


@pytest.mark.parametrize("flags, message", [
    (["-ctk", "q9"], "cache_type_k: 'q9' is not a cache type (f32, f16, bf16, q8_0"),
    (["-ctvd", "int8"], "cache_type_v_draft: 'int8' is not a cache type"),
    (["-dev", "CUDA0"], "devices: no device 'CUDA0' to offload to (this llama.cpp build has none"),
    (["-devd", "Vulkan0"], "devices_draft: no device 'Vulkan0'"),
    (["-lm", "none", "--mlock"], "give -lm/--load-mode or --no-mmap/--mlock, not both"),
    (["--spec-draft-n-min", 9], "'--draft-min' / '--spec-draft-n-min': must be in [0, 8], got 9"),
])
def test_llama_flags_that_cannot_be_honoured_are_one_clear_line(flags, message):
    out = run_cli("generate", *PAIR, "-p", "Hi", "-n", 2, "-t", 1, *flags)
    assert out.returncode != 0 and message in out.stderr and "Traceback" not in out.stderr, out.stderr[-1500:]


def test_the_shortest_block_is_honoured_and_keeps_the_targets_output():
    """--spec-draft-n-min: a block that --draft-p-min cuts below the minimum is not verified.
    With the minimum at K every verified block holds exactly K tokens; without it, some fewer."""
    with Engine("smollm2-135m", "smollm2-135m-draft", n_ctx=512, n_threads=1, calibration=None) as engine:
        base = engine.generate(PROMPT, max_tokens=48, mode="target-only")
        common = dict(max_tokens=48, spec_type="draft", draft_max=4, adaptive_draft=False, draft_p_min=0.1)
        free = engine.generate(PROMPT, **common)
        held = engine.generate(PROMPT, **common, draft_min=4)
        assert free.tokens == base.tokens and held.tokens == base.tokens
        assert free.stats.draft_n < 4 * free.stats.blocks  # the control: p-min does cut blocks short here
        assert held.stats.draft_n == 4 * held.stats.blocks and held.stats.blocks > 0
        assert len(engine.generate(PROMPT, n_predict=3, ignore_eos=True).tokens) == 3  # llama.cpp's name
        with pytest.raises(InvalidArgumentError, match=r"draft_min: must be in \[0, 4\]"):
            engine.generate(PROMPT, max_tokens=4, draft_max=4, draft_min=5)


def test_current_llama_spellings_set_the_same_settings():
    from cospec_local.params import param_flags

    assert "--spec-draft-n-max" in param_flags("draft_max") and "--draft-max" in param_flags("draft_max")
    assert "--spec-draft-n-min" in param_flags("draft_min")
    assert "--spec-draft-p-min" in param_flags("draft_p_min")
    a = run_cli("generate", *PAIR, "-p", PROMPT, "-n", 24, "-t", 1, "--json", "--spec-draft-n-max", 3,
                "--spec-draft-p-min", 0.2, "--spec-draft-n-min", 2, "--fixed-draft")
    b = run_cli("generate", *PAIR, "-p", PROMPT, "-n", 24, "-t", 1, "--json", "--draft-max", 3, "--draft-p-min", 0.2,
                "--draft-min", 2, "--fixed-draft")
    assert a.returncode == 0 and b.returncode == 0, a.stderr[-1500:] + b.stderr[-1500:]
    import json

    ja, jb = json.loads(a.stdout), json.loads(b.stdout)
    assert ja["tokens"] == jb["tokens"] and ja["stats"]["draft_n"] == jb["stats"]["draft_n"] > 0
    # --json says what produced the run: the models, the draft sources asked for, the blocks of each
    assert ja["models"]["target"].endswith(".gguf") and ja["models"]["draft"].endswith(".gguf")
    assert ja["models"]["head"] is None and ja["spec_type"] == "auto" and ja["arbiter"] == "target"
    assert sum(ja["blocks_by_source"].values()) == ja["stats"]["blocks"] > 0


@pytest.mark.parametrize("kind", ["ngram-simple", "ngram-mod", "ngram-map-k", "ngram-map-k4v", "ngram-cache"])
def test_llama_cpp_ngram_kinds_are_the_ngram_drafter_said_once(kind):
    out = run_cli("generate", "-m", "smollm2-135m", "-p", PROMPT, "-n", 16, "-t", 1, "--spec-type", kind,
                  "--no-display-prompt")
    ngram = run_cli("generate", "-m", "smollm2-135m", "-p", PROMPT, "-n", 16, "-t", 1, "--spec-type", "ngram",
                    "--no-display-prompt")
    assert out.returncode == 0, out.stderr[-1500:]
    assert out.stderr.count(f"note: {kind}: llama.cpp's n-gram kind, which this engine's n-gram drafter covers") == 1
    assert out.stdout == ngram.stdout and out.stdout.strip()


def test_ollama_verbs():
    listed = run_cli("list")
    assert listed.returncode == 0 and listed.stdout == run_cli("models").stdout
    answered = run_cli("run", "smollm2-135m", "What is 2+2?", "-n", 20, "-t", 1)
    assert answered.returncode == 0 and "is 4" in answered.stdout, answered.stderr[-1500:]
    assert "What is 2+2?" not in answered.stdout  # an answer, as Ollama prints it
    chatted = subprocess.run([*CLI, "run", "smollm2-135m", "-n", "8", "-t", "1"], input="Hello\n", capture_output=True,
                             text=True, timeout=300)
    assert chatted.returncode == 0 and ">>>" in chatted.stdout
    ps = run_cli("ps")
    assert ps.returncode != 0 and "no command 'ps' here" in ps.stderr
