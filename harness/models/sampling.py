"""Token choice: greedy, or Gumbel-max sampling with noise keyed by (seed, prompt, position).

Under sampling, the target's token at output position t is `argmax(logits/T + G(key_t))`,
an exact sample from softmax(logits/T) whose noise depends only on (seed, prompt, t) and
never on which drafter ran. So the target's output is drafter-invariant, a draft token is
accepted iff it equals that sample (accepted = longest common prefix, as under greedy), and
dense logs replay any policy exactly. `expected_accepted` separately records what standard
speculative sampling (Leviathan et al.) would accept on average for the same draft:
`sum_j prod_{i<=j} min(1, p_i / q_i)` with p the target's and q the drafter's probability
of draft token i (q = 1 for deterministic drafters, whose proposal is a point mass).

The noise is a counter-based hash (no generator state), so any position's noise can be
recomputed alone and in any batch shape: this is what keeps dense and live runs identical.
"""

from __future__ import annotations

import zlib

import torch

_M32 = 0xFFFFFFFF
TARGET_STREAM = 0  # drafters use stream_id(name) so their noise is independent of the target's


def stream_id(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF or 1


def prompt_key(seed: int, workload: str, prompt_id: str) -> int:
    return zlib.crc32(f"{seed}\x00{workload}\x00{prompt_id}".encode()) & _M32


def _mix(x: torch.Tensor) -> torch.Tensor:
    """32-bit integer finaliser (lowbias32) on int64 tensors holding values < 2**32."""
    x = x & _M32
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & _M32
    x = ((x ^ (x >> 15)) * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def gumbel(pkey: int, positions: torch.Tensor, vocab: int, stream: int = TARGET_STREAM) -> torch.Tensor:
    """Gumbel(0, 1) noise (len(positions), vocab), float32, a pure function of its arguments."""
    dev = positions.device
    base = _mix(
        _mix(torch.tensor(pkey, dtype=torch.int64, device=dev) ^ _mix(torch.tensor(stream, device=dev)))
        ^ positions.to(torch.int64)[:, None] * 0x9E3779B1
    )
    h = _mix(base ^ _mix(torch.arange(vocab, dtype=torch.int64, device=dev) + 0x632BE5AB)[None, :])
    u = (h.to(torch.float64) + 0.5) / 4294967296.0
    return (-torch.log(-torch.log(u))).to(torch.float32)


def choose(
    logits: torch.Tensor,
    temperature: float,
    pkey: int = 0,
    positions: torch.Tensor | None = None,
    stream: int = TARGET_STREAM,
) -> torch.Tensor:
    """Tokens (Q,) from logits (Q, V): argmax at T=0, else coupled Gumbel-max at `positions`."""
    if temperature <= 0:
        return logits.argmax(-1)
    return (logits.float() / temperature + gumbel(pkey, positions, logits.shape[-1], stream)).argmax(-1)


def probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The distribution a token is drawn from: softmax(logits/T), or softmax(logits) at T=0."""
    return torch.softmax(logits.float() / (temperature if temperature > 0 else 1.0), -1)


def conf_entropy(p: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Probability of each chosen token and the entropy (nats) of each row of p (Q, V)."""
    conf = p.gather(-1, tokens[:, None])[:, 0]
    ent = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
    return conf.clamp(0.0, 1.0), ent.clamp_min(0.0)


def expected_accepted(p_target: list[float], q_draft: list[float]) -> float:
    """sum_j prod_{i<=j} min(1, p_i / q_i): expected accepted length under rejection sampling."""
    total, run = 0.0, 1.0
    for p, q in zip(p_target, q_draft):
        run *= min(1.0, p / q) if q > 0 else 0.0
        total += run
    return total
