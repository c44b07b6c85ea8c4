//! Safe Rust interface to libswiftkv, the KV-cache memory layer that lets co-located LLMs share
//! KV memory: a lender's elastic region, a borrower's chunk cache over peer, host and disk
//! tiers, per-layer loads and saves into an engine's own pages, and multi-token paged attention.
//!
//! Every call returns `Result<T, Error>`; an `Error` carries the library's status and its
//! message. Handles end their C object when dropped (`Context`, `Elastic`, `Pool`, `Request`);
//! what borrows a context cannot outlive it. `Context` and `Elastic` are `Send + Sync` because
//! the C API makes every call on them thread-safe; `Request` is `Send` only.
//!
//! ```no_run
//! use swiftkv::{Context, ContextConfig, ModelDesc};
//! let ctx = Context::new(&ContextConfig { host_budget_bytes: 64 << 20, ..Default::default() })?;
//! let model = ctx.register_model(&ModelDesc::new("llama", 4, 2, 64).chunk_tokens(32))?;
//! let tokens: Vec<u32> = (0..64).collect();
//! let kv = vec![0u8; 2 * model.desc().chunk_bytes()? as usize];
//! assert_eq!(model.store(&tokens, &kv)?, 64);
//! # Ok::<(), swiftkv::Error>(())
//! ```

use std::ffi::{c_void, CStr, CString};
use std::fmt;
use std::marker::PhantomData;
use std::os::raw::c_char;
use std::ptr;
use std::sync::Mutex;

pub use swiftkv_sys as sys;

// --- Errors -------------------------------------------------------------------------------------

/// A status of the C API (`swiftkv_status`): 0 and 1 are not errors, every error is negative.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Status(pub i32);

impl Status {
    pub const OK: Status = Status(sys::SWIFTKV_OK);
    pub const IN_PROGRESS: Status = Status(sys::SWIFTKV_IN_PROGRESS);
    pub const EINVAL: Status = Status(sys::SWIFTKV_EINVAL);
    pub const ENOMEM: Status = Status(sys::SWIFTKV_ENOMEM);
    pub const ENOTFOUND: Status = Status(sys::SWIFTKV_ENOTFOUND);
    pub const EBUSY: Status = Status(sys::SWIFTKV_EBUSY);
    pub const EIO: Status = Status(sys::SWIFTKV_EIO);
    pub const ECUDA: Status = Status(sys::SWIFTKV_ECUDA);
    pub const ENODEV: Status = Status(sys::SWIFTKV_ENODEV);
    pub const EPEER: Status = Status(sys::SWIFTKV_EPEER);
    pub const ETIMEDOUT: Status = Status(sys::SWIFTKV_ETIMEDOUT);
    pub const EVERSION: Status = Status(sys::SWIFTKV_EVERSION);
    pub const EUNSUPPORTED: Status = Status(sys::SWIFTKV_EUNSUPPORTED);
    pub const EUSER: Status = Status(sys::SWIFTKV_EUSER);
    pub const ESTATE: Status = Status(sys::SWIFTKV_ESTATE);
    pub const EINTERNAL: Status = Status(sys::SWIFTKV_EINTERNAL);

    /// The library's static text for the status.
    pub fn as_str(self) -> &'static str {
        unsafe { CStr::from_ptr(sys::swiftkv_status_string(self.0)) }.to_str().unwrap_or("?")
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed call: its status and the library's message (read on the failing thread).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
    /// Set by `Model::store` when it failed after its arguments were checked: the leading
    /// tokens it cached before the failure, which stay cached.
    pub cached_tokens: Option<u64>,
    /// Set by `Model::store_named` likewise: the leading chunks it cached before the failure.
    pub cached_chunks: Option<u64>,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.as_str(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Turns a C status into a Result; the message is thread-local, so it is read right here.
fn check(st: sys::swiftkv_status) -> Result<Status> {
    if st >= 0 {
        return Ok(Status(st));
    }
    let message = unsafe { CStr::from_ptr(sys::swiftkv_last_error_message()) }
        .to_string_lossy()
        .into_owned();
    Err(Error { status: Status(st), message, cached_tokens: None, cached_chunks: None })
}

fn invalid(message: &str) -> Error {
    Error {
        status: Status::EINVAL,
        message: message.to_string(),
        cached_tokens: None,
        cached_chunks: None,
    }
}

fn cstring(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| invalid(&format!("{} contains a NUL byte", what)))
}

// --- Version, dtypes, constants --------------------------------------------------------------------

pub fn version() -> u32 {
    unsafe { sys::swiftkv_version() }
}

pub fn version_string() -> &'static str {
    unsafe { CStr::from_ptr(sys::swiftkv_version_string()) }.to_str().unwrap_or("?")
}

/// KV element types (`swiftkv_dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum DType {
    F16 = sys::SWIFTKV_DTYPE_F16 as i32,
    BF16 = sys::SWIFTKV_DTYPE_BF16 as i32,
    F32 = sys::SWIFTKV_DTYPE_F32 as i32,
    Fp8E4M3 = sys::SWIFTKV_DTYPE_FP8_E4M3 as i32,
    Fp8E5M2 = sys::SWIFTKV_DTYPE_FP8_E5M2 as i32,
    I8 = sys::SWIFTKV_DTYPE_I8 as i32,
}

impl DType {
    pub fn size(self) -> u32 {
        unsafe { sys::swiftkv_dtype_size(self as sys::swiftkv_dtype) }
    }
    fn from_raw(v: sys::swiftkv_dtype) -> DType {
        [DType::F16, DType::BF16, DType::F32, DType::Fp8E4M3, DType::Fp8E5M2, DType::I8]
            .into_iter()
            .find(|d| *d as sys::swiftkv_dtype == v)
            .unwrap_or(DType::F16)
    }
}

/// A versioned struct as the library's `swiftkv_<struct>_init` fills it: the library owns every
/// default, so none is written again here.
fn library_defaults<T>(init: unsafe extern "C" fn(*mut T)) -> T {
    let mut v = std::mem::MaybeUninit::<T>::zeroed();
    unsafe {
        init(v.as_mut_ptr());
        v.assume_init()
    }
}

/// What a connector request does (`swiftkv_request_shape`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum RequestShape {
    /// Per layer `wait_layer_load(l)` then `save_layer(l)`, then `wait_save`.
    LoadAndSave = sys::SWIFTKV_REQUEST_LOAD_AND_SAVE as u32,
    /// `start_load`, then `wait_layer_load(l)` for every layer; nothing saved.
    LoadOnly = sys::SWIFTKV_REQUEST_LOAD_ONLY as u32,
    /// `save_layer(l)` for every layer, then `wait_save`; nothing loaded.
    SaveOnly = sys::SWIFTKV_REQUEST_SAVE_ONLY as u32,
}

/// Where a chunk lives (`swiftkv_tier`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Tier {
    Peer = sys::SWIFTKV_TIER_PEER as u32,
    Host = sys::SWIFTKV_TIER_HOST as u32,
    Disk = sys::SWIFTKV_TIER_DISK as u32,
    Dropped = sys::SWIFTKV_TIER_DROPPED as u32,
    /// Memory lent by another host, over UCX (numbered after `Dropped`).
    Remote = sys::SWIFTKV_TIER_REMOTE as u32,
}

impl Tier {
    fn from_raw(v: u32) -> Tier {
        match v {
            sys::SWIFTKV_TIER_PEER => Tier::Peer,
            sys::SWIFTKV_TIER_HOST => Tier::Host,
            sys::SWIFTKV_TIER_DISK => Tier::Disk,
            sys::SWIFTKV_TIER_REMOTE => Tier::Remote,
            _ => Tier::Dropped,
        }
    }
}

/// Where the remote tier stands in the chunk cache's chain (`swiftkv_tier_order`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TierOrder {
    /// Peer, remote, host, disk (the default).
    RemoteFirst,
    /// Peer, host, remote, disk: this host's memory first (a slow network).
    HostFirst,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Lender,
    Borrower,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvictionPolicy {
    Lru,
    Retention,
}

/// How a borrower reaches a lender's memory in another process (`swiftkv_remote_path`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemotePath {
    /// Mapped (memfd, VMM, CUDA IPC) on the lender's host, UCX from anywhere else.
    Auto,
    /// UCX whatever the host.
    Ucx,
    /// Mapped only: a lender on another host is refused.
    Local,
}

/// How a device region is allocated (`swiftkv_cuda_alloc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaAlloc {
    Auto,
    Vmm,
    Malloc,
}

pub const DEVICE_HOST: i32 = sys::SWIFTKV_DEVICE_HOST;
/// Every lease, for `Elastic::reclaim`.
pub const LEASE_ALL: u64 = u64::MAX;
/// Every model, for `Context::clear`.
pub const MODEL_ALL: u32 = sys::SWIFTKV_MODEL_ALL;
/// Every tier, for the clear calls.
pub const TIERS_ALL: u32 = sys::SWIFTKV_TIERS_ALL;

// --- Geometry and planning ------------------------------------------------------------------------

/// A model's KV geometry (`swiftkv_model_desc`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelDesc {
    pub name: String,
    pub num_layers: u32,
    pub num_kv_heads: u32,
    pub head_dim: u32,
    pub block_tokens: u32,
    pub chunk_tokens: u32,
    pub dtype: DType,
    pub device: i32,
    /// Goes into every chunk key with the name: a weights revision, an adapter, a tenant or a
    /// salt. Models differing only in it never share chunks. Empty: none.
    pub identity: String,
}

