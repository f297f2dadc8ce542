"""The cascade (`cascade`): a composition of drafters named before it, extending one's draft by another's or
taking the first non-empty one."""

from __future__ import annotations

from ..models.lm import HarnessError
from .base import Draft, Drafter, Prefix, Sequence, feature_layers


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
        trees = [p for p, d in zip(self.parts, self.drafters) if getattr(d, "tree", 0)]
        if trees:
            raise HarnessError(f"--drafter {name}=cascade: {trees[0]} drafts a tree, and a cascade combines chains")
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
