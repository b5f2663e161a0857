"""A real browser for the page tests: headless Chromium from the distribution's packages, run offline.

`probe(page)` opens a copy of a page with a probe script appended (the page itself has none) and returns what the
browser drew: every element matching a selector with its box on screen and its computed fill or background colour,
read off the browser's layout and style after load (`--dump-dom`). `screenshot(page, png)` saves what the same
window shows, and `pixel(png, x, y)` reads one of its pixels back (PNG decoded here: zlib and the five filters).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path
from typing import Any, Optional

INSTALL = "apt-get install -y chromium (Debian; Ubuntu: chromium-browser), or set KVCACHE_CHROMIUM to its path"
WINDOW = (1280, 2400)
# Offline and quiet: without these Chromium waits on network lookups, the first-run flow and component updates.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--hide-scrollbars", "--force-device-scale-factor=1",
         f"--window-size={WINDOW[0]},{WINDOW[1]}"]
PROBE = """<script>
addEventListener('load', () => {
  const drawn = [...document.querySelectorAll('%s')].map(e => {
    const box = e.getBoundingClientRect(), style = getComputedStyle(e);
    return {data: {...e.dataset}, x: box.x, y: box.y, width: box.width, height: box.height,
            fill: style.fill, background: style.backgroundColor, text: e.textContent.trim()};
  });
  const out = document.createElement('pre');
  out.id = 'kvcache-probe';
  out.textContent = JSON.stringify(drawn);
  document.body.appendChild(out);
});
</script>"""


def chromium() -> Optional[str]:
    """The browser's path: KVCACHE_CHROMIUM, else chromium or chromium-browser on PATH; None when absent."""
    named = os.environ.get("KVCACHE_CHROMIUM")
    return named if named and Path(named).exists() else shutil.which("chromium") or shutil.which("chromium-browser")


def _run(arguments: list[str], seconds: float = 90) -> str:
    browser = chromium()
    assert browser is not None
    with tempfile.TemporaryDirectory(prefix="kvcache-chromium-") as profile:
        done = subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", *arguments], capture_output=True,
                              text=True, timeout=seconds)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def probe(page: Path, selector: str) -> list[dict[str, Any]]:
    """What the browser drew for `selector` on the page: boxes, colours, data attributes and text."""
    with tempfile.TemporaryDirectory(prefix="kvcache-probe-") as folder:
        copy = Path(folder) / page.name
        copy.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE % selector + "</body>"),
                        encoding="utf-8")
        dom = _run(["--virtual-time-budget=5000", "--dump-dom", copy.as_uri()])
    start = dom.index('<pre id="kvcache-probe">') + len('<pre id="kvcache-probe">')
    return list(json.loads(_unescape(dom[start:dom.index("</pre>", start)])))


def _unescape(text: str) -> str:
    return text.replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def screenshot(page: Path, png: Path, window: tuple[int, int] = WINDOW) -> None:
    _run([f"--screenshot={png}", f"--window-size={window[0]},{window[1]}", page.as_uri()])
    assert png.exists() and png.stat().st_size > 0


def cause_picture(report_path: Path, number: int, png: Path, width: int = 900) -> None:
    """A picture of one cause of a saved JSON report, as the HTML report draws it, cut to its grid (the README's):
    a page of that cause alone, shot in a window as tall as the grid's bottom."""
    from kvcache_spec.conformance.report_page import cause_section, page

    report = json.loads(report_path.read_text(encoding="utf-8"))
    finding = report["semantic"]["findings"][number - 1]
    with tempfile.TemporaryDirectory(prefix="kvcache-picture-") as folder:
        alone = Path(folder) / "cause.html"
        alone.write_text(page(report["target"], [cause_section(finding, number, report["target"])]), encoding="utf-8")
        legend = probe(alone, "p.legend")
        assert legend, "the cause has no attend grid"
        screenshot(alone, png, (width, int(legend[0]["y"] + legend[0]["height"] + 24)))


if __name__ == "__main__":   # python -m tests.browser REPORT.json CAUSE OUT.png: the README's picture of a cause
    import sys

    cause_picture(Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))


def pixel(png: Path, x: int, y: int) -> tuple[int, int, int]:
    """The RGB of one pixel of an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes)."""
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, chunks, header = 8, b"", b""
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        header = body if kind == b"IHDR" else header
        chunks += body if kind == b"IDAT" else b""
        at += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    channels = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(chunks), width * channels
    previous = bytearray(stride)
    for row in range(y + 1):
        kind, line = raw[row * (stride + 1)], bytearray(raw[row * (stride + 1) + 1:(row + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = previous[i], previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                guess = left + up - corner
                best = min((abs(guess - left), 0, left), (abs(guess - up), 1, up), (abs(guess - corner), 2, corner))
                line[i] = (line[i] + best[2]) & 255
        previous = line
    r, g, b = previous[x * channels:x * channels + 3]
    return r, g, b
