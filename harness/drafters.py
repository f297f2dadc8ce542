"""Drafters behind one small protocol, and how the CLI names them.

A drafter proposes up to k tokens after a prefix (the prompt plus the target's output so far)
and says how sure it is of each. The protocol (subclass `Drafter`, or duck-type it):

    class MyDrafter(Drafter):
        kind = "mine"
        def __init__(self, name: str, settings: dict, env: DrafterEnv): ...
        def draft(self, pre: Prefix, k: int) -> Draft           # required
        def start(self, workload: str, prompt_id: str) -> None     # optional: a new prompt begins
        def finish(self, output: list[int]) -> None                # optional: the prompt's output is final
        def dense(self, seq: Sequence, done: dict) -> list[Draft]  # optional: drafts at every position at once
        def info(self) -> dict                                     # optional: {"settings": ..., "sha256": ...}

`Draft` holds `tokens`, `conf` (the drafter's probability of each token, or its own score in
[0, 1]), `entropy` (nats), and `q` (the probability the token was proposed with, for
`expected_accepted`; None for deterministic drafters). Drafts must be a deterministic function
of the prefix, the prompt key and the drafter's state from earlier prompts: that is what makes
dense logs equal to live runs.

Target hidden states. A drafter that reads them declares which, by `feature_layers()` (a set of
harness.lm tap keys: "last" = the final post-norm state, lm_head's input; "in:i" / "out:i" = the
input / output of decoder layer i); the default is {"last"} when the class sets
`needs_features = True`, else nothing. The engine computes the union of all drafters'
declarations once per target forward (forward hooks on those layers only) and passes them as
`Prefix.hidden[key]`, each (N >= len(ids)-1, H): rows 0..len(ids)-2 are the target's states at
those positions (the last prefix token is not yet fed to the target); `Prefix.feats` is
`hidden["last"]`.

Naming a drafter on the CLI: `--drafter NAME=KIND[:key=value,...]` with KIND one of
`ngram`, `suffix`, `draft`, `medusa`, `eagle`, `eagle3`, `dflash`, `cascade` (settings below), or

  * an import path: `--drafter mine=my_pkg.mod:MyDrafter:path=/ckpt,steps=4`
  * an entry point: a package that declares, in its pyproject.toml,
        [project.entry-points."specbandit.drafters"]
        mine = "my_pkg.mod:MyDrafter"
    is then named as `--drafter d1=mine:path=/ckpt`.

The class is called as `cls(name, settings, env)`; values in settings are parsed as int,
float, bool (true/false) or left as strings. `env` gives the loaded target, tokenizer,
device, dtype, models root, temperature, seed and the drafters defined before it.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import torch

from . import dflash, eagle3, lm
from .heads import EagleHead, MedusaHeads
from .lm import HarnessError
from .sampling import choose, conf_entropy, probs, stream_id

ENTRY_POINT_GROUP = "specbandit.drafters"
STEP_KEYS = 4096  # a drafter's noise at (origin pos, step j) is keyed pos * STEP_KEYS + j; k < STEP_KEYS


@dataclass
class Draft:
    tokens: list[int]
    conf: list[float]
    entropy: list[float]
    q: list[float] | None = None  # proposal probabilities; None = deterministic (point mass)

    @staticmethod
    def empty() -> "Draft":
        return Draft([], [], [], None)


@dataclass
class Prefix:
    ids: list[int]  # prompt + output so far
    n_prompt: int
    feats: torch.Tensor | None  # (N >= len(ids)-1, H): the "last" target state at positions 0..len(ids)-2
    pkey: int  # the prompt's noise key (sampling.prompt_key)
    temperature: float
    speculative: int = 0  # trailing ids that are draft tokens, not output (cascade extension)
    hidden: dict = field(default_factory=dict)  # tap key -> (N >= len(ids)-1, H): states at 0..len(ids)-2

    @property
    def pos(self) -> int:
        return len(self.ids) - self.n_prompt - self.speculative


@dataclass
class Sequence:
    """A finished prompt for dense drafting: origin pos has prefix ids[:n_prompt + pos]."""

    ids: list[int]
    n_prompt: int
    feats: torch.Tensor | None  # (len(ids)-1, H): the "last" target state at every position but the final one
    pkey: int
    temperature: float
    ks: list[int]  # draft length at each origin 0..N-1
    hidden: dict = field(default_factory=dict)  # tap key -> (len(ids)-1, H), as in Prefix

    def prefix(self, pos: int) -> Prefix:
        return Prefix(
            self.ids[: self.n_prompt + pos], self.n_prompt, self.feats, self.pkey, self.temperature, 0, self.hidden
        )


@dataclass
class DrafterEnv:
    target: object  # the target model (transformers PreTrainedModel)
    tokenizer: object
    target_path: Path | None = None
    device: str = "cpu"
    dtype: str = "float32"
    models_root: str | None = None
    temperature: float = 0.0
    seed: int = 0
    drafters: dict = field(default_factory=dict)  # name -> drafter, those defined earlier
    # exact (with Target(exact=True), --exact-verify): model drafters feed one position per forward and
    # draft densely by the per-position loop, so that a dense draft is bit-identical to the live one at any
    # dtype (batched forwards of other shapes differ in the last bits, and bf16 near-ties then flip)
    exact: bool = False


class Drafter:
    kind = ""
    needs_features = False  # True: drafts read Prefix.feats (the "last" target state)

    def feature_layers(self) -> frozenset:
        """The target hidden states (harness.lm tap keys) this drafter's drafts read."""
        return frozenset({lm.LAST}) if self.needs_features else frozenset()

    def __init__(self, name: str, settings: dict, env: DrafterEnv):
        self.name, self.settings, self.env = name, dict(settings), env
        self.stream = stream_id(name)

    def start(self, workload: str, prompt_id: str) -> None:
        pass

    def finish(self, output: list[int]) -> None:
        pass

    def draft(self, pre: Prefix, k: int) -> Draft:
        raise NotImplementedError

    def dense(self, seq: Sequence, done: dict) -> list[Draft]:
        """Drafts at every origin. Default: one `draft` call per position (the naive loop)."""
        return [self.draft(seq.prefix(p), k) for p, k in enumerate(seq.ks)]

    def info(self) -> dict:
        return {"settings": self.settings, "sha256": None}

    def _setting(self, key, default, cast=None):
        v = self.settings.setdefault(key, default)
        if v is None:
            raise HarnessError(f"--drafter {self.name}={self.kind}: missing setting {key}=")
        return cast(v) if cast else v

    def _check_settings(self, allowed: set[str]) -> None:
        bad = sorted(set(self.settings) - allowed)
        if bad:
            raise HarnessError(f"--drafter {self.name}={self.kind}: unknown setting(s) {bad}; known: {sorted(allowed)}")


