#!/usr/bin/env python3
"""Writes fables.txt, the GPT-2 demo's training text: short animal fables in
plain English, assembled from the sentences below (all written for this
project and placed in the public domain). Deterministic: the same file on
every run. Usage: python3 make_fables.py [OUT] [KIB]"""
import random
import sys

ANIMALS = [
    ("fox", "clever"), ("crow", "proud"), ("tortoise", "patient"), ("hare", "quick"),
    ("lion", "strong"), ("mouse", "small"), ("ant", "busy"), ("grasshopper", "merry"),
    ("wolf", "hungry"), ("lamb", "gentle"), ("owl", "wise"), ("goat", "stubborn"),
    ("heron", "careful"), ("frog", "noisy"), ("bear", "sleepy"), ("sparrow", "cheerful"),
    ("donkey", "tired"), ("horse", "swift"), ("cat", "curious"), ("dog", "loyal"),
    ("badger", "grumpy"), ("otter", "playful"), ("beaver", "diligent"), ("stork", "polite"),
]
PLACES = [
    "by the river", "at the edge of the forest", "on a windy hill", "in a quiet meadow",
    "near the old mill", "under a tall oak", "beside the farmer's well", "in the reeds of the pond",
    "on the road to the market", "among the vines", "at the foot of the mountain", "in a field of barley",
]
SEASONS = ["one summer morning", "late in the autumn", "on a cold winter evening", "early in the spring",
           "after a long rain", "on the hottest day of the year", "at the first light of dawn", "one still night"]
THINGS = [
    ("a piece of cheese", "the cheese"), ("a bunch of grapes", "the grapes"), ("a golden apple", "the apple"),
    ("a crust of bread", "the bread"), ("a bright feather", "the feather"), ("a pot of honey", "the honey"),
    ("a handful of corn", "the corn"), ("a shiny pebble", "the pebble"), ("a warm blanket", "the blanket"),
    ("a basket of plums", "the plums"), ("a silver bell", "the bell"), ("a jar of water", "the water"),
]
MORALS = [
    "Slow and steady wins the race.",
    "Do not trust those who flatter you.",
    "A kindness is never wasted.",
    "Prepare today for the needs of tomorrow.",
    "It is easy to despise what you cannot have.",
    "Look before you leap.",
    "Pride goes before a fall.",
    "Little friends may prove great friends.",
    "Honesty is the best policy.",
    "Those who are greedy often lose what they already have.",
    "United we stand, divided we fall.",
    "It is wise to listen to good advice.",
    "Appearances are often deceiving.",
    "Necessity is the mother of invention.",
    "Do not count your chickens before they are hatched.",
    "He who laughs at others may one day be laughed at.",
]

