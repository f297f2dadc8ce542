"""specbandit collection engine on Hugging Face transformers (driven by `sweep.py`).

Four rooms; imports run one way only, campaign -> decode -> drafters -> models (a room imports its own or a lower
one; tests/test_harness_layers.py fails on an upward import or a cycle):

models/       the bottom: loading, formats, conversion, the target's forward
  lm.py         local model loading (safetensors, no hub, no remote code), cache helpers, HarnessError
  target.py     reference generation and one-forward verification of N drafts
  sampling.py   greedy / Gumbel-max coupled sampling, expected_accepted
  heads.py      Medusa and EAGLE head models (also used by zoo/train.py)
  head_formats.py  their formats on disk: ours, Medusa-1 and EAGLE-1/2 layouts (safetensors only)
  blocks.py     shared torch pieces of the public drafters (RMSNorm, RoPE, attention, MLP, strict loading)
  eagle3.py     EAGLE-3 heads (speculators / vLLM and SpecForge layouts) on target layer inputs
  dflash.py     DFlash block-diffusion drafters (z-lab layout) on target layer outputs
  gguf.py       GGUF model files -> safetensors model directories, once (python -m harness.gguf smollm2)
  convert.py    convert-checkpoint: pickled .bin/.pt weights -> safetensors, the one unpickling step
  tiny.py       tiny random-init models for tests and benches
  options.py    the bounds of sweep.py's options (torch-free), which the engine and the drafter registry check too
drafters/     the drafter protocol (base.py), one module per family, the registry and plug-in point (registry.py)
decode/       decoding one prompt
  engine.py     dense / sparse / live decoding of one prompt into block records
  livephase.py  the live phase after a dense sweep (plain, fixed drafters, best-of-N, live policies; live.jsonl)
  calibrate.py  live timing calibration (verify_ms, verify_batch_ms, drafter_ms)
campaign/     running a campaign
  campaign.py   one campaign checked and set up (options, prompts, workers, run directory): sweep.py's run_sweep
  collect.py    running a set-up campaign: the prompts, calibration or the live phase, target check, shard ends
  rundir.py     crash-safe run directory: locks, appends, resume (cut back to the last finished prompt)
  manifest.py   the manifest and settings.json: built, checked against a resumed or joined campaign
  preflight.py  run-directory checks before any model loads, lock holders, the run --resume continues
  shards.py     shards, run-directory parts, locks, campaign identity (torch-free)
  worker.py     one campaign worker: models loaded once (in-process or a Ray actor)
  raypool.py    Ray as the distributed engine (optional extra)
  merge.py      specbandit merge: shards or runs of one campaign into one (torch-free)
  outputs.py    outputs.jsonl: each finished prompt's prompt and output token ids and text; its check against the
                logs; `python -m harness.outputs RUN` reconstructs it for a run from before it (torch-free at import)
  smollm2.py    the SmolLM2 campaign end to end (python -m harness.smollm2)

gguf.py, smollm2.py, outputs.py (top level): `python -m` shims that call the moved module's main, nothing else.
"""
