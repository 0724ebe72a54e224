#!/usr/bin/env python3
"""Writes bursty.jsonl: a Mooncake-format trace whose load comes in bursts.

Twenty minutes of single-turn requests: a quiet base of 2 requests/s with a 90-second burst of
12 requests/s every five minutes. Prompts of 1-4k tokens, answers of 100-400 tokens, no shared
prefixes. Deterministic: rerunning gives the same file.
"""
import json
import random

rng = random.Random(11)
BLOCK = 512
rows = []
next_id = 0
t = 0.0
while t < 1_200_000:
    in_burst = (t % 300_000) >= 120_000 and (t % 300_000) < 210_000
    rate = 12.0 if in_burst else 2.0
    t += rng.expovariate(rate) * 1000
    isl = rng.randint(1024, 4096)
    blocks = -(-isl // BLOCK)
    rows.append({
        "timestamp": round(t),
        "input_length": isl,
        "output_length": rng.randint(100, 400),
        "hash_ids": list(range(next_id, next_id + blocks)),
    })
    next_id += blocks
with open("bursty.jsonl", "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
print(f"wrote {len(rows)} requests")
