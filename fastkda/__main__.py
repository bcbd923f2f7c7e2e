"""``python -m fastkda``: the main job -- fastkda.fwd on one default problem, validated, then timed.

On a GPU: H = 64 heads, one sequence of 8,192 tokens, D = 128 (a standard benchmark task). On a CPU: a
small problem through the chunked torch reference (the API's CPU path), labelled as such. The problem is
first checked against the float64 ground truth on fresh random inputs (fastkda.validation.quick_check);
only then is it timed. For the full comparison with peers run ``python -m fastkda.bench``.
"""

from __future__ import annotations

import sys

import torch

from .bench import default_device, run_benchmark
from .bench.impls import fastkda_impl
from .bench.report import MAIN, format_table
from .bench.tasks import select_tasks

DEFAULT_TASK = {"cuda": "H64_fixed_8192", "cpu": "H4_fixed_512"}


def main() -> int:
    device = torch.device(default_device())
    task = select_tasks([DEFAULT_TASK["cuda" if device.type == "cuda" else "cpu"]])
    result = run_benchmark(task, [fastkda_impl()], device=device, suite_name="main")
    print(format_table(result))
    return 0 if all(tr.results[MAIN].status == "ok" for tr in result.tasks) else 1


if __name__ == "__main__":
    sys.exit(main())
