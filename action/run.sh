#!/usr/bin/env bash
# The steps of action.yml (the repository's GitHub Action), runnable outside GitHub (tests/test_action.py):
#   run.sh scan     scan INPUT_PATHS with INPUT_ARGS: SARIF to INPUT_SARIF_FILE, annotations (`--format
#                   github`) to the log; outputs sarif-file, findings and exit-code (0 clean, 1 findings,
#                   2 error) to $GITHUB_OUTPUT. Fails only on an error (a usage error, a bug).
#   run.sh verdict  exit 1 when SCAN_EXIT says the scan reported findings (fail-on-findings).
set -uo pipefail

step="${1:-scan}"
output="${GITHUB_OUTPUT:-/dev/null}"
tcaudit="${TCAUDIT:-tcaudit}"

if [ "$step" = verdict ]; then
  if [ "${SCAN_EXIT:-}" = 1 ]; then
    echo "tcaudit: findings at or above the fail-on severity (fail-on-findings: true)" >&2
    exit 1
  fi
  exit 0
fi

sarif="${INPUT_SARIF_FILE:-tcaudit.sarif}"

# Split an input as a shell would (POSIX quoting: --config "fail-on = 'error'", a path with spaces in
# quotes), without running it through a shell; into the array split_result (no namerefs: macOS runners'
# bash 3.2 has none). Unbalanced quotes: exit 2.
split_words() {
  local words status
  words=$(mktemp)
  python3 -c '
import shlex, sys
try:
    words = shlex.split(sys.argv[1])
except ValueError as exc:
    sys.exit(f"tcaudit: error: the action input {sys.argv[2]} cannot be split into arguments: {exc}")
sys.stdout.write("".join(word + "\0" for word in words))' "$1" "$2" > "$words"
  status=$?
  if [ "$status" -ne 0 ]; then
    rm -f "$words"
    echo "exit-code=2" >> "$output"
    exit 2
  fi
  split_result=()
  while IFS= read -r -d '' word; do split_result+=("$word"); done < "$words"
  rm -f "$words"
}
split_words "${INPUT_PATHS:-.}" paths
paths=(${split_result[@]+"${split_result[@]}"})
split_words "${INPUT_ARGS:-}" args
extra=(${split_result[@]+"${split_result[@]}"})
[ "${#paths[@]}" -gt 0 ] || paths=(.)

"$tcaudit" scan --no-exec --format sarif --output-file "$sarif" --exit-zero "${extra[@]}" "${paths[@]}"
status=$?
if [ "$status" -ne 0 ]; then
  echo "exit-code=$status" >> "$output"
  echo "tcaudit: the scan failed (exit $status)" >&2
  exit "$status"
fi
echo "sarif-file=$sarif" >> "$output"
# The same findings as workflow annotations on the pull request (answered from the scan's cache).
"$tcaudit" scan --no-exec --format github "${extra[@]}" "${paths[@]}"
status=$?
findings=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["runs"][0]["results"]))' "$sarif")
echo "findings=$findings" >> "$output"
echo "exit-code=$status" >> "$output"
if [ "$status" -ge 2 ]; then
  exit "$status"
fi
exit 0
