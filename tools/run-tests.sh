#!/usr/bin/env bash
# Run the test suite with every component it needs: Debian's chromium (for the HTML
# report tests) and headless Java runtime (for the Spark tests, which start a real Spark
# standalone master and worker from pyspark's own scripts) are installed, and the real
# local Slurm cluster is started first (tools/local-slurm.sh; as root, which CI is), and
# the cluster is stopped afterwards. Without root (a laptop) those tests are skipped with
# the reason; as root they are required (PARALELA_REQUIRE_SLURM=1,
# PARALELA_REQUIRE_CHROMIUM=1, PARALELA_REQUIRE_SPARK=1): a component that does not come
# up fails them instead of skipping them.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}

started=0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    # A real headless browser checks the HTML reports (Debian's chromium).
    if ! command -v chromium >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends chromium >/dev/null || { echo "run-tests: cannot install chromium" >&2; exit 1; }
    fi
    export PARALELA_REQUIRE_CHROMIUM=1
    # Java for Spark (pyspark 4 needs 17 or newer): Debian 12's OpenJDK 17, else the
    # release's default JRE (21 on Debian 13).
    if ! command -v java >/dev/null; then
        jre=openjdk-17-jre-headless
        apt-cache show "$jre" >/dev/null 2>&1 || { apt-get update -qq; apt-cache show "$jre" >/dev/null 2>&1; } \
            || jre=default-jre-headless
        mkdir -p /usr/share/man/man1  # slim images lack it, and the JRE's set-up links a page there
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$jre" >/dev/null \
            || { echo "run-tests: cannot install $jre (Java for the Spark tests)" >&2; exit 1; }
    fi
    export PARALELA_REQUIRE_SPARK=1
    if bash tools/local-slurm.sh start; then
        started=1
        export PARALELA_REQUIRE_SLURM=1
    else
        echo "run-tests: the local Slurm cluster did not start; see /tmp/local-slurm/log" >&2
        exit 1
    fi
else
    echo "run-tests: not root: the Slurm tests will be skipped (CI runs them)" >&2
fi

"$PYTHON" -m pytest "$@"
status=$?
if [ "$started" = 1 ]; then
    bash tools/local-slurm.sh stop >/dev/null 2>&1 || echo "run-tests: stopping Slurm failed" >&2
fi
exit $status
