"""MapReduce benchmark: a word count of a 200 MB Zipf corpus with paralela and its peers.

    parent ── corpus (bench/_corpus.py, cached) ──► for each engine, one after another:
      wait for a quiet machine ─► fresh child: `bench_mapreduce.py --child ENGINE`
        │   start the engine (untimed; Spark's JVM start timed apart)
        │   one untimed full run ("cold"), then REPS timed runs (best, median)
        │   sha256 of the sorted (word, count) table, untimed
        └─ the parent samples the child's process tree every 50 ms (psutil):
           RSS summed over the tree (peak), CPU of the tree, and the machine's other load
      then the 2 GB corpus through paralela with memory_limit="512MB" (one run), and
      the serial Counter over it

Engines, 2 workers everywhere: ``serial_lines`` (a ``Counter`` over the lines),
``mp_pool_lines`` / ``mp_pool_read_split`` (``multiprocessing.Pool(2)`` by file),
``dask_bag_frequencies`` / ``dask_bag_reduction`` (distributed ``LocalCluster``, 2
processes), ``spark_rdd`` / ``spark_df`` (``local[2]``), ``paralela_local`` (the mapper
a user writes: ``for w in line.split(): yield w, 1``), ``paralela_local_counter`` (the
mapper returns ``Counter(line.split())``, the pre-counting idiom of docs/mapreduce.md),
``paralela_local_batched`` (``batched=True``: one ``Counter`` per ~4 MiB batch of lines),
``paralela_spark`` (``engine="spark"``, ``master="local[2]"``).

Usage::

    .venv-bench/bin/python bench/bench_mapreduce.py            # everything (~15 min)
    .venv-bench/bin/python bench/bench_mapreduce.py --quick    # 16 MB corpus, 1 rep
    .venv-bench/bin/python bench/bench_mapreduce.py --only serial_lines,paralela_local
    .venv-bench/bin/python bench/bench_mapreduce.py --no-big   # skip the 2 GB corpus

Progress goes to stderr; the results to ``bench/results/mapreduce.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import add
from pathlib import Path
from typing import Any, cast

from _corpus import corpus_files, ensure_corpus  # bench/ is not a package: via sys.path
from _harness import BENCH_DIR, child_env, machine_lines, md_table, sig
from bench_sweep import machine_busy_s, wait_quiet

REPO = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results" / "mapreduce.md"
CACHE = BENCH_DIR / ".cache"
PACKAGES = ("numpy", "dask", "distributed", "pyspark", "pyarrow", "cloudpickle", "psutil")
WORKERS = 2
#: A row whose child saw more than this much other load (cores) runs again at the end
#: (``--retries``); the run with less other load is kept.
RETRY_CORES = 0.3
SPARK_CONF = {
    "spark.driver.memory": "4g",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}
BIG_LIMIT = "512MB"
BIG_LIMIT_BYTES = 512 * 1000**2
#: Allowed above the limit for the whole tree: the driver's and two workers' interpreters
#: with paralela imported (~40-60 MB each, measured as the tree's RSS before any map
#: task), which no memory_limit can shrink.
BIG_MARGIN_BYTES = 192 * 1000**2

# The anchors' figures (wall s, same corpus parameters, same machine type).
ANCHORS = {
    "spark_df": 3.1,
    "mp_pool_lines": 3.2,
    "dask_bag_reduction": 4.2,
    "serial_lines": 5.2,
    "spark_rdd": 12.2,
    "dask_bag_frequencies": 15.3,
}
ENGINES = (
    "serial_lines",
    "mp_pool_lines",
    "mp_pool_read_split",
    "dask_bag_frequencies",
    "dask_bag_reduction",
    "spark_rdd",
    "spark_df",
    "paralela_local",
    "paralela_local_counter",
    "paralela_local_batched",
    "paralela_local_files",
    "paralela_spark",
)
LABELS = {
    "paralela_local": "paralela_local (mapper: `for w in line.split(): yield w, 1`)",
    "paralela_local_counter": "paralela_local_counter (mapper returns `Counter(line.split())`)",
    "paralela_local_batched": "paralela_local_batched (`batched=True`; mapper returns "
    "`Counter(chain.from_iterable(map(str.split, lines)))`)",
    "paralela_local_files": "paralela_local_files (records = the file paths, "
    "`input_format='records'`; mapper returns `Counter(f.read().split())`)",
    "paralela_spark": "paralela_spark (engine='spark', local[2])",
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ work functions
# Module-level (imported by name as ``bench_mapreduce`` in every worker: bench/ is on
# PYTHONPATH), so every engine pickles them by reference.


def count_lines(path: str) -> Counter[str]:
    """The serial loop over one file: ``Counter.update(line.split())`` per line."""
    counts: Counter[str] = Counter()
    update = counts.update
    with open(path, encoding="utf-8") as f:
        for line in f:
            update(line.split())
    return counts


def count_read_split(path: str) -> Counter[str]:
    """One file read whole and split at once."""
    with open(path, encoding="utf-8") as f:
        return Counter(f.read().split())


def count_partition(lines: Iterable[str]) -> Counter[str]:
    counts: Counter[str] = Counter()
    update = counts.update
    for line in lines:
        update(line.split())
    return counts


def merge_counters(parts: Iterable[Counter[str]]) -> Counter[str]:
    total: Counter[str] = Counter()
    for part in parts:
        total.update(part)
    return total


def split_mapper(line: str) -> Iterator[tuple[str, int]]:
    """The mapper a user writes for a word count."""
    for w in line.split():
        yield w, 1


def counter_mapper(line: str) -> Counter[str]:
    """The pre-counting mapper of docs/mapreduce.md: a mapping per line."""
    return Counter(line.split())


def batch_mapper(lines: list[str]) -> Counter[str]:
    """The batched mapper of docs/mapreduce.md: one Counter per ~4 MiB batch of lines."""
    return Counter(chain.from_iterable(map(str.split, lines)))


def table_sha256(counts: Iterable[tuple[str, int]]) -> tuple[str, int, int]:
    """sha256 of the sorted table, its distinct words and its total count."""
    items = sorted((str(k), int(v)) for k, v in counts)
    h = hashlib.sha256()
    for k, v in items:
        h.update(f"{k}\t{v}\n".encode())
    return h.hexdigest(), len(items), sum(v for _, v in items)


# ------------------------------------------------------------------------- children


def _spark_session() -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(f"local[{WORKERS}]").appName("bench-mapreduce")
    for k, v in SPARK_CONF.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def child_main(
    engine: str, files: list[str], reps: int, result_path: str, extra: dict[str, Any]
) -> None:
    """Start ``engine``, warm it with one run, time ``reps`` runs; write a JSON result."""
    import bench_mapreduce as W  # by name, so that workers import the functions

    out: dict[str, Any] = {"engine": engine}
    cleanup: list[Callable[[], Any]] = []
    t0 = time.perf_counter()
    run: Callable[[], Iterable[tuple[str, int]]]

    if engine == "serial_lines":

        def run() -> Iterable[tuple[str, int]]:
            total: Counter[str] = Counter()
            update = total.update
            for path in files:
                with open(path, encoding="utf-8") as f:
                    for line in f:
                        update(line.split())
            return total.items()

    elif engine in ("mp_pool_lines", "mp_pool_read_split"):
        import multiprocessing as mp

        pool = mp.get_context("fork").Pool(WORKERS)
        cleanup.append(pool.terminate)
        fn = W.count_lines if engine == "mp_pool_lines" else W.count_read_split

        def run() -> Iterable[tuple[str, int]]:
            return W.merge_counters(pool.map(fn, files, chunksize=1)).items()

    elif engine.startswith("dask_"):
        import dask.bag as db  # type: ignore[import-not-found]
        from dask.distributed import Client, LocalCluster  # type: ignore[import-not-found]

        cluster = LocalCluster(
            n_workers=WORKERS, threads_per_worker=1, processes=True, dashboard_address=None
        )
        client = Client(cluster)
        cleanup += [cluster.close, client.close]

        if engine == "dask_bag_frequencies":

            def run() -> Iterable[tuple[str, int]]:
                bag = db.read_text(files).str.split().flatten().frequencies()
                return cast("Iterable[tuple[str, int]]", bag.compute())

        else:

            def run() -> Iterable[tuple[str, int]]:
                bag = db.read_text(files).reduction(W.count_partition, W.merge_counters)
                return cast("Iterable[tuple[str, int]]", bag.compute().items())

    elif engine in ("spark_rdd", "spark_df", "paralela_spark"):
        spark = _spark_session()
        out["jvm_start_s"] = time.perf_counter() - t0
        cleanup.append(spark.stop)
        sc = spark.sparkContext
        if engine == "spark_rdd":

            def run() -> Iterable[tuple[str, int]]:
                rdd = sc.textFile(",".join(files))
                pairs = (
                    rdd.flatMap(lambda line: line.split())
                    .map(lambda w: (w, 1))
                    .reduceByKey(add)
                    .collect()
                )
                return cast("Iterable[tuple[str, int]]", pairs)

        elif engine == "spark_df":
            from pyspark.sql import functions as F

            def run() -> Iterable[tuple[str, int]]:
                df = spark.read.text(files)
                words = df.select(F.explode(F.split(df.value, " ")).alias("word"))
                rows = words.groupBy("word").count().collect()
                return [(r[0], r[1]) for r in rows]

        else:
            from wordcount import (  # type: ignore[import-not-found]  # examples/ on PYTHONPATH
                combiner,
                reducer,
            )

            import paralela

            def run() -> Iterable[tuple[str, int]]:
                result = paralela.mapreduce(
                    W.split_mapper,
                    reducer,
                    files,
                    combiner=combiner,
                    engine="spark",
                    master=f"local[{WORKERS}]",
                    progress=False,
                )
                out["summary"] = str(result.summary)
                return result.to_dict().items()

    elif engine.startswith("paralela_"):
        from wordcount import (  # examples/ on PYTHONPATH
            combiner,
            reducer,
        )

        import paralela

        mapper: Any = W.split_mapper
        options: dict[str, Any] = {}
        if engine == "paralela_local_counter":
            mapper = W.counter_mapper
        elif engine == "paralela_local_batched":
            mapper = W.batch_mapper
            options = {"batched": True}
        elif engine == "paralela_local_files":
            mapper = W.count_read_split
            options = {"input_format": "records", "records_per_split": 1}
        limit = extra.get("memory_limit")

        def run() -> Iterable[tuple[str, int]]:
            result = paralela.mapreduce(
                mapper,
                reducer,
                files,
                combiner=combiner,
                workers=WORKERS,
                memory_limit=limit,
                progress=False,
                **options,
            )
            counts = result.to_dict()
            out["summary"] = str(result.summary)
            return counts.items()

    else:
        raise SystemExit(f"unknown engine {engine!r}")

    out["start_s"] = time.perf_counter() - t0
    _mark(result_path, "started")
    try:
        if reps > 0:
            t = time.perf_counter()
            cold = run()
            out["cold_s"] = time.perf_counter() - t
            out["sha256"], out["distinct"], out["tokens"] = table_sha256(cold)
            del cold
        times = []
        for _ in range(max(1, reps)):
            t = time.perf_counter()
            counts = run()
            times.append(time.perf_counter() - t)
            if reps <= 0:  # one run only: check it
                out["sha256"], out["distinct"], out["tokens"] = table_sha256(counts)
            del counts
        out["times"] = times
    finally:
        for fn_ in cleanup:
            with contextlib.suppress(Exception):
                fn_()
    Path(result_path).write_text(json.dumps(out))


def _mark(result_path: str, what: str) -> None:
    Path(result_path + "." + what).write_text(str(time.time()))


# --------------------------------------------------------------------------- parent


class TreeSampler:
    """Every ``interval`` s: RSS summed over the process tree of ``root`` (peak kept, also
    the largest single process), and CPU seconds used by the tree."""

    def __init__(self, root: int, interval: float = 0.05) -> None:
        import psutil

        self._psutil = psutil
        self.root = psutil.Process(root)
        self.interval = interval
        self.peak_rss = 0
        self.peak_proc_rss = 0
        self.peak_procs = 0
        self.cpu = 0.0
        self._last: dict[tuple[int, float], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        ps = self._psutil
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except ps.Error:
            return
        total = 0
        for p in procs:
            try:
                with p.oneshot():
                    rss = p.memory_info().rss
                    ct = p.cpu_times()
                    key = (p.pid, p.create_time())
            except ps.Error:
                continue
            total += rss
            self.peak_proc_rss = max(self.peak_proc_rss, rss)
            cur = ct.user + ct.system
            self.cpu += cur - self._last.get(key, 0.0)
            self._last[key] = cur
        if total > self.peak_rss:
            self.peak_rss = total
            self.peak_procs = len(procs)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclass
class Row:
    engine: str
    ok: bool = False
    error: str = ""
    start_s: float | None = None
    jvm_start_s: float | None = None
    cold_s: float | None = None
    times: list[float] = field(default_factory=list)
    sha256: str = ""
    distinct: int = 0
    tokens: int = 0
    peak_rss: int = 0
    peak_proc_rss: int = 0
    peak_procs: int = 0
    other_cores: float = 0.0
    earlier_other: list[float] = field(default_factory=list)  # other load of runs not kept
    summary: str = ""

    @property
    def best(self) -> float | None:
        return min(self.times) if self.times else None

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times else None


def _rusage_children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_engine(
    engine: str, files: list[str], reps: int, timeout: float, extra: dict[str, Any] | None = None
) -> Row:
    """Run ``engine`` in a fresh child process, sampling its process tree."""
    row = Row(engine)
    wait_quiet(30.0, log)
    with tempfile.TemporaryDirectory(prefix="bench-mr-") as tmp:
        result = os.path.join(tmp, "result.json")
        spec = os.path.join(tmp, "spec.json")
        Path(spec).write_text(json.dumps({"files": files, "extra": extra or {}}))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", engine,
               "--reps", str(reps), "--spec", spec, "--result", result]  # fmt: skip
        env = child_env({"PYTHONPATH": os.pathsep.join([str(BENCH_DIR), str(REPO / "examples")])})
        env["PYSPARK_PYTHON"] = sys.executable
        env["PYSPARK_DRIVER_PYTHON"] = sys.executable
        busy0, tree0 = machine_busy_s(), _rusage_children_cpu()
        t0 = time.perf_counter()
        with tempfile.TemporaryFile() as logf:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                env=env, cwd=str(REPO), start_new_session=True,
            )  # fmt: skip
            sampler = TreeSampler(proc.pid)
            try:
                code: int | None = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = None
            # Whatever the engine left behind (daemons) goes with the session.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            wall = time.perf_counter() - t0
            sampler.stop()
            logf.seek(0)
            tail = logf.read().decode("utf-8", "replace")[-3000:]
        tree = max(_rusage_children_cpu() - tree0, sampler.cpu)
        row.other_cores = max(0.0, (machine_busy_s() - busy0) - tree) / max(wall, 1e-9)
        row.peak_rss, row.peak_proc_rss = sampler.peak_rss, sampler.peak_proc_rss
        row.peak_procs = sampler.peak_procs
        if code != 0 or not os.path.exists(result):
            row.error = "timed out" if code is None else f"exit {code}"
            log(f"  {engine}: FAILED ({row.error})\n{tail}")
            return row
        data = json.loads(Path(result).read_text())
    row.ok = True
    row.start_s = data.get("start_s")
    row.jvm_start_s = data.get("jvm_start_s")
    row.cold_s = data.get("cold_s")
    row.times = data["times"]
    row.sha256, row.distinct, row.tokens = data["sha256"], data["distinct"], data["tokens"]
    row.summary = data.get("summary", "")
    return row


def _logged(row: Row) -> Row:
    if row.ok:
        log(f"  {row.engine}: best {sig(row.best)} s, median {sig(row.median)} s, cold "
            f"{sig(row.cold_s)} s, peak RSS {_mb(row.peak_rss)} MB, other load "
            f"{row.other_cores:.2f} cores")  # fmt: skip
    return row


def _load(r: Row) -> str:
    """The row's other load, and that of the runs of it not kept."""
    if not r.earlier_other:
        return f"{r.other_cores:.2f}"
    return f"{r.other_cores:.2f} (other runs: {', '.join(f'{c:.2f}' for c in r.earlier_other)})"


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:,.0f}"


