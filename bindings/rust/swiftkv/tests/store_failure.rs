//! A disk that fails in the middle of a store: the error carries the leading tokens that were
//! cached, and those come back bit-exact. Its own test binary: the failure is a file size limit,
//! which holds for the whole process.
use swiftkv::*;

extern "C" {
    fn setrlimit(resource: i32, limit: *const [u64; 2]) -> i32;
    fn signal(sig: i32, handler: usize) -> usize;
}
const RLIMIT_FSIZE: i32 = 1;
const SIGXFSZ: i32 = 25;
const SIG_IGN: usize = 1;

fn bytes_of(seed: u64, n: usize) -> Vec<u8> {
    (0..n).map(|i| (seed as usize * 31 + i * 7 + (i >> 8)) as u8).collect()
}

#[test]
fn a_failed_store_says_what_it_kept() {
    let dir = std::env::temp_dir().join(format!("swiftkv-rust-store-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ctx = Context::new(&ContextConfig {
        disk_path: Some(dir.to_str().unwrap().to_string()),
        disk_budget_bytes: 1 << 20,
        ..Default::default()
    })
    .unwrap();
    let desc = ModelDesc::new("rust-model", 2, 2, 16).chunk_tokens(32);
    let m = ctx.register_model(&desc).unwrap();
    let chunk = desc.chunk_bytes().unwrap() as usize;
    let first: Vec<u32> = (1000..1032).collect();
    assert_eq!(m.store(&first, &bytes_of(1, chunk)).unwrap(), 32);
    unsafe {
        signal(SIGXFSZ, SIG_IGN);
        assert_eq!(setrlimit(RLIMIT_FSIZE, &[32768, 32768]), 0);
    }
    let tokens: Vec<u32> = (0..8 * 32).collect();
    let kv = bytes_of(2, 8 * chunk);
    let e = m.store(&tokens, &kv).unwrap_err();
    unsafe {
        setrlimit(RLIMIT_FSIZE, &[u64::MAX, u64::MAX]);
    }
    assert_eq!(e.status, Status::EIO);
    let n = e.cached_tokens.expect("the count of what was kept");
    assert!(n > 0 && n < 8 * 32 && n % 32 == 0, "{}", n);
    assert_eq!(m.lookup(&tokens).unwrap().prefix_tokens, n);
    let mut out = vec![0u8; kv.len()];
    assert_eq!(m.retrieve(&tokens, 0, &mut out).unwrap(), n);
    let kept = n as usize / 32 * chunk;
    assert_eq!(out[..kept], kv[..kept]);
    // Bad arguments: no count.
    assert_eq!(m.store(&tokens[..3], &kv).unwrap_err().cached_tokens, None);
    drop(m);
    drop(ctx);
    std::fs::remove_dir_all(&dir).unwrap();
}
