"""The chat REPL as a llama.cpp or Ollama user meets it: fresh seeds, both spellings of a setting,
plain-word errors, what /show says, a malformed /load, and the note when the draft is all but off."""
from __future__ import annotations

import io
import json
import os
import sys

import pytest
import pexpect

from cospec_local import Engine
from cospec_local.chat.session import ChatSession
from cospec_local.params import CHAT_SAMPLING, GenerationParams

CLI = [sys.executable, "-m", "cospec_local.cli"]
QUESTION = "Tom has 3 apples and buys 4 more. How many apples does Tom have now?"


def session_on_demo(lines, seed_fixed=True, **settings):
    feed = iter(lines)

    def read_line(prompt):
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None

    out = io.StringIO()
    engine = Engine("demo-target", "demo-draft", n_ctx=1024, n_threads=1)
    session = ChatSession(engine, GenerationParams(**{**CHAT_SAMPLING, "max_tokens": 40, **settings}),
                          read_line=read_line, out=out, seed_fixed=seed_fixed)
    return engine, session, out


def replies(text: str) -> list[str]:
    """The reply texts of a session's output (each ends before its stats line)."""
    out, current = [], []
    for line in text.splitlines():
        if line.startswith("[") and "tok/s" in line:
            out.append("\n".join(current).strip())
            current = []
        elif not line.startswith(("(", "Type a message")):
            current.append(line)
    return out


def test_a_seed_nobody_set_is_new_for_each_reply(monkeypatch):
    import cospec_local.chat.session as chat_session

    drawn = []

    def recorded_seed() -> int:
        drawn.append(real_seed())
        return drawn[-1]

    real_seed = chat_session.random_seed
    monkeypatch.setattr(chat_session, "random_seed", recorded_seed)
    engine, session, out = session_on_demo([QUESTION, "/clear", QUESTION, "/clear", QUESTION, "/show"],
                                           seed_fixed=False, temperature=1.5)
    with engine:
        session.run()
    text = out.getvalue()
    assert len(drawn) == 3 and len(set(drawn)) == 3  # a fresh seed for each reply
    assert f"seed = random (the last reply's: {drawn[-1]}; " in text
    # and a fresh seed gives a fresh sample: these three seeds' replies differ (fixed here, so the
    # check cannot fail by the chance of three random draws sampling the same reply)
    seeds = iter([1, 2, 3, 4, 5])
    monkeypatch.setattr(chat_session, "random_seed", lambda: next(seeds))
    engine, session, out = session_on_demo([QUESTION, "/clear", QUESTION, "/clear", QUESTION, "/clear", QUESTION,
                                            "/clear", QUESTION], seed_fixed=False, temperature=1.5)
    with engine:
        session.run()
    assert len(set(replies(out.getvalue()))) > 1
    engine, session, out = session_on_demo([QUESTION, "/clear", QUESTION, "/clear", QUESTION], seed_fixed=True,
                                           temperature=1.5, seed=7)
    with engine:
        session.run()
    assert len(set(replies(out.getvalue()))) == 1  # a seed set by the user repeats the reply exactly


def test_settings_take_both_spellings_and_bad_values_say_why():
    engine, session, out = session_on_demo(["/set temperature 0.5", "/set top_k 30", "/set top-p 0.9",
                                            "/set temp abc", "/set top-k 1.5", "/set adaptive-draft maybe",
                                            "/set arbiter nonsense", "/set seed 12", "/set seed random",
                                            "/set parameter num_predict 33", "/set parameter repeat_penalty 1.1",
                                            "/set parameter num_ctx 4096"])
    with engine:
        session.run()
    text = out.getvalue()
    assert session.settings.temperature == 0.5 and session.settings.top_k == 30 and session.settings.top_p == 0.9
    assert "temp: 'abc' is not a number" in text and "top-k: '1.5' is not a whole number" in text
    assert "adaptive-draft: 'maybe' is not on or off" in text
    assert "could not convert" not in text and "invalid literal" not in text
    assert "arbiter: no arbiter 'nonsense'" in text and "demo-lora" in text
    assert "auto, target, fly" in text and "smollm2-arith" not in text  # the names that fit this draft
    assert "(seed set)" in text and "(seed set: a new one each reply)" in text and not session.seed_fixed
    # Ollama's spelling
    assert session.settings.max_tokens == 33 and session.settings.repeat_penalty == 1.1
    assert "the context is fixed when the models load: start again with -c N" in text


def test_show_names_model_sizes_and_a_threshold_only_where_there_is_one(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"turns": []}))
    engine, session, out = session_on_demo(["/show", "/set arbiter fly", "/show", f"/load {bad}"],
                                           arbiter="demo-lora")
    with engine:
        session.run()
    text = out.getvalue()
    assert "(llama, 4 layers" in text and "Q8_0)" in text and "?B" not in text
    shows = text.split("  target: ")
    assert "keeps at P >= 0.560" in shows[1] and "keeps at P" not in shows[2]
    assert "arbiter: demo-lora (demo-lora, keeps" in shows[1]  # the name replies' stats give, not its file's
    assert "is not a saved conversation (it holds no list of messages)" in text and "KeyError" not in text


