"""One prompt at a time, in one of three modes, to schema-v1 block records.

* dense: the target's output y is generated once; every drafter drafts at every output
  position (teacher-forced and batched where the drafter supports it); accepted = longest
  common prefix with y[pos:]. A record at every position, no `block` field.
* sparse: the research README's design: at each block start of one behaviour drafter's
  trajectory every drafter drafts from the identical prefix and the target verifies all
  drafts in one forward; the behaviour drafter's draft advances the output.
* live: real speculative decoding with one drafter, or with a policy choosing a drafter
  per block, or best-of-N (`best_of_n=True`: every drafter drafts, one tree forward verifies
  all drafts, the longest accepted one advances the output; ties go to the first drafter);
  wall times per block. Under a policy the lookup drafters (LOOKUP_KINDS) draft at every block
  with room for a draft, before it chooses (their lengths and features are in its Context, their
  calls are timed and counted), only the chosen draft is verified, and the policy is told the chosen drafter's
  acceptance, or, when it is `full_information`, also each lookup's, censored to what the block
  revealed (the common prefix of its draft with the block's new tokens); a policy with
  `observe_step(n_verified, n_drafts, ms)` is given each verify forward's measured time.

Draft length at output position pos is min(k, max_new_tokens - 1 - pos) in every mode, so a
block never overruns the budget and the three modes see the same prefixes and drafts.

Target hidden states: the engine asks the target, in every forward, for the union of what its
drafters declare (`drafters.feature_layers`) and keeps one buffer per key over the prompt's positions;
"last" (the lm_head's input) too in dense mode and with `states=True` (PromptResult.hidden and .state then
hold it). A sparse or live run whose drafters read nothing (lookups) taps nothing: its forwards are plain
decoding's, with no hook, and its prefill computes the last row's logits only, as `Target.generate` does.

The target check (`check=True`; sweep.py turns it on): after each prompt, one teacher-forced
verification forward over its final sequence (prompt + output, one chain after the trunk, the shape
that live runs verify) recomputes the target's token at every output position; `PromptResult.check` counts
where it differs from the run's own token (in dense mode: generation's). At float32 that is 0 in
practice; at bfloat16 near-ties flip, and a dense log may then differ from a live run (see
target.py, `exact`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import numpy as np
import torch

from bandit.logs.schema import EMPTY_DRAFT_FEATURES, LOOKUP_KINDS, ArmsOnly, Context, Timing, draft_features

from ..drafters import common_prefix, Draft, Prefix, Sequence, feature_layers
from ..models.lm import LAST, HarnessError
from ..models import lm
from ..models.sampling import expected_accepted, prompt_key
from ..models.target import Target, now_ms

MODES = ("dense", "sparse", "live")


@dataclass
class RunConfig:
    mode: str = "dense"  # dense | sparse | live
    k: int = 8  # maximum draft length
    max_new_tokens: int = 128  # output budget per prompt
    temperature: float = 0.0  # 0 = greedy; > 0: Gumbel-max coupled sampling
    seed: int = 0  # keys all sampling noise
    behaviour: str | None = None  # sparse: whose draft advances the output (default: the first drafter)
    generator: str | None = None  # dense: make y by speculative decoding with this drafter (same y, fewer passes)

    def check(self, drafters: list[str]) -> None:
        if self.mode not in MODES:
            raise HarnessError(f"--mode {self.mode!r}: expected one of {', '.join(MODES)}")
        from harness.models import options  # the bounds sweep.py's --help states

        options.integer("--k", self.k)  # the draft length
        options.integer("--max-new-tokens", self.max_new_tokens)
        options.temperature(self.temperature)  # finite: never a NaN into a manifest
        options.seed(self.seed)
        if self.behaviour is not None and self.behaviour not in drafters:
            raise HarnessError(f"--behaviour {self.behaviour!r}: not among the drafters {drafters}")
        if self.generator is not None and self.generator not in drafters:
            raise HarnessError(f"--generator {self.generator!r}: not among the drafters {drafters}")


def _r(x: float, nd: int = 6) -> float:
    return round(float(x), nd)


def draft_record(d: Draft, accepted: int, exp_acc: float | None, ms: float | None) -> dict:
    rec = {
        "tokens": [int(t) for t in d.tokens],
        "accepted": int(accepted),
        "conf": [min(1.0, max(0.0, _r(c))) for c in d.conf],
        "entropy": [max(0.0, _r(e)) for e in d.entropy],
    }
    if d.parents is not None:  # a tree: its nodes in `tokens`, so draft_len is what the target verifies
        rec["parents"] = [int(q) for q in d.parents]
    if exp_acc is not None:
        rec["expected_accepted"] = min(float(len(d.tokens)), _r(exp_acc))
    if ms is not None:
        rec["ms"] = _r(ms, 3)
    return rec


def record_features(d: Draft) -> np.ndarray:
    """(4,) FEATURES of a draft from its conf and entropy rounded as its record rounds them (`draft_record`):
    what a replay of the log reads, to the last bit."""
    r = draft_record(d, 0, None, None)
    return np.asarray(draft_features(r["conf"], r["entropy"]))


@dataclass
class PromptResult:
    records: list[dict]
    output: list[int]
    timings: dict = field(default_factory=dict)  # live/sparse: raw wall times for calibration
    # sparse/live: ("last" state (len(ids)-1, H), None when not tapped; cache over ids[:-1])
    state: tuple | None = None
    hidden: dict = field(default_factory=dict)  # sparse/live: every tapped state, key -> (len(ids)-1, H)
    check: dict | None = None  # the target check: {"tokens", "disagreements", "first"} (None: not run)


class Engine:
    def __init__(
        self,
        target: Target,
        drafters: dict,
        cfg: RunConfig,
        policy=None,
        workloads: list[str] = (),
        best_of_n: bool = False,
        check: bool = False,
        timing: Timing | None = None,
        states: bool = False,
    ):
        cfg.check(list(drafters))
        self.target, self.drafters, self.cfg, self.policy = target, drafters, cfg, policy
        self.best_of_n = best_of_n
        self.check = check  # the target check after each prompt (see the module's doc)
        self.states = states or cfg.mode == "dense"  # keep the "last" state of every position (module doc)
        self.taps = self._taps()
        if best_of_n and (cfg.mode != "live" or policy is not None):
            raise HarnessError("best-of-N is a live mode without a policy")
        self.names = list(drafters)
        self.workloads = list(workloads)
        self.n_prompts = 0
        self.dev = target.device
        if cfg.mode == "live" and policy is None and not best_of_n and len(drafters) != 1:
            raise HarnessError(
                f"--mode live runs one drafter, or a --policy choosing among several; "
                f"got {len(drafters)} drafters and no policy"
            )
        self.lookups = [n for n in self.names if getattr(drafters[n], "kind", "") in LOOKUP_KINDS]
        arms = [i for i, n in enumerate(self.names) if not getattr(drafters[n], "tree", 0)]
        if policy is not None and not arms:
            raise HarnessError("a policy needs a drafter to choose, and every drafter here drafts a tree")
        wrap = not (isinstance(policy, ArmsOnly) or getattr(policy, "all_drafters", False))
        if policy is not None and len(arms) < len(self.names) and wrap:
            policy = self.policy = ArmsOnly(policy, arms)  # a tree is no policy's arm (schema.ArmsOnly)
        if policy is not None:  # bandit.schema's Policy protocol passes a Timing; a minimal policy may not take it
            params = inspect.signature(policy.reset).parameters
            if len(params) >= 3 or any(p.kind == p.VAR_POSITIONAL for p in params.values()):
                policy.reset(self.names, self.workloads, timing or Timing(k=cfg.k, lookup=tuple(self.lookups)))
            else:
                policy.reset(self.names, self.workloads)

    def _taps(self) -> frozenset:
        """The union of the drafters' declared target states (and "last" when states are kept), checked against
        the target."""
        keys = frozenset({LAST} if self.states else ()).union(*(feature_layers(d) for d in self.drafters.values()))
        n = int(getattr(self.target.model.config, "num_hidden_layers", 0) or 0)
        for key in keys - {LAST}:
            lm.parse_tap(key, n)
        if keys - {LAST}:
            lm.decoder_layers(self.target.model)  # a target whose layers cannot be found is refused now
        return keys

    def ks(self, n_out: int) -> list[int]:
        return [min(self.cfg.k, self.cfg.max_new_tokens - 1 - p) for p in range(n_out)]

    def _start(self, wl, pid):
        for d in self.drafters.values():
            getattr(d, "start", lambda *a: None)(wl, pid)

    def _finish(self, y):
        for d in self.drafters.values():
            getattr(d, "finish", lambda *a: None)(y)

    def run_prompt(self, workload: str, prompt_id: str, prompt: list[int], finish: bool = True) -> PromptResult:
        """`finish=False`: do not hand the output to the drafters (the caller does, once,
        when several configurations decode the same prompt)."""
        if not prompt:
            raise HarnessError(f"{workload}/{prompt_id}: empty prompt")
        pkey = prompt_key(self.cfg.seed, workload, prompt_id)
        self._start(workload, prompt_id)
        fn = self._dense if self.cfg.mode == "dense" else self._trajectory
        res = fn(workload, prompt_id, list(prompt), pkey)
        if self.check:
            res.check = self._check(list(prompt), res.output, pkey)
        if finish:
            self._finish(res.output)
        self.n_prompts += 1
        return res

    def skip(self, output: list[int]) -> None:
        """A prompt finished in an earlier session: give drafters its output, as if run."""
        self._finish(list(output))
        self.n_prompts += 1

    def _check(self, prompt: list[int], y: list[int], pkey: int) -> dict:
        """Teacher-forced verification of the final sequence vs the run's own tokens (see the module's doc)."""
        ch = self.target.teacher_forced(prompt, y, pkey)
        diff = [i for i, (a, b) in enumerate(zip(ch, y)) if a != b]
        return {"tokens": len(y), "disagreements": len(diff), "first": diff[0] if diff else None}

    def _head(self, wl, pid, pos) -> dict:
        return {"v": 1, "workload": wl, "prompt_id": pid, "pos": pos}

    # -------------------------------------------------------------------------- dense
    def _dense(self, wl, pid, prompt, pkey) -> PromptResult:
        cfg, T = self.cfg, self.cfg.temperature
        t0 = now_ms(self.dev)
        if cfg.generator is None:
            y, hidden, cache = self.target.generate(prompt, cfg.max_new_tokens, pkey, taps=self.taps)
        else:  # exact under greedy and under coupled sampling: the same y in fewer target passes
            gen = self._trajectory(wl, pid, prompt, pkey, only=cfg.generator)
            y, hidden, cache = gen.output, gen.hidden, gen.state[1]
            self._start(wl, pid)  # the generator drafter starts the prompt afresh for its dense drafts
        timings = {"generate_ms": now_ms(self.dev) - t0, "tokens": len(y)}
        seq = Sequence(prompt + y, len(prompt), hidden[LAST], pkey, T, self.ks(len(y)), hidden)
        done: dict[str, list[Draft]] = {}
        for name, d in self.drafters.items():
            t0 = now_ms(self.dev)
            dense = getattr(d, "dense", None)
            done[name] = dense(seq, done) if dense else [d.draft(seq.prefix(p), k) for p, k in enumerate(seq.ks)]
            timings[f"dense_ms.{name}"] = now_ms(self.dev) - t0
            if len(done[name]) != len(y) or any(x.depth > k for x, k in zip(done[name], seq.ks)):
                raise HarnessError(f"drafter {name}: dense() returned drafts of the wrong count or length")
        p = None
        if T > 0 and any(x.parents is not None for ds in done.values() for x in ds):
            raise HarnessError(
                "a tree of drafts is logged at temperature 0 only (its expected acceptance is a chain's)"
            )
        if T > 0:
            origins = list(range(len(y)))
            p = self.target.score_dense(
                cache, seq.ids, len(prompt), origins, [[done[n][o].tokens for n in self.names] for o in origins], pkey
            )
        recs = []
        for pos in range(len(y)):
            rec = self._head(wl, pid, pos)
            rec["drafts"] = {}
            for i, n in enumerate(self.names):
                d = done[n][pos]
                a = d.accepted(y[pos:])
                ea = float(a) if T == 0 else expected_accepted(p[pos][i], d.q or [1.0] * len(d.tokens))
                rec["drafts"][n] = draft_record(d, a, ea, None)
            recs.append(rec)
        return PromptResult(recs, y, timings)

    # ----------------------------------------------------------------- sparse and live
    def _order(self, ctx: Context | None) -> tuple[list[str], int | None]:
        """Which drafters draft this block (the first one's draft advances the output), and
        the policy's cut length for it (None: no cut)."""
        if self.cfg.mode == "sparse":
            b = self.cfg.behaviour or self.names[0]
            return [b] + [n for n in self.names if n != b], None
        if self.best_of_n:
            return list(self.names), None
        if self.policy is None:
            return self.names[:1], None
        choice = self.policy.choose(ctx)
        i, cut = choice if isinstance(choice, tuple) else (choice, None)
        i = int(i)
        if not 0 <= i < len(self.names):
            raise HarnessError(f"policy.choose returned {choice}, not an index into {self.names}")
        return [self.names[i]], (None if cut is None else max(0, int(cut)))

    def _trajectory(self, wl, pid, prompt, pkey, only: str | None = None) -> PromptResult:
        """Sparse and live decoding; `only`: live with that drafter, no policy (dense's generator)."""
        cfg, T, dev = self.cfg, self.cfg.temperature, self.dev
        tgt = self.target
        H = tgt.model.get_output_embeddings().weight.shape[1]
        n_buf = len(prompt) + cfg.max_new_tokens + cfg.k + 2
        dt = next(tgt.model.parameters()).dtype
        # one buffer per tapped state (N, H): rows 0..c-1 hold the target's states at positions 0..c-1
        fbuf = {key: torch.zeros(n_buf, H, device=dev, dtype=dt) for key in self.taps}
        cache, ids, y, c = lm.new_cache(), list(prompt), [], 0  # the cache covers ids[:c]
        t0 = now_ms(dev)
        if len(prompt) > 1:  # prefill, so that feature-reading drafters see the prompt's features
            _, f = lm.forward(tgt.model, torch.tensor(prompt[:-1], device=dev), cache, taps=self.taps, last_logits=True)
            _put(fbuf, 0, f)
            c = len(prompt) - 1
        D = len(self.names)
        pol = self.policy if not only else None
        full = bool(getattr(pol, "full_information", False))
        observe_step = getattr(pol, "observe_step", None)
        prev_acc, prev_feat = np.full(D, np.nan), np.full((D, 4), np.nan)
        recs, timings = [], {"verify": [], "draft": {n: [] for n in self.names}, "prefill_ms": now_ms(dev) - t0}
        if pol is not None:
            timings["chosen"] = []  # the drafter whose draft was verified, per block
        wl_i = self.workloads.index(wl) if wl in self.workloads else -1
        while len(y) < cfg.max_new_tokens:
            pos = len(y)
            k = min(cfg.k, cfg.max_new_tokens - 1 - pos)
            pre = Prefix(ids, len(prompt), fbuf.get(LAST), pkey, T, 0, fbuf)
            drafts, ms, uncut = {}, {}, {}
            dlen, dfeat, ctx = None, None, None  # the policy's context (no policy: none is built)
            if pol is not None:  # lookup drafts are cheap and known before choosing: made (and timed) at every block
                dlen = np.full(D, k, np.int32)  # int32, as the log's draft_len column (a replay's ctx)
                dfeat = np.full((D, 4), np.nan)
                for i, n in enumerate(self.names):
                    kind = getattr(self.drafters[n], "kind", "")
                    if kind in LOOKUP_KINDS and k > 0:
                        t0 = now_ms(dev)
                        drafts[n] = self.drafters[n].draft(pre, k)
                        ms[n] = now_ms(dev) - t0
                        dlen[i] = len(drafts[n].tokens)
                        dfeat[i] = record_features(drafts[n])
                    elif kind in LOOKUP_KINDS:  # no room for a draft: an empty one's features, as the log has them
                        dfeat[i] = EMPTY_DRAFT_FEATURES
                    elif kind == "medusa":
                        dlen[i] = min(k, self.drafters[n].heads.cfg.num_heads)
                    elif getattr(self.drafters[n], "tree", 0):  # a tree: its size, known before it drafts
                        dlen[i] = self.drafters[n].tree_size(k)
                    elif getattr(self.drafters[n], "max_len", None):  # one-pass drafters (dflash)
                        dlen[i] = min(k, self.drafters[n].max_len)
            looked = list(drafts)  # the lookups drafted before choosing
            if pol is not None:
                ctx = Context(wl_i, self.n_prompts, pos, prev_acc.copy(), prev_feat.copy(), dlen, dfeat)
            order, cut = ([only], None) if only else self._order(ctx)
            for n in order:
                if n not in drafts:
                    t0 = now_ms(dev)
                    drafts[n] = self.drafters[n].draft(pre, k) if k > 0 else Draft.empty()
                    ms[n] = now_ms(dev) - t0
                if cut is not None and cut < len(drafts[n].tokens):
                    uncut[n] = drafts[n]
                    drafts[n] = drafts[n].cut(cut)
                if drafts[n].depth > k:
                    raise HarnessError(f"drafter {n}: drafted {drafts[n].depth} tokens deep, asked for <= {k}")
                if drafts[n].parents is not None and T > 0:
                    raise HarnessError(f"drafter {n}: a tree of drafts is verified at temperature 0 only")
                timings["draft"][n].append(ms[n])
            for n in looked:  # a lookup not chosen was still drafted: its call counts
                if n not in order:
                    timings["draft"][n].append(ms[n])
            trunk = ids[c:]
            t0 = now_ms(dev)
            parents = [drafts[n].parents for n in order]
            verdicts, tf, cf = tgt.verify(
                cache, trunk, [drafts[n].tokens for n in order], len(prompt), pkey, want_p=T > 0, taps=self.taps,
                parents=parents if any(q is not None for q in parents) else None,
            )  # fmt: skip
            target_ms = now_ms(dev) - t0
            n_verified = len(trunk) + sum(len(drafts[n].tokens) for n in order)
            timings["verify"].append((n_verified, len(order), target_ms))
            if observe_step is not None:
                observe_step(n_verified, len(order), target_ms)
            j = max(range(len(order)), key=lambda i: (verdicts[i].accepted, -i)) if self.best_of_n else 0
            v0 = verdicts[j]
            a = v0.accepted
            path = list(range(a)) if v0.path is None else v0.path  # the accepted nodes of draft j
            new = [drafts[order[j]].tokens[i] for i in path]
            if not (new and new[-1] in tgt.eos):
                new = new + [v0.choices[a]]
            _put(fbuf, c, tf)
            rows = slice(0, a) if v0.path is None else path
            _put(fbuf, c + len(trunk), {key: v[rows] for key, v in cf[j].items()})
            src = c + len(trunk) + sum(len(drafts[n].tokens) for n in order[:j])  # draft j's keys
            c = c + len(trunk)
            if v0.path is None:
                lm.move_span(cache, c, src, a)
            else:
                lm.move_rows(cache, c, [src + i for i in path])
            c = c + a
            rec = self._head(wl, pid, pos)
            rec["block"] = len(recs)
            rec["drafts"] = {}
            if pol is not None:
                acc, obs = np.full(D, np.nan), np.zeros(D, dtype=bool)
            for n, v in zip(order, verdicts):
                d = drafts[n]
                ea = float(v.accepted) if T == 0 else expected_accepted(v.p, d.q or [1.0] * len(d.tokens))
                rec["drafts"][n] = dr = draft_record(d, v.accepted, ea, ms[n])
                if pol is not None:  # the next block's context
                    i = self.names.index(n)
                    acc[i], obs[i] = v.accepted, True
                    # as logged, so that replay sees the same; a cut draft: the features of what was drafted
                    prev_feat[i] = (
                        record_features(uncut[n]) if n in uncut else draft_features(dr["conf"], dr["entropy"])
                    )
            rec["target_ms"] = _r(target_ms, 3)
            recs.append(rec)
            if pol is not None:
                if full:  # the lookups not chosen are compared with what the block revealed: their common prefix
                    for n in looked:
                        i = self.names.index(n)
                        if not obs[i]:
                            acc[i], obs[i], prev_feat[i] = common_prefix(drafts[n].tokens, new), True, dfeat[i]
                timings["chosen"].append(order[j])
                pol.update(ctx, self.names.index(order[j]), acc, obs)
                prev_acc = acc
                prev_feat = np.where(obs[:, None], prev_feat, np.nan)
            ids += new
            y += new
            if new[-1] in tgt.eos:
                break
        # Records in the dict order of self.names for byte-stable output
        for r in recs:
            r["drafts"] = {n: r["drafts"][n] for n in self.names if n in r["drafts"]}
        lm.crop(cache, len(ids) - 1)  # an accepted EOS left its own key in: cover ids[:-1] exactly
        hidden = {key: v[: len(ids) - 1] for key, v in fbuf.items()}
        return PromptResult(recs, y, timings, (hidden.get(LAST), cache), hidden)


def _put(buf: dict, at: int, feats: dict) -> None:
    """Write per-key states (n, H) into the per-key buffers at rows at..at+n-1."""
    for key, v in feats.items():
        buf[key][at : at + v.shape[0]] = v
