"""Byte-level BPE tokenizer for the zoo (``tokenizers``), saved as a transformers tokenizer.

``build_tokenizer(items, out_dir)`` trains on the *train* split only and writes a
``PreTrainedTokenizerFast`` directory (``tokenizer.json``, ``tokenizer_config.json`` with the
chat template) that ``AutoTokenizer.from_pretrained(dir, local_files_only=True)`` loads.
"""

from __future__ import annotations

from pathlib import Path

from .corpus_base import CHAT_TEMPLATE, EOT, SPECIAL_TOKENS, END

VOCAB_SIZE = 4096


def build_tokenizer(items, out_dir: Path, vocab_size: int = VOCAB_SIZE):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
        min_frequency=2,
    )
    texts = [it.text for it in items if it.split == "train"]
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    hf = wrap(tok)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(out_dir)
    return hf


def wrap(tok):
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOT,
        eos_token=EOT,
        unk_token=None,
        pad_token=EOT,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t != EOT],
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def load_tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def end_token_ids(tok) -> list[int]:
    """Token ids that end a generation: end of text and end of a chat turn."""
    return [tok.convert_tokens_to_ids(EOT), tok.convert_tokens_to_ids(END)]
