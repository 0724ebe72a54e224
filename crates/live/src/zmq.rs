//! KV events on ZMQ in vLLM's wire format.
//!
//! Each rank with a port publishes on a PUB socket. A message has three frames: an empty topic,
//! the sequence number (u64, big-endian), and a msgpack payload `(timestamp, [event, ...],
//! dp_rank)` where each event is a map tagged by `type`: `BlockStored {block_hashes,
//! parent_block_hash, token_ids, block_size, lora_id, group_idx}` or `BlockRemoved
//! {block_hashes, group_idx}`. The last 10,000 payloads are kept for a ROUTER socket that replays
//! them: a request `[identity, "", start_seq]` is answered with every kept message from
//! `start_seq` on, `[identity, "", seq, payload]`, and ends with `[identity, "", -1, ""]`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::Serialize;
use servesim_engine::KvEvent;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// Messages kept for replay.
pub const REPLAY_BUFFER: usize = 10_000;

#[derive(Serialize)]
#[serde(tag = "type")]
enum WireEvent {
    BlockStored {
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        token_ids: Vec<u32>,
        block_size: u32,
        lora_id: Option<u32>,
        group_idx: u32,
    },
    BlockRemoved {
        block_hashes: Vec<u64>,
        group_idx: u32,
    },
}

/// Encodes one pass's events (`tokens` holds the tokens of the stored blocks, in order).
pub fn encode(events: &[KvEvent], tokens: &[u32], block_size: u32, dp_rank: u32, timestamp: f64) -> Vec<u8> {
    let mut wire = Vec::with_capacity(events.len());
    let mut at = 0usize;
    for e in events {
        match e {
            KvEvent::Stored { parent, blocks } => {
                let n = blocks.len() * block_size as usize;
                let token_ids = tokens.get(at..at + n).map(<[u32]>::to_vec).unwrap_or_default();
                at += n;
                wire.push(WireEvent::BlockStored {
                    block_hashes: blocks.iter().map(|b| b.hash).collect(),
                    parent_block_hash: *parent,
                    token_ids,
                    block_size,
                    lora_id: None,
                    group_idx: 0,
                });
            }
            KvEvent::Removed { hashes } => {
                wire.push(WireEvent::BlockRemoved { block_hashes: hashes.clone(), group_idx: 0 })
            }
        }
    }
    rmp_serde::to_vec_named(&(timestamp, wire, dp_rank as i32)).expect("KV events serialise")
}

/// The sending side of one rank's publisher (cheap to clone).
#[derive(Clone, Debug)]
pub struct Publisher {
    tx: UnboundedSender<Vec<u8>>,
}

impl Publisher {
    pub fn publish(&self, events: &[KvEvent], tokens: &[u32], block_size: u32, dp_rank: u32) {
        let ts = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        let _ = self.tx.send(encode(events, tokens, block_size, dp_rank, ts));
    }
}

type Ring = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

/// Binds the PUB socket (and the replay ROUTER socket) of one rank and starts their tasks.
pub async fn start(host: &str, pub_port: u16, replay_port: Option<u16>) -> Result<Publisher, String> {
    let mut socket = PubSocket::new();
    let endpoint = format!("tcp://{host}:{pub_port}");
    socket.bind(&endpoint).await.map_err(|e| format!("ZMQ KV events: cannot bind {endpoint}: {e}"))?;
    let ring: Ring = Arc::new(Mutex::new(VecDeque::new()));
    if let Some(port) = replay_port {
        let mut router = RouterSocket::new();
        let endpoint = format!("tcp://{host}:{port}");
        router.bind(&endpoint).await.map_err(|e| format!("ZMQ KV replay: cannot bind {endpoint}: {e}"))?;
        tokio::spawn(replay(router, ring.clone()));
    }
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(publish(socket, rx, ring));
    Ok(Publisher { tx })
}

async fn publish(mut socket: PubSocket, mut rx: UnboundedReceiver<Vec<u8>>, ring: Ring) {
    let mut seq: u64 = 0;
    while let Some(payload) = rx.recv().await {
        let payload = Bytes::from(payload);
        {
            let mut ring = ring.lock().expect("replay ring lock");
            if ring.len() == REPLAY_BUFFER {
                ring.pop_front();
            }
            ring.push_back((seq, payload.clone()));
        }
        let frames = vec![Bytes::new(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload];
        let msg = ZmqMessage::try_from(frames).expect("three frames");
        // A PUB socket drops what nobody listens to; a failure is not worth stopping for.
        let _ = socket.send(msg).await;
        seq += 1;
    }
}

async fn replay(mut router: RouterSocket, ring: Ring) {
    loop {
        let Ok(msg) = router.recv().await else { continue };
        let frames = msg.into_vec();
        // [identity, (empty delimiter,) start_seq]
        let (Some(identity), Some(last)) = (frames.first().cloned(), frames.last()) else { continue };
        let start = match <[u8; 8]>::try_from(last.as_ref()) {
            Ok(b) => u64::from_be_bytes(b),
            Err(_) => continue,
        };
        let kept: Vec<(u64, Bytes)> =
            ring.lock().expect("replay ring lock").iter().filter(|(s, _)| *s >= start).cloned().collect();
        for (seq, payload) in kept {
            let frames = vec![identity.clone(), Bytes::new(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload];
            if router.send(ZmqMessage::try_from(frames).expect("four frames")).await.is_err() {
                break;
            }
        }
        let end = vec![identity, Bytes::new(), Bytes::copy_from_slice(&(-1i64).to_be_bytes()), Bytes::new()];
        let _ = router.send(ZmqMessage::try_from(end).expect("four frames")).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use servesim_engine::StoredBlock;

    #[test]
    fn payload_is_vllm_event_batch() {
        let events = vec![
            KvEvent::Stored {
                parent: Some(7),
                blocks: vec![StoredBlock { hash: u64::MAX, local: 1 }, StoredBlock { hash: 5, local: 2 }],
            },
            KvEvent::Removed { hashes: vec![9] },
        ];
        let bytes = encode(&events, &[1, 2, 3, 4], 2, 3, 12.5);
        let v: rmpv::Value = rmpv::decode::read_value(&mut &bytes[..]).unwrap();
        let batch = v.as_array().unwrap();
        assert_eq!(batch[0].as_f64(), Some(12.5));
        assert_eq!(batch[2].as_i64(), Some(3));
        let evs = batch[1].as_array().unwrap();
        let get = |e: &rmpv::Value, k: &str| {
            e.as_map().unwrap().iter().find(|(key, _)| key.as_str() == Some(k)).map(|(_, v)| v.clone()).unwrap()
        };
        assert_eq!(get(&evs[0], "type").as_str(), Some("BlockStored"));
        assert_eq!(get(&evs[0], "block_hashes"), rmpv::Value::Array(vec![u64::MAX.into(), 5u64.into()]));
        assert_eq!(get(&evs[0], "parent_block_hash").as_u64(), Some(7));
        assert_eq!(get(&evs[0], "token_ids"), rmpv::Value::Array(vec![1.into(), 2.into(), 3.into(), 4.into()]));
        assert_eq!(get(&evs[0], "block_size").as_u64(), Some(2));
        assert_eq!(get(&evs[1], "type").as_str(), Some("BlockRemoved"));
        assert_eq!(get(&evs[1], "block_hashes"), rmpv::Value::Array(vec![9u64.into()]));
    }
}