def render(
    args: argparse.Namespace,
    manifest: dict[str, Any],
    rows: list[Row],
    big: dict[str, Any] | None,
) -> str:
    by = {r.engine: r for r in rows}
    serial = by.get("serial_lines")
    ref = serial.sha256 if serial and serial.ok else ""
    mb = manifest["bytes"] / 1e6
    lines = [
        "# MapReduce benchmark (`bench/bench_mapreduce.py`)",
        "",
        "Word count of a synthetic corpus, 2 workers everywhere, each engine alone in a "
        "fresh child process, one after another. **The figures are noisy**: a 2-core VM "
        "shared with other engineers running tests; `other load` is the CPU the rest of the "
        "machine used while the row ran (cores, /proc/stat minus the engine's own tree). "
        "Compare rows within this run; best-of is the most stable figure. A row that saw "
        f"more than {RETRY_CORES} cores of other load ran again at the end "
        f"(`--retries {args.retries}`) and the run with less other load is kept.",
        "",
        *machine_lines(PACKAGES),
        f"- Command: `{' '.join(['bench/bench_mapreduce.py', *args.argv])}`",
        "",
        "## Corpus",
        "",
        f"- {mb:.1f} MB in {len(manifest['files'])} files, {manifest['tokens']:,} tokens, "
        f"{manifest['lines']:,} lines; Zipf s=1.0 over a vocabulary of 50,000 random "
        "lowercase words (3-10 letters), 1-23 words a line (mean 12), seed 20240611; "
        "generated by `bench/_corpus.py` (numpy) and cached under `bench/.cache/`.",
        "- The anchors' corpus: 200.0 MB in 16 files, 27,023,456 tokens, 50,000 distinct "
        "words, same parameters, their own generator (not available): the sizes and the "
        "distribution match, the bytes and checksums differ (their words are a little "
        "shorter: 7.40 bytes a token against this one's "
        f"{manifest['bytes'] / max(1, manifest['tokens']):.2f}).",
        f"- sha256 of file 0: `{manifest['files'][0]['sha256'][:16]}...`",
        "",
        "## 200 MB corpus" if not args.quick else "## Quick corpus (smoke run)",
        "",
        f"Cold = the untimed warm-up run; best and median of {args.reps} timed runs; "
        "start-up (pool, cluster, JVM) excluded, Spark's JVM start shown apart. Peak RSS "
        "= the largest sum of RSS over the engine's process tree (the child, its workers; "
        "for Spark the JVM and its Python workers), sampled every 50 ms with psutil over "
        "the child's whole life (warm-up included); forked workers share pages, so the sum "
        "overstates. `counts` = the full (word, count) table's sha256 equals serial_lines'.",
        "",
    ]
    headers = ["engine", "JVM start s", "cold s", "best s", "median s", "MB/s",
               "speed-up vs serial (best)", "peak RSS MB", "counts", "other load (cores)",
               "anchors' wall s"]  # fmt: skip
    table = []
    for r in rows:
        label = LABELS.get(r.engine, r.engine)
        if not r.ok:
            table.append(
                [
                    label,
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    _mb(r.peak_rss),
                    r.error,
                    f"{r.other_cores:.2f}",
                    "-",
                ]
            )
            continue
        speed = serial.best / r.best if serial and serial.best and r.best else None
        same = "identical" if r.sha256 == ref else ("reference" if r is serial else "DIFFERENT")
        if r is serial:
            same = "reference"
        table.append([
            label,
            sig(r.jvm_start_s),
            sig(r.cold_s),
            sig(r.best),
            sig(r.median),
            sig(mb / r.best) if r.best else "-",
            f"{speed:.2f}x" if speed else "-",
            _mb(r.peak_rss),
            same,
            _load(r),
            sig(ANCHORS.get(r.engine)),
        ])  # fmt: skip
    lines += [md_table(headers, table), ""]
    lines += _targets(by, mb)
    for r in rows:
        if r.summary:
            lines.append(f"- `{r.engine}` summary (last run): {r.summary}")
    lines.append("")
    if big is not None:
        lines += _big_section(big)
    return "\n".join(lines) + "\n"


