#!/usr/bin/env python3
"""The model support matrix: every model the reference marks PASS, through servesim and aisimulate.

  scripts/model_matrix.py --quick --jobs 2         # one cell per model; markdown on stdout
  scripts/model_matrix.py --models Qwen3-8B         # every PASS cell of the models matching
  scripts/model_matrix.py --systems h200_sxm,b200_sxm --backends vllm,sglang
  scripts/model_matrix.py --quick --json /tmp/matrix.json   # also every cell, as JSON
  scripts/model_matrix.py --quick --no-reference    # reference results from the cache only

Cells. The reference's support matrices ($SERVESIM_AIS_SYSTEMS/support_matrix/*.csv, default the
systems directory of the aisimulate 0.13 venv, --ref-venv) list per model, system, backend,
version and mode a status. A *cell* is a (model, system, backend, version) row with Mode `agg`
and Status `PASS`; its family is the row's Architecture. --models / --systems / --backends keep
the cells whose model contains one of the comma-separated substrings / whose system or backend
is listed. --quick keeps one cell per model: the first system of h200_sxm, b200_sxm, then the
others by name; on it the first backend of vllm, sglang, trtllm; on that the data package's
`current` version (systems/query_versions.yaml) when the matrix lists it, else the newest listed
(the matrix passes versions the installed data no longer answers for, e.g. SGLang 0.5.16).

Config. Each cell is one unified-YAML `predict -c` config both tools read: aggregated, one
replica, AIS timing (`timing.type: default`), the cell's hardware / backend / backend_version, a
fixed synthetic load (16 requests of 1024 input and 128 output tokens, concurrency 4), and no
`kv_cache:` section, so each tool sizes the KV cache from GPU memory. Layout: tensor-parallel
size 1, 2, 4, 8 in turn, the first for which the reference's predict runs: a run that fails
because the memory model leaves no KV budget or the model does not split into that size
(`no KV budget`, `divisible`, ...) moves to the next size, then to 16 (two nodes of 8). When no size of
the cell's system runs in the reference (or it fails for another reason, e.g. missing data), the model's
other PASS cells (other systems such as b200_sxm / b300_sxm / gb200, other backends) are tried the same way
in --quick's order (`candidates`), and the first the reference runs is the cell compared; a cell is `both
fail` only when no candidate runs (`layouts_tried` in --json lists them).
MoE models (the model's config.json in the reference's model_configs names experts) run TEP at
that size, attention tensor-parallel with experts spread (`moe_expert` = tensor, `moe_tensor` 1):
the reference has no single default MoE layout for predict (it refuses an unset one), TEP is one
of the shapes its recommend enumerates for every backend, and at size 1 it is the identity.

Run. The reference: `aisimulate predict -c CFG --output-dir TMP --overwrite --detail memory`
under --ref-venv (the same run as ../shared/parity/aisimulate_predict.py makes, called directly
because `--detail memory` reports the KV blocks the memory model sized:
`details.sections.memory.roles.aggregated.estimated_num_gpu_blocks` × its block size). Its
results are cached in --cache-dir (default ~/.cache/servesim-model-matrix) keyed by the sha256
of the command and config, so a re-run only runs servesim. servesim (--binary): `predict -c CFG
--output-dir TMP --overwrite --format json --threads 1`, TMP/prediction.json; its KV capacity
comes from a second run with `--set traffic.source.input_tokens=1000000000 --set
engine.context_length=2000000000`, which it refuses naming the cache it sized (`... cannot fit
the workers' KV cache (N blocks of B tokens)`). Both run with $SERVESIM_AIS_SYSTEMS and
$AISIM_REF_VENV set to the venv's unless already set.

Classification. `match`: mean TTFT, mean ITL (mean TPOT where ITL is absent) and KV tokens per
rank within --tolerance (relative, default 0.001 = 0.1 %); `differs`: one is not (the worst
metric and its deviation are shown); `servesim refuses`: servesim exits non-zero and the
reference runs (its message without paths, the `engine.workers.<role>.timing:` prefix and the
list of what is supported: the reasons the issue asks for; --json keeps it whole); `reference fails`:
the reference fails and servesim runs; `both fail`; `unchecked`: --no-reference and no cached
result. Output: one markdown table per architecture family (model, system, backend, version,
layout, status, worst deviation or reason), then totals of cells and of models by status (a model
counts under every status one of its cells has). Sorted, no timings: the same inputs print the
same bytes. --json OUT writes every cell (config, both outcomes, deviations).

Exit status: 0 when no cell differs and no cell servesim runs fails in the reference, 1 otherwise
(refusals are reported, not failures); 2 on bad arguments.
"""
import argparse
import concurrent.futures
import csv
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REF_VENV = "/tmp/servesim-aisim-ref"
SYSTEM_ORDER = ("h200_sxm", "b200_sxm")
BACKEND_ORDER = ("vllm", "sglang", "trtllm")
TPS = (1, 2, 4, 8)
# Sizes past one node of 8, tried when every size of TPS fails in the reference (`candidates`).
EXTRA_TPS = (16,)
LOAD = {"requests": 16, "input_tokens": 1024, "output_tokens": 128, "concurrency": 4}
KV_PROBE = ("--set", "traffic.source.input_tokens=1000000000", "--set", "engine.context_length=2000000000")
# A reference failure that means "this layout is too small or does not split the model": try a larger one.
LAYOUT_RETRY = re.compile(r"no KV budget|out of memory|divisible|cannot hold|KV cache holds|exceeds the KV", re.I)
EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
STATUSES = ("match", "differs", "servesim refuses", "reference fails", "both fail", "unchecked")