def feature_layers(d) -> frozenset:
    """What a drafter (or a duck-typed one, by `needs_features`) reads of the target's states."""
    fn = getattr(d, "feature_layers", None)
    if callable(fn):
        return frozenset(fn())
    return frozenset({lm.LAST}) if getattr(d, "needs_features", False) else frozenset()


def _entropy(counts) -> float:
    n = sum(counts)
    return max(0.0, -sum(c / n * math.log(c / n) for c in counts if c))


# -------------------------------------------------------------------------- lookup drafters


class NgramDrafter(Drafter):
    """Prompt lookup over prompt + output: the most recent earlier occurrence of the longest
    suffix n-gram (n_max down to n_min) is copied forward (overlapping copies continue a
    repeated span, LZ77-style). conf[j]: the fraction of the n-gram's occurrences whose
    continuation agrees with the draft up to and including j (carried forward past the
    known continuations); entropy[j]: of those occurrences' next tokens.

    `rule=vllm` drafts as vLLM's ngram proposer does (bench/vllm_crosscheck.py measured both):
    the *earliest* occurrence, and only the tokens that exist after it (no overlapping copy).
    The default `rule=latest` is not recorded in the settings, so older runs resume unchanged."""

    kind = "ngram"

    def __init__(self, name, settings, env):
        super().__init__(name, settings, env)
        self.n_min = self._setting("n_min", 1, int)  # shortest suffix pattern tried
        self.n_max = self._setting("n_max", 4, int)  # longest suffix pattern tried (tried first)
        self.max_occ = self._setting("max_occ", 64, int)  # most recent occurrences used for conf
        self.rule = str(self.settings.get("rule", "latest"))  # latest (ours) | vllm (vLLM's proposer)
        self._check_settings({"n_min", "n_max", "max_occ", "rule"})
        if self.rule not in ("latest", "vllm"):
            raise HarnessError(f"--drafter {name}=ngram: rule={self.rule!r}; expected latest or vllm")
        if not 1 <= self.n_min <= self.n_max:
            raise HarnessError(f"--drafter {name}=ngram: need 1 <= n_min <= n_max, got {self.n_min}, {self.n_max}")

    def draft(self, pre: Prefix, k: int) -> Draft:
        ids = pre.ids if isinstance(pre.ids, list) else list(pre.ids)
        n, after = self.match(ids, self.n_min, self.n_max)
        if not n:
            return Draft.empty()
        if self.rule == "vllm":
            return self._copy(ids, after[: self.max_occ], k, first=True)
        return self._copy(ids, after[-self.max_occ :], k)

    @staticmethod
    def match(ids: list[int], n_min: int, n_max: int) -> tuple[int, list[int]]:
        """(n, after): the longest n in n_min..n_max whose suffix n-gram ids[P-n:] occurs earlier, as a window
        ids[s:s+n] with s + n <= P - 1, and the position after each such occurrence (s + n, ascending); (0, [])
        when none does. The occurrences of the last token are found in one pass and only they are extended
        backwards. Plain lists: between two target forwards a handful of numpy calls cost more than this."""
        P = len(ids)
        hi = min(n_max, P - 1)
        if hi < n_min:
            return 0, []
        last = ids[P - 1]
        best, after = 0, []
        for e in [i for i, t in enumerate(ids[: P - 1]) if t == last]:  # windows ending at e <= P - 2
            n = 1
            while n < hi and e >= n and ids[e - n] == ids[P - 1 - n]:
                n += 1
            if n > best:
                best, after = n, [e + 1]
            elif n == best:
                after.append(e + 1)
        return (best, after) if best >= n_min else (0, [])

    @staticmethod
    def _copy(ids: list[int], starts: list[int], k: int, first: bool = False) -> Draft:
        P = len(ids)
        if first:  # vLLM: the earliest occurrence, and only the tokens after it that exist
            src = starts[0]
            toks = ids[src : min(P, src + k)]
            k = len(toks)
        else:
            src = starts[-1]
            seq = list(ids)
            for j in range(k):  # overlapping copy: may read tokens it has just drafted
                seq.append(seq[src + j])
            toks = seq[P:]
        same = [ids[s : min(P, s + k)] for s in starts]  # at j: the continuations c with c[:j] == toks[:j]
        conf, ent, c_prev = [], [], 1.0
        for j in range(k):
            if j:
                same = [c for c in same if len(c) >= j and c[j - 1] == toks[j - 1]]
            alive = [c for c in same if len(c) > j]
            if alive:
                cnt = Counter(c[j] for c in alive)
                c_prev = cnt[toks[j]] / len(alive)
                conf.append(c_prev)
                ent.append(_entropy(cnt.values()))
            else:
                conf.append(c_prev)
                ent.append(0.0)
        return Draft([int(t) for t in toks], conf, ent, None)


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
            ent.append(_entropy(cnt.values()))
        return Draft(toks, conf, ent, None)


class TrieNode:
    """A node of SuffixTrie: how many suffixes pass through it, its children, and their order. Both
    containers are made on demand (most nodes are leaves or have one child): kids None = a leaf;
    groups None = at most one child, whose order is trivial."""

    __slots__ = ("count", "kids", "groups")

    def __init__(self):
        self.count = 0
        self.kids: dict[int, TrieNode] | None = None
        self.groups: dict[int, list[int]] | None = None  # child count -> those children's tokens, in sibling order

    def head(self):
        """(token, node) of the first child of the highest count, or None for a leaf."""
        if self.kids is None:
            return None
        if self.groups is None:
            return next(iter(self.kids.items()))
        tok = self.groups[max(self.groups)][0]
        return tok, self.kids[tok]


