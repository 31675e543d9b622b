#!/usr/bin/env bash
# The H200 run behind BENCHMARKS.md ("Input pipelines on the H200"): ResNet50 training on 24,000
# generated JPEGs (in $JPEG_DIR, default /tmp/tcaudit-input-jpegs) with each input pipeline of `fix --dali`, and synthetic data as the model's bound.
#   bash benchmarks/input/run.sh [OUT] [extra bench.py options]
# OUT defaults to $OUT (the device machine's output folder). DALI is used where `import nvidia.dali`
# works (e.g. wheels unpacked into /tmp/site and that folder on PYTHONPATH); without it the dali row
# records the error and the rest still run. Writes OUT/results.json and one log per pipeline.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
DEST=${1:-${OUT:?usage: run.sh OUT_DIR [bench.py options]}}
[ $# -gt 0 ] && shift
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
"$PY" -c "import sys, torch, torchvision; print(sys.version.split()[0], torch.__version__, torchvision.__version__, torch.cuda.is_available())"
"$PY" -c "import nvidia.dali as d; print('DALI', d.__version__)" 2>/dev/null || echo "DALI not importable: the dali row will say why"
exec "$PY" "$HERE/bench.py" all --out "$DEST" --data "${JPEG_DIR:-/tmp/tcaudit-input-jpegs}" "$@"
