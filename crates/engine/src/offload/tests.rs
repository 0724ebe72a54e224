//! HostTier behaviour with hand-computed times.
//!
//! Blocks here are 16 MB (16 tokens of 1 MB), so at 1 GB/s one block takes 16 ms.

use super::*;
use crate::output::HostKvEvent;

const MB: u64 = 1_000_000;

fn tier(capacity: usize, d2h: f64, h2d: f64, latency: f64) -> HostTier {
    HostTier::new(HostTierConfig::new(capacity, 16, MB, d2h, h2d, latency).unwrap())
}

/// Prepare a store of `keys` at `at`, submit it there and complete it; returns its completion time.
fn store(tier: &mut HostTier, keys: &[BlockKey], at: f64) -> f64 {
    assert!(matches!(tier.prepare_store(0, 0, keys, at), StoreOutcome::Prepared { .. }));
    let [(_, done)] = tier.submit_prepared(0, at)[..] else { panic!("one store") };
    assert_eq!(tier.tick(0, done).0.len(), 1);
    done
}

#[test]
fn config_derives_block_bytes_and_rejects_bad_keys_with_the_reference_messages() {
    let ok = HostTierConfig::new(8, 64, 131_072, 32.0, 0.0, 0.5).unwrap();
    assert_eq!((ok.capacity_blocks, ok.block_bytes), (8, 8 * 1024 * 1024));
    let err = |r: Result<HostTierConfig, String>| r.unwrap_err();
    assert_eq!(
        err(HostTierConfig::new(0, 64, 1, 1.0, 1.0, 0.0)),
        "native_host_offload.num_host_blocks must be positive"
    );
    assert_eq!(
        err(HostTierConfig::new(1, 64, 1, -1.0, 1.0, 0.0)),
        "native_host_offload.d2h_bandwidth_gbps must be finite and non-negative"
    );
    assert_eq!(
        err(HostTierConfig::new(1, 64, 1, 1.0, f64::NAN, 0.0)),
        "native_host_offload.h2d_bandwidth_gbps must be finite and non-negative"
    );
    assert_eq!(
        err(HostTierConfig::new(1, 64, 1, 1.0, 1.0, f64::INFINITY)),
        "native_host_offload.latency_to_first_byte_ms must be finite and non-negative"
    );
    assert_eq!(
        err(HostTierConfig::new(1, 64, u64::MAX, 1.0, 1.0, 0.0)),
        "native_host_offload requires block_size * kv_cache_bytes_per_token to produce a positive, representable block size"
    );
    assert_eq!(
        err(HostTierConfig::new(usize::MAX, 64, 1, 1.0, 1.0, 0.0)),
        "native_host_offload capacity in bytes overflowed"
    );
    assert_eq!(
        err(HostTierConfig::new(1, 64, 1, 1e308, 1.0, 0.0)),
        "native_host_offload.d2h_bandwidth_gbps produces an unrepresentable transfer duration"
    );
}

#[test]
fn a_store_reserves_at_preparation_and_lands_after_its_copy() {
    let mut t = tier(8, 1.0, 1.0, 0.0);
    let StoreOutcome::Prepared { transfer, blocks: 4 } = t.prepare_store(0, 7, &[1, 2, 3, 4], 0.0) else { panic!() };
    // Reserved but not loadable; not on the lane until the pass boundary.
    assert_eq!(t.lookup(1), Lookup::Pending(transfer));
    assert_eq!(t.occupancy(), (0, 4));
    assert_eq!((t.completes_at(transfer), t.next_deadline(0)), (None, None));
    assert!(t.has_work(0));
    assert_eq!(t.submit_prepared(0, 40.0), [(transfer, 104.0)]); // 64 MB at 1 GB/s
    assert_eq!(t.completes_at(transfer), Some(104.0));
    assert!(t.tick(0, 103.9).0.is_empty());
    let done = t.tick(0, 104.0).0;
    assert_eq!(done, [Completed { kind: Kind::Store, transfer, request: 7, blocks: vec![1, 2, 3, 4], at_ms: 104.0 }]);
    assert_eq!(t.lookup(4), Lookup::Hit);
    assert_eq!(t.occupancy(), (4, 4));
    assert!(!t.has_work(0) && !t.is_in_flight(transfer));
    let s = t.stats();
    assert_eq!((s.stores_completed, s.blocks_stored, s.bytes_stored), (1, 4, 64 * MB));
}

