"""Writes the headroom study's task files (bench/headroom/tasks/*.jsonl): short questions that
Gemma 3 270M and SmolLM2-135M-Instruct can each answer a little, in four kinds: capitals (facts),
one-step addition and subtraction, antonyms (words), plurals (spelling). Every row is a plain-answer
task row ({"id", "prompt", "answer", "match": "regex"}), scored on the reply's first line, so that a
base model's " Lima" and an instruction model's "The capital of Peru is Lima." count alike:

- words: the answer appears as a word in the first line, in any case;
- numbers: the answer is the last number in the first line.

Each kind is split in two by a stable hash of the question: `test` (what the headroom and the
evaluations read) and `train` (what an arbiter may learn from). Deterministic; run again to rewrite.

    python bench/headroom/make_tasks.py
"""
from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path

OUT = Path(__file__).resolve().parent / "tasks"

CAPITALS = {
    "Afghanistan": "Kabul", "Albania": "Tirana", "Algeria": "Algiers", "Angola": "Luanda", "Argentina": "Buenos Aires",
    "Armenia": "Yerevan", "Australia": "Canberra", "Austria": "Vienna", "Azerbaijan": "Baku", "Bangladesh": "Dhaka",
    "Belarus": "Minsk", "Belgium": "Brussels", "Bolivia": "Sucre|La Paz", "Brazil": "Brasília|Brasilia",
    "Bulgaria": "Sofia", "Cambodia": "Phnom Penh", "Cameroon": "Yaoundé|Yaounde", "Canada": "Ottawa",
    "Chile": "Santiago", "China": "Beijing", "Colombia": "Bogotá|Bogota", "Costa Rica": "San José|San Jose",
    "Croatia": "Zagreb", "Cuba": "Havana", "Cyprus": "Nicosia", "the Czech Republic": "Prague",
    "Denmark": "Copenhagen", "Ecuador": "Quito", "Egypt": "Cairo", "Estonia": "Tallinn", "Ethiopia": "Addis Ababa",
    "Finland": "Helsinki", "France": "Paris", "Georgia": "Tbilisi", "Germany": "Berlin", "Ghana": "Accra",
    "Greece": "Athens", "Guatemala": "Guatemala City", "Honduras": "Tegucigalpa", "Hungary": "Budapest",
    "Iceland": "Reykjavik|Reykjavík", "India": "New Delhi", "Indonesia": "Jakarta", "Iran": "Tehran", "Iraq": "Baghdad",
    "Ireland": "Dublin", "Italy": "Rome", "Jamaica": "Kingston", "Japan": "Tokyo", "Jordan": "Amman",
    "Kazakhstan": "Astana", "Kenya": "Nairobi", "Kuwait": "Kuwait City", "Laos": "Vientiane", "Latvia": "Riga",
    "Lebanon": "Beirut", "Libya": "Tripoli", "Lithuania": "Vilnius", "Luxembourg": "Luxembourg",
    "Madagascar": "Antananarivo", "Malaysia": "Kuala Lumpur", "Mali": "Bamako", "Malta": "Valletta",
    "Mexico": "Mexico City", "Mongolia": "Ulaanbaatar|Ulan Bator", "Morocco": "Rabat", "Mozambique": "Maputo",
    "Nepal": "Kathmandu", "the Netherlands": "Amsterdam", "New Zealand": "Wellington", "Nicaragua": "Managua",
    "Nigeria": "Abuja", "North Korea": "Pyongyang", "Norway": "Oslo", "Oman": "Muscat", "Pakistan": "Islamabad",
    "Panama": "Panama City", "Paraguay": "Asunción|Asuncion", "Peru": "Lima", "the Philippines": "Manila",
    "Poland": "Warsaw", "Portugal": "Lisbon", "Qatar": "Doha", "Romania": "Bucharest", "Russia": "Moscow",
    "Rwanda": "Kigali", "Saudi Arabia": "Riyadh", "Senegal": "Dakar", "Serbia": "Belgrade", "Singapore": "Singapore",
    "Slovakia": "Bratislava", "Slovenia": "Ljubljana", "Somalia": "Mogadishu", "South Korea": "Seoul",
    "Spain": "Madrid", "Sri Lanka": "Colombo|Sri Jayawardenepura Kotte", "Sudan": "Khartoum", "Sweden": "Stockholm",
    "Switzerland": "Bern|Berne", "Syria": "Damascus", "Taiwan": "Taipei", "Tanzania": "Dodoma",
    "Thailand": "Bangkok", "Tunisia": "Tunis", "Turkey": "Ankara", "Uganda": "Kampala", "Ukraine": "Kyiv|Kiev",
    "the United Kingdom": "London", "the United States": "Washington", "Uruguay": "Montevideo",
    "Uzbekistan": "Tashkent", "Venezuela": "Caracas", "Vietnam": "Hanoi", "Yemen": "Sanaa|Sana'a", "Zambia": "Lusaka",
    "Zimbabwe": "Harare",
}