class SuffixTrie:
    """arctic-inference's SuffixTree (csrc/suffix_decoding) as a plain trie of depth max_depth: the same
    counts, the same child order, the same path speculation, the same float32 arithmetic. arctic keeps
    a path-compressed tree (O(N) memory); this one holds up to max_depth nodes per token (about 60 bytes
    a leaf, 300 a node with one child), which is what the reference's answers need (tie order included)
    and fine at research scales.

    Sibling order: arctic keeps children sorted by count in runs of equal count ("groups"). A new child
    joins the back of the count-1 run; a child whose count rises from c to c+1 goes to the front of
    the c+1 run if it was the first of its c run, and to the back of the c+1 run otherwise."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = TrieNode()

    def append(self, active: list, tok: int, log: list | None = None) -> None:
        """Append `tok` to the sequence whose open suffixes are `active` (updated in place); `log`
        collects what `undo` needs."""
        active.append(self.root)
        self.root.count += 1
        if len(active) > self.max_depth:
            del active[0]  # that suffix has reached the depth: it stops growing
        if log is not None:
            log.append((self.root, None, 0))
        for i, node in enumerate(active):
            child = node.kids.get(tok) if node.kids else None
            if child is None:
                child = self._new_child(node, tok)
                op = (node, tok, -1)
            else:
                op = (node, tok, self._bump(node, tok, child))
            active[i] = child
            if log is not None:
                log.append(op)

    @staticmethod
    def _new_child(node: TrieNode, tok: int) -> TrieNode:
        child = TrieNode()
        child.count = 1
        if node.kids is None:
            node.kids = {tok: child}
            return child
        if node.groups is None:  # a second child: the order starts to matter
            ((t0, c0),) = node.kids.items()
            node.groups = {c0.count: [t0]}
        node.kids[tok] = child
        node.groups.setdefault(1, []).append(tok)
        return child

    @staticmethod
    def _bump(node: TrieNode, tok: int, child: TrieNode) -> int:
        """Raise a child's count by one, moving it as arctic's _increment_count does; returns its old
        index in its run."""
        c = child.count
        child.count = c + 1
        if node.groups is None:
            return 0
        run = node.groups[c]
        i = run.index(tok)
        del run[i]
        if not run:
            del node.groups[c]
        up = node.groups.setdefault(c + 1, [])
        up.insert(0, tok) if i == 0 else up.append(tok)
        return i

    def undo(self, log: list) -> None:
        """Undo the appends recorded in `log`, newest first (restoring counts and order exactly)."""
        for node, tok, i in reversed(log):
            if tok is None:
                node.count -= 1
            elif i < 0:
                del node.kids[tok]
                if node.groups is not None:
                    run = node.groups[1]
                    run.pop()  # a new child sat at the back of the count-1 run
                    if not run:
                        del node.groups[1]
                if not node.kids:
                    node.kids = node.groups = None
            else:
                child = node.kids[tok]
                c = child.count
                child.count = c - 1
                if node.groups is not None:
                    run = node.groups[c]
                    run.pop(0) if i == 0 else run.pop()
                    if not run:
                        del node.groups[c]
                    node.groups.setdefault(c - 1, []).insert(i, tok)
        log.clear()

    def find(self, pattern) -> TrieNode | None:
        node = self.root
        for t in pattern:
            node = node.kids.get(t) if node.kids else None
            if node is None:
                return None
        return node

    def speculate(self, context: list[int], k: int, factor: float, offset: float, min_prob: float):
        """arctic's SuffixTree.speculate (path mode): (score, tokens, conf, entropy) of the best match."""
        best = (np.float32(0.0), [], [], [])
        floor = np.float32(min_prob)
        for m in range(1, len(context)):
            node = self.find(context[len(context) - m :])
            if node is None:
                break
            cap = max(0, min(k, int(float(np.float32(m) * np.float32(factor) + np.float32(offset)) + 1e-6)))
            d = self._path(node, cap, floor)
            if d[0] >= best[0]:  # ties: the longer match
                best = d
        return best

    @staticmethod
    def _path(node: TrieNode, cap: int, floor: np.float32):
        prob, score = np.float32(1.0), np.float32(0.0)
        toks, conf, ent = [], [], []
        while len(toks) < cap:
            nxt = node.head()
            if nxt is None:
                break
            tok, child = nxt
            ratio = np.float32(child.count) / np.float32(node.count)
            prob = np.float32(prob * ratio)
            if prob < floor:
                break
            score = np.float32(score + prob)
            toks.append(int(tok))
            conf.append(float(ratio))
            ent.append(0.0 if node.groups is None else _entropy([c for c, run in node.groups.items() for _ in run]))
            node = child
        return score, toks, conf, ent


class ArcticSuffixCache:
    """arctic-inference's SuffixDecodingCache for one request at a time: a local trie over the current
    prompt + output, and a global trie over every finished output plus the current output so far (those
    appends are logged, so that a prompt that is dropped unfinished leaves no trace)."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.glob = SuffixTrie(max_depth)
        self.drop()

    def drop(self) -> None:
        """Forget the current prompt (its output leaves the global trie again)."""
        if getattr(self, "log", None):
            self.glob.undo(self.log)
        self.local, self.local_open, self.ids, self.n_prompt = None, [], [], 0
        self.glob_open, self.log = [], []

    def sync(self, ids: list[int], n_prompt: int) -> None:
        """Make the local trie cover ids, and the global one ids[n_prompt:] (the output so far)."""
        if self.local is None or n_prompt != self.n_prompt or ids[: len(self.ids)] != self.ids:
            self.drop()
            self.local, self.n_prompt = SuffixTrie(self.max_depth), n_prompt
        for i in range(len(self.ids), len(ids)):
            self.local.append(self.local_open, ids[i])
            if i >= n_prompt:
                self.glob.append(self.glob_open, ids[i], self.log)
        self.ids = list(ids)

    def finish(self, output: list[int]) -> None:
        """The current prompt's output is final: it stays in the global trie for good."""
        done = self.ids[self.n_prompt :] if self.local is not None else []
        if output[: len(done)] != done:
            self.drop()
            done = []
        for t in output[len(done) :]:
            self.glob.append(self.glob_open, t, self.log)
        self.log = []  # committed: no longer undone
        self.drop()

    def speculate(self, context: list[int], k: int, factor: float, offset: float, min_prob: float):
        """The better of the local and global drafts (ties: local), as (tokens, conf, entropy)."""
        ctx = list(context[-self.max_depth :])
        trees = ([self.local] if self.local is not None else []) + [self.glob]
        best = None
        for tree in trees:
            d = tree.speculate(ctx, k, factor, offset, min_prob)
            if best is None or d[0] > best[0]:
                best = d
        return best[1], best[2], best[3]