/// The strings a raw `swiftkv_model_desc` points to.
struct RawStrings(#[allow(dead_code)] CString, #[allow(dead_code)] Option<CString>);

impl ModelDesc {
    /// A model with the library's defaults (`swiftkv_model_desc_init`: a host model in f16,
    /// 16-token blocks, 256-token chunks).
    pub fn new(name: &str, num_layers: u32, num_kv_heads: u32, head_dim: u32) -> ModelDesc {
        let d = library_defaults(sys::swiftkv_model_desc_init);
        ModelDesc {
            name: name.to_string(),
            num_layers,
            num_kv_heads,
            head_dim,
            block_tokens: d.block_tokens,
            chunk_tokens: d.chunk_tokens,
            dtype: DType::from_raw(d.dtype),
            device: d.device,
            identity: String::new(),
        }
    }
    pub fn block_tokens(mut self, v: u32) -> Self {
        self.block_tokens = v;
        self
    }
    pub fn chunk_tokens(mut self, v: u32) -> Self {
        self.chunk_tokens = v;
        self
    }
    pub fn dtype(mut self, v: DType) -> Self {
        self.dtype = v;
        self
    }
    pub fn device(mut self, v: i32) -> Self {
        self.device = v;
        self
    }
    pub fn identity(mut self, v: &str) -> Self {
        self.identity = v.to_string();
        self
    }

    /// The C struct and the strings it points to (keep both alive while the struct is used).
    fn raw(&self) -> Result<(sys::swiftkv_model_desc, RawStrings)> {
        let name = cstring(&self.name, "name")?;
        let identity = if self.identity.is_empty() {
            None
        } else {
            Some(cstring(&self.identity, "identity")?)
        };
        let d = sys::swiftkv_model_desc {
            size: std::mem::size_of::<sys::swiftkv_model_desc>() as u32,
            version: sys::SWIFTKV_MODEL_DESC_VERSION,
            name: if self.name.is_empty() { ptr::null() } else { name.as_ptr() },
            num_layers: self.num_layers,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            block_tokens: self.block_tokens,
            chunk_tokens: self.chunk_tokens,
            dtype: self.dtype as sys::swiftkv_dtype,
            device: self.device,
            identity: identity.as_ref().map_or(ptr::null(), |s| s.as_ptr()),
        };
        Ok((d, RawStrings(name, identity)))
    }

    /// KV bytes of one token over all layers.
    pub fn bytes_per_token(&self) -> Result<u64> {
        let (d, _n) = self.raw()?;
        let mut out = 0;
        check(unsafe { sys::swiftkv_geometry_bytes_per_token(&d, &mut out) })?;
        Ok(out)
    }

    /// Bytes of one cached chunk.
    pub fn chunk_bytes(&self) -> Result<u64> {
        Ok(self.bytes_per_token()? * self.chunk_tokens as u64)
    }
}

/// The minimum elastic unit (Eq. 6-9): (borrower blocks, lender blocks).
pub fn meu(borrower: &ModelDesc, lender: &ModelDesc) -> Result<(u64, u64)> {
    let (b, _bn) = borrower.raw()?;
    let (l, _ln) = lender.raw()?;
    let (mut ob, mut ol) = (0, 0);
    check(unsafe { sys::swiftkv_geometry_meu(&b, &l, &mut ob, &mut ol) })?;
    Ok((ob, ol))
}

/// The lending unit: (borrower chunks, lender blocks).
pub fn lend_unit(borrower: &ModelDesc, lender: &ModelDesc) -> Result<(u64, u64)> {
    let (b, _bn) = borrower.raw()?;
    let (l, _ln) = lender.raw()?;
    let (mut oc, mut ol) = (0, 0);
    check(unsafe { sys::swiftkv_geometry_lend_unit(&mut oc, &mut ol, &b, &l) })?;
    Ok((oc, ol))
}

/// A borrower's capacity plan (Eq. 1-5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CapacityPlan {
    pub stream_blocks: u64,
    pub regular_blocks: u64,
    pub max_context_tokens: u64,
    pub baseline_context_tokens: u64,
    pub lender_full_blocks: u64,
}

pub fn plan_borrower(borrower: &ModelDesc, borrower_kv_bytes: u64,
                     lender_kv_bytes: &[u64]) -> Result<CapacityPlan> {
    let (b, _n) = borrower.raw()?;
    let mut out: sys::swiftkv_capacity_plan = unsafe { std::mem::zeroed() };
    out.size = std::mem::size_of::<sys::swiftkv_capacity_plan>() as u32;
    out.version = sys::SWIFTKV_CAPACITY_PLAN_VERSION;
    let lenders = if lender_kv_bytes.is_empty() { ptr::null() } else { lender_kv_bytes.as_ptr() };
    check(unsafe {
        sys::swiftkv_plan_borrower(&b, borrower_kv_bytes, lenders, lender_kv_bytes.len(), &mut out)
    })?;
    Ok(CapacityPlan {
        stream_blocks: out.stream_blocks,
        regular_blocks: out.regular_blocks,
        max_context_tokens: out.max_context_tokens,
        baseline_context_tokens: out.baseline_context_tokens,
        lender_full_blocks: out.lender_full_blocks,
    })
}

/// Algorithm 1 ScaleUp: (lender delta, borrower delta) in blocks.
pub fn plan_scale_up(owned_blocks: u64, block_tokens: u32, meu_lender: u64, meu_borrower: u64,
                     request_tokens: u64) -> Result<(u64, u64)> {
    let (mut l, mut b) = (0, 0);
    check(unsafe {
        sys::swiftkv_plan_scale_up(owned_blocks, block_tokens, meu_lender, meu_borrower,
                                   request_tokens, &mut l, &mut b)
    })?;
    Ok((l, b))
}

/// Algorithm 1 ScaleDown: (lender delta, borrower delta) in blocks.
pub fn plan_scale_down(owned_blocks: u64, block_tokens: u32, meu_lender: u64, meu_borrower: u64,
                       max_tokens_in_window: u64) -> Result<(u64, u64)> {
    let (mut l, mut b) = (0, 0);
    check(unsafe {
        sys::swiftkv_plan_scale_down(owned_blocks, block_tokens, meu_lender, meu_borrower,
                                     max_tokens_in_window, &mut l, &mut b)
    })?;
    Ok((l, b))
}

/// CUDA devices this process can use (0 without CUDA).
pub fn device_count() -> Result<u32> {
    let mut n = 0;
    check(unsafe { sys::swiftkv_device_count(&mut n) })?;
    Ok(n)
}

// --- The context ------------------------------------------------------------------------------------

/// `swiftkv_ctx_config` in Rust terms; `Default` gives the header's defaults.
#[derive(Clone, Debug)]
pub struct ContextConfig {
    pub device_mask: u64,
    pub host_budget_bytes: u64,
    pub host_numa_node: i32,
    pub disk_path: Option<String>,
    pub disk_budget_bytes: u64,
    pub eviction_policy: EvictionPolicy,
    pub demote_free_percent: u32,
    pub recompute_token_cost: f64,
    pub recompute_attention_cost: f64,
    pub attention_cost_table: Vec<f64>,
    pub maintenance_interval_ms: u32,
    pub coord_endpoint: Option<String>,
    pub coord_heartbeat_ms: u32,
    pub coord_timeout_ms: u32,
    /// Bytes of one disk segment file (0: the library's default).
    pub disk_segment_bytes: u64,
    /// Group commit period of the disk tier in ms (0: when a segment fills and at close).
    pub disk_sync_ms: u32,
    /// Threads of the host copy engine (0: the library's default for this machine).
    pub transfer_threads: u32,
    /// Connector requests open at once; a `request` beyond is `Status::EBUSY` (1 to 2^20).
    pub max_open_requests: u32,
    /// With a disk tier: when the context ends, move host and lent-memory chunks to disk as far
    /// as its free room goes, so a later context on the same path finds them (default true).
    pub write_back_on_close: bool,
    /// UCX transports for lent memory on another host, as UCX_TLS names them (None: UCX picks).
    pub coord_ucx_transports: Option<String>,
    pub coord_remote_path: RemotePath,
    /// The longest a batch of UCX reads or writes of lent memory waits with none completing.
    pub coord_rma_timeout_ms: u32,
    pub tier_order: TierOrder,
}

impl Default for ContextConfig {
    /// The library's defaults (`swiftkv_ctx_config_init`).
    fn default() -> Self {
        ContextConfig::from_raw(&library_defaults(sys::swiftkv_ctx_config_init))
    }
}

impl ContextConfig {
    /// The safe form of a C configuration (the strings and the table copied).
    fn from_raw(c: &sys::swiftkv_ctx_config) -> ContextConfig {
        let string = |p: *const c_char| {
            if p.is_null() {
                None
            } else {
                Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            }
        };
        let table = if c.attention_cost_table.is_null() {
            Vec::new()
        } else {
            unsafe {
                std::slice::from_raw_parts(c.attention_cost_table, c.attention_cost_entries as usize)
            }
            .to_vec()
        };
        ContextConfig {
            device_mask: c.device_mask,
            host_budget_bytes: c.host_budget_bytes,
            host_numa_node: c.host_numa_node,
            disk_path: string(c.disk_path),
            disk_budget_bytes: c.disk_budget_bytes,
            eviction_policy: if c.eviction_policy == sys::SWIFTKV_EVICT_LRU {
                EvictionPolicy::Lru
            } else {
                EvictionPolicy::Retention
            },
            demote_free_percent: c.demote_free_percent,
            recompute_token_cost: c.recompute_token_cost,
            recompute_attention_cost: c.recompute_attention_cost,
            attention_cost_table: table,
            maintenance_interval_ms: c.maintenance_interval_ms,
            coord_endpoint: string(c.coord_endpoint),
            coord_heartbeat_ms: c.coord_heartbeat_ms,
            coord_timeout_ms: c.coord_timeout_ms,
            disk_segment_bytes: c.disk_segment_bytes,
            disk_sync_ms: c.disk_sync_ms,
            transfer_threads: c.transfer_threads,
            max_open_requests: c.max_open_requests,
            write_back_on_close: c.write_back_on_close != 0,
            coord_ucx_transports: string(c.coord_ucx_transports),
            coord_remote_path: match c.coord_remote_path {
                sys::SWIFTKV_REMOTE_PATH_UCX => RemotePath::Ucx,
                sys::SWIFTKV_REMOTE_PATH_LOCAL => RemotePath::Local,
                _ => RemotePath::Auto,
            },
            coord_rma_timeout_ms: c.coord_rma_timeout_ms,
            tier_order: if c.tier_order == sys::SWIFTKV_TIER_ORDER_HOST_FIRST {
                TierOrder::HostFirst
            } else {
                TierOrder::RemoteFirst
            },
        }
    }
}

/// A chunk that left a tier without the caller asking (`swiftkv_chunk_event`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkEvent {
    pub model: u32,
    pub from: Tier,
    pub to: Tier,
    /// 0 evicted, 1 revoked (its lender took the memory back), 2 corrupt.
    pub reason: u32,
    pub key: u128,
}

type EventFn = Box<dyn Fn(&ChunkEvent) + Send + Sync>;

/// One per engine process (`swiftkv_ctx`). Every call is thread-safe. Dropping it ends the C
/// context, which no other call may be using (`swiftkv_ctx_destroy`): models, pools, requests
/// and regions borrow the context, so it is dropped only when no call can be in flight.
///
/// A context belongs to the process that made it. In the child of a `fork()` its calls (and
/// those of its models, pools, requests and regions) fail with `Status::ESTATE` naming the fork,
/// and dropping it releases nothing: its memory, disk and threads are the parent's. The child
/// makes a context of its own.
pub struct Context {
    raw: *mut sys::swiftkv_ctx,
    events: Mutex<Option<Box<EventFn>>>,
}

