#!/usr/bin/env python3
"""Seeded generator of traces in every format servesim replays (for parity checks and benchmarks).

  scripts/gen_traces.py FORMAT --requests N --seed S --out PATH

FORMAT: mooncake | mooncake-delta | applied | agentic_mooncake | dynamo | dynamo-agentic | weka.
PATH is a file, except for dynamo formats (a directory of shards, one of them gzipped).
The same arguments always give the same bytes. Prompts share prefixes (system prompts, growing
conversations) so that prefix caching matters; agentic traces have spawns, joins, tool waits.
"""
import argparse, gzip, json, os, random

BS = 16  # trace block size of the agentic formats
# --profile long: prompts and outputs the size of production traces (the public Mooncake
# conversation trace averages 12k prompt and 340 output tokens); the default keeps them small.
IN, OUT = 1, 1


def mooncake(rng, n, out):
    t = 0.0
    with open(out, "w") as f:
        for i in range(n):
            t += rng.expovariate(1 / 40.0) * IN
            group = rng.randrange(8)
            blocks = rng.randint(1, 6) * IN
            ids = ([group * 1000 + b for b in range(rng.randint(0, 3) * IN)]
                   + [100000 + i * 10 * IN + b for b in range(blocks)])
            row = {"timestamp": round(t, 3), "input_length": len(ids) * 512 - rng.randrange(400),
                   "output_length": rng.randint(1, 120) * OUT, "hash_ids": ids}
            if rng.random() < 0.1:
                row["priority"] = rng.randint(0, 2)
            f.write(json.dumps(row) + "\n")


