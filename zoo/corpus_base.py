"""The corpus's shared pieces: the item, its split by source unit, the seeded streams, the chat format.

Every generator of the corpus (``zoo/corpus_stdlib.py``, ``zoo/corpus_math.py``, ``zoo/corpus_copy.py``)
makes ``Item``s whose split comes from ``split_of`` (a stable hash of the item's source unit) and whose
randomness comes from ``rng_for`` (a ``random.Random`` seeded from the seed and a per-stream label);
``zoo/corpus.py`` assembles them. The tokenizer (``zoo/tokenizer.py``) reads the special tokens and the
chat template from here.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

DEFAULT_SEED = 1234
TEST_PERCENT = 8  # share of source units held out (by hash)
DOMAINS = ("code", "prose", "math", "copy", "chat")

EOT = "<|endoftext|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
SYSTEM = "<|system|>"
END = "<|end|>"
SPECIAL_TOKENS = [EOT, USER, ASSISTANT, SYSTEM, END]


@dataclass(frozen=True)
class Item:
    domain: str
    split: str
    uid: str  # stable id of the item
    text: str  # full training text (chat already rendered)
    prompt: str = ""  # the prompt part (for workloads): text up to where generation starts
    messages: tuple = ()  # for chat items: ((role, content), ...) of the prompt turns


def split_of(unit: str, salt: str = "split") -> str:
    h = int(hashlib.sha256(f"{salt}:{unit}".encode()).hexdigest()[:8], 16)
    return "test" if h % 100 < TEST_PERCENT else "train"


def rng_for(seed: int, label: str) -> random.Random:
    return random.Random(int(hashlib.sha256(f"{seed}:{label}".encode()).hexdigest()[:16], 16))


def render_chat(messages, add_generation_prompt: bool = False) -> str:
    """Plain-Python twin of the Jinja chat template shipped with the tokenizer."""
    tags = {"user": USER, "assistant": ASSISTANT, "system": SYSTEM}
    out = "".join(f"{tags[r]}\n{c}{END}\n" for r, c in messages)
    if add_generation_prompt:
        out += f"{ASSISTANT}\n"
    return out


CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}<|system|>\n"
    "{% elif message['role'] == 'user' %}<|user|>\n"
    "{% else %}<|assistant|>\n{% endif %}"
    "{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
