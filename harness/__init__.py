"""specbandit collection engine on Hugging Face transformers (driven by `sweep.py`).

lm.py         local model loading (safetensors, no hub, no remote code), cache helpers
sampling.py   greedy / Gumbel-max coupled sampling, expected_accepted
target.py     reference generation and one-forward verification of N drafts
drafters/     the drafter protocol (base.py), one module per family, the registry and plug-in point (registry.py)
heads.py      Medusa and EAGLE head models (also used by zoo/train.py)
head_formats.py  their formats on disk: ours, Medusa-1 and EAGLE-1/2 layouts (safetensors only)
blocks.py     shared torch pieces of the public drafters (RMSNorm, RoPE, attention, MLP, strict loading)
eagle3.py     EAGLE-3 heads (speculators / vLLM and SpecForge layouts) on target layer inputs
dflash.py     DFlash block-diffusion drafters (z-lab layout) on target layer outputs
convert.py    convert-checkpoint: pickled .bin/.pt weights -> safetensors, the one unpickling step
livephase.py  the live phase after a dense sweep (plain, fixed drafters, best-of-N, live policies; live.jsonl)
engine.py     dense / sparse / live decoding of one prompt into block records
campaign.py   one campaign checked and set up (options, prompts, workers, run directory): sweep.py's run_sweep
collect.py    running a set-up campaign: the prompts, calibration or the live phase, target check, shard ends
rundir.py     crash-safe run directory: locks, appends, resume (cut back to the last finished prompt)
gguf.py       GGUF model files -> safetensors model directories, once (python -m harness.gguf smollm2)
outputs.py    outputs.jsonl: each finished prompt's prompt and output token ids and text; its check against the
              logs; `python -m harness.outputs RUN` reconstructs it for a run from before it (torch-free at import)
manifest.py   the manifest and settings.json: built, checked against a resumed or joined campaign
preflight.py  run-directory checks before any model loads, lock holders, the run --resume continues
shards.py     shards, run-directory parts, locks, campaign identity (torch-free)
worker.py     one campaign worker: models loaded once (in-process or a Ray actor)
raypool.py    Ray as the distributed engine (optional extra)
merge.py      specbandit merge: shards or runs of one campaign into one (torch-free)
calibrate.py  live timing calibration (verify_ms, verify_batch_ms, drafter_ms)
tiny.py       tiny random-init models for tests and benches
"""
