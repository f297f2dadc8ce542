"""Model cards for the zoo (written by zoo/train.py)."""
import json


def render_card(name, info, src):
    return f"# zoo/{name}\n\n```json\n{json.dumps(info, indent=2, sort_keys=True)}\n```\n\n```json\n{json.dumps(src, indent=2)}\n```\n"
