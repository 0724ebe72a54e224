//! What several readers share: the furthest time the virtual clock resolves, and the numbering
//! of trace hash ids as prompt tokens.

use std::sync::Arc;

use rustc_hash::FxHashMap;

/// Times on the run's clock, trace timestamps, delays and `not_before_ms` may reach 2^43 ms
/// (about 278 years; Unix-epoch milliseconds fit). Virtual time is an `f64` of milliseconds,
/// which below 2^43 resolves better than a microsecond (2^-10 ms); past it latencies are
/// quantised (at 1e13 ms a 18.023974 ms TTFT reads 18.0234375), and such values are nearly
/// always microseconds or nanoseconds written as milliseconds.
pub const MAX_TIME_MS: f64 = 8_796_093_022_208.0;

/// Hash ids as prompt tokens. The reference always interns ids into compact ids in first-seen
/// order (the first new id is 0, the next 1, ...), and the ids become the prompt's tokens, so
/// block hashes, and the orders that break ties by hash (the host cache's LRU), depend on that
/// numbering. A trace already numbered that way (the public Mooncake traces are) is used as it
/// is, with no map; any other is interned as the reference does, and so is one whose ids do not
/// fit in 32 bits, so distinct ids never alias.
pub enum Ids {
    Verbatim,
    Interned(FxHashMap<u64, u32>),
}

impl Ids {
    pub fn new(interned: bool) -> Ids {
        if interned {
            Ids::Interned(FxHashMap::default())
        } else {
            Ids::Verbatim
        }
    }

    /// The first `reached` of a row's ids as tokens; an interned trace numbers all of them, in
    /// order, as the reference does (ids past the prompt still take their number).
    pub fn blocks(&mut self, ids: &[u64], reached: usize) -> Result<Arc<[u32]>, String> {
        let reached = reached.min(ids.len());
        match self {
            Ids::Verbatim => Ok(ids[..reached].iter().map(|&h| h as u32).collect()),
            Ids::Interned(map) => {
                let mut blocks = Vec::with_capacity(reached);
                for (i, &h) in ids.iter().enumerate() {
                    let next = map.len();
                    let v = match map.get(&h) {
                        Some(&v) => v,
                        None => {
                            let v = u32::try_from(next)
                                .map_err(|_| "the trace has more unique hash ids than 2^32".to_string())?;
                            map.insert(h, v);
                            v
                        }
                    };
                    if i < reached {
                        blocks.push(v);
                    }
                }
                Ok(blocks.into())
            }
        }
    }
}
