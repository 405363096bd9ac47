"""What the built-in short-answer families ask: facts, words and numbers with one checkable answer
each (short_answer.py asks them in several wordings and formats). Answers list their accepted forms
separated by "|". Capitals, antonyms and plurals are not here: they are the families the shipped
Gemma arbiters and the developers' evaluations hold out (bench/headroom/tasks).
"""
from __future__ import annotations

# ---------------------------------------------------------------- facts

CONTINENTS = {
    "France": "Europe", "Germany": "Europe", "Italy": "Europe", "Spain": "Europe", "Portugal": "Europe",
    "Poland": "Europe", "Sweden": "Europe", "Norway": "Europe", "Finland": "Europe", "Denmark": "Europe",
    "Greece": "Europe", "Ireland": "Europe", "Austria": "Europe", "Hungary": "Europe", "Romania": "Europe",
    "Belgium": "Europe", "the Netherlands": "Europe", "Switzerland": "Europe", "Ukraine": "Europe",
    "Croatia": "Europe", "Serbia": "Europe", "Bulgaria": "Europe", "Iceland": "Europe", "Estonia": "Europe",
    "Japan": "Asia", "China": "Asia", "India": "Asia", "Thailand": "Asia", "Vietnam": "Asia", "Indonesia": "Asia",
    "Malaysia": "Asia", "the Philippines": "Asia", "South Korea": "Asia", "Nepal": "Asia", "Pakistan": "Asia",
    "Bangladesh": "Asia", "Mongolia": "Asia", "Iran": "Asia", "Iraq": "Asia", "Saudi Arabia": "Asia",
    "Kazakhstan": "Asia", "Sri Lanka": "Asia", "Cambodia": "Asia", "Laos": "Asia", "Jordan": "Asia",
    "Egypt": "Africa", "Nigeria": "Africa", "Kenya": "Africa", "Ethiopia": "Africa", "Ghana": "Africa",
    "Morocco": "Africa", "Algeria": "Africa", "Tanzania": "Africa", "Uganda": "Africa", "Senegal": "Africa",
    "Angola": "Africa", "Zambia": "Africa", "Zimbabwe": "Africa", "Mali": "Africa", "Madagascar": "Africa",
    "Cameroon": "Africa", "Tunisia": "Africa", "Namibia": "Africa", "Botswana": "Africa", "Rwanda": "Africa",
    "Brazil": "South America", "Argentina": "South America", "Chile": "South America", "Peru": "South America",
    "Colombia": "South America", "Venezuela": "South America", "Ecuador": "South America",
    "Bolivia": "South America", "Paraguay": "South America", "Uruguay": "South America",
    "Canada": "North America", "Mexico": "North America", "Guatemala": "North America|Central America",
    "Honduras": "North America|Central America", "Cuba": "North America|Caribbean",
    "Jamaica": "North America|Caribbean", "Panama": "North America|Central America",
    "Australia": "Australia|Oceania", "New Zealand": "Oceania|Australia", "Fiji": "Oceania",
    "Papua New Guinea": "Oceania|Australia",
}

# Case-sensitive; no symbol that is also a word a reply may begin with ("He", "Be", "As", "No", "I").
ELEMENT_SYMBOLS = {
    "hydrogen": "H", "lithium": "Li", "boron": "B", "carbon": "C",
    "nitrogen": "N", "oxygen": "O", "fluorine": "F", "neon": "Ne", "sodium": "Na", "magnesium": "Mg",
    "aluminium": "Al", "silicon": "Si", "phosphorus": "P", "sulfur": "S", "chlorine": "Cl", "argon": "Ar",
    "potassium": "K", "calcium": "Ca", "titanium": "Ti", "chromium": "Cr", "manganese": "Mn", "iron": "Fe",
    "cobalt": "Co", "nickel": "Ni", "copper": "Cu", "zinc": "Zn", "bromine": "Br",
    "krypton": "Kr", "silver": "Ag", "tin": "Sn", "xenon": "Xe", "tungsten": "W",
    "platinum": "Pt", "gold": "Au", "mercury": "Hg", "lead": "Pb", "uranium": "U", "radon": "Rn",
    "strontium": "Sr", "barium": "Ba", "plutonium": "Pu", "selenium": "Se", "gallium": "Ga",
}

