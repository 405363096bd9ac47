"""Short-answer task families: facts, words and numbers, each question asked in one of several
wordings and one of three formats, scored on the reply's first line.

An arbiter meant for tasks it never saw learns how the two models disagree, not one task's phrasing:
so each problem is drawn as (item, wording, format), where the formats are

- "raw": the question as it is (a base model continues it);
- "qa": "Question: ...\\nAnswer:" (how a base model is asked a short question);
- "chat": the question as the user's message in the target's chat template (Problem.meta
  "format"; evaluation.task_prompt renders it).

A reply scores where its first line holds an accepted answer as a word (any case; element symbols
in their case), or, for numbers, where the last number of its first line is the answer: a base
model's " Lima" and an instruction model's "The capital of Peru is Lima." count alike. No wording
may hold an accepted answer itself (a reply that repeats the question would score): such items are
left out of that family. All wordings of one item share a split (the split key is the item), so a
test item is never trained on in another wording.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from . import short_answer_tables as tables
from .base import Problem, TaskFamily, split_of

FORMATS = ("raw", "qa", "chat")
# How a base model is asked a short question (the domain gate renders prompts in it too).
QA_FORMAT = "Question: {}\nAnswer:"
# What a reply is scored on: its first non-empty line.
_FIRST_LINE = re.compile(r"\A\s*([^\n]*)")


def word_pattern(alternatives: str, case_sensitive: bool = False) -> str:
    """Any of the |-separated forms as a whole word (regex source, searched in the first line)."""
    forms = "|".join(re.escape(a) for a in alternatives.split("|"))
    return ("" if case_sensitive else "(?i)") + rf"(?<![\w])(?:{forms})(?![\w])"


def number_pattern(n: int) -> str:
    """n as the last number of the line (regex source; "4,021" counts as 4021)."""
    digits = str(n)
    if len(digits) > 3:
        digits = digits[:-3] + ",?" + digits[-3:]
    return rf"(?<![\d.,]){digits}(?![\d])(?![^\n]*\d)"


def first_line(completion: str) -> str:
    return _FIRST_LINE.match(completion).group(1)


@dataclass(frozen=True)
class Table:
    """One family's questions: each item's accepted answers, and the wordings ({x}: the item)."""

    items: dict[str, str]
    wordings: tuple[str, ...]
    case_sensitive: bool = False


class ShortAnswer(TaskFamily):
    """A family of (item, wording, format) problems drawn from a fixed table of items, or from a
    generator of numeric items (subclasses override `item`)."""

    kind = ""  # facts, words or numbers
    numeric = False
    optional_difficulty = frozenset({"formats"})

    def __init__(self, name: str, kind: str, table: Table | None = None, wordings: tuple[str, ...] = (),
                 numeric: bool | None = None):
        self.name, self.kind, self.table = name, kind, table
        if numeric is not None:
            self.numeric = numeric
        self.wordings = table.wordings if table is not None else wordings
        if table is not None:
            # Items whose answer a wording already says are left out (see the module's note).
            self.items = sorted(x for x, a in table.items.items()
                                if not any(re.search(word_pattern(a, table.case_sensitive), w.format(x=x))
                                           for w in self.wordings))
            if not self.items:
                raise ValueError(f"{name}: every item's answer is in its wordings")

    def capacity(self, split: str, difficulty: dict | None = None) -> int | None:
        """A table's items of `split`, each in every wording and format (a generator's: None)."""
        if self.table is None:
            return None
        formats = self.difficulty(difficulty).get("formats", FORMATS)
        return sum(split_of(f"{self.name}:{x}") == split for x in self.items) * len(self.wordings) * len(formats)

    def generate(self, split: str, n: int, difficulty: dict | None = None, *, distinct: bool = True) -> list[Problem]:
        """Up to n problems of `split`: a table's split holds capacity() of them."""
        room = self.capacity(split, difficulty)
        return super().generate(split, n if room is None else min(n, room), difficulty, distinct=distinct)

    def item(self, rng: random.Random, difficulty: dict) -> tuple[str, str]:
        """(the item as the wordings show it, its accepted answers)."""
        x = rng.choice(self.items)
        return x, self.table.items[x]

    def make(self, rng: random.Random, difficulty: dict) -> Problem:
        x, answers = self.item(rng, difficulty)
        k = rng.randrange(len(self.wordings))
        fmt = rng.choice(tuple(difficulty.get("formats", FORMATS)))
        question = self.wordings[k].format(x=x)
        prompt = QA_FORMAT.format(question) if fmt == "qa" else question
        pattern = number_pattern(int(answers)) if self.numeric else \
            word_pattern(answers, self.table is not None and self.table.case_sensitive)
        first = answers.split("|")[0]
        return Problem("", self.name, prompt, pattern, first,
                       {"item": x, "wording": k, "format": fmt, "kind": self.kind, "answers": answers})

    def split_key(self, problem: Problem) -> str:
        return f"{self.name}:{problem.meta['item']}"

    def distinct_key(self, problem: Problem) -> str:
        # An item comes back in other wordings and formats: each is a problem of its own.
        return f"{problem.meta['format']}:{problem.prompt}"

    def score(self, problem: Problem, completion: str) -> bool:
        return re.search(problem.answer, first_line(completion)) is not None


