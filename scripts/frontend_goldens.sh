#!/bin/bash
# Records the goldens of SGLang's frontend stages from the reference (aisimulate 0.13):
# tests/deploy/predict_frontend_{fixed,sglang,disagg}.expected.json (the prediction summary) and
# .requests.json (per request, in release order: arrival, frontend_ready, first and last token).
# Run from the repository root: scripts/frontend_goldens.sh
set -euo pipefail
py=${AISIM_REF_VENV:-/tmp/servesim-aisim-ref}/bin/python
tmp=$(mktemp -d)
for name in predict_frontend_fixed predict_frontend_sglang predict_frontend_disagg; do
    $py ../shared/parity/aisimulate_predict.py tests/deploy/$name.yaml --per-request $tmp/$name.jsonl \
        > $tmp/$name.json
    # The summary without its per-request copy (the .requests.json keeps what the test reads).
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d.pop("per_request", None); print(json.dumps(d, indent=1, sort_keys=True))' \
        $tmp/$name.json > tests/deploy/$name.expected.json
    python3 - $tmp/$name.jsonl tests/deploy/$name.requests.json <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows.sort(key=lambda r: (r["arrival_time_ms"], int(r["session_id"].split("_")[1])))
keys = ["arrival_time_ms", "frontend_ready_ms", "first_token_ms", "last_token_ms"]
with open(sys.argv[2], "w") as f:
    json.dump({"columns": keys, "requests": [[r[k] for k in keys] for r in rows]}, f)
    f.write("\n")
PY
done
rm -rf $tmp
