//! The safe crate against the library: exact figures, statuses and untouched state after bad
//! input, bytes that survive the tiers, the elastic region and the coordinator, pools and the
//! connector, attention, and a context shared by threads.
use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use swiftkv::*;

fn small() -> ModelDesc {
    ModelDesc::new("rust-model", 2, 2, 16).chunk_tokens(32)
}

fn lender() -> ModelDesc {
    ModelDesc::new("rust-lender", 3, 2, 16)
}

fn kv_of(seed: u64, bytes: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..bytes)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn tokens_of(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| seed.wrapping_mul(100_003).wrapping_add(i)).collect()
}

fn ctx(host: u64) -> Context {
    Context::new(&ContextConfig { host_budget_bytes: host, ..Default::default() }).unwrap()
}

// The defaults are the library's (swiftkv_<struct>_init), the values its header documents.
#[test]
fn defaults_come_from_the_library() {
    let m = ModelDesc::new("m", 2, 4, 64);
    assert_eq!((m.block_tokens, m.chunk_tokens, m.dtype, m.device), (16, 256, DType::F16, -1));
    let c = ContextConfig::default();
    assert_eq!((c.demote_free_percent, c.maintenance_interval_ms), (25, 10));
    assert_eq!((c.coord_heartbeat_ms, c.coord_timeout_ms, c.disk_sync_ms), (100, 5000, 1000));
    assert_eq!((c.max_open_requests, c.write_back_on_close), (4096, true));
    assert_eq!(c.eviction_policy, EvictionPolicy::Retention);
    let e = ElasticConfig::new(m.clone(), None, 8);
    assert_eq!((e.window_ms, e.lease_ms, e.reclaim_deadline_ms), (60000, 10000, 30000));
    assert_eq!(e.host_granule_bytes, 0);
    assert_eq!((e.cuda_alloc, e.keep_committed), (CudaAlloc::Auto, false));
    let a = AttentionDesc::new(8, 2, 64, DType::F16);
    assert_eq!((a.page_tokens, a.causal, a.device), (16, true, -1));
}

#[test]
fn version_and_statuses() {
    assert_eq!(version(), 100);
    assert_eq!(version_string(), "0.1.0");
    assert!(Status::EINVAL.as_str().starts_with("SWIFTKV_EINVAL"));
    assert_eq!(Status::EBUSY.to_string(), Status::EBUSY.as_str());
    assert_eq!(DType::F16.size(), 2);
    assert_eq!(DType::F32.size(), 4);
    assert_eq!(DType::I8.size(), 1);
    let e = ModelDesc::new("x", 0, 1, 1).bytes_per_token().unwrap_err();
    assert_eq!(e.status, Status::EINVAL);
    assert!(e.message.contains("num_layers"), "{}", e);
    assert!(e.to_string().starts_with("SWIFTKV_EINVAL"));
    assert!(device_count().unwrap() <= 64);
}

#[test]
fn geometry_and_planning_exact() {
    let qwen = |l| ModelDesc::new("qwen3", l, 8, 128);
    assert_eq!(qwen(64).bytes_per_token().unwrap(), 262_144);
    assert_eq!(meu(&qwen(40), &qwen(36)).unwrap(), (9, 10));
    assert_eq!(lend_unit(&small(), &lender()).unwrap(), (3, 4));
    let flat = ModelDesc::new("flat", 32, 32, 128);
    let gib = 1u64 << 30;
    let p = plan_borrower(&flat, 40 * gib, &[20 * gib, 30 * gib]).unwrap();
    assert_eq!((p.lender_full_blocks, p.stream_blocks, p.regular_blocks), (6400, 6400, 4920));
    assert_eq!((p.max_context_tokens, p.baseline_context_tokens), (181_120, 81_920));
    assert_eq!(plan_scale_up(10, 16, 4, 3, 200).unwrap(), (4, 3));
    assert_eq!(plan_scale_up(10, 16, 4, 3, 100).unwrap(), (0, 0));
    assert!(plan_scale_down(10, 0, 4, 3, 100).unwrap_err().message.contains("block_tokens"));
}

#[test]
fn config_round_trip_and_errors() {
    let dir = std::env::temp_dir().join(format!("swiftkv-rust-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c = Context::new(&ContextConfig {
        host_budget_bytes: 1 << 20,
        disk_path: Some(dir.to_string_lossy().into_owned()),
        disk_budget_bytes: 1 << 20,
        eviction_policy: EvictionPolicy::Lru,
        attention_cost_table: vec![1.0, 2.0],
        coord_timeout_ms: 700,
        disk_segment_bytes: 1 << 18,
        disk_sync_ms: 250,
        transfer_threads: 3,
        max_open_requests: 7,
        write_back_on_close: false,
        coord_ucx_transports: Some("tcp".into()),
        coord_remote_path: RemotePath::Ucx,
        coord_rma_timeout_ms: 900,
        tier_order: TierOrder::HostFirst,
        ..Default::default()
    })
    .unwrap();
    let got = c.config().unwrap();
    assert_eq!((got.tier_order, ContextConfig::default().tier_order), (TierOrder::HostFirst, TierOrder::RemoteFirst));
    assert_eq!(got.coord_ucx_transports.as_deref(), Some("tcp"));
    assert_eq!((got.coord_remote_path, got.coord_rma_timeout_ms), (RemotePath::Ucx, 900));
    let d = ContextConfig::default();
    assert_eq!((d.coord_ucx_transports, d.coord_remote_path, d.coord_rma_timeout_ms), (None, RemotePath::Auto, 2000));
    assert!(!got.write_back_on_close && ContextConfig::default().write_back_on_close);
    assert_eq!((got.disk_segment_bytes, got.disk_sync_ms), (1 << 18, 250));
    assert_eq!((got.transfer_threads, got.max_open_requests), (3, 7));
    assert_eq!(ContextConfig::default().max_open_requests, 4096);
    let st = c.stats().unwrap();
    assert_eq!((st.disk_files_skipped, st.disk_bytes_allocated, st.disk_full_refusals), (0, 0, 0));
    assert_eq!(st.requests_open, 0);
    assert!(st.index_bytes > 0 && st.index_capacity_chunks > 0);
    assert_eq!(got.host_budget_bytes, 1 << 20);
    assert_eq!(got.disk_path.as_deref(), Some(dir.to_str().unwrap()));
    assert_eq!(got.eviction_policy, EvictionPolicy::Lru);
    assert_eq!(got.attention_cost_table, vec![1.0, 2.0]);
    assert_eq!((got.coord_heartbeat_ms, got.coord_timeout_ms), (100, 700));
    assert_eq!(c.device_count().unwrap(), 0);
    drop(c);
    std::fs::remove_dir_all(&dir).unwrap();
    let e = Context::new(&ContextConfig { maintenance_interval_ms: 0, ..Default::default() })
        .err()
        .unwrap();
    assert_eq!(e.status, Status::EINVAL);
    let e = Context::new(&ContextConfig { coord_endpoint: Some("udp://x".into()), ..Default::default() })
        .err()
        .unwrap();
    assert!(e.message.contains("neither ipc:// nor tcp://"));
}