# --------------------------------------------------------------------------- model drafters


def _chain_allow(limit: torch.Tensor, n_seq: int, step: int) -> torch.Tensor:
    """Mask for step `step` (1-based) of M parallel draft chains after a cached sequence of
    n_seq keys and step-1 earlier chain blocks of M keys: chain m sees sequence keys
    < limit[m] and its own earlier chain tokens (an identity block per step)."""
    M = limit.shape[0]
    seq = torch.arange(n_seq, device=limit.device)[None, :] < limit[:, None]
    eye = torch.eye(M, dtype=torch.bool, device=limit.device)
    return torch.cat([seq] + [eye] * step, 1)


class _ModelDrafter(Drafter):
    """Shared: choosing tokens with the drafter's own noise stream and scoring them."""

    @property
    def exact(self) -> bool:
        return bool(getattr(self.env, "exact", False))

    def _spans(self, n: int) -> list[tuple[int, int]]:
        """How to feed n new positions: in one forward, or (exact) one forward each."""
        if n <= 0:
            return []
        return [(i, i + 1) for i in range(n)] if self.exact else [(0, n)]

    def _naive(self, seq: Sequence) -> list[Draft]:
        """Dense drafts by one live-style `draft` call per origin (the exact mode's dense)."""
        self.start("", "")
        return Drafter.dense(self, seq, {})

    def _pick(self, logits: torch.Tensor, T: float, pkey: int, keys: torch.Tensor):
        tok = choose(logits, T, pkey, keys, self.stream)
        conf, ent = conf_entropy(probs(logits, T), tok)
        return tok, conf, ent

    @staticmethod
    def _assemble(toks, confs, ents, T, lens) -> list[Draft]:
        """Per-origin drafts from per-step tensors (steps, M), truncated to lens[m]."""
        toks, confs, ents = (torch.stack(x).T.cpu().tolist() if x else [] for x in (toks, confs, ents))
        out = []
        for m, n in enumerate(lens):
            t, c, e = (toks[m][:n], confs[m][:n], ents[m][:n]) if n else ([], [], [])
            out.append(Draft([int(x) for x in t], c, e, list(c) if T > 0 else None))
        return out

    def _chunks(self, seq: Sequence, first: int):
        """Origins with a non-empty draft, from origin `first`, in chunks of `batch`."""
        orig = [p for p, k in enumerate(seq.ks) if k > 0 and p >= first]
        for i in range(0, len(orig), self.batch):
            yield orig[i : i + self.batch]


class DraftModelDrafter(_ModelDrafter):
    """An independent small causal LM sharing the target's tokenizer (`path=`). Live drafting
    keeps its own KV cache, cropped to the prefix it shares with the new one. Dense drafting
    is teacher-forced: one pass over the whole sequence gives every origin's first token,
    then each further step is one pass over all origins at once, each attending to its own
    prefix and its own chain through a custom attention mask."""

    kind = "draft"

    def __init__(self, name, settings, env):
        super().__init__(name, settings, env)
        path = self._setting("path", None, str)
        self.batch = self._setting("batch", 256, int)  # origins per dense pass
        self._check_settings({"path", "batch"})
        where = f"--drafter {name}=draft path"
        self.path = lm.resolve_model_dir(path, env.models_root, where)
        lm.refuse_drafter_dir(self.path, where, name)  # before the tokenizer: a head directory has none
        lm.check_same_tokenizer(env.tokenizer, lm.load_tokenizer(self.path), str(env.target_path), str(self.path))
        self.model = lm.load_lm(self.path, env.device, env.dtype, where)
        self.cache, self.cache_ids = None, []

    def info(self):
        return {"settings": self.settings, "sha256": lm.weights_sha256(self.path)}

    def start(self, workload, prompt_id):
        self.cache, self.cache_ids = lm.new_cache(), []

    def draft(self, pre: Prefix, k: int) -> Draft:
        if k <= 0:
            return Draft.empty()
        ids, P, T = pre.ids, len(pre.ids), pre.temperature
        if self.cache is None:
            self.start("", "")
        common = 0
        for a, b in zip(self.cache_ids, ids):
            if a != b:
                break
            common += 1
        keep = min(common, P - 1, lm.cache_len(self.cache))
        lm.crop(self.cache, keep)
        dev = self.env.device
        for a, b in self._spans(P - keep):
            logits, _ = lm.forward(self.model, torch.tensor(ids[keep + a : keep + b], device=dev), self.cache)
        logits = logits[-1:]
        toks, confs, ents = [], [], []
        for j in range(k):
            key = torch.tensor([pre.pos * STEP_KEYS + j], device=dev)
            t, c, e = self._pick(logits, T, pre.pkey, key)
            toks.append(t)
            confs.append(c)
            ents.append(e)
            if j + 1 < k:
                logits, _ = lm.forward(self.model, t, self.cache)
        self.cache_ids = list(ids) + [int(t) for t in toks[:-1]]
        return self._assemble(toks, confs, ents, T, [k])[0]

    def dense(self, seq: Sequence, done: dict) -> list[Draft]:
        if self.exact:
            return self._naive(seq)
        dev, T = self.env.device, seq.temperature
        L, npr = len(seq.ids), seq.n_prompt
        cache = lm.new_cache()
        logits_seq, _ = lm.forward(self.model, torch.tensor(seq.ids[: L - 1], device=dev), cache)
        n_seq = L - 1
        out = [Draft.empty() for _ in seq.ks]
        for orig in self._chunks(seq, 0):
            o = torch.tensor(orig, device=dev)
            kmax = max(seq.ks[p] for p in orig)
            logits = logits_seq[npr + o - 1]
            toks, confs, ents = [], [], []
            for j in range(kmax):
                t, c, e = self._pick(logits, T, seq.pkey, o * STEP_KEYS + j)
                toks.append(t)
                confs.append(c)
                ents.append(e)
                if j + 1 < kmax:
                    allow = _chain_allow(npr + o, n_seq, j + 1)
                    logits, _ = lm.forward(self.model, t, cache, pos=npr + o + j, allow=allow)
            lm.crop(cache, n_seq)
            for m, d in zip(orig, self._assemble(toks, confs, ents, T, [seq.ks[p] for p in orig])):
                out[m] = d
        self.cache, self.cache_ids = None, []
        return out


