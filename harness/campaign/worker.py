"""One worker of a campaign: the models loaded once, then prompts through the engine, the live phase and
the timing calibration. It runs in the sweep's own process (a plain sweep, a `--shard`) or as a Ray actor
(harness/campaign/raypool.py); either way it only computes, and the sweep's driver writes every record (rundir.py).

A `Plan` is everything a worker needs to load the models (picklable: it travels to Ray actors). Results
are plain dicts, one per prompt: workload, prompt_id, records, output, check, draft_ms, seconds (the
prompt's compute time in the worker), worker (its id: host:pid-random, one per session) and where (host,
device, gpu).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass, field

import torch

from ..decode import livephase
from ..models import kernels, lm, options
from ..decode.calibrate import live_phase, pad_table, time_passes, time_verify
from ..drafters import DrafterEnv, DrafterSpec, build_drafters
from ..decode.engine import Engine, RunConfig
from ..models.lm import HarnessError
from .manifest import hardware
from ..models.target import Target, check_pad


@dataclass
class Plan:
    target_dir: str
    specs: list[DrafterSpec]
    mode: str = "dense"
    k: int = 8
    max_new_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    behaviour: str | None = None
    generator: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    models: str | None = None
    exact: bool = False
    threads: int | None = None  # torch threads; None: torch's own (campaign.py sets every core on cpu)
    kernels: str = "default"  # the linears' path (harness/models/kernels.py): default, auto (probe), aten, mkldnn, ...
    workloads: list[str] = field(default_factory=list)
    verify_pad: str | None = None  # "Q:Q',...": a one-chain verify of Q tokens runs as Q' (models/target.py); "auto"
    pad_ms: dict | None = None  # the forward times an earlier session's "auto" table came from (kept on resume)

    def config(self) -> RunConfig:
        return RunConfig(
            self.mode, self.k, self.max_new_tokens, self.temperature, self.seed, self.behaviour, self.generator
        )


class Worker:
    """The target, the drafters and the engine of one plan, loaded once. `policy`: live mode's drafter choice
    (in-process only: a policy learns from the prompts in their order)."""

    def __init__(self, plan: Plan, policy=None):
        self.plan = plan
        options.device(plan.device, here=False)  # the form; then this host's CUDA (a Ray worker's own)
        n_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if plan.device.startswith("cuda") and int(plan.device.partition(":")[2] or 0) >= n_cuda:
            why = f"{n_cuda} CUDA device(s) (cuda:0..cuda:{n_cuda - 1})" if n_cuda else "CUDA is not available"
            raise HarnessError(f"--device {plan.device}: {why} on {socket.gethostname()}")
        if plan.threads is not None:
            options.integer("--threads", plan.threads)
            torch.set_num_threads(plan.threads)
        torch.manual_seed(plan.seed)
        tdir = lm.resolve_model_dir(plan.target_dir, plan.models, "--target")
        self.tok = lm.load_tokenizer(tdir)
        model = lm.load_lm(tdir, plan.device, plan.dtype, "--target")
        self.kernels = kernels.choose(model, plan.kernels, plan.device)
        self.env = DrafterEnv(
            model, self.tok, tdir, plan.device, plan.dtype, plan.models, plan.temperature, plan.seed, exact=plan.exact
        )
        self.drafters = self._built()
        self.target = Target(model, self.tok, plan.device, plan.temperature, exact=plan.exact)
        pass_ms = self._pad()
        self.engine = Engine(self.target, self.drafters, plan.config(), policy, plan.workloads, check=True)
        self.id = f"{socket.gethostname()}:{os.getpid()}-{uuid.uuid4().hex[:6]}"  # unique across sessions
        self.info = self._info(model)
        if plan.verify_pad:  # what ran: the table, and the forward times an "auto" one came from
            pad = {"verify_pad": {str(q): v for q, v in self.target.pad.items()}}
            if pass_ms:
                pad["pass_ms"] = {str(q): round(v, 3) for q, v in pass_ms.items()}
            self.info["kernels"] = {**self.info["kernels"], **pad}
        self.where = {"host": socket.gethostname(), "device": plan.device, "gpu": self.info["hardware"]["gpu"]}

    def _pad(self) -> dict | None:
        """The target's verification padding (plan.verify_pad): a table as given, or "auto", measured here on the
        loaded target (harness/decode/calibrate.py: the forwards of 1..k+1 tokens; each size run as the cheapest at
        or above it). Returns the forward times the table came from (measured, or kept from an earlier session)."""
        plan = self.plan
        if plan.verify_pad != "auto":
            self.target.pad = check_pad(options.pad_of(plan.verify_pad))
            return {int(q): v for q, v in plan.pad_ms.items()} if plan.pad_ms else None
        ms = time_passes(self.target.model, list(range(1, plan.k + 2)))
        self.target.pad = check_pad(pad_table(ms))
        return ms

    def _built(self) -> dict:
        """The plan's drafters, their models' linears on the target's kernel path (compile: its packed linears,
        as a drafter calls its modules' own methods, which a compiled forward never wraps)."""
        drafters = build_drafters(self.plan.specs, self.env)
        dtype = next(self.env.target.parameters()).dtype
        if not self.plan.device.startswith("cpu") or dtype not in kernels.DTYPES.values():
            return drafters  # as choose(): a GPU or an unmeasured dtype (float16) keeps aten, untouched
        path = "mkldnn" if self.kernels["kernels"] == "compile" else self.kernels["kernels"]
        for d in drafters.values():
            kernels.apply_drafter(d, path, dtype)
        return drafters

    def _info(self, model) -> dict:
        """What the driver needs to know of the loaded models (drafter settings and hashes as their info())."""
        drafters = {}
        for s in self.plan.specs:
            d = self.drafters[s.name]
            info = getattr(d, "info", lambda: {"settings": s.settings, "sha256": None})()
            drafters[s.name] = {
                "kind": s.kind,
                "settings": dict(info.get("settings", s.settings)),
                "sha256": info.get("sha256"),
            }
        cfg = model.config
        return {
            "drafters": drafters,
            "across_prompts": [n for n, d in self.drafters.items() if getattr(d, "across_prompts", False)],
            "n_pos": getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None),
            "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "exact": bool(self.target.exact),
            "worker": self.id,
            "hardware": hardware(self.plan.device),
            "kernels": self.kernels,
        }

    # ---- the sweep ----
    def run_items(self, items):
        """Run prompts in order: items are (workload, prompt_id, ids, output) with output None for a prompt to
        run, else the output of a prompt finished earlier (given to the drafters, as if run). Yields results."""
        for wl, pid, ids, done in items:
            if done is not None:
                self.engine.skip(done)
                continue
            t0 = time.perf_counter()
            res = self.engine.run_prompt(wl, pid, ids)
            yield {
                "workload": wl,
                "prompt_id": pid,
                "records": res.records,
                "output": res.output,
                "check": res.check,
                "draft_ms": res.timings.get("draft", {}),
                "seconds": time.perf_counter() - t0,
                "worker": self.id,
                "where": self.where,
            }

    def run(self, batches):
        """(tag, items) batches in order -> (tag, result) per prompt run (the driver's interface, as Pool.run)."""
        for tag, items in batches:
            for res in self.run_items(items):
                yield tag, res

    # ---- after the sweep: the live phase and the timing calibration ----
    def live(self, prompts, outputs, chosen, done, policies=None, workloads=(), timing=None):
        """The live phase's decodes (livephase.decode) on fresh drafters: (workload, prompt_id, lines)."""
        cfg = self.plan.config()
        fresh = self._built()  # the dense phase's hold the state of its end
        yield from livephase.decode(
            self.target, fresh, prompts, outputs, cfg, chosen, done, policies, workloads, timing
        )

    def policy_timing(self, prompts, outputs, chosen) -> dict:
        """The live policies' timing, measured before the live decodes (livephase.measure), on fresh drafters."""
        fresh = self._built()
        return livephase.measure(self.target, fresh, prompts, outputs, self.plan.config(), chosen)

    def time_verify(self, prefixes, k: int, n_drafts: int):
        return time_verify(self.target, prefixes, k, n_drafts)

    def calibrate(self, prompts, progress=None):
        """The short live calibration (harness/decode/calibrate.py) on the sweep's own drafters, after the sweep."""
        p = self.plan
        cfg = RunConfig("live", p.k, min(p.max_new_tokens, 64), p.temperature, p.seed)
        return live_phase(self.target, self.drafters, prompts, cfg, progress)

    def close(self) -> None:
        pass
