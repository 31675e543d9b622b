#!/usr/bin/env bash
# The GPU runs behind BENCHMARKS.md's "Frameworks that own the loop" table (issue 47): one call.
#   [NAMES="hf_gpt2 lightning_mlp"] bash benchmarks/gpu_frameworks.sh OUT_DIR
# For each of benchmarks/frameworks/hf_gpt2.py (a Hugging Face Trainer, GPT-2 small from its config, batch
# 8 x 512 synthetic tokens) and lightning_mlp.py (a Lightning Trainer, 6 MLP blocks 1024-4096-1024, batch 512):
#   fix:  the script against `tcaudit fix`'s default patch;
#   hand: the script against its hand-tuned copy (`--patched benchmarks/frameworks/*_tuned.py`);
# each 2 interleaved rounds of 20 timed steps after 5 warm-up steps, each side its own process per round.
# Writes OUT_DIR/<script>-<part>/verify.json and OUT_DIR/<script>-<part>.txt (the report).
set -uo pipefail
OUT=${1:?usage: gpu_frameworks.sh OUT_DIR}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# The carried tcaudit first; libcst from a wheel carried beside it when the machine lacks it.
HERE=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH=$HERE${PYTHONPATH:+:$PYTHONPATH}
if ! python3 -c "import libcst" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site "$HERE"/.whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
mkdir -p "$OUT"
for name in ${NAMES:-hf_gpt2 lightning_mlp}; do
    script=$HERE/benchmarks/frameworks/$name.py
    for part in fix hand; do
        extra=()
        [ "$part" = hand ] && extra=(--patched "$HERE/benchmarks/frameworks/${name}_tuned.py")
        start=$SECONDS
        (cd "$OUT" && python3 -m tcaudit verify "$script" --steps 20 --warmup 5 --rounds 2 --isolated \
            --out "$OUT/$name-$part" "${extra[@]}" 2>&1) | tee "$OUT/$name-$part.txt"
        echo "$name $part: $((SECONDS - start))s" | tee -a "$OUT/timings.txt"
    done
done
