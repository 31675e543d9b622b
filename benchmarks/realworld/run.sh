#!/usr/bin/env bash
# The real-world benchmark: six training scripts in the shapes of public ones, each measured three
# ways under `tcaudit verify` (the same harness, same seeds, interleaved rounds):
#   fix:      naive vs `tcaudit fix`'s default patch                     (OUT/<name>/fix)
#   compile:  naive vs `tcaudit fix --compile`'s patch                   (OUT/<name>/compile)
#   ceiling:  naive vs the hand-tuned <name>_ceiling.py (verify --patched) (OUT/<name>/ceiling)
#   h2h:      `tcaudit fix --compile`'s patch vs the ceiling, head to head   (OUT/<name>/h2h)
#             (not in the default PARTS: the fraction of the ceiling measured in one verify, on one
#             machine, interleaved; the patch is written to OUT/<name>/h2h/<name>.py first)
# then summarize.py writes OUT/results.json and prints the table.
#
#   bash benchmarks/realworld/run.sh OUT            # GPU settings (H200: ResNet50 b256, GPT-2 124M b8, ...)
#   bash benchmarks/realworld/run.sh OUT --tiny     # tiny models and steps, for a CPU smoke test
#
# Run from the repository root. Environment knobs:
#   BUDGET_S (default 510): a run that would start past the budget, or whose estimated cost does not
#     fit in what is left, is skipped and says so; each verify is also killed at the budget's end (+30s).
#   PARTS (default "fix ceiling compile", in that order: every script's fix first, then every ceiling,
#     then every compile), SCRIPTS (default: all seven), ROUNDS (default 2; --tiny: 1),
#     CEILING_ROUNDS (default 1), STEPS/WARMUP (default 20/5; --tiny: 2/1).
# Resumable: a (script, part) whose verify.json exists in OUT is not run again, so a second call with
# the same OUT finishes what the budget skipped.
set -uo pipefail  # a verify that exits 1 (loss parity) must not stop the others
OUT=${1:?usage: run.sh OUT_DIR [--tiny]}
TINY=0
[ "${2:-}" = "--tiny" ] && TINY=1
HERE=benchmarks/realworld
BUDGET_S=${BUDGET_S:-510}
PARTS=${PARTS:-fix ceiling compile}
SCRIPTS=${SCRIPTS:-imagenet_style gpt_manual_attention word_lm dcgan unet_seg vit_classifier resnet50_fixture}
# Scripts kept elsewhere in the repository; the rest are $HERE/<name>.py. Every ceiling is $HERE/<name>_ceiling.py.
declare -A SOURCE=([resnet50_fixture]=fixtures/resnet50/train.py)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# Kept across calls on the same machine, so that a resumed run compiles from the cache.
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/tcaudit-realworld-inductor}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
if ! "$PY" -c "import libcst, rich, torch, torchvision" 2>/dev/null; then
    echo "run.sh: $PY cannot import libcst, rich, torch and torchvision (PYTHONPATH=$PYTHONPATH)" >&2
    exit 2
fi

if (( TINY )); then
    ROUNDS=${ROUNDS:-1}; STEPS=${STEPS:-2}; WARMUP=${WARMUP:-1}; TIMEOUT=900
    # On a small shared CPU, intra-op threads spinning against each other slow a tiny step 100-fold.
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
    declare -A ARGS=(
        [imagenet_style]="-a resnet18 --dummy -b 4 -j 1 --image-size 32"
        [gpt_manual_attention]="--batch-size 2 --block-size 64 --n-layer 2 --n-head 2 --n-embd 64"
        [word_lm]="--model LSTM --emsize 32 --nhid 32 --batch-size 4 --bptt 8"
        [dcgan]="--ngf 8 --ndf 8 --batch-size 4 --workers 1"
        [unet_seg]="--base 8 --image-size 64 --batch-size 2 --workers 1"
        [vit_classifier]="--batch-size 4 --image-size 32 --patch-size 8 --dim 64 --depth 2 --heads 2"
        [resnet50_fixture]="--synthetic --batch-size 2 --image-size 32 --num-classes 10"
    )
    declare -A COST=([fix]=0 [ceiling]=0 [compile]=0 [h2h]=0)
