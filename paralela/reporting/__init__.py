"""Run reports: one self-contained HTML page (and PNG charts) for any run directory.

``write_report(run_dir)`` finds the run (a map's store, a sweep, a launch, a scaling
measurement, or a directory of several), reads what it recorded, and draws a timeline
per worker, where the time went, the scaling curve and a sweep's leaderboard and plots.
"""

from paralela.reporting._api import REPORT_FILE, RunReport, write_report
from paralela.reporting._find import FoundRun, find_runs

__all__ = ["REPORT_FILE", "FoundRun", "RunReport", "find_runs", "write_report"]
