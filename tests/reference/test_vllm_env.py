"""The vllm tier's venv installs what vLLM imports (tests/reference/vllm.sh): nothing may come from the base image's
Python by accident. The venv sees this environment (--system-site-packages, for torch); what it may take from there
is what the project declares (pyproject.toml: the project itself, its dependencies and the harness, test, ray and smollm2 extras,
which .ci/run installs) and what those
packages require, transitively. Everything else vLLM, its spec-decode methods and arctic-inference import must be in
the venv: a subprocess imports them with every other base-image package blocked (as a plain venv would lack them).

Run with `bash .ci/tiers.sh vllm`.
"""

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import upstream

pytestmark = pytest.mark.tier_vllm
REPO = Path(__file__).resolve().parents[2]

PROBE = r"""
import importlib.abc, importlib.metadata as md, json, os, re, sys, sysconfig, tomllib
from importlib.machinery import PathFinder
from packaging.requirements import Requirement

venv = os.path.realpath(sys.prefix)
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
proj = tomllib.loads(open(sys.argv[1], "rb").read().decode())["project"]
# the project itself is declared too: .ci/run installs it editable, and its finder serves its own packages
roots = [proj["name"], *proj["dependencies"]] + [r for x in ("harness", "test", "ray", "smollm2") for r in proj["optional-dependencies"][x]]
declared, stack = set(), [Requirement(r).name for r in roots]
while stack:
    n = norm(stack.pop())
    if n in declared:
        continue
    declared.add(n)
    try:
        d = md.distribution(n)
    except md.PackageNotFoundError:
        continue
    for r in d.requires or []:
        q = Requirement(r)
        if not q.marker or q.marker.evaluate({"extra": ""}):
            stack.append(q.name)
def tops(d):
    return (d.read_text("top_level.txt") or "").split() or sorted(
        {f.parts[0].removesuffix(".py") for f in d.files or [] if f.parts and "." not in f.parts[0].rstrip(".py")}
    )

def in_venv(d):
    return os.path.realpath(str(d.locate_file(""))).startswith(venv)

mine = {t for d in md.distributions() if in_venv(d) for t in tops(d)}
blocked = {}  # top-level module -> distribution, for base-image packages outside the declared set
gone = set()  # those distributions' names: their metadata is absent too
for d in md.distributions():
    if in_venv(d) or norm(d.metadata["Name"]) in declared:
        continue
    gone.add(norm(d.metadata["Name"]))
    for t in tops(d):
        if t not in mine:  # the venv's own copy shadows the base image's
            blocked.setdefault(t, d.metadata["Name"])

class Absent(importlib.abc.MetaPathFinder):
    # The path finder with the blocked base-image packages absent, as a plain venv lacks them: find_spec gives
    # None (an availability probe, like accelerate's for boto3, reads "not installed") and an import raises
    # ModuleNotFoundError, named below.
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in blocked:
            return None
        return PathFinder.find_spec(name, path, target)

    def find_distributions(self, context=md.DistributionFinder.Context()):
        found = PathFinder.find_distributions(context)
        return (d for d in found if in_venv(d) or norm(d.metadata["Name"]) not in gone)

    def invalidate_caches(self):
        PathFinder.invalidate_caches()

sys.meta_path[:] = [Absent() if f is PathFinder else f for f in sys.meta_path]
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
try:
    from vllm import LLM, SamplingParams, TokensPrompt
    import vllm.v1.engine.core, vllm.v1.worker.cpu_model_runner
    import vllm.v1.spec_decode.ngram_proposer, vllm.v1.spec_decode.suffix_decoding, vllm.v1.spec_decode.eagle
    import vllm.v1.spec_decode.medusa, vllm.model_executor.models.llama_eagle3, vllm.model_executor.models.medusa
    import arctic_inference.suffix_decoding
except ModuleNotFoundError as e:
    top = (e.name or "").split(".")[0]
    if top in blocked:
        raise ModuleNotFoundError(f"{e.name} (base image's {blocked[top]})", name=e.name) from e
    raise
own = {m: os.path.realpath(sys.modules[m].__file__).startswith(venv) for m in ("requests", "urllib3", "cpuinfo", "psutil")}
import importlib.util
absent = all(importlib.util.find_spec(t) is None for t in sorted(blocked)[:50])  # the block bites, as a probe sees it
print(json.dumps({"blocked": len(blocked), "own": own, "absent": absent}))
"""


def test_vllm_imports_only_the_venv_and_the_declared_environment():
    upstream("vllm", "vllm")
    r = subprocess.run(
        [sys.executable, "-c", PROBE, str(REPO / "pyproject.toml")], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["own"] == {
        "requests": True,
        "urllib3": True,
        "cpuinfo": True,
        "psutil": True,
    }  # never the base image's copies
    assert res["absent"] is True  # and those packages are absent to the import system, not merely refused
    assert res["blocked"] > 0  # the base image does hold packages the project does not declare: the check bites