#[test]
fn cache_round_trip_and_controller() {
    let c = ctx(4 << 20);
    let m = c.register_model(&small()).unwrap();
    let cb = small().chunk_bytes().unwrap() as usize;
    let t = tokens_of(1, 128);
    let kv = kv_of(1, 4 * cb);
    assert_eq!(m.store(&t, &kv).unwrap(), 128);
    let l = m.lookup(&t).unwrap();
    assert_eq!((l.chunks, l.prefix_tokens, l.chunks_per_tier), (4, 128, [0, 4, 0]));
    assert_eq!(l.residency, vec![Tier::Host; 4]);
    let mut out = vec![0u8; kv.len()];
    assert_eq!(m.retrieve(&t, 0, &mut out).unwrap(), 128);
    assert_eq!(out, kv);
    // Bad input: statuses, nothing stored.
    let e = m.store(&t[..33], &kv[..cb]).unwrap_err();
    assert_eq!(e.status, Status::EINVAL);
    assert_eq!(c.register_model(&small()).err().unwrap().status, Status::EBUSY);
    m.pin(&t).unwrap();
    assert_eq!(m.clear(Some(&t), TIERS_ALL).unwrap(), 0);
    m.unpin(&t).unwrap();
    assert_eq!(m.unpin(&t).unwrap_err().status, Status::ENOTFOUND);
    assert_eq!(m.move_to(&t, Tier::Disk).unwrap_err().status, Status::EINVAL);
    assert_eq!(m.move_to(&t, Tier::Host).unwrap(), 4);
    let s = c.stats().unwrap();
    assert_eq!((s.stores, s.chunks[1]), (4, 4));
    assert_eq!(m.clear(None, TIERS_ALL).unwrap(), 4);
    assert_eq!(c.clear_all(TIERS_ALL).unwrap(), 0);
    m.unregister().unwrap();
}

#[test]
fn lookup_reports_the_longest_run() {
    let c = ctx(4 << 20);
    let m = c.register_model(&small()).unwrap();
    let cb = small().chunk_bytes().unwrap() as usize;
    let t = tokens_of(3, 128);
    let kv = kv_of(3, 4 * cb);
    assert_eq!(m.store(&t, &kv).unwrap(), 128);
    assert_eq!(m.clear(Some(&t[..64]), TIERS_ALL).unwrap(), 2);
    assert_eq!(m.store(&t[..32], &kv[..cb]).unwrap(), 32); // chunk 1 alone is missing
    let l = m.lookup(&t).unwrap();
    assert_eq!((l.prefix_tokens, l.dropped_head_tokens, l.loadable_tokens), (32, 64, 64));
    assert_eq!(l.residency, vec![Tier::Host, Tier::Dropped, Tier::Host, Tier::Host]);
    let mut out = vec![0u8; 2 * cb];
    assert_eq!(m.retrieve(&t, 64, &mut out).unwrap(), 64);
    assert_eq!(out, kv[2 * cb..]);
}

// Chunks named by the caller: stored, found, loaded, pinned, moved and cleared by name; never
// found by the same bytes as tokens or under another identity; bad names are EINVAL.
#[test]
fn named_chunks() {
    let c = ctx(4 << 20);
    let m = c.register_model(&small()).unwrap();
    let cb = small().chunk_bytes().unwrap() as usize;
    let names: Vec<u8> = (0..3 * 16).map(|i| (i * 7 + 1) as u8).collect();
    let kv = kv_of(5, 3 * cb);
    assert_eq!(m.store_named(&names, 16, 0, &kv).unwrap(), 3);
    let l = m.lookup_named(&names, 16).unwrap();
    assert_eq!((l.chunks, l.prefix_tokens), (3, 96));
    assert_eq!(l.residency, vec![Tier::Host; 3]);
    let mut out = vec![0u8; kv.len()];
    assert_eq!(m.retrieve_named(&names, 16, &mut out).unwrap(), 3);
    assert_eq!(out, kv);
    let as_tokens: Vec<u32> =
        names.chunks(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    assert_eq!(m.lookup(&as_tokens).unwrap().prefix_tokens, 0);
    let other = c.register_model(&small().identity("tenant-b")).unwrap();
    assert_eq!(other.lookup_named(&names, 16).unwrap().prefix_tokens, 0);
    let e = m.store_named(&names[..17], 16, 0, &kv[..cb]).unwrap_err();
    assert_eq!((e.status, e.cached_chunks), (Status::EINVAL, None));
    assert_eq!(m.lookup_named(&names, 65).unwrap_err().status, Status::EINVAL);
    m.pin_named(&names[..16], 16).unwrap();
    assert_eq!(m.clear_named(&names, 16, TIERS_ALL).unwrap(), 2);
    m.unpin_named(&names[..16], 16).unwrap();
    assert_eq!(m.move_named(&names[..16], 16, Tier::Host).unwrap(), 1);
    assert_eq!(c.stats().unwrap().stores, 3);
    // The keys the chunk event callback reports: a named chunk evicted is known by its name.
    let keys = m.chunk_keys_named(&names, 16).unwrap();
    assert_eq!(keys.len(), 3);
    let small_tier = Context::new(&ContextConfig {
        host_budget_bytes: 2 * cb as u64,
        eviction_policy: EvictionPolicy::Lru,
        ..Default::default()
    })
    .unwrap();
    let s = small_tier.register_model(&small()).unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s2 = seen.clone();
    assert_eq!(s.store_named(&names[..32], 16, 0, &kv[..2 * cb]).unwrap(), 2);
    small_tier.on_chunk_event(Some(Box::new(move |e: &ChunkEvent| s2.lock().unwrap().push(e.key))))
        .unwrap();
    assert_eq!(s.store_named(&names[32..], 16, 2, &kv[2 * cb..]).unwrap(), 1);
    small_tier.on_chunk_event(None).unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![keys[0]]);
    let info = s.chunk_info_named(&names, 16).unwrap();
    assert_eq!(info.iter().map(|i| i.tier).collect::<Vec<_>>(),
               vec![Tier::Dropped, Tier::Host, Tier::Host]);
}