# ---------------------------------------------------------------------------------------------
# Cells


def version_key(version):
    """Order versions numerically where they are numbers: 0.5.9 < 0.5.14 < 1.0.0rc1 < 1.0.0."""
    parts = re.findall(r"\d+|[A-Za-z]+", version)
    # A release sorts after its pre-releases: pad with a marker above any letter.
    return [(0, int(p), "") if p.isdigit() else (-1, 0, p) for p in parts] + [(0, -1, "")]


def read_cells(rows):
    """The agg PASS cells of support-matrix rows (dicts with the CSV's columns), deduplicated, sorted."""
    cells = set()
    for r in rows:
        if r.get("Mode") == "agg" and r.get("Status") == "PASS":
            cells.add((r["Architecture"], r["HuggingFaceID"], r["System"], r["Backend"], r["Version"]))
    return [dict(family=a, model=m, system=s, backend=b, version=v)
            for a, m, s, b, v in sorted(cells, key=lambda c: (c[0], c[1], c[2], c[3], version_key(c[4])))]


def load_rows(systems_dir):
    rows = []
    for path in sorted(glob.glob(os.path.join(systems_dir, "support_matrix", "*.csv"))):
        with open(path, newline="") as f:
            rows.extend(csv.DictReader(f))
    return rows


def _rank(value, order):
    return (order.index(value), "") if value in order else (len(order), value)


def current_versions(systems_dir):
    """{(system, backend): version} of the data package's `current` slots (query_versions.yaml)."""
    try:
        import yaml
        with open(os.path.join(systems_dir, "query_versions.yaml")) as f:
            doc = yaml.safe_load(f) or {}
    except (ImportError, OSError, ValueError):
        return {}
    defaults = {b: (v or {}).get("current") for b, v in (doc.get("defaults") or {}).items()}
    out = {}
    for system in os.listdir(os.path.join(systems_dir, "data")) if os.path.isdir(
            os.path.join(systems_dir, "data")) else []:
        for backend, version in defaults.items():
            out[(system, backend)] = version
    for system, backends in (doc.get("overrides") or {}).items():
        for backend, v in (backends or {}).items():
            out[(system, backend)] = (v or {}).get("current")
    return {k: str(v) for k, v in out.items() if v}


def quick_pick(cells, current=None):
    """One cell per model: preferred system, then backend, then the data package's current version, else the
    newest listed."""
    current = current or {}

    def key(c):
        return (_rank(c["system"], SYSTEM_ORDER), _rank(c["backend"], BACKEND_ORDER),
                current.get((c["system"], c["backend"])) != c["version"])

    def better(c, cur):
        nk, ck = key(c), key(cur)
        return nk < ck or (nk == ck and version_key(c["version"]) > version_key(cur["version"]))
    best = {}
    for c in cells:
        if c["model"] not in best or better(c, best[c["model"]]):
            best[c["model"]] = c
    return [best[m] for m in sorted(best, key=lambda m: (best[m]["family"], m))]


