#!/usr/bin/env python3
"""Signed median error of the TTFT percentiles, TPOT p99 and E2E p99 over a real-hardware run's
'ok' stages that servesim does not saturate (predicted TTFT ≤ 10× measured): the numbers of the
tail table in docs/accuracy.md.

    python3 scripts/real_hw.py --servesim B --mode hardware --json /tmp/rh.json
    python3 scripts/real_hw_tails.py /tmp/rh.json
"""
import json
import statistics
import sys

KEYS = ["ttft_p50", "ttft_p90", "ttft_p99", "tpot_p99", "e2e_p99"]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    rows = [r for r in json.load(open(sys.argv[1]))["rows"]
            if r["status"] == "ok" and r.get("pred") and r["pred"].get("ttft_mean")
            and r["pred"]["ttft_mean"] <= 10 * r["meas"]["ttft_mean"]]
    ttft_mean = [abs(r["pred"]["ttft_mean"] / r["meas"]["ttft_mean"] - 1) * 100 for r in rows]
    print(f"TTFT mean: median abs {statistics.median(ttft_mean):.1f} % ({len(rows)} stages)")
    for k in KEYS:
        e = [(r["pred"][k] / r["meas"][k] - 1) * 100 for r in rows if r["pred"].get(k) and r["meas"].get(k)]
        if e:
            print(f"{k:9} {len(e):3} stages: signed median {statistics.median(e):+6.1f} %, "
                  f"median abs {statistics.median(map(abs, e)):5.1f} %, {sum(x < 0 for x in e)} below")


if __name__ == "__main__":
    main()
