"""The English text `numpy-tf train` learns from by default (shipped as
numpy_tf/text/texts/tiny_corpus.txt; `default_corpus()` reads it).

Short stories about eight villagers, built from a small grammar: who walks where, the weather,
what they carry, and counting that always adds up (giving away k of n leaves n - k; finding m
and then j makes m + j). The structure repeats, so a tiny model can learn it, yet the names,
pronouns, places and numbers must agree across sentences, so it is not trivial.

No random numbers: paragraph p picks each word with its own modular formula in p, so the text is
the same on every machine and every Python version. tests/test_data.py checks that
build_corpus() reproduces the shipped file byte for byte.

    python -m numpy_tf.text.corpus       # rewrites numpy_tf/text/texts/tiny_corpus.txt
"""
from __future__ import annotations

import textwrap
from importlib import resources
from pathlib import Path

PARAGRAPHS = 168
WIDTH = 76
OUTPUT = Path(__file__).resolve().parent / "texts" / "tiny_corpus.txt"

PEOPLE = [("Anna", "baker", "she"), ("Tomas", "fisher", "he"), ("Lena", "weaver", "she"),
          ("Pavel", "smith", "he"), ("Ines", "teacher", "she"), ("Oskar", "farmer", "he"),
          ("Mira", "potter", "she"), ("Jonas", "miller", "he")]
PLACES = [("the market", "The market was full of voices and carts."),
          ("the river", "The water of the river was slow and clear."),
          ("the mill", "The great wheel of the mill turned and turned."),
          ("the old bridge", "The old bridge was made of grey stone."),
          ("the hill", "From the hill, the whole village could be seen."),
          ("the school", "Children were reading aloud in the school."),
          ("the forest", "Birds were singing between the tall trees."),
          ("the harbour", "Small boats rocked gently in the harbour.")]
TIMES = ["In the morning", "At noon", "In the afternoon", "In the evening"]
WEATHER = ["The sky was clear and blue.", "It was raining softly.",
           "A cold wind came from the north.", "The air was warm and still.",
           "Grey clouds hung over the roofs.", "Thin snow lay on the fields."]
THINGS = [("apple", "apples"), ("pear", "pears"), ("loaf", "loaves"), ("fish", "fish"),
          ("egg", "eggs"), ("candle", "candles"), ("cup", "cups"), ("stone", "stones")]
NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
           "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
           "seventeen", "eighteen", "nineteen", "twenty"]
ENDINGS = ["went home", "sat by the fire", "walked back before dark", "ate some warm soup",
           "told the story to a friend"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def count(number: int, thing: tuple[str, str]) -> str:
    """"one apple", "three apples"."""
    return f"{NUMBERS[number]} {thing[0] if number == 1 else thing[1]}"


def giving(p: int) -> str:
    (giver, trade, pronoun), (taker, taker_trade, _) = _pair(p)
    place, _ = PLACES[(3 * p + p // 8) % len(PLACES)]
    thing = THINGS[(3 * p + p // 5) % len(THINGS)]
    have = 2 + (7 * p) % 11
    give = 1 + (5 * p + p // 3) % (have - 1)
    return (f"{TIMES[(5 * p // 3) % 4]}, {giver} the {trade} walked to {place}. "
            f"{WEATHER[(7 * p + 2) % len(WEATHER)]} {pronoun.capitalize()} carried "
            f"{count(have, thing)}. At {place}, {pronoun} met {taker} the {taker_trade}. "
            f"{giver} gave {taker} {count(give, thing)}. Now {giver} had "
            f"{count(have - give, thing)} and {taker} had {count(give, thing)}. "
            f"\"Thank you, {giver},\" said {taker}. Then {pronoun} "
            f"{ENDINGS[(p + p // 5) % len(ENDINGS)]}.")


def finding(p: int) -> str:
    (finder, trade, pronoun), _ = _pair(p)
    place, detail = PLACES[(5 * p + 1) % len(PLACES)]
    thing = THINGS[(5 * p + p // 7) % len(THINGS)]
    first, more = 1 + (3 * p) % 9, 1 + (4 * p + 2) % 9
    return (f"{TIMES[(p + p // 4) % 4]}, {finder} the {trade} went to {place}. {detail} "
            f"{pronoun.capitalize()} found {count(first, thing)} near the path and "
            f"{NUMBERS[more]} more under a tree. That made {count(first + more, thing)} in "
            f"all. {finder} put them in a basket and carried the basket home.")


def asking(p: int) -> str:
    (owner, trade, pronoun), (asker, asker_trade, _) = _pair(p)
    thing = THINGS[(7 * p + 3) % len(THINGS)]
    have = 2 + (5 * p + 1) % 11
    eat = 1 + (3 * p + p // 4) % (have - 1)
    return (f"{TIMES[(3 * p + 1) % 4]}, {asker} the {asker_trade} asked {owner} the {trade}, "
            f"\"How many {thing[1]} do you have?\" {owner} counted them slowly. \"I have "
            f"{count(have, thing)},\" {pronoun} said. \"If I give away {NUMBERS[eat]}, I will "
            f"have {NUMBERS[have - eat]}.\" {asker} smiled, because the answer was right.")


def facts(p: int) -> str:
    first, second = 1 + p % 9, 1 + (p // 2) % 9
    day = DAYS[p % 7]
    return (f"A lesson at the school. {NUMBERS[first].capitalize()} and {NUMBERS[second]} make "
            f"{NUMBERS[first + second]}. After {day} comes {DAYS[(p + 1) % 7]}. A week has "
            f"seven days, and a year has twelve months. "
            f"{NUMBERS[max(first, second) + 1].capitalize()} is more than "
            f"{NUMBERS[min(first, second)]}.")


def _pair(p: int):
    """Two different villagers for paragraph p."""
    first = p % len(PEOPLE)
    second = (first + 1 + (p // len(PEOPLE)) % (len(PEOPLE) - 1)) % len(PEOPLE)
    return PEOPLE[first], PEOPLE[second]


def build_corpus(paragraphs: int = PARAGRAPHS) -> str:
    """The whole text: a title, then `paragraphs` paragraphs wrapped at WIDTH columns."""
    stories = (giving, finding, asking)
    blocks = ["Stories from the River Village"]
    for p in range(paragraphs):
        paragraph = facts(p) if p % 7 == 6 else stories[(p + p // 3) % 3](p)
        blocks.append(textwrap.fill(paragraph, WIDTH))
    return "\n\n".join(blocks) + "\n"


def default_corpus() -> str:
    """The English text that ships with numpy_tf (numpy_tf/text/texts/tiny_corpus.txt, about 40 KB):
    short village stories from a small grammar, with counting that adds up, written for this
    project by build_corpus below. What `numpy-tf train` learns from by default."""
    path = resources.files(__package__).joinpath("texts").joinpath("tiny_corpus.txt")
    return path.read_bytes().decode("utf-8")


if __name__ == "__main__":
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_bytes(build_corpus().encode("utf-8"))
    print(f"wrote {OUTPUT} ({OUTPUT.stat().st_size} bytes)")
