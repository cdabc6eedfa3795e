"""The documentation site (mkdocs.yml), built strictly and opened in a real browser.

The site is built as ``make docs`` builds it (``mkdocs build --strict``) into a temporary
directory and served on a loopback ``http.server``. Debian's headless chromium (as the
report tests use it) opens the home page, a lesson, the CLI reference and an API
reference page, whose title and headings must be in the DOM; and the search: its index
holds the words, and Material's own search, driven in chromium through the DevTools
protocol on a pipe, finds a word and links to the page that has it. A small site with a
broken link and a broken anchor shows that the site's validation settings fail on them.
Every example is in the examples' index and linked from a guide page.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_reporting_browser import FLAGS, run_chromium

ROOT = Path(__file__).resolve().parent.parent
BUILD_TIMEOUT = 100.0  # seconds; the build takes 10-20 s on 2 cores
BROWSER_TIMEOUT = 60.0  # seconds for one DevTools reply or one page's search results


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    proc = mkdocs_build(ROOT / "mkdocs.yml", out)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr[-5000:]}"
    return out


@pytest.fixture(scope="module")
def server(site: Path) -> Iterator[str]:
    """The built site on a loopback port (Material's search needs http, not file://)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def dom(chromium: str, url: str, workdir: Path) -> str:
    proc = run_chromium(chromium, workdir, "--dump-dom", url)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def text_of(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("page", "title", "heading", "wanted"),
    [
        ("index.html", "paralela", "paralela", ["Lessons", "paralela map", "make demo"]),
        ("lessons/index.html", "Lessons", "Lessons", ["Data parallelism", "Amdahl"]),
        (
            "reference/cli.html",
            "CLI reference",
            "CLI reference",
            ["paralela map", "--chunksize", "Exit codes"],
        ),
        (
            "reference/api/mapping.html",
            "Map",
            "paralela.mapping",
            ['id="paralela.mapping.map"', 'id="paralela.mapping.imap"', "Apply fn to every item"],
        ),
    ],
)
def test_a_page_renders_with_its_title_headings_and_menu(
    chromium: str,
    server: str,
    tmp_path: Path,
    page: str,
    title: str,
    heading: str,
    wanted: list[str],
) -> None:
    html = dom(chromium, f"{server}/{page}", tmp_path)
    match = re.search(r"<title>([^<]*)</title>", html)
    assert match is not None, html[:2000]
    assert match.group(1) == f"{title} - paralela" or match.group(1) == title
    h1 = re.search(r"<h1[^>]*>(.*?)</h1>", html, flags=re.DOTALL)
    assert h1 is not None, "no h1 heading"
    assert heading in text_of(h1.group(1))
    text = text_of(html)
    for word in wanted:  # in the text, or an object's anchor in the HTML
        assert word in text or word in html, f"{word!r} not on {page}"
    # Material's menu, rendered by the theme: every section of the site
    for section in ("Getting started", "Guide", "Lessons", "Reference"):
        assert section in text, f"menu section {section!r} not on {page}"


@pytest.mark.slow
def test_the_built_cli_reference_has_every_option_of_every_command(site: Path) -> None:
    import typer

    from paralela.cli import app

    root = typer.main.get_command(app)
    text = text_of((site / "reference/cli.html").read_text(encoding="utf-8"))
    ctx = root.context_class(root, info_name="paralela")
    names = root.list_commands(ctx)
    assert len(names) >= 12
    for name in names:
        command = root.get_command(ctx, name)
        assert f"paralela {name}" in text
        for param in command.params:
            if param.param_type_name == "option" and not param.hidden:
                for opt in [*param.opts, *param.secondary_opts]:
                    assert opt in text, f"paralela {name} {opt} is not in the CLI reference"


@pytest.mark.slow
def test_the_search_index_holds_the_words_of_the_pages(site: Path) -> None:
    index = json.loads((site / "search/search_index.json").read_text(encoding="utf-8"))
    docs = index["docs"]
    where = {d["location"].split("#")[0] for d in docs if "chunksize" in d["text"]}
    assert "map.html" in where
    assert "reference/cli.html" in where
    assert any("Gustafson" in d["text"] for d in docs if d["location"].startswith("scaling"))


@pytest.mark.slow
def test_the_api_reference_links_the_objects_its_docstrings_name(site: Path) -> None:
    pages = sorted((site / "reference/api").glob("*.html"))
    assert len(pages) > 15
    for page in pages:
        html = page.read_text(encoding="utf-8")
        roles = re.findall(r":(?:func|class|meth|attr|mod|exc|data):`", html)
        assert roles == [], f"{page.name}: Sphinx roles shown as written"
    mapping = (site / "reference/api/mapping.html").read_text(encoding="utf-8")
    # MapIterator's docstring says :func:`paralela.imap`: a link to imap on the same page
    assert re.search(r'<a class="autorefs[^"]*"[^>]*href="#paralela\.mapping\.imap"', mapping)
    # every top-level name of the index links to its documentation
    index = (site / "reference/api/index.html").read_text(encoding="utf-8")
    assert 'href="mapping.html#paralela.mapping.map"' in index
    assert 'href="config.html#paralela.config"' in index


class DevTools:
    """Chromium driven through the DevTools protocol on a pipe (fds 3 and 4)."""

    def __init__(self, chromium: str, workdir: Path) -> None:
        to_child, self._out = os.pipe()
        self._in, from_child = os.pipe()
        profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=workdir)
        args = [chromium, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe"]
        # bash puts the two pipe ends on fds 3 and 4, where chromium expects them
        script = f'exec "$@" 3<&{to_child} 4>&{from_child}'
        self.proc = subprocess.Popen(
            ["bash", "-c", script, "chromium", *args, "about:blank"],
            pass_fds=(to_child, from_child),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its renderer and GPU processes go with it on close
        )
        os.close(to_child)
        os.close(from_child)
        self._buffer = b""
        self._id = 0
        try:
            # a page of our own: the first one may not exist yet when the pipe answers
            target = self.call("Target.createTarget", url="about:blank")["targetId"]
            attached = self.call("Target.attachToTarget", targetId=target, flatten=True)
        except BaseException:
            self.kill()
            raise
        self.session: str = attached["sessionId"]

    def kill(self) -> None:
        """Kill chromium and its renderers (its own process group), close the pipes."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        os.close(self._out)
        os.close(self._in)

    def call(self, method: str, session: str | None = None, **params: Any) -> Any:
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + BROWSER_TIMEOUT
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._id:
                    assert "error" not in reply, f"{method}: {reply['error']}"
                    return reply["result"]
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"chromium did not answer {method} within {BROWSER_TIMEOUT} s")
            ready, _, _ = select.select([self._in], [], [], left)
            if ready:
                chunk = os.read(self._in, 1 << 16)
                assert chunk, "chromium closed its DevTools pipe"
                self._buffer += chunk

    def evaluate(self, expression: str) -> Any:
        result = self.call(
            "Runtime.evaluate", self.session, expression=expression, returnByValue=True
        )
        return result["result"].get("value")

    def close(self) -> None:
        try:
            self.call("Browser.close")
            self.proc.wait(timeout=BROWSER_TIMEOUT)
        finally:
            self.kill()


@pytest.mark.slow
def test_search_in_the_browser_finds_a_word_and_links_to_its_page(
    chromium: str, server: str, tmp_path: Path
) -> None:
    browser = DevTools(chromium, tmp_path)
    try:
        # ?q= opens Material's search with the word typed in, once its worker has the index
        browser.call("Page.navigate", browser.session, url=f"{server}/index.html?q=chunksize")
        links: list[str] = []
        deadline = time.monotonic() + BROWSER_TIMEOUT
        while not links and time.monotonic() < deadline:
            links = browser.evaluate(
                "[...document.querySelectorAll('.md-search-result__item a')]"
                ".map(a => a.getAttribute('href'))"
            )
            if not links:
                time.sleep(0.1)  # poll the page until the results are there, or the deadline
        meta = browser.evaluate("document.querySelector('.md-search-result__meta').textContent")
    finally:
        browser.close()
    assert links, f"no search results within {BROWSER_TIMEOUT} s; the search says {meta!r}"
    assert re.fullmatch(r"\d+ matching documents", meta), meta
    pages = {re.sub(r"^https?://[^/]+/", "", link).split("?")[0].split("#")[0] for link in links}
    assert "map.html" in pages or "reference/api/mapping.html" in pages, pages


def test_the_site_validation_fails_a_broken_link_and_a_broken_anchor(tmp_path: Path) -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    small = {"site_name": "t", "strict": True, "validation": config["validation"]}
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/other.md").write_text("# Other\n\n## Here\n", encoding="utf-8")
    (tmp_path / "mkdocs.yml").write_text(json.dumps(small), encoding="utf-8")
    for link, error in [
        ("other.md#nowhere", "does not contain an anchor '#nowhere'"),
        ("missing.md", "not found among documentation files"),
    ]:
        (tmp_path / "docs/index.md").write_text(f"# Home\n\n[x]({link})\n", encoding="utf-8")
        proc = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
        assert proc.returncode != 0, proc.stderr
        assert error in proc.stderr, proc.stderr
    (tmp_path / "docs/index.md").write_text("# Home\n\n[x](other.md#here)\n", encoding="utf-8")
    proc = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode == 0, proc.stderr
    shutil.rmtree(tmp_path / "site")


def markdown_links(path: Path) -> set[Path]:
    """The files that a Markdown page's relative links point to, resolved."""
    text = path.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)", text)
    return {(path.parent / t).resolve() for t in targets if "://" not in t}


def test_every_example_is_in_the_examples_index_and_linked_from_a_guide_page() -> None:
    examples = ROOT / "examples"
    scripts = sorted(p for p in examples.rglob("*") if p.suffix in (".py", ".yaml") and p.is_file())
    assert len(scripts) > 20
    indexed = markdown_links(examples / "README.md")
    assert [p.name for p in scripts if p.resolve() not in indexed] == []
    linked: set[Path] = set()
    named = ""
    for page in (ROOT / "docs").rglob("*.md"):
        linked |= markdown_links(page)
        named += page.read_text(encoding="utf-8")
    top_level = [p for p in scripts if p.parent == examples]
    # a link, or the path in a command the page shows (python examples/NAME.py ...)
    missing = [
        p.name for p in top_level if p.resolve() not in linked and f"examples/{p.name}" not in named
    ]
    assert missing == []
    # the index itself is reached from the site's home page
    assert (examples / "README.md").resolve() in markdown_links(ROOT / "docs/index.md")