#[test]
fn identity_keeps_models_apart() {
    let c = ctx(4 << 20);
    let rev1 = c.register_model(&small().identity("weights-rev-1")).unwrap();
    let t = tokens_of(2, 64);
    let kv = kv_of(2, 2 * small().chunk_bytes().unwrap() as usize);
    assert_eq!(rev1.store(&t, &kv).unwrap(), 64);
    let rev2 = c.register_model(&small().identity("weights-rev-2")).unwrap();
    let none = c.register_model(&small()).unwrap();
    assert_eq!(rev1.lookup(&t).unwrap().prefix_tokens, 64);
    assert_eq!(rev2.lookup(&t).unwrap().prefix_tokens, 0);
    assert_eq!(none.lookup(&t).unwrap().prefix_tokens, 0);
    let e = c.register_model(&small().identity("weights-rev-1")).err().unwrap();
    assert_eq!(e.status, Status::EBUSY);
    assert!(e.message.contains("geometry and identity"), "{}", e.message);
    let e = c.register_model(&small().identity("a\0b")).err().unwrap();
    assert_eq!(e.status, Status::EINVAL);
    let text = c.metrics_text().unwrap();
    assert!(text.contains("\nswiftkv_stores_total 2\n"), "{}", text);
    assert!(text.contains("swiftkv_chunks{tier=\"host\"} 2\n"), "{}", text);
}

#[test]
fn events_on_eviction() {
    let cb = small().chunk_bytes().unwrap();
    let c = Context::new(&ContextConfig {
        host_budget_bytes: 4 * cb,
        eviction_policy: EvictionPolicy::Lru,
        ..Default::default()
    })
    .unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s2 = seen.clone();
    c.on_chunk_event(Some(Box::new(move |e: &ChunkEvent| s2.lock().unwrap().push(*e)))).unwrap();
    let m = c.register_model(&small()).unwrap();
    for i in 0..8 {
        m.store(&tokens_of(10 + i, 32), &kv_of(i as u64, cb as usize)).unwrap();
    }
    c.on_chunk_event(None).unwrap();
    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty());
    assert_eq!(seen.len() as u64, c.stats().unwrap().evictions);
    assert!(seen.iter().all(|e| e.to == Tier::Dropped && e.reason == 0 && e.model == m.id()));
}

#[test]
fn reclaim_deadline() {
    // A borrower that keeps renewing a lease asked back, and never releases it, loses it: the
    // lease (300 ms) is renewed to at most 100 ms after the asking, so renewing every 20 ms
    // meets ETIMEDOUT soon after the 300 ms first granted.
    let c = ctx(8 << 20);
    let mut cfg = ElasticConfig::new(lender(), Some(small()), 64);
    cfg.lease_ms = 300;
    cfg.reclaim_deadline_ms = 100;
    let e = c.elastic(&cfg).unwrap();
    let l = e.lend(1).unwrap();
    e.reclaim(l.id).unwrap();
    let mut ended = None;
    for _ in 0..250 {
        thread::sleep(Duration::from_millis(20));
        if let Err(err) = e.renew(l.id) {
            ended = Some(err.status);
            break;
        }
    }
    assert_eq!(ended, Some(Status::ETIMEDOUT));
    assert!(e.pending_reclaims().unwrap().is_empty());
    cfg.reclaim_deadline_ms = 0;
    assert_eq!(c.elastic(&cfg).err().unwrap().status, Status::EINVAL);
}

#[test]
fn host_granules() {
    // One memfd per granule of four pages: the region says so, its physical memory follows the
    // granules in use, and a granule that is not whole pages is refused.
    let c = ctx(8 << 20);
    let mut cfg = ElasticConfig::new(lender(), Some(small()), 64);
    cfg.owned_blocks = 8;
    cfg.host_granule_bytes = 16384;
    let e = c.elastic(&cfg).unwrap();
    let s = e.stats().unwrap();
    assert_eq!(s.memory_kind, sys::SWIFTKV_MEMORY_HOST_GRANULES as u32);
    let block = s.region_bytes / 64;
    assert_eq!(s.committed_bytes, (8 * block + 16383) / 16384 * 16384);
    cfg.host_granule_bytes = 16385;
    assert_eq!(c.elastic(&cfg).err().unwrap().status, Status::EINVAL);
}

#[test]
fn elastic_region_and_local_borrow() {
    let c = ctx(8 << 20);
    let mut cfg = ElasticConfig::new(lender(), Some(small()), 64);
    cfg.owned_blocks = 8;
    let e = c.elastic(&cfg).unwrap();
    let s = e.stats().unwrap();
    assert_eq!((s.capacity_blocks, s.owned_blocks, s.free_blocks), (64, 8, 56));
    assert_eq!((s.unit_lender_blocks, s.unit_borrower_chunks), (4, 3));
    assert_eq!(e.layer_view(2).unwrap().num_pages, 64);
    assert_eq!(e.layer_view(3).unwrap_err().status, Status::EINVAL);
    let l = e.lend(2).unwrap();
    assert_eq!((l.blocks, l.chunks, l.first_block), (8, 6, 56));
    e.renew(l.id).unwrap();
    let (st, grown, lost) = e.scale_for_request(64 * 16).unwrap();
    assert_eq!((st, grown, lost), (Status::IN_PROGRESS, 56, 42));
    assert_eq!(e.pending_reclaims().unwrap(), vec![l.id]);
    e.release(l.id).unwrap();
    assert_eq!(e.renew(l.id).unwrap_err().status, Status::ENOTFOUND);
    assert!(e.pending_reclaims().unwrap().is_empty());
    assert_eq!(e.tick(64).unwrap().0, Status::OK);
    // The owned part set by hand: down to 8 blocks (14 units given up), a bad count refused.
    assert_eq!(e.resize(8).unwrap(), (Status::OK, 56, 42));
    assert_eq!(e.resize(9).unwrap_err().status, Status::EINVAL);
    assert_eq!(e.stats().unwrap().owned_blocks, 8);
    assert_eq!(e.lease(l.id).unwrap_err().status, Status::ENOTFOUND);
    assert_eq!(e.offer("x").unwrap_err().status, Status::ESTATE); // no coord_endpoint
    drop(e);

    // A borrower in the same context takes a lease, the lender asks for it back.
    let m = c.register_model(&small()).unwrap();
    let mut cfg = ElasticConfig::new(lender(), Some(small()), 16);
    cfg.owned_blocks = 4;
    let e = c.elastic(&cfg).unwrap();
    m.borrow(&e, 10).unwrap();
    let cb = small().chunk_bytes().unwrap() as usize;
    let t = tokens_of(5, 9 * 32);
    let kv = kv_of(5, 9 * cb);
    m.store(&t, &kv).unwrap();
    // All nine went to the lease; the background thread may already have demoted ahead to host
    // memory until a quarter of the lease is free again (demote_free_percent 25: three chunks).
    let l = m.lookup(&t).unwrap();
    assert_eq!(l.chunks_per_tier[Tier::Peer as usize] + l.chunks_per_tier[Tier::Host as usize], 9);
    assert!(l.chunks_per_tier[Tier::Peer as usize] >= 6);
    e.reclaim(LEASE_ALL).unwrap();
    e.wait_reclaims(5000).unwrap(); // the borrower's thread answers while this one waits
    assert!(e.pending_reclaims().unwrap().is_empty());
    let mut out = vec![0u8; kv.len()];
    assert_eq!(m.retrieve(&t, 0, &mut out).unwrap(), 9 * 32);
    assert_eq!(out, kv);
}

