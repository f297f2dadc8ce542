"""Decoding: one prompt into block records (engine.py), the live phase (livephase.py), the live timing calibration
(calibrate.py). Imports harness.drafters and harness.models, never harness.campaign."""
