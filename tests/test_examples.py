"""Every example in examples/ runs as `python examples/X.py` and prints its result."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, cwd: Path, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_every_example_is_tested() -> None:
    tested = {
        "map_files.py",
        "map_numpy_shared.py",
        "map_initializer.py",
        "wordcount.py",
        "vocabulary.py",
        "sweep_digits_mlp.py",
        "serve_embeddings.py",
        "digits_model.py",
        "train_ddp.py",
        "train_ddp_pipeline.py",
        # run under their strategies' tests: tests/test_distributed_{ps,pipeline,tf}.py
        "train_ps.py",
        "train_pipeline.py",
        "train_tf_mwms.py",
    }
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested


def test_map_files_resumes_from_its_run_directory(tmp_path: Path) -> None:
    out = run_example("map_files.py", tmp_path, str(tmp_path / "work"))
    assert "first run: interrupted after 20 files" in out
    match = re.search(
        r"second run: (\d+) files resumed from the run directory, (\d+) computed", out
    )
    assert match, out
    resumed, computed = int(match[1]), int(match[2])
    assert resumed >= 20
    assert resumed + computed == 48
    assert "third run: resumed 48 of 48 files, computed 0" in out
    assert len(list((tmp_path / "work" / "raw").glob("*.clean.csv"))) == 48
    assert len(list((tmp_path / "work" / "run" / "chunks").glob("*.pkl"))) >= 12
    # Running it again on the same directory resumes everything at once.
    again = run_example("map_files.py", tmp_path, str(tmp_path / "work"))
    assert "second run: 48 files resumed from the run directory, 0 computed" in again


def test_map_numpy_shared_agrees_with_the_serial_computation(tmp_path: Path) -> None:
    out = run_example("map_numpy_shared.py", tmp_path)
    match = re.search(r"predictions agree with the serial computation: (\d+) of (\d+)", out)
    assert match, out
    assert int(match[2]) == 32 * 256
    assert int(match[1]) >= 0.999 * int(match[2])
    assert "summary: 32 items (32 computed, 0 resumed)" in out


def test_map_initializer_loads_the_model_once_per_worker(tmp_path: Path) -> None:
    out = run_example("map_initializer.py", tmp_path)
    match = re.search(r"scored 2000 sentences on (\d+) workers", out)
    assert match, out
    workers = int(match[1])
    assert f"model loads: {workers} for 2000 sentences (once per worker)" in out
    assert re.search(r"labels: \{'negative': \d+, 'positive': \d+\}", out), out


def test_sweep_digits_mlp_tunes_the_mlp(tmp_path: Path) -> None:
    out = run_example(
        "sweep_digits_mlp.py", tmp_path, "--sweep", "--trials", "4", "--run-dir", "run"
    )
    assert re.search(r"^4 trials in .*run: \{", out, re.M), out
    assert "best parameters: {'lr': " in out
    found = re.search(r"best val_loss: (\d+\.\d+)", out)
    assert found is not None, out
    assert 0.0 < float(found.group(1)) < 1.0
    assert (tmp_path / "run" / "trials.csv").read_text().count("\n") == 5  # header + 4


def test_train_ddp_learns_the_digits_and_resumes(tmp_path: Path) -> None:
    def launch(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "paralela",
                "launch",
                "--nproc",
                "2",
                str(EXAMPLES / "train_ddp.py"),
                *args,
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=180,
        )

    ckpt, out = tmp_path / "ckpt.pt", tmp_path / "result.json"
    first = launch("--epochs", "4", "--checkpoint", str(ckpt), "--out", str(out))
    assert first.returncode == 0, first.stdout + first.stderr
    result = json.loads(out.read_text())
    assert result["world_size"] == 2
    assert result["accuracy"] > 0.85
    # Asked for more epochs, it goes on from the checkpoint instead of starting over.
    more = launch("--epochs", "6", "--checkpoint", str(ckpt), "--out", str(out))
    assert more.returncode == 0, more.stdout + more.stderr
    assert "[rank 0] resuming after epoch 3" in more.stdout
    assert json.loads(out.read_text())["accuracy"] > 0.85


def test_train_ddp_pipeline_learns_the_digits_from_a_pipeline(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    run = subprocess.run(
        [sys.executable, "-m", "paralela", "launch", "--nproc", "2",
         str(EXAMPLES / "train_ddp_pipeline.py"), "--epochs", "3", "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    assert result["world_size"] == 2
    assert result["accuracy"] > 0.85


def test_wordcount_equals_a_serial_counter(tmp_path: Path) -> None:
    out = run_example("wordcount.py", tmp_path, str(tmp_path / "corpus"))
    assert "wrote a corpus to" in out
    assert re.search(r"\d+ distinct words; equal to a serial Counter: True", out), out
    assert len(list((tmp_path / "corpus").glob("*.txt"))) == 6
    # A second run counts the corpus already there.
    again = run_example("wordcount.py", tmp_path, str(tmp_path / "corpus"))
    assert "wrote a corpus" not in again
    assert "equal to a serial Counter: True" in again


def test_vocabulary_gives_ids_to_tokens_seen_min_count_times(tmp_path: Path) -> None:
    import collections
    import importlib.util

    out = run_example("vocabulary.py", tmp_path, "corpus", "--min-count", "5")
    vocabulary = json.loads((tmp_path / "corpus" / "vocab.json").read_text(encoding="utf-8"))
    spec = importlib.util.spec_from_file_location("vocabulary_example", EXAMPLES / "vocabulary.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    counts: collections.Counter[str] = collections.Counter()
    for path in sorted((tmp_path / "corpus").glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            counts.update(module.tokenize(json.loads(line)["text"]))
    kept = {t for t, n in counts.items() if n >= 5}
    assert set(vocabulary) == kept | set(module.SPECIALS)
    assert sorted(vocabulary.values()) == list(range(len(vocabulary)))
    assert [vocabulary[s] for s in module.SPECIALS] == [0, 1, 2, 3]
    # Ids by frequency, ties by token: the most frequent token comes right after the specials.
    assert vocabulary[min(kept, key=lambda t: (-counts[t], t))] == len(module.SPECIALS)
    assert f"{len(counts)} distinct tokens; {len(vocabulary)} in the vocabulary" in out


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))  # the embeddings have unit length


def test_serve_embeddings_embeds_offline_and_predict_equals_a_serial_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np

    import paralela

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network: the weights are on disk
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.syspath_prepend(str(EXAMPLES))  # the workers import it by the same name
    from serve_embeddings import DIMENSIONS, Embedder

    model = Embedder()
    model.setup("cpu")
    guitar, plays, market = model.predict(
        ["A man is playing a guitar.", "Someone plays the guitar.", "Stocks fell sharply today."]
    )
    assert len(guitar) == len(plays) == len(market) == DIMENSIONS == 384
    assert np.linalg.norm(guitar) == pytest.approx(1.0, abs=1e-5)
    assert cosine(guitar, plays) > 0.6 > cosine(guitar, market)
    assert cosine(guitar, plays) > cosine(plays, market)

    subjects = ["the cat", "a model", "my neighbour", "the committee", "an engineer"]
    verbs = ["reads", "trains", "ignores", "approves", "repairs"]
    sentences = [f"{s} {v} the report number {i}" for i, (s, v) in
                 enumerate((s, v) for s in subjects for v in verbs)]  # fmt: skip
    corpus = tmp_path / "sentences.txt"
    corpus.write_text("\n".join(sentences) + "\n")
    result = paralela.predict(
        Embedder, corpus, output=tmp_path / "out", workers=2, batch_size=8, split_bytes="400B"
    )
    assert result.records == len(sentences) == 25
    assert result.shards >= 2
    rows = [json.loads(line) for f in result.files for line in Path(f).read_text().splitlines()]
    assert [row["input"] for row in rows] == sentences
    serial = [v for i in range(0, 25, 8) for v in model.predict(sentences[i : i + 8])]
    assert np.allclose([row["output"] for row in rows], serial, atol=1e-5)

    # The script's serve command: the class of its __main__ behind paralela.serve.
    served = _serve_script(EXAMPLES / "serve_embeddings.py", sentences[:6])
    alone = [model.predict([s])[0] for s in sentences[:6]]
    assert np.allclose(served, alone, atol=1e-4)  # padded in a batch: float32 noise only


def _serve_script(script: Path, sentences: list[str]) -> list[list[float]]:
    """Run ``SCRIPT serve --port 0``, ask it for ``sentences`` (one request each, at
    once), stop it with SIGTERM (it must exit 0) and return the embeddings."""
    import asyncio
    import signal

    import httpx

    process = subprocess.Popen(
        [sys.executable, str(script), "serve", "--port", "0", "--workers", "1"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        while "ready on" not in line:
            assert line, "the server exited before it was ready"
            line = process.stderr.readline()
        url = re.search(r"(http://\S+)", line).group(1)  # type: ignore[union-attr]

        async def ask() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=60) as http:
                return await asyncio.gather(
                    *(http.post(f"{url}/predict", json={"input": s}) for s in sentences)
                )

        answers = asyncio.run(ask())
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        return [a.json()["output"] for a in answers]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()


def test_digits_model_predicts_like_a_serial_loop(tmp_path: Path) -> None:
    out = run_example("digits_model.py", tmp_path, "--workers", "2")
    assert re.search(r"^360 records in 4 shards, .*; 2 workers;", out, re.M), out
    assert "predictions agree with a serial loop: 360 of 360" in out
    found = re.search(r"accuracy on the held-out images: (\d+\.\d)%", out)
    assert found is not None, out
    assert float(found[1]) > 90.0
    # The serial loop trained and saved the weights; the workers loaded them.
    assert (tmp_path / "paralela-runs" / "digits-mlp.pt").is_file()


def test_digits_model_refuses_an_image_that_is_not_64_pixels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import paralela
    from paralela.errors import InputError

    monkeypatch.setenv("PARALELA_DIGITS_CHECKPOINT", str(tmp_path / "mlp.pt"))
    monkeypatch.syspath_prepend(str(EXAMPLES))
    from digits_model import DigitsClassifier

    images = tmp_path / "images.jsonl"
    images.write_text(json.dumps([0] * 64) + "\n" + json.dumps([1] * 63) + "\n")
    with pytest.raises(InputError, match=r"images.jsonl line 2.*input_model Pixels"):
        paralela.predict(DigitsClassifier, images, output=tmp_path / "out", backend="sequential")