def quick_order(cells, current=None):
    """Cells in --quick's preference order (system, backend, current version, then newest version), one per
    (system, backend): the candidates a cell moves on to (`candidates`)."""
    current = current or {}
    out = []
    for c in cells:
        same = [o for o in out if (o["system"], o["backend"]) == (c["system"], c["backend"])]
        if not same:
            out.append(c)
        elif quick_pick([same[0], c], current)[0] is c:
            out[out.index(same[0])] = c
    return sorted(out, key=lambda c: (_rank(c["system"], SYSTEM_ORDER), _rank(c["backend"], BACKEND_ORDER)))


def select(cells, models=None, systems=None, backends=None, quick=False, current=None):
    def listed(value, names):
        return not names or value in names
    out = [c for c in cells
           if (not models or any(s.lower() in c["model"].lower() for s in models))
           and listed(c["system"], systems) and listed(c["backend"], backends)]
    return quick_pick(out, current) if quick else out


# ---------------------------------------------------------------------------------------------
# Configs


def is_moe(model_config):
    """Does a Hugging Face config.json (nested text_config included) name more than one expert?"""
    if not isinstance(model_config, dict):
        return False
    for k, v in model_config.items():
        if k in EXPERT_KEYS and isinstance(v, int) and v > 1:
            return True
        if isinstance(v, dict) and is_moe(v):
            return True
    return False


def model_is_moe(systems_dir, model):
    path = os.path.join(os.path.dirname(systems_dir), "model_configs", model.replace("/", "--") + "_config.json")
    try:
        with open(path) as f:
            return is_moe(json.load(f))
    except (OSError, ValueError):
        return False


def layout(tp, moe):
    return {"tensor": tp, "moe_tensor": 1, "moe_expert": tp} if moe else {"tensor": tp}


def candidates(cell, moe, others=()):
    """The (cell, layout) pairs a matrix cell tries, in order, until one runs in the reference: the cell's own
    system at each size of TPS, then TEP/TP 16 (two nodes of 8); then each other PASS cell of the same model
    (`others`: other systems such as b200_sxm / b300_sxm / gb200, or backends) in the --quick preference order,
    the same sizes on each. A generator, so a run stops asking at the first that runs (`Runner.cell` also
    moves on from a size whose failure is not a layout one: the next system may have the data)."""
    for c in (cell, *[o for o in others if cell_row(o) != cell_row(cell)]):
        for tp in TPS + EXTRA_TPS:
            yield c, layout(tp, moe)


def layout_label(par):
    return f"TEP{par['tensor']}" if "moe_expert" in par else f"TP{par['tensor']}"


def make_config(cell, par):
    return {
        "traffic": {
            "source": {"type": "synthetic", "input_tokens": LOAD["input_tokens"],
                       "output_tokens": LOAD["output_tokens"]},
            "load": {"type": "concurrency", "concurrency": LOAD["concurrency"]},
            "stop": {"requests": LOAD["requests"]},
        },
        "engine": {
            "mode": "aggregated", "model": cell["model"], "hardware": cell["system"],
            "backend": cell["backend"], "backend_version": cell["version"],
            "workers": {"aggregated": {"timing": {"type": "default"}, "parallelism": dict(par)}},
        },
    }


def dump_yaml(cfg):
    # JSON is YAML; both tools read it. Sorted keys keep the cache key stable.
    return json.dumps(cfg, indent=1, sort_keys=True) + "\n"


# ---------------------------------------------------------------------------------------------
# Runs


