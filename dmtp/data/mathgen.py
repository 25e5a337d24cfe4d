"""Generated multi-step arithmetic word problems with worked answers ("math" domain).

Deterministic: problem i of seed s is the same on every machine. The worked answer restates each
step as an equation, so a good model finds the answer text highly predictable, as in GSM8K-style
chains of thought.
"""
from __future__ import annotations

import random

NAMES = ["Ava", "Ben", "Chloe", "Dan", "Emma", "Finn", "Grace", "Hugo", "Iris", "Jack", "Kara", "Leo",
         "Maya", "Noah", "Olga", "Paul", "Quinn", "Rosa", "Sam", "Tara", "Umar", "Vera", "Will", "Zoe"]
ITEMS = ["apples", "books", "marbles", "stickers", "pencils", "cookies", "coins", "cards", "shells",
         "stamps", "toy cars", "flowers", "eggs", "oranges", "beads", "candles", "bottles", "boxes"]
PLACES = ["the market", "school", "the shop", "the fair", "the library", "the park", "a friend"]


def _step(rng: random.Random, name: str, item: str, total: int) -> tuple[str, str, int]:
    kind = rng.choice(["buy", "give", "double", "share", "lose", "receive", "triple"])
    if kind in ("buy", "receive"):
        n = rng.randint(2, 40)
        verb = f"buys {n} more {item} at {rng.choice(PLACES)}" if kind == "buy" else f"receives {n} {item} from {rng.choice(NAMES)}"
        return (f"Then {name} {verb}.", f"{total} + {n} = {total + n}", total + n)
    if kind in ("give", "lose") and total > 2:
        n = rng.randint(1, total - 1)
        verb = f"gives {n} {item} to {rng.choice(NAMES)}" if kind == "give" else f"loses {n} {item}"
        return (f"Then {name} {verb}.", f"{total} - {n} = {total - n}", total - n)
    if kind == "double" and total < 500:
        return (f"Then the number of {item} doubles.", f"{total} * 2 = {total * 2}", total * 2)
    if kind == "triple" and total < 300:
        return (f"Then the number of {item} triples.", f"{total} * 3 = {total * 3}", total * 3)
    divisors = [d for d in (2, 3, 4, 5) if total % d == 0 and total >= d]
    if kind == "share" and divisors:
        d = rng.choice(divisors)
        return (f"Then {name} shares the {item} equally among {d} friends and keeps one share.",
                f"{total} / {d} = {total // d}", total // d)
    n = rng.randint(2, 30)
    return (f"Then {name} finds {n} more {item}.", f"{total} + {n} = {total + n}", total + n)


def make_problem(seed: int, index: int) -> str:
    rng = random.Random(f"dmtp-math-{seed}-{index}")
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    total = rng.randint(3, 60)
    question = [f"{name} has {total} {item}."]
    work = [f"{name} starts with {total} {item}."]
    for _ in range(rng.randint(2, 5)):
        sentence, equation, total = _step(rng, name, item, total)
        question.append(sentence)
        work.append(f"{equation}, so {name} now has {total} {item}.")
    question.append(f"How many {item} does {name} have now?")
    work.append(f"The answer is {total}.")
    return "Question: " + " ".join(question) + "\nAnswer: " + " ".join(work) + "\n"


def math_documents(seed: int, count: int) -> list[str]:
    return [make_problem(seed, i) for i in range(count)]