def _targets(by: dict[str, Row], mb: float) -> list[str]:
    serial = by.get("serial_lines")
    out = ["## Targets", ""]
    if not (serial and serial.ok and serial.best):
        return [*out, "- serial_lines did not run: no ratios.", ""]
    peers = [
        by[e]
        for e in ENGINES
        if e in by and not e.startswith("paralela") and by[e].ok and by[e] is not serial
    ]
    fastest = min(peers, key=lambda r: r.best or 1e9) if peers else None
    for name in ("paralela_local", "paralela_local_counter", "paralela_local_batched"):
        r = by.get(name)
        if not (r and r.ok and r.best):
            continue
        ratio = r.best / serial.best
        out.append(
            f"- `{name}`: {ratio:.2f}x serial wall ({serial.best / r.best:.2f}x speed-up); "
            f"target ≤ 0.55x: **{'met' if ratio <= 0.55 else 'MISSED'}**."
        )
        if fastest is not None and fastest.best:
            out.append(
                f"  Fastest peer: `{fastest.engine}` {sig(fastest.best)} s; paralela / fastest "
                f"peer = {r.best / fastest.best:.2f}x; faster than every peer: "
                f"**{'met' if r.best < fastest.best else 'MISSED'}**."
            )
    natural, batched = by.get("paralela_local"), by.get("paralela_local_batched")
    if natural and natural.ok and natural.best:  # issue 27's row: the natural mapper
        speed_up = serial.best / natural.best
        out.append(
            f"- `paralela_local` (the natural mapper, combined in the map task): "
            f"{speed_up:.2f}x serial; target ≥ 1.5x: **{'met' if speed_up >= 1.5 else 'MISSED'}**."
        )
        if batched and batched.ok and batched.best:
            ratio = natural.best / batched.best
            out.append(
                f"  Against the batched mapper: {ratio:.2f}x its wall time (best; medians "
                f"{sig(natural.median)} s vs {sig(batched.median)} s); target within 1.3x: "
                f"**{'met' if ratio <= 1.3 else 'MISSED'}**."
            )
    ps, rdd = by.get("paralela_spark"), by.get("spark_rdd")
    if ps and ps.ok and rdd and rdd.ok and ps.best and rdd.best:
        ratio = ps.best / rdd.best
        out.append(
            f"- `paralela_spark` / hand-written `spark_rdd` = {ratio:.2f}x (best; medians "
            f"{sig(ps.median)} s vs {sig(rdd.median)} s); target within 10 %: "
            f"**{'met' if ratio <= 1.10 else 'MISSED'}**."
        )
    out.append("")
    return out


