"""The extended scenario's encoded labelled secret, for real: the model and the run agree.

Only the layers that decide it are switched (egress, inspect: four subsets), so the run
stays short; the model's side over every subset is in tests/model/test_seed.py.
"""

from __future__ import annotations

from stockade.probe._runner import probe
from tests.conftest import bwrap_works, require


def test_encoded_label_in_a_query_is_stopped_by_inspect_and_nothing_else() -> None:
    require(bwrap_works(), "bubblewrap with unprivileged user namespaces is not available")
    report = probe("extended", layers=("egress", "inspect"), cost_repeat=0)
    require(
        report.build["inspect"].enforceable,
        f"this build cannot enforce inspect: {report.build['inspect'].detail}",
    )
    agree, total = report.agreement
    assert agree == total, [
        (r.layers, c.action, c.detail) for r in report.runs for c in r.cells if not c.agree
    ]
    cells = {r.layers: next(c for c in r.cells if c.action == "encoded-label") for r in report.runs}
    assert set(cells) == {(), ("egress",), ("inspect",), ("egress", "inspect")}
    both = cells[("egress", "inspect")]
    assert not both.predicted_through
    assert "inspect" in both.predicted_by
    assert not both.measured_through
    # The proxy refused it for what it carried, not for where it went.
    assert "proxy: HTTP 403 labelled-data" in both.detail
    # Egress alone relays the registry's TLS unopened: the secret gets there (the allowed
    # twin: the same GET reaches the registry whenever inspect is off).
    for layers in ((), ("egress",), ("inspect",)):
        assert cells[layers].predicted_through, layers
        assert cells[layers].measured_through, layers