ANTONYMS = {
    "hot": "cold", "big": "small|little", "fast": "slow", "up": "down", "happy": "sad|unhappy", "light": "dark|heavy",
    "open": "closed|shut", "early": "late", "full": "empty", "high": "low", "hard": "soft|easy", "wet": "dry",
    "young": "old", "strong": "weak", "rich": "poor", "thick": "thin", "loud": "quiet|soft", "long": "short",
    "clean": "dirty", "true": "false", "win": "lose", "push": "pull", "buy": "sell", "give": "take|receive",
    "near": "far", "inside": "outside", "above": "below|beneath", "before": "after", "first": "last",
    "day": "night", "north": "south", "east": "west", "left": "right", "begin": "end|finish", "arrive": "depart|leave",
    "love": "hate", "friend": "enemy|foe", "question": "answer", "war": "peace", "black": "white", "good": "bad|evil",
    "sweet": "sour|bitter", "cheap": "expensive", "safe": "dangerous|unsafe", "brave": "cowardly|afraid|scared",
    "deep": "shallow", "wide": "narrow", "heavy": "light", "always": "never", "accept": "reject|refuse",
    "increase": "decrease", "maximum": "minimum", "ancient": "modern", "victory": "defeat", "entrance": "exit",
    "asleep": "awake", "sunrise": "sunset", "winter": "summer", "polite": "rude|impolite", "noisy": "quiet|silent",
    "smooth": "rough", "tight": "loose", "sharp": "dull|blunt", "wild": "tame", "guilty": "innocent",
    "remember": "forget", "borrow": "lend", "float": "sink", "laugh": "cry", "include": "exclude",
    "import": "export", "minor": "major", "solid": "liquid", "visible": "invisible", "legal": "illegal",
    "possible": "impossible", "correct": "incorrect|wrong", "odd": "even", "generous": "stingy|selfish|greedy",
    "success": "failure", "attack": "defend|defense|defence",
}

PLURALS = {
    "mouse": "mice", "child": "children", "tooth": "teeth", "foot": "feet", "man": "men", "woman": "women",
    "goose": "geese", "person": "people|persons", "ox": "oxen", "cactus": "cacti|cactuses", "fungus": "fungi|funguses",
    "crisis": "crises", "analysis": "analyses", "thesis": "theses", "phenomenon": "phenomena",
    "criterion": "criteria", "knife": "knives", "wife": "wives", "leaf": "leaves", "wolf": "wolves", "life": "lives",
    "loaf": "loaves", "half": "halves", "shelf": "shelves", "calf": "calves", "potato": "potatoes",
    "tomato": "tomatoes", "hero": "heroes", "echo": "echoes", "box": "boxes", "fox": "foxes", "church": "churches",
    "bus": "buses|busses", "glass": "glasses", "dish": "dishes", "baby": "babies", "city": "cities", "party": "parties",
    "story": "stories", "fly": "flies", "key": "keys", "day": "days", "toy": "toys", "boy": "boys", "sheep": "sheep",
    "fish": "fish|fishes", "deer": "deer", "moose": "moose", "series": "series", "species": "species",
    "cat": "cats", "dog": "dogs", "book": "books", "tree": "trees", "car": "cars", "house": "houses",
    "apple": "apples", "chair": "chairs", "river": "rivers", "mountain": "mountains", "bird": "birds",
    "horse": "horses", "window": "windows", "garden": "gardens", "teacher": "teachers", "student": "students",
    "bench": "benches", "brush": "brushes", "watch": "watches", "wish": "wishes", "lady": "ladies",
    "puppy": "puppies", "army": "armies", "monkey": "monkeys", "valley": "valleys", "roof": "roofs",
    "chief": "chiefs", "piano": "pianos", "photo": "photos", "index": "indices|indexes", "appendix": "appendices|appendixes",
    "datum": "data", "medium": "media|mediums", "louse": "lice", "die": "dice|dies",
}


def split_of(question: str) -> str:
    """test or train, by a stable hash of the question (about half each)."""
    return "test" if hashlib.sha256(question.encode()).digest()[0] < 128 else "train"


def word_regex(alternatives: str) -> str:
    """The answer (any of |-separated forms) as a whole word in the first line, in any case."""
    forms = "|".join(re.escape(a) for a in alternatives.split("|"))
    return rf"(?i)\A\s*[^\n]*?(?<![\w])(?:{forms})(?![\w])"


def number_regex(n: int) -> str:
    """n is the last number in the first line."""
    return rf"\A\s*[^\n]*?(?<![\d.]){n}(?![\d])(?![^\n]*\d)"


def rows():
    for country, capital in CAPITALS.items():
        q = f"What is the capital of {country}?"
        yield "capitals", q, word_regex(capital)
    for word, opposite in ANTONYMS.items():
        q = f"What is the opposite of the word \"{word}\"?"
        yield "antonyms", q, word_regex(opposite)
    for noun, plural in PLURALS.items():
        q = f"What is the plural of the word \"{noun}\"?"
        yield "plurals", q, word_regex(plural)
    rng = random.Random(20261205)
    seen = set()
    while len(seen) < 600:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        op = rng.choice("+-")
        if op == "-" and a < b:
            a, b = b, a
        q = f"What is {a} {op} {b}?"
        if q in seen:
            continue
        seen.add(q)
        yield "arithmetic", q, number_regex(a + b if op == "+" else a - b)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    files = {}
    counts = {}
    for kind, question, answer in rows():
        split = split_of(question)
        name = f"{kind}-{split}"
        files.setdefault(name, []).append({"id": f"{kind}-{len(files.get(name, [])):03d}-{split}", "prompt": question,
                                          "answer": answer, "match": "regex"})
        counts[name] = counts.get(name, 0) + 1
    for name, items in sorted(files.items()):
        with open(OUT / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for row in items:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(", ".join(f"{n}: {c}" for n, c in sorted(counts.items())))


if __name__ == "__main__":
    main()
