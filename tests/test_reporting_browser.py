"""The report in a real browser: Debian's chromium, headless, with no network.

One page holds a run of every kind (map, sweep, launch, scale). Chromium loads it from
disk; the page's own inline script checks on load that every image decoded and that
the embedded JSON parses, and marks ``<body>`` with the outcome, which ``--dump-dom``
shows. A screenshot proves the charts render (not blank, the right size, the charts'
colours present) and is kept in ``test-artifacts/`` at the repository's root. A page
broken on purpose shows that these checks do fail.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest
from test_reporting import make_collection, png_size

from paralela.reporting import RunReport, write_report

# Chromium as CI runs it: as root (no sandbox), no GPU, and none of the background
# connections that this closed network refuses (they would slow it down and log errors).
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WINDOW = (1280, 2000)
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
CHROMIUM_TIMEOUT = 60.0  # seconds; it takes 1-2 s


def run_chromium(chromium: str, workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run chromium with a fresh profile; kill its whole process group on timeout."""
    profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=workdir)
    proc = subprocess.Popen(
        [chromium, *FLAGS, f"--user-data-dir={profile}", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its renderer and GPU processes go with it on timeout
    )
    try:
        out, err = proc.communicate(timeout=CHROMIUM_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"chromium did not finish within {CHROMIUM_TIMEOUT} s:\n{err[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def body_attributes(dom: str) -> dict[str, str]:
    match = re.search(r"<body([^>]*)>", dom)
    assert match is not None, dom[:2000]
    return dict(re.findall(r'([\w-]+)="([^"]*)"', match.group(1)))


def console_lines(stderr: str) -> list[str]:
    """What the page logged to the console (errors, CSP refusals, uncaught exceptions)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> RunReport:
    root = make_collection(tmp_path_factory.mktemp("runs") / "demo")
    return write_report(root)


def test_the_page_loads_without_errors_and_every_image_decodes(
    chromium: str, report: RunReport, tmp_path: Path
) -> None:
    proc = run_chromium(
        chromium, tmp_path, "--enable-logging=stderr", "--v=0", "--dump-dom", report.url
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    body = body_attributes(proc.stdout)
    html = report.path.read_text()
    images = html.count("<img ")
    assert images == 8  # map, sweep, launch: timeline + breakdown; the sweep's plot; scaling
    assert body.get("data-report-status") == "ok", body
    assert body["data-images"] == str(images)
    assert body["data-broken-images"] == ""
    assert console_lines(proc.stderr) == []
    # Each image decoded at the size of the PNG it embeds (our charts, drawn at 100 dpi).
    decoded = sorted(body["data-image-sizes"].split())
    charts = [png_size(p.read_bytes()) for p in report.images]
    plot = png_size((report.runs[1].path / "plots" / "optimization_history.png").read_bytes())
    assert decoded == sorted(f"{w}x{h}" for w, h in [*charts, plot])
    assert "Map: _work" in proc.stdout
    assert "Leaderboard" in proc.stdout


def test_the_charts_render_in_a_screenshot(
    chromium: str, report: RunReport, tmp_path: Path
) -> None:
    import numpy as np
    from PIL import Image  # Pillow comes with matplotlib

    shot = tmp_path / "report.png"
    proc = run_chromium(
        chromium,
        tmp_path,
        f"--screenshot={shot}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        "--hide-scrollbars",
        report.url,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ARTIFACTS.mkdir(exist_ok=True)
    kept = ARTIFACTS / "report-screenshot.png"
    shutil.copyfile(shot, kept)
    print(f"screenshot of the report: {kept}")
    with Image.open(shot) as image:
        assert image.size == WINDOW
        rgb = np.asarray(image.convert("RGB"), dtype=np.int16)
    white = np.all(rgb >= 245, axis=2).mean()
    assert white < 0.97, f"the page is {white:.1%} white: blank"
    # The charts' own colour (#4c72b0): the timeline's bars and the breakdown's compute.
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    blue = int(((abs(r - 0x4C) < 12) & (abs(g - 0x72) < 12) & (b > 0x9F)).sum())
    assert blue > 5_000, f"only {blue} pixels of the charts' blue: no chart drawn?"
    variance = float(rgb.mean(axis=2).var())
    assert variance > 200, f"pixel variance {variance:.0f}: a uniform page"


def test_a_broken_page_fails_the_same_checks(
    chromium: str, report: RunReport, tmp_path: Path
) -> None:
    """The checks above can fail: an undecodable image shows up, and a script that is not
    the page's own is refused by the Content-Security-Policy (allowed by hash only)."""
    html = report.path.read_text()
    broken = re.sub(
        r"data:image/png;base64,[A-Za-z0-9+/=]+", "data:image/png;base64,AAAA", html, count=1
    )
    broken = broken.replace("</main>", "</main><script>noSuchFunction();</script>")
    page = tmp_path / "broken.html"
    page.write_text(broken)
    proc = run_chromium(
        chromium, tmp_path, "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()
    )
    body = body_attributes(proc.stdout)
    assert body.get("data-report-status") == "broken-images"
    assert body["data-broken-images"] != ""
    refused = [line for line in console_lines(proc.stderr) if "Content Security Policy" in line]
    assert refused, "an injected inline script ran: the page's CSP allows more than its own"
