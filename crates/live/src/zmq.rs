//! KV events on ZMQ in vLLM's wire format.
//!
//! Each rank with a port publishes on a PUB socket. A message has three frames: an empty topic,
//! the sequence number (u64, big-endian), and a msgpack payload `[timestamp, [event, ...],
//! dp_rank]`. vLLM encodes its events as msgspec structs with `array_like=True, tag=True`, so
//! an event is an array led by its tag: `["BlockStored", block_hashes, parent_block_hash,
//! token_ids, block_size, lora_id, medium]` or `["BlockRemoved", block_hashes, medium]`
//! ([`EventFormat::Vllm`], what vLLM-native consumers decode). [`EventFormat::Named`] writes the
//! same events as maps tagged by `type` (`{type, block_hashes, parent_block_hash, token_ids,
//! block_size, lora_id, group_idx}`), as Dynamo's mocker publishes them. The last 10,000 payloads
//! are kept for a ROUTER socket that replays them: a request `[identity, "", start_seq]` is
//! answered with every kept message from `start_seq` on, `[identity, "", seq, payload]`, and
//! ends with `[identity, "", -1, ""]`.

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

/// The storage tier vLLM names for blocks in GPU memory.
const MEDIUM_GPU: &str = "GPU";

/// How events are laid out in the msgpack payload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EventFormat {
    /// vLLM's own: positional arrays led by the event's tag.
    #[default]
    Vllm,
    /// Maps tagged by `type`, as Dynamo's mocker writes them.
    Named,
}

/// vLLM's layout: each variant serialises as a plain array.
#[derive(Serialize)]
#[serde(untagged)]
enum PositionalEvent {
    BlockStored(&'static str, Vec<u64>, Option<u64>, Vec<u32>, u32, Option<u32>, &'static str),
    BlockRemoved(&'static str, Vec<u64>, &'static str),
}

#[derive(Serialize)]
#[serde(tag = "type")]
enum NamedEvent {
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
pub fn encode(
    format: EventFormat,
    events: &[KvEvent],
    tokens: &[u32],
    block_size: u32,
    dp_rank: u32,
    timestamp: f64,
) -> Vec<u8> {
    // Each stored event's token ids, cut from `tokens` in order.
    let mut at = 0usize;
    let mut stored_tokens = |blocks: usize| {
        let n = blocks * block_size as usize;
        let ids = tokens.get(at..at + n).map(<[u32]>::to_vec).unwrap_or_default();
        at += n;
        ids
    };
    let encoded = match format {
        EventFormat::Vllm => {
            let wire: Vec<PositionalEvent> = events
                .iter()
                .map(|e| match e {
                    KvEvent::Stored { parent, blocks } => PositionalEvent::BlockStored(
                        "BlockStored",
                        blocks.iter().map(|b| b.hash).collect(),
                        *parent,
                        stored_tokens(blocks.len()),
                        block_size,
                        None,
                        MEDIUM_GPU,
                    ),
                    KvEvent::Removed { hashes } => {
                        PositionalEvent::BlockRemoved("BlockRemoved", hashes.clone(), MEDIUM_GPU)
                    }
                })
                .collect();
            rmp_serde::to_vec(&(timestamp, wire, dp_rank as i32))
        }
        EventFormat::Named => {
            let wire: Vec<NamedEvent> = events
                .iter()
                .map(|e| match e {
                    KvEvent::Stored { parent, blocks } => NamedEvent::BlockStored {
                        block_hashes: blocks.iter().map(|b| b.hash).collect(),
                        parent_block_hash: *parent,
                        token_ids: stored_tokens(blocks.len()),
                        block_size,
                        lora_id: None,
                        group_idx: 0,
                    },
                    KvEvent::Removed { hashes } => {
                        NamedEvent::BlockRemoved { block_hashes: hashes.clone(), group_idx: 0 }
                    }
                })
                .collect();
            rmp_serde::to_vec_named(&(timestamp, wire, dp_rank as i32))
        }
    };
    encoded.expect("KV events serialise")
}

/// The sending side of one rank's publisher (cheap to clone).
#[derive(Clone, Debug)]
pub struct Publisher {
    tx: UnboundedSender<Vec<u8>>,
    format: EventFormat,
}

impl Publisher {
    pub fn publish(&self, events: &[KvEvent], tokens: &[u32], block_size: u32, dp_rank: u32) {
        let ts = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        let _ = self.tx.send(encode(self.format, events, tokens, block_size, dp_rank, ts));
    }
}

type Ring = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

/// Binds the PUB socket (and the replay ROUTER socket) of one rank and starts their tasks.
pub async fn start(
    host: &str,
    pub_port: u16,
    replay_port: Option<u16>,
    format: EventFormat,
) -> Result<Publisher, crate::error::LiveError> {
    let mut socket = PubSocket::new();
    let endpoint = format!("tcp://{host}:{pub_port}");
    if let Err(source) = socket.bind(&endpoint).await {
        return Err(crate::error::LiveError::ZmqBind { what: "events", endpoint, source });
    }
    let ring: Ring = Arc::new(Mutex::new(VecDeque::new()));
    if let Some(port) = replay_port {
        let mut router = RouterSocket::new();
        let endpoint = format!("tcp://{host}:{port}");
        if let Err(source) = router.bind(&endpoint).await {
            return Err(crate::error::LiveError::ZmqBind { what: "replay", endpoint, source });
        }
        tokio::spawn(replay(router, ring.clone()));
    }
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(publish(socket, rx, ring));
    Ok(Publisher { tx, format })
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

    fn sample() -> Vec<KvEvent> {
        vec![
            KvEvent::Stored {
                parent: Some(7),
                blocks: vec![StoredBlock { hash: u64::MAX, local: 1 }, StoredBlock { hash: 5, local: 2 }],
            },
            KvEvent::Removed { hashes: vec![9] },
        ]
    }

    fn decode(bytes: &[u8]) -> Vec<rmpv::Value> {
        let v: rmpv::Value = rmpv::decode::read_value(&mut &bytes[..]).unwrap();
        let batch = v.as_array().unwrap().clone();
        assert_eq!(batch.len(), 3, "[timestamp, events, dp_rank]");
        assert_eq!(batch[0].as_f64(), Some(12.5));
        assert_eq!(batch[2].as_i64(), Some(3));
        batch[1].as_array().unwrap().clone()
    }

    #[test]
    fn vllm_events_are_arrays_led_by_their_tag() {
        use rmpv::Value;
        let evs = decode(&encode(EventFormat::Vllm, &sample(), &[1, 2, 3, 4], 2, 3, 12.5));
        let stored = vec![
            Value::from("BlockStored"),
            Value::Array(vec![u64::MAX.into(), 5u64.into()]),
            7u64.into(),
            Value::Array(vec![1.into(), 2.into(), 3.into(), 4.into()]),
            2u32.into(),
            Value::Nil,
            Value::from("GPU"),
        ];
        assert_eq!(evs[0], Value::Array(stored));
        let removed = vec![Value::from("BlockRemoved"), Value::Array(vec![9u64.into()]), Value::from("GPU")];
        assert_eq!(evs[1], Value::Array(removed));
    }

    #[test]
    fn named_events_are_maps_tagged_by_type() {
        let evs = decode(&encode(EventFormat::Named, &sample(), &[1, 2, 3, 4], 2, 3, 12.5));
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
