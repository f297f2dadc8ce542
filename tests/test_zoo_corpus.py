"""zoo corpus: deterministic for a seed, held-out split disjoint from training (CI never trains)."""

import hashlib

import pytest

from zoo import corpus as C
from zoo.corpus_base import DEFAULT_SEED, DOMAINS
from zoo.corpus_copy import copy_items
from zoo.corpus_math import math_items


def _digest(items):
    h = hashlib.sha256()
    for it in items:
        h.update(f"{it.domain}|{it.split}|{it.uid}|{it.text}".encode())
    return h.hexdigest()


@pytest.fixture(scope="module")
def items():
    from zoo.data import corpus_items

    return corpus_items()  # cached per process (the workloads test shares it)


def test_generators_deterministic_for_seed():
    a = math_items(7, 400)
    assert a == math_items(7, 400)
    assert a != math_items(8, 400)
    chunks = [("train", "x.py", 0, "def f(alpha, beta):\n" + "    gamma = alpha + beta\n" * 8)]
    assert copy_items(7, 60, chunks) == copy_items(7, 60, chunks)
    assert copy_items(7, 60, chunks) != copy_items(8, 60, chunks)


def test_full_corpus_deterministic(items):
    again = C.build_corpus(DEFAULT_SEED)
    assert _digest(items) == _digest(again)


def test_every_domain_has_both_splits(items):
    g = C.by_domain_split(items)
    for d in DOMAINS:
        assert len(g.get((d, "train"), [])) > 100, d
        assert len(g.get((d, "test"), [])) >= 10, d


def test_heldout_disjoint_from_train(items):
    train = {it.text for it in items if it.split == "train"}
    test = [it for it in items if it.split == "test"]
    assert not [it.uid for it in test if it.text in train]
    # code is split by whole stdlib file: no file contributes to both splits
    files = {}
    for it in items:
        if it.domain == "code":
            files.setdefault(it.uid.split(":")[1], set()).add(it.split)
    assert all(len(s) == 1 for s in files.values())
    # generated math: no question text in both splits
    q = {}
    for it in items:
        if it.domain == "math":
            q.setdefault(it.prompt, set()).add(it.split)
    assert all(len(s) == 1 for s in q.values())


def test_training_stream_uses_train_split_only(items):
    small = [it for it in items if it.domain == "math"][:300]
    stream = C.training_stream(small, 1, {"math": 1.0})
    assert set(stream) == {it.text for it in small if it.split == "train"}
    assert stream == C.training_stream(small, 1, {"math": 1.0})


def test_math_solutions_are_correct():
    import re

    for it in math_items(3, 300)[0]:
        for a, op, b, c in re.findall(r"(\d+) ([-+*]) (\d+) = \$?(\d+)", it.text):
            assert eval(f"{a}{op}{b}") == int(c), it.text