#[test]
fn a_store_copies_only_the_missing_blocks_and_skips_a_present_cohort() {
    let mut t = tier(8, 1.0, 1.0, 0.0);
    store(&mut t, &[1, 2], 0.0);
    assert!(matches!(t.prepare_store(0, 0, &[1, 2, 3, 3], 100.0), StoreOutcome::Prepared { blocks: 1, .. }));
    assert_eq!(t.prepare_store(0, 0, &[1, 2, 3], 100.0), StoreOutcome::AlreadyPresent);
    assert_eq!(t.submit_prepared(0, 100.0)[0].1, 116.0);
}

#[test]
fn stores_share_one_fifo_lane() {
    // Two requests' stores submitted at one boundary: 32 MB then 16 MB at 1 GB/s.
    let mut t = tier(8, 1.0, 1.0, 2.0);
    let a = t.prepare_store(0, 0, &[1, 2], 10.0);
    let b = t.prepare_store(0, 1, &[3], 10.0);
    let (StoreOutcome::Prepared { transfer: a, .. }, StoreOutcome::Prepared { transfer: b, .. }) = (a, b) else {
        panic!()
    };
    // First byte 2 ms after the boundary; the second waits for the first.
    assert_eq!(t.submit_prepared(0, 10.0), [(a, 44.0), (b, 60.0)]);
    // A later store queues behind the tail even though its first byte is ready earlier.
    t.prepare_store(0, 2, &[4], 20.0);
    assert_eq!(t.submit_prepared(0, 20.0)[0].1, 76.0);
    assert_eq!(t.next_deadline(0), Some(44.0));
}

#[test]
fn a_full_cache_evicts_the_least_recently_used_resident_blocks() {
    let mut t = tier(4, 0.0, 0.0, 0.0);
    store(&mut t, &[1, 2], 0.0);
    store(&mut t, &[3, 4], 1.0);
    t.touch_prompt(&[1, 2]); // vLLM order: 2 then 1, so 1 is the most recent
    let StoreOutcome::Prepared { blocks: 2, .. } = t.prepare_store(0, 0, &[5, 6], 2.0) else { panic!() };
    assert_eq!([3, 4, 2, 1].map(|k| t.lookup(k) == Lookup::Hit), [false, false, true, true]);
    assert_eq!(t.stats().blocks_evicted, 2);
    // One more: the oldest resident is now 2 (5 and 6 are still being stored).
    t.prepare_store(0, 0, &[7], 2.0);
    assert_eq!(t.lookup(2), Lookup::Miss);
    assert_eq!(t.lookup(1), Lookup::Hit);
}

#[test]
fn a_completed_store_is_one_recency_epoch_ordered_by_key() {
    let mut t = tier(4, 0.0, 0.0, 0.0);
    store(&mut t, &[40, 10, 30, 20], 0.0);
    t.prepare_store(0, 0, &[50, 60], 1.0);
    // Same epoch: the smaller keys go first, whatever the cohort order.
    assert_eq!([10, 20, 30, 40].map(|k| t.lookup(k) == Lookup::Hit), [false, false, true, true]);
}

#[test]
fn blocks_being_stored_loaded_or_in_the_cohort_are_not_evicted() {
    let mut t = tier(4, 0.0, 1.0, 0.0);
    store(&mut t, &[1, 2], 0.0);
    let (load, _) = t.schedule_load(0, 9, &[1], 1.0, 1.0).unwrap(); // pins 1 until 17 ms
    t.prepare_store(0, 0, &[3], 1.0); // storing, not yet resident
                                      // Needs 2 victims beyond the 0 free: 1 is pinned, 3 is storing, 2 is in the cohort.
    assert_eq!(t.prepare_store(0, 0, &[2, 4, 5], 1.0), StoreOutcome::RetryCapacity { unfittable: false });
    assert_eq!(t.stats().capacity_retries, 1);
    assert_eq!(t.occupancy(), (2, 3)); // nothing changed
    assert_eq!(t.prepare_store(0, 0, &[1, 2, 3, 4, 5], 1.0), StoreOutcome::RetryCapacity { unfittable: true });
    // With the load done, 1 is evictable again.
    assert_eq!(t.tick(0, 17.0).0.len(), 1);
    assert!(!t.is_in_flight(load));
    assert!(matches!(t.prepare_store(0, 0, &[2, 4, 5], 17.0), StoreOutcome::Prepared { blocks: 2, .. }));
    assert_eq!(t.lookup(1), Lookup::Miss);
}

