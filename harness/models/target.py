"""The target side: plain generation (the reference output and its features) and the
verification of one or several drafts against one prefix in a single forward.

Verification input is a *trunk* (prefix tokens not yet in the KV cache: normally the last
one) followed by N draft chains; chain i's token j sits at position P+j and sees the cache,
the trunk and chain i up to itself (a tree attention mask), so N drafts cost one forward.
Chain 0 is placed first so that its accepted tokens are contiguous after the trunk in the
cache: cropping keeps them and the next block only feeds its bonus token. One chain (live
decoding with one drafter) is a plain causal forward over cache + trunk + chain: its tree mask is
the causal mask, so no tree mask is built.

Exactness at low precision. In bfloat16 a position's logits depend, in their last bits, on the
shape of the forward that computed them (how many queries, which mask): a verification forward
of k+1 tokens and generation's one-token forwards can disagree on a near-tie, and then a dense
log (made by generation) differs from a live run (made by verification). `exact=True` verifies
by feeding the trunk and each chain through the target one token at a time with a plain causal
mask, exactly the forwards generation makes, so every decision, cache entry and feature is
bit-identical to generation's at any dtype; it costs up to 1 + sum(len(chain)) target forwards
per block. Generation always prefills prompt[:-1] and then feeds the last prompt token alone,
which is what the live loop does too.

Padding (`pad`, {Q: Q'}). On a CPU the matrix kernels change regime with the row count, and a forward of Q rows can
cost more than one of Q' > Q rows (bench/pass_cost.py; oneDNN at 2 rows on the SmolLM2 host, bench/early_stop.py).
A one-chain verification of Q tokens (trunk + chain) is then run as Q' tokens: the chain's last token repeated after
it, whose rows (causal: no real row sees them) are dropped and whose cache entries are cropped before `verify`
returns, so the verdicts, features and cache are those of the Q-token forward up to the kernels' rounding. GPU
engines pad to their captured graph sizes for the same reason. Plain generation (one token) is never padded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from bandit.logs.schema import tree_depths

from . import lm
from .sampling import choose, probs


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def now_ms(device: str) -> float:
    sync(device)
    return time.perf_counter() * 1000.0


@dataclass
class Verdict:
    """The target's reading of one draft chain."""

    accepted: int  # leading draft tokens equal to the target's own choice (a tree: the accepted path's length)
    choices: list[int]  # the target's token at positions P..P+len(draft): bonus = choices[accepted]
    p: list[float]  # the target's probability of each draft token (temperature applied)
    path: list[int] | None = None  # a tree: the accepted nodes, root first (a chain: None, the first `accepted`)


def check_pad(pad: dict | None, where: str = "pad") -> dict[int, int]:
    """A verification padding table {Q: Q'} (Q' > Q >= 2), checked; None or {}: no padding."""
    out = {}
    for q, to in (pad or {}).items():
        ok = all(isinstance(x, int) and not isinstance(x, bool) for x in (q, to))
        if not ok or not 2 <= q < to <= 1 << 12:
            raise lm.HarnessError(f"{where}: {q!r}:{to!r}: expected Q:Q' with 2 <= Q < Q' <= 4096 (a forward of Q "
                                  "tokens run as Q')")  # fmt: skip
        out[q] = to
    return out


