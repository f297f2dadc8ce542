"""specbandit collection engine on Hugging Face transformers (driven by `sweep.py`).

lm.py         local model loading (safetensors, no hub, no remote code), cache helpers
sampling.py   greedy / Gumbel-max coupled sampling, expected_accepted
target.py     reference generation and one-forward verification of N drafts
drafters.py   the drafter protocol, the built-in kinds, the plug-in point
heads.py      Medusa and EAGLE heads: our format (also used by zoo/train.py), Medusa-1 and EAGLE-1/2 layouts
blocks.py     shared torch pieces of the public drafters (RMSNorm, RoPE, attention, MLP, strict loading)
eagle3.py     EAGLE-3 heads (speculators / vLLM and SpecForge layouts) on target layer inputs
dflash.py     DFlash block-diffusion drafters (z-lab layout) on target layer outputs
convert.py    convert-checkpoint: pickled .bin/.pt weights -> safetensors, the one unpickling step
livephase.py  the live phase after a dense sweep (plain, fixed drafters, best-of-N, live policies; live.jsonl)
engine.py     dense / sparse / live decoding of one prompt into block records
rundir.py     crash-safe run directory, resume, manifest
shards.py     shards, run-directory parts, locks, campaign identity (torch-free)
worker.py     one campaign worker: models loaded once (in-process or a Ray actor)
raypool.py    Ray as the distributed engine (optional extra)
merge.py      specbandit merge: shards or runs of one campaign into one (torch-free)
calibrate.py  live timing calibration (verify_ms, verify_batch_ms, drafter_ms)
tiny.py       tiny random-init models for tests and benches
"""
