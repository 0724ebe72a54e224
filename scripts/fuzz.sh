#!/usr/bin/env bash
# Fuzzes the input readers (every trace format, Weka as .json and .jsonl, plain, gzip, zstd and
# truncated compressed files, several Mooncake files or Dynamo shards; the engine and router
# configuration readers) with proptest: each target runs PROPTEST_CASES generated inputs
# (default 10000 here; the ordinary `cargo test` run uses 64). A crash or a broken property fails with the shrunk input.
#
#   scripts/fuzz.sh                  # 10000 cases per target
#   PROPTEST_CASES=200000 scripts/fuzz.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PROPTEST_CASES="${PROPTEST_CASES:-10000}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "fuzz: ${PROPTEST_CASES} cases per target"
start=$(date +%s)
cargo test --release -p servesim-replay --test fuzz -- --test-threads 1 --nocapture >"$log" 2>&1
status=$?
grep -E '^test |fuzz counts|test result|panicked|minimal failing input|Test failed|^error' "$log"
echo "fuzz: finished in $(( $(date +%s) - start )) s, exit ${status}"
exit "${status}"