unsafe impl Send for Context {}
unsafe impl Sync for Context {}

unsafe extern "C" fn event_trampoline(e: *const sys::swiftkv_chunk_event, user: *mut c_void) {
    let f = &*(user as *const EventFn);
    let e = &*e;
    let ev = ChunkEvent {
        model: e.model,
        from: Tier::from_raw(e.from as u32),
        to: Tier::from_raw(e.to as u32),
        reason: e.reason as u32,
        key: (e.key_hi as u128) << 64 | e.key_lo as u128,
    };
    // A panic must not cross into C.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&ev)));
}

impl Context {
    pub fn new(config: &ContextConfig) -> Result<Context> {
        let disk = config.disk_path.as_deref().map(|p| cstring(p, "disk_path")).transpose()?;
        let ep = config.coord_endpoint.as_deref().map(|p| cstring(p, "coord_endpoint")).transpose()?;
        let tls = config.coord_ucx_transports.as_deref().map(|p| cstring(p, "coord_ucx_transports")).transpose()?;
        let mut c: sys::swiftkv_ctx_config = unsafe { std::mem::zeroed() };
        c.size = std::mem::size_of::<sys::swiftkv_ctx_config>() as u32;
        c.version = sys::SWIFTKV_CTX_CONFIG_VERSION;
        c.device_mask = config.device_mask;
        c.host_budget_bytes = config.host_budget_bytes;
        c.host_numa_node = config.host_numa_node;
        c.disk_path = disk.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        c.disk_budget_bytes = config.disk_budget_bytes;
        c.eviction_policy = match config.eviction_policy {
            EvictionPolicy::Lru => sys::SWIFTKV_EVICT_LRU,
            EvictionPolicy::Retention => sys::SWIFTKV_EVICT_RETENTION,
        };
        c.demote_free_percent = config.demote_free_percent;
        c.recompute_token_cost = config.recompute_token_cost;
        c.recompute_attention_cost = config.recompute_attention_cost;
        if !config.attention_cost_table.is_empty() {
            c.attention_cost_table = config.attention_cost_table.as_ptr();
            c.attention_cost_entries = config.attention_cost_table.len() as u32;
        }
        c.maintenance_interval_ms = config.maintenance_interval_ms;
        c.coord_endpoint = ep.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        c.coord_heartbeat_ms = config.coord_heartbeat_ms;
        c.coord_timeout_ms = config.coord_timeout_ms;
        c.disk_segment_bytes = config.disk_segment_bytes;
        c.disk_sync_ms = config.disk_sync_ms;
        c.transfer_threads = config.transfer_threads;
        c.max_open_requests = config.max_open_requests;
        c.write_back_on_close = config.write_back_on_close as u32;
        c.coord_ucx_transports = tls.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        c.coord_remote_path = match config.coord_remote_path {
            RemotePath::Auto => sys::SWIFTKV_REMOTE_PATH_AUTO,
            RemotePath::Ucx => sys::SWIFTKV_REMOTE_PATH_UCX,
            RemotePath::Local => sys::SWIFTKV_REMOTE_PATH_LOCAL,
        };
        c.coord_rma_timeout_ms = config.coord_rma_timeout_ms;
        c.tier_order = match config.tier_order {
            TierOrder::RemoteFirst => sys::SWIFTKV_TIER_ORDER_REMOTE_FIRST,
            TierOrder::HostFirst => sys::SWIFTKV_TIER_ORDER_HOST_FIRST,
        };
        let mut raw = ptr::null_mut();
        check(unsafe { sys::swiftkv_ctx_create(&mut raw, &c) })?;
        Ok(Context { raw, events: Mutex::new(None) })
    }

    pub fn as_raw(&self) -> *mut sys::swiftkv_ctx {
        self.raw
    }

    /// The configuration in effect (defaults filled in).
    pub fn config(&self) -> Result<ContextConfig> {
        let mut c: sys::swiftkv_ctx_config = unsafe { std::mem::zeroed() };
        c.size = std::mem::size_of::<sys::swiftkv_ctx_config>() as u32;
        c.version = sys::SWIFTKV_CTX_CONFIG_VERSION;
        check(unsafe { sys::swiftkv_ctx_get_config(&mut c, self.raw) })?;
        Ok(ContextConfig::from_raw(&c))
    }

    pub fn device_count(&self) -> Result<u32> {
        let mut n = 0;
        check(unsafe { sys::swiftkv_ctx_device_count(&mut n, self.raw) })?;
        Ok(n)
    }

    pub fn register_model(&self, desc: &ModelDesc) -> Result<Model<'_>> {
        self.register(desc, Role::Borrower)
    }

    pub fn register(&self, desc: &ModelDesc, role: Role) -> Result<Model<'_>> {
        let (d, _name) = desc.raw()?;
        let cfg = sys::swiftkv_model_config {
            size: std::mem::size_of::<sys::swiftkv_model_config>() as u32,
            version: sys::SWIFTKV_MODEL_CONFIG_VERSION,
            desc: &d,
            role: match role {
                Role::Lender => sys::SWIFTKV_ROLE_LENDER,
                Role::Borrower => sys::SWIFTKV_ROLE_BORROWER,
            },
            reserved0: 0,
        };
        let mut id = 0;
        check(unsafe { sys::swiftkv_model_register(&mut id, self.raw, &cfg) })?;
        Ok(Model { ctx: self, id, desc: desc.clone() })
    }

    /// The chunk cache's counts and counters.
    pub fn stats(&self) -> Result<Stats> {
        let mut s = library_defaults(sys::swiftkv_stats_init);
        check(unsafe { sys::swiftkv_stats_get(&mut s, self.raw) })?;
        Ok(Stats::from(&s))
    }

    /// Cached chunks and bytes by codec and tier (`swiftkv_codec_stats_get`).
    pub fn codec_stats(&self) -> Result<CodecStats> {
        let mut s = library_defaults(sys::swiftkv_codec_stats_init);
        check(unsafe { sys::swiftkv_codec_stats_get(&mut s, self.raw) })?;
        Ok(CodecStats {
            chunks: s.chunks,
            raw_bytes: s.raw_bytes,
            stored_bytes: s.stored_bytes,
            encodes: s.encodes,
            decodes: s.decodes,
            lossy_refused: s.lossy_refused,
        })
    }

    /// The context's counters in Prometheus' text exposition format (`swiftkv_metrics_text`;
    /// the names are listed in docs/api.md).
    pub fn metrics_text(&self) -> Result<String> {
        let mut len = 0usize;
        check(unsafe { sys::swiftkv_metrics_text(ptr::null_mut(), 0, &mut len, self.raw) })?;
        loop {
            let mut buf = vec![0u8; len + 1];
            let mut got = 0usize;
            check(unsafe {
                sys::swiftkv_metrics_text(buf.as_mut_ptr() as *mut std::os::raw::c_char, buf.len(),
                                          &mut got, self.raw)
            })?;
            if got < buf.len() {
                buf.truncate(got);
                return String::from_utf8(buf).map_err(|_| invalid("metrics text is not UTF-8"));
            }
            len = got; // the counters grew between the two calls
        }
    }

    /// The coordinator's counts and counters.
    pub fn coord_stats(&self) -> Result<CoordStats> {
        let mut s = library_defaults(sys::swiftkv_coord_stats_init);
        check(unsafe { sys::swiftkv_coord_stats_get(&mut s, self.raw) })?;
        Ok(CoordStats::from(&s))
    }

    /// Drops the unpinned chunks of every model in the tiers of tier_mask.
    pub fn clear_all(&self, tier_mask: u32) -> Result<u64> {
        let mut n = 0;
        check(unsafe { sys::swiftkv_clear(&mut n, self.raw, MODEL_ALL, tier_mask, ptr::null(), 0) })?;
        Ok(n)
    }

    /// Sets (None: removes) the chunk event callback; it runs on a library thread.
    pub fn on_chunk_event(&self, f: Option<EventFn>) -> Result<()> {
        let mut slot = self.events.lock().unwrap();
        match f {
            None => {
                check(unsafe { sys::swiftkv_set_chunk_event_callback(self.raw, None, ptr::null_mut()) })?;
                *slot = None;
            }
            Some(f) => {
                let boxed: Box<EventFn> = Box::new(f);
                let user = &*boxed as *const EventFn as *mut c_void;
                check(unsafe {
                    sys::swiftkv_set_chunk_event_callback(self.raw, Some(event_trampoline), user)
                })?;
                *slot = Some(boxed); // the previous one is not running any more: drop it
            }
        }
        Ok(())
    }

    /// A lender's elastic region.
    pub fn elastic(&self, config: &ElasticConfig) -> Result<Elastic<'_>> {
        Elastic::new(self, config)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        unsafe { sys::swiftkv_ctx_destroy(self.raw) };
    }
}

// --- Models and the chunk cache --------------------------------------------------------------------

/// A model registered in a context.
/// An encoding of a cached chunk (docs/codecs.md gives the formats and error bounds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    /// The chunk's bytes as they are.
    Raw,
    /// Lossless; `level` 1..=19 is the encoder's (not part of the format; reported as 0).
    Zstd { byte_planes: bool, level: i32 },
    /// Lossy: keys per channel, values per token; `bits` 8, 4 or 2, `group` a power of two in
    /// 8..=256.
    Kivi { bits: u32, group: u32 },
    /// Lossy: FP8 E4M3 with a scale per token.
    Fp8,
}

impl Codec {
    fn to_sys(self) -> sys::swiftkv_codec_params {
        let mut p = library_defaults(sys::swiftkv_codec_params_init);
        match self {
            Codec::Raw => p.codec = sys::SWIFTKV_CODEC_RAW,
            Codec::Zstd { byte_planes, level } => {
                p.codec = sys::SWIFTKV_CODEC_ZSTD;
                p.byte_planes = u32::from(byte_planes);
                p.zstd_level = level;
            }
            Codec::Kivi { bits, group } => {
                p.codec = sys::SWIFTKV_CODEC_KIVI;
                p.bits = bits;
                p.group = group;
            }
            Codec::Fp8 => p.codec = sys::SWIFTKV_CODEC_FP8,
        }
        p
    }
}

/// What a model asks of compression (`swiftkv_compression_config`): whether loads may return
/// lossy chunks, and either the fixed codec of exact chunks entering host memory and the disk
/// or (`adaptive`) the utility policy that chooses each chunk's encoding.
#[derive(Clone, Debug, PartialEq)]
pub struct Compression {
    pub accept_lossy: bool,
    pub host: Codec,
    pub disk: Codec,
    /// Adaptive mode (host and disk must then be raw).
    pub adaptive: Option<Adaptive>,
}