class MedusaDrafter(_ModelDrafter):
    """Medusa heads (`path=`, harness.heads.MedusaHeads): head i drafts token P-1+i from the
    target feature at P-2, so one pass drafts min(k, num_heads) tokens."""

    kind = "medusa"
    needs_features = True

    def __init__(self, name, settings, env):
        super().__init__(name, settings, env)
        path = self._setting("path", None, str)
        self._check_settings({"path"})
        self.path = lm.resolve_model_dir(path, env.models_root, f"--drafter {name}=medusa path")
        try:
            self.heads = MedusaHeads.load(self.path, env.target)
        except (ValueError, FileNotFoundError) as e:
            raise HarnessError(f"--drafter {name}=medusa: {e}") from None

    def info(self):
        return {
            "settings": {**self.settings, "num_heads": self.heads.cfg.num_heads},
            "sha256": lm.weights_sha256(self.path),
        }

    def _draft_many(self, feats, origins, ks, pkey, T):
        n = min(max(ks), self.heads.cfg.num_heads)
        with torch.no_grad():
            logits = self.heads(feats).float()  # (heads, M, V)
        o = torch.as_tensor(origins, device=feats.device)
        toks, confs, ents = [], [], []
        for j in range(n):
            t, c, e = self._pick(logits[j], T, pkey, o * STEP_KEYS + j)
            toks.append(t)
            confs.append(c)
            ents.append(e)
        return self._assemble(toks, confs, ents, T, [min(k, n) for k in ks])

    def draft(self, pre: Prefix, k: int) -> Draft:
        P = len(pre.ids)
        if k <= 0 or P < 2:
            return Draft.empty()
        return self._draft_many(pre.feats[P - 2 : P - 1], [pre.pos], [k], pre.pkey, pre.temperature)[0]

    def dense(self, seq: Sequence, done: dict) -> list[Draft]:
        if self.exact:
            return self._naive(seq)
        out = [Draft.empty() for _ in seq.ks]
        orig = [p for p, k in enumerate(seq.ks) if k > 0 and seq.n_prompt + p >= 2]
        if orig:
            idx = torch.tensor([seq.n_prompt + p - 2 for p in orig], device=seq.feats.device)
            for p, d in zip(
                orig, self._draft_many(seq.feats[idx], orig, [seq.ks[p] for p in orig], seq.pkey, seq.temperature)
            ):
                out[p] = d
        return out


class EagleDrafter(_ModelDrafter):
    """EAGLE head (`path=`, harness.heads.EagleHead): reads pairs (feature j, token j+1) for
    j = 0..P-2 of the prefix, then drafts autoregressively on its own features. Live drafting
    keeps the head's KV cache over true pairs; dense drafting is teacher-forced like `draft`."""

    kind = "eagle"
    needs_features = True

    def __init__(self, name, settings, env):
        super().__init__(name, settings, env)
        path = self._setting("path", None, str)
        self.batch = self._setting("batch", 256, int)  # origins per dense pass
        self._check_settings({"path", "batch"})
        self.path = lm.resolve_model_dir(path, env.models_root, f"--drafter {name}=eagle path")
        try:
            self.head = EagleHead.load(self.path, env.target)
        except (ValueError, FileNotFoundError) as e:
            raise HarnessError(f"--drafter {name}=eagle: {e}") from None
        self.kv, self.kv_ids = None, []  # head cache over pairs 0..n-1, and the ids it covered

    def info(self):
        return {"settings": self.settings, "sha256": lm.weights_sha256(self.path)}

    def start(self, workload, prompt_id):
        self.kv, self.kv_ids = None, []

    def _logits(self, f):
        return self.head.logits(f).float()

    @torch.no_grad()
    def draft(self, pre: Prefix, k: int) -> Draft:
        ids, P, T, dev = pre.ids, len(pre.ids), pre.temperature, pre.feats.device if pre.feats is not None else "cpu"
        if k <= 0 or P < 2:
            return Draft.empty()
        n_pairs = P - 1
        common = 0
        for a, b in zip(self.kv_ids, ids):
            if a != b:
                break
            common += 1
        keep = max(0, min(common - 1, n_pairs - 1, 0 if self.kv is None else self.kv[0].shape[2]))
        past = None if keep == 0 else (self.kv[0][:, :, :keep], self.kv[1][:, :, :keep])
        for a, b in self._spans(n_pairs - keep):
            j = torch.arange(keep + a, keep + b, device=dev)
            nxt = torch.tensor(ids[keep + a + 1 : keep + b + 1], device=dev)
            pred, (kn, vn) = self.head.step(pre.feats[j][None], nxt[None], j[None], past)
            past = (kn, vn) if past is None else (torch.cat([past[0], kn], 2), torch.cat([past[1], vn], 2))
        self.kv, self.kv_ids = past, list(ids)
        f, kv = pred[:, -1:], self.kv
        toks, confs, ents = [], [], []
        for s in range(k):
            t, c, e = self._pick(self._logits(f[0]), T, pre.pkey, torch.tensor([pre.pos * STEP_KEYS + s], device=dev))
            toks.append(t)
            confs.append(c)
            ents.append(e)
            if s + 1 < k:
                f, (kn, vn) = self.head.step(f, t[None], torch.tensor([[P - 1 + s]], device=dev), kv)
                kv = (torch.cat([kv[0], kn], 2), torch.cat([kv[1], vn], 2))
        return self._assemble(toks, confs, ents, T, [k])[0]

    @torch.no_grad()
    def dense(self, seq: Sequence, done: dict) -> list[Draft]:
        if self.exact:
            return self._naive(seq)
        dev, T, npr = seq.feats.device, seq.temperature, seq.n_prompt
        L = len(seq.ids)
        n_seq = L - 1  # pairs 0..L-2
        j = torch.arange(n_seq, device=dev)
        pred_seq, (ks, vs) = self.head.step(
            seq.feats[:n_seq][None], torch.tensor(seq.ids[1:], device=dev)[None], j[None]
        )
        out = [Draft.empty() for _ in seq.ks]
        for orig in self._chunks(seq, max(0, 2 - npr)):
            o = torch.tensor(orig, device=dev)
            P = npr + o
            kmax = max(seq.ks[p] for p in orig)
            f = pred_seq[0, P - 2]  # (M, H): predicted feature at P-1
            kc, vc = ks, vs
            toks, confs, ents = [], [], []
            for s in range(kmax):
                t, c, e = self._pick(self._logits(f), T, seq.pkey, o * STEP_KEYS + s)
                toks.append(t)
                confs.append(c)
                ents.append(e)
                if s + 1 < kmax:
                    allow = _chain_allow(P - 1, n_seq, s + 1)[None, None]
                    f2, (kn, vn) = self.head.step(f[None], t[None], (P - 1 + s)[None], (kc, vc), allow)
                    kc, vc, f = torch.cat([kc, kn], 2), torch.cat([vc, vn], 2), f2[0]
            for m, d in zip(orig, self._assemble(toks, confs, ents, T, [seq.ks[p] for p in orig])):
                out[m] = d
        self.kv, self.kv_ids = None, []
        return out


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists (an accepted draft, a reusable cache)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _cat_kv(a: list, b: list) -> list:
    """Per-layer (k, v) caches joined along the key axis."""
    return [(torch.cat([ka, kb], 2), torch.cat([va, vb], 2)) for (ka, va), (kb, vb) in zip(a, b)]


