#!/usr/bin/env bash
# Fuzzes the input readers (every trace format, Weka as .json and .jsonl, plain, gzip, zstd and
# truncated compressed files, several Mooncake files or Dynamo shards; the engine and router
# configuration readers; the deployment YAML reader; recommend's shard and cache records) with proptest: each target runs PROPTEST_CASES generated inputs
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
status=0
cargo test --release -p servesim-workload --test fuzz -- --test-threads 1 --nocapture >"$log" 2>&1 || status=$?
# The deployment YAML reader, and the shard and cache records recommend reads back.
cargo test --release -p servesim-deploy --test fuzz_yaml --test fuzz_records -- --test-threads 1 --nocapture \
    >>"$log" 2>&1 || status=$?
# Every target reports its running counts after each case: show the last report of each.
grep -oE 'fuzz counts[^:]*: .*' "$log" | awk -F': ' '{ last[$1] = $0 } END { for (k in last) print last[k] }' | sort
grep -E 'test result|panicked|minimal failing input|Test failed|^error' "$log"
echo "fuzz: finished in $(( $(date +%s) - start )) s, exit ${status}"
exit "${status}"