impl Default for Compression {
    fn default() -> Self {
        Compression { accept_lossy: false, host: Codec::Raw, disk: Codec::Raw, adaptive: None }
    }
}

/// A method adaptive mode may choose (`swiftkv_compression_method`), with the engine's own
/// quality and decoder speed for it; `None`: the library measures them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Method {
    pub codec: Codec,
    pub quality: Option<f64>,
    pub decode_gbps: Option<f64>,
}

impl Method {
    /// A method whose quality and decoder speed the library measures.
    pub fn measured(codec: Codec) -> Method {
        Method { codec, quality: None, decode_gbps: None }
    }
}

/// The adaptive policy's parameters (docs/codecs.md); `Default` gives the library's defaults
/// and the default method set (an empty `methods`).
#[derive(Clone, Debug, PartialEq)]
pub struct Adaptive {
    pub alpha: f64,
    pub reuse_horizon_s: f64,
    pub host_gbps: f64,
    pub disk_gbps: f64,
    pub recompute_gbps: f64,
    pub methods: Vec<Method>,
}

impl Default for Adaptive {
    fn default() -> Self {
        let c = library_defaults(sys::swiftkv_compression_config_init);
        Adaptive {
            alpha: c.alpha,
            reuse_horizon_s: c.reuse_horizon_s,
            host_gbps: c.host_gbps,
            disk_gbps: c.disk_gbps,
            recompute_gbps: c.recompute_gbps,
            methods: Vec::new(),
        }
    }
}

/// How one chunk is cached (`swiftkv_chunk_info`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkInfo {
    pub tier: Tier,
    /// `None` when the chunk is not cached.
    pub codec: Option<Codec>,
    pub lossy: bool,
    pub stored_bytes: u64,
}

impl ChunkInfo {
    fn from_sys(v: &sys::swiftkv_chunk_info) -> ChunkInfo {
        let tier = Tier::from_raw(u32::from(v.tier));
        let codec = match (tier, u32::from(v.codec)) {
            (Tier::Dropped, _) => None,
            (_, sys::SWIFTKV_CODEC_ZSTD) => Some(Codec::Zstd { byte_planes: v.byte_planes != 0, level: 0 }),
            (_, sys::SWIFTKV_CODEC_KIVI) => {
                Some(Codec::Kivi { bits: u32::from(v.bits), group: u32::from(v.group) })
            }
            (_, sys::SWIFTKV_CODEC_FP8) => Some(Codec::Fp8),
            _ => Some(Codec::Raw),
        };
        ChunkInfo { tier, codec, lossy: v.lossy != 0, stored_bytes: v.stored_bytes }
    }
}

/// Cached chunks by codec (rows: raw, zstd, kivi, fp8) and tier (columns: peer, host, disk).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodecStats {
    pub chunks: [[u64; 3]; 4],
    pub raw_bytes: [[u64; 3]; 4],
    pub stored_bytes: [[u64; 3]; 4],
    pub encodes: u64,
    pub decodes: u64,
    pub lossy_refused: u64,
}

pub struct Model<'a> {
    ctx: &'a Context,
    id: u32,
    desc: ModelDesc,
}

/// What a prompt can reuse (`swiftkv_lookup_result`), with the tier of each full chunk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lookup {
    pub chunks: u64,
    /// Leading tokens that load from token 0.
    pub prefix_tokens: u64,
    /// Tokens before the longest cached run (the earliest of equal ones), cached or not: an
    /// engine recomputes them and loads the run (0 when the run is the prefix).
    pub dropped_head_tokens: u64,
    /// The longest cached run's tokens.
    pub loadable_tokens: u64,
    /// Cached chunks in the peer, host and disk tiers (index by `Tier as usize`).
    pub chunks_per_tier: [u64; 3],
    /// Cached chunks in the remote tier.
    pub remote_chunks: u64,
    /// The tier of each full chunk of the tokens (`Tier::Dropped`: not cached).
    pub residency: Vec<Tier>,
}

impl Lookup {
    /// A result struct of this binding's version, for a lookup call to fill.
    fn raw_result() -> sys::swiftkv_lookup_result {
        let mut out: sys::swiftkv_lookup_result = unsafe { std::mem::zeroed() };
        out.size = std::mem::size_of::<sys::swiftkv_lookup_result>() as u32;
        out.version = sys::SWIFTKV_LOOKUP_RESULT_VERSION;
        out
    }

    fn from_raw(out: &sys::swiftkv_lookup_result, residency: Vec<u8>) -> Lookup {
        Lookup {
            chunks: out.chunks,
            prefix_tokens: out.prefix_tokens,
            dropped_head_tokens: out.dropped_head_tokens,
            loadable_tokens: out.loadable_tokens,
            chunks_per_tier: out.chunks_per_tier,
            remote_chunks: out.remote_chunks,
            residency: residency.into_iter().map(|t| Tier::from_raw(u32::from(t))).collect(),
        }
    }
}

impl<'a> Model<'a> {
    pub fn id(&self) -> u32 {
        self.id
    }
    pub fn desc(&self) -> &ModelDesc {
        &self.desc
    }

    pub fn unregister(self) -> Result<()> {
        check(unsafe { sys::swiftkv_model_unregister(self.ctx.raw, self.id) })?;
        Ok(())
    }

    pub fn lookup(&self, tokens: &[u32]) -> Result<Lookup> {
        let mut out = Lookup::raw_result();
        let mut res = vec![0u8; tokens.len() / self.desc.chunk_tokens.max(1) as usize];
        check(unsafe {
            sys::swiftkv_lookup(&mut out, res.as_mut_ptr(), res.len(), self.ctx.raw, self.id,
                                tokens.as_ptr(), tokens.len())
        })?;
        Ok(Lookup::from_raw(&out, res))
    }

    /// Stores the chunks of `tokens` from `kv` (chunk after chunk); the leading tokens cached.
    /// A chunk that cannot be written fails the call (EIO) with `Error::cached_tokens` set to
    /// the leading tokens cached before it.
    pub fn store(&self, tokens: &[u32], kv: &[u8]) -> Result<u64> {
        let mut n = 0;
        let st = unsafe {
            sys::swiftkv_store(&mut n, self.ctx.raw, self.id, tokens.as_ptr(), tokens.len(),
                               kv.as_ptr() as *const c_void, kv.len())
        };
        check(st).map_err(|e| {
            let cached = if e.status == Status::EINVAL { None } else { Some(n) };
            Error { cached_tokens: cached, ..e }
        })?;
        Ok(n)
    }

    /// Copies cached chunks from `start_token` into `kv`; the tokens copied.
    pub fn retrieve(&self, tokens: &[u32], start_token: u64, kv: &mut [u8]) -> Result<u64> {
        let mut n = 0;
        check(unsafe {
            sys::swiftkv_retrieve(&mut n, self.ctx.raw, self.id, tokens.as_ptr(), tokens.len(),
                                  start_token, kv.as_mut_ptr() as *mut c_void, kv.len())
        })?;
        Ok(n)
    }

    /// A lease of an elastic region of this process; the lease id.
    pub fn borrow(&self, lender: &Elastic<'_>, max_units: u64) -> Result<u64> {
        let mut id = 0;
        check(unsafe { sys::swiftkv_borrow(&mut id, self.ctx.raw, self.id, lender.raw, max_units) })?;
        Ok(id)
    }

    /// A lease of the region offered as `lender_name` at `endpoint` (another process).
    pub fn borrow_remote(&self, endpoint: &str, lender_name: &str, max_units: u64) -> Result<u64> {
        let ep = cstring(endpoint, "endpoint")?;
        let name = cstring(lender_name, "lender_name")?;
        let mut id = 0;
        check(unsafe {
            sys::swiftkv_borrow_remote(&mut id, self.ctx.raw, self.id, ep.as_ptr(), name.as_ptr(),
                                       max_units)
        })?;
        Ok(id)
    }

    pub fn pin(&self, tokens: &[u32]) -> Result<()> {
        check(unsafe { sys::swiftkv_pin(self.ctx.raw, self.id, tokens.as_ptr(), tokens.len()) })?;
        Ok(())
    }

    pub fn unpin(&self, tokens: &[u32]) -> Result<()> {
        check(unsafe { sys::swiftkv_unpin(self.ctx.raw, self.id, tokens.as_ptr(), tokens.len()) })?;
        Ok(())
    }

    /// Drops the unpinned chunks of `tokens` (None: all of this model's) in the tiers of the mask.
    pub fn clear(&self, tokens: Option<&[u32]>, tier_mask: u32) -> Result<u64> {
        let (p, n) = tokens.map_or((ptr::null(), 0), |t| (t.as_ptr(), t.len()));
        let mut out = 0;
        check(unsafe { sys::swiftkv_clear(&mut out, self.ctx.raw, self.id, tier_mask, p, n) })?;
        Ok(out)
    }

    /// Moves the chunks of `tokens` to `to`; how many are there afterwards.
    pub fn move_to(&self, tokens: &[u32], to: Tier) -> Result<u64> {
        let mut n = 0;
        check(unsafe {
            sys::swiftkv_move(&mut n, self.ctx.raw, self.id, tokens.as_ptr(), tokens.len(),
                              to as sys::swiftkv_tier)
        })?;
        Ok(n)
    }

    // Chunks named by the caller (`swiftkv_*_named`): `names` holds the names of consecutive
    // chunks, `name_bytes` bytes each (1 to 64), each already chained over everything before
    // its chunk (an engine's block or page keys).

    /// Where each named chunk is; token counts are chunks times chunk_tokens.
    pub fn lookup_named(&self, names: &[u8], name_bytes: u32) -> Result<Lookup> {
        let mut out = Lookup::raw_result();
        let mut res = vec![0u8; names.len() / name_bytes.max(1) as usize];
        check(unsafe {
            sys::swiftkv_lookup_named(&mut out, res.as_mut_ptr(), res.len(), self.ctx.raw,
                                      self.id, names.as_ptr() as *const c_void, names.len(),
                                      name_bytes)
        })?;
        Ok(Lookup::from_raw(&out, res))
    }