OPENINGS = [
    "{Season}, a {adj} {a} lived {place}.",
    "Once upon a time, {place}, there lived a {adj} {a}.",
    "There was once a {adj} {a} who made a home {place}.",
    "Long ago, {place}, a {adj} {a} spent its days in peace.",
]
MEETINGS = [
    "One day the {a} met a {adj2} {b}, who was carrying {thing}.",
    "{Season}, the {a} saw a {adj2} {b} sitting with {thing}.",
    "While it walked {place2}, the {a} came upon a {adj2} {b} and {thing} lying in the grass.",
    "The {a} was resting when a {adj2} {b} passed by with {thing}.",
]
TURNS = {
    "flatter": [
        "\"Good day, friend {b},\" said the {a}. \"How fine you look today! Surely your voice is the sweetest in all the land.\"",
        "The {b} was so pleased by these words that it opened its mouth to sing, and {the_thing} fell to the ground.",
        "The {a} picked it up at once and ran off, laughing as it went.",
    ],
    "race": [
        "The {b} laughed at the {a} and said, \"You are so slow that I could beat you with my eyes closed.\"",
        "\"Let us race to the top of the hill,\" said the {a}, \"and we shall see who arrives first.\"",
        "The {b} ran far ahead, then lay down to sleep in the shade, for it was sure of winning.",
        "The {a} kept walking, step after step, and never stopped until it reached the top.",
        "When the {b} woke, it ran as fast as it could, but the {a} was already waiting at the finish.",
    ],
    "help": [
        "The {b} was caught in a hunter's net and cried out for help.",
        "The {a} heard the cries and came to see what was the matter.",
        "\"I am too small to be of use,\" thought the {a}, but it began to gnaw at the ropes all the same.",
        "Before long the net gave way, and the {b} was free.",
        "\"I laughed at you once,\" said the {b}, \"but today you have saved my life.\"",
    ],
    "prepare": [
        "All through the warm days the {a} carried food to its store, while the {b} sang and danced and did no work.",
        "\"Why do you toil so hard?\" asked the {b}. \"There is plenty to eat, and the sun is shining.\"",
        "\"Winter is coming,\" said the {a}, \"and I would rather be ready for it.\"",
        "When the snow came, the {a} had {thing} and a warm house, but the {b} had nothing at all.",
        "The {b} knocked at the door, cold and hungry, and asked for a little of {the_thing}.",
    ],
    "sour": [
        "The {a} saw {thing} hanging high above its head and jumped to reach it.",
        "It jumped again and again, but {the_thing} was always just out of reach.",
        "At last it walked away with its nose in the air.",
        "\"I am sure {the_thing} is not worth having,\" it said to the {b}. \"I did not want it anyway.\"",
    ],
    "greed": [
        "The {a} found {thing} and carried it home across a narrow bridge.",
        "Looking down into the water, it saw another {a} with something that seemed even larger.",
        "Wanting that one too, the {a} opened its mouth to snatch it, and {the_thing} fell into the stream.",
        "The {b}, who had watched from the bank, shook its head and said nothing.",
    ],
    "thirst": [
        "The {a} was dying of thirst and found a jar with a little water at the bottom.",
        "Its beak could not reach the water, and the jar was too heavy to tip over.",
        "So the {a} dropped one pebble after another into the jar, and slowly the water rose.",
        "At last it could drink, and the {b}, who had only watched, wished it had thought of that itself.",
    ],
    "together": [
        "The {a} and the {b} argued every day about who was the stronger.",
        "A hungry wolf watched them from the trees and waited for them to part.",
        "An old owl told them, \"Alone, each of you is easy prey. Together, no one will dare to touch you.\"",
        "From that day they kept close together, and the wolf went hungry.",
    ],
    "honest": [
        "The {a} dropped its axe into the deep river and sat down on the bank to weep.",
        "A spirit of the water rose up holding {thing} and asked, \"Is this what you lost?\"",
        "\"No,\" said the {a}, \"mine was only an old axe of iron.\"",
        "The spirit was so pleased with this honest answer that it gave the {a} its axe and {the_thing} as well.",
        "When the {b} heard of this, it threw its own axe into the river and told a lie, and it got nothing at all.",
    ],
}
MORAL_OF = {
    "flatter": 1, "race": 0, "help": 7, "prepare": 3, "sour": 4, "greed": 9,
    "thirst": 13, "together": 10, "honest": 8,
}
CLOSINGS = [
    "And so the {a} went home {place}, a little wiser than before.",
    "The {b} never forgot that day.",
    "From then on the two of them greeted each other politely whenever they met.",
    "The sun went down {place}, and all was quiet again.",
]


def cap(s):
    return s[0].upper() + s[1:]


def fable(rng, n):
    (a, adj), (b, adj2) = rng.sample(ANIMALS, 2)
    place, place2 = rng.sample(PLACES, 2)
    season = rng.choice(SEASONS)
    thing, the_thing = rng.choice(THINGS)
    kind = rng.choice(sorted(TURNS))
    f = dict(a=a, b=b, adj=adj, adj2=adj2, place=place, place2=place2, thing=thing,
             the_thing=the_thing, Season=cap(season))
    title = "Fable %d. The %s and the %s" % (n, cap(a), cap(b))
    lines = [rng.choice(OPENINGS), rng.choice(MEETINGS)] + TURNS[kind] + [rng.choice(CLOSINGS)]
    body = " ".join(cap(x.format(**f)) for x in lines)
    moral = MORALS[MORAL_OF[kind]] if rng.random() < 0.8 else rng.choice(MORALS)
    return "%s\n\n%s\n\nMoral: %s\n\n" % (title, body, moral)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "fables.txt"
    kib = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    rng = random.Random(1337)
    parts, size, n = [], 0, 1
    while size < kib * 1024:
        text = fable(rng, n)
        parts.append(text)
        size += len(text)
        n += 1
    with open(out, "w", encoding="ascii", newline="\n") as fh:
        fh.write("".join(parts))


if __name__ == "__main__":
    main()