/// The borrower asks for UCX although the lender is on this host: every byte goes over UCX's tcp
/// transport. Checks nothing more on a libswiftkv without UCX (EUNSUPPORTED).
#[test]
fn remote_lender_over_ucx() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let ep = format!("tcp://127.0.0.1:{port}");
    let tcp = || Some("tcp".to_string());
    let lc = Context::new(&ContextConfig {
        host_budget_bytes: 4 << 20,
        coord_endpoint: Some(ep.clone()),
        coord_ucx_transports: tcp(),
        ..Default::default()
    })
    .unwrap();
    let mut cfg = ElasticConfig::new(lender(), Some(small()), 32);
    cfg.owned_blocks = 8;
    let e = lc.elastic(&cfg).unwrap();
    e.offer("pool-a").unwrap();
    let bc = Context::new(&ContextConfig {
        host_budget_bytes: 4 << 20,
        demote_free_percent: 0,
        coord_ucx_transports: tcp(),
        coord_remote_path: RemotePath::Ucx,
        ..Default::default()
    })
    .unwrap();
    let m = bc.register_model(&small()).unwrap();
    match m.borrow_remote(&ep, "pool-a", 6) {
        Err(err) if err.status == Status::EUNSUPPORTED => return, // no UCX in this build
        r => r.unwrap(),
    };
    let cb = small().chunk_bytes().unwrap() as usize;
    let t = tokens_of(8, 12 * 32);
    let kv = kv_of(8, 12 * cb);
    m.store(&t, &kv).unwrap();
    // Memory of another host is the remote tier.
    let l = m.lookup(&t).unwrap();
    assert_eq!((l.remote_chunks, l.chunks_per_tier[Tier::Peer as usize]), (12, 0));
    assert!(l.residency.iter().all(|&r| r == Tier::Remote));
    assert_eq!(bc.stats().unwrap().remote_chunks, 12);
    let mut out = vec![0u8; kv.len()];
    assert_eq!(m.retrieve(&t, 0, &mut out).unwrap(), 12 * 32);
    assert_eq!(out, kv);
    let cs = bc.coord_stats().unwrap();
    assert_eq!((cs.remote_lenders, cs.rma_batches_failed), (1, 0));
    assert_eq!((cs.rma_bytes_written, cs.rma_bytes_read), ((12 * cb) as u64, (12 * cb) as u64));
    assert_eq!(lc.coord_stats().unwrap().remote_sessions, 1);
}

