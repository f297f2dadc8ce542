"""The corpus's copy/edit tasks: a file, an edit instruction, and the whole edited file given back.

The files are generated docker-compose YAML, INI and JSON configs (the split follows the file and its
instruction) or short stdlib code chunks with an identifier renamed (the split follows the chunk's file).
"""

from __future__ import annotations

import hashlib
import json

from .corpus_base import Item, rng_for, split_of

SERVICES = [
    "web",
    "api",
    "db",
    "cache",
    "worker",
    "proxy",
    "queue",
    "auth",
    "search",
    "metrics",
    "scheduler",
    "frontend",
    "backend",
    "gateway",
    "mailer",
]
IMAGES = {
    "web": "nginx",
    "api": "python",
    "db": "postgres",
    "cache": "redis",
    "worker": "python",
    "proxy": "traefik",
    "queue": "rabbitmq",
    "auth": "keycloak",
    "search": "elasticsearch",
    "metrics": "prometheus",
    "scheduler": "python",
    "frontend": "node",
    "backend": "golang",
    "gateway": "envoy",
    "mailer": "mailhog",
}
ENV_KEYS = [
    "LOG_LEVEL",
    "DEBUG",
    "WORKERS",
    "TIMEOUT",
    "DATABASE_URL",
    "REDIS_URL",
    "MAX_CONNECTIONS",
    "CACHE_TTL",
    "REGION",
    "FEATURE_FLAGS",
]


def _compose(rng):
    svcs = rng.sample(SERVICES, rng.randint(2, 4))
    spec = []
    for s in svcs:
        env = {
            k: rng.choice(["info", "debug", "1", "0", "30", "eu-west-1", "4", "100"])
            for k in rng.sample(ENV_KEYS, rng.randint(1, 3))
        }
        spec.append(
            {
                "name": s,
                "image": IMAGES[s],
                "tag": f"{rng.randint(1, 16)}.{rng.randint(0, 9)}",
                "port": rng.choice([80, 443, 3000, 5000, 5432, 6379, 8000, 8080, 9000, 9090]),
                "env": env,
                "restart": rng.choice(["always", "unless-stopped", "on-failure"]),
            }
        )
    return spec


def _render_compose(spec):
    lines = ['version: "3.8"', "services:"]
    for s in spec:
        lines += [
            f"  {s['name']}:",
            f"    image: {s['image']}:{s['tag']}",
            f"    restart: {s['restart']}",
            "    ports:",
            f'      - "{s["port"]}:{s["port"]}"',
            "    environment:",
        ]
        lines += [f'      {k}: "{v}"' for k, v in s["env"].items()]
    return "\n".join(lines) + "\n"


def _compose_task(rng):
    spec = _compose(rng)
    new = json.loads(json.dumps(spec))
    t = rng.randrange(5)
    s = rng.randrange(len(new))
    name = new[s]["name"]
    if t == 0:
        port = rng.choice([p for p in [81, 8081, 8888, 7000, 9091, 5001] if p != new[s]["port"]])
        instr = f"Change the port of service `{name}` from {new[s]['port']} to {port}."
        new[s]["port"] = port
    elif t == 1:
        tag = f"{rng.randint(1, 16)}.{rng.randint(0, 9)}"
        instr = f"Upgrade the image of `{name}` to tag {tag}."
        new[s]["tag"] = tag
    elif t == 2:
        k = rng.choice([k for k in ENV_KEYS if k not in new[s]["env"]])
        v = rng.choice(["true", "false", "60", "8", "warning"])
        instr = f"Add the environment variable {k}={v} to service `{name}`."
        new[s]["env"][k] = v
    elif t == 3:
        cand = [x for x in SERVICES if x not in [y["name"] for y in new]]
        nn = rng.choice(cand)
        instr = f"Rename service `{name}` to `{nn}`."
        new[s]["name"] = nn
    else:
        r = rng.choice(["always", "unless-stopped", "on-failure", "no"])
        instr = f"Set the restart policy of `{name}` to {r}."
        new[s]["restart"] = r
    return "docker-compose.yml", "yaml", _render_compose(spec), instr, _render_compose(new)


def _ini_task(rng):
    sections = {}
    for sec in rng.sample(["server", "database", "logging", "cache", "auth", "paths"], 3):
        keys = rng.sample(
            ["host", "port", "user", "level", "timeout", "enabled", "path", "retries", "size", "name"],
            rng.randint(2, 4),
        )
        sections[sec] = {
            k: rng.choice(["localhost", "8080", "admin", "INFO", "30", "true", "/var/lib/app", "3", "512", "main"])
            for k in keys
        }

    def render(d):
        return "\n".join(f"[{s}]\n" + "\n".join(f"{k} = {v}" for k, v in kv.items()) + "\n" for s, kv in d.items())

    new = json.loads(json.dumps(sections))
    sec = rng.choice(list(new))
    key = rng.choice(list(new[sec]))
    t = rng.randrange(3)
    if t == 0:
        v = rng.choice(["9000", "false", "DEBUG", "120", "/srv/data", "replica"])
        instr = f"In section [{sec}], set {key} to {v}."
        new[sec][key] = v
    elif t == 1:
        instr = f"Remove the key {key} from section [{sec}]."
        del new[sec][key]
    else:
        k2 = rng.choice(["owner", "backup", "mode", "region", "version"])
        v = rng.choice(["ops", "daily", "strict", "us-east-1", "2"])
        instr = f"Add {k2} = {v} to section [{sec}]."
        new[sec][k2] = v
    return "settings.ini", "ini", render(sections), instr, render(new)