#[test]
fn a_load_needs_resident_distinct_blocks() {
    let mut t = tier(4, 1.0, 1.0, 0.0);
    store(&mut t, &[1, 2], 0.0);
    t.prepare_store(0, 0, &[3], 32.0);
    assert_eq!(t.schedule_load(0, 0, &[], 32.0, 0.0), None);
    assert_eq!(t.schedule_load(0, 0, &[1, 1], 32.0, 0.0), None);
    assert_eq!(t.schedule_load(0, 0, &[1, 3], 32.0, 0.0), None); // 3 is still being stored
    assert_eq!(t.schedule_load(0, 0, &[1, 9], 32.0, 0.0), None);
    assert!(t.schedule_load(0, 0, &[1, 2], 32.0, 0.0).is_some());
}

#[test]
fn loads_wait_for_their_fence_and_the_lane_and_the_first_byte() {
    // The fixed_d2h_fence golden: 16 MB blocks, D2H 0.1 GB/s, H2D 1 GB/s, 5 ms first byte.
    let mut t = tier(16, 0.1, 1.0, 5.0);
    t.prepare_store(0, 0, &[1, 2, 3, 4], 0.0);
    assert_eq!(t.submit_prepared(0, 40.0)[0].1, 685.0); // 40 + 5 + 64 MB / 0.1 GB/s
    t.tick(0, 685.0);
    t.prepare_store(0, 1, &[5, 6, 7, 8], 725.0);
    assert_eq!(t.submit_prepared(0, 735.0)[0].1, 1380.0);
    // A' loads 3 of A's blocks into device blocks freed by B, whose store ends at 1380.
    let (load, at) = t.schedule_load(0, 2, &[2, 3, 4], 735.0, 1380.0).unwrap();
    assert_eq!(at, Some(1433.0)); // 1380 + 5 + 48 MB / 1 GB/s
    assert_eq!(t.next_deadline(0), Some(1380.0));
    assert_eq!(t.tick(0, 1380.0).0[0].kind, Kind::Store);
    let done = t.tick(0, 1433.0).0;
    assert_eq!((done[0].kind, done[0].transfer, done[0].request), (Kind::Load, load, 2));
    let s = t.stats();
    assert_eq!((s.loads_completed, s.blocks_loaded, s.bytes_loaded), (1, 3, 48 * MB));
}

#[test]
fn loads_share_one_fifo_lane() {
    let mut t = tier(8, 0.0, 1.0, 0.0);
    store(&mut t, &[1, 2, 3], 0.0);
    assert_eq!(t.schedule_load(0, 0, &[1, 2], 0.0, 0.0).unwrap().1, Some(32.0));
    // The same block may be read by two loads at once.
    assert_eq!(t.schedule_load(0, 1, &[2, 3], 0.0, 0.0).unwrap().1, Some(64.0));
}

#[test]
fn same_instant_completions_apply_stores_before_loads() {
    let mut t = tier(8, 1.0, 1.0, 0.0);
    store(&mut t, &[1], 0.0);
    let (load, _) = t.schedule_load(0, 0, &[1], 16.0, 16.0).unwrap(); // 16 -> 32
    t.prepare_store(0, 1, &[2], 16.0);
    let [(store_id, 32.0)] = t.submit_prepared(0, 16.0)[..] else { panic!() };
    assert!(load < store_id);
    let kinds: Vec<_> = t.tick(0, 40.0).0.iter().map(|c| (c.kind, c.at_ms)).collect();
    assert_eq!(kinds, [(Kind::Store, 32.0), (Kind::Load, 32.0)]);
}

