"""The prompts of the self-distillation data (zoo/distill.py), every one disjoint from the campaign's.

Four sources, each deterministic for a seed:

* ``magpie``: instructions the target writes itself (Magpie, Xu et al. 2024, arXiv 2406.08464): its chat
  template up to the start of a user turn, sampled (zoo/distill_gen.py), then kept by ``keep_instruction``
  (finished, 4-80 words, English-looking, no template tokens) and deduplicated by their normalised text.
* ``stdlib-edit``: the campaign's kind of edit task (workloads.EDITS) on standard-library files the campaign
  does not use (every top-level ``*.py`` not in workloads.STDLIB_MODULES).
* ``humaneval``: the HumanEval tasks of the ``train`` part (the campaign's prompts are the ``campaign`` part).
* ``templates``: word problems and open questions made from templates with seeded fills.

Disjointness: a prompt's identity is the sha256 of its rendered token ids (as the harness renders it) and of
its normalised user text; a prompt whose either hash is among those of every campaign-part prompt of the
four real workloads is dropped and counted (``disjoint``), and the card records the count.
"""

from __future__ import annotations

import hashlib
import re
import sysconfig
from pathlib import Path

import numpy as np

import workloads
from workloads import PromptItem

SOURCES = ("magpie", "stdlib-edit", "humaneval", "templates")
CAMPAIGN_WORKLOADS = ("humaneval-chat", "stdlib-edit", "chat-open", "math-word")
STDLIB_EDITS_MAX = 900  # edit tasks kept (seeded choice among every function of the other files)
TEMPLATE_MATH, TEMPLATE_OPEN = 1500, 1400  # template prompts of each kind
_COMMON = set("the a an is are to of and in for what how why you your can i my me do does with on it this".split())


def text_hash(text: str) -> str:
    return hashlib.sha256(" ".join(re.findall(r"[a-z0-9]+", text.lower())).encode()).hexdigest()


def ids_hash(ids: list[int]) -> str:
    return hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()


def user_text(item: PromptItem) -> str:
    return item.prompt if item.messages is None else "\n".join(m["content"] for m in item.messages)


def campaign_hashes(tok) -> tuple[set[str], int]:
    """(the id and text hashes of every campaign-part prompt of the four real workloads, how many prompts)."""
    seen, n = set(), 0
    for w in CAMPAIGN_WORKLOADS:
        for p in workloads.load_named(f"{w}:campaign"):
            seen |= {ids_hash(p.token_ids(tok)), text_hash(user_text(p))}
            n += 1
    return seen, n


def keep_instruction(text: str, finished: bool) -> bool:
    """Magpie's filter, in short: a finished turn of 4-80 words of plain English-looking text."""
    words = text.split()
    if not finished or not 4 <= len(words) <= 80 or "<|" in text or "im_start" in text:
        return False
    ascii_share = sum(c.isascii() for c in text) / max(1, len(text))
    return ascii_share >= 0.97 and len(_COMMON & {w.lower().strip(".,?!:;") for w in words}) >= 2


def chat(workload: str, pid: str, text: str) -> PromptItem:
    return PromptItem(workload, pid, messages=[{"role": "user", "content": text}])


def stdlib_edits(seed: int) -> list[PromptItem]:
    root = Path(sysconfig.get_paths()["stdlib"])
    used = set(workloads.STDLIB_MODULES)
    other = tuple(sorted(f.name for f in root.glob("*.py") if f.name not in used and not f.name.startswith("_")))
    edits = workloads.stdlib_edits(root, other)
    rng = np.random.default_rng([seed, 1])
    pick = sorted(rng.choice(len(edits), size=min(STDLIB_EDITS_MAX, len(edits)), replace=False))
    return [chat("stdlib-edit", edits[i].prompt_id, edits[i].ask()) for i in pick]


def humaneval_train() -> list[PromptItem]:
    return workloads.load_named("humaneval-chat:train")


NAMES = "Ava Ben Chloe Dev Elena Farid Grace Hiro Ines Jamal Kira Liam Maya Noah Omar Priya Quinn Rosa Sam Tara".split()
ITEMS = "apples marbles stickers books pencils cookies stamps cards shells coins beads tickets".split()
MATH = (
    "{n} has {a} {it}. {n} buys {b} packs with {c} {it} in each. How many {it} does {n} have now?",
    "{n} reads {a} pages a day for {b} days, then {c} pages on the last day. How many pages in total?",
    "A shop sells {it} at {a} dollars each. {n} buys {b} and pays with a {d}-dollar bill. What is the change?",
    "{n} shares {p} {it} equally among {b} friends and keeps the rest. How many does each friend get, and how many are left?",
    "A train travels {a} km in {b} hours. At the same speed, how far does it go in {c} hours?",
    "{n} saves {a} dollars a week. How many weeks until {n} has at least {p} dollars?",
    "A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
    "{n} had {p} {it}, gave {a} to a friend and then lost {c}. How many are left?",
    "There are {a} rows of chairs with {b} chairs in each row. {c} chairs are taken. How many are free?",
    "A recipe needs {a} eggs for {b} people. How many eggs are needed for {p} people?",
    "{n} runs {a} km on Monday and {b} km more each day after. How far does {n} run on day {c}?",
    "The price of a jacket is {p} dollars. It is {a} percent off. What is the sale price?",
)
TOPICS = (
    "photosynthesis", "the water cycle", "compound interest", "black holes", "vaccines", "the stock market",
    "machine learning", "recycling", "the immune system", "climate change", "the internet", "electric cars",
    "sleep", "volcanoes", "democracy", "inflation", "gravity", "the Roman Empire", "coffee", "honey bees",
    "solar panels", "meditation", "earthquakes", "the printing press", "antibiotics", "rainbows", "tides",
    "public libraries", "chess", "bread baking", "jazz", "the moon landing", "coral reefs", "password security",
)  # fmt: skip
OPEN = (
    "Explain {t} to a ten-year-old.",
    "What are the main benefits and drawbacks of {t}?",
    "Give me three surprising facts about {t}.",
    "How has {t} changed the way people live?",
    "Write a short paragraph about {t} for a school newsletter.",
    "What is a common misconception about {t}, and what is the truth?",
    "Compare {t} and {u} in a few sentences.",
    "Why should someone care about {t}?",
    "Write a haiku about {t}.",
    "Summarize the history of {t} in five sentences.",
    "What questions would you ask an expert on {t}?",
    "Give a step-by-step explanation of how {t} works.",
)


def templates(seed: int) -> list[PromptItem]:
    rng = np.random.default_rng([seed, 2])
    out, seen = [], set()
    while len(out) < TEMPLATE_MATH:
        t = MATH[rng.integers(len(MATH))]
        a, b, c = (int(x) for x in rng.integers(2, 30, 3))
        fill = dict(n=NAMES[rng.integers(len(NAMES))], it=ITEMS[rng.integers(len(ITEMS))], a=a, b=b, c=c)
        fill.update(d=int(a * b + rng.integers(1, 50)), p=int(rng.integers(40, 400)))
        text = t.format(**fill)
        if text not in seen:
            seen.add(text)
            out.append(chat("math", f"math-{len(out)}", text))
    n_math = len(out)
    while len(out) - n_math < TEMPLATE_OPEN:
        i, j = rng.choice(len(TOPICS), 2, replace=False)
        text = OPEN[rng.integers(len(OPEN))].format(t=TOPICS[i], u=TOPICS[j])
        if text not in seen:
            seen.add(text)
            out.append(chat("open", f"open-{len(out) - n_math}", text))
    return out
