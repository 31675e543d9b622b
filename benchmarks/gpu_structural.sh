#!/usr/bin/env bash
# The GPU runs of the structural conversions behind BENCHMARKS.md ("Structural conversions on the H200")
# and benchmarks/scaling/:
#   bash benchmarks/gpu_structural.sh OUT_DIR [compile] [ddp] [jpeg]
# compile: naive ResNet50, synthetic batches: the default fix plus `--compile` (warmup covers the compile);
# ddp:     the same with `--ddp --nproc 2` (per-GPU batch 256): original on one GPU, the converted
#          script on one and on two GPUs, scaling efficiency = img/s on 2 / (2 x img/s on 1);
# jpeg:    8,000 generated 500x375 JPEGs (30 batches of 256 stay inside the first epoch) through ImageFolder: the default fix plus `--dali` (DALI where it is
#          installed, else torchvision's nvjpeg decode on the GPU).
set -uo pipefail  # a run that fails parity (exit 1) must not stop the next one
OUT=${1:?usage: gpu_structural.sh OUT_DIR [compile] [ddp] [jpeg]}
shift
RUNS=${*:-compile ddp jpeg}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
TCAUDIT=(python3 -m tcaudit)
SYNTHETIC=(-- --synthetic --steps 300 --batch-size 256)

for run in $RUNS; do
    case $run in
    compile)
        "${TCAUDIT[@]}" verify fixtures/resnet50/train.py --compile --steps 30 --warmup 15 --out "$OUT/compile" \
            "${SYNTHETIC[@]}" | tee "$OUT/compile.txt" ;;
    ddp)
        "${TCAUDIT[@]}" verify fixtures/resnet50/train.py --ddp --nproc 2 --steps 30 --warmup 10 --out "$OUT/ddp" \
            "${SYNTHETIC[@]}" | tee "$OUT/ddp.txt" ;;
    jpeg)
        JPEGS=${JPEG_DIR:-/tmp/tcaudit-jpegs}
        [ -d "$JPEGS/train" ] || python3 fixtures/resnet50/make_jpegs.py "$JPEGS" --images 8000 --classes 10 --jobs 16
        "${TCAUDIT[@]}" verify fixtures/resnet50/train.py --dali --steps 20 --warmup 10 --out "$OUT/jpeg" \
            -- --data "$JPEGS" --epochs 1 --steps 100 --batch-size 256 --num-classes 10 | tee "$OUT/jpeg.txt" ;;
    *) echo "unknown run: $run" >&2; exit 2 ;;
    esac
done