def _json_task(rng):
    name = rng.choice(["parser", "webapp", "toolkit", "scheduler", "cli", "dashboard"])
    d = {
        "name": name,
        "version": f"{rng.randint(0, 3)}.{rng.randint(0, 20)}.{rng.randint(0, 9)}",
        "private": rng.choice([True, False]),
        "scripts": {
            k: v
            for k, v in rng.sample(
                [
                    ("build", "make build"),
                    ("test", "pytest -q"),
                    ("lint", "ruff check ."),
                    ("start", "python -m app"),
                    ("docs", "mkdocs build"),
                ],
                3,
            )
        },
        "dependencies": {
            k: f"^{rng.randint(1, 9)}.{rng.randint(0, 9)}.0"
            for k in rng.sample(["requests", "numpy", "flask", "click", "rich", "pyyaml", "attrs", "httpx"], 3)
        },
    }
    new = json.loads(json.dumps(d))
    t = rng.randrange(3)
    if t == 0:
        v = f"{rng.randint(0, 3)}.{rng.randint(0, 20)}.{rng.randint(0, 9)}"
        instr = f"Bump the version to {v}."
        new["version"] = v
    elif t == 1:
        dep = rng.choice(list(new["dependencies"]))
        instr = f"Remove the dependency {dep}."
        del new["dependencies"][dep]
    else:
        k = rng.choice(list(new["scripts"]))
        v = rng.choice(["tox", "nox -s tests", "python -m build", "black ."])
        instr = f"Change the {k} script to `{v}`."
        new["scripts"][k] = v
    return "package.json", "json", json.dumps(d, indent=2) + "\n", instr, json.dumps(new, indent=2) + "\n"


def _code_edit_task(rng, chunk):
    """Rename an identifier that occurs in a stdlib code chunk (whole-word replacement)."""
    import re

    names = sorted(
        {
            n
            for n in re.findall(r"\b[a-z_][a-z0-9_]{2,}\b", chunk)
            if n
            not in {
                "self",
                "def",
                "return",
                "import",
                "from",
                "class",
                "for",
                "not",
                "and",
                "None",
                "with",
                "while",
                "else",
                "elif",
                "try",
                "except",
                "raise",
                "pass",
                "lambda",
                "yield",
                "global",
                "del",
                "assert",
                "continue",
                "break",
                "finally",
                "nonlocal",
                "async",
                "await",
                "print",
                "len",
                "str",
                "int",
                "isinstance",
            }
        }
    )
    if not names:
        return None
    old = rng.choice(names)
    new = rng.choice(["value", "item", "result", "node", "data", "count", "entry", "buf"]) + rng.choice(
        ["", "_", "2", "_new"]
    )
    if re.search(rf"\b{new}\b", chunk):
        return None
    edited = re.sub(rf"\b{old}\b", new, chunk)
    return "module.py", "python", chunk, f"Rename `{old}` to `{new}` everywhere.", edited


def copy_prompt(fname, lang, src, instr):
    return f"### File: {fname}\n```{lang}\n{src}```\n### Edit: {instr}\n### Result:\n```{lang}\n"


def copy_items(seed: int, n_config: int, code_chunks):
    rng = rng_for(seed, "copy")
    out, seen = [], set()
    for i in range(n_config):
        fname, lang, src, instr, dst = [_compose_task, _ini_task, _json_task][i % 3](rng)
        key = src + instr
        if key in seen:
            continue
        seen.add(key)
        split = split_of("copy:" + key)
        prompt = copy_prompt(fname, lang, src, instr)
        uid = "copy:" + hashlib.sha256(key.encode()).hexdigest()[:12]
        out.append(Item("copy", split, uid, prompt + dst + "```\n", prompt))
    # code edits on short stdlib chunks; the split follows the chunk's file
    for split, rel, i, ch in code_chunks:
        nlines = ch.count("\n")
        if not (6 <= nlines <= 24) or rng.random() > 0.5:
            continue
        task = _code_edit_task(rng, ch)
        if task is None:
            continue
        fname, lang, src, instr, dst = task
        prompt = copy_prompt(rel, lang, src, instr)
        out.append(Item("copy", split, f"copy:code:{rel}:{i}", prompt + dst + "```\n", prompt))
    return out