ANIMAL_YOUNG = {
    "cat": "kitten|kit", "dog": "puppy|pup|whelp", "cow": "calf", "horse": "foal|colt|filly", "sheep": "lamb",
    "goat": "kid", "pig": "piglet|shoat", "duck": "duckling", "goose": "gosling", "frog": "tadpole|froglet",
    "kangaroo": "joey", "lion": "cub", "bear": "cub", "deer": "fawn", "swan": "cygnet", "owl": "owlet",
    "hen": "chick", "eagle": "eaglet", "butterfly": "caterpillar|larva", "seal": "pup", "whale": "calf",
    "elephant": "calf", "fox": "kit|cub|pup", "wolf": "pup|cub", "tiger": "cub", "giraffe": "calf",
    "zebra": "foal", "donkey": "foal", "turkey": "poult|chick", "fish": "fry|fingerling", "hare": "leveret",
    "pigeon": "squab", "koala": "joey", "rabbit": "kit|kitten|bunny", "bee": "larva", "mosquito": "larva|wriggler",
}

CURRENCIES = {
    "Japan": "yen", "the United Kingdom": "pound|pound sterling|sterling", "the United States": "dollar",
    "India": "rupee", "China": "yuan|renminbi", "Russia": "ruble|rouble", "Mexico": "peso",
    "Switzerland": "franc", "South Korea": "won", "Brazil": "real", "South Africa": "rand", "Poland": "zloty|złoty",
    "Sweden": "krona", "Norway": "krone", "Denmark": "krone", "Turkey": "lira", "Thailand": "baht",
    "Vietnam": "dong", "Indonesia": "rupiah", "Israel": "shekel|new shekel", "Egypt": "pound",
    "Nigeria": "naira", "Kenya": "shilling", "Canada": "dollar", "Australia": "dollar", "Argentina": "peso",
    "Hungary": "forint", "the Czech Republic": "koruna|crown", "Ukraine": "hryvnia", "the Philippines": "peso",
    "Malaysia": "ringgit", "Saudi Arabia": "riyal", "Iran": "rial", "Pakistan": "rupee", "Bangladesh": "taka",
    "Germany": "euro", "France": "euro", "Italy": "euro", "Spain": "euro", "Ghana": "cedi", "Peru": "sol",
}

# ---------------------------------------------------------------- words

PAST_TENSES = {
    "go": "went", "eat": "ate", "see": "saw", "take": "took", "give": "gave", "write": "wrote", "run": "ran",
    "swim": "swam", "sing": "sang", "drink": "drank", "begin": "began", "ring": "rang", "bring": "brought",
    "buy": "bought", "think": "thought", "teach": "taught", "catch": "caught", "fight": "fought",
    "seek": "sought", "fly": "flew", "grow": "grew", "know": "knew", "throw": "threw", "draw": "drew",
    "blow": "blew", "break": "broke", "speak": "spoke", "choose": "chose", "freeze": "froze", "steal": "stole",
    "wake": "woke|waked", "drive": "drove", "ride": "rode", "rise": "rose", "fall": "fell", "feel": "felt",
    "keep": "kept", "sleep": "slept", "leave": "left", "meet": "met", "lead": "led", "feed": "fed",
    "hold": "held", "stand": "stood", "understand": "understood", "sit": "sat", "find": "found",
    "win": "won", "lose": "lost", "send": "sent", "spend": "spent", "build": "built", "lend": "lent",
    "make": "made", "say": "said", "pay": "paid", "lay": "laid", "sell": "sold", "tell": "told",
    "hear": "heard", "wear": "wore", "tear": "tore", "bear": "bore", "forget": "forgot", "get": "got",
    "shine": "shone|shined", "strike": "struck", "dig": "dug", "hang": "hung|hanged", "swing": "swung",
    "stick": "stuck", "sting": "stung", "cling": "clung", "bite": "bit", "hide": "hid", "slide": "slid",
    "shake": "shook", "forgive": "forgave", "weave": "wove", "tread": "trod", "kneel": "knelt|kneeled",
    "walk": "walked", "carry": "carried", "stop": "stopped", "plan": "planned", "try": "tried",
    "cry": "cried", "play": "played", "hope": "hoped", "travel": "traveled|travelled", "admit": "admitted",
}

COMPARATIVES = {
    "good": "better", "bad": "worse", "far": "farther|further", "big": "bigger", "small": "smaller",
    "happy": "happier", "easy": "easier", "busy": "busier", "funny": "funnier", "hot": "hotter", "thin": "thinner",
    "fat": "fatter", "sad": "sadder", "wet": "wetter", "red": "redder", "large": "larger", "wide": "wider",
    "nice": "nicer", "late": "later", "simple": "simpler", "gentle": "gentler", "tall": "taller", "short": "shorter",
    "long": "longer", "young": "younger", "old": "older|elder", "strong": "stronger", "weak": "weaker",
    "cold": "colder", "warm": "warmer", "fast": "faster", "slow": "slower", "dry": "drier|dryer", "shy": "shyer|shier",
    "early": "earlier", "heavy": "heavier", "pretty": "prettier", "lazy": "lazier", "angry": "angrier",
    "noisy": "noisier", "quiet": "quieter", "clever": "cleverer|more clever", "narrow": "narrower",
    "little": "less|littler|smaller", "many": "more", "much": "more", "brave": "braver", "safe": "safer",
    "close": "closer", "rich": "richer", "poor": "poorer", "deep": "deeper", "cheap": "cheaper", "bright": "brighter",
    "loud": "louder", "clean": "cleaner", "dark": "darker", "high": "higher", "low": "lower", "near": "nearer",
}