def error_of(text):
    """The gist of a tool's failure output: its last error line, without the run's paths."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    pick = next((ln for ln in reversed(lines) if re.match(r"(error|aisimulate predict failed)", ln, re.I)),
                lines[-1] if lines else "(no output)")
    pick = re.sub(r"^(error|aisimulate predict failed):\s*", "", pick, flags=re.I)
    pick = re.sub(r"^\S+\.(ya?ml|json):\s*", "", pick)           # the config file
    pick = re.sub(r"(^|\s)/\S+\.json:\s*", r"\1", pick)          # a model config.json it read
    return re.sub(r"/tmp/\S+", "<tmp>", pick)


def shorten(error, limit=160):
    """A table-sized reason: without the worker-role prefix and the list of what is supported."""
    text = re.sub(r"^engine\.workers\.\w+\.timing:\s*", "", error)
    text = re.split(r";\s*(supported|accepted):", text)[0]
    return text if len(text) <= limit else text[:limit - 1] + "…"


def metrics_of(pred):
    itl = pred.get("mean_itl_ms")
    return {"mean_ttft_ms": pred.get("mean_ttft_ms"),
            "mean_itl_ms": itl if itl is not None else pred.get("mean_tpot_ms"),
            "completed_requests": pred.get("completed_requests")}


class Runner:
    def __init__(self, args):
        self.binary, self.venv, self.cache_dir = args.binary, args.ref_venv, args.cache_dir
        self.no_reference, self.timeout = args.no_reference, args.timeout
        self.env = dict(os.environ)
        self.env.setdefault("AISIM_REF_VENV", args.ref_venv)
        self.env.setdefault("SERVESIM_AIS_SYSTEMS", args.systems_dir)

    def _run(self, cmd, cwd):
        try:
            p = subprocess.run(cmd, cwd=cwd, env=self.env, capture_output=True, text=True, timeout=self.timeout)
            return p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired:
            return -1, f"error: timed out after {self.timeout} s"

    def reference(self, text):
        cmd = ["aisimulate", "predict", "-c", "CFG", "--output-dir", "OUT", "--overwrite", "--detail", "memory"]
        key = hashlib.sha256(json.dumps({"cmd": cmd, "config": text}, sort_keys=True).encode()).hexdigest()
        path = os.path.join(self.cache_dir, key + ".json")
        if os.path.exists(path):
            with open(path) as f:
                return json.load(f)
        if self.no_reference:
            return None
        with tempfile.TemporaryDirectory(prefix="matrix-ref-") as tmp:
            cfg = os.path.join(tmp, "cfg.yaml")
            with open(cfg, "w") as f:
                f.write(text)
            real = [os.path.join(self.venv, "bin", "aisimulate")] + cmd[1:]
            real[real.index("CFG")], real[real.index("OUT")] = cfg, os.path.join(tmp, "out")
            rc, out = self._run(real, tmp)
            res = {"ok": False, "error": error_of(out)}
            if rc == 0:
                with open(os.path.join(tmp, "out", "prediction.json")) as f:
                    pred = json.load(f)
                roles = (((pred.get("details") or {}).get("sections") or {}).get("memory") or {}).get("roles") or {}
                mem = roles.get("aggregated") or {}
                blocks, bs = mem.get("estimated_num_gpu_blocks"), mem.get("scheduler_block_size_tokens")
                res = {"ok": True, "metrics": metrics_of(pred),
                       "kv_tokens": blocks * bs if blocks is not None and bs is not None else None,
                       "kv_blocks": blocks, "block_size": bs}
        if res["ok"] or rc != -1:  # a timeout is not cached
            os.makedirs(self.cache_dir, exist_ok=True)
            with open(path + ".tmp", "w") as f:
                json.dump(res, f, sort_keys=True)
            os.replace(path + ".tmp", path)
        return res

    def servesim(self, text):
        with tempfile.TemporaryDirectory(prefix="matrix-ss-") as tmp:
            cfg = os.path.join(tmp, "cfg.yaml")
            with open(cfg, "w") as f:
                f.write(text)
            base = [self.binary, "predict", "-c", cfg, "--overwrite", "--format", "json", "--threads", "1"]
            rc, out = self._run(base + ["--output-dir", os.path.join(tmp, "out")], tmp)
            if rc != 0:
                return {"ok": False, "error": error_of(out)}
            with open(os.path.join(tmp, "out", "prediction.json")) as f:
                pred = json.load(f)
            res = {"ok": True, "metrics": metrics_of(pred), "kv_tokens": None}
            _, out = self._run(base + ["--output-dir", os.path.join(tmp, "probe"), *KV_PROBE], tmp)
            m = re.search(r"KV cache \((\d+) blocks of (\d+) tokens\)", out)
            if m:
                res.update(kv_blocks=int(m.group(1)), block_size=int(m.group(2)),
                           kv_tokens=int(m.group(1)) * int(m.group(2)))
            else:
                res["kv_probe"] = error_of(out)
            return res

    def cell(self, cell, moe, others=()):
        """Settle the layout on the reference, then run servesim on it. When no size of the cell's own
        system runs in the reference, the candidates (`candidates`) on the model's other PASS cells are tried
        in turn; the first the reference runs is the cell compared. When none runs, the first failure is kept
        (its cell and layout) and the others are listed in `layouts_tried`."""
        tried, first, settled = [], None, None
        for cand, par in candidates(cell, moe, others):
            if settled is cand:
                continue  # a failure that is not the layout's: no other size of this cell helps
            text = dump_yaml(make_config(cand, par))
            ref = self.reference(text)
            label = layout_label(par)
            tried.append(label if cand is cell else f"{cand['system']}/{cand['backend']} {label}")
            if first is None:
                first = (cand, par, text, ref)
            if ref is None or ref["ok"]:
                break
            if not LAYOUT_RETRY.search(ref["error"]):
                settled = cand
        else:
            cand, par, text, ref = first
        ss = self.servesim(text)
        return dict(cand, moe=moe, layout=layout_label(par), layouts_tried=tried, config=json.loads(text),
                    servesim=ss, reference=ref, **({} if cand is cell else {"picked_for": cell_row(cell)[1:3]}))


# ---------------------------------------------------------------------------------------------
# Classification and output


def deviation(a, b):
    if a is None or b is None:
        return float("inf")
    if a == b:
        return 0.0
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale > 1e-12 else 0.0


def classify(ss, ref, tolerance):
    """(status, worst metric, its deviation, detail text) of one cell's two outcomes."""
    if ref is None:
        return "unchecked", None, None, "no cached reference result" if ss["ok"] else shorten(ss["error"])
    if not ss["ok"] and not ref["ok"]:
        return "both fail", None, None, f"servesim: {shorten(ss['error'])}; reference: {shorten(ref['error'])}"
    if not ss["ok"]:
        return "servesim refuses", None, None, shorten(ss["error"])
    if not ref["ok"]:
        return "reference fails", None, None, shorten(ref["error"])
    devs = {"mean_ttft_ms": deviation(ss["metrics"].get("mean_ttft_ms"), ref["metrics"].get("mean_ttft_ms")),
            "mean_itl_ms": deviation(ss["metrics"].get("mean_itl_ms"), ref["metrics"].get("mean_itl_ms")),
            "kv_tokens": deviation(ss.get("kv_tokens"), ref.get("kv_tokens"))}
    worst = max(sorted(devs), key=lambda k: devs[k])
    text = f"{worst} {fmt_dev(devs[worst])}"
    if worst == "kv_tokens":
        text += f" ({ss.get('kv_tokens')} vs {ref.get('kv_tokens')})"
    else:
        text += f" ({ss['metrics'][worst]:.6g} vs {ref['metrics'][worst]:.6g} ms)"
    return ("match" if devs[worst] <= tolerance else "differs"), worst, devs[worst], text


