#!/usr/bin/env python3
"""Speed and peak memory of servesim beside the reference (Dynamo 1.6.1), per trace format.

  scripts/bench_traces.py [--requests 10000] [--seed 3] [--formats mooncake,weka,...]

For each format a trace of about N requests is generated (scripts/gen_traces.py, seeded), then
replayed by `servesim predict` and by the reference (scripts/reference_replay.py under the
reference python), each in a fresh process. Reported: wall time of the whole process (trace
loading included), its CPU time (user + system: what the run costs, whatever else the machine
is doing), its peak resident memory (wait4's ru_maxrss), and that peak above the process's floor
(the same program replaying a one-request trace: servesim's binary, the reference's Python
interpreter and native library), with the ratios. Peak memory is the process's own high-water
mark (VmHWM, sampled every 2 ms until it exits): wait4's ru_maxrss would also count the Python
image the child was forked from. Both runs must complete the same number of
requests.
"""
import argparse, atexit, json, os, shutil, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import parity  # noqa: E402

ENGINE = {"block_size": 16, "num_gpu_blocks": 16000, "max_num_seqs": 128}
FORMATS = {
    # name: (generator format, case keys)
    "mooncake": ("mooncake", {}),
    "mooncake-delta": ("mooncake-delta", {"trace_format": "mooncake-delta", "trace_block_size": 64}),
    "applied_compute_agentic": ("applied", {"trace_format": "applied_compute_agentic", "replay_concurrency": 64,
                                            "trace_block_size": 64}),
    "agentic_mooncake": ("agentic_mooncake", {"trace_format": "agentic_mooncake", "trace_block_size": None,
                                              "execution_model": "target"}),
    "dynamo": ("dynamo", {"trace_format": "dynamo", "trace_block_size": None}),
    "dynamo (agentic)": ("dynamo-agentic", {"trace_format": "dynamo", "trace_block_size": None,
                                            "execution_model": "target"}),
    "weka": ("weka", {"trace_format": "weka", "trace_block_size": None, "execution_model": "target"}),
}


def measure(cmd):
    """(wall seconds, CPU seconds, peak RSS in MiB, stdout) of one process."""
    start = time.perf_counter()
    out_f, err_f = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    p = subprocess.Popen(cmd, stdout=out_f, stderr=err_f)
    hwm_kib = 0
    while True:
        try:
            with open(f"/proc/{p.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        hwm_kib = max(hwm_kib, int(line.split()[1]))
        except OSError:
            pass
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(0.002)
    wall = time.perf_counter() - start
    p.returncode = status
    out_f.seek(0)
    err_f.seek(0)
    if status != 0:
        raise RuntimeError(f"{cmd[:3]} failed: {err_f.read().decode()[-500:]}")
    return wall, usage.ru_utime + usage.ru_stime, hwm_kib / 1024.0, out_f.read()


def main():
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--requests", type=int, default=10000)
    a.add_argument("--seed", type=int, default=3)
    a.add_argument("--formats", default=",".join(FORMATS))
    a.add_argument("--profile", choices=["small", "long"], default="long",
                   help="request sizes of the generated traces (gen_traces.py --profile)")
    a.add_argument("--binary", default=os.path.join(parity.ROOT, "target", "release", "servesim"))
    args = a.parse_args()
    py = subprocess.run([os.path.join(parity.SHARED, "parity", "setup.sh")], check=True, capture_output=True,
                        text=True).stdout.strip()
    tmp = tempfile.mkdtemp(prefix="servesim-bench-traces-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    one = os.path.join(tmp, "one.jsonl")
    open(one, "w").write('{"timestamp": 0, "input_length": 16, "output_length": 1, "hash_ids": [1]}\n')
    one_case = {"traces": [one], "engine": ENGINE, "num_workers": 4}
    json.dump(one_case, open(os.path.join(tmp, "one.json"), "w"))
    # A one-request run can end between two samples: take the largest of a few.
    ours_floor = max(measure([args.binary] + parity.servesim_args(one_case))[2] for _ in range(15))
    ref_floor = measure([py, os.path.join(HERE, "reference_replay.py"), os.path.join(tmp, "one.json")])[2]
    print(f"memory floor (one-request trace): servesim {ours_floor:.1f} MiB, reference {ref_floor:.1f} MiB")
    print(f"{'format':24} {'requests':>8} | {'wall s':>13} {'x':>5} | {'CPU s':>13} {'x':>5} | "
          f"{'peak MiB':>13} {'x':>5} | {'above floor':>13} {'x':>5}")
    print(f"{'':24} {'':>8} | {'ours   ref':>13} {'':>5} | {'ours   ref':>13} {'':>5} | {'ours   ref':>13} "
          f"{'':>5} | {'ours   ref':>13}")
    worst = [float("inf")] * 4
    for name in args.formats.split(","):
        gen, keys = FORMATS[name]
        out = os.path.join(tmp, gen.replace("-", "_")) + ("" if gen.startswith("dynamo") else ".jsonl")
        subprocess.run([sys.executable, os.path.join(HERE, "gen_traces.py"), gen, "--requests", str(args.requests),
                        "--profile", args.profile,
                        "--seed", str(args.seed), "--out", out], check=True)
        traces = ([os.path.join(out, "shard-000.jsonl"), os.path.join(out, "shard-001.jsonl.gz")]
                  if gen.startswith("dynamo") else [out])
        case = dict(keys, traces=traces, engine=ENGINE, num_workers=4)
        case_file = os.path.join(tmp, f"{gen}.json")
        json.dump(case, open(case_file, "w"))
        ours_s, ours_cpu, ours_mb, ours_out = measure([args.binary] + parity.servesim_args(case))
        ref_s, ref_cpu, ref_mb, ref_out = measure([py, os.path.join(HERE, "reference_replay.py"), case_file])
        ours, ref = json.loads(ours_out), json.loads(ref_out)
        if ours["completed_requests"] != ref["completed_requests"]:
            print(f"  {name}: completed {ours['completed_requests']} vs {ref['completed_requests']}")
        above = (max(ours_mb - ours_floor, 0.1), max(ref_mb - ref_floor, 0.1))
        ratios = [ref_s / ours_s, ref_cpu / ours_cpu, ref_mb / ours_mb, above[1] / above[0]]
        worst = [min(w, r) for w, r in zip(worst, ratios)]
        print(f"{name:24} {ours['completed_requests']:>8} | {ours_s:>6.2f} {ref_s:>6.2f} {ratios[0]:>4.1f}x | "
              f"{ours_cpu:>6.2f} {ref_cpu:>6.2f} {ratios[1]:>4.1f}x | {ours_mb:>6.1f} {ref_mb:>6.1f} {ratios[2]:>4.1f}x | "
              f"{above[0]:>6.1f} {above[1]:>6.1f} {ratios[3]:>4.1f}x")
    print("worst ratios: wall {:.1f}x, CPU {:.1f}x, peak memory {:.1f}x, memory above floor {:.1f}x".format(*worst))


if __name__ == "__main__":
    main()
