"""Tiny random-init models and a character tokenizer, built locally for tests and benches.

Nothing is downloaded: the tokenizer is a character-level WordLevel model built from a
fixed alphabet, the models are random-init Llama / GPT-2 / Qwen2 configs, and everything
is saved with safetensors to a directory that `harness.decode.engine.load_target` loads like any
local checkpoint.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch

ALPHABET = string.ascii_letters + string.digits + string.punctuation + " \n"  # 96 chars
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]


def make_tokenizer(extra: str = ""):
    """A character-level fast tokenizer (vocab 100 + len(extra)); `extra` makes a different vocab."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + list(dict.fromkeys(ALPHABET + extra)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )


def make_model(arch: str, vocab_size: int, hidden: int = 32, layers: int = 2, seed: int = 0):
    """Random-init causal LM of family `arch` in {llama, gpt2, qwen2}, float32, eval mode."""
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "llama":
        cfg = tf.LlamaConfig(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            tie_word_embeddings=False,
            **common,
        )
        model = tf.LlamaForCausalLM(cfg)
    elif arch == "qwen2":
        cfg = tf.Qwen2Config(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            tie_word_embeddings=True,
            **common,
        )
        model = tf.Qwen2ForCausalLM(cfg)
    elif arch == "gpt2":
        cfg = tf.GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=1024, **common)
        model = tf.GPT2LMHeadModel(cfg)
    else:
        raise ValueError(f"make_model: unknown arch {arch!r} (llama, gpt2, qwen2)")
    # Random init gives near-uniform logits; a larger scale makes greedy outputs decisive
    # and repetitive, which is what lookup drafters and acceptance tests need to be exercised.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(3.0)
    return model.eval()


def save_model(model, tokenizer, path: str | Path) -> Path:
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def make_pair(root: str | Path, target_arch: str = "llama", draft_arch: str = "llama", seed: int = 0):
    """Save a tiny target and a tiny draft model sharing one tokenizer under root/{target,draft}."""
    root = Path(root)
    tok = make_tokenizer()
    t = save_model(make_model(target_arch, len(tok), seed=seed), tok, root / "target")
    d = save_model(make_model(draft_arch, len(tok), hidden=32, layers=1, seed=seed + 1), tok, root / "draft")
    return t, d


def make_zoo(root: str | Path, arch: str = "llama", seed: int = 0) -> dict:
    """A tiny target, draft model, Medusa heads and EAGLE head under root; returns the
    drafter specs (CLI strings) of all six built-in kinds over them."""
    from .heads import EagleHead, MedusaHeads

    root = Path(root)
    t, d = make_pair(root, arch, "llama", seed)
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(str(t), local_files_only=True, use_safetensors=True)
    torch.manual_seed(seed + 2)
    MedusaHeads.from_target(target, num_heads=8).save(root / "medusa")
    torch.manual_seed(seed + 3)
    EagleHead.from_target(target).save(root / "eagle")
    specs = [
        "ngram=ngram",
        "suffix=suffix",
        f"draft=draft:path={d}",
        f"medusa=medusa:path={root / 'medusa'}",
        f"eagle=eagle:path={root / 'eagle'}",
        "cascade=cascade:of=draft+ngram",
    ]
    return {"target": t, "draft": d, "root": root, "specs": specs}


PROMPTS = [  # varied prompts; the character tokenizer covers all of them
    ("code", "c1", "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"),
    ("code", "c2", "for i in range(10):\n    print(i)\nfor j in range(10):\n"),
    ("chat", "h1", "user: hello, how are you today?\nassistant:"),
    ("copy", "p1", "abc abc abc abc abc abc"),
]


def write_workload_file(path: str | Path, prompts=PROMPTS) -> Path:
    import json

    path = Path(path)
    path.write_text("".join(json.dumps({"workload": w, "prompt_id": p, "prompt": t}) + "\n" for w, p, t in prompts))
    return path