#[test]
fn remote_lender_through_the_coordinator() {
    let ep = format!("ipc:///tmp/swiftkv-rust-{}-lender", std::process::id());
    let lc = Context::new(&ContextConfig {
        host_budget_bytes: 4 << 20,
        coord_endpoint: Some(ep.clone()),
        coord_heartbeat_ms: 20,
        ..Default::default()
    })
    .unwrap();
    let mut cfg = ElasticConfig::new(lender(), Some(small()), 32);
    cfg.owned_blocks = 8;
    let e = lc.elastic(&cfg).unwrap();
    e.offer("pool-a").unwrap();
    let bc = Context::new(&ContextConfig {
        host_budget_bytes: 4 << 20,
        coord_heartbeat_ms: 20,
        demote_free_percent: 0,
        ..Default::default()
    })
    .unwrap();
    let m = bc.register_model(&small()).unwrap();
    let lease = m.borrow_remote(&ep, "pool-a", 6).unwrap();
    assert_eq!(e.lease(lease).unwrap().blocks, 24);
    let cb = small().chunk_bytes().unwrap() as usize;
    let t = tokens_of(6, 12 * 32);
    let kv = kv_of(6, 12 * cb);
    m.store(&t, &kv).unwrap();
    assert_eq!(m.lookup(&t).unwrap().chunks_per_tier[0], 12);
    // A heartbeat goes every 20 ms; on a loaded machine its answer may take a while.
    for _ in 0..5000 {
        if bc.coord_stats().unwrap().heartbeats_answered > 0 {
            break;
        }
        thread::sleep(Duration::from_millis(1));
    }
    let cs = bc.coord_stats().unwrap();
    assert!(cs.heartbeats_answered > 0 && cs.lenders_connected == 1);
    let (st, _, _) = e.scale_for_request(32 * 16).unwrap();
    assert_eq!(st, Status::IN_PROGRESS);
    for _ in 0..5000 {
        if e.stats().unwrap().reclaiming_blocks == 0 {
            break;
        }
        thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(e.stats().unwrap().reclaiming_blocks, 0);
    assert_eq!(lc.coord_stats().unwrap().reclaims_acked, 1);
    let mut out = vec![0u8; kv.len()];
    assert_eq!(m.retrieve(&t, 0, &mut out).unwrap(), 12 * 32);
    assert_eq!(out, kv);
    assert_eq!(m.borrow_remote(&ep, "nobody", 1).unwrap_err().status, Status::ENOTFOUND);
    assert_eq!(m.borrow_remote("udp://x", "a", 1).unwrap_err().status, Status::EINVAL);
}

#[test]
fn pools_and_the_connector() {
    let c = ctx(4 << 20);
    let m = c.register_model(&small()).unwrap();
    // Library-made pool with stream pages: their memory is shared by every layer.
    let pool = m.pool_create(8, 2).unwrap();
    let lay = pool.layout().unwrap();
    assert_eq!(lay.stream_pages, 2);
    let elem = |layer: usize, page: i64| unsafe {
        (lay.layer_base[layer] as *mut u16).offset((page * lay.page_stride) as isize)
    };
    unsafe {
        *elem(0, lay.stream_first as i64) = 7;
        assert_eq!(*elem(1, lay.stream_first as i64), 7);
    }
    drop(pool);

    // The engine's own tensors, vLLM's [2, pages, B, H, D] per layer, in f16 bits.
    let pages_n = 8usize;
    let page = 16 * 2 * 16;
    let mut layers: Vec<Vec<u16>> = (0..2).map(|_| vec![0u16; 2 * pages_n * page]).collect();
    let layout = PoolLayout {
        num_pages: pages_n as u32,
        stream_first: 0,
        stream_pages: 0,
        layer_base: layers.iter_mut().map(|l| l.as_mut_ptr() as *mut c_void).collect(),
        layer_span_bytes: (2 * pages_n * page * 2) as u64,
        page_stride: page as i64,
        kv_stride: (pages_n * page) as i64,
        token_stride: 32,
        head_stride: 16,
    };
    let pool = unsafe { m.pool_register(&layout).unwrap() };
    let tokens = tokens_of(7, 96);
    let pages = [5i32, 1, 7, 0, 3, 2];
    let value = |l: usize, c: usize, tok: usize, i: usize| (l * 7919 + c * 104_729 + tok * 97 + i) as u16;
    let at = |c: usize, p: i32, off: usize| c * pages_n * page + p as usize * page + off;
    // First request: nothing cached; the engine computes and saves every layer.
    {
        let r = m.request(&pool, &tokens, &pages, 0).unwrap();
        r.start_load(Stream::HOST).unwrap();
        for l in 0..2u32 {
            assert_eq!(r.wait_layer_load(l, Stream::HOST).unwrap(), 0);
            for tok in 0..96 {
                for c in 0..2 {
                    for i in 0..32 {
                        layers[l as usize][at(c, pages[tok / 16], (tok % 16) * 32 + i)] =
                            value(l as usize, c, tok, i);
                    }
                }
            }
            r.save_layer(l, Stream::HOST).unwrap();
        }
        assert_eq!(r.wait_save(Stream::HOST).unwrap(), 96);
        assert_eq!(r.finish().unwrap().saved_tokens, 96);
    }
    for l in layers.iter_mut() {
        l.iter_mut().for_each(|x| *x = 0);
    }
    // Second request, other pages: everything loads.
    let pages2 = [4i32, 6, 0, 1, 2, 3];
    let r = m.request(&pool, &tokens, &pages2, 0).unwrap();
    r.start_load(Stream::HOST).unwrap();
    for l in 0..2u32 {
        assert_eq!(r.wait_layer_load(l, Stream::HOST).unwrap(), 96);
        r.save_layer(l, Stream::HOST).unwrap();
    }
    r.wait_save(Stream::HOST).unwrap();
    assert_eq!(r.info().unwrap().load_end_tokens, 96);
    drop(r);
    for l in 0..2 {
        for tok in 0..96 {
            for c in 0..2 {
                for i in 0..32 {
                    assert_eq!(layers[l][at(c, pages2[tok / 16], (tok % 16) * 32 + i)],
                               value(l, c, tok, i));
                }
            }
        }
    }
    // The other shapes: save-only stores what pages2 holds under other tokens; load-only
    // brings it back into the first pages, saving nothing.
    let tokens2 = tokens_of(8, 96);
    let r = m.request_shaped(&pool, &tokens2, &pages2, 0, RequestShape::SaveOnly).unwrap();
    assert_eq!(r.start_load(Stream::HOST).unwrap_err().status, Status::ESTATE);
    for l in 0..2u32 {
        r.save_layer(l, Stream::HOST).unwrap();
    }
    assert_eq!(r.wait_save(Stream::HOST).unwrap(), 96);
    drop(r);
    for l in layers.iter_mut() {
        l.iter_mut().for_each(|x| *x = 0);
    }
    let r = m.request_shaped(&pool, &tokens2, &pages, 0, RequestShape::LoadOnly).unwrap();
    r.start_load(Stream::HOST).unwrap();
    for l in 0..2u32 {
        assert_eq!(r.wait_layer_load(l, Stream::HOST).unwrap(), 96);
    }
    assert_eq!(r.save_layer(0, Stream::HOST).unwrap_err().status, Status::ESTATE);
    assert_eq!(r.info().unwrap().save_tokens, 0);
    drop(r);
    for l in 0..2 {
        for tok in 0..96 {
            for c in 0..2 {
                for i in 0..32 {
                    assert_eq!(layers[l][at(c, pages[tok / 16], (tok % 16) * 32 + i)],
                               value(l, c, tok, i));
                }
            }
        }
    }
    // Chunks named by the caller: saved from the first pages under names (no tokens), loaded
    // back by the names into pages2, byte for byte; other names load nothing.
    let names: Vec<u8> = (0..3 * 32).map(|i| (i * 13 + 5) as u8).collect();
    let r = m.request_named(&pool, 96, &names, 32, &pages, 0, RequestShape::SaveOnly).unwrap();
    for l in 0..2u32 {
        r.save_layer(l, Stream::HOST).unwrap();
    }
    assert_eq!(r.wait_save(Stream::HOST).unwrap(), 96);
    drop(r);
    assert_eq!(m.lookup_named(&names, 32).unwrap().prefix_tokens, 96);
    for l in layers.iter_mut() {
        l.iter_mut().for_each(|x| *x = 0);
    }
    let r = m.request_named(&pool, 96, &names, 32, &pages2, 0, RequestShape::LoadOnly).unwrap();
    r.start_load(Stream::HOST).unwrap();
    for l in 0..2u32 {
        assert_eq!(r.wait_layer_load(l, Stream::HOST).unwrap(), 96);
    }
    drop(r);
    for l in 0..2 {
        for tok in 0..96 {
            for c in 0..2 {
                for i in 0..32 {
                    assert_eq!(layers[l][at(c, pages2[tok / 16], (tok % 16) * 32 + i)],
                               value(l, c, tok, i));
                }
            }
        }
    }
    let other = vec![9u8; 3 * 32];
    let r = m.request_named(&pool, 96, &other, 32, &pages2, 0, RequestShape::LoadOnly).unwrap();
    assert_eq!(r.info().unwrap().load_end_tokens, 0);
    drop(r);
    assert_eq!(m.request_named(&pool, 96, &names[..64], 32, &pages2, 0, RequestShape::LoadOnly)
                   .err().unwrap().status, Status::EINVAL);
    // An engine holding the first block itself (its own prefix cache) loads from token 16,
    // inside the first chunk: its block is left as it is, the rest arrives.
    for l in layers.iter_mut() {
        l.iter_mut().for_each(|x| *x = 0);
    }
    let r = m.request_shaped(&pool, &tokens, &pages2, 16, RequestShape::LoadOnly).unwrap();
    r.start_load(Stream::HOST).unwrap();
    for l in 0..2u32 {
        assert_eq!(r.wait_layer_load(l, Stream::HOST).unwrap(), 96);
    }
    assert_eq!(r.info().unwrap().load_begin_tokens, 16);
    drop(r);
    for l in 0..2 {
        for tok in 0..96 {
            for c in 0..2 {
                for i in 0..32 {
                    let want = if tok < 16 { 0 } else { value(l, c, tok, i) };
                    assert_eq!(layers[l][at(c, pages2[tok / 16], (tok % 16) * 32 + i)], want);
                }
            }
        }
    }
    // Bad requests leave nothing behind: a page named twice, a start inside a block.
    assert_eq!(m.request(&pool, &tokens[..64], &[0, 0, 1, 2], 0).err().unwrap().status,
               Status::EINVAL);
    assert_eq!(m.request(&pool, &tokens[..64], &[0, 1, 2, 3], 8).err().unwrap().status,
               Status::EINVAL);
    assert_eq!(c.stats().unwrap().requests_open, 0);
    let r = m.request(&pool, &tokens[..32], &[0, 1], 0).unwrap();
    assert_eq!(r.wait_layer_load(0, Stream::HOST).unwrap_err().status, Status::ESTATE);
}

// The batch hooks: two requests of one step saved, then loaded into other pages, every element
// checked; a bad batch (one request not started, one named twice, two contexts) changes nothing.
#[test]
fn batch_hooks() {
    let c = ctx(4 << 20);
    let m = c.register_model(&small()).unwrap();
    let pool = m.pool_create(12, 0).unwrap();
    let lay = pool.layout().unwrap();
    let elem = |l: usize, p: i32, kv: i64, t: i64, i: i64| unsafe {
        (lay.layer_base[l] as *mut u16)
            .offset((p as i64 * lay.page_stride + kv * lay.kv_stride + t * lay.token_stride + i) as isize)
    };
    let value = |seq: usize, l: usize, kv: i64, tok: usize, i: i64| {
        (seq * 31 + l * 7919 + kv as usize * 104_729 + tok * 97 + i as usize) as u16
    };
    let toks = [tokens_of(31, 64), tokens_of(32, 64)];
    let step = |pages: &[[i32; 4]; 2], write: bool| -> Vec<Vec<u64>> {
        let rs: Vec<Request<'_>> =
            (0..2).map(|i| m.request(&pool, &toks[i], &pages[i], 0).unwrap()).collect();
        for r in &rs {
            r.start_load(Stream::HOST).unwrap();
        }
        let batch: Vec<&Request<'_>> = rs.iter().collect();
        let mut valid = Vec::new();
        for l in 0..2u32 {
            valid.push(wait_layer_load_batch(&batch, l, Stream::HOST).unwrap());
            for (seq, p) in pages.iter().enumerate() {
                for tok in 0..64 {
                    for kv in 0..2 {
                        for i in 0..32 {
                            let at = elem(l as usize, p[tok / 16], kv, (tok % 16) as i64, i);
                            if write {
                                unsafe { *at = value(seq, l as usize, kv, tok, i) };
                            } else {
                                assert_eq!(unsafe { *at }, value(seq, l as usize, kv, tok, i));
                            }
                        }
                    }
                }
            }
            save_layer_batch(&batch, l, Stream::HOST).unwrap();
        }
        for r in rs {
            assert_eq!(r.wait_save(Stream::HOST).unwrap(), if write { 64 } else { 0 });
        }
        valid
    };
    assert_eq!(step(&[[0, 1, 2, 3], [4, 5, 6, 7]], true), vec![vec![0, 0]; 2]);
    assert_eq!(step(&[[9, 2, 7, 4], [0, 11, 3, 8]], false), vec![vec![64, 64]; 2]);

    let a = m.request(&pool, &toks[0], &[0, 1, 2, 3], 0).unwrap();
    let b = m.request(&pool, &toks[1], &[4, 5, 6, 7], 0).unwrap();
    a.start_load(Stream::HOST).unwrap();
    let e = wait_layer_load_batch(&[&a, &b], 0, Stream::HOST).unwrap_err();
    assert_eq!(e.status, Status::ESTATE);
    assert!(e.message.contains("before start_load"), "{}", e.message);
    assert_eq!(a.info().unwrap().layers_loaded, 0);
    let e = wait_layer_load_batch(&[&a, &a], 0, Stream::HOST).unwrap_err();
    assert_eq!(e.status, Status::EINVAL);
    assert!(e.message.contains("named twice"), "{}", e.message);
    let c2 = ctx(1 << 20);
    let m2 = c2.register_model(&small()).unwrap();
    let pool2 = m2.pool_create(4, 0).unwrap();
    let other = m2.request(&pool2, &toks[0], &[0, 1, 2, 3], 0).unwrap();
    other.start_load(Stream::HOST).unwrap();
    assert_eq!(wait_layer_load_batch(&[&a, &other], 0, Stream::HOST).unwrap_err().status,
               Status::EINVAL);
    assert_eq!(a.info().unwrap().layers_loaded, 0);
    b.start_load(Stream::HOST).unwrap();
    assert_eq!(wait_layer_load_batch(&[&a, &b], 0, Stream::HOST).unwrap(), vec![64, 64]);
    assert!(wait_layer_load_batch(&[], 0, Stream::HOST).unwrap().is_empty());
    save_layer_batch(&[&b, &a], 0, Stream::HOST).unwrap();
    assert_eq!(b.info().unwrap().layers_saved, 1);
}

#[test]
fn open_requests_are_bounded() {
    let c = Context::new(&ContextConfig {
        host_budget_bytes: 4 << 20,
        max_open_requests: 1,
        ..Default::default()
    })
    .unwrap();
    let m = c.register_model(&small()).unwrap();
    let pool = m.pool_create(4, 0).unwrap();
    let r = m.request(&pool, &tokens_of(1, 32), &[0, 1], 0).unwrap();
    let e = m.request(&pool, &tokens_of(2, 32), &[2, 3], 0).err().unwrap();
    assert_eq!(e.status, Status::EBUSY);
    assert!(e.message.contains("max_open_requests"), "{}", e.message);
    assert_eq!(c.stats().unwrap().requests_open, 1);
    drop(r);
    let r = m.request(&pool, &tokens_of(2, 32), &[2, 3], 0).unwrap();
    drop(r);
    assert_eq!(c.stats().unwrap().requests_open, 0);
}

#[test]
fn attention_on_the_host() {
    let desc = AttentionDesc::new(4, 2, 64, DType::F32);
    let n_pages = 4usize;
    let (page_tokens, hk, d) = (16usize, 2usize, 64usize);
    let kv_len = 16 + 5;
    let pages = [3i32, 1];
    let k: Vec<f32> = (0..n_pages * page_tokens * hk * d).map(|i| ((i * 37 % 101) as f32) / 101.0 - 0.5).collect();
    let v: Vec<f32> = (0..k.len()).map(|i| ((i * 53 % 89) as f32) / 89.0 - 0.5).collect();
    let t = 3usize;
    let q: Vec<f32> = (0..t * 4 * d).map(|i| ((i * 29 % 71) as f32) / 71.0 - 0.5).collect();
    let bytes = desc.workspace_size(1, t as u64).unwrap() as usize;
    let mut raw = vec![0u8; bytes + 256];
    let off = (256 - raw.as_ptr() as usize % 256) % 256;
    let ws = unsafe { raw.as_mut_ptr().add(off) } as *mut c_void;
    let plan = unsafe {
        AttentionPlan::new(&desc, &[0, t as i32], &[0, 2], &[5], ws, bytes as u64, Stream::HOST)
    }
    .unwrap();
    assert_eq!(plan.counts().kv_tokens, kv_len as u64);
    let mut out = vec![0f32; q.len()];
    let args = AttentionArgs {
        q: q.as_ptr() as *const c_void,
        q_token_stride: (4 * d) as i64,
        q_head_stride: d as i64,
        k_base: k.as_ptr() as *const c_void,
        v_base: v.as_ptr() as *const c_void,
        page_stride: (page_tokens * hk * d) as i64,
        token_stride: (hk * d) as i64,
        head_stride: d as i64,
        num_pages: n_pages as u32,
        kv_indices: pages.as_ptr(),
        out: out.as_mut_ptr() as *mut c_void,
        out_token_stride: (4 * d) as i64,
        out_head_stride: d as i64,
        lse: ptr::null_mut(),
    };
    unsafe { plan.run(&args, ws, Stream::HOST) }.unwrap();
    // A naive causal reference in f64.
    let kv_at = |base: &Vec<f32>, tok: usize, h: usize, i: usize| {
        let p = pages[tok / page_tokens] as usize;
        base[((p * page_tokens + tok % page_tokens) * hk + h) * d + i] as f64
    };
    let mut worst = 0f64;
    for qi in 0..t {
        let limit = kv_len - t + qi + 1;
        for h in 0..4 {
            let kh = h / 2;
            let s: Vec<f64> = (0..limit)
                .map(|j| (0..d).map(|i| q[(qi * 4 + h) * d + i] as f64 * kv_at(&k, j, kh, i)).sum::<f64>() / 8.0)
                .collect();
            let mx = s.iter().cloned().fold(f64::MIN, f64::max);
            let w: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
            let z: f64 = w.iter().sum();
            for i in 0..d {
                let want: f64 = (0..limit).map(|j| w[j] / z * kv_at(&v, j, kh, i)).sum();
                worst = worst.max((out[(qi * 4 + h) * d + i] as f64 - want).abs());
            }
        }
    }
    assert!(worst < 1e-5, "max error {}", worst);
    let bad = [3i32, 9];
    let args_bad = AttentionArgs { kv_indices: bad.as_ptr(), ..args };
    assert_eq!(unsafe { plan.run(&args_bad, ws, Stream::HOST) }.unwrap_err().status, Status::EINVAL);
}

#[test]
fn one_context_many_threads() {
    let c = Arc::new(ctx(16 << 20));
    let cb = small().chunk_bytes().unwrap() as usize;
    let m_id = c.register_model(&small()).unwrap().id();
    let _ = m_id;
    let handles: Vec<_> = (0..4u32)
        .map(|i| {
            let c = c.clone();
            thread::spawn(move || {
                let m = c.register_model(&ModelDesc::new(&format!("t{}", i), 2, 2, 16).chunk_tokens(32)).unwrap();
                for round in 0..20u32 {
                    let t = tokens_of(i * 1000 + round, 64);
                    let kv = kv_of((i * 1000 + round) as u64, 2 * cb);
                    assert_eq!(m.store(&t, &kv).unwrap(), 64);
                    let mut out = vec![0u8; kv.len()];
                    assert_eq!(m.retrieve(&t, 0, &mut out).unwrap(), 64);
                    assert_eq!(out, kv);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(c.stats().unwrap().stores, 4 * 20 * 2);
}

// f16 values in [0.5, 1): finite, as a codec's input must be.
fn halves_of(seed: u64, bytes: usize) -> Vec<u8> {
    kv_of(seed, bytes / 2)
        .iter()
        .enumerate()
        .flat_map(|(i, b)| (0x3800u16 + ((u16::from(*b) << 2) ^ (i as u16 & 3))).to_le_bytes())
        .collect()
}

// Compression: a fixed host codec encodes what is stored, a lossy chunk is refused until the
// model accepts it, compress re-encodes in place, bad parameters change nothing.
#[test]
fn compression_fixed_lossy_and_compress() {
    let c = ctx(1 << 20);
    let m = c.register_model(&small()).unwrap();
    let chunk = small().chunk_bytes().unwrap() as usize;
    let t = tokens_of(21, 64);
    let kv = halves_of(21, 2 * chunk);
    let bad = Compression { host: Codec::Kivi { bits: 3, group: 32 }, ..Default::default() };
    assert_eq!(m.set_compression(&bad).unwrap_err().status, Status::EINVAL);
    // A lossy codec for a model that takes exact bytes only: chunks it could never load.
    let exact_only = Compression { host: Codec::Fp8, ..Default::default() };
    assert_eq!(m.set_compression(&exact_only).unwrap_err().status, Status::EINVAL);
    m.set_compression(&Compression { accept_lossy: true, host: Codec::Fp8, ..Default::default() })
        .unwrap();
    assert_eq!(m.store(&t, &kv).unwrap(), 64);
    let info = m.chunk_info(&t).unwrap();
    assert_eq!(info.len(), 2);
    assert_eq!((info[0].tier, info[0].codec, info[0].lossy), (Tier::Host, Some(Codec::Fp8), true));
    assert!(info[0].stored_bytes < chunk as u64);
    let s = c.codec_stats().unwrap();
    assert_eq!(s.chunks[3][1], 2);
    assert_eq!(s.raw_bytes[3][1], 2 * chunk as u64);

    let mut out = vec![0u8; 2 * chunk];
    m.set_compression(&Compression::default()).unwrap(); // exact bytes again
    assert_eq!(m.retrieve(&t, 0, &mut out).unwrap(), 0); // the lossy chunks stay, refused
    assert_eq!(c.codec_stats().unwrap().lossy_refused, 1);
    m.set_compression(&Compression { accept_lossy: true, host: Codec::Fp8, ..Default::default() })
        .unwrap();
    assert_eq!(m.retrieve(&t, 0, &mut out).unwrap(), 64);
    assert_ne!(out, kv);

    let e = m.compress(&t, Codec::Kivi { bits: 5, group: 32 }).unwrap_err();
    assert_eq!(e.status, Status::EINVAL);
    assert_eq!(m.chunk_info(&t).unwrap()[1].codec, Some(Codec::Fp8));
    let missing = tokens_of(22, 32);
    assert_eq!(m.compress(&missing, Codec::Raw).unwrap_err().status, Status::ENOTFOUND);
    assert_eq!(m.compress(&t, Codec::Kivi { bits: 4, group: 32 }).unwrap(), 2);
    let info = m.chunk_info(&t).unwrap();
    assert_eq!(info[1].codec, Some(Codec::Kivi { bits: 4, group: 32 }));
    assert!(info[1].lossy);
}

// Adaptive mode: exact while quality is worth the most, compressed by the policy once it is
// worth nothing; bad parameters are EINVAL with nothing changed; the policy chooses only in
// adaptive mode.
#[test]
fn compression_adaptive_policy() {
    let c = ctx(1 << 20);
    let m = c.register_model(&small()).unwrap();
    let chunk = small().chunk_bytes().unwrap() as usize;
    let t = tokens_of(23, 64);
    let kv = halves_of(23, 2 * chunk);
    assert_eq!(m.compress_by_policy(&t).unwrap_err().status, Status::EINVAL);
    let k4 = Codec::Kivi { bits: 4, group: 8 };
    let gpu = Method { codec: k4, quality: None, decode_gbps: Some(1e6) };
    let mut a = Adaptive { alpha: 1e6, methods: vec![gpu], ..Default::default() };
    assert_eq!(Adaptive::default().alpha, 1.0);
    let lossy_refused = Compression { adaptive: Some(a.clone()), ..Default::default() };
    assert_eq!(m.set_compression(&lossy_refused).unwrap_err().status, Status::EINVAL);
    let both = Compression {
        accept_lossy: true,
        host: Codec::Fp8,
        adaptive: Some(a.clone()),
        ..Default::default()
    };
    assert_eq!(m.set_compression(&both).unwrap_err().status, Status::EINVAL);
    let too_many = Adaptive { methods: vec![Method::measured(Codec::Fp8); 9], ..a.clone() };
    let cfg = Compression { accept_lossy: true, adaptive: Some(too_many), ..Default::default() };
    assert_eq!(m.set_compression(&cfg).unwrap_err().status, Status::EINVAL);

    let cfg = Compression { accept_lossy: true, adaptive: Some(a.clone()), ..Default::default() };
    m.set_compression(&cfg).unwrap();
    assert_eq!(m.store(&t, &kv).unwrap(), 64);
    assert!(m.chunk_info(&t).unwrap().iter().all(|i| i.codec == Some(Codec::Raw)));
    a.alpha = 0.0;
    m.set_compression(&Compression { accept_lossy: true, adaptive: Some(a), ..Default::default() })
        .unwrap();
    assert_eq!(m.compress_by_policy(&t).unwrap(), 2);
    for i in m.chunk_info(&t).unwrap() {
        assert_eq!((i.codec, i.lossy), (Some(k4), true));
        assert!(i.stored_bytes < chunk as u64);
    }
}

// fork() with a live context: in the child every call is ESTATE naming the fork and dropping the
// context releases nothing; the parent's chunks stay right. Before, the child's stores went over
// the parent's newest chunks in the shared host slabs.
extern "C" {
    fn fork() -> i32;
    fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
    fn _exit(code: i32) -> !;
}

#[test]
fn a_fork_cannot_use_the_parents_context() {
    let c = ctx(4 << 20);
    let m = c.register_model(&small()).unwrap();
    let cb = small().chunk_bytes().unwrap() as usize;
    let t = tokens_of(5, 128);
    let kv = kv_of(5, 4 * cb);
    assert_eq!(m.store(&t, &kv).unwrap(), 128);
    let pid = unsafe { fork() };
    if pid == 0 {
        // The child: exit codes say what went wrong (no panics across the fork).
        let refused = |r: std::result::Result<u64, Error>| match r {
            Err(e) => e.status == Status::ESTATE && e.message.contains("a fork of it"),
            Ok(_) => false,
        };
        let theirs = tokens_of(6, 64);
        let code = if !refused(m.store(&theirs, &kv_of(6, 2 * cb))) {
            10
        } else if !refused(m.retrieve(&t, 0, &mut vec![0u8; kv.len()])) {
            11
        } else if c.config().err().map(|e| e.status) != Some(Status::ESTATE) {
            12
        } else {
            drop(m);
            drop(c); // releases nothing, and returns
            0
        };
        unsafe { _exit(code) };
    }
    assert!(pid > 0);
    let mut status = 0;
    assert_eq!(unsafe { waitpid(pid, &mut status, 0) }, pid);
    assert_eq!(status, 0, "the child's wait status");
    let mut out = vec![0u8; kv.len()];
    assert_eq!(m.retrieve(&t, 0, &mut out).unwrap(), 128);
    assert_eq!(out, kv);
    assert_eq!(m.lookup(&tokens_of(6, 64)).unwrap().prefix_tokens, 0);
}