    /// Stores the named chunks from `kv` (a chunk's bytes per name); the leading chunks cached.
    /// `first_chunk` is the number of the first name's chunk in its sequence. A chunk that
    /// cannot be written fails the call (EIO) with `Error::cached_chunks` set.
    pub fn store_named(&self, names: &[u8], name_bytes: u32, first_chunk: u64, kv: &[u8])
                       -> Result<u64> {
        let mut n = 0;
        let st = unsafe {
            sys::swiftkv_store_named(&mut n, self.ctx.raw, self.id,
                                     names.as_ptr() as *const c_void, names.len(), name_bytes,
                                     first_chunk, kv.as_ptr() as *const c_void, kv.len())
        };
        check(st).map_err(|e| {
            let cached = if e.status == Status::EINVAL { None } else { Some(n) };
            Error { cached_chunks: cached, ..e }
        })?;
        Ok(n)
    }

    /// Copies the named chunks from the first on into `kv`; the chunks copied.
    pub fn retrieve_named(&self, names: &[u8], name_bytes: u32, kv: &mut [u8]) -> Result<u64> {
        let mut n = 0;
        check(unsafe {
            sys::swiftkv_retrieve_named(&mut n, self.ctx.raw, self.id,
                                        names.as_ptr() as *const c_void, names.len(), name_bytes,
                                        kv.as_mut_ptr() as *mut c_void, kv.len())
        })?;
        Ok(n)
    }

    pub fn pin_named(&self, names: &[u8], name_bytes: u32) -> Result<()> {
        check(unsafe {
            sys::swiftkv_pin_named(self.ctx.raw, self.id, names.as_ptr() as *const c_void,
                                   names.len(), name_bytes)
        })?;
        Ok(())
    }

    pub fn unpin_named(&self, names: &[u8], name_bytes: u32) -> Result<()> {
        check(unsafe {
            sys::swiftkv_unpin_named(self.ctx.raw, self.id, names.as_ptr() as *const c_void,
                                     names.len(), name_bytes)
        })?;
        Ok(())
    }

    /// Drops the unpinned named chunks in the tiers of the mask.
    pub fn clear_named(&self, names: &[u8], name_bytes: u32, tier_mask: u32) -> Result<u64> {
        let mut out = 0;
        check(unsafe {
            sys::swiftkv_clear_named(&mut out, self.ctx.raw, self.id, tier_mask,
                                     names.as_ptr() as *const c_void, names.len(), name_bytes)
        })?;
        Ok(out)
    }

    /// Moves the named chunks to `to`; how many are there afterwards.
    pub fn move_named(&self, names: &[u8], name_bytes: u32, to: Tier) -> Result<u64> {
        let mut n = 0;
        check(unsafe {
            sys::swiftkv_move_named(&mut n, self.ctx.raw, self.id, names.as_ptr() as *const c_void,
                                    names.len(), name_bytes, to as sys::swiftkv_tier)
        })?;
        Ok(n)
    }

    /// The library's keys of the named chunks, as `ChunkEvent::key` reports them. Computes only.
    pub fn chunk_keys_named(&self, names: &[u8], name_bytes: u32) -> Result<Vec<u128>> {
        let n = names.len() / name_bytes.max(1) as usize;
        let mut keys = vec![0u64; 2 * n];
        check(unsafe {
            sys::swiftkv_chunk_keys_named(keys.as_mut_ptr(), keys.len(), self.ctx.raw, self.id,
                                          names.as_ptr() as *const c_void, names.len(), name_bytes)
        })?;
        Ok(keys.chunks(2).map(|k| (u128::from(k[1]) << 64) | u128::from(k[0])).collect())
    }

    /// Sets what this model asks of compression, from now on (`swiftkv_compression_set`).
    pub fn set_compression(&self, c: &Compression) -> Result<()> {
        let mut cfg = library_defaults(sys::swiftkv_compression_config_init);
        cfg.accept_lossy = u32::from(c.accept_lossy);
        cfg.host = c.host.to_sys();
        cfg.disk = c.disk.to_sys();
        if let Some(a) = &c.adaptive {
            if a.methods.len() > cfg.methods.len() {
                return Err(invalid(&format!(
                    "at most {} methods, not {}",
                    cfg.methods.len(),
                    a.methods.len()
                )));
            }
            cfg.adaptive = 1;
            cfg.alpha = a.alpha;
            cfg.reuse_horizon_s = a.reuse_horizon_s;
            cfg.host_gbps = a.host_gbps;
            cfg.disk_gbps = a.disk_gbps;
            cfg.recompute_gbps = a.recompute_gbps;
            cfg.n_methods = a.methods.len() as u32;
            for (slot, m) in cfg.methods.iter_mut().zip(&a.methods) {
                slot.params = m.codec.to_sys();
                slot.quality = m.quality.unwrap_or(-1.0);
                slot.decode_gbps = m.decode_gbps.unwrap_or(0.0);
            }
        }
        check(unsafe { sys::swiftkv_compression_set(self.ctx.raw, self.id, &cfg) })?;
        Ok(())
    }

    /// Re-encodes the chunks of `tokens` where they are under what the model's adaptive policy
    /// chooses for each (`swiftkv_compress` with no params; EINVAL in fixed mode); how many are
    /// stored as it chose afterwards.
    pub fn compress_by_policy(&self, tokens: &[u32]) -> Result<u64> {
        let mut n = 0;
        check(unsafe {
            sys::swiftkv_compress(&mut n, self.ctx.raw, self.id, tokens.as_ptr(), tokens.len(),
                                  ptr::null())
        })?;
        Ok(n)
    }

    /// Re-encodes the chunks of `tokens` under `codec` where they are (`swiftkv_compress`);
    /// how many are under it afterwards.
    pub fn compress(&self, tokens: &[u32], codec: Codec) -> Result<u64> {
        let p = codec.to_sys();
        let mut n = 0;
        check(unsafe {
            sys::swiftkv_compress(&mut n, self.ctx.raw, self.id, tokens.as_ptr(), tokens.len(), &p)
        })?;
        Ok(n)
    }

    /// How each full chunk of `tokens` is cached, recording no activity.
    pub fn chunk_info(&self, tokens: &[u32]) -> Result<Vec<ChunkInfo>> {
        let n = tokens.len() / self.desc.chunk_tokens.max(1) as usize;
        let mut v: Vec<sys::swiftkv_chunk_info> = vec![unsafe { std::mem::zeroed() }; n];
        let mut chunks = 0usize;
        check(unsafe {
            sys::swiftkv_chunk_info_get(v.as_mut_ptr(), v.len(), &mut chunks, self.ctx.raw,
                                        self.id, tokens.as_ptr(), tokens.len())
        })?;
        v.truncate(chunks.min(n));
        Ok(v.iter().map(ChunkInfo::from_sys).collect())
    }

    /// How each named chunk is cached, recording no activity.
    pub fn chunk_info_named(&self, names: &[u8], name_bytes: u32) -> Result<Vec<ChunkInfo>> {
        let n = names.len() / name_bytes.max(1) as usize;
        let mut v: Vec<sys::swiftkv_chunk_info> = vec![unsafe { std::mem::zeroed() }; n];
        let mut chunks = 0usize;
        check(unsafe {
            sys::swiftkv_chunk_info_get_named(v.as_mut_ptr(), v.len(), &mut chunks, self.ctx.raw,
                                              self.id, names.as_ptr() as *const c_void,
                                              names.len(), name_bytes)
        })?;
        v.truncate(chunks.min(n));
        Ok(v.iter().map(ChunkInfo::from_sys).collect())
    }

    /// A library-made pool: regular pages, then stream pages shared by every layer.
    pub fn pool_create(&self, regular_pages: u32, stream_pages: u32) -> Result<Pool<'a>> {
        let mut id = 0;
        check(unsafe {
            sys::swiftkv_pool_create(&mut id, self.ctx.raw, self.id, regular_pages, stream_pages)
        })?;
        Ok(Pool { ctx: self.ctx, id, layers: self.desc.num_layers })
    }

    /// Registers the engine's own tensors as a pool.
    ///
    /// # Safety
    /// Every `desc.layer_base` pointer and the `layer_span_bytes` after it must stay valid
    /// memory of the model's layout for as long as the pool lives.
    pub unsafe fn pool_register(&self, desc: &PoolLayout) -> Result<Pool<'a>> {
        let d = sys::swiftkv_pool_desc {
            size: std::mem::size_of::<sys::swiftkv_pool_desc>() as u32,
            version: sys::SWIFTKV_POOL_DESC_VERSION,
            num_pages: desc.num_pages,
            stream_first: desc.stream_first,
            stream_pages: desc.stream_pages,
            reserved0: 0,
            layer_base: desc.layer_base.as_ptr(),
            layer_span_bytes: desc.layer_span_bytes,
            page_stride: desc.page_stride,
            kv_stride: desc.kv_stride,
            token_stride: desc.token_stride,
            head_stride: desc.head_stride,
        };
        let mut id = 0;
        check(sys::swiftkv_pool_register(&mut id, self.ctx.raw, self.id, &d))?;
        Ok(Pool { ctx: self.ctx, id, layers: self.desc.num_layers })
    }

    /// Begins an engine request over `pool`'s `pages`; finished when dropped.
    pub fn request<'p>(&self, pool: &'p Pool<'a>, tokens: &[u32], pages: &[i32],
                       load_from_tokens: u64) -> Result<Request<'p>> {
        self.request_shaped(pool, tokens, pages, load_from_tokens, RequestShape::LoadAndSave)
    }

    /// `request` of a given shape: load-only, save-only or both.
    pub fn request_shaped<'p>(&self, pool: &'p Pool<'a>, tokens: &[u32], pages: &[i32],
                              load_from_tokens: u64, shape: RequestShape) -> Result<Request<'p>> {
        let mut d = self.request_desc(pool, pages, load_from_tokens, shape);
        d.tokens = tokens.as_ptr();
        d.n_tokens = tokens.len() as u64;
        let mut id = 0;
        check(unsafe { sys::swiftkv_request_begin(&mut id, self.ctx.raw, &d) })?;
        Ok(Request { ctx: self.ctx, id, open: true, _pool: PhantomData, _not_sync: PhantomData })
    }

    /// A request of `n_tokens` tokens whose full chunks are named by the caller (`names`, one
    /// name of `name_bytes` per full chunk); the tokens themselves are not needed.
    pub fn request_named<'p>(&self, pool: &'p Pool<'a>, n_tokens: u64, names: &[u8],
                             name_bytes: u32, pages: &[i32], load_from_tokens: u64,
                             shape: RequestShape) -> Result<Request<'p>> {
        let mut d = self.request_desc(pool, pages, load_from_tokens, shape);
        d.n_tokens = n_tokens;
        d.names = names.as_ptr() as *const c_void;
        d.names_bytes = names.len() as u64;
        d.name_bytes = name_bytes;
        let mut id = 0;
        check(unsafe { sys::swiftkv_request_begin(&mut id, self.ctx.raw, &d) })?;
        Ok(Request { ctx: self.ctx, id, open: true, _pool: PhantomData, _not_sync: PhantomData })
    }

    fn request_desc(&self, pool: &Pool<'a>, pages: &[i32], load_from_tokens: u64,
                    shape: RequestShape) -> sys::swiftkv_request_desc {
        let mut d: sys::swiftkv_request_desc = unsafe { std::mem::zeroed() };
        d.size = std::mem::size_of::<sys::swiftkv_request_desc>() as u32;
        d.version = sys::SWIFTKV_REQUEST_DESC_VERSION;
        d.pool = pool.id;
        d.pages = pages.as_ptr();
        d.n_pages = pages.len() as u64;
        d.load_from_tokens = load_from_tokens;
        d.shape = shape as sys::swiftkv_request_shape;
        d
    }
}

