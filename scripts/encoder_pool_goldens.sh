#!/bin/bash
# Records the goldens of native encoder pools (engine.workers.encoder mode: native) from the
# reference (aisimulate 0.13): tests/deploy/predict_encoder_native_*.expected.json (the prediction
# summary) and .requests.json (per request, in arrival order: arrival, encoder_ready,
# first_admit, first and last token). The host-table case gets its table's absolute path.
# Run from the repository root: scripts/encoder_pool_goldens.sh
set -euo pipefail
py=${AISIM_REF_VENV:-/tmp/servesim-aisim-ref}/bin/python
tmp=$(mktemp -d)
table=$(realpath tests/deploy/host_profile/table.json)
for name in predict_encoder_native_cap1 predict_encoder_native_two predict_encoder_native_slow \
    predict_encoder_native_host_table predict_encoder_native_host_loop predict_encoder_native_disagg \
    predict_encoder_native_replicas; do
    sets=()
    if [ $name = predict_encoder_native_host_table ]; then
        sets=(--set "engine.workers.encoder.host_profile={path: $table, frontend: python}")
    fi
    $py ../shared/parity/aisimulate_predict.py tests/deploy/$name.yaml --per-request $tmp/$name.jsonl "${sets[@]}" \
        > $tmp/$name.json
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d.pop("per_request", None); d.pop("call_wall_ms", None); print(json.dumps(d, indent=1, sort_keys=True))' \
        $tmp/$name.json > tests/deploy/$name.expected.json
    python3 - $tmp/$name.jsonl tests/deploy/$name.requests.json <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows.sort(key=lambda r: (r["arrival_time_ms"], int(r["session_id"].split("_")[1])))
keys = ["arrival_time_ms", "encoder_ready_ms", "first_admit_ms", "first_token_ms", "last_token_ms"]
with open(sys.argv[2], "w") as f:
    json.dump({"columns": keys, "requests": [[r[k] for k in keys] for r in rows]}, f)
    f.write("\n")
PY
done
rm -rf $tmp
