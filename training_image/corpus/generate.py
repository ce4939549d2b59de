"""Writes ``workshop_tales.txt``: the trainer's demo corpus, generated so nothing is downloaded.

The text is made by a small seeded grammar, so it has the regularities (repeated words, sentence
shapes, punctuation) that let a byte-level model's loss fall within a few hundred steps, and the
same seed always writes the same bytes. Run ``python generate.py`` to rewrite it.
"""

from __future__ import annotations

import random
from pathlib import Path

SEED = 2026
TARGET_BYTES = 240_000

NAMES = [
    "Ada",
    "Bram",
    "Cora",
    "Dev",
    "Esme",
    "Finn",
    "Greta",
    "Hugo",
    "Iris",
    "Jonah",
    "Kira",
    "Leo",
    "Mina",
    "Nils",
    "Orla",
    "Pia",
    "Quin",
    "Rosa",
    "Sami",
    "Tove",
]
TRADES = [
    "baker",
    "smith",
    "weaver",
    "miller",
    "potter",
    "carpenter",
    "fisher",
    "gardener",
    "clockmaker",
    "glassblower",
    "cartographer",
    "beekeeper",
]
PLACES = [
    "the harbour",
    "the old mill",
    "the market square",
    "the hill farm",
    "the lighthouse",
    "the river bend",
    "the orchard",
    "the workshop",
    "the north road",
    "the library",
]
TIMES = [
    "At dawn",
    "In the morning",
    "By noon",
    "In the afternoon",
    "At dusk",
    "That night",
    "On the first day of spring",
    "When the frost came",
    "After the long rain",
]
OBJECTS = [
    "a wooden box",
    "a brass key",
    "a map of the coast",
    "a basket of pears",
    "a broken lantern",
    "a loaf of rye bread",
    "a spool of blue thread",
    "a copper kettle",
    "a letter with no name",
    "a jar of honey",
    "a small silver bell",
    "a bundle of reeds",
]
VERBS = [
    "found",
    "carried",
    "mended",
    "sold",
    "painted",
    "hid",
    "counted",
    "wrapped",
    "weighed",
    "polished",
    "lost",
    "shared",
]
FEELINGS = ["glad", "tired", "curious", "worried", "proud", "calm", "puzzled", "hopeful"]
WEATHER = [
    "The wind was cold.",
    "The sky was clear and pale.",
    "Rain drummed on the roofs.",
    "Fog lay over the water.",
    "The sun was warm on the stones.",
    "Snow fell softly.",
]
SAYINGS = [
    "Measure twice and cut once.",
    "A slow fire bakes the best bread.",
    "Every road leads to the market.",
    "What is shared is never lost.",
    "The tide waits for no one.",
    "A good tool is half the work.",
]


def sentence(rng: random.Random) -> str:
    who, other = rng.sample(NAMES, 2)
    trade = rng.choice(TRADES)
    shapes = [
        lambda: (
            f"{rng.choice(TIMES)}, {who} the {trade} {rng.choice(VERBS)} "
            f"{rng.choice(OBJECTS)} at {rng.choice(PLACES)}."
        ),
        lambda: f"{who} walked to {rng.choice(PLACES)} and met {other}.",
        lambda: f'"Have you seen {rng.choice(OBJECTS)}?" asked {who}.',
        lambda: f'"I {rng.choice(VERBS)} it yesterday," said {other}.',
        lambda: (
            f"{who} felt {rng.choice(FEELINGS)}, because {other} had "
            f"{rng.choice(VERBS)} {rng.choice(OBJECTS)}."
        ),
        lambda: rng.choice(WEATHER),
        lambda: f'{other} the {rng.choice(TRADES)} always said: "{rng.choice(SAYINGS)}"',
        lambda: (
            f"There were {rng.randint(2, 19)} {rng.choice(['boats', 'carts', 'lamps', 'geese'])}"
            f" near {rng.choice(PLACES)}, and {who} counted them twice."
        ),
    ]
    return rng.choice(shapes)()


def tale(rng: random.Random, number: int) -> str:
    paragraphs = []
    for _ in range(rng.randint(2, 4)):
        paragraphs.append(" ".join(sentence(rng) for _ in range(rng.randint(3, 7))))
    return f"Tale {number}\n\n" + "\n\n".join(paragraphs) + "\n\n"


def generate(target_bytes: int = TARGET_BYTES, seed: int = SEED) -> str:
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    number = 1
    while size < target_bytes:
        part = tale(rng, number)
        parts.append(part)
        size += len(part.encode())
        number += 1
    return "".join(parts)


if __name__ == "__main__":
    out = Path(__file__).with_name("workshop_tales.txt")
    out.write_text(generate(), encoding="utf-8")
    print(f"wrote {out} ({out.stat().st_size} bytes)")