ING_FORMS = {
    "run": "running", "swim": "swimming", "sit": "sitting", "stop": "stopping", "plan": "planning",
    "begin": "beginning", "forget": "forgetting", "shop": "shopping", "cut": "cutting", "get": "getting",
    "make": "making", "write": "writing", "ride": "riding", "come": "coming", "take": "taking", "smile": "smiling",
    "dance": "dancing", "hope": "hoping", "lie": "lying", "die": "dying", "tie": "tying", "see": "seeing",
    "agree": "agreeing", "flee": "fleeing", "be": "being", "play": "playing", "study": "studying", "fly": "flying",
    "carry": "carrying", "try": "trying", "open": "opening", "visit": "visiting", "listen": "listening",
    "panic": "panicking", "picnic": "picnicking", "travel": "traveling|travelling", "refer": "referring",
    "prefer": "preferring", "admit": "admitting", "hit": "hitting", "put": "putting", "win": "winning",
    "drive": "driving", "give": "giving", "live": "living", "move": "moving", "love": "loving", "bake": "baking",
}

FEMININE_FORMS = {
    "king": "queen", "prince": "princess", "actor": "actress", "waiter": "waitress", "husband": "wife",
    "nephew": "niece", "uncle": "aunt", "brother": "sister", "son": "daughter", "father": "mother",
    "grandfather": "grandmother", "boy": "girl", "man": "woman", "gentleman": "lady", "duke": "duchess",
    "emperor": "empress", "lord": "lady", "monk": "nun", "groom": "bride", "bridegroom": "bride",
    "host": "hostess", "hero": "heroine", "god": "goddess", "lion": "lioness", "tiger": "tigress",
    "stallion": "mare", "rooster": "hen", "bull": "cow", "ram": "ewe", "drake": "duck", "gander": "goose",
    "fox": "vixen", "wizard": "witch", "landlord": "landlady", "count": "countess", "steward": "stewardess",
    "mister": "missus|mrs|miss", "sir": "madam|ma'am", "widower": "widow", "fiancé": "fiancée",
}

# ---------------------------------------------------------------- numbers

COUNTS = {
    "legs does a spider have": "8", "legs does an insect have": "6", "days are in a week": "7",
    "months are in a year": "12", "hours are in a day": "24", "minutes are in an hour": "60",
    "seconds are in a minute": "60", "sides does a triangle have": "3", "sides does a square have": "4",
    "sides does a pentagon have": "5", "sides does a hexagon have": "6", "sides does an octagon have": "8",
    "days are in a leap year": "366", "days are in a normal year": "365", "weeks are in a year": "52",
    "cards are in a standard deck": "52", "players are on a soccer team on the field": "11",
    "strings does a standard guitar have": "6", "keys does a standard piano have": "88",
    "planets are in the solar system": "8", "continents are there": "7", "legs does an octopus have": "8",
    "years are in a century": "100", "years are in a decade": "10", "centimetres are in a metre": "100",
    "grams are in a kilogram": "1000", "metres are in a kilometre": "1000", "items are in a dozen": "12",
    "wheels does a tricycle have": "3", "hearts does an octopus have": "3", "bones are in the adult human body": "206",
    "teeth does an adult human usually have": "32", "colours are in a rainbow": "7", "squares are on a chessboard": "64",
    "pieces does each chess player start with": "16", "letters are in the English alphabet": "26",
    "days are in February in a leap year": "29", "degrees are in a right angle": "90",
    "degrees are in a full circle": "360", "sides does a cube have": "6",
}

ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
        "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def number_words(n: int) -> str:
    """English words for 0 <= n < 10000 ("four thousand and twenty-one" style: British 'and')."""
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else "-" + ONES[n % 10])
    if n < 1000:
        rest = n % 100
        return ONES[n // 100] + " hundred" + ("" if rest == 0 else " and " + number_words(rest))
    rest = n % 1000
    joint = "" if rest == 0 else (" and " if rest < 100 else " ") + number_words(rest)
    return ONES[n // 1000] + " thousand" + joint