def _big_section(big: dict[str, Any]) -> list[str]:
    limit = big["limit"]
    out = [f"## {big['manifest']['bytes'] / 1e9:.2f} GB corpus, memory_limit={limit}", ""]
    m = big["manifest"]
    out.append(
        f"- Corpus: {m['bytes'] / 1e6:,.1f} MB in {len(m['files'])} files, {m['tokens']:,} "
        "tokens (the same generator, 10x the files)."
    )
    r: Row = big["paralela"]
    if not r.ok:
        out.append(f"- paralela_local: FAILED ({r.error})")
    else:
        limit_bytes = big["limit_bytes"]
        tree_ok = r.peak_rss <= limit_bytes + BIG_MARGIN_BYTES
        s_row = big.get("serial")
        same = bool(s_row and s_row.ok and s_row.sha256 == r.sha256)
        out += [
            f"- paralela_local (mapper `for w in line.split(): yield w, 1`, combiner, "
            f'workers=2, memory_limit="{limit}"), one run: **{sig(r.best)} s** '
            f"({m['bytes'] / 1e6 / (r.best or 1):,.0f} MB/s), counts "
            f"{'identical to' if same else 'NOT compared with / different from'} "
            f"the serial Counter's ({r.distinct:,} words, {r.tokens:,} tokens); other load "
            f"{r.other_cores:.2f} cores.",
            f"- Peak RSS of the whole process tree (driver + workers, {r.peak_procs} "
            f"processes, psutil every 50 ms): **{_mb(r.peak_rss)} MB**; the largest single "
            f"process: {_mb(r.peak_proc_rss)} MB. Limit {_mb(limit_bytes)} MB; margin "
            f"allowed for the tree: {_mb(BIG_MARGIN_BYTES)} MB (three interpreters with "
            "paralela imported, which no memory_limit can shrink). Within limit + margin: "
            f"**{'yes' if tree_ok else 'NO'}**; within the bare limit: "
            f"{'yes' if r.peak_rss <= limit_bytes else 'no'}.",
            f"- Summary: {r.summary}",
        ]
    s: Row | None = big.get("serial")
    if s is None:
        out.append("- serial_lines on the 2 GB corpus: not run.")
    elif s.ok:
        out.append(
            f"- serial_lines on the 2 GB corpus, one run: {sig(s.best)} s, peak RSS "
            f"{_mb(s.peak_rss)} MB; paralela / serial = {(r.best or 0) / (s.best or 1):.2f}x."
        )
    else:
        out.append(f"- serial_lines on the 2 GB corpus: FAILED ({s.error}).")
    out.append("")
    return out


