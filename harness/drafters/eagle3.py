"""The EAGLE-3 drafter (`eagle3`) on the target's states at three layers; the head itself in harness/models/eagle3.py."""

from __future__ import annotations

import math

import torch

from ..models import eagle3, lm
from .base import STEP_KEYS, Draft, Prefix, Sequence, common_prefix
from .model import ModelDrafter, chain_allow


class Eagle3Drafter(ModelDrafter):
    """EAGLE-3 (`path=`: a speculators or EAGLE-3/SpecForge directory, harness.models.eagle3): reads the
    target's states at its three layers, drafts k tokens greedily (or by its own coupled noise)
    in a chain, each step feeding back its own hidden state and token; conf/entropy come from its
    own distribution over the draft vocabulary, its tokens are mapped to the target's by d2t.
    Live drafting keeps the head's KV cache over true pairs; dense drafting is teacher-forced
    like `eagle`, all origins' chains in one pass per step.

    `tree=N` (0: a chain) drafts a tree of N tokens instead, as EAGLE-2 does and EAGLE-3 and the engines
    (SGLang's --speculative-eagle-topk / --speculative-num-draft-tokens, vLLM's EAGLE tree) deploy it: each depth
    up to k expands the `width` nodes of highest path probability by their `width` most probable tokens, one head
    step over all of them with a tree mask, and the tree is the N nodes of highest path probability (prefix-closed,
    since a child is never more probable than its parent). The target verifies every node in one forward and
    accepts the deepest node on its own path (harness/models/target.py). Greedy only (temperature 0)."""

    kind = "eagle3"

    def __init__(self, name, settings, env):
        super().__init__(name, settings, env)
        path = self._setting("path", None, str)
        self.batch = self._setting("batch", 256, int)  # origins per dense pass
        self._check_settings({"path", "batch", "stop_below", "tree", "width"})
        self.stop_below = self._read_stop()
        # types and ranges: harness/models/options.py SETTINGS, checked by parse_spec as batch's are
        self.tree = int(self.settings.get("tree", 0))  # draft tokens in the tree (0: a chain of k)
        self.width = int(self.settings.get("width", 4)) if self.tree else 0  # nodes expanded per depth, children each
        if self.tree:  # as numbers in the manifest, where the analyses find the trees (schema.tree_drafters)
            self.settings["tree"], self.settings["width"] = self.tree, self.width
        if self.tree and (self.stop_below or env.temperature > 0 or env.exact):
            what = "stop_below" if self.stop_below else ("a temperature > 0" if env.temperature > 0 else "exact")
            raise lm.HarnessError(
                f"--drafter {name}=eagle3: tree={self.tree} cannot be combined with {what}: a tree is drafted and "
                "verified greedily"
            )
        self.path = lm.resolve_model_dir(path, env.models_root, f"--drafter {name}=eagle3 path")
        self.model = eagle3.load(self.path, env.target, f"--drafter {name}=eagle3:")
        self.kv, self.kv_ids = None, []  # per-layer cache over pairs 0..n-1, and the ids it covered

    def tree_size(self, k: int) -> int:
        """The tokens of a tree drafted k deep: N, or fewer where depth k holds fewer (width at depth 1, width**2
        more at each further depth)."""
        return 0 if k <= 0 else min(self.tree, self.width + (k - 1) * self.width**2)

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
        prefix lengths P (M,). allow_at(s): the mask of step s (None: causal after kv). Fewer when every
        chain has stopped by the stop rule (ModelDrafter)."""
        toks, confs, ents, stopped = [], [], [], None
        for s in range(k):
            d, c, e = self._pick(logits, T, pkey, o * STEP_KEYS + s)
            t = self.model.to_target(d)
            toks.append(t)
            confs.append(c)
            ents.append(e)
            stopped = self._stopped(stopped, c)
            if stopped is not None and bool(stopped.all()):
                break  # every chain has stopped (stop_below): the steps after are not run
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
        if self.tree:
            base = torch.ones(1, self.kv[0][0].shape[2], dtype=torch.bool, device=dev)
            return self._grow(h[:, -1:], lg[0, -1:], self.kv, base, Pt, [k])[0]
        toks, confs, ents = self._chain(h[:, -1:], lg[0, -1:], self.kv, T, pre.pkey, o, Pt, k)
        return self._assemble(toks, confs, ents, T, [k])[0]

    def _grow(self, h, logits, kv, base, P, ks) -> list[Draft]:
        """Trees (the class's doc) for M origins at once: h (1, M, H) / logits (M, Vd) the head's last step at
        each origin's prefix, kv its cache, base (M, K0) the cache keys each origin sees, P (M,) the prefix
        lengths, ks the depth allowed at each (>= 1). Nodes are ranked by (path log-probability, creation order),
        so that a parent always ranks before its children."""
        M, dev, W = logits.shape[0], logits.device, self.width
        tok, par, lp, conf, ent, dep = ([[] for _ in range(M)] for _ in range(6))  # per origin, per node
        hout: list[dict] = [{} for _ in range(M)]  # node -> the head's output state after feeding it
        fed: list[dict] = [{} for _ in range(M)]  # node -> its row among the fed keys (after the K0 of the cache)
        vis = torch.zeros(0, 0, dtype=torch.bool, device=dev)  # fed row -> the fed rows it sees, itself included
        cur = [(m, -1, m) for m in range(M)]  # (origin, node whose children `logits` row r gives, r)
        for d in range(1, max(ks) + 1):
            logp = torch.log_softmax(logits.float(), -1)
            e = (-(logp.exp() * logp.clamp_min(-1e30)).sum(-1)).clamp_min(0.0).tolist()
            top_lp, top_i = logp.topk(min(W, logp.shape[-1]), -1)
            top_t, top_lp = self.model.to_target(top_i).tolist(), top_lp.tolist()
            for m, f, r in cur:
                if d > ks[m]:
                    continue
                for t, x in zip(top_t[r], top_lp[r]):
                    tok[m].append(int(t))
                    par[m].append(f)
                    lp[m].append((0.0 if f < 0 else lp[m][f]) + x)
                    conf[m].append(min(1.0, math.exp(x)))
                    ent[m].append(e[r])
                    dep[m].append(d)
            rows = []  # the nodes expanded next: each origin's W most probable of depth d, where it may go deeper
            for m in range(M):
                if d < ks[m]:
                    at = [i for i in range(len(tok[m])) if dep[m][i] == d]
                    rows += [(m, x) for x in sorted(at, key=lambda i, m=m: (-lp[m][i], i))[:W]]
            if not rows:
                break
            Q, F = len(rows), vis.shape[0]
            om = torch.tensor([m for m, _ in rows], device=dev)
            prow = torch.tensor([fed[m].get(par[m][x], -1) for m, x in rows], device=dev)  # -1: a child of the root
            seen = torch.zeros(Q, F + Q, dtype=torch.bool, device=dev)
            if F:
                seen[:, :F] = vis[prow.clamp_min(0)] & (prow >= 0)[:, None]
            seen[:, F:] = torch.eye(Q, dtype=torch.bool, device=dev)
            vis = torch.cat([torch.cat([vis, torch.zeros(F, Q, dtype=torch.bool, device=dev)], 1), seen], 0)
            allow = torch.cat([base[om], seen], 1)
            hin = torch.stack([hout[m][par[m][x]] if par[m][x] >= 0 else h[0, m] for m, x in rows])
            t_in = torch.tensor([tok[m][x] for m, x in rows], device=dev)
            pos = P[om] + (d - 1)  # a depth-d node sits where the output's d-th token would
            hnew, lg, kv = self.model.step(hin[None], t_in[None], pos[None], kv, allow[None, None])
            logits = lg[0]
            for r, (m, x) in enumerate(rows):
                fed[m][x], hout[m][x] = F + r, hnew[0, r]
            cur = [(m, x, r) for r, (m, x) in enumerate(rows)]
        out = []
        for m in range(M):
            keep = sorted(range(len(tok[m])), key=lambda i, m=m: (-lp[m][i], i))[: self.tree]
            keep.sort(key=lambda i, m=m: (dep[m][i], -lp[m][i], i))  # by depth: parents before children
            new = {x: i for i, x in enumerate(keep)}
            out.append(Draft([tok[m][x] for x in keep], [conf[m][x] for x in keep], [ent[m][x] for x in keep],
                             None, [new.get(par[m][x], -1) for x in keep]))  # fmt: skip
        return out

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
            if self.tree:  # origin m sees pairs 0..P-2, as its chain would
                base = torch.arange(n_seq, device=dev)[None, :] < (P - 1)[:, None]
                for m, d in zip(
                    orig, self._grow(hs[:, P - 2], lgs[0, P - 2], kv_seq, base, P, [seq.ks[p] for p in orig])
                ):
                    out[m] = d
                continue
            kmax = max(seq.ks[p] for p in orig)
            allow_at = lambda step, P=P: chain_allow(P - 1, n_seq, step)[None, None]
            # chain m sees pairs 0..P-2 and its own earlier chain tokens
            toks, confs, ents = self._chain(hs[:, P - 2], lgs[0, P - 2], kv_seq, T, seq.pkey, o, P, kmax, allow_at)
            for m, d in zip(orig, self._assemble(toks, confs, ents, T, [seq.ks[p] for p in orig])):
                out[m] = d
        self.kv, self.kv_ids = None, []
        return out