#[test]
fn a_cancelled_load_unpins_but_keeps_its_lane_time() {
    let mut t = tier(2, 0.0, 1.0, 0.0);
    store(&mut t, &[1, 2], 0.0);
    let (a, _) = t.schedule_load(0, 0, &[1], 0.0, 0.0).unwrap(); // 0 -> 16
    assert!(t.cancel_load(0, a, 5.0));
    assert!(!t.cancel_load(0, a, 5.0));
    assert_eq!(t.next_deadline(0), None);
    // The lane stays booked to 16 ms.
    assert_eq!(t.schedule_load(0, 1, &[2], 5.0, 5.0).unwrap().1, Some(32.0));
    // Block 1 is unpinned again while 2 is pinned by the new load: storing 3 evicts 1.
    assert!(matches!(t.prepare_store(0, 0, &[3], 6.0), StoreOutcome::Prepared { .. }));
    assert_eq!((t.lookup(1), t.lookup(2)), (Lookup::Miss, Lookup::Hit));
    assert_eq!(t.stats().loads_cancelled, 1);
    // A load that already completed cannot be cancelled.
    let done = t.tick(0, 32.0).0;
    assert!(!t.cancel_load(0, done[0].transfer, 32.0));
}

#[test]
fn a_finished_load_makes_its_sources_the_most_recent() {
    let mut t = tier(3, 0.0, 1.0, 0.0);
    store(&mut t, &[1], 0.0);
    store(&mut t, &[2], 0.0);
    store(&mut t, &[3], 0.0);
    t.schedule_load(0, 0, &[1], 0.0, 0.0);
    t.touch(1); // pinned: ignored
    t.tick(0, 16.0);
    // Recency now 2, 3, 1: the next store evicts 2.
    t.prepare_store(0, 0, &[4], 16.0);
    assert_eq!([1, 2, 3].map(|k| t.lookup(k) == Lookup::Hit), [true, false, true]);
}

#[test]
fn zero_bandwidth_transfers_complete_at_their_first_byte() {
    let mut t = tier(4, 0.0, 0.0, 0.0);
    t.prepare_store(0, 0, &[1], 3.0);
    assert_eq!(t.submit_prepared(0, 3.0)[0].1, 3.0);
    assert_eq!(t.tick(0, 3.0).0.len(), 1);
    assert_eq!(t.schedule_load(0, 0, &[1], 3.0, 0.0).unwrap().1, Some(3.0));
    let mut slow = tier(4, 0.0, 0.0, 0.25);
    slow.prepare_store(0, 0, &[1], 3.0);
    assert_eq!(slow.submit_prepared(0, 3.0)[0].1, 3.25);
}

#[test]
fn an_earlier_command_acts_at_the_tiers_present() {
    let mut t = tier(4, 0.0, 1.0, 0.0);
    store(&mut t, &[1], 0.0);
    t.tick(0, 50.0);
    assert_eq!(t.schedule_load(0, 0, &[1], 10.0, 0.0).unwrap().1, Some(66.0));
}

#[test]
#[should_panic(expected = "must be ticked first")]
fn a_change_past_an_unticked_completion_is_a_driver_bug() {
    let mut t = tier(4, 1.0, 1.0, 0.0);
    t.prepare_store(0, 0, &[1], 0.0);
    t.submit_prepared(0, 0.0);
    t.prepare_store(0, 0, &[2], 20.0);
}

#[test]
fn identical_inputs_give_identical_runs() {
    let run = || {
        let mut t = tier(6, 2.0, 1.5, 0.3);
        let mut log = Vec::new();
        let mut now = 0.0;
        for step in 0..40u64 {
            for c in t.tick(0, now).0 {
                log.push(format!("{:?} {} {}", c.kind, c.transfer.0, c.at_ms));
            }
            let keys: Vec<BlockKey> = (0..3).map(|i| (step * 7 + i * 3) % 11).collect();
            log.push(format!("{:?}", t.prepare_store(0, step, &keys, now)));
            if let Some((id, at)) = t.schedule_load(0, step, &keys[..1], now, now) {
                log.push(format!("load {} {}", id.0, at.expect("a private lane fixes the time")));
            }
            for (id, at) in t.submit_prepared(0, now) {
                log.push(format!("store {} {at}", id.0));
            }
            now = t.next_deadline(0).map_or(now + 1.0, |at| at.min(now + 5.0));
        }
        (log, t.stats())
    };
    assert_eq!(run(), run());
}

