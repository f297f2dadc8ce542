"""Running a campaign: set-up, run directory, shards, Ray workers, merge, manifest, outputs, the SmolLM2 driver.
The top room of harness/: it may import decode, drafters and models; none of them imports it. Torch-free at import."""
