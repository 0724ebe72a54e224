#!/bin/bash
# Records how the reference (aisimulate 0.13) names and ends requests in its per-request records
# (predict -c --capture-per-request): tests/deploy/request_records.golden.json, one list of rows
# per case, each row [session_id, turn_index, terminal_status, terminal_time_ms,
# decode_worker_idx, source_released_ms, the pools of its admissions, readmission_count], sorted
# by its first two (agentic rows start with
# agentic.request_id instead and end with the top-level request_id, the trace's). The cases: a
# synthetic source (each request a one-turn session_N); a trace (request_N) cut by
# max_virtual_time_seconds while a request is in flight (the reference does not list it); a
# disaggregated run whose decode worker refuses requests (failed); SGLang disaggregated (its
# requests are placed on decode first, admitted on prefill first); an agentic profile whose
# deadline cancels what is in flight.
# Run from the repository root: scripts/request_record_goldens.sh
set -euo pipefail
py=${AISIM_REF_VENV:-/tmp/servesim-aisim-ref}/bin/python
tmp=$(mktemp -d)
record() {
    local case=$1 name=$2
    shift 2
    $py ../shared/parity/aisimulate_predict.py tests/deploy/$name.yaml --per-request $tmp/$case.jsonl "$@" > /dev/null
}
record synthetic predict_agg_vllm_fixed --set traffic.stop.requests=5
record trace_cut predict_sglang_retract --set traffic.stop.max_virtual_time_seconds=0.405
record failed_handoff predict_state_cache_disagg_pressure
record sglang_disagg predict_sglang_disagg_held_prefix
record agentic_canceled predict_agentic_profile
python3 - $tmp > tests/deploy/request_records.golden.json <<'PY'
import json, os, sys
out = {}
for case in ["synthetic", "trace_cut", "failed_handoff", "sglang_disagg", "agentic_canceled"]:
    rows = []
    for line in open(os.path.join(sys.argv[1], case + ".jsonl")):
        r = json.loads(line)
        first = r["agentic"]["request_id"] if "agentic" in r else r["session_id"]
        row = [first, r["turn_index"], r["terminal_status"], r["terminal_time_ms"], r["decode_worker_idx"],
               r["source_released_ms"], [a["pool"] for a in r["admission_history"]], r["readmission_count"]]
        rows.append(row + [r["request_id"]] if "agentic" in r else row)
    rows.sort(key=lambda row: (row[0], -1 if row[1] is None else row[1]))
    out[case] = rows
# One row a line.
cases = [json.dumps(c) + ": [\n" + ",\n".join("  " + json.dumps(r) for r in rows) + "\n ]" for c, rows in out.items()]
print("{\n " + ",\n ".join(cases) + "\n}")
PY
rm -rf $tmp