#[test]
fn residency_is_published_when_stores_land_and_when_blocks_are_evicted() {
    use crate::output::HostKvEvent;
    let mut t = tier(2, 1.0, 1.0, 0.0);
    store(&mut t, &[1, 2], 0.0);
    let mut events = Vec::new();
    t.drain_residency(0, &mut events);
    assert!(events.is_empty(), "nothing is recorded until the rank publishes");
    t.publish_residency(0);
    // Preparing a store of 3 evicts the oldest block (1) at once; 3 is resident when its copy
    // lands, not when it is prepared.
    assert!(matches!(t.prepare_store(0, 0, &[3], 20.0), StoreOutcome::Prepared { .. }));
    t.drain_residency(0, &mut events);
    assert_eq!(events, [HostKvEvent::Removed { hashes: vec![1] }]);
    let [(_, done)] = t.submit_prepared(0, 20.0)[..] else { panic!("one store") };
    t.tick(0, done);
    t.drain_residency(0, &mut events);
    assert_eq!(events[1..], [HostKvEvent::Stored { hashes: vec![3] }]);
    // A block that arrives from outside the device (a promotion from G3) is published when it
    // lands; a reservation rolled back publishes nothing.
    let StoreOutcome::Prepared { transfer, .. } = t.reserve_external(0, 0, &[4], 30.0) else { panic!("room") };
    t.complete_external(transfer);
    t.drain_residency(0, &mut events);
    assert_eq!(events[2..], [HostKvEvent::Removed { hashes: vec![2] }, HostKvEvent::Stored { hashes: vec![4] }]);
}

#[test]
fn held_store_sources_stay_pinned_until_released_then_become_recent_together() {
    let mut t = tier(2, 0.0, 0.0, 0.0);
    t.hold_completed_sources(0);
    store(&mut t, &[1], 0.0);
    assert_eq!(t.pins(1), 1);
    // Held, so not a victim: a second block fits, a third does not.
    store(&mut t, &[2], 0.0);
    assert_eq!(t.prepare_store(0, 0, &[3], 0.0), StoreOutcome::RetryCapacity { unfittable: false });
    t.unpin_external(&[2, 1]);
    assert_eq!(t.pins(1), 0);
    // Released in one cohort: the smaller key is the older.
    assert!(matches!(t.prepare_store(0, 0, &[3], 0.0), StoreOutcome::Prepared { .. }));
    assert_eq!((t.lookup(1), t.lookup(2)), (Lookup::Miss, Lookup::Hit));
}

#[test]
fn external_reservations_take_capacity_without_a_lane_and_complete_or_roll_back() {
    let mut t = tier(2, 1.0, 1.0, 0.0);
    store(&mut t, &[1], 0.0);
    let StoreOutcome::Prepared { transfer: a, .. } = t.reserve_external(0, 7, &[2], 100.0) else {
        panic!("free block")
    };
    assert_eq!(t.lookup(2), Lookup::Pending(a));
    assert!(t.is_in_flight(a) && t.completes_at(a).is_none() && t.next_deadline(0).is_none());
    assert!(!t.can_reserve_external_prefix(&[1, 3]), "1 is protected and 2 is pending");
    assert!(t.can_reserve_external_prefix(&[3]), "1 could be evicted");
    assert_eq!(t.lookup(1), Lookup::Hit, "the check changes nothing");
    // Reserving 3 evicts 1, the only resident block.
    let StoreOutcome::Prepared { transfer: b, .. } = t.reserve_external(0, 7, &[3], 100.0) else { panic!("evicts 1") };
    assert_eq!((t.lookup(1), t.stats().blocks_evicted), (Lookup::Miss, 1));
    t.complete_external(a);
    t.cancel_external(b);
    assert_eq!((t.lookup(2), t.lookup(3)), (Lookup::Hit, Lookup::Miss));
    assert_eq!(t.stats().stores_completed, 1, "only the seeding store copied from the device");
    assert!(!t.has_work(0));
}

/// A pool shared by two clients, each with a 1 GB/s link both ways and no first-byte latency,
/// under pool caps of `cap` GB/s.
fn shared(capacity: usize, cap: f64) -> (HostTier, usize, usize) {
    let mut t = HostTier::shared(HostTierConfig::new(capacity, 16, MB, cap, cap, 0.0).unwrap());
    let link = HostLink { d2h_gbps: 1.0, h2d_gbps: 1.0, latency_to_first_byte_ms: 0.0 };
    let (a, b) = (t.register(link), t.register(link));
    (t, a, b)
}