class Eagle3Drafter(_ModelDrafter):
    """EAGLE-3 (`path=`: a speculators or EAGLE-3/SpecForge directory, harness.eagle3): reads the
    target's states at its three layers, drafts k tokens greedily (or by its own coupled noise)
    in a chain, each step feeding back its own hidden state and token; conf/entropy come from its
    own distribution over the draft vocabulary, its tokens are mapped to the target's by d2t.
    Live drafting keeps the head's KV cache over true pairs; dense drafting is teacher-forced
    like `eagle`, all origins' chains in one pass per step."""

    kind = "eagle3"

    def __init__(self, name, settings, env):
        super().__init__(name, settings, env)
        path = self._setting("path", None, str)
        self.batch = self._setting("batch", 256, int)  # origins per dense pass
        self._check_settings({"path", "batch"})
        self.path = lm.resolve_model_dir(path, env.models_root, f"--drafter {name}=eagle3 path")
        self.model = eagle3.load(self.path, env.target, f"--drafter {name}=eagle3:")
        self.kv, self.kv_ids = None, []  # per-layer cache over pairs 0..n-1, and the ids it covered

    def feature_layers(self):
        return frozenset(self.model.keys)

    def info(self):
        return {
            "settings": {**self.settings, "layers": list(self.model.layer_ids)},
            "sha256": lm.weights_sha256(self.path),
        }

    def start(self, workload, prompt_id):
        self.kv, self.kv_ids = None, []

    def _g(self, hidden: dict, rows: torch.Tensor) -> torch.Tensor:
        """The head's input at those positions: fc over the concatenated target states."""
        return self.model.fuse(torch.cat([hidden[key][rows] for key in self.model.keys], -1))

    def _chain(self, h, logits, kv, T, pkey, o, P, k, allow_at=None):
        """k chained steps from h (1, M, H) / logits (M, Vd) after cache kv; origins o (M,),
        prefix lengths P (M,). allow_at(s): the mask of step s (None: causal after kv)."""
        toks, confs, ents = [], [], []
        for s in range(k):
            d, c, e = self._pick(logits, T, pkey, o * STEP_KEYS + s)
            t = self.model.to_target(d)
            toks.append(t)
            confs.append(c)
            ents.append(e)
            if s + 1 < k:
                mask = None if allow_at is None else allow_at(s + 1)
                h, lg, kv = self.model.step(h, t[None], (P + s)[None], kv, mask)
                logits = lg[0]
        return toks, confs, ents

    @torch.no_grad()
    def draft(self, pre: Prefix, k: int) -> Draft:
        ids, P, T = pre.ids, len(pre.ids), pre.temperature
        if k <= 0 or P < 2:
            return Draft.empty()
        dev = pre.hidden[self.model.keys[0]].device
        cached = 0 if self.kv is None else self.kv[0][0].shape[2]
        keep = max(0, min(common_prefix(self.kv_ids, ids) - 1, P - 2, cached))  # pair j needs ids[: j + 2] unchanged
        past = None if keep == 0 else [(k_[:, :, :keep], v_[:, :, :keep]) for k_, v_ in self.kv]
        for a, b in self._spans(P - 1 - keep):
            j = torch.arange(keep + a, keep + b, device=dev)
            nxt = torch.tensor(ids[keep + a + 1 : keep + b + 1], device=dev)
            h, lg, past = self.model.step(self._g(pre.hidden, j)[None], nxt[None], (j + 1)[None], past)
        self.kv, self.kv_ids = past, list(ids)
        o, Pt = torch.tensor([pre.pos], device=dev), torch.tensor([P], device=dev)
        toks, confs, ents = self._chain(h[:, -1:], lg[0, -1:], self.kv, T, pre.pkey, o, Pt, k)
        return self._assemble(toks, confs, ents, T, [k])[0]

    @torch.no_grad()
    def dense(self, seq: Sequence, done: dict) -> list[Draft]:
        if self.exact:
            return self._naive(seq)
        T, npr, n_seq = seq.temperature, seq.n_prompt, len(seq.ids) - 1
        dev = seq.hidden[self.model.keys[0]].device
        j = torch.arange(n_seq, device=dev)
        nxt = torch.tensor(seq.ids[1:], device=dev)
        hs, lgs, kv_seq = self.model.step(self._g(seq.hidden, j)[None], nxt[None], (j + 1)[None])
        out = [Draft.empty() for _ in seq.ks]
        for orig in self._chunks(seq, max(0, 2 - npr)):
            o = torch.tensor(orig, device=dev)
            P = npr + o
            kmax = max(seq.ks[p] for p in orig)
            allow_at = lambda step, P=P: _chain_allow(P - 1, n_seq, step)[None, None]
            # chain m sees pairs 0..P-2 and its own earlier chain tokens
            toks, confs, ents = self._chain(hs[:, P - 2], lgs[0, P - 2], kv_seq, T, seq.pkey, o, P, kmax, allow_at)
            for m, d in zip(orig, self._assemble(toks, confs, ents, T, [seq.ks[p] for p in orig])):
                out[m] = d
        self.kv, self.kv_ids = None, []
        return out


