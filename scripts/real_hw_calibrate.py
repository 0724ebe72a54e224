#!/usr/bin/env python3
"""The calibration protocol on the real-hardware development set (../shared/real-hw).

    python3 scripts/real_hw_calibrate.py --servesim target/release/servesim [--members 5]
                                         [--only REGEX] [--json OUT] [--work DIR]

For every (model, GPU, tensor-parallel size) with at least two experiments, `servesim calibrate`
fits the hardware-faithful mode (scripts/real_hw.py's HARDWARE settings) to the stages of ONE
experiment (the first by id) and the calibration predicts the group's OTHER experiments, which
it never saw. On those held-out stages it prints three rows — uncalibrated reference mode,
uncalibrated hardware mode, calibrated — of median / mean absolute error on TTFT mean and p99,
TPOT, E2E mean and p99, and the count of falsely saturated stages (predicted TTFT > 10x the
measurement), as run.py defines them.

Then the intervals: each held-out experiment is replayed `--members` times with the trace's
arrival and prompt-order seed varied (run.py's --seed-offset), and every stage's 90 % interval
is the members' 5th-95th percentile widened by the model error in quadrature on a log scale, as
`predict --ensemble --calibration` widens its intervals (servesim-calibrate's
`Calibration::widen`): the calibration's cross-validated error pooled with a prior worth
PRIOR_STAGES stages, Student's t for both. Coverage is the share of held-out stages whose
measurement falls inside, printed twice:

- with servesim's built-in prior (`prior_log_rms`), which was taken from this set's own
  held-out errors, so it is optimistic;
- with the prior each group would have had without its own data: the pooled held-out error of
  the OTHER groups (leave one group out). This is the honest number.

It also prints the pooled held-out log RMS per metric over all groups: the built-in prior.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import real_hw  # noqa: E402  (the runner loader and the hardware-mode settings)

KEYS = [("ttft_mean", "ttft_ms", "mean", "mean_ttft_ms"), ("ttft_p99", "ttft_ms", "p99", "p99_ttft_ms"),
        ("tpot_mean", "tpot_ms", "mean", "mean_tpot_ms"), ("e2e_mean", "e2e_ms", "mean", "mean_e2e_latency_ms"),
        ("e2e_p99", "e2e_ms", "p99", "p99_e2e_latency_ms")]
Z90 = 1.6448536269514722
T90 = [6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753,
       1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697]


# servesim-calibrate's prior_log_rms and PRIOR_STAGES (crates/calibrate/src/file.rs).
PRIOR = {"ttft_mean": 0.075, "ttft_p99": 0.837, "tpot_mean": 0.048, "e2e_mean": 0.048, "e2e_p99": 0.162}
PRIOR_STAGES = 4


def half_width(log_rms, stages, prior):
    """servesim-calibrate's ModelError::half_width: the measured error pooled with the prior
    (worth PRIOR_STAGES stages), Student's t for the stages of both, times the pooled RMS."""
    dof = stages + PRIOR_STAGES
    pooled = math.sqrt((PRIOR_STAGES * prior ** 2 + stages * log_rms ** 2) / dof)
    t = T90[dof - 1] if dof <= 30 else Z90 + (T90[29] - Z90) * 30.0 / dof
    return t * pooled


def rms(xs):
    return math.sqrt(sum(x * x for x in xs) / len(xs)) if xs else 0.0
# The hardware mode's pass settings. Its frontend cost and its pass overhead are what a
# calibration fits (a calibration and a `timing.calibration` key are not given together).
PASSES = [kv for kv in real_hw.HARDWARE if not kv.startswith("engine.tokenization") and ".calibration." not in kv]


def group_of(e):
    return (e["model"], e["gpu"], e["tp"])


