"""arctic-inference's suffix trees for the suffix drafter's rule=arctic (suffix.py): a trie with arctic's
counts, child order and path speculation (SuffixTrie), and its per-request cache of a local and a global tree
(ArcticSuffixCache)."""

from __future__ import annotations

import numpy as np

from .base import count_entropy


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
            ent.append(
                0.0 if node.groups is None else count_entropy([c for c, run in node.groups.items() for _ in run])
            )
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
