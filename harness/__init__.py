"""specbandit collection engine on Hugging Face transformers (driven by `sweep.py`).

    lm.py         local model loading (safetensors, no hub, no remote code), cache helpers
    sampling.py   greedy / Gumbel-max coupled sampling, expected_accepted
    target.py     reference generation and one-forward verification of N drafts
    drafters.py   the drafter protocol, the built-in kinds, the plug-in point
    heads.py      our Medusa and EAGLE head formats (also used by zoo/train.py)
    engine.py     dense / sparse / live decoding of one prompt into block records
    rundir.py     crash-safe run directory, resume, manifest
    calibrate.py  live timing calibration (verify_ms, verify_batch_ms, drafter_ms)
    tiny.py       tiny random-init models for tests and benches
"""
