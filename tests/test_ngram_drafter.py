"""The n-gram drafter (native/src/ngram_drafter.cpp): its proposals on crafted token sequences,
checked by hand, then in the engine: lossless on the grounded prompts, apart in the stats and
provenance, and refused where it cannot serve."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cospec_local import Engine, _cospec
from cospec_local.errors import InvalidArgumentError
from cospec_local.models import resolve_model

REPO = Path(__file__).resolve().parents[1]
GROUNDED = [json.loads(line) for line in (REPO / "bench" / "grounded_prompts.jsonl").read_text().splitlines()]
CLI = [sys.executable, "-m", "cospec_local.cli"]


def drafter(*texts: list[int]) -> _cospec.NgramDrafter:
    d = _cospec.NgramDrafter()
    for text in texts:
        d.begin(text)
    return d


def test_the_continuation_of_the_earlier_match_is_proposed():
    # ... 5 6 | 7 8 9 ... 5 6 -> 7 8 9, and on past the end of that occurrence into what followed it
    d = drafter([1, 2, 5, 6, 7, 8, 9, 3, 4, 5, 6])
    assert d.propose(3) == [7, 8, 9]
    assert d.propose(5) == [7, 8, 9, 3, 4]


def test_nothing_is_proposed_without_an_earlier_match_nor_past_the_text():
    assert drafter([1, 2, 3, 4, 5]).propose(8) == []  # no n-gram occurs twice
    assert drafter([]).propose(8) == []
    # the end "4 5" occurred before, but only as the text's own end: nothing followed it
    assert drafter([9, 4, 5]).propose(8) == []
    # a one-token match is not enough (the first token needs two)
    assert drafter([7, 1, 8, 2, 1]).propose(4) == []


def test_the_longest_match_wins_over_a_more_recent_shorter_one():
    # "3 4" is followed by 10 in the long match (5 3 4) and by 20 most recently (6 3 4)
    d = drafter([5, 3, 4, 10, 11, 6, 3, 4, 20, 21, 5, 3, 4])
    assert d.propose(2) == [10, 11]


def test_a_split_vote_stops_the_proposal():
    # "1 2" was followed by 3 once and by 4 once, with equal matches: no majority, no proposal
    assert drafter([1, 2, 3, 9, 1, 2, 4, 8, 1, 2]).propose(4) == []


def test_a_refused_continuation_is_not_proposed_again_and_an_accepted_one_gains():
    d = drafter([1, 2, 3, 9, 5, 1, 2, 3])
    assert d.propose(1) == [9]  # a three-token match
    d.feedback(0)  # the target refused it
    assert d.propose(1) == []
    e = drafter([1, 2, 3, 9, 5, 1, 2, 4, 7, 1, 2, 3, 9, 6, 1, 2])
    assert e.propose(1) == [3]  # "1 2" -> 3 twice, -> 4 once
    e.feedback(0)
    assert e.propose(1) == [4]  # refused: 3's votes weigh a third, and the other continuation leads


def test_the_pool_lives_across_generations_and_a_chat_continues_its_text():
    d = drafter([10, 11, 12, 13, 14, 15])
    d.begin([1, 2, 10, 11])  # another text: the first one stays searchable
    assert d.propose(3) == [12, 13, 14]
    before = d.pool_size
    d.begin([1, 2, 10, 11, 12, 50])  # the next turn extends the current text: only the new tokens join
    assert d.pool_size == before + 2
    d.clear()
    assert d.pool_size == 0 and d.propose(3) == []
