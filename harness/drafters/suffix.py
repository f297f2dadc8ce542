"""The suffix drafter (`suffix`): SuffixDecoding-style lookup over the prompt + output and earlier outputs,
by our longest-match index (rule=longest) or arctic-inference's suffix trees (rule=arctic, in suffix_tree.py)."""

from __future__ import annotations

from collections import Counter

import torch

from ..models.lm import HarnessError
from .base import Draft, Drafter, Prefix, common_prefix, count_entropy
from .suffix_tree import ArcticSuffixCache


class SuffixDrafter(Drafter):
    """SuffixDecoding-style lookup over the current prompt + output and, by `corpus=`, the earlier outputs of
    the run, by one of two match rules (`rule=`).

    corpus=prompt (what sweep.py gives every new run): the prompt and its own output so far, nothing else. A
    prompt's drafts then depend on that prompt alone, so a campaign split into shards, run by several
    processes or in any order, has record for record the records of one process (docs/DESIGN.md,
    "Campaigns beyond one process"). corpus=run (this class's default, and what a manifest without
    `corpus` means: the runs recorded before the setting existed): also every earlier output of the run, in
    the sweep's order. Its drafts depend on which prompts ran before in the same process, so it declares
    `across_prompts` and the sweep refuses it with --shard and --ray. Below, "earlier outputs" are those of
    corpus=run; under corpus=prompt there are none (arctic's global tree holds the current output only).

    rule=longest (default): one index over every sequence (earlier outputs, and the current prompt +
    output); the longest suffix of the prefix (up to max_depth tokens) with a recorded continuation is
    found; the draft follows the most frequent continuation token by token among the most recent max_occ
    occurrences (ties: the most recent), conf[j] = its count / the count of continuations still
    consistent with the draft, and drafting stops once the product of confs < min_score.

    rule=arctic: arctic-inference's SuffixDecodingCache (the SuffixDecoding paper's implementation, path
    speculation), reproduced token for token (tests/reference/test_suffix.py): a local tree over the
    current prompt + output and a global tree over every output (earlier ones and the current one so far),
    each a suffix tree of depth max_depth (default 24, vLLM's); for every match length m = 1 ..
    min(len(prefix), max_depth) - 1 whose pattern occurs, the draft follows the child with the largest
    count (ties: arctic's sibling order) for at most min(k, floor(spec_factor * m + spec_offset)) tokens while
    the token's probability count(pattern + draft so far) / count(pattern), in float32, is >= min_score;
    the draft with the largest score (sum of those probabilities; ties: the longer match) wins within a
    tree, then the local tree's draft unless the global one scores strictly higher. conf[j] = count(next) /
    count(current node) (their product is arctic's probability).

    feed= (rule=arctic only): what a finished prompt leaves in the global tree. feed=output (default, not
    recorded): its output. feed=vllm: what vLLM's suffix proposer leaves there, the output and the tokens vLLM's
    last step verified past it: vLLM drafts up to k tokens to the end (max_tokens does not cut its drafts) and adds
    every token a step verified (accepted draft tokens and the bonus) before the output is cut at max_tokens or
    after an EOS. At finish the drafter replays vLLM's walk over the output (first draft at output position 1,
    after the prefill's token; each draft of the largest k it was asked for in the run) and, when the last draft
    runs past the end, verifies it with the target (greedy, teacher-forced, through an EOS) for those tokens
    (bench/vllm_crosscheck.py measures both feeds against vLLM). Greedy decoding only.

    Where the rules differ (each shown on a stream in tests/reference/test_suffix.py):
      * corpus: longest pools all sequences in one index; arctic drafts from the two trees separately
        (the current output counts in both) and keeps the better-scoring draft;
      * match length: longest takes the longest matching suffix; arctic scores every match length and
        caps the draft at floor(spec_factor * m + spec_offset) tokens (a 1-token match drafts 1 token);
      * counts: arctic's denominator counts every occurrence of the pattern, including the ones with no
        continuation (at the end of a sequence, or past the tree depth); longest counts only occurrences
        whose continuation is known, and only the most recent max_occ;
      * depth: arctic's tree holds substrings of at most max_depth tokens, so match + draft <= max_depth, and
        the match is at most max_depth - 1; longest matches up to max_depth and drafts up to k past it;
      * ties: longest picks the most recent occurrence's token; arctic keeps its children sorted by count
        and a child whose count rises goes to the front of its new count group if it was the first of its
        old group, else to the back (so ties depend on the order in which counts were reached).
    """

    kind = "suffix"

    def __init__(self, name, settings, env):
        super().__init__(name, settings, env)
        self.rule = str(self.settings.get("rule", "longest"))  # not recorded when default: old manifests stay equal
        if self.rule not in ("longest", "arctic"):
            raise HarnessError(f"--drafter {name}=suffix: rule={self.rule!r}; expected longest or arctic")
        self.corpus = str(self.settings.get("corpus", "run"))  # run: not recorded (info), as before the setting
        if self.corpus not in ("run", "prompt"):
            raise HarnessError(f"--drafter {name}=suffix: corpus={self.corpus!r}; expected prompt or run")
        self.across_prompts = self.corpus == "run"  # drafts depend on earlier prompts' outputs
        arctic = self.rule == "arctic"
        self.feed = str(self.settings.get("feed", "output"))  # output (not recorded) | vllm: see the class doc
        if self.feed not in ("output", "vllm") or (self.feed == "vllm" and not arctic):
            raise HarnessError(
                f"--drafter {name}=suffix: feed={self.feed!r}; expected output, or vllm with rule=arctic"
            )
        if self.feed == "vllm" and env is not None and env.temperature > 0:
            raise HarnessError(f"--drafter {name}=suffix: feed=vllm models vLLM's greedy decoding only (temperature 0)")
        self._k_vllm = 0  # feed=vllm: vLLM's draft length, the largest k asked for
        self.max_depth = self._setting("max_depth", 24 if arctic else 8, int)  # longest pattern (tree depth)
        self.min_score = self._setting("min_score", 0.1, float)  # stop when prod(conf) falls below
        if arctic:
            self.spec_factor = self._setting("spec_factor", 1.0, float)  # draft <= spec_factor * match + spec_offset
            self.spec_offset = self._setting("spec_offset", 0.0, float)
            self._check_settings({"rule", "corpus", "max_depth", "min_score", "spec_factor", "spec_offset", "feed"})
            self.arctic = ArcticSuffixCache(self.max_depth)
        else:
            self.max_occ = self._setting("max_occ", 256, int)  # most recent occurrences followed
            self._check_settings({"rule", "corpus", "max_depth", "max_occ", "min_score"})
        if self.max_depth < 1:
            raise HarnessError(f"--drafter {name}=suffix: max_depth={self.max_depth}; must be >= 1")
        self.seqs: list[list[int]] = []  # corpus: earlier outputs, then the current sequence last
        self.index: dict[tuple, list[tuple[int, int]]] = {}  # pattern -> [(seq, end index)]
        self._cur: list[int] | None = None  # the current prompt's sequence (indexed part)
        self._cur_keys: set = set()  # patterns the current sequence added: what un-indexing visits

    def _add(self, s: int, seq: list[int], lo: int, hi: int, keys: set | None = None) -> None:
        """Index pattern ends e in [lo, hi) of seqs[s] (each needs a continuation at e+1)."""
        for e in range(lo, hi):
            for m in range(1, min(self.max_depth, e + 1) + 1):
                key = tuple(seq[e - m + 1 : e + 1])
                self.index.setdefault(key, []).append((s, e))
                if keys is not None:
                    keys.add(key)

    def start(self, workload, prompt_id):
        if self.rule == "arctic":
            self.arctic.drop()
        else:
            self._drop_current()

    def _drop_current(self):
        if self._cur is not None:  # un-index the current sequence (it is the last one)
            s = len(self.seqs) - 1
            for key in self._cur_keys:  # its entries are the newest, so they sit at the ends of the lists
                occ = self.index[key]
                while occ and occ[-1][0] == s:
                    occ.pop()
                if not occ:
                    del self.index[key]
            self.seqs.pop()
        self._cur, self._cur_keys = None, set()

    def finish(self, output):
        if self.corpus == "prompt":  # nothing outlives its prompt
            self.start("", "")
            return
        if self.rule == "arctic":
            tail = self._vllm_tail(list(output)) if self.feed == "vllm" else []
            self.arctic.finish(list(output) + tail)
            return
        self._drop_current()
        out = list(output)
        self.seqs.append(out)
        self._add(len(self.seqs) - 1, out, 0, len(out) - 1)

    def _vllm_tail(self, output: list[int]) -> list[int]:
        """The tokens vLLM's last step verifies past `output` (see the class doc): vLLM's walk replayed on the
        current prompt's trees (rebuilt from the prompt on: the global tree forgets the prompt's appends first)."""
        c = self.arctic
        if c.local is None or len(output) < 2 or self._k_vllm < 1:
            return []
        prompt, n = c.ids[: c.n_prompt], len(output)
        c.drop()
        pos = 1
        while pos < n:
            ctx = prompt + output[:pos]
            c.sync(ctx, len(prompt))
            d = c.speculate(ctx, self._k_vllm, self.spec_factor, self.spec_offset, self.min_score)[0]
            a = common_prefix(d, output[pos:])
            if a == n - pos:  # the draft consumed the output: the target's tokens past it decide the step's
                ids = torch.tensor([ctx + list(d)], device=self.env.target.device)
                with torch.no_grad():
                    pred = self.env.target(ids).logits[0, len(ctx) - 1 :].argmax(-1).tolist()
                return pred[a : common_prefix(d, pred) + 1]  # accepted past the end, and the bonus token
            pos += a + 1
        return []

    def info(self) -> dict:
        """corpus=run is recorded as no `corpus` at all: the manifests of runs from before the setting match."""
        settings = {k: v for k, v in self.settings.items() if not (k == "corpus" and v == "run")}
        return {"settings": settings, "sha256": None}

    def _sync(self, ids: list[int]) -> None:
        """Make the current sequence's index cover ids[:-1] (pattern ends up to len-2)."""
        cur = self._cur
        if cur is None or len(ids) < len(cur) or ids[: len(cur)] != cur:
            self._drop_current()
            self.seqs.append([])
            cur = []
        s = len(self.seqs) - 1
        self.seqs[s] = list(ids)
        self._add(s, self.seqs[s], max(0, len(cur) - 1), len(ids) - 1, self._cur_keys)
        self._cur = list(ids)

    def draft(self, pre: Prefix, k: int) -> Draft:
        true_ids = pre.ids[: len(pre.ids) - pre.speculative]
        self._k_vllm = max(self._k_vllm, k)
        if self.rule == "arctic":
            self.arctic.sync(true_ids, pre.n_prompt)
            toks, conf, ent = self.arctic.speculate(pre.ids, k, self.spec_factor, self.spec_offset, self.min_score)
            return Draft(toks, conf, ent, None)
        self._sync(true_ids)
        ids = pre.ids
        occ = None
        for m in range(min(self.max_depth, len(ids)), 0, -1):
            occ = self.index.get(tuple(ids[-m:]))
            if occ:
                break
        if not occ:
            return Draft.empty()
        conts = [self.seqs[s][e + 1 : e + 1 + k] for s, e in occ[-self.max_occ :]]
        toks, conf, ent, score = [], [], [], 1.0
        for j in range(k):
            alive = [c for c in conts if len(c) > j and c[:j] == toks]
            if not alive:
                break
            cnt = Counter(c[j] for c in alive)
            last = {c[j]: i for i, c in enumerate(alive)}  # most recent index of each token
            tok = max(cnt, key=lambda t: (cnt[t], last[t]))
            c = cnt[tok] / len(alive)
            score *= c
            if score < self.min_score:
                break
            toks.append(int(tok))
            conf.append(c)
            ent.append(count_entropy(cnt.values()))
        return Draft(toks, conf, ent, None)
