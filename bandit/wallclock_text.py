"""The wall-clock report's text and plot (bandit/wallclock.py computes it; this module says it), and the choices
and cost-model tables paper/build.py quotes."""

from __future__ import annotations

import numpy as np

from bandit.logs import outputs
from bandit.live.livelog import LIVE_FILE


def render(r) -> str:
    lines = [
        *([outputs.HEADER + r.command] if r.command else []),
        f"# wall clock: dense-log predictions against the live phase of {r.run}",
        "inputs: " + ", ".join(f"{i['path']} sha256:{i['sha256'][:12]}" for i in r.inputs) + f" and {LIVE_FILE}",
        f"live sample: {r.n_prompts} prompts; outputs equal to the dense phase's in {r.same_as_dense[0]} of "
        f"{r.same_as_dense[1]} decodes; output, target passes, verified tokens and drafter calls equal to the "
        f"dense-log walk's in {r.passes_agree[0]} of {r.passes_agree[1]} (the decodes the timing model is fitted on)",
        "timing model (ms; pass@Q: a target pass verifying Q tokens, linear between; drafter calls measured plus a "
        "fitted extra; the rest NNLS; docs/DESIGN.md, Wall clock) [MODEL]: "
        + ", ".join(f"{k} {v:.4g}" for k, v in r.coef.items()),
        f"CIs: {r.ci_how}",
        "",
        "| configuration | predicted tokens/s [MODEL] | measured tokens/s [MEASURED] | measured / predicted | prompts |",
        "|---|---|---|---|---|",
    ]
    for e in r.entries:
        lo, hi = e["predicted_ci"]
        mlo, mhi = e["measured_ci"]
        rlo, rhi = e["ratio_ci"]
        lines.append(
            f"| {e['config']} | {e['predicted_tokens_per_s']:.1f} [{lo:.1f}, {hi:.1f}] | "
            f"{e['measured_tokens_per_s']:.1f} [{mlo:.1f}, {mhi:.1f}] | "
            f"{e['measured_over_predicted']:.3f} [{rlo:.3f}, {rhi:.3f}] | {e['n_prompts']} |"
        )
    for e in r.entries:
        h = e.get("held_out_configuration")
        if h and np.isfinite(h["predicted_tokens_per_s"]):
            lines.append(
                f"| {e['config']}, fit without its decodes | {h['predicted_tokens_per_s']:.1f} "
                f"[{h['predicted_ci'][0]:.1f}, {h['predicted_ci'][1]:.1f}] | "
                f"{e['measured_tokens_per_s']:.1f} | {h['measured_over_predicted']:.3f} "
                f"[{h['ratio_ci'][0]:.3f}, {h['ratio_ci'][1]:.3f}] | {e['n_prompts']} |"
            )
    lines += [
        "",
        "Rows 'fit without its decodes': the coefficients, the drafters' call times included, come only from "
        "the other configurations' decodes (of the other prompts): the test of a configuration never timed.",
    ]
    if any("choices" in e for e in r.entries):
        lines += ["", choices_text(r.entries)]
    cm = r.cost_models
    if cm and cm["rows"]:
        lines += ["", cost_model_text(cm)]
    worst = max(r.entries, key=lambda e: abs(e["measured_over_predicted"] - 1))
    lines += [
        "",
        f"largest miss: {worst['config']}, measured / predicted {worst['measured_over_predicted']:.3f} "
        f"({'within' if abs(worst['measured_over_predicted'] - 1) <= 0.15 else 'outside'} 15%)",
    ]
    return "\n".join(lines) + "\n"


