"""Writes reworded copies of the headroom test sets (capitals, antonyms, plurals) to
bench/headroom/tasks/<kind>-reworded-test.jsonl.

Why: every prompt in make_tasks.py uses one fixed wording ("What is the capital of X?", ...), and an
arbiter trained on the train split has only ever seen that wording. These files hold the very same
test problems (same answer regex, same match field) asked in wordings the arbiter's training never
used, so that an evaluation can tell a learned skill from a learned template. The wordings below were
written apart from any training wording: six per kind, given out round-robin by problem index.
Stdlib only, deterministic; run again to rewrite.

    python bench/headroom/make_reworded_tasks.py
"""
from __future__ import annotations

import json
import re
from pathlib import Path

TASKS = Path(__file__).resolve().parent / "tasks"

# kind -> (regex that pulls the item out of the original prompt, six wordings with {item}).
# Capitals items are the country (or "the US state of X") as written; words keep their quotes.
KINDS = {
    "capitals": (re.compile(r'\AWhat is the capital of (?P<item>[^?"]+)\?\Z'), [
        "Name the capital city of {item}.",
        "In {item}, which city is the capital?",
        "Quick geography question. Which city is the capital of {item}?",
        "Tell me the capital of {item}. Reply with just the name of the city.",
        "I'm doing a crossword and one clue asks for the capital city of {item}. What's the answer?",
        "Can you tell me what city {item} has as its capital?",
    ]),
    "antonyms": (re.compile(r'\AWhat is the opposite of the word (?P<item>"[^"]+")\?\Z'), [
        "Give me an antonym of {item}.",
        "Vocabulary check. Which word means the reverse of {item}?",
        "What's a word that means the contrary of {item}? Reply with a single word.",
        "I'm doing a crossword. The clue is the opposite of {item}. What word fits?",
        "Name a word with the opposite meaning to {item}.",
        "Tell me the opposite of {item}, please.",
    ]),
    "plurals": (re.compile(r'\AWhat is the plural of the word (?P<item>"[^"]+")\?\Z'), [
        "How is {item} spelled in the plural?",
        "Give the plural form of {item}.",
        "I'm writing a story and need the plural of {item}. How do I spell it?",
        "Turn {item} into its plural. Reply with only the word.",
        "I'm doing a crossword. The clue is the plural of {item}. What word goes there?",
        "What word do we use for more than one {item}?",
    ]),
}
ORIGINAL = re.compile(r"What is the (capital|opposite|plural) of ")


def echoes(prompt: str, answer: str) -> bool:
    """Whether the prompt itself holds an accepted answer as a word (as in make_tasks.echoes)."""
    return re.search(answer.replace(r"\A\s*[^\n]*?", ""), prompt) is not None


def reword(kind: str) -> list[dict]:
    pattern, wordings = KINDS[kind]
    out = []
    with open(TASKS / f"{kind}-test.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    for i, row in enumerate(rows):
        m = pattern.match(row["prompt"])
        if not m:
            raise SystemExit(f"{kind}-test.jsonl row {i} ({row['id']}): prompt does not match: {row['prompt']!r}")
        if not row["id"].endswith("-test"):
            raise SystemExit(f"{kind}-test.jsonl row {i}: id does not end in -test: {row['id']!r}")
        item = m.group("item")
        prompt = wordings[i % len(wordings)].format(item=item)
        if item not in prompt or ORIGINAL.search(prompt):
            raise SystemExit(f"{row['id']}: bad rewording {prompt!r}")
        if echoes(prompt, row["answer"]):
            raise SystemExit(f"{row['id']}: reworded prompt holds an accepted answer: {prompt!r}")
        out.append({"id": row["id"][: -len("-test")] + "-reworded-test", "prompt": prompt,
                    "answer": row["answer"], "match": row["match"]})
    return out


def main() -> None:
    for kind in KINDS:
        rows = reword(kind)
        with open(TASKS / f"{kind}-reworded-test.jsonl", "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"{kind}-reworded-test: {len(rows)}")


if __name__ == "__main__":
    main()