class Target:
    def __init__(
        self,
        model,
        tokenizer,
        device: str = "cpu",
        temperature: float = 0.0,
        exact: bool = False,
        pad: dict[int, int] | None = None,
    ):
        self.model, self.tokenizer, self.device, self.T = model, tokenizer, device, temperature
        self.exact = exact  # verify one token per forward, as generation does (see the module's doc)
        self.pad = check_pad(pad)  # {Q: Q'}: a one-chain verification of Q tokens runs as Q' (see the module's doc)
        eos = getattr(model.generation_config, "eos_token_id", None) or tokenizer.eos_token_id
        self.eos = set(eos if isinstance(eos, (list, tuple)) else ([eos] if eos is not None else []))

    # ---------------------------------------------------------------- reference output
    def _fwd(self, ids: list[int], cache, taps, last_logits: bool = False, feats: bool = True):
        """One plain causal forward; feats as `lm.forward` gives them for `taps` (None: "last" alone; feats=False:
        none)."""
        t = torch.tensor(ids, device=self.device)
        if not feats:
            return lm.forward(self.model, t, cache, last_logits=last_logits)
        if taps is None:
            return lm.forward(self.model, t, cache, hidden=True, last_logits=last_logits)
        return lm.forward(self.model, t, cache, taps=taps, last_logits=last_logits)

    def generate(
        self, prompt: list[int], max_new: int, pkey: int, taps=None, timings: dict | None = None, feats: bool = True
    ):
        """Token-by-token output y (stops after EOS) and the target features at positions
        0..len(prompt)+len(y)-2. Returns (y, feats, cache over those positions): feats is the
        "last" hidden state (N, H), or {key: (N, H)} for the keys in `taps`. `timings` (a dict, the
        live phase's `plain` configuration): gets the prefill's ms ("prefill_ms") and (1, 1, ms) per
        one-token forward after it ("verify"), as the live engine times its forwards. feats=False (plain decoding,
        where nothing reads them): no features (None), and the prefill computes no logits but its last."""
        cache = lm.new_cache()
        dev = self.device
        clock = (lambda: now_ms(dev)) if timings is not None else (lambda: 0.0)
        steps: list = []
        feats_, y = [], []
        t0 = clock()
        if len(prompt) > 1:  # the live loop's prefill, so that both make the same forwards
            feats_.append(self._fwd(prompt[:-1], cache, taps, last_logits=True, feats=feats)[1])  # its logits unread
        t1 = clock()
        prefill_ms = t1 - t0
        logits, f = self._fwd(prompt[-1:], cache, taps, feats=feats)
        steps.append((1, 1, clock() - t1))
        feats_.append(f)
        for t in range(max_new):
            y.append(int(self._choose(logits[-1:], pkey, t)))
            if y[-1] in self.eos or t + 1 == max_new:
                break
            t1 = clock()
            logits, f = self._fwd([y[-1]], cache, taps, feats=feats)
            steps.append((1, 1, clock() - t1))
            feats_.append(f)
        if timings is not None:
            timings.update(prefill_ms=prefill_ms, verify=steps, draft={})
        return y, (_cat(feats_) if feats else None), cache

    # -------------------------------------------------------------------- verification
    def verify(
        self,
        cache,
        trunk: list[int],
        chains: list[list[int]],
        n_prompt: int,
        pkey: int,
        want_p: bool = True,
        taps=None,
        parents: list[list[int] | None] | None = None,
    ):
        """Verify `chains` after cache + trunk in one forward (exact: one token per forward).
        Returns (verdicts, trunk features, chain features list): the "last" hidden state
        (len(trunk), H) and [(len(chain), H)], or dicts {key: ...} for the keys in `taps`. The
        cache is left extended by the whole tree (trunk, then every chain's keys in order): crop
        it afterwards. `parents[i]` (None: a chain): draft i is a tree whose node j hangs under node
        parents[i][j] (-1: the root), each node seeing its ancestors only; its verdict's `path` names the
        accepted nodes (their features and keys are at those rows of the draft's span)."""
        c0 = lm.cache_len(cache)
        P = c0 + len(trunk)  # prefix length
        parents = list(parents) if parents is not None else [None] * len(chains)
        if len(parents) != len(chains):
            raise lm.HarnessError(f"verify: {len(parents)} parent lists for {len(chains)} drafts")
        trees = any(par is not None for par in parents)
        if self.exact and trees:
            raise lm.HarnessError(
                "a tree of drafts cannot be verified one token per forward (exact); drop --exact-verify"
            )
        if self.exact:
            logits, feats, spans = self._forward_exact(cache, trunk, chains, taps)
        else:
            logits, feats, spans = self._forward_tree(cache, trunk, chains, taps, parents if trees else None)
        verdicts, chain_feats = [], []
        r = len(trunk) - 1  # the root: the trunk's last row predicts position P
        for (s, n), c, par in zip(spans, chains, parents):
            if par is not None:
                verdicts.append(self._tree_verdict(logits[r : r + 1], logits[s : s + n], c, par, P - n_prompt, pkey,
                                                   want_p))  # fmt: skip
            else:  # (n+1, V): predictions for P..P+n; one chain right after the trunk is a plain slice, no copy
                rows = logits[r : s + n] if s == r + 1 else torch.cat([logits[r : r + 1], logits[s : s + n]])
                verdicts.append(self._verdict(rows, c, P - n_prompt, pkey, want_p))
            chain_feats.append(_rows(feats, s, s + n))
        return verdicts, _rows(feats, 0, len(trunk)), chain_feats

    def _choose(self, rows: torch.Tensor, pkey: int, out0: int) -> torch.Tensor:
        """The target's tokens (Q,) for rows (Q, V) at output positions out0..: sampling.choose, whose greedy
        argmax is taken here as `max(-1).indices` (the same index, the first maximum, in a third of the time on
        the CPU) and keys no noise."""
        if self.T <= 0:
            return rows.max(-1).indices
        return choose(rows, self.T, pkey, torch.arange(out0, out0 + rows.shape[0], device=self.device))

    def _verdict(self, rows: torch.Tensor, c: list[int], out0: int, pkey: int, want_p: bool) -> Verdict:
        dev, n = self.device, len(c)
        ch = self._choose(rows, pkey, out0).tolist()  # one round trip for the whole block
        a = 0
        while a < n and c[a] == ch[a] and ch[a] not in self.eos:
            a += 1
        if a < n and c[a] == ch[a]:  # an accepted EOS ends the output: count it, no bonus follows
            a += 1
        p = []
        if want_p and n:
            pr = probs(rows[:n], self.T)
            p = pr.gather(1, torch.tensor(c, device=dev)[:, None])[:, 0].clamp(0, 1).tolist()
        return Verdict(a, ch, p)

    def _tree_verdict(self, root, rows, c: list[int], par: list[int], out0: int, pkey: int, want_p: bool) -> Verdict:
        """A tree draft's verdict from the root's row (1, V) and its nodes' rows (n, V): from the root, the child
        whose token is the target's choice, as deep as it goes (bandit.logs.schema.tree_path), an accepted EOS
        ending it as in `_verdict`."""
        depth = tree_depths(par)
        lg = torch.cat([root, rows])  # row 0 predicts output position out0, node j's row out0 + depth[j]
        at = torch.tensor([out0] + [out0 + d for d in depth], device=self.device)
        ch = (lg.max(-1).indices if self.T <= 0 else choose(lg, self.T, pkey, at)).tolist()
        path, at_node = [], -1
        while True:
            want = ch[at_node + 1]
            nxt = next((j for j, q in enumerate(par) if q == at_node and c[j] == want), None)
            if nxt is None:
                break
            path.append(nxt)
            at_node = nxt
            if want in self.eos:  # an accepted EOS ends the output: no bonus follows
                break
        choices = [ch[0]] + [ch[j + 1] for j in path]
        p = []
        if want_p and c:
            pr = probs(lg[[q + 1 for q in par]], self.T)  # node j under its parent's row
            p = pr.gather(1, torch.tensor(c, device=self.device)[:, None])[:, 0].clamp(0, 1).tolist()
        return Verdict(len(path), choices, p, path)

    def _forward_tree(self, cache, trunk, chains, taps, parents=None):
        """The whole tree in one forward: (logits (Q, V), feats over the Q rows, chain spans). One chain
        (live decoding with one drafter) is a plain causal forward over trunk + chain: its tree mask
        is the causal mask, so no tree mask is built (see `_forward_chain`). `parents`: per draft, None (a
        chain) or its tree's parent list (`verify`): a node sits at position P + depth - 1 and sees its ancestors."""
        if parents is None:
            parents = [None] * len(chains)
        if len(chains) == 1 and parents[0] is None:
            return self._forward_chain(cache, trunk, chains[0], taps)
        dev = self.device
        c0 = lm.cache_len(cache)
        P = c0 + len(trunk)
        Q = len(trunk) + sum(len(c) for c in chains)
        ids = torch.tensor(trunk + [t for c in chains for t in c], device=dev)
        pos = torch.empty(Q, dtype=torch.long, device=dev)
        pos[: len(trunk)] = torch.arange(c0, P, device=dev)
        allow = torch.zeros(Q, c0 + Q, dtype=torch.bool, device=dev)
        allow[:, :c0] = True
        allow[: len(trunk), c0:P] = torch.ones(len(trunk), len(trunk), dtype=torch.bool, device=dev).tril()
        allow[len(trunk) :, c0:P] = True
        start = len(trunk)
        spans = []
        for c, par in zip(chains, parents):
            n = len(c)
            par = list(range(-1, n - 1)) if par is None else par  # a chain: node j under node j - 1
            anc = torch.eye(n, dtype=torch.bool, device=dev)  # node j sees itself and its ancestors
            for j, q in enumerate(par):
                if q >= 0:
                    anc[j] |= anc[q]
            pos[start : start + n] = P - 1 + torch.tensor(tree_depths(par), device=dev, dtype=torch.long)
            allow[start : start + n, c0 + start : c0 + start + n] = anc
            spans.append((start, n))
            start += n
        if taps is None:
            logits, feats = lm.forward(self.model, ids, cache, pos=pos, allow=allow, hidden=True)
        else:
            logits, feats = lm.forward(self.model, ids, cache, pos=pos, allow=allow, taps=taps)
        return logits, feats, spans

    def _forward_chain(self, cache, trunk, chain, taps):
        """One chain after the trunk: token i of trunk + chain sits at position c0 + i and sees the cache and
        the tokens before it: the causal mask (`lm.forward(causal=True)`: from a template, no allow matrix)
        and the default positions after the cache. The same spans as `_forward_tree`."""
        toks = trunk + chain
        q = len(toks)
        extra = self.pad.get(q, q) - q
        if extra:
            c0 = lm.cache_len(cache)
            toks = toks + toks[-1:] * extra
        ids = torch.tensor(toks, device=self.device)
        if taps is None:
            logits, feats = lm.forward(self.model, ids, cache, hidden=True, causal=True)
        else:
            logits, feats = lm.forward(self.model, ids, cache, taps=taps, causal=True)
        if extra:  # the padding's rows and cache entries go; no real row attended to them
            lm.crop(cache, c0 + q)
            logits, feats = logits[:q], _rows(feats, 0, q)
        return logits, feats, [(len(trunk), len(chain))]

    def _forward_exact(self, cache, trunk, chains, taps):
        """The tree one token per forward: the trunk, then each chain after the trunk alone; the
        chains' keys are then laid out one after another, as the tree forward leaves them."""
        rows, feats, spans, kept = [], [], [], []
        for t in trunk:
            lg, f = self._fwd([t], cache, taps)
            rows.append(lg)
            feats.append(f)
        P, start = lm.cache_len(cache), len(trunk)
        for c in chains:
            for t in c:
                lg, f = self._fwd([t], cache, taps)
                rows.append(lg)
                feats.append(f)
            kept.append(lm.kv_tail(cache, P))
            lm.crop(cache, P)
            spans.append((start, len(c)))
            start += len(c)
        for kv in kept:
            lm.kv_extend(cache, kv)
        return torch.cat(rows), _cat(feats), spans

    def teacher_forced(self, prompt: list[int], y: list[int], pkey: int) -> list[int]:
        """The target's token at output position i given prompt + y[:i], for every i, from one
        verification forward of one chain (y[:-1] after the trunk prompt[-1:], as live runs verify) after a
        prefill of prompt[:-1] (never the exact path): what the engine's target check compares with a
        run's own tokens."""
        if not y:
            return []
        cache = lm.new_cache()
        if len(prompt) > 1:
            lm.forward(self.model, torch.tensor(prompt[:-1], device=self.device), cache)
        logits, _, _ = self._forward_tree(cache, prompt[-1:], [y[:-1]], ())
        return self._choose(logits, pkey, 0).tolist()

    def score_dense(
        self,
        cache,
        ids: list[int],
        n_prompt: int,
        origins: list[int],
        chains: list[list[list[int]]],
        pkey: int,
        max_q: int = 1024,
    ) -> list[list[list[float]]]:
        """Target probabilities of every draft token at every origin (dense mode, sampling).
        `cache` covers ids[:-1]; for origin o (prefix length P) a copy of token P-1 is the
        root, seeing sequence keys < P-1, and each of that origin's chains hangs off it.
        Returns p[origin][chain][j]; the cache is cropped back."""
        dev, n_seq = self.device, lm.cache_len(cache)
        out: list[list[list[float]]] = [[] for _ in origins]
        groups, cur, size = [], [], 0
        for i, cs in enumerate(chains):
            n = 1 + sum(len(c) for c in cs)
            if cur and size + n > max_q:
                groups.append(cur)
                cur, size = [], 0
            cur.append(i)
            size += n
        if cur:
            groups.append(cur)
        for g in groups:
            toks, pos, lim, roots, spans = [], [], [], [], []
            for i in g:
                P = n_prompt + origins[i]
                roots.append(len(toks))
                toks.append(ids[P - 1])
                pos.append(P - 1)
                lim.append(P - 1)
                sp = []
                for c in chains[i]:
                    sp.append((len(toks), len(c)))
                    toks += c
                    pos += list(range(P, P + len(c)))
                    lim += [P - 1] * len(c)
                spans.append(sp)
            Q = len(toks)
            allow = torch.zeros(Q, n_seq + Q, dtype=torch.bool, device=dev)
            allow[:, :n_seq] = torch.arange(n_seq, device=dev)[None, :] < torch.tensor(lim, device=dev)[:, None]
            for r, sp in zip(roots, spans):
                allow[r, n_seq + r] = True
                for s, n in sp:
                    allow[s : s + n, n_seq + r] = True
                    allow[s : s + n, n_seq + s : n_seq + s + n] = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
            logits, _ = lm.forward(
                self.model, torch.tensor(toks, device=dev), cache, pos=torch.tensor(pos, device=dev), allow=allow
            )
            lm.crop(cache, n_seq)
            pr = probs(logits, self.T)
            for i, r, sp in zip(g, roots, spans):
                for s, n in sp:
                    prev = torch.tensor([r] + list(range(s, s + n - 1)), device=dev)[:n]
                    tk = torch.tensor(toks[s : s + n], device=dev)
                    out[i].append(pr[prev].gather(1, tk[:, None])[:, 0].clamp(0, 1).tolist() if n else [])
        return out


def _cat(parts: list):
    """Concatenate per-forward features: tensors (n_i, H), or dicts of them key by key."""
    if parts and isinstance(parts[0], dict):
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    return torch.cat(parts)


def _rows(feats, lo: int, hi: int):
    if isinstance(feats, dict):
        return {k: v[lo:hi] for k, v in feats.items()}
    return feats[lo:hi]
