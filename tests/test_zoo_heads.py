"""`python -m zoo.heads`: Medusa and EAGLE heads trained on a target's own greedy outputs load in the harness's
drafters, carry a card that matches their files, are byte-identical on a rerun with the same seed, and the
held-out acceptance is what a brute-force recomputation from the head modules gives."""

import json
from pathlib import Path

import pytest
import torch

from harness.models import lm
from harness.drafters import DrafterEnv, Prefix, build_drafters, common_prefix, parse_spec
from harness.models.heads import EagleHead, MedusaHeads
from harness.models.tiny import PROMPTS, make_model, make_tokenizer, save_model, write_workload_file
from zoo import EAGLE_DIR, MEDUSA_DIR, TARGET_DIR
from zoo.heads import main
from zoo.heads_data import Example, teacher_forced
from harness.models.gguf import file_sha256
from zoo.heads_eval import accepted_lengths, drafters_for, heldout_acceptance

torch.set_num_threads(1)
K = 4
HELD = [("code", "c9", "def mul(a, b):\n    return a * b\n"), ("chat", "h9", "user: what is up?\nassistant:")]


def _argv(root, out):
    return [
        *("--target", str(root / "target"), "--out", str(out)),
        *("--prompts", str(root / "train.jsonl"), "--heldout", str(root / "held.jsonl")),
        *("--max-new-tokens", "16", "--steps", "4", "--batch", "2", "--window", "24", "--seed", "7"),
        *("--compare", "ng=ngram"),
    ]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo_heads")
    tok = make_tokenizer()
    save_model(make_model("llama", len(tok)), tok, root / "target")
    write_workload_file(root / "train.jsonl", PROMPTS[:3])
    write_workload_file(root / "held.jsonl", HELD)
    out = root / "out"
    main(_argv(root, out))
    weights = {n: (out / n / "model.safetensors").read_bytes() for n in ("medusa", "eagle")}
    return {"root": root, "out": out, "weights": weights}


def brute_chain(kind: str, head, feats, ids: list[int], P: int, k: int) -> list[int]:
    """The head's greedy chain after the prefix ids[:P], from the module alone, recomputed from scratch each step."""
    with torch.no_grad():
        if kind == "medusa":
            lg = head(feats[P - 2][None])  # head i drafts token P - 1 + i from the feature at P - 2
            return [int(lg[i, 0].argmax()) for i in range(min(k, head.cfg.num_heads))]
        f, x, chain = feats[: P - 1].clone(), torch.tensor(ids[1:P]), []
        for _ in range(k):  # pairs (feature j, token j + 1); its own feature and token fed back
            pred = head(f[None], x[None])[0, -1]
            chain.append(int(head.logits(pred[None]).argmax(-1)))
            f, x = torch.cat([f, pred[None]]), torch.cat([x, torch.tensor(chain[-1:])])
        return chain


def brute_accepted(kind, head, ex: Example, feats, p: int, k: int) -> int:
    kp = min(k, len(ex.output) - p)
    return common_prefix(brute_chain(kind, head, feats, ex.ids, len(ex.prompt) + p, kp)[:kp], ex.output[p : p + kp])


def test_the_heads_load_in_the_harness_drafters_and_draft(trained):
    root, out = trained["root"], trained["out"]
    target, tok = lm.load_lm(root / "target"), lm.load_tokenizer(root / "target")
    env = DrafterEnv(target, tok, root / "target")
    specs = [parse_spec(f"{n}={n}:path={out / n}") for n in ("medusa", "eagle")]
    drafters = build_drafters(specs, env)
    ids = tok(HELD[0][2]).input_ids
    feats, _ = teacher_forced(target, ids)
    modules = {"medusa": MedusaHeads.load(out / "medusa", target), "eagle": EagleHead.load(out / "eagle", target)}
    for n, d in drafters.items():
        d.start("code", "c9")
        draft = d.draft(Prefix(ids, len(ids), feats, 0, 0.0), K)
        assert len(draft.tokens) == K and all(0 <= t < len(tok) for t in draft.tokens), n
        assert draft.tokens == brute_chain(n, modules[n], feats, ids, len(ids), K), n


