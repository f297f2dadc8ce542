"""Drafters on the target's last hidden state: Medusa heads (`medusa`) and an EAGLE-1/2 head (`eagle`), the
head models themselves in harness/models/heads.py."""

from __future__ import annotations

import torch

from ..models import lm
from ..models.heads import EagleHead, MedusaHeads
from ..models.lm import HarnessError
from .base import STEP_KEYS, Draft, Prefix, Sequence, common_prefix
from .model import ModelDrafter, chain_allow


class MedusaDrafter(ModelDrafter):
    """Medusa heads (`path=`, harness.models.heads.MedusaHeads): head i drafts token P-1+i from the
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
            toks.append(self.heads.to_target(t))
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


class EagleDrafter(ModelDrafter):
    """EAGLE head (`path=`, harness.models.heads.EagleHead): reads pairs (feature j, token j+1) for
    j = 0..P-2 of the prefix, then drafts autoregressively on its own features. Live drafting
    keeps the head's KV cache over true pairs; dense drafting is teacher-forced like `draft`."""

    kind = "eagle"
    needs_features = True

    def __init__(self, name, settings, env):
        super().__init__(name, settings, env)
        path = self._setting("path", None, str)
        self.batch = self._setting("batch", 256, int)  # origins per dense pass
        self._check_settings({"path", "batch", "stop_below"})
        self.stop_below = self._read_stop()
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
        common = common_prefix(self.kv_ids, ids)
        keep = max(0, min(common - 1, n_pairs - 1, 0 if self.kv is None else self.kv[0].shape[2]))
        past = None if keep == 0 else (self.kv[0][:, :, :keep], self.kv[1][:, :, :keep])
        for a, b in self._spans(n_pairs - keep):
            j = torch.arange(keep + a, keep + b, device=dev)
            nxt = torch.tensor(ids[keep + a + 1 : keep + b + 1], device=dev)
            pred, (kn, vn) = self.head.step(pre.feats[j][None], nxt[None], j[None], past)
            past = (kn, vn) if past is None else (torch.cat([past[0], kn], 2), torch.cat([past[1], vn], 2))
        self.kv, self.kv_ids = past, list(ids)
        f, kv = pred[:, -1:], self.kv
        toks, confs, ents, stopped = [], [], [], None
        for s in range(k):
            t, c, e = self._pick(self._logits(f[0]), T, pre.pkey, torch.tensor([pre.pos * STEP_KEYS + s], device=dev))
            t = self.head.to_target(t)
            toks.append(t)
            confs.append(c)
            ents.append(e)
            stopped = self._stopped(stopped, c)
            if stopped is not None and bool(stopped.all()):
                break
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
            toks, confs, ents, stopped = [], [], [], None
            for s in range(kmax):
                t, c, e = self._pick(self._logits(f), T, seq.pkey, o * STEP_KEYS + s)
                t = self.head.to_target(t)
                toks.append(t)
                confs.append(c)
                ents.append(e)
                stopped = self._stopped(stopped, c)
                if stopped is not None and bool(stopped.all()):
                    break
                if s + 1 < kmax:
                    allow = chain_allow(P - 1, n_seq, s + 1)[None, None]
                    f2, (kn, vn) = self.head.step(f[None], t[None], (P - 1 + s)[None], (kc, vc), allow)
                    kc, vc, f = torch.cat([kc, kn], 2), torch.cat([vc, vn], 2), f2[0]
            for m, d in zip(orig, self._assemble(toks, confs, ents, T, [seq.ks[p] for p in orig])):
                out[m] = d
        self.kv, self.kv_ids = None, []
        return out
