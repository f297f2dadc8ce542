"""Batched generation for the self-distillation data: B sequences at once on one KV cache.

Prompts are left-padded to one length; the attention mask hides the padding and the position ids count only
real tokens, so each row is the forward a single sequence would make (up to the float rounding of a batched
matmul: the card reports how many outputs match single-sequence greedy decoding token for token). A row that
ends (an end token or the length limit) leaves the batch and its cache at once, so finished rows cost nothing.

The target's states at `keys` (harness.models.lm tap keys; "last" is the final norm's output, lm_head's input)
are kept for every position that ran a forward: that is what the drafters train on, with no second pass.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np
import torch

from harness.models import lm


@dataclass
class Sampling:
    """temperature 0: greedy (argmax); else sampled at `temperature` within the top-p nucleus by `generator`."""

    temperature: float = 0.0
    top_p: float = 1.0
    generator: torch.Generator | None = None


@dataclass
class Row:
    """One finished sequence. feats (len(ids), K, H) float16: the states of positions 0..len-2; the last
    position never ran a forward and holds zeros. finished: it ended on an end token."""

    prompt: list[int]
    output: list[int]
    finished: bool
    feats: np.ndarray | None = None

    @property
    def ids(self) -> list[int]:
        return self.prompt + self.output


def _pick(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    if s.temperature <= 0:
        return logits.argmax(-1)
    p = torch.softmax(logits.float() / s.temperature, -1)
    if s.top_p < 1.0:
        sp, si = p.sort(-1, descending=True)
        drop = sp.cumsum(-1) - sp > s.top_p  # keep the smallest head whose mass reaches top_p
        sp[drop] = 0
        p = torch.zeros_like(p).scatter_(-1, si, sp)
    return torch.multinomial(p, 1, generator=s.generator)[:, 0]


def generate(
    model, prompts: list[list[int]], max_new: int, eos: set[int], keys: list[str], pad: int, sampling: Sampling
) -> list[Row]:
    """Each prompt continued up to `max_new` tokens (ending at, and including, an end token), in one batch."""
    base, head = model.get_decoder(), model.get_output_embeddings()
    B, P = len(prompts), max(len(p) for p in prompts)
    dev = head.weight.device
    ids = torch.full((B, P), pad, dtype=torch.long, device=dev)
    mask = torch.zeros((B, P), dtype=torch.long, device=dev)
    for b, p in enumerate(prompts):
        ids[b, P - len(p) :] = torch.tensor(p, device=dev)
        mask[b, P - len(p) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    taps = [k for k in keys if k != lm.LAST]
    outs: list[list[int]] = [[] for _ in prompts]
    feats: list[list[np.ndarray]] = [[] for _ in prompts]
    done: list[Row | None] = [None] * B
    live = torch.arange(B, device=dev)  # the original row of each batch row
    cache = lm.new_cache()
    kw = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"  # renamed in 5.x
    with torch.inference_mode(), lm.tapped(model, taps) as got:
        h = base(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{kw: cache})
        h = h.last_hidden_state
        first = True
        while True:
            if keys:
                st = torch.stack([h if k == lm.LAST else got[k] for k in keys], 2).to(torch.float16).numpy()
                for r, b in enumerate(live.tolist()):
                    feats[b].append(st[r, P - len(prompts[b]) :] if first else st[r])
            nxt = _pick(head(h[:, -1]), sampling)
            first = False
            keep = []
            for r, (b, t) in enumerate(zip(live.tolist(), nxt.tolist())):
                outs[b].append(t)
                if t in eos or len(outs[b]) >= max_new:
                    f = None
                    if keys:
                        f = np.concatenate(feats[b] + [np.zeros((1, *st.shape[2:]), np.float16)])
                    done[b] = Row(prompts[b], outs[b], t in eos, f)
                    feats[b] = []
                else:
                    keep.append(r)
            if not keep:
                break
            if len(keep) < len(live):
                sel = torch.tensor(keep, device=dev)
                cache.batch_select_indices(sel)
                live, mask, pos, nxt = live[sel], mask[sel], pos[sel], nxt[sel]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            pos = pos[:, -1:] + 1
            h = base(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos, use_cache=True, **{kw: cache})
            h = h.last_hidden_state
    return [r for r in done if r is not None]
