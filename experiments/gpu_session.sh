#!/bin/sh
# One call of the lent GPU (the `device` tool): measure its operators and training steps with the
# project's own `learnedperf measure`, each part within a time budget, into $OUT/gpu (a data set with
# its manifest; ops_cuda.parquet, steps_cuda.parquet). The device tool allows 10 minutes a command and
# 15 minutes of device time a session, starts included, so both parts run in this one command and
# stop starting cases on their budgets (OPS_S, STEPS_S) instead of being killed with nothing written.
#
# Here, once per session (the machine has no package index; pydantic is the one missing dependency):
#   echo /.whl/ >> .git/info/exclude
#   python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .whl pydantic==2.13.4 pydantic-core==2.46.4 \
#     annotated-types==0.7.0 typing-inspection==0.4.2 typing-extensions==4.16.0
# then the device tool's run, with carry [".whl"] and timeout_s 600:
#   sh experiments/gpu_session.sh
# Back here: copy $OUT/gpu's files into datasets/measured/<host>/ (a new host name, e.g. lent-h100),
# check the manifest (`python -c "from learnedperf.measure.records import verify_manifest as v; v('DIR')"`)
# and retrain. The records describe the GPU by its catalog data sheet (see `learnedperf measure`).
set -u
OPS_S=${OPS_S:-220}
STEPS_S=${STEPS_S:-280}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "gpu_session: the carried wheels (.whl) did not install" >&2; exit 1; }
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
mkdir -p "$OUT/gpu"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv \
  > "$OUT/nvidia-smi.csv" 2>&1
python3 -m learnedperf.cli measure --device cuda --parts ops --out "$OUT/gpu" \
  --time-budget-s "$OPS_S" --no-progress > "$OUT/ops.log" 2>&1
echo "ops: exit $?"; tail -n 5 "$OUT/ops.log"
python3 -m learnedperf.cli measure --device cuda --parts steps --out "$OUT/gpu" \
  --time-budget-s "$STEPS_S" --no-progress > "$OUT/steps.log" 2>&1
echo "steps: exit $?"; tail -n 5 "$OUT/steps.log"
ls -l "$OUT/gpu"
