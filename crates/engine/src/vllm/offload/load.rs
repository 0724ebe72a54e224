//! The connector's host lookup and loads: after the device prefix match, how many further
//! prompt blocks the host (or, through it, G3) holds; starting a load into reserved device
//! blocks; and a completed load becoming the request's cached prefix.

use super::*;

impl VllmEngine {
    /// Uncapped device prefix match (complete known blocks), as the host lookup sees it.
    pub(super) fn raw_g1(&self, req: &Req) -> (u32, u32) {
        let limit = ((req.len() / self.cfg.block_size) as usize).min(req.hashes.len());
        self.resident_prefix(&req.hashes.seq[..limit])
    }

    pub(super) fn host_lookup(
        &mut self,
        slot: u32,
        base_blocks: u32,
        original_g1_tokens: u32,
        now_ms: f64,
    ) -> HostLookup {
        let bs = self.cfg.block_size;
        let footprint_blocks = self.reqs[slot].len().div_ceil(bs);
        let h = self.host.as_mut().unwrap();
        let hreq = h.req(&self.reqs[slot], bs);
        match hreq.load {
            Some(Load::Activated { .. }) => return HostLookup::Miss,
            Some(Load::Loading { .. }) => return HostLookup::Deferred,
            None => {}
        }
        if let Some(t) = hreq.latest_store {
            if h.tier().is_in_flight(t) {
                return HostLookup::Deferred;
            }
            h.reqs.get_mut(&self.reqs[slot].id).unwrap().latest_store = None;
        }
        let keys = h.reqs[&self.reqs[slot].id].keys.clone();
        let base = base_blocks as usize;
        let id = self.reqs[slot].id;
        let outcome = if base >= keys.len() {
            HostLookup::Miss
        } else if h.g3.is_some() && !h.reqs[&id].restore.bypassed() && h.stage(id, &keys[base..], now_ms) {
            HostLookup::Deferred
        } else {
            let tier = h.tier();
            let (mut matched, mut deferred) = (0, false);
            for &key in &keys[base..] {
                match tier.lookup(key) {
                    Lookup::Hit => deferred |= h.load_by_key.contains_key(&key),
                    Lookup::Pending(_) => deferred = true,
                    Lookup::Miss => break,
                }
                matched += 1;
            }
            if matched == 0 {
                HostLookup::Miss
            } else if deferred {
                HostLookup::Deferred
            } else {
                HostLookup::Hit(Hit {
                    keys: keys[base..base + matched].to_vec(),
                    base_blocks,
                    original_g1_tokens,
                    footprint_blocks,
                })
            }
        };
        h.tier().touch_prompt(&keys);
        outcome
    }

    pub(super) fn start_load(&mut self, slot: u32, hit: Hit, now_ms: f64) -> StartLoad {
        let h = self.host.as_mut().unwrap();
        if hit.keys.iter().any(|k| h.load_by_key.contains_key(k)) {
            return StartLoad::Deferred;
        }
        let req = &self.reqs[slot];
        let base = hit.base_blocks as usize;
        let mut reserved = Vec::new();
        if !self.pool.allocate(&req.hashes.seq[..base], hit.keys.len() as u32, &mut reserved) {
            return StartLoad::CapacityBlocked;
        }
        let not_before = reserved[base..].iter().filter_map(|&b| h.pending_dep(b)).fold(now_ms, f64::max);
        let client = h.client();
        let Some((transfer, _)) = h.tier().schedule_load(client, req.id, &hit.keys, now_ms, not_before) else {
            self.pool.release_lease(&reserved);
            return StartLoad::Retry;
        };
        for &k in &hit.keys {
            h.load_by_key.insert(k, transfer);
        }
        if let Some(g3) = h.g3.as_mut() {
            g3.epoch += 1;
        }
        let loaded_prefix_blocks = hit.base_blocks + hit.keys.len() as u32;
        h.reqs.get_mut(&req.id).unwrap().load = Some(Load::Loading {
            transfer,
            keys: hit.keys,
            reserved,
            original_g1_tokens: hit.original_g1_tokens,
            loaded_prefix_blocks,
            footprint_blocks: hit.footprint_blocks,
        });
        StartLoad::Queued
    }

    /// A completed load: its reserved device blocks become the request's cached prefix.
    pub(super) fn activate_load(&mut self, id: u64) {
        let bs = self.cfg.block_size;
        let h = self.host.as_mut().unwrap();
        let hreq = h.reqs.get_mut(&id).expect("loading request");
        let Some(Load::Loading { keys, reserved, original_g1_tokens, loaded_prefix_blocks, footprint_blocks, .. }) =
            hreq.load.take()
        else {
            panic!("completed load without a loading request")
        };
        hreq.load = Some(Load::Activated { original_g1_tokens, loaded_prefix_blocks, footprint_blocks });
        let slot = h.members.iter().find(|&(_, &r)| r == id).map(|(&s, _)| s).expect("a loading request waits");
        let base = loaded_prefix_blocks as usize - keys.len();
        let record = self.pool.records_events();
        let mut run: Vec<StoredBlock> = Vec::new();
        let mut parent = None;
        let mut events = Vec::new();
        let req = &self.reqs[slot];
        for (b, &copy) in reserved.iter().enumerate().take(loaded_prefix_blocks as usize).skip(base) {
            let hash = req.hashes.seq[b];
            if self.pool.cache(copy, hash) {
                if run.is_empty() {
                    parent = b.checked_sub(1).map(|p| req.hashes.seq[p]);
                }
                if record && self.record_tokens {
                    let start = b as u32 * bs;
                    self.stored_tokens.extend((start..start + bs).map(|pos| req.token_at(pos)));
                }
                run.push(StoredBlock { hash, local: req.hashes.local[b] });
            } else if !run.is_empty() {
                events.push(KvEvent::Stored { parent, blocks: std::mem::take(&mut run) });
            }
        }
        if !run.is_empty() {
            events.push(KvEvent::Stored { parent, blocks: run });
        }
        for e in events {
            self.pool.push_event(e);
        }
        debug_assert!(self.reqs[slot].blocks.is_empty());
        self.reqs[slot].blocks = reserved;
    }
}