// --- The lender's elastic region -------------------------------------------------------------------

/// `swiftkv_elastic_config` in Rust terms.
#[derive(Clone, Debug)]
pub struct ElasticConfig {
    pub lender: ModelDesc,
    pub borrower: Option<ModelDesc>,
    pub capacity_blocks: u64,
    pub owned_blocks: u64,
    pub window_ms: u64,
    pub lease_ms: u64,
    pub cuda_alloc: CudaAlloc,
    pub keep_committed: bool,
    /// A lease asked back is renewed to at most this long after the asking, then expires
    /// whether or not the borrower released it.
    pub reclaim_deadline_ms: u64,
    /// Host regions: 0 for one memfd, passed to a borrower in another process whole; else a
    /// multiple of the page size, one memfd per granule, passed with each lease as VMM device
    /// memory is (`SWIFTKV_MEMORY_HOST_GRANULES`).
    pub host_granule_bytes: u64,
}

impl ElasticConfig {
    /// The library's defaults (`swiftkv_elastic_config_init`) for the rest.
    pub fn new(lender: ModelDesc, borrower: Option<ModelDesc>, capacity_blocks: u64) -> Self {
        let c = library_defaults(sys::swiftkv_elastic_config_init);
        ElasticConfig {
            lender,
            borrower,
            capacity_blocks,
            owned_blocks: c.owned_blocks,
            window_ms: c.window_ms,
            lease_ms: c.lease_ms,
            cuda_alloc: match c.cuda_alloc {
                sys::SWIFTKV_CUDA_ALLOC_VMM => CudaAlloc::Vmm,
                sys::SWIFTKV_CUDA_ALLOC_MALLOC => CudaAlloc::Malloc,
                _ => CudaAlloc::Auto,
            },
            keep_committed: c.flags & sys::SWIFTKV_ELASTIC_KEEP_COMMITTED != 0,
            reclaim_deadline_ms: c.reclaim_deadline_ms,
            host_granule_bytes: c.host_granule_bytes,
        }
    }
}

/// A lender's elastic region (`swiftkv_elastic`); thread-safe.
pub struct Elastic<'a> {
    raw: *mut sys::swiftkv_elastic,
    _ctx: PhantomData<&'a Context>,
}

unsafe impl Send for Elastic<'_> {}
unsafe impl Sync for Elastic<'_> {}

fn zeroed_versioned<T>(version: u32) -> T {
    let mut v: T = unsafe { std::mem::zeroed() };
    // Every versioned struct starts with size and version (u32 each).
    unsafe {
        let p = &mut v as *mut T as *mut u32;
        *p = std::mem::size_of::<T>() as u32;
        *p.add(1) = version;
    }
    v
}

impl<'a> Elastic<'a> {
    fn new(ctx: &'a Context, c: &ElasticConfig) -> Result<Elastic<'a>> {
        let (l, _ln) = c.lender.raw()?;
        let b = c.borrower.as_ref().map(|b| b.raw()).transpose()?;
        let mut cfg: sys::swiftkv_elastic_config =
            zeroed_versioned(sys::SWIFTKV_ELASTIC_CONFIG_VERSION);
        cfg.lender = &l;
        cfg.borrower = b.as_ref().map_or(ptr::null(), |(d, _)| d as *const _);
        cfg.capacity_blocks = c.capacity_blocks;
        cfg.owned_blocks = c.owned_blocks;
        cfg.window_ms = c.window_ms;
        cfg.lease_ms = c.lease_ms;
        cfg.reclaim_deadline_ms = c.reclaim_deadline_ms;
        cfg.host_granule_bytes = c.host_granule_bytes;
        cfg.cuda_alloc = match c.cuda_alloc {
            CudaAlloc::Auto => sys::SWIFTKV_CUDA_ALLOC_AUTO,
            CudaAlloc::Vmm => sys::SWIFTKV_CUDA_ALLOC_VMM,
            CudaAlloc::Malloc => sys::SWIFTKV_CUDA_ALLOC_MALLOC,
        };
        cfg.flags = if c.keep_committed { sys::SWIFTKV_ELASTIC_KEEP_COMMITTED } else { 0 };
        let mut raw = ptr::null_mut();
        check(unsafe { sys::swiftkv_elastic_create(&mut raw, ctx.raw, &cfg) })?;
        Ok(Elastic { raw, _ctx: PhantomData })
    }

    pub fn layer_view(&self, layer: u32) -> Result<LayerView> {
        let mut v = library_defaults(sys::swiftkv_layer_view_init);
        check(unsafe { sys::swiftkv_elastic_layer_view(&mut v, self.raw, layer) })?;
        Ok(LayerView::from(&v))
    }

    /// Algorithm 1 ScaleUp, applied: (OK or IN_PROGRESS, lender blocks, borrower chunks).
    pub fn scale_for_request(&self, request_tokens: u64) -> Result<(Status, u64, u64)> {
        let (mut b, mut c) = (0, 0);
        let st = check(unsafe {
            sys::swiftkv_elastic_scale_for_request(&mut b, &mut c, self.raw, request_tokens)
        })?;
        Ok((st, b, c))
    }

    /// The periodic ScaleDown, applied.
    pub fn tick(&self, in_use_blocks: u64) -> Result<(Status, u64, u64)> {
        let (mut b, mut c) = (0, 0);
        let st = check(unsafe { sys::swiftkv_elastic_tick(&mut b, &mut c, self.raw, in_use_blocks) })?;
        Ok((st, b, c))
    }

    /// Sets the owned part to `owned_blocks` (whole lending units), applied: (OK, or
    /// IN_PROGRESS while leases on the units it took back are given back; lender blocks grown
    /// or shrunk; borrower chunks).
    pub fn resize(&self, owned_blocks: u64) -> Result<(Status, u64, u64)> {
        let (mut b, mut c) = (0, 0);
        let st =
            check(unsafe { sys::swiftkv_elastic_resize(&mut b, &mut c, self.raw, owned_blocks) })?;
        Ok((st, b, c))
    }

    pub fn lend(&self, max_units: u64) -> Result<Lease> {
        let mut l = library_defaults(sys::swiftkv_lease_init);
        check(unsafe { sys::swiftkv_elastic_lend(&mut l, self.raw, max_units) })?;
        Ok(Lease::from(&l))
    }

    pub fn lease(&self, id: u64) -> Result<Lease> {
        let mut l = library_defaults(sys::swiftkv_lease_init);
        check(unsafe { sys::swiftkv_elastic_lease_get(&mut l, self.raw, id) })?;
        Ok(Lease::from(&l))
    }

    pub fn renew(&self, id: u64) -> Result<()> {
        check(unsafe { sys::swiftkv_elastic_renew(self.raw, id) }).map(|_| ())
    }

    pub fn release(&self, id: u64) -> Result<()> {
        check(unsafe { sys::swiftkv_elastic_release(self.raw, id) }).map(|_| ())
    }

    pub fn reclaim(&self, id: u64) -> Result<()> {
        check(unsafe { sys::swiftkv_elastic_reclaim(self.raw, id) }).map(|_| ())
    }

    /// Blocks until no lease is asked back (each released or expired); `ETIMEDOUT` after
    /// `timeout_ms` milliseconds.
    pub fn wait_reclaims(&self, timeout_ms: u64) -> Result<()> {
        check(unsafe { sys::swiftkv_elastic_wait_reclaims(self.raw, timeout_ms) }).map(|_| ())
    }

    pub fn pending_reclaims(&self) -> Result<Vec<u64>> {
        let mut n = 0;
        check(unsafe { sys::swiftkv_elastic_pending_reclaims(ptr::null_mut(), 0, &mut n, self.raw) })?;
        let mut ids = vec![0u64; n.max(1)];
        check(unsafe {
            sys::swiftkv_elastic_pending_reclaims(ids.as_mut_ptr(), ids.len(), &mut n, self.raw)
        })?;
        ids.truncate(n.min(ids.len()));
        Ok(ids)
    }

    pub fn stats(&self) -> Result<ElasticStats> {
        let mut s = library_defaults(sys::swiftkv_elastic_stats_init);
        check(unsafe { sys::swiftkv_elastic_stats_get(&mut s, self.raw) })?;
        Ok(ElasticStats::from(&s))
    }

    /// Offers the region to other processes through the context's coord_endpoint.
    pub fn offer(&self, name: &str) -> Result<()> {
        let n = cstring(name, "name")?;
        check(unsafe { sys::swiftkv_elastic_offer(self.raw, n.as_ptr()) }).map(|_| ())
    }
}

impl Drop for Elastic<'_> {
    fn drop(&mut self) {
        unsafe { sys::swiftkv_elastic_destroy(self.raw) };
    }
}

// --- Pools and requests ------------------------------------------------------------------------------

/// The layout of an engine's own per-layer tensors (`swiftkv_pool_desc`); strides in elements.
#[derive(Clone, Debug)]
pub struct PoolLayout {
    pub num_pages: u32,
    pub stream_first: u32,
    pub stream_pages: u32,
    pub layer_base: Vec<*mut c_void>,
    pub layer_span_bytes: u64,
    pub page_stride: i64,
    pub kv_stride: i64,
    pub token_stride: i64,
    pub head_stride: i64,
}

/// A borrower's paged KV pool; destroyed when dropped.
pub struct Pool<'a> {
    ctx: &'a Context,
    id: u32,
    layers: u32,
}

