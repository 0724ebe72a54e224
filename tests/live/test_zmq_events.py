"""KV events on ZMQ (pyzmq): decoded with msgspec structs laid out as vLLM declares its events
(array_like, tagged), hashes computed independently; the named layout decoded with msgpack."""

import struct
import time
from typing import Optional, Union

import msgpack
import msgspec
import xxhash
import zmq

from conftest import FIXED, Server, client, consecutive_ports

BLOCK = 16


# vLLM's event classes, as its subscribers decode them: msgspec structs with array_like=True,
# so a batch is [ts, events, dp_rank] and an event is [tag, field, ...].
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: Optional[int] = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: Optional[str]


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]


DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def decode(payload):
    """(ts, events as dicts with a "type" key, dp_rank) of a vLLM-format payload."""
    batch = DECODER.decode(payload)
    events = [{"type": type(e).__name__, **msgspec.structs.asdict(e)} for e in batch.events]
    return batch.ts, events, batch.data_parallel_rank


def local_hash(tokens):
    return xxhash.xxh3_64_intdigest(struct.pack(f"<{len(tokens)}I", *tokens), seed=1337)


def chain(parent, local):
    if parent is None:
        return local
    return xxhash.xxh3_64_intdigest(struct.pack("<QQ", parent, local), seed=1337)


def block_hashes(tokens):
    out, parent = [], None
    for i in range(0, len(tokens) - len(tokens) % BLOCK, BLOCK):
        parent = chain(parent, local_hash(tokens[i : i + BLOCK]))
        out.append(parent)
    return out


def receive(sub, until, timeout=5.0):
    """Messages (seq, ts, events, rank) until `until(events_so_far)` or the timeout."""
    got, events = [], []
    deadline = time.time() + timeout
    while time.time() < deadline and not until(events):
        if sub.poll(100):
            topic, seq, payload = sub.recv_multipart()
            assert topic == b""
            ts, evs, rank = decode(payload)
            got.append((struct.unpack(">Q", seq)[0], ts, evs, rank))
            events.extend(evs)
    return got, events


def test_stored_and_removed_events_carry_engine_hashes():
    pub_port, replay_port = consecutive_ports(2), None
    replay_port = pub_port + 1
    engine = {"timing_model": FIXED, "block_size": BLOCK, "num_gpu_blocks": 10}
    ctx = zmq.Context()
    with Server(
        "--speedup-ratio", "10", "--zmq-kv-events-ports", pub_port, "--zmq-replay-ports", replay_port, engine=engine
    ) as srv:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{pub_port}")
        time.sleep(0.3)  # let the subscription reach the publisher
        prompt = [7000 + 3 * i for i in range(70)]  # 4 full blocks and 6 tokens
        r = client(srv).completions.create(model="servesim-model", prompt=prompt, max_tokens=20)
        expected = block_hashes(prompt)
        msgs, events = receive(sub, lambda evs: sum(len(e["block_hashes"]) for e in evs if e["type"] == "BlockStored") >= 5)
        stored = [e for e in events if e["type"] == "BlockStored"]
        assert stored, "no BlockStored event"
        first = stored[0]
        assert first["block_hashes"] == expected
        assert first["parent_block_hash"] is None
        assert first["token_ids"] == prompt[:64]
        assert first["block_size"] == BLOCK
        assert (first["lora_id"], first["medium"]) == (None, "GPU")
        # Generated tokens fill block 5 (positions 64..79): its hash chains from the prompt's.
        later = [h for e in stored[1:] for h in e["block_hashes"]]
        assert stored[1]["parent_block_hash"] == expected[-1]
        assert len(stored[1]["token_ids"]) == BLOCK and stored[1]["token_ids"][:6] == prompt[64:]
        assert later[0] == chain(expected[-1], local_hash(stored[1]["token_ids"]))
        assert all(rank == 0 for (_, _, _, rank) in msgs)
        assert all(abs(ts - time.time()) < 30 for (_, ts, _, _) in msgs)
        seqs = [m[0] for m in msgs]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))

        # A different prompt needs 7 blocks of the 10: the oldest cached ones are evicted.
        other = [9000 + i for i in range(100)]
        client(srv).completions.create(model="servesim-model", prompt=other, max_tokens=2)
        msgs2, events2 = receive(sub, lambda evs: any(e["type"] == "BlockRemoved" for e in evs))
        removed = [h for e in events2 if e["type"] == "BlockRemoved" for h in e["block_hashes"]]
        assert removed and set(removed) <= set(expected + later), removed
        stored2 = [h for e in events2 if e["type"] == "BlockStored" for h in e["block_hashes"]]
        assert stored2[: len(block_hashes(other))] == block_hashes(other)

        # Replay everything from sequence 0 over the ROUTER socket.
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{replay_port}")
        dealer.send_multipart([b"", struct.pack(">Q", 0)])
        replayed = []
        while dealer.poll(3000):
            _, seq, payload = dealer.recv_multipart()
            if struct.unpack(">q", seq)[0] == -1:
                assert payload == b""
                break
            replayed.append((struct.unpack(">Q", seq)[0], decode(payload)))
        else:
            raise AssertionError("no end-of-replay marker")
        assert [s for s, _ in replayed] == list(range(len(replayed)))
        assert len(replayed) >= len(msgs) + len(msgs2)
        replayed_stored = [h for _, (_, evs, _) in replayed for e in evs if e["type"] == "BlockStored" for h in e["block_hashes"]]
        assert replayed_stored[:4] == expected
        sub.close(0)
        dealer.close(0)
    ctx.term()


def test_named_layout_writes_maps_tagged_by_type():
    port = consecutive_ports(1)
    engine = {"timing_model": FIXED, "block_size": BLOCK}
    ctx = zmq.Context()
    with Server("--speedup-ratio", "10", "--zmq-kv-events-ports", port, "--zmq-event-format", "named", engine=engine) as srv:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{port}")
        time.sleep(0.3)
        prompt = [500 + i for i in range(40)]
        client(srv).completions.create(model="servesim-model", prompt=prompt, max_tokens=2)
        assert sub.poll(5000), "no KV event"
        _, _, payload = sub.recv_multipart()
        ts, events, rank = msgpack.unpackb(payload)
        assert rank == 0 and events[0]["type"] == "BlockStored"
        assert events[0]["block_hashes"] == block_hashes(prompt)
        assert (events[0]["group_idx"], events[0]["token_ids"]) == (0, prompt[:32])
        sub.close(0)
    ctx.term()


def test_port_count_must_match_workers():
    import subprocess

    from conftest import binary

    r = subprocess.run(
        [str(binary()), "serve", "--num-workers", "2", "--zmq-kv-events-ports", "5557"], capture_output=True, text=True
    )
    assert r.returncode == 2 and "one port per worker" in r.stderr