class DFlashDrafter(_ModelDrafter):
    """DFlash (`path=`: z-lab's format, harness.dflash): one non-causal pass over the block
    [last token, mask x (block-1)] after context keys made from the target's states drafts
    block-1 tokens (`block=` overrides the checkpoint's block_size); a draft of k is the block's
    first min(k, block-1). Live drafting keeps the context keys of the prefix; dense drafting
    makes every position's context keys once and runs all origins' blocks together."""

    kind = "dflash"

    def __init__(self, name, settings, env):
        super().__init__(name, settings, env)
        path = self._setting("path", None, str)
        self.batch = self._setting("batch", 64, int)  # origins per dense pass
        block = self._setting("block", 0, int)  # 0: the checkpoint's block_size
        self._check_settings({"path", "batch", "block"})
        self.path = lm.resolve_model_dir(path, env.models_root, f"--drafter {name}=dflash path")
        self.model = dflash.load(self.path, env.target, f"--drafter {name}=dflash:", block or None)
        self.max_len = self.model.block_size - 1  # the longest draft one pass gives
        self.ctx, self.ctx_ids = None, []  # per-layer context (k, v) over positions 0..n-1, and the ids then

    def feature_layers(self):
        return frozenset(self.model.keys)

    def info(self):
        return {"settings": {**self.settings, "block": self.model.block_size}, "sha256": lm.weights_sha256(self.path)}

    def start(self, workload, prompt_id):
        self.ctx, self.ctx_ids = None, []

    def _g(self, hidden: dict, lo: int, hi: int) -> torch.Tensor:
        return torch.cat([hidden[key][lo:hi] for key in self.model.keys], -1)

    def _pick_block(self, logits, T, pkey, o, ks) -> list[Draft]:
        """Drafts from block logits (M, block-1, V), origin o (M,), truncated to ks."""
        n = min(max(ks), self.max_len)
        toks, confs, ents = [], [], []
        for j in range(n):
            t, c, e = self._pick(logits[:, j], T, pkey, o * STEP_KEYS + j)
            toks.append(t)
            confs.append(c)
            ents.append(e)
        return self._assemble(toks, confs, ents, T, [min(k, n) for k in ks])

    @torch.no_grad()
    def draft(self, pre: Prefix, k: int) -> Draft:
        ids, P = pre.ids, len(pre.ids)
        if k <= 0 or P < 2:
            return Draft.empty()
        dev = pre.hidden[self.model.keys[0]].device
        cached = 0 if self.ctx is None else self.ctx[0][0].shape[2]
        keep = min(common_prefix(self.ctx_ids, ids), P - 1, cached)  # position j's keys need ids[: j + 1] unchanged
        ctx = [(k_[:, :, :keep], v_[:, :, :keep]) for k_, v_ in self.ctx] if keep else None
        for a, b in self._spans(P - 1 - keep):
            rows = torch.arange(keep + a, keep + b, device=dev)
            new = self.model.context(self._g(pre.hidden, keep + a, keep + b), rows)
            ctx = new if ctx is None else _cat_kv(ctx, new)
        self.ctx, self.ctx_ids = ctx, list(ids)
        logits = self.model.block(torch.tensor([ids[-1]], device=dev), torch.tensor([P - 1], device=dev), self.ctx)
        return self._pick_block(logits, pre.temperature, pre.pkey, torch.tensor([pre.pos], device=dev), [k])[0]

    @torch.no_grad()
    def dense(self, seq: Sequence, done: dict) -> list[Draft]:
        if self.exact:
            return self._naive(seq)
        npr, n_seq = seq.n_prompt, len(seq.ids) - 1
        dev = seq.hidden[self.model.keys[0]].device
        ctx = self.model.context(self._g(seq.hidden, 0, n_seq), torch.arange(n_seq, device=dev))
        ids = torch.tensor(seq.ids, device=dev)
        out = [Draft.empty() for _ in seq.ks]
        for orig in self._chunks(seq, max(0, 2 - npr)):
            o = torch.tensor(orig, device=dev)
            P = npr + o
            allow = torch.arange(n_seq, device=dev)[None, :] < (P - 1)[:, None]  # context 0..P-2
            logits = self.model.block(ids[P - 1], P - 1, ctx, allow)
            for m, d in zip(orig, self._pick_block(logits, seq.temperature, seq.pkey, o, [seq.ks[p] for p in orig])):
                out[m] = d
        self.ctx, self.ctx_ids = None, []
        return out


# --------------------------------------------------------------------------------- cascade