#[test]
fn shared_clients_split_the_pool_cap_and_get_only_their_own_completions() {
    let (mut t, a, b) = shared(16, 1.0);
    assert!(t.is_shared());
    t.prepare_store(a, 1, &[1, 2, 3, 4], 0.0);
    t.prepare_store(b, 2, &[5, 6, 7, 8], 0.0);
    // Completion times are not known when a shared transfer starts.
    assert!(t.submit_prepared(a, 0.0).is_empty() && t.submit_prepared(b, 0.0).is_empty());
    // Two 64 MB stores at half of 1 GB/s each: both end at 128 ms (alone, 64 ms).
    assert_eq!(t.next_deadline(a), Some(128.0));
    let (done, progressed) = t.tick(a, 128.0);
    assert!(progressed);
    assert_eq!(done.iter().map(|c| (c.request, c.at_ms)).collect::<Vec<_>>(), [(1, 128.0)]);
    // Both stores landed when a advanced the pool; b collects its own at its next tick, and a
    // peer's progress makes b due at once.
    assert_eq!((t.lookup(5), t.lookup(1)), (Lookup::Hit, Lookup::Hit));
    assert_eq!(t.next_deadline(b), Some(128.0));
    let (done, progressed) = t.tick(b, 128.0);
    assert!(progressed);
    assert_eq!(done.iter().map(|c| c.request).collect::<Vec<_>>(), [2]);
    assert_eq!((t.next_deadline(a), t.next_deadline(b)), (None, None));
    assert_eq!(t.stats().stores_completed, 2);
}

#[test]
fn a_client_behind_the_pool_gets_its_completion_at_its_own_time() {
    let (mut t, a, b) = shared(16, 0.0);
    t.prepare_store(b, 2, &[5], 0.0);
    t.submit_prepared(b, 0.0);
    // a advances the pool to 40 ms; b's store (16 ms alone, pool uncapped) landed at 16.
    t.tick(a, 40.0);
    assert_eq!(t.lookup(5), Lookup::Hit);
    // b, still at 10 ms, sees the progress but not a completion it has not reached.
    let (done, progressed) = t.tick(b, 10.0);
    assert!(done.is_empty() && progressed);
    let (done, progressed) = t.tick(b, 16.0);
    assert_eq!((done.len(), progressed), (1, false));
}

#[test]
fn cancelling_a_shared_load_gives_its_share_back() {
    let (mut t, a, b) = shared(16, 1.0);
    for (client, key) in [(a, 1), (b, 2)] {
        t.prepare_store(client, 0, &[key], 0.0);
        t.submit_prepared(client, 0.0);
    }
    t.tick(a, 100.0);
    t.tick(b, 100.0);
    let (la, at) = t.schedule_load(a, 1, &[1], 100.0, 100.0).unwrap();
    assert_eq!(at, None);
    t.schedule_load(b, 2, &[2], 100.0, 100.0).unwrap();
    // Sharing 1 GB/s, each 16 MB load would take 32 ms; a's is cancelled at 108 (4 MB of b's
    // moved), so b's remaining 12 MB move alone: done at 120.
    assert!(t.cancel_load(a, la, 108.0));
    assert_eq!(t.next_deadline(b), Some(120.0));
    assert_eq!(t.stats().loads_cancelled, 1);
}

#[test]
fn every_subscribed_client_of_a_shared_pool_sees_its_residency() {
    let (mut t, a, b) = shared(2, 0.0);
    t.publish_residency(a);
    t.prepare_store(a, 0, &[1], 0.0);
    t.submit_prepared(a, 0.0);
    t.tick(a, 16.0);
    // A client that subscribes later starts from a snapshot of what is resident.
    t.publish_residency(b);
    for (key, at) in [(2, 16.0), (3, 40.0)] {
        t.prepare_store(b, 0, &[key], at);
        t.submit_prepared(b, at);
        t.tick(b, at + 16.0);
    }
    let drain = |t: &mut HostTier, c| {
        let mut out = Vec::new();
        t.drain_residency(c, &mut out);
        out
    };
    let stored = |h: &[u64]| HostKvEvent::Stored { hashes: h.to_vec() };
    let removed = HostKvEvent::Removed { hashes: vec![1] };
    assert_eq!(drain(&mut t, a), [stored(&[1]), stored(&[2]), removed.clone(), stored(&[3])]);
    assert_eq!(drain(&mut t, b), [stored(&[1]), stored(&[2]), removed, stored(&[3])]);
}
