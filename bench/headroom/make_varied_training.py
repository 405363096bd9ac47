"""Writes a learned arbiter's training prompts in several wordings: bench/headroom/tasks/
{capitals,antonyms,plurals}-train-varied.jsonl from the matching *-train.jsonl files.

The train files ask every question in one fixed wording ("What is the capital of X?"). An arbiter
trained only on that wording may learn the phrasing rather than the task. So each problem is kept
as it is and asked once more in one of 8 other wordings per task (round-robin by problem index):
other questions, imperatives, fill-in-the-blank, a short context sentence before, an instruction
(such as a requested format) after. The item (the place, or the quoted word with its quotes) is
kept verbatim; the answer and match fields are unchanged.

Rows: for each original problem, the original row (id unchanged), then the re-asked one (id with
"-v{k}" appended, k the wording's number, 1 to 8). As in make_tasks.py, no prompt may hold an
accepted answer as a word (a reply that only repeats the prompt would score): every wording is
checked against every item, and the script fails if one does, or if an item can't be extracted.
Deterministic; run again to rewrite.

    python bench/headroom/make_varied_training.py
"""
from __future__ import annotations

import json
import re
from pathlib import Path

TASKS = Path(__file__).resolve().parent / "tasks"

# How each original prompt reads; group 1 is the item, used verbatim in the wordings.
ORIGINAL = {
    "capitals": re.compile(r"What is the capital of (.+)\?"),
    "antonyms": re.compile(r'What is the opposite of the word ("[^"]+")\?'),
    "plurals": re.compile(r'What is the plural of the word ("[^"]+")\?'),
}

# 8 wordings per task; {x} is the item. Capital items include "the US state of Ohio", so the
# capital wordings say neither "country" nor use a possessive.
WORDINGS = {
    "capitals": [
        "Which city is the capital of {x}?",
        "Name the city that is the capital of {x}.",
        "Fill in the blank: The capital of {x} is ____.",
        "I'm studying for a geography quiz. What city is the capital of {x}?",
        "What's the capital of {x}? Reply with just the city name.",
        "Tell me the capital of {x}, please.",
        "My partner and I are planning a trip. Do you know what the capital of {x} is?",
        "Capital of {x}? Keep it brief, a single line.",
    ],
    "antonyms": [
        "What is the antonym of {x}?",
        "Give me a word that means the opposite of {x}.",
        "Fill in the blank: The opposite of {x} is ____.",
        "I'm helping my kid with an English worksheet. What's the opposite of {x}?",
        "Which word is opposite in meaning to {x}? Reply with a single word.",
        "Tell me the antonym of the word {x}.",
        "Here's a vocabulary puzzle. Which word has the opposite meaning to {x}?",
        "{x} - what's its opposite? Respond with one word only.",
    ],
    "plurals": [
        "What's the plural form of {x}?",
        "Write the plural of {x}.",
        "Complete this: the plural form of {x} is ____.",
        "I'm learning English grammar. How do you say {x} in the plural?",
        "How do you spell the plural of {x}? Just give the word, nothing else.",
        "Give me the plural form of the noun {x}.",
        "I always get irregular nouns mixed up. What's the plural of {x}?",
        "Pluralize {x}. Reply with only the plural form.",
    ],
}

# make_tasks.word_regex's prefix, which anchors the answer to the reply's first line; without it
# the regex finds an accepted answer as a word anywhere (make_tasks.echoes does the same).
FIRST_LINE = r"\A\s*[^\n]*?"


def echoes(prompt: str, answer_regex: str) -> bool:
    """Whether the prompt itself holds an accepted answer as a word (make_tasks.echoes' logic)."""
    if FIRST_LINE not in answer_regex:
        raise ValueError(f"answer regex not in make_tasks.word_regex's form: {answer_regex!r}")
    return re.search(answer_regex.replace(FIRST_LINE, ""), prompt) is not None


def item_of(task: str, row: dict) -> str:
    m = ORIGINAL[task].fullmatch(row["prompt"])
    if m is None:
        raise ValueError(f"{task}: can't extract the item from {row['id']}: {row['prompt']!r}")
    return m.group(1)


def varied(task: str, rows: list[dict]) -> list[dict]:
    wordings = WORDINGS[task]
    if len(wordings) != 8 or len(set(wordings)) != 8:
        raise ValueError(f"{task}: need 8 distinct wordings")
    out = []
    for i, row in enumerate(rows):
        if row.get("match") != "regex":
            raise ValueError(f"{task}: {row['id']}: match is not regex")
        item = item_of(task, row)
        prompts = [w.format(x=item) for w in wordings]
        for k, prompt in enumerate(prompts, 1):
            if item not in prompt:
                raise ValueError(f"{task}: wording {k} loses the item {item!r}: {prompt!r}")
            if echoes(prompt, row["answer"]):
                raise ValueError(f"{task}: wording {k} holds an accepted answer for {row['id']}: {prompt!r}")
        k = i % len(wordings) + 1
        out.append(row)
        out.append({**row, "id": f"{row['id']}-v{k}", "prompt": prompts[k - 1]})
    return out


def main() -> None:
    counts = []
    for task in WORDINGS:
        src = TASKS / f"{task}-train.jsonl"
        rows = [json.loads(line) for line in src.read_text(encoding="utf-8").splitlines() if line.strip()]
        out = varied(task, rows)
        assert len(out) == 2 * len(rows)
        with open(TASKS / f"{task}-train-varied.jsonl", "w", encoding="utf-8") as f:
            for row in out:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        counts.append(f"{task}: {len(rows)} -> {len(out)}")
    print(", ".join(counts))


if __name__ == "__main__":
    main()
