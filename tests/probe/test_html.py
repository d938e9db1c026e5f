"""The HTML report in headless Chromium: it renders, and a layer switch moves the arrows."""

from __future__ import annotations

import re
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from stockade.probe._html import render_html
from stockade.probe._runner import Report

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _chrome(chromium: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [chromium, *FLAGS, f"--user-data-dir={tmp / 'profile'}", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def _png_is_not_blank(path: Path) -> bool:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    width = height = 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    assert width
    assert height
    return len(set(raw[: len(raw) // 2])) > 8


def _arrows(dom: str) -> dict[str, tuple[str, str]]:
    out = {}
    for tag in re.findall(r"<line [^>]*class=\"arrow[^>]*>", dom):
        action = re.search(r'data-action="([^"]+)"', tag)
        end = re.search(r'data-end="([^"]+)"', tag)
        x2 = re.search(r'x2="([^"]+)"', tag)
        assert action
        assert end
        assert x2
        out[action.group(1)] = (end.group(1), x2.group(1))
    return out


@pytest.mark.slow
def test_html_renders_and_switches_move_arrows(
    seed_report: Report, chromium: str, tmp_path: Path
) -> None:
    page = tmp_path / "probe.html"
    page.write_text(render_html(seed_report.to_json()))
    text = page.read_text()
    # Self-contained: nothing is fetched (an xmlns URI is a name, not a request).
    assert not re.search(r"(src|href)=\"https?:|<link |@import|fetch\(", text)
    shot = tmp_path / "shot.png"
    _chrome(chromium, tmp_path, f"--screenshot={shot}", "--window-size=1000,900", page.as_uri())
    assert shot.exists()
    assert _png_is_not_blank(shot)

    none = _chrome(chromium, tmp_path, "--dump-dom", page.as_uri() + "#layers=")
    full = _chrome(
        chromium,
        tmp_path,
        "--dump-dom",
        page.as_uri() + "#layers=" + ",".join(seed_report.measured_layers),
    )
    bare, all_on = _arrows(none.stdout), _arrows(full.stdout)
    assert set(bare) == set(all_on) == {a["id"] for a in seed_report.to_json()["actions"]}
    assert all(end == "target" for end, _ in bare.values())
    assert all_on["read-ssh-key"][0] in seed_report.measured_layers
    assert all_on["read-ssh-key"] != bare["read-ssh-key"]
    assert all_on["download"][0] == "target"
    assert 'class="needed' in full.stdout or "arrow needed" in full.stdout


#: appended to a copy of the page: writes the page's and the matrix box's widths into
#: the DOM, so that --dump-dom reports the layout at the window size given
_MEASURE = """<script>
window.addEventListener('load', () => {
  const m = document.querySelector('.matrix');
  document.body.setAttribute('data-widths', [document.documentElement.scrollWidth,
    m ? m.clientWidth : -1, m ? m.scrollWidth : -1].join(','));
});
</script>"""


def test_matrix_scrolls_in_its_box_and_the_page_fits_1400px(
    seed_report: Report, chromium: str, tmp_path: Path
) -> None:
    data = seed_report.to_json()
    # The widest matrix a report can have: every subset of the seven layers (128 columns).
    run = data["runs"][-1]
    data["runs"] = [
        {**run, "layers": ["files", "container", "syscalls", "egress"][: i % 5]} for i in range(128)
    ]
    page_html = render_html(data)
    assert '<div class="matrix"><table>' in page_html
    page = tmp_path / "wide.html"
    page.write_text(page_html.replace("</body>", _MEASURE + "</body>"))
    dom = _chrome(chromium, tmp_path, "--window-size=1400,900", "--dump-dom", page.as_uri())
    found = re.search(r'data-widths="(-?\d+),(-?\d+),(-?\d+)"', dom.stdout)
    assert found, dom.stderr[-2000:]
    page_width, box, content = (int(x) for x in found.groups())
    assert page_width <= 1400, (page_width, box, content)
    assert box <= 1400
    # The twin: the matrix really is wider than its box (so it scrolls, it is not cut).
    assert content > box, (page_width, box, content)
