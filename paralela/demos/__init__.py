"""Demos behind ``paralela demo``: each one a function that runs a small, real workload
and returns what it measured; the command line only prints it."""

from paralela.demos._compare_demo import CompareDemoResult, run_compare_demo
from paralela.demos._ddp_demo import DdpDemoResult, run_ddp_demo
from paralela.demos._map_demo import DEFAULT_ITEMS, MapDemoResult, extract_features, run_map_demo
from paralela.demos._predict_demo import PredictDemoResult, run_predict_demo
from paralela.demos._serve_demo import ServeDemoResult, run_serve_demo
from paralela.demos._sweep_demo import SweepDemoResult, run_sweep_demo

__all__ = [
    "CompareDemoResult",
    "DEFAULT_ITEMS",
    "DdpDemoResult",
    "MapDemoResult",
    "PredictDemoResult",
    "ServeDemoResult",
    "SweepDemoResult",
    "extract_features",
    "run_compare_demo",
    "run_ddp_demo",
    "run_map_demo",
    "run_predict_demo",
    "run_serve_demo",
    "run_sweep_demo",
]
