"""The probe's report as one self-contained HTML page (inline CSS, JS and SVG; no network).

The figure shows the process inside nested boundaries, one ring per switchable layer
(innermost first, in the canonical layer order). Each action is an arrow from the
process towards its target: it ends at the ring of the layer that stopped it, or reaches
the target. Needed actions are solid blue, unneeded ones dashed red. A switch per layer
redraws the arrows from the measured matrix (never from the model); the page reads
``#layers=files,container`` on load so that a headless browser can be driven by URL.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from stockade.probe._terminal import backend_summary, cost_text

_TEMPLATE = Path(__file__).with_name("report.html")


def _table(report: dict[str, Any]) -> str:
    runs = report["runs"]
    head = "".join(f"<th>{html.escape(', '.join(r['layers']) or 'none')}</th>" for r in runs)
    rows = []
    for a in report["actions"]:
        cells = []
        for r in runs:
            c = r["cells"][a["id"]]
            t = "T" if c["measured"] == "through" else "s"
            cls = ("n" if a["needed"] else "") + t + ("" if c["agree"] else " bad")
            tip = html.escape(f"model: {c['predicted']}; really: {c['measured']}; {c['detail']}")
            cells.append(f'<td class="{cls}" title="{tip}">{t}{"" if c["agree"] else "!"}</td>')
        need = "needed" if a["needed"] else "unneeded"
        rows.append(
            f'<tr><td class="l">{html.escape(a["id"])}</td><td>{need}</td>{"".join(cells)}</tr>'
        )
    for key, label in (("open_unneeded", "open unneeded"), ("broken_needed", "broken needed")):
        counts = []
        for r in runs:
            got, model = r[key]["measured"], r[key]["model"]
            counts.append(f"<td>{got}{'' if got == model else f' ≠ model {model}'}</td>")
        rows.append(f'<tr><td class="l" colspan="2">{label}</td>{"".join(counts)}</tr>')
    # The matrix has a column per subset of layers (up to 2^7): it scrolls inside its own
    # box, with the action names held at the left, rather than widening the page.
    return (
        '<div class="matrix"><table>'
        f"<tr><th>action</th><th></th>{head}</tr>{''.join(rows)}</table></div>"
    )


def _build(report: dict[str, Any]) -> str:
    rows = []
    backend = report.get("backend", "bubblewrap")
    fixed = report.get("fixed_why") or {}
    for layer, info in report["build"].items():
        shown = html.escape(
            cost_text(
                report["cost_ms"]["per_layer"].get(layer),
                report["cost_ms"].get("per_layer_spread", {}).get(layer),
            )
        )
        state = "enforced" if info["enforceable"] else "not enforceable in this build"
        detail = html.escape(info["detail"])
        if layer in fixed:
            state += f" (always on under {backend})"
            detail += "<br>" + html.escape(fixed[layer])
        if layer == "container":
            # The runtime's cost beside what only the runtime's own kernel stops.
            detail += f'<br><span class="runtime">{html.escape(backend_summary(report))}</span>'
        rows.append(
            f'<tr><td class="l">{layer}</td><td class="l">{state}</td><td>{shown}</td>'
            f'<td class="l">{detail}</td></tr>'
        )
    return (
        "<table><tr><th>layer</th><th>build</th><th>cost per command</th><th>evidence</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def render_html(report: dict[str, Any]) -> str:
    """The report (the ``--json`` document) as one self-contained page."""
    data = json.dumps(report).replace("</", "<\\/")
    agree = report["agreement"]
    title = f"stockade probe: {report['scenario']} ({report.get('backend', 'bubblewrap')})"
    page = _TEMPLATE.read_text(encoding="utf-8")
    cost = report["cost_ms"]
    parts = {
        "TITLE": html.escape(title),
        "SUMMARY": f"Model and reality agree on {agree['agree']} of {agree['total']} cells.",
        "TABLE": _table(report),
        "BUILD": _build(report),
        "COST": html.escape(
            f"Start-up per command: {cost['baseline']:.1f} ms bare, "
            f"{cost['all_on']:.1f} ms with every enforced layer on. "
            + backend_summary(report)[:1].upper()
            + backend_summary(report)[1:]
            + "."
        ),
        "DATA": data,
    }
    for key, value in parts.items():
        page = page.replace("{{" + key + "}}", value)
    return page
