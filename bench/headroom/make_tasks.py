"""Writes the headroom study's task files (bench/headroom/tasks/*.jsonl): short questions that
Gemma 3 270M and SmolLM2-135M-Instruct can each answer a little, in four kinds: capitals (facts),
one-step addition and subtraction, antonyms (words), plurals (spelling). Every row is a plain-answer
task row ({"id", "prompt", "answer", "match": "regex"}), scored on the reply's first line, so that a
base model's " Lima" and an instruction model's "The capital of Peru is Lima." count alike:

- words: the answer appears as a word in the first line, in any case;
- numbers: the answer is the last number in the first line.

A question that itself holds an accepted answer (the plural of "sheep", the capital of
Singapore) is left out: a reply that only repeats it would score.

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

from cospec_local.tasks.short_answer import word_pattern

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

# More rows of each kind, so that an arbiter has a train split of a useful size.
MORE_CAPITALS = {
    "Andorra": "Andorra la Vella", "Bahrain": "Manama", "Barbados": "Bridgetown", "Belize": "Belmopan",
    "Benin": "Porto-Novo|Porto Novo", "Bhutan": "Thimphu", "Bosnia and Herzegovina": "Sarajevo", "Botswana": "Gaborone",
    "Brunei": "Bandar Seri Begawan", "Burkina Faso": "Ouagadougou", "Burundi": "Gitega|Bujumbura",
    "Chad": "N'Djamena|Ndjamena", "the Democratic Republic of the Congo": "Kinshasa",
    "the Dominican Republic": "Santo Domingo", "El Salvador": "San Salvador", "Eritrea": "Asmara", "Fiji": "Suva",
    "Gabon": "Libreville", "the Gambia": "Banjul", "Guinea": "Conakry", "Guyana": "Georgetown",
    "Haiti": "Port-au-Prince|Port au Prince", "Israel": "Jerusalem", "Kyrgyzstan": "Bishkek", "Lesotho": "Maseru",
    "Liberia": "Monrovia", "Liechtenstein": "Vaduz", "Malawi": "Lilongwe", "the Maldives": "Malé|Male",
    "Mauritania": "Nouakchott", "Mauritius": "Port Louis", "Moldova": "Chișinău|Chisinau", "Montenegro": "Podgorica",
    "Myanmar": "Naypyidaw|Nay Pyi Taw|Naypyitaw", "Namibia": "Windhoek", "Niger": "Niamey",
    "North Macedonia": "Skopje", "Papua New Guinea": "Port Moresby", "Sierra Leone": "Freetown",
    "South Africa": "Pretoria|Cape Town|Bloemfontein", "South Sudan": "Juba", "Suriname": "Paramaribo",
    "Tajikistan": "Dushanbe", "Togo": "Lomé|Lome", "Trinidad and Tobago": "Port of Spain|Port-of-Spain",
    "Turkmenistan": "Ashgabat", "the United Arab Emirates": "Abu Dhabi", "the Bahamas": "Nassau",
    "Cape Verde": "Praia", "the Central African Republic": "Bangui", "the Comoros": "Moroni",
    "Equatorial Guinea": "Malabo", "Eswatini": "Mbabane|Lobamba", "Guinea-Bissau": "Bissau",
    "Ivory Coast": "Yamoussoukro|Abidjan", "Samoa": "Apia", "the Solomon Islands": "Honiara",
    "Tonga": "Nuku'alofa|Nukualofa", "Vanuatu": "Port Vila", "East Timor": "Dili", "Dominica": "Roseau",
    "Saint Lucia": "Castries", "Scotland": "Edinburgh", "Wales": "Cardiff", "England": "London",
    "Northern Ireland": "Belfast", "Greenland": "Nuuk",
}
US_STATE_CAPITALS = {
    "Alabama": "Montgomery", "Alaska": "Juneau", "Arizona": "Phoenix", "Arkansas": "Little Rock",
    "California": "Sacramento", "Colorado": "Denver", "Connecticut": "Hartford", "Delaware": "Dover",
    "Florida": "Tallahassee", "Georgia": "Atlanta", "Hawaii": "Honolulu", "Idaho": "Boise", "Illinois": "Springfield",
    "Indiana": "Indianapolis", "Iowa": "Des Moines", "Kansas": "Topeka", "Kentucky": "Frankfort",
    "Louisiana": "Baton Rouge", "Maine": "Augusta", "Maryland": "Annapolis", "Massachusetts": "Boston",
    "Michigan": "Lansing", "Minnesota": "Saint Paul|St. Paul|St Paul", "Mississippi": "Jackson",
    "Missouri": "Jefferson City", "Montana": "Helena", "Nebraska": "Lincoln", "Nevada": "Carson City",
    "New Hampshire": "Concord", "New Jersey": "Trenton", "New Mexico": "Santa Fe", "New York": "Albany",
    "North Carolina": "Raleigh", "North Dakota": "Bismarck", "Ohio": "Columbus", "Oklahoma": "Oklahoma City",
    "Oregon": "Salem", "Pennsylvania": "Harrisburg", "Rhode Island": "Providence", "South Carolina": "Columbia",
    "South Dakota": "Pierre", "Tennessee": "Nashville", "Texas": "Austin", "Utah": "Salt Lake City",
    "Vermont": "Montpelier", "Virginia": "Richmond", "Washington": "Olympia", "West Virginia": "Charleston",
    "Wisconsin": "Madison", "Wyoming": "Cheyenne",
}
MORE_ANTONYMS = {
    "alive": "dead", "agree": "disagree", "bottom": "top", "bright": "dim|dark|dull", "careful": "careless",
    "come": "go|leave", "cool": "warm|hot", "difficult": "easy|simple", "dry": "wet|damp", "empty": "full",
    "enter": "exit|leave", "fail": "succeed|pass|success", "few": "many", "fresh": "stale|rotten|old",
    "hello": "goodbye|bye", "hungry": "full|satisfied|satiated|fed", "in": "out", "kind": "cruel|unkind|mean",
    "lazy": "hardworking|hard-working|diligent|active|energetic", "less": "more", "low": "high", "male": "female",
    "many": "few", "more": "less|fewer", "morning": "evening|night", "new": "old", "no": "yes", "off": "on",
    "old": "young|new", "on": "off", "over": "under", "past": "future|present", "plus": "minus",
    "positive": "negative", "private": "public", "pretty": "ugly", "same": "different", "short": "long|tall",
    "sick": "healthy|well", "slow": "fast|quick", "small": "big|large", "soft": "hard|loud", "start": "finish|end|stop",
    "stand": "sit", "tall": "short", "top": "bottom", "under": "over|above", "ugly": "beautiful|pretty|handsome",
    "weak": "strong", "wrong": "right|correct", "yes": "no", "dark": "light|bright", "whisper": "shout|yell",
    "teach": "learn", "send": "receive", "sell": "buy", "throw": "catch", "narrow": "wide|broad", "cold": "hot|warm",
    "dead": "alive|living", "female": "male", "hate": "love", "sink": "float|swim", "lead": "follow",
    "mother": "father", "king": "queen", "boy": "girl", "brother": "sister", "husband": "wife", "uncle": "aunt",
    "son": "daughter", "inner": "outer", "upper": "lower", "forward": "backward|backwards|back",
    "ascend": "descend", "expand": "contract|shrink", "optimist": "pessimist", "beginning": "end|ending",
    "birth": "death", "create": "destroy", "freeze": "melt|thaw|boil", "frequent": "rare|infrequent|seldom",
    "hire": "fire|dismiss", "horizontal": "vertical", "interesting": "boring|dull|uninteresting",
    "junior": "senior", "majority": "minority", "natural": "artificial|unnatural|man-made", "obey": "disobey",
    "permanent": "temporary", "plural": "singular", "absent": "present", "profit": "loss", "quiet": "loud|noisy",
    "rural": "urban", "simple": "complex|complicated|difficult", "wise": "foolish|stupid|unwise",
    "heavy": "light", "fat": "thin|skinny|slim", "found": "lost", "girl": "boy", "queen": "king", "night": "day",
    "summer": "winter", "south": "north", "west": "east", "right": "left|wrong", "empty": "full",
    "late": "early", "cheap": "expensive|costly", "add": "subtract|remove", "multiply": "divide",
    "question": "answer", "enemy": "friend|ally", "future": "past", "sad": "happy|glad|cheerful",
    "slowly": "quickly|fast", "never": "always", "nobody": "everybody|somebody|everyone",
    "front": "back|rear|behind", "sour": "sweet", "lend": "borrow", "tame": "wild", "dull": "sharp|bright|interesting",
}
MORE_PLURALS = {
    "cherry": "cherries", "family": "families", "country": "countries", "body": "bodies", "berry": "berries",
    "hobby": "hobbies", "penny": "pennies|pence", "spy": "spies", "donkey": "donkeys", "turkey": "turkeys",
    "journey": "journeys", "chimney": "chimneys", "kiss": "kisses", "class": "classes", "dress": "dresses",
    "boss": "bosses", "tax": "taxes", "match": "matches", "peach": "peaches", "beach": "beaches",
    "sandwich": "sandwiches", "switch": "switches", "bush": "bushes", "quiz": "quizzes", "hoof": "hooves|hoofs",
    "scarf": "scarves|scarfs", "thief": "thieves", "elf": "elves", "self": "selves", "belief": "beliefs",
    "cliff": "cliffs", "chef": "chefs", "proof": "proofs", "volcano": "volcanoes|volcanos",
    "mosquito": "mosquitoes|mosquitos", "veto": "vetoes", "radio": "radios", "zoo": "zoos", "kangaroo": "kangaroos",
    "video": "videos", "stimulus": "stimuli", "nucleus": "nuclei|nucleuses", "radius": "radii|radiuses",
    "alumnus": "alumni", "syllabus": "syllabi|syllabuses", "focus": "foci|focuses", "oasis": "oases",
    "axis": "axes", "basis": "bases", "diagnosis": "diagnoses", "hypothesis": "hypotheses",
    "parenthesis": "parentheses", "bacterium": "bacteria", "curriculum": "curricula|curriculums",
    "millennium": "millennia|millenniums", "formula": "formulae|formulas", "antenna": "antennae|antennas",
    "larva": "larvae", "vertebra": "vertebrae", "matrix": "matrices|matrixes", "vertex": "vertices|vertexes",
    "plateau": "plateaus|plateaux", "dwarf": "dwarfs|dwarves", "mother-in-law": "mothers-in-law",
    "octopus": "octopuses|octopi", "genus": "genera", "lamp": "lamps", "table": "tables", "cup": "cups",
    "pen": "pens", "flower": "flowers", "ship": "ships", "girl": "girls", "hand": "hands", "eye": "eyes",
    "shoe": "shoes", "road": "roads", "star": "stars", "cloud": "clouds", "friend": "friends", "door": "doors",
    "wall": "walls", "lily": "lilies", "ferry": "ferries", "daisy": "daisies", "tray": "trays", "ray": "rays",
    "hero": "heroes", "wolf": "wolves", "goose": "geese", "fox": "foxes", "wish": "wishes", "glass": "glasses",
    "box": "boxes", "knife": "knives", "witch": "witches", "torch": "torches", "fairy": "fairies",
    "jelly": "jellies", "lorry": "lorries", "pony": "ponies", "cookie": "cookies", "movie": "movies",
}


def split_of(question: str) -> str:
    """test or train, by a stable hash of the question (about half each)."""
    return "test" if hashlib.sha256(question.encode()).digest()[0] < 128 else "train"


def word_regex(alternatives: str) -> str:
    """The answer (any of |-separated forms) as a whole word in the first line, in any case."""
    return r"(?i)\A\s*[^\n]*?" + word_pattern(alternatives, case_sensitive=True)


def number_regex(n: int) -> str:
    """n is the last number in the first line."""
    return rf"\A\s*[^\n]*?(?<![\d.]){n}(?![\d])(?![^\n]*\d)"


def echoes(question: str, alternatives: str) -> bool:
    """Whether the question itself holds an accepted answer as a word: a reply that only repeats the
    question would score (the plural of "sheep", the capital of Singapore)."""
    return re.search(word_pattern(alternatives), question) is not None


def rows():
    questions = []
    for country, capital in (CAPITALS | MORE_CAPITALS).items():
        questions.append(("capitals", f"What is the capital of {country}?", capital))
    for state, capital in US_STATE_CAPITALS.items():
        questions.append(("capitals", f"What is the capital of the US state of {state}?", capital))
    for word, opposite in (ANTONYMS | MORE_ANTONYMS).items():
        questions.append(("antonyms", f"What is the opposite of the word \"{word}\"?", opposite))
    for noun, plural in (PLURALS | MORE_PLURALS).items():
        questions.append(("plurals", f"What is the plural of the word \"{noun}\"?", plural))
    for kind, q, answer in questions:
        if not echoes(q, answer):
            yield kind, q, word_regex(answer)
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