def predict(runner, binary, rec, work, tag, extra, seed_offset=0):
    """Per-stage metrics of one run of the experiment (run.py's definitions), or None."""
    trace_dir = os.path.join(work, f"traces-{seed_offset}")
    t0_ms = runner.ensure_trace(rec, seed_offset, trace_dir)
    config = runner.local_config(rec, os.path.join(work, f"cfg-{seed_offset}"), trace_dir)
    out = os.path.join(work, "out", tag)
    cmd = [binary, "predict", "-c", config, "--output-dir", out, "--overwrite", "--capture-per-request",
           "--format", "json", "--threads", "1"] + extra
    p = subprocess.run(cmd, cwd=os.path.dirname(config), capture_output=True, text=True)
    if p.returncode != 0:
        print(f"  {rec['id']} ({tag}): exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    records = [json.loads(line) for line in open(os.path.join(out, "requests.jsonl"))]
    return runner.stage_metrics(records, rec, t0_ms)


def write_measurement_set(runner, rec, e, work):
    """The measurement set of one experiment: its 'ok' stages, windows on the replay's clock."""
    trace_dir = os.path.join(work, "traces-0")
    t0_ms = runner.ensure_trace(rec, 0, trace_dir)
    config = runner.local_config(rec, os.path.join(work, "cfg-0"), trace_dir)
    d = os.path.join(work, "calibrate", rec["config"][:-5])
    os.makedirs(d, exist_ok=True)
    stages = []
    for st_rec, st in zip(rec["stages"], e["stages"]):
        if st["status"] != "ok":
            continue
        measured = {summary: st[field][stat] for _, field, stat, summary in KEYS}
        path = os.path.join(d, f"stage{st['index']}.json")
        json.dump(measured, open(path, "w"))
        lo = (st_rec["start_s"] * 1000.0 - t0_ms) / 1000.0
        stages.append({"name": f"stage {st['index']} ({st_rec['rate_rps']} rps)", "measured": path,
                       "window_s": [lo, lo + st_rec["duration_s"]], "set": PASSES})
    path = os.path.join(d, "measurements.yaml")
    json.dump({"deployment": config, "stages": stages}, open(path, "w"), indent=1)  # JSON is YAML
    return path, len(stages)


def table(rows, title):
    print(f"\n{title}")
    print(f"  {'mode':<26}" + "".join(f"{k:>16}" for k, *_ in KEYS) + f"{'false sat.':>12}")
    for label, errs, sat in rows:
        cells = ""
        for k, *_ in KEYS:
            v = sorted(abs(x) for x in errs[k])
            cells += f"{v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2:>7.1f} / {sum(v) / len(v):>6.1f}" if v else f"{'-':>16}"
        print(f"  {label:<26}{cells}{sat:>12}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servesim", required=True)
    ap.add_argument("--real-hw", default=os.path.join(os.path.dirname(real_hw.ROOT), "shared", "real-hw"))
    ap.add_argument("--only", help="regex over experiment ids")
    ap.add_argument("--members", type=int, default=5, help="seeded replays per held-out experiment (0: no intervals)")
    ap.add_argument("--work", help="scratch directory (default: a temporary one)")
    ap.add_argument("--json", help="write every number to this file")
    a = ap.parse_args()
    runner = real_hw.load_runner(os.path.abspath(a.real_hw))
    binary = os.path.abspath(a.servesim)
    work = os.path.abspath(a.work or tempfile.mkdtemp(prefix="realhw-cal-"))
    index = {r["id"]: r for r in json.load(open(os.path.join(runner.CONFIGS, "index.json")))["experiments"]}
    gt = [e for e in json.load(open(os.path.join(runner.HERE, "ground-truth.json")))["experiments"]
          if e["id"] in index and (not a.only or re.search(a.only, e["id"]))]
    groups = {}
    for e in sorted(gt, key=lambda e: e["id"]):
        groups.setdefault(group_of(e), []).append(e)
    modes = [("reference (uncalibrated)", []), ("hardware (uncalibrated)", real_hw.HARDWARE)]
    errs = {m: {k: [] for k, *_ in KEYS} for m, _ in modes + [("calibrated", None)]}
    sat = {m: 0 for m in errs}
    # Per stage and metric: (group, metric, prediction, members' 5th / 95th percentile,
    # measurement, the calibration's own error and its stages), for the intervals at the end.
    spans = []
    held_log_errors = {}  # group -> metric -> log errors of its calibrated held-out predictions
    out = {"groups": []}
    for key, exps in groups.items():
        if len(exps) < 2:
            continue
        fit_on, held = exps[0], exps[1:]
        mset, n = write_measurement_set(runner, index[fit_on["id"]], fit_on, work)
        if n == 0:
            continue
        cal = os.path.join(work, "calibrate", index[fit_on["id"]]["config"][:-5], "calibration.json")
        p = subprocess.run([binary, "calibrate", mset, "-o", cal, "--overwrite", "--format", "json"],
                           capture_output=True, text=True)
        if p.returncode != 0:
            print(f"{fit_on['id']}: calibrate failed: {p.stderr.strip()}", file=sys.stderr)
            continue
        c = json.load(open(cal))
        sigma = c["model_error"]["log_rms"]
        counts = c["model_error"].get("stages", {})
        print(f"{' '.join(map(str, key))}: fitted on {fit_on['id']} ({n} stages): "
              + ", ".join(f"{k} {v:.3f}" for k, v in c["parameters"].items()), file=sys.stderr)
        g = {"group": list(key), "fitted_on": fit_on["id"], "parameters": c["parameters"], "model_error": sigma,
             "held_out": []}
        calibrated = ["--calibration", cal] + [x for kv in PASSES for x in ("--set", kv)]
        for e in held:
            rec = index[e["id"]]
            preds = {m: predict(runner, binary, rec, work, f"{m[:3]}-{rec['config']}", [x for kv in s for x in ("--set", kv)])
                     for m, s in modes}
            preds["calibrated"] = predict(runner, binary, rec, work, f"cal-{rec['config']}", calibrated)
            members = [predict(runner, binary, rec, work, f"m{k}-{rec['config']}", calibrated, seed_offset=k)
                       for k in range(a.members)]
            for i, st in enumerate(e["stages"]):
                if st["status"] != "ok":
                    continue
                row = {"id": e["id"], "stage": st["index"], "measured": {}, "predicted": {}, "interval": {}}
                for m, pm in preds.items():
                    sm = pm[i] if pm else None
                    pred_ttft = ((sm or {}).get("ttft_ms") or {}).get("mean")
                    if not pred_ttft or pred_ttft > 10 * st["ttft_ms"]["mean"]:
                        sat[m] += 1
                        continue
                    for k, field, stat, _ in KEYS:
                        meas, pred = st[field][stat], sm[field][stat]
                        errs[m][k].append((pred / meas - 1) * 100)
                        if m == "calibrated":
                            held_log_errors.setdefault(key, {}).setdefault(k, []).append(math.log(pred / meas))
                        row["measured"][k] = meas
                        row["predicted"].setdefault(m, {})[k] = pred
                ok = [mm[i] for mm in members if mm and mm[i].get("ttft_ms")]
                if ok and preds["calibrated"]:
                    for k, field, stat, _ in KEYS:
                        vals = sorted(x[field][stat] for x in ok)
                        mid = preds["calibrated"][i][field][stat]
                        lo_n, hi_n = runner.pct(vals, 5), runner.pct(vals, 95)
                        mk = k if k in sigma else k.split("_")[0] + "_mean"
                        if mk in sigma:
                            span = (key, mk, mid, lo_n, hi_n, st[field][stat], sigma[mk], counts.get(mk, 0))
                            spans.append((len(spans), k, span))
                            row["interval"][k] = len(spans) - 1
                g["held_out"].append(row)
        out["groups"].append(g)
    n_stages = len(errs["calibrated"]["ttft_mean"])
    table([(m, errs[m], sat[m]) for m in errs],
          f"Held-out experiments ({n_stages} 'ok' stages predicted by a calibration fitted on another experiment): "
          "median / mean absolute error, %")
    pooled = {k: rms([x for g in held_log_errors.values() for x in g.get(k, [])]) for k, *_ in KEYS}
    print("\npooled held-out log RMS (servesim-calibrate's prior_log_rms): "
          + ", ".join(f"{k} {v:.3f}" for k, v in pooled.items()))
    coverage = {}
    if a.members:
        def interval(span, prior):
            _, mk, mid, lo_n, hi_n, _, sigma_k, n_k = span
            hw = half_width(sigma_k, n_k, prior)
            down = math.sqrt(math.log(mid / min(lo_n, mid)) ** 2 + hw ** 2)
            up = math.sqrt(math.log(max(hi_n, mid) / mid) ** 2 + hw ** 2)
            return mid * math.exp(-down), mid * math.exp(up)

        def others(span):
            mine = span[0]
            return rms([x for g, e in held_log_errors.items() if g != mine for x in e.get(span[1], [])])

        priors = [("built-in prior", lambda sp: PRIOR[sp[1]]), ("prior from the other groups", others)]
        print(f"\n90 % intervals ({a.members} seeded replays widened by the model error): coverage, "
              "median width (high / low)")
        for label, prior_of in priors:
            print(f"  {label}:")
            coverage[label] = {}
            for k, *_ in KEYS:
                rows = [interval(sp, prior_of(sp)) + (sp[5],) for _, kk, sp in spans if kk == k]
                if not rows:
                    continue
                inside = sum(lo <= m <= hi for lo, hi, m in rows)
                widths = sorted(hi / lo for lo, hi, _ in rows)
                coverage[label][k] = [inside, len(rows)]
                print(f"    {k:<10} {inside}/{len(rows)} = {100.0 * inside / len(rows):.0f} %   "
                      f"width x{widths[len(widths) // 2]:.2f}")
        for g in out["groups"]:
            for row in g["held_out"]:
                for k, i in row["interval"].items():
                    sp = spans[i][2]
                    row["interval"][k] = {label: list(interval(sp, prior_of(sp))) for label, prior_of in priors}
    out["pooled_held_out_log_rms"] = pooled
    out["errors"] = errs
    out["falsely_saturated"] = sat
    out["coverage"] = coverage
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
