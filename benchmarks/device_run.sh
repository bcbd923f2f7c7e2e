#!/usr/bin/env bash
# Everything the GPU must confirm, in one device call: cold/warm stage times, the full validation suite,
# the six-task benchmark (validation first), the GPU test suite, the traffic floors of the two-stage and
# a fused design beside fastkda's stages (byte_floor.py), and where a stage-1 program's time goes
# (stage1_phases.py). Logs and JSON go to $OUT.
#
#   FASTKDA_GIT_COMMIT=$(git rev-parse HEAD) bash benchmarks/device_run.sh            # fastkda only
#   FASTKDA_GIT_COMMIT=... WITH_PEERS=1 bash benchmarks/device_run.sh                 # + fla (carry .whl)
#
# The device gets a copy of the working tree without .git, hence the commit passed in. fla travels as a
# wheel in .whl/ (carry it); its first call per shape autotunes for about a minute.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/fastkda-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
peers=--no-peers
[ "${WITH_PEERS:-0}" = 1 ] && peers=
status=0
python3 benchmarks/profile_stages.py --json "$OUT/profile.json" 2>&1 | tee "$OUT/profile.log" | tail -7
python3 -m fastkda.validation --device cuda --size full --calls 2 --json "$OUT/validation.json" --quiet \
    > "$OUT/validation.log" 2>&1 || status=1
tail -3 "$OUT/validation.log"
python3 -m fastkda.bench $peers --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1 || status=1
tail -16 "$OUT/bench.log"
python3 -m pytest -q tests -k "not full_validation" > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
python3 benchmarks/byte_floor.py --json "$OUT/byte_floor.json" 2>&1 | tee "$OUT/byte_floor.log" | tail -8
python3 benchmarks/stage1_phases.py --json "$OUT/stage1_phases.json" 2>&1 | tee "$OUT/stage1_phases.log" | tail -6
exit $status
