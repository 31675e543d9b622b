#!/usr/bin/env bash
# The GPU verification runs behind BENCHMARKS.md's "Verify" tables.
#   bash benchmarks/gpu_verify.sh OUT_DIR [synthetic] [jpeg]      (default: both)
# Each verify runs 3 interleaved rounds (the default), so the JSON carries the speedup interval; the
# shorter all-in-one run with A/A and attribution is benchmarks/gpu_verify_rounds.sh.
# 1. synthetic ResNet50 (batches on the GPU): naive script vs `tcaudit fix`'s default patch;
# 2. JPEG ImageFolder (16,000 generated 500x375 JPEGs, 62 batches: the timed steps stay inside the
#    first epoch, as they would in an ImageNet epoch): the same pair, so the loader fixes show.
set -uo pipefail  # a run that fails parity (exit 1) must not stop the next one
OUT=${1:?usage: gpu_verify.sh OUT_DIR [synthetic] [jpeg]}
shift
PARTS=" ${*:-synthetic jpeg} "
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
TCAUDIT=(python3 -m tcaudit)

if [[ $PARTS == *" synthetic "* ]]; then
"${TCAUDIT[@]}" verify fixtures/resnet50/train.py --steps 50 --warmup 10 --rounds 3 --out "$OUT/synthetic" \
    -- --synthetic --steps 200 --batch-size 256 | tee "$OUT/synthetic.txt"
fi

[[ $PARTS == *" jpeg "* ]] || exit 0
JPEGS=${JPEG_DIR:-/tmp/tcaudit-jpegs}
[ -d "$JPEGS/train" ] || python3 fixtures/resnet50/make_jpegs.py "$JPEGS" --images 16000 --classes 10
"${TCAUDIT[@]}" verify fixtures/resnet50/train.py --steps 40 --warmup 10 --rounds 3 --out "$OUT/jpeg" \
    -- --data "$JPEGS" --epochs 1 --steps 100 --batch-size 256 --num-classes 10 | tee "$OUT/jpeg.txt"
