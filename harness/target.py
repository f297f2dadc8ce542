"""The target side: plain generation (the reference output and its features) and the
verification of one or several drafts against one prefix in a single forward.

Verification input is a *trunk* (prefix tokens not yet in the KV cache: normally the last
one) followed by N draft chains; chain i's token j sits at position P+j and sees the cache,
the trunk and chain i up to itself (a tree attention mask), so N drafts cost one forward.
Chain 0 is placed first so that its accepted tokens are contiguous after the trunk in the
cache: cropping keeps them and the next block only feeds its bonus token.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

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
    accepted: int  # leading draft tokens equal to the target's own choice
    choices: list[int]  # the target's token at positions P..P+len(draft): bonus = choices[accepted]
    p: list[float]  # the target's probability of each draft token (temperature applied)


class Target:
    def __init__(self, model, tokenizer, device: str = "cpu", temperature: float = 0.0):
        self.model, self.tokenizer, self.device, self.T = model, tokenizer, device, temperature
        eos = getattr(model.generation_config, "eos_token_id", None) or tokenizer.eos_token_id
        self.eos = set(eos if isinstance(eos, (list, tuple)) else ([eos] if eos is not None else []))

    # ---------------------------------------------------------------- reference output
    def generate(self, prompt: list[int], max_new: int, pkey: int):
        """Token-by-token output y (stops after EOS) and the target features at positions
        0..len(prompt)+len(y)-2. Returns (y, feats, cache over those positions)."""
        cache = lm.new_cache()
        dev = self.device
        logits, f = lm.forward(self.model, torch.tensor(prompt, device=dev), cache, hidden=True)
        feats, y = [f], []
        for t in range(max_new):
            tok = choose(logits[-1:], self.T, pkey, torch.tensor([t], device=dev))
            y.append(int(tok))
            if y[-1] in self.eos or t + 1 == max_new:
                break
            logits, f = lm.forward(self.model, tok, cache, hidden=True)
            feats.append(f)
        return y, torch.cat(feats), cache

    # -------------------------------------------------------------------- verification
    def verify(self, cache, trunk: list[int], chains: list[list[int]], n_prompt: int, pkey: int,
               want_p: bool = True):
        """Verify `chains` after cache + trunk in one forward. Returns (verdicts, trunk
        features (len(trunk), H), chain features list). The cache is left extended by the
        whole tree: crop it with `keep` afterwards."""
        dev = self.device
        c0 = lm.cache_len(cache)
        P = c0 + len(trunk)  # prefix length
        Q = len(trunk) + sum(len(c) for c in chains)
        ids = torch.tensor(trunk + [t for c in chains for t in c], device=dev)
        pos = torch.empty(Q, dtype=torch.long, device=dev)
        pos[: len(trunk)] = torch.arange(c0, P, device=dev)
        allow = torch.zeros(Q, c0 + Q, dtype=torch.bool, device=dev)
        allow[:, :c0] = True
        allow[: len(trunk), c0: P] = torch.ones(len(trunk), len(trunk), dtype=torch.bool, device=dev).tril()
        allow[len(trunk):, c0: P] = True
        start = len(trunk)
        spans = []
        for c in chains:
            n = len(c)
            pos[start: start + n] = torch.arange(P, P + n, device=dev)
            allow[start: start + n, c0 + start: c0 + start + n] = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
            spans.append((start, n))
            start += n
        logits, feats = lm.forward(self.model, ids, cache, pos=pos, allow=allow, hidden=True)
        verdicts, chain_feats = [], []
        root = logits[len(trunk) - 1: len(trunk)]
        for (s, n), c in zip(spans, chains):
            rows = torch.cat([root, logits[s: s + n]])  # (n+1, V): predictions for P..P+n
            out_pos = torch.arange(P - n_prompt, P - n_prompt + n + 1, device=dev)
            ch = choose(rows, self.T, pkey, out_pos).tolist()
            a = 0
            while a < n and c[a] == ch[a] and ch[a] not in self.eos:
                a += 1
            if a < n and c[a] == ch[a]:  # an accepted EOS ends the output: count it, no bonus follows
                a += 1
            p = []
            if want_p and n:
                pr = probs(rows[:n], self.T)
                p = pr.gather(1, torch.tensor(c, device=dev)[:, None])[:, 0].clamp(0, 1).tolist()
            verdicts.append(Verdict(a, ch, p))
            chain_feats.append(feats[s: s + n])
        return verdicts, feats[: len(trunk)], chain_feats

    def score_dense(self, cache, ids: list[int], n_prompt: int, origins: list[int], chains: list[list[list[int]]],
                    pkey: int, max_q: int = 1024) -> list[list[list[float]]]:
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
                groups.append(cur); cur, size = [], 0
            cur.append(i); size += n
        if cur:
            groups.append(cur)
        for g in groups:
            toks, pos, lim, roots, spans = [], [], [], [], []
            for i in g:
                P = n_prompt + origins[i]
                roots.append(len(toks)); toks.append(ids[P - 1]); pos.append(P - 1); lim.append(P - 1)
                sp = []
                for c in chains[i]:
                    sp.append((len(toks), len(c)))
                    toks += c; pos += list(range(P, P + len(c))); lim += [P - 1] * len(c)
                spans.append(sp)
            Q = len(toks)
            allow = torch.zeros(Q, n_seq + Q, dtype=torch.bool, device=dev)
            allow[:, :n_seq] = torch.arange(n_seq, device=dev)[None, :] < torch.tensor(lim, device=dev)[:, None]
            for r, sp in zip(roots, spans):
                allow[r, n_seq + r] = True
                for s, n in sp:
                    allow[s: s + n, n_seq + r] = True
                    allow[s: s + n, n_seq + s: n_seq + s + n] = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
            logits, _ = lm.forward(self.model, torch.tensor(toks, device=dev), cache,
                                   pos=torch.tensor(pos, device=dev), allow=allow)
            lm.crop(cache, n_seq)
            pr = probs(logits, self.T)
            for i, r, sp in zip(g, roots, spans):
                for s, n in sp:
                    prev = torch.tensor([r] + list(range(s, s + n - 1)), device=dev)[:n]
                    tk = torch.tensor(toks[s: s + n], device=dev)
                    out[i].append(pr[prev].gather(1, tk[:, None])[:, 0].clamp(0, 1).tolist() if n else [])
        return out
