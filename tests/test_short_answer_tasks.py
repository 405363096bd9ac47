"""The built-in short-answer families and the general training mix: splits by item, wordings and
formats, scoring on the first line, and the chat format through the real target's template."""
from __future__ import annotations

import re

import pytest

from cospec_local.evaluation.task_eval import task_prompt
from cospec_local.tasks import FAMILY_STOPS, GENERAL_MIX, MIX, TASKS, expand_tasks, load_task, score
from cospec_local.tasks.short_answer import FAMILIES, FORMATS, ShortAnswer, number_pattern, word_pattern
from cospec_local.train.arbiter_recipe import RecipeSettings, available_problems, setting_default

NAMES = [f.name for f in FAMILIES]


@pytest.mark.parametrize("name", NAMES)
def test_every_problem_is_answered_by_its_solution_and_items_never_cross_splits(name):
    family = TASKS[name]
    by_split = {split: family.generate(split, 120) for split in ("train", "dev", "test")}
    for split, problems in by_split.items():
        assert problems, split
        assert len({(p.meta["format"], p.prompt) for p in problems}) == len(problems)  # distinct problems
        for p in problems:
            assert score(p, p.solution) and score(p, f"  {p.solution}\nmore text")
            assert not score(p, f"I do not know.\n{p.solution}")  # the first line is what counts
            assert p.meta["format"] in FORMATS and (p.meta["format"] != "qa" or p.prompt.startswith("Question: "))
    items = {split: {p.meta["item"] for p in ps} for split, ps in by_split.items()}
    assert not (items["train"] & items["test"]) and not (items["train"] & items["dev"]) and not (items["dev"] & items["test"])
    # Deterministic, and a longer draw extends a shorter one.
    again = family.generate("train", 60)
    assert [p.prompt for p in again] == [p.prompt for p in by_split["train"][:60]]


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.table is not None], ids=lambda f: f.name)
def test_no_wording_says_its_own_answer_and_a_table_split_holds_its_capacity(family):
    for x in family.items:
        for w in family.wordings:
            assert not re.search(word_pattern(family.table.items[x], family.table.case_sensitive), w.format(x=x))
    left_out = set(family.table.items) - set(family.items)
    assert all(any(re.search(word_pattern(family.table.items[x], family.table.case_sensitive), w.format(x=x))
                   for w in family.wordings) for x in left_out)
    room = family.capacity("test")
    assert len(family.generate("test", 10 ** 6)) == room > 0


def test_numbers_are_the_last_number_of_the_first_line():
    assert re.search(number_pattern(4021), "It is 4,021.") and re.search(number_pattern(4021), "4021")
    assert not re.search(number_pattern(4021), "4021 or maybe 4022")
    assert not re.search(number_pattern(21), "4021") and not re.search(number_pattern(40), "40.5")
    assert re.search(word_pattern("Fe", case_sensitive=True), "The symbol is Fe.")
    assert not re.search(word_pattern("Fe", case_sensitive=True), "fe") and re.search(word_pattern("kitten"), "A Kitten!")


def test_all_three_formats_are_drawn_and_can_be_narrowed():
    problems = load_task("past-tense", "train", 300)
    assert {p.meta["format"] for p in problems} == set(FORMATS)
    assert {p.meta["wording"] for p in problems} == set(range(len(TASKS["past-tense"].wordings)))
    qa_only = TASKS["past-tense"].generate("train", 20, {"formats": ["qa"]})
    assert {p.meta["format"] for p in qa_only} == {"qa"}
    assert not any(name in FAMILY_STOPS for name in NAMES)  # a raw reply may open with a blank line


def test_a_chat_format_problem_goes_through_the_targets_template(engine):
    chat = next(p for p in load_task("counts", "train", 50) if p.meta["format"] == "chat")
    raw = next(p for p in load_task("counts", "train", 50) if p.meta["format"] == "raw")
    tokens, stops = task_prompt(engine, chat, as_chat=False)
    assert tokens == engine.render_chat([{"role": "user", "content": chat.prompt}]) and stops == ()
    tokens, stops = task_prompt(engine, raw, as_chat=False)
    assert tokens == engine.tokenize(raw.prompt) and stops == ()
    # A real generation is scored on its first line.
    reply = engine.generate(tokens, max_tokens=16, stop=list(stops)).text
    assert score(raw, reply) == bool(re.search(raw.answer, reply.lstrip().split("\n")[0]))


def test_the_general_mix_is_the_default_and_takes_a_users_file_beside_it(tmp_path):
    assert setting_default("tasks") == (MIX,)
    settings = RecipeSettings(name="x")
    assert settings.tasks == GENERAL_MIX and "listops" not in settings.tasks
    assert not {"capitals", "antonyms", "plurals"} & set(settings.tasks)
    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"prompt": "What is 2 + 2?", "answer": "4"}\n')
    assert expand_tasks([MIX, str(mine), "arith"]) == (*GENERAL_MIX, str(mine))
    sizes = available_problems(RecipeSettings(name="x", tasks=("continents", "arith")))
    assert sizes["test"][0] == TASKS["continents"].capacity("test") and sizes["test"][1] is None
    assert all(isinstance(TASKS[n], ShortAnswer) for n in GENERAL_MIX[:len(FAMILIES)])