else
    ROUNDS=${ROUNDS:-2}; STEPS=${STEPS:-20}; WARMUP=${WARMUP:-5}; TIMEOUT=240
    declare -A ARGS=(
        [imagenet_style]="-a resnet50 --dummy -b 256 -j 8"
        [gpt_manual_attention]="--batch-size 8"
        [word_lm]="--model LSTM --emsize 650 --nhid 650 --dropout 0.5 --batch-size 64"
        [dcgan]="--batch-size 128 --workers 4"
        [unet_seg]="--batch-size 16 --image-size 256 --workers 4"
        [vit_classifier]="--batch-size 128"
        [resnet50_fixture]="--synthetic --batch-size 256"
    )
    # The least a verify takes on an H200 (process start-ups dominate; a cold torch.compile adds 30-90s):
    # a run that does not fit is skipped, and one that overruns is killed at the budget (resume later).
    declare -A COST=([fix]=30 [ceiling]=45 [compile]=60 [h2h]=90)
fi
CEILING_ROUNDS=${CEILING_ROUNDS:-1}

{ date -u; "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')"; echo "ROUNDS=$ROUNDS CEILING_ROUNDS=$CEILING_ROUNDS STEPS=$STEPS WARMUP=$WARMUP TINY=$TINY BUDGET_S=$BUDGET_S"; } \
    > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

for part in $PARTS; do
    for name in $SCRIPTS; do
        dir="$OUT/$name/$part"
        if [ -f "$dir/verify.json" ]; then
            echo "$name $part: done before, kept"
            continue
        fi
        left=$((BUDGET_S - SECONDS))
        if (( left < ${COST[$part]} || left <= 0 )); then
            echo "skipped $name $part: ${SECONDS}s elapsed, ${left}s of BUDGET_S=$BUDGET_S left, needs ~${COST[$part]}s" \
                | tee -a "$OUT/skipped.txt"
            continue
        fi
        mkdir -p "$dir"
        read -r -a script_args <<< "${ARGS[$name]} --steps 100000"
        case $part in
        fix)     extra=(--rounds "$ROUNDS") ;;
        compile) extra=(--rounds "$ROUNDS" --compile) ;;
        ceiling) extra=(--rounds "$CEILING_ROUNDS" --patched "$HERE/${name}_ceiling.py") ;;
        h2h)     extra=(--rounds "$ROUNDS" --patched "$HERE/${name}_ceiling.py") ;;
        *) echo "unknown part: $part" >&2; exit 2 ;;
        esac
        start=$SECONDS
        echo "== $name $part (${SECONDS}s elapsed)"
        # timeout signals its whole process group, so the harness processes verify started go too.
        source="${SOURCE[$name]:-$HERE/$name.py}"
        original="$source"
        if [ "$part" = h2h ]; then
            original="$dir/$name.py"
            cp "$source" "$original"
            "$PY" -m tcaudit fix --compile --apply --isolated "$original" > "$dir/fix.txt" 2>&1
        fi
        timeout --kill-after=10 $((left + 30)) "$PY" -m tcaudit verify "$original" --steps "$STEPS" \
            --warmup "$WARMUP" --timeout "$TIMEOUT" "${extra[@]}" --out "$dir" -- "${script_args[@]}" \
            > "$dir/report.txt" 2>&1
        rc=$?
        tail -n 25 "$dir/report.txt"
        echo "$name $part: exit $rc, $((SECONDS - start))s" | tee -a "$OUT/timings.txt"
    done
done
"$PY" "$HERE/summarize.py" "$OUT" --output "$OUT/results.json"
echo "total ${SECONDS}s"