def choices_text(entries: list[dict]) -> str:
    """Every live policy's choices against its replay on the dense log (a table; wallclock.json's entries)."""
    lines = [
        "Policies decoded live against their replay on the dense log (same prompts, same order): decodes whose "
        "passes, verified tokens and drafter calls equal the replay's; total variation distance between the "
        "drafters' shares of the chosen blocks live and replayed (0: the same choices in aggregate). A policy "
        "that learns live step times is told the measured verify times live and the timing's in replay, so its "
        "choices may differ; any other policy's must not",
        "",
        "| policy | decodes equal to the replay | chosen blocks equal | TV distance | chosen shares live | replayed |",
        "|---|---|---|---|---|---|",
    ]
    sh = lambda d: ", ".join(f"{n} {v:.2f}" for n, v in d.items() if v) or "none"
    for e in [e for e in entries if "choices" in e]:
        ch = e["choices"]
        eq, n = ch["decodes_equal_to_replay"]
        logged = "total_variation" in ch
        ce = "{} of {}".format(*ch["chosen_equal_to_replay"]) if logged else "not logged"
        tv = f"{ch['total_variation']:.3f}" if logged else "n/a"
        live = sh(ch["live_chosen_share"]) if logged else ch["live_chosen"]
        who = e["config"] + (" (learns live step times)" if ch["learns_step_times"] else "")
        lines.append(f"| {who} | {eq} of {n} | {ce} | {tv} | {live} | {sh(ch['replay_chosen_share'])} |")
    return "\n".join(lines)


def cost_model_text(cm: dict) -> str:
    """The two cost models' speedups over the fastest fixed drafter beside the measured ones (a table)."""
    f = lambda v, c: f"{v:.3f} [{c[0]:.3f}, {c[1]:.3f}]" if c[0] is not None else f"{v:.3f}"
    lines = [
        f"Speedup over the fastest fixed drafter, {cm['fastest_fixed']} ({cm['rule']}): measured [MEASURED], the "
        "timing model's prediction [MODEL] and the rho/alpha cost model's [MODEL], each model's ratio to the "
        f"measured beside it; rho/alpha {cm['rho_alpha_costs']}",
        "",
        "| configuration | measured | timing model | timing / measured | rho/alpha model | rho/alpha / measured |",
        "|---|---|---|---|---|---|",
    ]
    for w in cm["rows"]:
        lines.append(
            f"| {w['config']} | {f(w['measured'], w['measured_ci'])} | {f(w['timing_model'], w['timing_model_ci'])} "
            f"| {w['timing_model_over_measured']:.3f} | {f(w['rho_alpha'], w['rho_alpha_ci'])} | "
            f"{w['rho_alpha_over_measured']:.3f} |"
        )
    miss = lambda k: max(cm["rows"], key=lambda w: abs(w[k] - 1))
    t, r = miss("timing_model_over_measured"), miss("rho_alpha_over_measured")
    lines += [
        "",
        f"largest miss of the speedups: timing model {t['config']} {t['timing_model_over_measured']:.3f}; "
        f"rho/alpha {r['config']} {r['rho_alpha_over_measured']:.3f} (model / measured)",
    ]
    return "\n".join(lines)


def plot_png(r, command: str) -> bytes:
    """wallclock.png: predicted against measured tokens/s with their CIs and the identity line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    for i, e in enumerate(r.entries):
        x, y = e["predicted_tokens_per_s"], e["measured_tokens_per_s"]
        xe = [[x - e["predicted_ci"][0]], [e["predicted_ci"][1] - x]]
        ye = [[y - e["measured_ci"][0]], [e["measured_ci"][1] - y]]
        ax.errorbar(x, y, xerr=xe, yerr=ye, fmt="o", color=f"C{i % 10}", label=e["config"], capsize=3)
    hi = 1.1 * max(max(e["predicted_ci"][1], e["measured_ci"][1]) for e in r.entries)
    ax.plot([0, hi], [0, hi], color="grey", lw=0.8, label="identity")
    ax.fill_between([0, hi], [0, 0.85 * hi], [0, 1.15 * hi], color="grey", alpha=0.1, lw=0, label="within 15%")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_xlabel("predicted tokens/s from the dense log [MODEL]")
    ax.set_ylabel("measured tokens/s, live phase [MEASURED]")
    ax.set_title(f"{r.run}: 95% CIs over prompts")
    ax.legend(fontsize=7)
    fig.tight_layout()
    data = outputs.png(fig, command)
    plt.close(fig)
    return data
