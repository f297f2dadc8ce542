"""How the CLI names a drafter, and the one place a drafter kind is registered.

Naming a drafter on the CLI: `--drafter NAME=KIND[:key=value,...]` with KIND one of
`ngram`, `suffix`, `draft`, `medusa`, `eagle`, `eagle3`, `dflash`, `cascade` (BUILTIN), or an
installed plug-in's entry point: a package that declares, in its pyproject.toml,
        [project.entry-points."specbandit.drafters"]
        mine = "my_pkg.mod:MyDrafter"
is then named as `--drafter d1=mine:path=/ckpt`. A command line never names a module to import itself
(`--drafter x=os:system` is an unknown kind): code runs only from BUILTIN or an installed entry point.

The class is called as `cls(name, settings, env)`; values in settings are parsed as int,
float, bool (true/false) or left as strings. `env` gives the loaded target, tokenizer,
device, dtype, models root, temperature, seed and the drafters defined before it.

Adding a built-in kind: its class in a module of its own under harness/drafters/ (subclassing
base.Drafter, or model.ModelDrafter for a network), and one line in BUILTIN: `"kind": "module:Class"`.
The module is imported only when a drafter of that kind is built. Optionally, the kind's settings' types
and ranges in harness/models/options.py (SETTINGS; a kind not listed there checks its own settings).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import import_module
from importlib.metadata import entry_points

from ..models.lm import HarnessError
from .base import DrafterEnv

ENTRY_POINT_GROUP = "specbandit.drafters"

BUILTIN = {  # kind -> "module:Class" (imported when a drafter of that kind is built) or the class itself
    "ngram": "harness.drafters.lookup:NgramDrafter",
    "suffix": "harness.drafters.suffix:SuffixDrafter",
    "draft": "harness.drafters.model:DraftModelDrafter",
    "medusa": "harness.drafters.heads:MedusaDrafter",
    "eagle": "harness.drafters.heads:EagleDrafter",
    "eagle3": "harness.drafters.eagle3:Eagle3Drafter",
    "dflash": "harness.drafters.dflash:DFlashDrafter",
    "cascade": "harness.drafters.cascade:CascadeDrafter",
    "layerskip": "harness.drafters.layerskip:LayerSkipDrafter",
}


def _value(v: str):
    """A setting's text as a bool (true/false), an int, a float (ASCII digits only), or the text itself."""
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float) if v.isascii() else ():
        try:
            return cast(v)
        except ValueError:
            pass
    return v


@dataclass
class DrafterSpec:
    name: str
    kind: str  # builtin kind or installed plug-in (entry point name)
    settings: dict

    def __str__(self):
        s = ",".join(f"{k}={v}" for k, v in self.settings.items())
        return f"{self.name}={self.kind}" + (f":{s}" if s else "")


def parse_settings(text: str, where: str, texts=()) -> dict:
    """key=value,... -> {key: value}; the keys in `texts` keep their text (a path named 123 stays "123"). A key
    given twice, an empty key and a number that is not finite (nan, inf, 1e400) are refused."""
    out = {}
    for item in filter(None, text.split(",")):
        if "=" not in item:
            raise HarnessError(f"{where}: setting {item!r} is not key=value")
        k, v = (x.strip() for x in item.split("=", 1))
        if not k or k in out:
            raise HarnessError(f"{where}: setting {item!r}: " + ("given twice" if k else "no key before ="))
        out[k] = v if k in texts else _value(v)
        if isinstance(out[k], float) and not math.isfinite(out[k]):
            raise HarnessError(f"{where}: setting {item!r}: not a finite number")
    return out


def _entry_points() -> dict:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def parse_spec(text: str) -> DrafterSpec:
    """NAME=KIND[:k=v,...], KIND built in or an installed plug-in's entry point; checks the kind exists."""
    where = f"--drafter {text if text.isprintable() else ascii(text)}"  # a control character is shown escaped
    if "=" not in text:
        raise HarnessError(f"{where}: expected NAME=KIND[:key=value,...]")
    name, rest = text.split("=", 1)
    name = name.strip()
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise HarnessError(f"{where}: drafter name {name!r} must be letters, digits, - or _")
    head, _, tail = rest.partition(":")
    if head in BUILTIN or head in _entry_points():
        from ..models import options

        schema = options.SETTINGS.get(head, {})
        settings = parse_settings(tail, where, [key for key, rule in schema.items() if rule is str])
        options.drafter_settings(head, settings, f"--drafter {name}={head}")  # types and ranges, before any load
        return DrafterSpec(name, head, settings)
    # never an arbitrary module:attr: a command line must not name code to import (os:system, builtins:eval)
    raise HarnessError(
        f"{where}: unknown drafter kind {head!r}; known kinds: {', '.join(sorted(BUILTIN))}"
        f"; installed plug-ins (entry points {ENTRY_POINT_GROUP}): {sorted(_entry_points()) or 'none'}"
    )


def load_class(ref):
    """A BUILTIN entry as a class: the class itself, or "package.module:Class" imported (an entry point's form)."""
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    obj = import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def resolve_class(kind: str):
    """The class of a drafter kind: BUILTIN's entry, else the installed plug-in's entry point, loaded."""
    if kind in BUILTIN:
        try:
            return load_class(BUILTIN[kind])
        except (ImportError, AttributeError) as e:
            raise HarnessError(f"drafter kind {kind!r} ({BUILTIN[kind]}): cannot import: {e}") from None
    eps = _entry_points()
    if kind not in eps:
        raise HarnessError(f"drafter kind {kind!r}: neither built in nor an installed plug-in ({ENTRY_POINT_GROUP})")
    try:
        return eps[kind].load()
    except (ImportError, AttributeError) as e:
        raise HarnessError(f"drafter plug-in {kind!r}: cannot import: {e}") from None


def build_drafters(specs: list[DrafterSpec], env: DrafterEnv) -> dict:
    """Instantiate in CLI order (a cascade may only name drafters given before it)."""
    out = {}
    for s in specs:
        if s.name in out:
            raise HarnessError(f"--drafter {s}: the name {s.name!r} is used twice")
        env.drafters = dict(out)
        out[s.name] = resolve_class(s.kind)(s.name, dict(s.settings), env)
    return out
