"""The corpus's GSM8K-like math word problems with step-by-step solutions, generated from templates and a seed.

A quarter of the problems become chat turns; the split follows the rendered question.
"""

from __future__ import annotations

import hashlib
import random

from .corpus_base import Item, render_chat, rng_for, split_of

NAMES = [
    "Ava",
    "Ben",
    "Carla",
    "Dev",
    "Elena",
    "Farid",
    "Grace",
    "Hiro",
    "Ines",
    "Jamal",
    "Kofi",
    "Lena",
    "Mateo",
    "Nora",
    "Omar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sam",
    "Tara",
    "Umar",
    "Vera",
    "Wei",
    "Xena",
    "Yusuf",
    "Zoe",
]
ITEMS = [
    ("apple", "apples"),
    ("pencil", "pencils"),
    ("book", "books"),
    ("cookie", "cookies"),
    ("marble", "marbles"),
    ("sticker", "stickers"),
    ("cupcake", "cupcakes"),
    ("toy car", "toy cars"),
    ("orange", "oranges"),
    ("card", "cards"),
    ("egg", "eggs"),
    ("shell", "shells"),
    ("balloon", "balloons"),
    ("candle", "candles"),
]
CONTAINERS = ["box", "bag", "basket", "pack", "crate", "jar", "tray"]
PLACES = [
    "the market",
    "the bakery",
    "the school fair",
    "the bookstore",
    "the farm",
    "the toy shop",
    "the garden center",
]


def _math_problem(rng: random.Random) -> tuple[str, str]:
    """One word problem and its step-by-step solution ending with '#### <answer>'."""
    t = rng.randrange(8)
    n = rng.choice(NAMES)
    m = rng.choice([x for x in NAMES if x != n])
    s, p = rng.choice(ITEMS)
    c = rng.choice(CONTAINERS)
    place = rng.choice(PLACES)
    if t == 0:
        a, b, g = rng.randint(2, 12), rng.randint(3, 24), rng.randint(1, 20)
        tot = a * b
        q = (
            f"{n} buys {a} {c}es of {p} at {place}. Each {c} holds {b} {p}. "
            f"{n} gives {g} {p} to {m}. How many {p} does {n} have left?"
        )
        sol = [
            f"{n} buys {a} {c}es with {b} {p} each, so {a} * {b} = {tot} {p}.",
            f"After giving {g} to {m}, {n} has {tot} - {g} = {tot - g} {p} left.",
        ]
        ans = tot - g
    elif t == 1:
        price, k, paid = rng.randint(2, 15), rng.randint(2, 9), 0
        cost = price * k
        paid = ((cost // 10) + 1) * 10 + rng.choice([0, 10, 20])
        q = f"At {place}, one {s} costs ${price}. {n} buys {k} {p} and pays with ${paid}. How much change does {n} get?"
        sol = [f"{k} {p} cost {k} * {price} = ${cost}.", f"The change is {paid} - {cost} = ${paid - cost}."]
        ans = paid - cost
    elif t == 2:
        a, d = rng.randint(5, 40), rng.randint(2, 6)
        b = a * d
        q = f"{n} has {a} {p}. {m} has {d} times as many {p} as {n}. How many {p} do they have together?"
        sol = [f"{m} has {d} * {a} = {b} {p}.", f"Together they have {a} + {b} = {a + b} {p}."]
        ans = a + b
    elif t == 3:
        speed, h1, h2 = rng.randint(20, 70), rng.randint(1, 5), rng.randint(1, 4)
        d1, d2 = speed * h1, speed * h2
        q = (
            f"{n} drives at {speed} miles per hour for {h1} hours, takes a break, and then "
            f"drives {h2} more hours at the same speed. How many miles does {n} drive in total?"
        )
        sol = [
            f"In the first part {n} drives {speed} * {h1} = {d1} miles.",
            f"In the second part {n} drives {speed} * {h2} = {d2} miles.",
            f"In total {n} drives {d1} + {d2} = {d1 + d2} miles.",
        ]
        ans = d1 + d2
    elif t == 4:
        per, days, weeks = rng.randint(2, 12), rng.randint(3, 7), rng.randint(2, 6)
        w = per * days
        q = f"{n} reads {per} pages every day, {days} days a week. How many pages does {n} read in {weeks} weeks?"
        sol = [
            f"Each week {n} reads {per} * {days} = {w} pages.",
            f"In {weeks} weeks {n} reads {w} * {weeks} = {w * weeks} pages.",
        ]
        ans = w * weeks
    elif t == 5:
        k = rng.randint(2, 8)
        each = rng.randint(3, 15)
        total = k * each + 0
        extra = rng.randint(1, k - 1) if k > 2 else 1
        total += extra
        q = (
            f"{n} has {total} {p} and shares them equally among {k} friends. "
            f"Each friend gets as many as possible. How many {p} are left over?"
        )
        sol = [
            f"{total} divided by {k} is {total // k} with a remainder.",
            f"{k} * {total // k} = {k * (total // k)}, so {total} - {k * (total // k)} = "
            f"{total % k} {p} are left over.",
        ]
        ans = total % k
    elif t == 6:
        base, pct = rng.randint(2, 30) * 10, rng.choice([10, 20, 25, 50])
        off = base * pct // 100
        q = f"A jacket at {place} costs ${base}. It is on sale for {pct}% off. What is the sale price?"
        sol = [
            f"The discount is {pct}% of {base}, which is {base} * {pct} / 100 = ${off}.",
            f"The sale price is {base} - {off} = ${base - off}.",
        ]
        ans = base - off
    else:
        a, b, c2 = rng.randint(10, 60), rng.randint(5, 40), rng.randint(2, 30)
        q = (
            f"{n} collected {a} {p} on Monday and {b} {p} on Tuesday. On Wednesday {n} lost "
            f"{c2} {p}. How many {p} does {n} have now?"
        )
        sol = [
            f"On Monday and Tuesday {n} collected {a} + {b} = {a + b} {p}.",
            f"After losing {c2}, {n} has {a + b} - {c2} = {a + b - c2} {p}.",
        ]
        ans = a + b - c2
    return q, "\n".join(sol) + f"\n#### {ans}"


def math_items(seed: int, n: int):
    rng = rng_for(seed, "math")
    math, chat, seen = [], [], set()
    for i in range(n):
        q, sol = _math_problem(rng)
        if q in seen:
            continue
        seen.add(q)
        split = split_of("math:" + q)
        uid = "math:" + hashlib.sha256(q.encode()).hexdigest()[:12]
        if i % 4 == 3:  # a quarter as chat turns
            msgs = (("user", q),)
            chat.append(
                Item(
                    "chat",
                    split,
                    "chat:" + uid,
                    render_chat(list(msgs) + [("assistant", sol)]),
                    render_chat(msgs, True),
                    msgs,
                )
            )
        else:
            prompt = f"Question: {q}\nAnswer:"
            math.append(Item("math", split, uid, f"{prompt} {sol}\n", prompt))
    return math, chat