def fmt_dev(d):
    if d == float("inf"):
        return "missing"
    return f"{d * 100:.3g} %"


def cell_row(c):
    return (c["model"], c["system"], c["backend"], version_key(c["version"]))


def escape(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(results, tolerance):
    """The markdown report of classified cells (each with family, model, ..., status, detail)."""
    out = [f"# Model support matrix: servesim vs aisimulate (tolerance {tolerance * 100:g} %)", ""]
    for family in sorted({r["family"] for r in results}):
        out += [f"## {family}", "", "| model | system | backend | version | layout | status | worst deviation / reason |",
                "|---|---|---|---|---|---|---|"]
        for r in sorted((r for r in results if r["family"] == family), key=cell_row):
            out.append(f"| {r['model']} | {r['system']} | {r['backend']} | {r['version']} | {r['layout']} | "
                       f"{r['status']} | {escape(r['detail'])} |")
        out.append("")
    models = sorted({r["model"] for r in results})
    out += ["## Totals", "", "| status | cells | models |", "|---|---|---|"]
    for s in STATUSES:
        n = sum(r["status"] == s for r in results)
        m = len({r["model"] for r in results if r["status"] == s})
        if n:
            out.append(f"| {s} | {n} | {m} |")
    out.append(f"| all | {len(results)} | {len(models)} |")
    full = [m for m in models if all(r["status"] == "match" for r in results if r["model"] == m)]
    out += ["", f"Models whose every cell matches: {len(full)} of {len(models)}."]
    refused = sorted({(r["model"], r["detail"]) for r in results if r["status"] == "servesim refuses"})
    if refused:
        out += ["", "## Models servesim refuses", ""]
        out += [f"- {m}: {escape(d)}" for m, d in refused]
    return "\n".join(out) + "\n"


def exit_code(results):
    return 1 if any(r["status"] in ("differs", "reference fails") for r in results) else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--quick", action="store_true", help="one cell per model")
    ap.add_argument("--models", help="comma-separated substrings of the Hugging Face id")
    ap.add_argument("--systems", help="comma-separated systems")
    ap.add_argument("--backends", help="comma-separated backends")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "servesim"))
    ap.add_argument("--tolerance", type=float, default=0.001, help="relative (default 0.001 = 0.1 %%)")
    ap.add_argument("--no-reference", action="store_true", help="reference results from the cache only")
    ap.add_argument("--ref-venv", default=os.environ.get("AISIM_REF_VENV", REF_VENV))
    ap.add_argument("--systems-dir", help="default $SERVESIM_AIS_SYSTEMS, else the venv's aisimulate_core/systems")
    ap.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/servesim-model-matrix"))
    ap.add_argument("--timeout", type=int, default=900, help="seconds per tool run")
    ap.add_argument("--json", metavar="OUT", help="write every cell here")
    ap.add_argument("--list", action="store_true", help="print the selected cells, run nothing")
    args = ap.parse_args(argv)
    args.systems_dir = args.systems_dir or os.environ.get("SERVESIM_AIS_SYSTEMS") or next(
        iter(glob.glob(os.path.join(args.ref_venv, "lib", "python3*", "site-packages", "aisimulate_core", "systems"))),
        "")
    split = (lambda s: [x for x in s.split(",") if x] if s else None)
    current = current_versions(args.systems_dir)
    cells = select(read_cells(load_rows(args.systems_dir)), split(args.models), split(args.systems),
                   split(args.backends), args.quick, current)
    if not cells:
        print(f"no cells: no agg PASS row under {args.systems_dir}/support_matrix matches", file=sys.stderr)
        return 2
    if args.list:
        for c in cells:
            print(c["family"], c["model"], c["system"], c["backend"], c["version"])
        return 0
    if not (os.path.exists(args.binary) or shutil.which(args.binary)):
        print(f"no servesim binary at {args.binary} (--binary)", file=sys.stderr)
        return 2
    runner = Runner(args)
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        every = read_cells(load_rows(args.systems_dir)) if args.quick else cells
        others = {c["model"]: quick_order([o for o in every if o["model"] == c["model"]], current) for c in cells}
        results = list(pool.map(
            lambda c: runner.cell(c, model_is_moe(args.systems_dir, c["model"]), others[c["model"]]), cells))
    for r in results:
        r["status"], r["worst_metric"], r["worst_deviation"], r["detail"] = classify(
            r["servesim"], r["reference"], args.tolerance)
        if r["worst_deviation"] == float("inf"):
            r["worst_deviation"] = None
    sys.stdout.write(render(results, args.tolerance))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(sorted(results, key=lambda r: (r["family"],) + cell_row(r)), f, indent=1, sort_keys=True)
            f.write("\n")
    return exit_code(results)


if __name__ == "__main__":
    sys.exit(main())
