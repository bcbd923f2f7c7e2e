"""The main job, ``python -m fastkda``: validated, then timed, on the best device (here: the CPU path)."""

import subprocess
import sys


def test_main_job_validates_then_times():
    run = subprocess.run([sys.executable, "-m", "fastkda"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "validating... timing..." in run.stderr
    assert "| geomean" in run.stdout
