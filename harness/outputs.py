"""`python -m harness.outputs`: a run's outputs.jsonl reconstructed or checked; the command lives in harness/campaign/outputs.py (a shim)."""

from harness.campaign.outputs import main

if __name__ == "__main__":
    main()
