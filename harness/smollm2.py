"""`python -m harness.smollm2`: the SmolLM2 campaign, end to end; the command lives in harness/campaign/smollm2.py (a shim)."""

from harness.campaign.smollm2 import main

if __name__ == "__main__":
    main()