def main(argv: Sequence[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated engines (default: all)")
    ap.add_argument("--reps", type=int, default=0, help="timed runs per engine (default 3)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 16 MB corpus, 1 rep")
    ap.add_argument("--no-big", action="store_true", help="skip the 2 GB corpus")
    ap.add_argument("--no-big-serial", action="store_true", help="skip serial on 2 GB")
    ap.add_argument("--out", default=str(RESULTS), help="Markdown file to write")
    ap.add_argument(
        "--retries",
        type=int,
        default=1,
        help=f"reruns of a row that saw > {RETRY_CORES} cores of other load (cleaner kept)",
    )
    ap.add_argument("--cache", default=str(CACHE), help="corpus cache directory")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.argv = list(argv)
    if args.child:
        spec = json.loads(Path(args.spec).read_text())
        child_main(args.child, spec["files"], args.reps, args.result, spec["extra"])
        return
    args.reps = args.reps or (1 if args.quick else 3)
    engines = [e for e in args.only.split(",") if e] or list(ENGINES)
    for e in engines:
        if e not in ENGINES:
            raise SystemExit(f"unknown engine {e!r}; engines: {', '.join(ENGINES)}")
    cache = Path(args.cache)
    if args.quick:
        corpus_dir, manifest = (
            cache / "mapreduce-16mb",
            ensure_corpus(cache / "mapreduce-16mb", 16, 16.0, log),
        )
    else:
        corpus_dir, manifest = (
            cache / "mapreduce-200mb",
            ensure_corpus(cache / "mapreduce-200mb", 16, 200.0, log),
        )
    files = corpus_files(corpus_dir, manifest)
    if "serial_lines" not in engines:
        engines.insert(0, "serial_lines")  # the reference of every ratio and checksum
    rows: list[Row] = []
    for engine in engines:
        log(f"{engine}: running")
        rows.append(_logged(run_engine(engine, files, args.reps, timeout=600)))
        Path(args.out).write_text(render(args, manifest, rows, None))
    for _ in range(args.retries):  # rows that shared the machine run again, at the end
        for i, row in enumerate(rows):
            if row.ok and row.other_cores <= RETRY_CORES:
                continue
            log(f"{row.engine}: running again (other load {row.other_cores:.2f} cores)")
            again = _logged(run_engine(row.engine, files, args.reps, timeout=600))
            again.earlier_other = [*row.earlier_other, row.other_cores]
            if again.ok and (not row.ok or again.other_cores < row.other_cores):
                rows[i] = again
            else:
                row.earlier_other.append(again.other_cores)
            Path(args.out).write_text(render(args, manifest, rows, None))
    big: dict[str, Any] | None = None
    if not args.no_big:
        if args.quick:
            big_dir, big_m = (
                cache / "mapreduce-160mb",
                ensure_corpus(cache / "mapreduce-160mb", 160, 160.0, log),
            )
            limit, limit_bytes = "16MB", 16 * 1000**2
        else:
            big_dir, big_m = (
                cache / "mapreduce-2gb",
                ensure_corpus(cache / "mapreduce-2gb", 160, 2000.0, log),
            )
            limit, limit_bytes = BIG_LIMIT, BIG_LIMIT_BYTES
        big_files = corpus_files(big_dir, big_m)
        log(f"paralela_big: {big_m['bytes'] / 1e6:.0f} MB, memory_limit={limit}")
        prow = run_engine("paralela_big", big_files, 0, timeout=1800, extra={"memory_limit": limit})
        log(f"  paralela_big: {sig(prow.best)} s, peak RSS {_mb(prow.peak_rss)} MB")
        big = {
            "manifest": big_m,
            "paralela": prow,
            "serial": None,
            "limit": limit,
            "limit_bytes": limit_bytes,
        }
        if not args.no_big_serial:
            log("serial_lines on the big corpus")
            srow = run_engine("serial_lines", big_files, 0, timeout=1800)
            big["serial"] = srow
            log(f"  serial_lines: {sig(srow.best)} s")
        Path(args.out).write_text(render(args, manifest, rows, big))
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