@pytest.mark.slow
def test_the_draft_all_but_off_is_said_once_in_plain_words():
    """SmolLM2 with a draft that disagrees: the tuner stops drafting, and chat says why once. Three
    replies: the first times the draft's blocks and may draft too much to be called off."""
    env = dict(os.environ, TERM="dumb", PYTHONUNBUFFERED="1")
    child = pexpect.spawn(sys.executable, [*CLI[1:], "chat", "-m", "smollm2-135m", "-md", "smollm2-135m-first4",
                                           "-n", "64", "-t", "1", "--temp", "0", "--spec-type", "draft"], env=env, encoding="utf-8",
                          timeout=300)
    child.expect_exact(">>> ")
    notes = 0
    for question in ("Tell me about the sea.", "Tell me about the moon.", "Tell me about the sun."):
        child.sendline(question)
        index = child.expect([r"draft agrees with the target too rarely", r">>> "])
        if index == 0:
            notes += 1
            child.expect_exact(">>> ")
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    assert notes == 1


def run_cli(*args):
    import subprocess

    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=600)


def test_a_bad_target_or_arbiter_is_the_first_thing_said(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    for target, why in ((bad, "not a GGUF file"), (tmp_path / "missing.gguf", "file not found")):
        out = run_cli("generate", "-m", target, "-p", "Hi")
        assert out.returncode == 1 and why in out.stderr
        assert "decoding with the target alone" not in out.stderr and "note:" not in out.stderr
    out = run_cli("generate", "-m", "smollm2-135m", "-md", "smollm2-135m-first4", "--arbiter", "demo-lora",
                  "-p", "Hello there")
    assert out.returncode == 1 and "made for another draft model" in out.stderr
    assert "\nfix: --arbiter auto, target, fly, aasd (those fit this draft)" in out.stderr
    assert "Hello there" not in out.stdout  # the prompt is not echoed before the error
    out = run_cli("chat", "--help")
    help_text = " ".join(out.stdout.split())  # click wraps the help
    assert "--seed INTEGER RANGE Seed of sampling and of sampled arbiter decisions. Default: a fresh one for each " \
           "reply (/show gives it). [0<=x<=18446744073709551615]" in help_text


def test_generate_reads_its_prompt_from_a_file_or_standard_input(tmp_path):
    import subprocess

    prompt = "Mei has 94 stamps. Then Mei buys 84 more stamps. How many stamps does Mei have now?"
    (tmp_path / "prompt.txt").write_text(prompt)
    given = run_cli("generate", "-p", prompt, "-n", 16, "--json")
    from_file = run_cli("generate", "-f", tmp_path / "prompt.txt", "-n", 16, "--json")
    from_stdin = subprocess.run([*CLI, "generate", "-n", "16", "--json"], input=prompt, capture_output=True, text=True,
                                timeout=600)
    assert given.returncode == from_file.returncode == from_stdin.returncode == 0, from_stdin.stderr
    tokens = json.loads(given.stdout)["tokens"]
    assert json.loads(from_file.stdout)["tokens"] == tokens == json.loads(from_stdin.stdout)["tokens"]
    both = run_cli("generate", "-p", prompt, "-f", tmp_path / "prompt.txt")
    assert both.returncode == 2 and "give the prompt once" in both.stderr
    empty = subprocess.run([*CLI, "generate"], input="", capture_output=True, text=True, timeout=600)
    assert empty.returncode == 2 and "the prompt is empty" in empty.stderr


def test_the_demo_banner_shows_a_question_of_each_kind_that_the_demo_pair_answers():
    """The banner's examples are in the wording the demo models learned: typed into chat as shown
    (the function as multi-line input), the arithmetic gets its answer and the function its body."""
    from cospec_local.cli import chat_banner
    from cospec_local.models import TASK_PAIR_EXAMPLES
    from cospec_local.tasks import final_answer

    arithmetic, function = TASK_PAIR_EXAMPLES
    banner = chat_banner("demo-target", None)
    assert arithmetic in banner and function in banner and "For general chat" in banner
    engine, session, out = session_on_demo([arithmetic, *function.split("\n")], temperature=0.0, max_tokens=96)
    with engine:
        session.run()
    sum_reply, function_reply = replies(out.getvalue())
    assert final_answer(sum_reply) == "36", sum_reply
    assert "return" in function_reply and "[::3]" in function_reply.replace(" ", ""), function_reply
    assert session.messages[-2]["content"] == function.replace("\\\n", "\n")  # read as the family writes it