class CascadeDrafter(Drafter):
    """A composition of drafters named earlier (`of=a+b`). rule=extend (default): a's draft,
    cut at its first token with conf < min_conf, then extended to k by b drafting after
    prefix + that cut (b must not need target features). rule=first: the first non-empty
    draft among of=..., in order."""

    kind = "cascade"

    def __init__(self, name, settings, env):
        super().__init__(name, settings, env)
        of = self._setting("of", None, str)
        self.rule = self._setting("rule", "extend", str)
        self.min_conf = self._setting("min_conf", 0.5, float)  # extend: keep a's tokens while conf >= this
        self._check_settings({"of", "rule", "min_conf"})
        self.parts = of.split("+")
        missing = [p for p in self.parts if p not in env.drafters]
        if missing:
            raise HarnessError(
                f"--drafter {name}=cascade: of={of} names {missing}, which are not defined "
                f"before it (defined: {sorted(env.drafters)})"
            )
        if self.rule not in ("extend", "first"):
            raise HarnessError(f"--drafter {name}=cascade: rule={self.rule!r}; expected extend or first")
        if self.rule == "extend":
            if len(self.parts) != 2:
                raise HarnessError(f"--drafter {name}=cascade: rule=extend needs of=a+b (two drafters), got {of}")
            if feature_layers(env.drafters[self.parts[1]]):
                raise HarnessError(
                    f"--drafter {name}=cascade: {self.parts[1]} reads target features, "
                    "so it cannot extend a draft; use a lookup drafter second"
                )
        self.drafters = [env.drafters[p] for p in self.parts]
        self.needs_features = any(feature_layers(d) for d in self.drafters)

    def feature_layers(self) -> frozenset:
        return frozenset().union(*(feature_layers(d) for d in self.drafters))

    def start(self, workload, prompt_id):
        # the parts' per-prompt state (a draft model's cache) starts afresh with the cascade's prompt; their
        # finish() is not passed on: the engine finishes every drafter itself, and a suffix corpus would
        # receive each output twice
        for d in self.drafters:
            getattr(d, "start", lambda *a: None)(workload, prompt_id)

    def _extend(self, pre: Prefix, a: Draft, k: int) -> Draft:
        n = 0
        while n < len(a.tokens) and a.conf[n] >= self.min_conf:
            n += 1
        toks, conf, ent = a.tokens[:n], a.conf[:n], a.entropy[:n]
        q = None if a.q is None else a.q[:n]
        if n < k:
            ext = Prefix(
                pre.ids + toks, pre.n_prompt, pre.feats, pre.pkey, pre.temperature, pre.speculative + n, pre.hidden
            )
            b = self.drafters[1].draft(ext, k - n)
            toks, conf, ent = toks + b.tokens, conf + b.conf, ent + b.entropy
            if q is not None or b.q is not None:
                q = (q if q is not None else [1.0] * n) + (b.q if b.q is not None else [1.0] * len(b.tokens))
        return Draft(toks, conf, ent, q)

    def draft(self, pre: Prefix, k: int) -> Draft:
        if k <= 0:
            return Draft.empty()
        if self.rule == "first":
            for d in self.drafters:
                out = d.draft(pre, k)
                if out.tokens:
                    return out
            return Draft.empty()
        return self._extend(pre, self.drafters[0].draft(pre, k), k)

    def dense(self, seq: Sequence, done: dict) -> list[Draft]:
        """Reuses the parts' dense drafts (computed first); only the extension runs here."""
        parts = [done[p] for p in self.parts]
        out = []
        for p, k in enumerate(seq.ks):
            if k <= 0:
                out.append(Draft.empty())
            elif self.rule == "first":
                out.append(next((d[p] for d in parts if d[p].tokens), Draft.empty()))
            else:
                out.append(self._extend(seq.prefix(p), parts[0][p], k))
        return out


# ------------------------------------------------------------------------------ CLI specs

BUILTIN = {
    c.kind: c
    for c in (
        NgramDrafter,
        SuffixDrafter,
        DraftModelDrafter,
        MedusaDrafter,
        EagleDrafter,
        Eagle3Drafter,
        DFlashDrafter,
        CascadeDrafter,
    )
}


def _value(v: str):
    """A setting's text as a bool (true/false), an int, a float (ASCII digits only), or the text itself."""
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float) if v.isascii() else ():
        try:
            return cast(v)
        except ValueError:
            pass
    return v


@dataclass
class DrafterSpec:
    name: str
    kind: str  # builtin kind or installed plug-in (entry point name)
    settings: dict

    def __str__(self):
        s = ",".join(f"{k}={v}" for k, v in self.settings.items())
        return f"{self.name}={self.kind}" + (f":{s}" if s else "")


def parse_settings(text: str, where: str, texts=()) -> dict:
    """key=value,... -> {key: value}; the keys in `texts` keep their text (a path named 123 stays "123"). A key
    given twice, an empty key and a number that is not finite (nan, inf, 1e400) are refused."""
    out = {}
    for item in filter(None, text.split(",")):
        if "=" not in item:
            raise HarnessError(f"{where}: setting {item!r} is not key=value")
        k, v = (x.strip() for x in item.split("=", 1))
        if not k or k in out:
            raise HarnessError(f"{where}: setting {item!r}: " + ("given twice" if k else "no key before ="))
        out[k] = v if k in texts else _value(v)
        if isinstance(out[k], float) and not math.isfinite(out[k]):
            raise HarnessError(f"{where}: setting {item!r}: not a finite number")
    return out


def _entry_points() -> dict:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def parse_spec(text: str) -> DrafterSpec:
    """NAME=KIND[:k=v,...], KIND built in or an installed plug-in's entry point; checks the kind exists."""
    where = f"--drafter {text if text.isprintable() else ascii(text)}"  # a control character is shown escaped
    if "=" not in text:
        raise HarnessError(f"{where}: expected NAME=KIND[:key=value,...]")
    name, rest = text.split("=", 1)
    name = name.strip()
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise HarnessError(f"{where}: drafter name {name!r} must be letters, digits, - or _")
    head, _, tail = rest.partition(":")
    if head in BUILTIN or head in _entry_points():
        from . import options

        schema = options.SETTINGS.get(head, {})
        settings = parse_settings(tail, where, [key for key, rule in schema.items() if rule is str])
        options.drafter_settings(head, settings, f"--drafter {name}={head}")  # types and ranges, before any load
        return DrafterSpec(name, head, settings)
    # never an arbitrary module:attr: a command line must not name code to import (os:system, builtins:eval)
    raise HarnessError(
        f"{where}: unknown drafter kind {head!r}; known kinds: {', '.join(sorted(BUILTIN))}"
        f"; installed plug-ins (entry points {ENTRY_POINT_GROUP}): {sorted(_entry_points()) or 'none'}"
    )


def resolve_class(kind: str):
    if kind in BUILTIN:
        return BUILTIN[kind]
    eps = _entry_points()
    if kind not in eps:
        raise HarnessError(f"drafter kind {kind!r}: neither built in nor an installed plug-in ({ENTRY_POINT_GROUP})")
    try:
        return eps[kind].load()
    except (ImportError, AttributeError) as e:
        raise HarnessError(f"drafter plug-in {kind!r}: cannot import: {e}") from None


def build_drafters(specs: list[DrafterSpec], env: DrafterEnv) -> dict:
    """Instantiate in CLI order (a cascade may only name drafters given before it)."""
    out = {}
    for s in specs:
        if s.name in out:
            raise HarnessError(f"--drafter {s}: the name {s.name!r} is used twice")
        env.drafters = dict(out)
        out[s.name] = resolve_class(s.kind)(s.name, dict(s.settings), env)
    return out
