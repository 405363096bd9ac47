"""Chat prompts for distilling a draft from an instruction model, built offline from templates.

Two disjoint sets: "train" prompts (used to generate distillation data) and "heldout" prompts
that share neither a template nor a topic with them, so agreement measured on heldout prompts is
agreement on prompts never used for distillation.
"""
from __future__ import annotations

import random

TOPICS = """photosynthesis; black holes; the water cycle; volcanoes; earthquakes; the immune system; vaccines;
DNA; evolution; climate change; renewable energy; solar panels; wind turbines; nuclear power; electric cars;
batteries; the internet; computer viruses; encryption; machine learning; neural networks; databases;
recursion; sorting algorithms; binary numbers; prime numbers; fractions; percentages; probability;
the Pythagorean theorem; the Roman Empire; ancient Egypt; the printing press; the Industrial Revolution;
the French Revolution; the Renaissance; the Silk Road; the Great Wall of China; the Moon landing;
the Olympic Games; chess; football; basketball; marathon training; yoga; meditation; sleep; nutrition;
vitamins; coffee; tea; bread baking; pizza; chocolate; spices; vegetarian cooking; gardening; composting;
houseplants; bees; ants; whales; dolphins; elephants; penguins; owls; rainforests; deserts; coral reefs;
rivers; mountains; glaciers; tides; rainbows; thunderstorms; hurricanes; snow; the seasons; time zones;
calendars; clocks; money; inflation; interest rates; budgeting; saving for retirement; taxes; banks;
the stock market; small businesses; job interviews; writing a resume; public speaking; learning a language;
reading habits; libraries; poetry; novels; fairy tales; museums; painting; photography; music theory;
the piano; the guitar; jazz; opera; movies; video games; board games; travel planning; packing a suitcase;
trains; airplanes; bicycles; city planning; bridges; skyscrapers; recycling; plastic pollution; clean water;
first aid; hand washing; exercise; walking; friendship; teamwork; leadership; time management; habits;
procrastination; stress; kindness; pets; dogs; cats; birds; fish tanks; the solar system; Mars; stars;
telescopes; microscopes; magnets; electricity; light; sound; gravity; friction; simple machines;
the periodic table; acids and bases; water; salt; glass; paper; cotton; wool; maps; compasses; weather
forecasts; email etiquette; passwords; smartphones; social media; online shopping; open source software;
Python programming; spreadsheets; cloud storage; robots; 3D printing; drones; satellites; GPS""".split(";")

HELDOUT_TOPICS = """tornadoes; lighthouses; honey; volleyball; the violin; origami; the Amazon river; submarines;
keyboards; the human heart; cheese making; kites; the Eiffel Tower; sundials; octopuses; camping;
handwriting; umbrellas; postal services; fireworks; windmills; knitting; the Arctic; hot air balloons""".split(";")

TEMPLATES = [
    "Explain {t} in simple terms.",
    "What is {t}?",
    "Give me three interesting facts about {t}.",
    "Write a short paragraph about {t}.",
    "Why is {t} important?",
    "How does {t} work?",
    "Write a short poem about {t}.",
    "List five things everyone should know about {t}.",
    "Explain {t} to a ten-year-old.",
    "What are the main advantages and disadvantages of {t}?",
    "Write a short story that involves {t}.",
    "Summarize the history of {t} in a few sentences.",
    "What are common misconceptions about {t}?",
    "Give me some tips related to {t}.",
    "Describe {t} in one sentence.",
    "How would you teach someone about {t}?",
    "What questions might a student ask about {t}?",
    "Write a haiku about {t}.",
    "Compare {t} and {u}.",
    "What do {t} and {u} have in common?",
    "Write a tweet about {t}.",
    "Give a step-by-step guide related to {t}.",
    "What is the future of {t}?",
    "Write a dialogue between two friends talking about {t}.",
]

HELDOUT_TEMPLATES = [
    "Tell me something surprising about {t}.",
    "Can you describe {t} briefly?",
    "I am curious about {t}. Where should I start?",
    "Write two sentences about {t} for a school newsletter.",
    "What would a beginner need to know about {t}?",
    "Write a limerick about {t}.",
]


def _topics(names: list[str]) -> list[str]:
    return [" ".join(t.split()) for t in names if t.strip()]


def heldout_topics() -> list[str]:
    """The topics of the "heldout" split, which no distillation data may name."""
    return _topics(HELDOUT_TOPICS)


def build_prompts(split: str, n: int, seed: int = 0) -> list[str]:
    """n distinct prompts of `split` ("train" or "heldout"), deterministic for the seed."""
    if split == "train":
        topics, templates = _topics(TOPICS), TEMPLATES
    elif split == "heldout":
        topics, templates = _topics(HELDOUT_TOPICS), HELDOUT_TEMPLATES
    else:
        raise ValueError(f"split must be 'train' or 'heldout', not {split!r}")
    rng = random.Random(f"{split}-{seed}")
    every = [(tmpl, t, u) for tmpl in templates for t in topics
             for u in ([rng.choice([x for x in topics if x != t])] if "{u}" in tmpl else [None])]
    rng.shuffle(every)
    if n > len(every):
        raise ValueError(f"only {len(every)} distinct {split} prompts")
    return [tmpl.format(t=t, u=u) for tmpl, t, u in every[:n]]
