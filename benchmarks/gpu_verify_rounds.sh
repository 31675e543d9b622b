#!/usr/bin/env bash
# The GPU runs behind BENCHMARKS.md's "Verify with rounds" table: one call, about 6-8 minutes on an H200.
#   bash benchmarks/gpu_verify_rounds.sh OUT_DIR [fix] [aa] [attribute]      (default: all three)
# All on the naive ResNet50 fixture with synthetic batches on the GPU (batch 256), 30 timed steps
# after 10 warmup steps, each side its own process per round:
#   fix:       naive vs `tcaudit fix`'s default patch, 3 rounds, with --health;
#   aa:        A/A self-check (the naive script on both sides), 3 rounds: the noise band;
#   attribute: leave-one-out attribution, 2 rounds, budget 8 extra runs; the loader rules
#              (TC401-TC404) are left out of the patch since synthetic batches never touch a DataLoader,
#              which leaves four groups (TC301, TC201, TC302, TC303) and so 4 x 2 extra runs.
# Writes OUT_DIR/<part>/verify.json, verify.png, runs/, and OUT_DIR/<part>.txt (the report).
# A part that would start after BUDGET_S seconds (default 420) is skipped and says so.
set -uo pipefail  # a run that exits 1 (parity, health, --fail-under) must not stop the next one
OUT=${1:?usage: gpu_verify_rounds.sh OUT_DIR [fix] [aa] [attribute]}
shift
PARTS=${*:-fix aa attribute}
BUDGET_S=${BUDGET_S:-420}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
# A machine without network: libcst/rich/matplotlib from wheels carried in .whl/ when missing.
if ! python3 -c "import libcst, rich, matplotlib" 2>/dev/null && [ -d .whl ]; then
    python3 -m pip install -q --no-index --find-links .whl libcst rich matplotlib >/dev/null 2>&1 ||
        python3 -m pip install -q --no-index --find-links .whl libcst rich
fi
TCAUDIT=(python3 -m tcaudit)
COMMON=(--steps 30 --warmup 10)
SCRIPT_ARGS=(-- --synthetic --steps 200 --batch-size 256)

for part in $PARTS; do
    if (( SECONDS > BUDGET_S )); then
        echo "skipped $part: ${SECONDS}s elapsed, past BUDGET_S=$BUDGET_S" | tee "$OUT/$part.txt"
        continue
    fi
    start=$SECONDS
    case $part in
    fix)
        "${TCAUDIT[@]}" verify fixtures/resnet50/train.py "${COMMON[@]}" --rounds 3 --health --out "$OUT/fix" \
            "${SCRIPT_ARGS[@]}" 2>&1 | tee "$OUT/fix.txt" ;;
    aa)
        "${TCAUDIT[@]}" verify fixtures/resnet50/train.py "${COMMON[@]}" --rounds 3 --aa --out "$OUT/aa" \
            "${SCRIPT_ARGS[@]}" 2>&1 | tee "$OUT/aa.txt" ;;
    attribute)
        "${TCAUDIT[@]}" verify fixtures/resnet50/train.py "${COMMON[@]}" --rounds 2 --attribute --attribute-budget 8 \
            --ignore TC401,TC402,TC403,TC404 --out "$OUT/attribute" "${SCRIPT_ARGS[@]}" 2>&1 | tee "$OUT/attribute.txt" ;;
    *) echo "unknown part: $part" >&2; exit 2 ;;
    esac
    echo "$part: $((SECONDS - start))s" | tee -a "$OUT/timings.txt"
done
