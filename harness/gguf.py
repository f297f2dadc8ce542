"""`python -m harness.gguf`: GGUF model files -> safetensors model directories; the command lives in harness/models/gguf.py (a shim)."""

from harness.models.gguf import main

if __name__ == "__main__":
    main()