def test_the_card_names_its_files_and_settings(trained):
    out = trained["out"]
    held = json.loads((out / "heldout.json").read_text())
    for n in ("medusa", "eagle"):
        d = out / n
        info = json.loads((d / "training_info.json").read_text())
        for field in ("kind", "config", "sha256", "target", "train_wall_s", "data", "steps", "seed", "command"):
            assert field in info, (n, field)
        assert info["kind"] == n and info["steps"] == 4 and info["seed"] == 7
        assert info["sha256"]["model.safetensors"] == file_sha256(d / "model.safetensors")
        assert info["sha256"]["weights"] == lm.weights_sha256(d)
        assert info["target"]["sha256"] == lm.weights_sha256(trained["root"] / "target")
        assert info["config"] == json.loads((d / "config.json").read_text())
        assert info["data"]["train_prompts"] == 3 and info["data"]["heldout_prompts"] == 2
        assert info["data"]["train_tokens"] > info["data"]["train_output_tokens"] > 0
        assert info["heldout_acceptance"] == held[n] and held[n]["k"] == K and held[n]["positions"] > 0
        assert set(info["compared"]) == {"ng"}
        card = (d / "README.md").read_text()
        assert info["sha256"]["model.safetensors"] in card and "mean accepted length at k = 4" in card


def test_a_rerun_with_the_same_seed_is_byte_identical_and_resumes_from_the_cache(trained):
    out = trained["out"]
    main(_argv(trained["root"], out))
    for n, b in trained["weights"].items():
        assert (out / n / "model.safetensors").read_bytes() == b, n
    said = [line for line in (out / "train.log").read_text().splitlines() if "greedy train:" in line]
    assert len(said) == 2 and "(0 generated, 3 from greedy-" in said[-1]  # the rerun generated nothing


def test_heldout_acceptance_equals_a_brute_force_recomputation(trained):
    """On the zoo target with the shipped zoo heads (their acceptance is well above zero) and on the tiny target
    with the heads just trained: per position and as the mean."""
    from workloads import load_named

    cases = []
    t = lm.load_lm(TARGET_DIR)
    tok = lm.load_tokenizer(TARGET_DIR)
    item = load_named("math")[0]
    prompt = item.token_ids(tok)
    from harness.models.target import Target

    y, _, _ = Target(t, tok).generate(prompt, 32, 0)
    ex = Example("math", item.prompt_id, prompt, [int(v) for v in y])
    cases.append((t, tok, TARGET_DIR, {"medusa": MEDUSA_DIR, "eagle": EAGLE_DIR}, ex))
    root, out = trained["root"], trained["out"]
    t2, tok2 = lm.load_lm(root / "target"), lm.load_tokenizer(root / "target")
    ids = tok2(HELD[0][2]).input_ids
    y2, _, _ = Target(t2, tok2).generate(ids, 16, 0)
    ex2 = Example("code", "c9", ids, [int(v) for v in y2])
    cases.append((t2, tok2, root / "target", {"medusa": out / "medusa", "eagle": out / "eagle"}, ex2))
    some = 0
    for target, tk, tpath, dirs, e in cases:
        drafters = drafters_for([f"{n}={n}:path={d}" for n, d in dirs.items()], target, tk, tpath)
        feats, _ = teacher_forced(target, e.ids)
        for n, d in drafters.items():
            head = (MedusaHeads if n == "medusa" else EagleHead).load(dirs[n], target)
            acc = accepted_lengths(d, e, feats, K)
            assert len(acc) == len(e.output)
            for p in sorted({0, 1, 5, len(e.output) // 2, len(e.output) - 2, len(e.output) - 1}):
                assert acc[p] == brute_accepted(n, head, e, feats, p, K), (n, p)
            some += sum(acc)
            mean = heldout_acceptance({n: d}, target, [e], K)[n]["mean"]
            assert mean == round(sum(acc) / len(acc), 4)
    assert some > 0  # the comparison is not vacuous


def test_a_card_records_paths_relative_to_the_models_root_or_the_repository(tmp_path, monkeypatch):
    from zoo.heads import abs_argv, portable

    monkeypatch.chdir(tmp_path)
    root = tmp_path / "models"
    argv = ["--models", str(root), "--target", "t", "--out", "models/heads", "--prompts=p.jsonl", "--seed", "1"]
    cmd = portable("python -m zoo.heads " + " ".join(abs_argv(argv)), root)
    assert cmd == (
        "python -m zoo.heads --models $SPECBANDIT_MODELS --target t --out $SPECBANDIT_MODELS/heads "
        f"--prompts={tmp_path / 'p.jsonl'} --seed 1"  # outside both roots: the user's own path, resolved
    )
    repo = Path(__file__).resolve().parents[1]
    assert portable(str(repo / "zoo" / "target"), None) == "zoo/target"