impl<'a> Pool<'a> {
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The pool's layout (library-made pools: where the library put each layer).
    pub fn layout(&self) -> Result<PoolLayout> {
        let mut d: sys::swiftkv_pool_desc = zeroed_versioned(sys::SWIFTKV_POOL_DESC_VERSION);
        let mut model = 0;
        check(unsafe { sys::swiftkv_pool_get(&mut d, &mut model, self.ctx.raw, self.id) })?;
        let bases = unsafe { std::slice::from_raw_parts(d.layer_base, self.layers as usize) };
        Ok(PoolLayout {
            num_pages: d.num_pages,
            stream_first: d.stream_first,
            stream_pages: d.stream_pages,
            layer_base: bases.to_vec(),
            layer_span_bytes: d.layer_span_bytes,
            page_stride: d.page_stride,
            kv_stride: d.kv_stride,
            token_stride: d.token_stride,
            head_stride: d.head_stride,
        })
    }
}

impl Drop for Pool<'_> {
    fn drop(&mut self) {
        // Cannot be EBUSY: every Request borrows its pool, so none is open here.
        unsafe { sys::swiftkv_pool_destroy(self.ctx.raw, self.id) };
    }
}

/// A CUDA stream (`cudaStream_t`) as the library takes it, or `Stream::HOST` for host pools and
/// plans (the null stream). Copies and kernels are enqueued on it; the library never owns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stream(*mut c_void);

impl Stream {
    /// No stream: what host pools and host plans take.
    pub const HOST: Stream = Stream(ptr::null_mut());

    /// Wraps an engine's `cudaStream_t`.
    ///
    /// # Safety
    /// `raw` must be a CUDA stream of the device the pool or plan is on (or null), alive for
    /// every call it is passed to and until the work enqueued on it has run.
    pub unsafe fn from_raw(raw: *mut c_void) -> Stream {
        Stream(raw)
    }

    pub fn as_raw(self) -> *mut c_void {
        self.0
    }
}

impl Default for Stream {
    fn default() -> Stream {
        Stream::HOST
    }
}

/// An engine request through the connector; finished (waiting for its copies) when dropped.
/// It borrows the pool whose pages it copies, so the pool cannot go while it is open:
///
/// ```
/// # use swiftkv::*;
/// # fn f(model: &Model<'_>) -> Result<()> {
/// let pool = model.pool_create(8, 0)?;
/// let r = model.request(&pool, &[1, 2, 3], &[0], 0)?;
/// r.wait_save(Stream::HOST)?;
/// drop(r);
/// drop(pool);
/// # Ok(())
/// # }
/// ```
///
/// and the same with the pool dropped first does not compile:
///
/// ```compile_fail,E0505
/// # use swiftkv::*;
/// # fn f(model: &Model<'_>) -> Result<()> {
/// let pool = model.pool_create(8, 0)?;
/// let r = model.request(&pool, &[1, 2, 3], &[0], 0)?;
/// drop(pool);
/// r.wait_save(Stream::HOST)?;
/// # Ok(())
/// # }
/// ```
pub struct Request<'p> {
    ctx: &'p Context,
    id: u64,
    open: bool,
    _pool: PhantomData<&'p Pool<'p>>,
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

unsafe impl Send for Request<'_> {}

impl Request<'_> {
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Starts the loads; `stream` is a CUDA stream for device pools (null on the host).
    pub fn start_load(&self, stream: Stream) -> Result<()> {
        check(unsafe { sys::swiftkv_start_load(self.ctx.raw, self.id, stream.0) }).map(|_| ())
    }

    /// Layer `layer` is in the pages; the end of the valid loaded tokens.
    pub fn wait_layer_load(&self, layer: u32, stream: Stream) -> Result<u64> {
        let mut v = 0;
        check(unsafe {
            sys::swiftkv_wait_layer_load(&mut v, self.ctx.raw, self.id, layer, stream.0)
        })?;
        Ok(v)
    }

    pub fn save_layer(&self, layer: u32, stream: Stream) -> Result<()> {
        check(unsafe { sys::swiftkv_save_layer(self.ctx.raw, self.id, layer, stream.0) }).map(|_| ())
    }

    pub fn wait_save(&self, stream: Stream) -> Result<u64> {
        let mut n = 0;
        check(unsafe { sys::swiftkv_wait_save(&mut n, self.ctx.raw, self.id, stream.0) })?;
        Ok(n)
    }

    pub fn info(&self) -> Result<RequestInfo> {
        let mut i = library_defaults(sys::swiftkv_request_info_init);
        check(unsafe { sys::swiftkv_request_info_get(&mut i, self.ctx.raw, self.id) })?;
        Ok(RequestInfo::from(&i))
    }

    /// Ends the request and returns its final info.
    pub fn finish(mut self) -> Result<RequestInfo> {
        self.open = false;
        let mut i = library_defaults(sys::swiftkv_request_info_init);
        check(unsafe { sys::swiftkv_request_finish(&mut i, self.ctx.raw, self.id) })?;
        Ok(RequestInfo::from(&i))
    }
}

/// The context of a batch and its request ids: one context for all (EINVAL otherwise).
fn batch_of(requests: &[&Request<'_>]) -> Result<(*mut sys::swiftkv_ctx, Vec<u64>)> {
    let raw = match requests.first() {
        Some(r) => r.ctx.raw,
        None => return Ok((ptr::null_mut(), Vec::new())),
    };
    if requests.iter().any(|r| r.ctx.raw != raw) {
        return Err(invalid("the requests of a batch belong to one context"));
    }
    Ok((raw, requests.iter().map(|r| r.id).collect()))
}

/// `wait_layer_load(layer)` for every request of a step in one call (`swiftkv_wait_layer_load_batch`):
/// each request is checked first, and a bad one fails the call with none of them changed. The
/// valid ends, in order.
pub fn wait_layer_load_batch(
    requests: &[&Request<'_>],
    layer: u32,
    stream: Stream,
) -> Result<Vec<u64>> {
    let (raw, ids) = batch_of(requests)?;
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = vec![0u64; ids.len()];
    check(unsafe {
        sys::swiftkv_wait_layer_load_batch(
            out.as_mut_ptr(),
            raw,
            ids.as_ptr(),
            ids.len(),
            layer,
            stream.0,
        )
    })?;
    Ok(out)
}

/// `save_layer(layer)` for every request of a step in one call (`swiftkv_save_layer_batch`),
/// checked as [`wait_layer_load_batch`] is.
pub fn save_layer_batch(requests: &[&Request<'_>], layer: u32, stream: Stream) -> Result<()> {
    let (raw, ids) = batch_of(requests)?;
    if ids.is_empty() {
        return Ok(());
    }
    check(unsafe { sys::swiftkv_save_layer_batch(raw, ids.as_ptr(), ids.len(), layer, stream.0) })
        .map(|_| ())
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        if self.open {
            unsafe { sys::swiftkv_request_finish(ptr::null_mut(), self.ctx.raw, self.id) };
        }
    }
}

// --- Multi-token paged attention ---------------------------------------------------------------------

/// `swiftkv_attention_desc`.
#[derive(Clone, Copy, Debug)]
pub struct AttentionDesc {
    pub device: i32,
    pub dtype: DType,
    pub num_qo_heads: u32,
    pub num_kv_heads: u32,
    pub head_dim: u32,
    pub page_tokens: u32,
    pub causal: bool,
    pub kv_chunk_tokens: u32,
    pub sm_scale: f32,
    pub logits_soft_cap: f32,
}

impl AttentionDesc {
    /// The library's defaults (`swiftkv_attention_desc_init`) for the rest.
    pub fn new(num_qo_heads: u32, num_kv_heads: u32, head_dim: u32, dtype: DType) -> Self {
        let d = library_defaults(sys::swiftkv_attention_desc_init);
        AttentionDesc {
            device: d.device,
            dtype,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_tokens: d.page_tokens,
            causal: d.causal != 0,
            kv_chunk_tokens: d.kv_chunk_tokens,
            sm_scale: d.sm_scale,
            logits_soft_cap: d.logits_soft_cap,
        }
    }

    fn raw(&self) -> sys::swiftkv_attention_desc {
        let mut d: sys::swiftkv_attention_desc = zeroed_versioned(sys::SWIFTKV_ATTENTION_DESC_VERSION);
        d.device = self.device;
        d.dtype = self.dtype as sys::swiftkv_dtype;
        d.num_qo_heads = self.num_qo_heads;
        d.num_kv_heads = self.num_kv_heads;
        d.head_dim = self.head_dim;
        d.page_tokens = self.page_tokens;
        d.causal = self.causal as u32;
        d.kv_chunk_tokens = self.kv_chunk_tokens;
        d.sm_scale = self.sm_scale;
        d.logits_soft_cap = self.logits_soft_cap;
        d
    }

    pub fn workspace_size(&self, max_requests: u32, max_q_tokens: u64) -> Result<u64> {
        let d = self.raw();
        let mut n = 0;
        check(unsafe { sys::swiftkv_attention_workspace_size(&mut n, &d, max_requests, max_q_tokens) })?;
        Ok(n)
    }
}

/// A plan over one batch; run it any number of times over tensors of those lengths.
pub struct AttentionPlan {
    raw: sys::swiftkv_attention_plan,
}

/// The tensors of one run (`swiftkv_attention_args`); strides in elements.
#[derive(Clone, Copy, Debug)]
pub struct AttentionArgs {
    pub q: *const c_void,
    pub q_token_stride: i64,
    pub q_head_stride: i64,
    pub k_base: *const c_void,
    pub v_base: *const c_void,
    pub page_stride: i64,
    pub token_stride: i64,
    pub head_stride: i64,
    pub num_pages: u32,
    pub kv_indices: *const i32,
    pub out: *mut c_void,
    pub out_token_stride: i64,
    pub out_head_stride: i64,
    pub lse: *mut f32,
}

impl AttentionPlan {
    /// Plans a batch into `workspace` (256-byte aligned; device memory for a device plan).
    ///
    /// # Safety
    /// `workspace` must point to `workspace_bytes` bytes that stay valid for every run.
    pub unsafe fn new(desc: &AttentionDesc, qo_indptr: &[i32], kv_indptr: &[i32],
                      kv_last_page_len: &[i32], workspace: *mut c_void, workspace_bytes: u64,
                      stream: Stream) -> Result<AttentionPlan> {
        if qo_indptr.len() != kv_last_page_len.len() + 1 || kv_indptr.len() != qo_indptr.len() {
            return Err(invalid("qo_indptr and kv_indptr need one entry more than kv_last_page_len"));
        }
        let d = desc.raw();
        let mut p: sys::swiftkv_attention_plan = zeroed_versioned(sys::SWIFTKV_ATTENTION_PLAN_VERSION);
        check(sys::swiftkv_attention_plan_make(&mut p, &d, qo_indptr.as_ptr(), kv_indptr.as_ptr(),
                                               kv_last_page_len.as_ptr(),
                                               kv_last_page_len.len() as u32, workspace,
                                               workspace_bytes, stream.0))?;
        Ok(AttentionPlan { raw: p })
    }

    pub fn counts(&self) -> &sys::swiftkv_attention_plan {
        &self.raw
    }

    /// Runs the plan.
    ///
    /// # Safety
    /// Every pointer in `args` must reach the elements its strides and the plan's lengths
    /// imply, in the plan's memory (host or device), and `workspace` must be the plan's.
    pub unsafe fn run(&self, args: &AttentionArgs, workspace: *mut c_void,
                      stream: Stream) -> Result<()> {
        let mut a: sys::swiftkv_attention_args = zeroed_versioned(sys::SWIFTKV_ATTENTION_ARGS_VERSION);
        a.q = args.q;
        a.q_token_stride = args.q_token_stride;
        a.q_head_stride = args.q_head_stride;
        a.k_base = args.k_base;
        a.v_base = args.v_base;
        a.page_stride = args.page_stride;
        a.token_stride = args.token_stride;
        a.head_stride = args.head_stride;
        a.num_pages = args.num_pages;
        a.kv_indices = args.kv_indices;
        a.out = args.out;
        a.out_token_stride = args.out_token_stride;
        a.out_head_stride = args.out_head_stride;
        a.lse = args.lse;
        check(sys::swiftkv_attention_run(&self.raw, &a, workspace, stream.0)).map(|_| ())
    }
}

// --- Safe forms of the structs the library fills: the sys structs' fields but size, version and
// the reserved ones, flags as bool. ----------------------------------------------------------

/// A context's counters (`swiftkv_stats`); per-tier arrays are indexed by `Tier as usize` (peer,
/// host, disk), the remote tier's counts are fields of their own.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    pub chunks: [u64; 3],
    pub bytes: [u64; 3],
    pub capacity_bytes: [u64; 3],
    pub hits: [u64; 3],
    pub misses: u64,
    pub stores: u64,
    pub stores_rejected: u64,
    pub evictions: u64,
    pub demotions: u64,
    pub promotions: u64,
    pub load_failures: u64,
    pub revocations: u64,
    pub corrupt_files_removed: u64,
    pub demotions_deferred: u64,
    pub disk_files_skipped: u64,
    pub disk_records_mismatched: u64,
    pub disk_segments_cleaned: u64,
    pub disk_bytes_relocated: u64,
    pub disk_bytes_allocated: u64,
    pub index_bytes: u64,
    pub index_capacity_chunks: u64,
    pub requests_open: u64,
    pub remote_chunks: u64,
    pub remote_bytes: u64,
    pub remote_capacity_bytes: u64,
    pub remote_hits: u64,
    /// Segments the filesystem could not give (a full disk); `swiftkv_stats` version 5.
    pub disk_full_refusals: u64,
}

impl From<&sys::swiftkv_stats> for Stats {
    fn from(c: &sys::swiftkv_stats) -> Stats {
        Stats {
            chunks: c.chunks,
            bytes: c.bytes,
            capacity_bytes: c.capacity_bytes,
            hits: c.hits,
            misses: c.misses,
            stores: c.stores,
            stores_rejected: c.stores_rejected,
            evictions: c.evictions,
            demotions: c.demotions,
            promotions: c.promotions,
            load_failures: c.load_failures,
            revocations: c.revocations,
            corrupt_files_removed: c.corrupt_files_removed,
            demotions_deferred: c.demotions_deferred,
            disk_files_skipped: c.disk_files_skipped,
            disk_records_mismatched: c.disk_records_mismatched,
            disk_segments_cleaned: c.disk_segments_cleaned,
            disk_bytes_relocated: c.disk_bytes_relocated,
            disk_bytes_allocated: c.disk_bytes_allocated,
            index_bytes: c.index_bytes,
            index_capacity_chunks: c.index_capacity_chunks,
            requests_open: c.requests_open,
            remote_chunks: c.remote_chunks,
            remote_bytes: c.remote_bytes,
            remote_capacity_bytes: c.remote_capacity_bytes,
            remote_hits: c.remote_hits,
            disk_full_refusals: c.disk_full_refusals,
        }
    }
}

/// The coordinator's counters (`swiftkv_coord_stats`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CoordStats {
    pub offered_regions: u64,
    pub sessions_served: u64,
    pub lenders_connected: u64,
    pub messages_sent: u64,
    pub messages_received: u64,
    pub messages_dropped: u64,
    pub heartbeats_sent: u64,
    pub heartbeats_answered: u64,
    pub reclaims_sent: u64,
    pub reclaims_acked: u64,
    pub reclaim_ns_total: u64,
    pub reclaim_ns_max: u64,
    pub leases_lost: u64,
    pub lenders_lost: u64,
    /// Sessions on this context's regions reached over UCX, now.
    pub remote_sessions: u64,
    /// Lenders this context reaches over UCX, now.
    pub remote_lenders: u64,
    /// Grants this side could not use (forged keys, bad ranges), given straight back.
    pub grants_refused: u64,
    pub rma_batches: u64,
    pub rma_batches_failed: u64,
    pub rma_bytes_read: u64,
    pub rma_bytes_written: u64,
}

