"""The text bridge between two vocabularies (native/src/text_bridge.cpp), on the real pair of
another family: Gemma 3 270M and SmolLM2-135M, each way. The reply the target writes is read by
the draft in its own tokens, and the draft's proposals come back as target tokens that continue
the reply where its text ends: spaces, newlines, UTF-8 split across tokens, a word cut in two."""
from __future__ import annotations

import pytest

from cospec_local import _cospec_internals
from cospec_local.models import resolve_model

TEXTS = ["The café in 中文 is   nice.\n\nYes! 🙂 done", "def f(x):\n    return x * 2  # twice\n",
         "ꙮ𝔘 rare characters, byte by byte", "  leading spaces\tand a tab"]


@pytest.fixture(scope="module", params=["gemma3-target", "smollm2-target"])
def bridge(request) -> _cospec_internals.TextBridge:
    gemma, smollm2 = str(resolve_model("gemma3-270m")), str(resolve_model("smollm2-135m"))
    return _cospec_internals.TextBridge(gemma, smollm2) if request.param == "gemma3-target" else _cospec_internals.TextBridge(smollm2, gemma)


def target_tokens(bridge, text: str) -> list[int]:
    return bridge.encode(text.encode(), True)


def test_the_pair_writes_each_others_texts(bridge):
    assert bridge.round_trip() == (True, "")


@pytest.mark.parametrize("text", TEXTS)
def test_the_draft_reads_the_reply_as_its_own_tokenizer_writes_it(bridge, text):
    bridge.begin([1, 2, 3])  # the draft's own prompt comes first, untouched
    for token in target_tokens(bridge, text):
        bridge.append_target(token)
        seen = bridge.draft_tokens()  # read after every token: the look-behind re-encodes the end
    assert seen[:3] == [1, 2, 3]
    assert seen[3:] == bridge.encode(text.encode(), False)
    assert bridge.reply == text.encode()


def test_an_incomplete_character_is_held_back_from_the_draft(bridge):
    # "ꙮ" is three byte tokens in both vocabularies (SmolLM2's first one holds the space before
    # it): after its first byte the draft reads up to it
    tokens = target_tokens(bridge, "ok ꙮ")
    assert [bridge.text([t], True) for t in tokens[-2:]] == [b"\x99", b"\xae"]
    assert bridge.text(tokens[-3:-2], True).endswith(b"\xea")
    bridge.begin([])
    for token in tokens[:-2]:
        bridge.append_target(token)
    assert bridge.text(bridge.draft_tokens(), False) == b"ok "
    assert _cospec_internals.utf8_complete_end(b"ok \xea") == 3 and _cospec_internals.utf8_complete_end("ok ꙮ".encode()) == 6
    # a proposal must begin with the held bytes; the rest continues the reply
    assert bridge.to_target(bridge.encode("ꙮ and on".encode(), False)) == \
        target_tokens(bridge, "ok ꙮ and on")[len(tokens) - 2:]
    assert bridge.to_target(bridge.encode(" other".encode(), False)) == []  # it parts from the held byte


def test_a_proposal_continues_a_word_cut_in_two(bridge):
    bridge.begin([])
    for token in target_tokens(bridge, "Hello wor"):
        bridge.append_target(token)
    assert bridge.text(bridge.draft_tokens(), False) == b"Hello wor"
    out = bridge.to_target(bridge.encode(b"ld is round", False))
    assert bridge.text(out, True) == b"ld is round"


def test_a_proposal_merges_with_the_replys_end_as_the_target_would(bridge):
    # the reply ends in a space-less word; the proposal's first token is its target token after it
    text = "Speculative decoding is fast. It checks"
    bridge.begin([])
    for token in target_tokens(bridge, text):
        bridge.append_target(token)
    bridge.draft_tokens()
    out = bridge.to_target(bridge.encode(b" a block of tokens at once.", False))
    assert out == target_tokens(bridge, text + " a block of tokens at once.")[len(target_tokens(bridge, text)):]
