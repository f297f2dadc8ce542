"""specbandit tiny CPU model zoo: offline corpus, tokenizer, target, draft model, Medusa and EAGLE heads.

Everything here is built by our own code from sources on this machine (see ``zoo/corpus.py``)
and trained from fixed seeds by ``python -m zoo.train all``. The committed weights live in
``zoo/target``, ``zoo/draft``, ``zoo/medusa`` and ``zoo/eagle``; the held-out CPU workload
prompts in ``zoo/workloads/{code,math,chat,copy}.jsonl``.
"""

from pathlib import Path

ZOO_DIR = Path(__file__).resolve().parent
TARGET_DIR = ZOO_DIR / "target"
DRAFT_DIR = ZOO_DIR / "draft"
MEDUSA_DIR = ZOO_DIR / "medusa"
EAGLE_DIR = ZOO_DIR / "eagle"
WORKLOADS_DIR = ZOO_DIR / "workloads"
SCRATCH_DIR = ZOO_DIR / "_scratch"
TOKENIZER_DIR = SCRATCH_DIR / "tokenizer"  # shipped copies live in target/ and draft/
WORKLOADS = ("code", "math", "chat", "copy")
