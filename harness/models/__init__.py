"""The bottom room of harness/: model loading, checkpoint formats and conversion, the target's forward and
sampling, and the sweep's option bounds. Imports nothing else of harness/ (harness/__init__.py lists the modules)."""
