#!/usr/bin/env python3
"""Writes conversation.jsonl: a small Mooncake-format trace for trying servesim.

Ten minutes of a chat service: 120 conversations of 1-6 turns arriving over ten minutes, each
turn's prompt extending the previous turn's (so later turns hit the prefix cache), and all
conversations sharing one of four system prompts. Deterministic: rerunning gives the same file.
"""
import json
import random

rng = random.Random(7)
BLOCK = 512  # tokens per hash id (Mooncake's trace block size)
system_prompts = [[1000 * (g + 1) + i for i in range(rng.randint(1, 3))] for g in range(4)]
next_id = 10_000
conversations = []
for c in range(120):
    rows = []
    start = round(rng.uniform(0, 600_000))
    history = list(rng.choice(system_prompts))
    for turn in range(rng.randint(1, 6)):
        new_blocks = rng.randint(1, 4)
        history += range(next_id, next_id + new_blocks)
        next_id += new_blocks
        row = {
            "session_id": f"chat-{c}",
            "input_length": len(history) * BLOCK - rng.randint(0, BLOCK - 1),
            "output_length": rng.randint(20, 600),
            "hash_ids": list(history),
        }
        if turn == 0:
            row["timestamp"] = start
        else:
            row["delay"] = round(rng.uniform(2_000, 30_000))
        rows.append(row)
        history.append(next_id)  # the model's answer becomes context for the next turn
        next_id += 1
    conversations.append(rows)
conversations.sort(key=lambda rows: rows[0]["timestamp"])
with open("conversation.jsonl", "w") as f:
    for rows in conversations:
        for r in rows:
            f.write(json.dumps(r) + "\n")