impl From<&sys::swiftkv_coord_stats> for CoordStats {
    fn from(c: &sys::swiftkv_coord_stats) -> CoordStats {
        CoordStats {
            offered_regions: c.offered_regions,
            sessions_served: c.sessions_served,
            lenders_connected: c.lenders_connected,
            messages_sent: c.messages_sent,
            messages_received: c.messages_received,
            messages_dropped: c.messages_dropped,
            heartbeats_sent: c.heartbeats_sent,
            heartbeats_answered: c.heartbeats_answered,
            reclaims_sent: c.reclaims_sent,
            reclaims_acked: c.reclaims_acked,
            reclaim_ns_total: c.reclaim_ns_total,
            reclaim_ns_max: c.reclaim_ns_max,
            leases_lost: c.leases_lost,
            lenders_lost: c.lenders_lost,
            remote_sessions: c.remote_sessions,
            remote_lenders: c.remote_lenders,
            grants_refused: c.grants_refused,
            rma_batches: c.rma_batches,
            rma_batches_failed: c.rma_batches_failed,
            rma_bytes_read: c.rma_bytes_read,
            rma_bytes_written: c.rma_bytes_written,
        }
    }
}

/// Where one layer of an elastic region lies (`swiftkv_layer_view`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerView {
    pub base: *mut c_void,
    pub page_stride: u64,
    pub k_offset: u64,
    pub v_offset: u64,
    pub token_stride: u64,
    pub head_stride: u64,
    pub num_pages: u64,
    pub device: i32,
}

impl From<&sys::swiftkv_layer_view> for LayerView {
    fn from(c: &sys::swiftkv_layer_view) -> LayerView {
        LayerView {
            base: c.base,
            page_stride: c.page_stride,
            k_offset: c.k_offset,
            v_offset: c.v_offset,
            token_stride: c.token_stride,
            head_stride: c.head_stride,
            num_pages: c.num_pages,
            device: c.device,
        }
    }
}

/// A lease on an elastic region's blocks (`swiftkv_lease`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lease {
    pub id: u64,
    pub first_block: u64,
    pub blocks: u64,
    pub chunks: u64,
    pub offset: u64,
    pub bytes: u64,
    pub data: *mut c_void,
    pub chunk_stride: u64,
    pub layer_stride: u64,
    pub expires_ns: u64,
    pub reclaim_requested: bool,
}

impl From<&sys::swiftkv_lease> for Lease {
    fn from(c: &sys::swiftkv_lease) -> Lease {
        Lease {
            id: c.id,
            first_block: c.first_block,
            blocks: c.blocks,
            chunks: c.chunks,
            offset: c.offset,
            bytes: c.bytes,
            data: c.data,
            chunk_stride: c.chunk_stride,
            layer_stride: c.layer_stride,
            expires_ns: c.expires_ns,
            reclaim_requested: c.reclaim_requested != 0,
        }
    }
}

/// An elastic region's counts (`swiftkv_elastic_stats`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ElasticStats {
    pub capacity_blocks: u64,
    pub owned_blocks: u64,
    pub ready_blocks: u64,
    pub reclaiming_blocks: u64,
    pub lent_blocks: u64,
    pub free_blocks: u64,
    pub unit_lender_blocks: u64,
    pub unit_borrower_chunks: u64,
    pub leases: u64,
    pub region_bytes: u64,
    pub committed_bytes: u64,
    pub scale_ups: u64,
    pub scale_downs: u64,
    pub leases_granted: u64,
    pub leases_expired: u64,
    pub reclaims_requested: u64,
    pub memory_kind: u32,
    pub device: i32,
}

impl From<&sys::swiftkv_elastic_stats> for ElasticStats {
    fn from(c: &sys::swiftkv_elastic_stats) -> ElasticStats {
        ElasticStats {
            capacity_blocks: c.capacity_blocks,
            owned_blocks: c.owned_blocks,
            ready_blocks: c.ready_blocks,
            reclaiming_blocks: c.reclaiming_blocks,
            lent_blocks: c.lent_blocks,
            free_blocks: c.free_blocks,
            unit_lender_blocks: c.unit_lender_blocks,
            unit_borrower_chunks: c.unit_borrower_chunks,
            leases: c.leases,
            region_bytes: c.region_bytes,
            committed_bytes: c.committed_bytes,
            scale_ups: c.scale_ups,
            scale_downs: c.scale_downs,
            leases_granted: c.leases_granted,
            leases_expired: c.leases_expired,
            reclaims_requested: c.reclaims_requested,
            memory_kind: c.memory_kind as u32,
            device: c.device,
        }
    }
}

/// Where a connector request stands (`swiftkv_request_info`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RequestInfo {
    pub load_begin_tokens: u64,
    pub load_end_tokens: u64,
    pub valid_end_tokens: u64,
    pub save_tokens: u64,
    pub saved_tokens: u64,
    pub layers_loaded: u32,
    pub layers_saved: u32,
    pub stream_ordered: bool,
}

impl From<&sys::swiftkv_request_info> for RequestInfo {
    fn from(c: &sys::swiftkv_request_info) -> RequestInfo {
        RequestInfo {
            load_begin_tokens: c.load_begin_tokens,
            load_end_tokens: c.load_end_tokens,
            valid_end_tokens: c.valid_end_tokens,
            save_tokens: c.save_tokens,
            saved_tokens: c.saved_tokens,
            layers_loaded: c.layers_loaded,
            layers_saved: c.layers_saved,
            stream_ordered: c.stream_ordered != 0,
        }
    }
}