def bare_question(problem: Problem) -> str:
    """A problem's question without its drawn format (a short-answer family's; any other prompt as it is)."""
    prefix, suffix = QA_FORMAT.split("{}")
    if problem.meta.get("format") == "qa" and problem.prompt.startswith(prefix) and problem.prompt.endswith(suffix):
        return problem.prompt[len(prefix):len(problem.prompt) - len(suffix)]
    return problem.prompt


class NumberWords(ShortAnswer):
    numeric = True

    def item(self, rng, difficulty):
        n = rng.choice((rng.randint(11, 99), rng.randint(100, 999), rng.randint(1000, 9999)))
        return tables.number_words(n), str(n)


class Multiplication(ShortAnswer):
    numeric = True

    def item(self, rng, difficulty):
        a, b = rng.randint(3, 12), rng.randint(3, 25)
        return f"{a} {rng.choice(('times', 'multiplied by'))} {b}", str(a * b)


class NextInSequence(ShortAnswer):
    numeric = True

    def item(self, rng, difficulty):
        start, step, n = rng.randint(1, 30), rng.randint(2, 12), rng.randint(4, 5)
        terms = [start + i * step for i in range(n)]
        return ", ".join(map(str, terms)), str(start + n * step)


FAMILIES: tuple[ShortAnswer, ...] = (
    ShortAnswer("continents", "facts", Table(tables.CONTINENTS, (
        "Which continent is {x} in?",
        "On which continent would you find {x}?",
        "{x} is a country on which continent?",
        "Name the continent where {x} lies.",
        "I'm making a map quiz. What continent is {x} on? Answer in one word or two.",
    ))),
    ShortAnswer("element-symbols", "facts", Table(tables.ELEMENT_SYMBOLS, (
        "What is the chemical symbol for {x}?",
        "Give the symbol of the element {x}.",
        "In the periodic table, which symbol stands for {x}?",
        "Write the chemical symbol of {x}, nothing else.",
        "My chemistry homework asks for the symbol of {x}. What is it?",
    ), case_sensitive=True)),
    ShortAnswer("animal-young", "facts", Table(tables.ANIMAL_YOUNG, (
        "What is a baby {x} called?",
        "What do you call the young of the {x}?",
        "A young {x} is known as a what?",
        "Name the word for a baby {x}.",
        "My daughter asked me what a baby {x} is called. Do you know?",
    ))),
    ShortAnswer("currencies", "facts", Table(tables.CURRENCIES, (
        "What is the currency of {x}?",
        "Which currency do people use in {x}?",
        "Name the money used in {x}.",
        "I'm travelling to {x} next month. What currency will I need?",
        "What currency is used in {x}? Just the name, please.",
    ))),
    ShortAnswer("past-tense", "words", Table(tables.PAST_TENSES, (
        'What is the past tense of "{x}"?',
        'Give the simple past form of the verb "{x}".',
        'Complete: Today I {x}; yesterday I ____.',
        'How do you say "{x}" in the past tense?',
        'Write the past simple of "{x}". One word only.',
    ))),
    ShortAnswer("comparatives", "words", Table(tables.COMPARATIVES, (
        'What is the comparative form of "{x}"?',
        'Fill in the blank: "{x}", ____, and then the superlative.',
        'How would you say "more {x}" correctly in English?',
        'Give the comparative of the adjective "{x}".',
        'Write the comparative of "{x}" and nothing else.',
    ))),
    ShortAnswer("ing-forms", "words", Table(tables.ING_FORMS, (
        'What is the -ing form of "{x}"?',
        'Write the present participle of the verb "{x}".',
        'How do you spell "{x}" with -ing added?',
        'Complete: I like to {x}. Right now I am ____.',
        'Add -ing to "{x}" and spell the result correctly.',
    ))),
    ShortAnswer("feminine-forms", "words", Table(tables.FEMININE_FORMS, (
        'What is the feminine form of "{x}"?',
        'What is the female equivalent of "{x}"?',
        'Which word names the female counterpart of "{x}"?',
        'If a man or male animal is called "{x}", what is the female called?',
        'Feminine of "{x}"? One word, please.',
    ))),
    NumberWords("number-words", "numbers", wordings=(
        'Write "{x}" as a number in digits.',
        "What is {x} in figures?",
        "Convert the words {x} into digits.",
        "How is {x} written with numerals?",
        "Someone wrote the amount as {x}. What is it in digits?",
    )),
    Multiplication("multiplication", "numbers", wordings=(
        "What is {x}?",
        "Calculate {x}.",
        "Quick maths: {x} equals what?",
        "Work out {x} and give just the number.",
        "My calculator is broken. What is {x}?",
    )),
    NextInSequence("next-in-sequence", "numbers", wordings=(
        "What number comes next: {x}, ...?",
        "Continue the sequence with the next number: {x}",
        "Find the next term of the sequence {x}.",
        "Here is a pattern: {x}. What is the next number?",
        "Which number follows in {x}? Give only the number.",
    )),
    ShortAnswer("counts", "numbers", Table(tables.COUNTS, (
        "How many {x}?",
        "Can you tell me: how many {x}?",
        "Quiz question: how many {x}?",
        "Do you know how many {x}? Give the number.",
        "Quick one: how many {x}? Answer with a number.",
    )), numeric=True),
)
