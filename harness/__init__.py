"""specbandit collection engine: targets, drafters, verification, block logging (see sweep.py)."""
