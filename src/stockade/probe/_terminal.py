"""The probe's report as a terminal table: action × subset, model vs reality, cost."""

from __future__ import annotations

import os
from typing import IO, Any

_ABBREV = {
    "files": "F",
    "container": "C",
    "syscalls": "S",
    "secrets": "K",
    "egress": "E",
    "inspect": "I",
    "limits": "L",
    "overlay": "O",
}


def cost_text(cost: float | None, spread: float | None, unit: str = "ms") -> str:
    """A layer's cost as the report shows it: ``+3.2 ± 0.4 ms``, ``below noise (± 1.1
    ms)``, or ``""`` when it was not measured."""
    if cost is None:
        return ""
    if cost <= 0:
        return "below noise" + (f" (± {spread:.1f} {unit})" if spread else "")
    return f"+{cost:.1f} ± {spread or 0:.1f} {unit}"


def use_colour(stream: IO[str]) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (no-color.org)."""
    return "NO_COLOR" not in os.environ and hasattr(stream, "isatty") and stream.isatty()


def _subset_label(layers: list[str]) -> str:
    return "".join(_ABBREV[x] for x in layers) or "-"


def backend_summary(report: dict[str, Any]) -> str:
    """One sentence: the start-up of each container runtime measured in this probe, and
    what only a kernel of the sandbox's own stops in the scenario (and whether the runs
    of this probe showed it)."""
    figures = report["cost_ms"].get("backends") or {}
    bwrap, gvisor = figures.get("bubblewrap"), figures.get("gvisor")
    if bwrap is None:
        cost = "container runtime start-up not measured (--cost-runs 0)"
    elif gvisor is None:
        cost = (
            f"container runtime start-up: bubblewrap {bwrap:.1f} ms per command; gvisor not "
            "measured (no usable runsc: scripts/get-runsc, docs/gvisor.md)"
        )
    else:
        cost = (
            f"container runtime start-up: bubblewrap {bwrap:.1f} ms, gvisor {gvisor:.1f} ms "
            f"per command ({gvisor - bwrap:+.1f} ms"
            + (f", {gvisor / bwrap:.1f}x" if bwrap > 0 else "")
            + ")"
        )
    landlock = figures.get("landlock")
    if landlock is not None and bwrap is not None:
        cost += f"; landlock (no namespaces) {landlock:.1f} ms"
    only = report.get("kernel_only") or []
    if not only:
        return (
            f"{cost}; what only gvisor's own kernel stops: nothing in this scenario "
            "(the extended scenario has host-kernel)"
        )
    backend = report.get("backend", "bubblewrap")
    seen = []
    for action in only:
        cells = [r["cells"][action]["measured"] for r in report["runs"] if action in r["cells"]]
        stopped = sum(c == "stopped" for c in cells)
        # What this probe's own runs showed, under the runtime it used.
        measured = f" (under {backend}: stopped in {stopped} of {len(cells)} runs here)"
        seen.append(action + (measured if cells else ""))
    return f"{cost}; what only gvisor's own kernel stops: {', '.join(seen)}"


def render(report: dict[str, Any], *, colour: bool = False) -> str:
    """The report (the ``--json`` document) as text."""

    def paint(text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if colour else text

    backend = report.get("backend", "bubblewrap")
    runsc = f" ({report['runsc']})" if backend == "gvisor" and report.get("runsc") else ""
    lines = [f"stockade probe: scenario {report['scenario']!r}, container runtime {backend}{runsc}"]
    fixed = report.get("fixed_why") or {}
    lines.append("")
    lines.append("layers in this build:")
    for layer, info in report["build"].items():
        mark = (
            paint("enforced", "32")
            if info["enforceable"]
            else paint("not enforceable in this build", "33")
        )
        shown = cost_text(
            report["cost_ms"]["per_layer"].get(layer),
            report["cost_ms"].get("per_layer_spread", {}).get(layer),
        )
        shown = f"  {shown} per command" if shown else ""
        switch = " (switched)" if layer in report["measured_layers"] else ""
        if layer in fixed:
            switch = f" (always on under {backend})"
        lines.append(f"  {_ABBREV[layer]} {layer:<10} {mark}{switch}{shown}")
        lines.append(f"      {info['detail']}")
        if layer in fixed:
            lines.append(f"      {fixed[layer]}")
        if layer == "container":
            # The runtime's cost beside what only the runtime's own kernel stops.
            lines.append(f"      {backend_summary(report)}")
            lost = report.get("lost_without_namespaces") or []
            if report.get("backend") == "landlock":
                lines.append(
                    "      without namespaces (landlock) this scenario loses, beside "
                    f"bubblewrap: {', '.join(lost) or 'nothing'} ('stockade doctor' lists "
                    "what no action here names)"
                )
    lines.append("")
    runs = report["runs"]
    width = max([len(a["id"]) for a in report["actions"]] + [6])
    cols = [_subset_label(r["layers"]) for r in runs]
    colw = max([len(c) for c in cols] + [2]) + 1
    header = f"  {'action':<{width}}  need  " + "".join(f"{c:>{colw}}" for c in cols)
    lines.append(header)
    for action in report["actions"]:
        row = f"  {action['id']:<{width}}  {'yes ' if action['needed'] else 'no  '}  "
        for r in runs:
            cell = r["cells"][action["id"]]
            if not cell["agree"]:
                text, code = "!" + ("T" if cell["measured"] == "through" else "s"), "1;31"
            elif cell["measured"] == "through":
                text, code = "T", "32" if action["needed"] else "31"
            else:
                text, code = "s", "31" if action["needed"] else "32"
            row += " " * (colw - len(text)) + paint(text, code)
        lines.append(row)
    for key, label in (("open_unneeded", "open unneeded"), ("broken_needed", "broken needed")):
        row = f"  {label:<{width + 8}}"
        for r in runs:
            val = r[key]
            text = (
                f"{val['measured']}"
                if val["model"] == val["measured"]
                else f"{val['measured']}≠{val['model']}"
            )
            row += f"{text:>{colw}}"
        lines.append(row)
    lines.append("")
    lines.append(
        "  T = got through, s = stopped; !X = the model predicted otherwise. Columns: the "
        "active layers (" + ", ".join(f"{v}={k}" for k, v in _ABBREV.items()) + "); others off."
    )
    agree = report["agreement"]
    verdict = "agree" if agree["agree"] == agree["total"] else "DISAGREE"
    lines.append(
        f"  model and reality {verdict}: {agree['agree']}/{agree['total']} "
        f"({len(runs)} subsets × {len(report['actions'])} actions)"
    )
    for r in runs:
        for action_id, cell in r["cells"].items():
            if not cell["agree"]:
                lines.append(
                    paint(
                        f"  disagreement: {action_id} under [{', '.join(r['layers'])}]: model "
                        f"{cell['predicted']}, really {cell['measured']} ({cell['detail']})",
                        "31",
                    )
                )
    cost = report["cost_ms"]
    if any(v is not None for v in cost["per_layer"].values()):
        lines.append(
            f"  start-up per command: {cost['baseline']:.1f} ms bare, {cost['all_on']:.1f} ms "
            "with every enforced layer on"
        )
    else:
        lines.append("  start-up cost: not measured (--cost-runs 0)")
    if report["not_enforceable"]:
        lines.append(
            paint(
                "  not measured (not enforceable in this build): "
                + ", ".join(report["not_enforceable"]),
                "33",
            )
        )
    return "\n".join(lines) + "\n"