def mooncake_delta(rng, n, out):
    rows, t, sid = [], 0.0, 0
    while len(rows) < n:
        t += rng.expovariate(1 / 150.0)
        turns = min(rng.randint(1, 6), n - len(rows))
        nid = 1_000_000 + sid * 1000
        for k in range(turns):
            blocks = rng.randint(1, 4) * IN
            ids = list(range(nid, nid + blocks))
            nid += blocks
            row = {"session_id": f"s{sid}", "input_length": blocks * 64 - rng.randrange(30),
                   "output_length": rng.randint(1, 60) * OUT, "hash_ids": ids}
            if k == 0:
                row["timestamp"] = round(t, 3)
            else:
                row["delay"] = round(rng.uniform(0, 300), 3)
            rows.append(row)
        sid += 1
    with open(out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def applied(rng, n, out):
    made = 0
    with open(out, "w") as f:
        while made < n:
            k = min(rng.randint(1, 6), max(n - made - 1, 1))
            f.write(json.dumps({
                "num_turns": k, "input_prompt_length": rng.randint(200, 3000) * IN,
                "assistant_response_length": [rng.randint(5, 200) * OUT for _ in range(k)],
                "tool_call_output_length": [rng.randint(10, 800) * IN for _ in range(k)],
                "tool_call_latency": [round(rng.uniform(0, 0.5), 3) for _ in range(k)],
                "final_assistant_response_length": rng.randint(5, 200) * OUT}) + "\n")
            made += k + 1


def play_nodes(rng, budget):
    """A play: a main session of turns (prompts growing), sometimes a spawned child chain joined
    back. Returns node dicts (local ids, session, prompt ids, deps with (source, trigger, delay,
    relation)) and the play's start offset."""
    nodes = []
    main_len = rng.randint(1, max(1, min(6, budget)))
    prefix = [rng.randrange(1 << 40) for _ in range(rng.randint(1, 4) * IN)]
    for k in range(main_len):
        prefix = prefix + [rng.randrange(1 << 40) for _ in range(rng.randint(1, 3) * IN)]
        deps = [] if k == 0 else [(k - 1, "completion", round(rng.uniform(0, 50), 3), "sequence")]
        nodes.append({"session": "main", "hashes": list(prefix), "deps": deps, "out": rng.randint(1, 40) * OUT})
    if main_len >= 2 and len(nodes) < budget and rng.random() < 0.6:
        parent = rng.randrange(main_len - 1)
        child_prefix = [rng.randrange(1 << 40) for _ in range(rng.randint(1, 3))]
        first_child = len(nodes)
        for c in range(rng.randint(1, 3)):
            child_prefix = child_prefix + [rng.randrange(1 << 40)]
            deps = ([(parent, "dispatch", round(rng.uniform(0, 20), 3), "spawn")] if c == 0
                    else [(len(nodes) - 1, "completion", round(rng.uniform(0, 20), 3), "sequence")])
            nodes.append({"session": "sub", "hashes": list(child_prefix), "deps": deps,
                          "out": rng.randint(1, 20) * OUT})
        last_child = len(nodes) - 1
        nodes[parent + 1]["deps"].append((last_child, "completion", round(rng.uniform(0, 5), 3), "join"))
        del first_child
    return nodes


def agentic_mooncake(rng, n, out):
    with open(out, "w") as f:
        f.write(json.dumps({"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": BS,
                            "hash_id_scope": "local", "source": {"format": "servesim-gen", "digest": "seed"}}) + "\n")
        made, p, t = 0, 0, 0.0
        while made < n:
            t += rng.expovariate(1 / 200.0)
            nodes = play_nodes(rng, n - made)
            for i, nd in enumerate(nodes):
                il = len(nd["hashes"]) * BS - rng.randrange(BS)
                f.write(json.dumps({
                    "request_id": f"p{p}-r{i}", "play_id": f"play{p:05d}", "session_id": f"p{p}-{nd['session']}",
                    "model": "src-model", "input_length": il, "output_length": nd["out"], "hash_ids": nd["hashes"],
                    "not_before_ms": round(t, 3) if not nd["deps"] else 0,
                    "dependencies": [{"request_id": f"p{p}-r{s}", "trigger": tr, "delay_ms": d, "relation": rel}
                                     for s, tr, d, rel in nd["deps"]]}) + "\n")
            made += len(nodes)
            p += 1


def dynamo_request(rid, start, dur, out_tokens, hashes, il, session=None, parent=None, model="claude-x", deps=None):
    r = {"schema": "dynamo.request.trace.v1", "event_type": "request_end", "event_time_unix_ms": start + dur,
         "request": {"request_id": rid, "model": model, "output_tokens": out_tokens, "request_received_ms": start,
                     "total_time_ms": dur,
                     "replay": {"trace_block_size": BS, "input_length": il, "input_sequence_hashes": hashes}}}
    if deps:
        r["request"]["replay"]["dependencies"] = deps
    if session is not None:
        r["agent_context"] = {"session_id": session}
        if parent:
            r["agent_context"]["parent_session_id"] = parent
    return r


def dynamo(rng, n, out, agentic):
    os.makedirs(out, exist_ok=True)
    lines, t, made, p = [], 1_700_000_000_000, 0, 0
    while made < n:
        t += int(rng.expovariate(1 / 300.0))
        if not agentic:
            hashes = [rng.randrange(1 << 60) for _ in range(rng.randint(1, 8) * IN)]
            lines.append(json.dumps({"event_type": "request_payload", "request_id": f"r{made}"}))
            lines.append(json.dumps(dynamo_request(f"r{made}", t, rng.randint(10, 400), rng.randint(1, 60) * OUT, hashes,
                                                   len(hashes) * BS - rng.randrange(BS))))
            made += 1
            continue
        # A parent session with a few turns, sometimes a child session spawned by a tool.
        s, cur = f"sess{p}", t
        prefix = [rng.randrange(1 << 60) for _ in range(2)]
        turns = rng.randint(1, 4)
        ids = []
        for k in range(turns):
            prefix = prefix + [rng.randrange(1 << 60) for _ in range(IN)]
            dur = rng.randint(20, 300)
            rid = f"{s}-{k}"
            ids.append((rid, cur, dur))
            lines.append(json.dumps(dynamo_request(rid, cur, dur, rng.randint(1, 40) * OUT, list(prefix),
                                                   len(prefix) * BS - rng.randrange(BS), session=s)))
            cur += dur + rng.randint(5, 400)
        made += turns
        if turns >= 2 and rng.random() < 0.5 and made < n:
            src = ids[0]
            c, ct = f"{s}-child", src[1] + rng.randint(0, src[2])
            cp = [rng.randrange(1 << 60)]
            crids = []
            for k in range(rng.randint(1, 2)):
                cp = cp + [rng.randrange(1 << 60)]
                dur = rng.randint(10, 100)
                crid = f"{c}-{k}"
                crids.append(crid)
                lines.append(json.dumps(dynamo_request(crid, ct, dur, rng.randint(1, 20), list(cp),
                                                       len(cp) * BS, session=c, parent=s)))
                ct += dur + rng.randint(1, 30)
                made += 1
            if rng.random() < 0.5:
                lines.append(json.dumps({"schema": "dynamo.request.trace.v1", "event_type": "tool_end",
                                         "event_time_unix_ms": ct, "agent_context": {"session_id": s},
                                         "tool": {"tool_call_id": f"call-{p}", "tool_class": "agent",
                                                  "started_at_unix_ms": src[1], "ended_at_unix_ms": max(ct, src[1]),
                                                  "claude": {"source_request_id": src[0],
                                                             "consumer_request_id": ids[1][0],
                                                             "child_session_id": c,
                                                             "execution_mode": "background"}}}))
        p += 1
    rng.shuffle(lines)
    half = len(lines) // 2
    with open(os.path.join(out, "shard-000.jsonl"), "w") as f:
        f.write("\n".join(lines[:half]) + "\n")
    with gzip.GzipFile(os.path.join(out, "shard-001.jsonl.gz"), "wb", mtime=0) as f:
        f.write(("\n".join(lines[half:]) + "\n").encode())


def weka(rng, n, out):
    made, p = 0, 0
    with open(out, "w") as f:
        while made < n:
            reqs, t, prefix = [], 0.0, [rng.randrange(1 << 30) for _ in range(3)]
            turns = rng.randint(2, 6)
            for k in range(turns):
                prefix = prefix + [rng.randrange(1 << 30) for _ in range(rng.randint(1, 3) * IN)]
                api = round(rng.uniform(0.05, 2.0), 3)
                reqs.append({"t": round(t, 3), "type": "s", "model": "m", "in": len(prefix) * 4 - rng.randrange(4),
                             "out": rng.randint(1, 30) * OUT, "hash_ids": list(prefix), "api_time": api})
                t += api + rng.uniform(0.05, 1.0)
                made += 1
                if k < turns - 1 and rng.random() < 0.3:
                    inner, it, cp = [], t, [rng.randrange(1 << 30) for _ in range(2)]
                    for _ in range(rng.randint(1, 3)):
                        cp = cp + [rng.randrange(1 << 30)]
                        a2 = round(rng.uniform(0.05, 0.5), 3)
                        inner.append({"t": round(it, 3), "type": "s", "model": "m", "in": len(cp) * 4,
                                      "out": rng.randint(0, 10), "hash_ids": list(cp), "api_time": a2})
                        it += a2 + 0.01
                        made += 1
                    blocking = rng.random() < 0.6
                    reqs.append({"t": round(t, 3), "type": "subagent", "agent_id": f"a{k}", "subagent_type": "Explore",
                                 "status": "completed" if blocking else "async_launched", "requests": inner})
                    if blocking:
                        t = it + 0.05
            f.write(json.dumps({"id": f"trace{p}", "models": ["m"], "block_size": 4, "hash_id_scope": "local",
                                "requests": reqs}) + "\n")
            p += 1


def main():
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("format")
    a.add_argument("--requests", type=int, default=1000)
    a.add_argument("--seed", type=int, default=1)
    a.add_argument("--out", required=True)
    a.add_argument("--profile", choices=["small", "long"], default="small")
    args = a.parse_args()
    global IN, OUT
    if args.profile == "long":
        IN, OUT = 4, 5
    rng = random.Random(args.seed)
    f = args.format
    if f == "mooncake":
        mooncake(rng, args.requests, args.out)
    elif f == "mooncake-delta":
        mooncake_delta(rng, args.requests, args.out)
    elif f == "applied":
        applied(rng, args.requests, args.out)
    elif f == "agentic_mooncake":
        agentic_mooncake(rng, args.requests, args.out)
    elif f == "dynamo":
        dynamo(rng, args.requests, args.out, agentic=False)
    elif f == "dynamo-agentic":
        dynamo(rng, args.requests, args.out, agentic=True)
    elif f == "weka":
        weka(rng, args.requests, args.out)
    else:
        a.error(f"unknown format {f}")


if __name__ == "__main__":
    main()
