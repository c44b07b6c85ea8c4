// Package swiftkv is the Go binding of libswiftkv, the KV-cache memory layer that lets
// co-located LLMs share KV memory: a lender's elastic region, a borrower's chunk cache over peer,
// host and disk tiers, per-layer loads and saves into an engine's own pages, the coordinator
// between processes, and multi-token paged attention.
//
// Every call that can fail returns an error of type *Error (the library's status and message).
// Handles (Context, Elastic, Pool, Request) end their C object on Close, or at the latest when
// the garbage collector finds them. Memory the library keeps pointers to after a call returns
// (engine tensors, attention tensors) must not be Go memory: pass addresses of C or device
// memory (HostBuffer allocates C memory).
package swiftkv

/*
#cgo pkg-config: swiftkv
#include <stdlib.h>
#include <string.h>
#include "swiftkv/swiftkv.h"

extern void swiftkvGoChunkEvent(swiftkv_chunk_event *e, void *user);

static swiftkv_status swiftkv_go_set_events(swiftkv_ctx *ctx, uintptr_t handle) {
  if (handle == 0) return swiftkv_set_chunk_event_callback(ctx, NULL, NULL);
  return swiftkv_set_chunk_event_callback(ctx, (swiftkv_chunk_event_fn)swiftkvGoChunkEvent,
                                          (void *)handle);
}
static uint64_t swiftkv_go_lease_all(void) { return SWIFTKV_LEASE_ALL; }
static uint32_t swiftkv_go_model_all(void) { return SWIFTKV_MODEL_ALL; }
*/
import "C"

import (
	"fmt"
	"runtime"
	"runtime/cgo"
	"sync"
	"unsafe"
)

// Status is a swiftkv_status: 0 and 1 are not errors, every error is negative.
type Status int32

const (
	OK           Status = C.SWIFTKV_OK
	InProgress   Status = C.SWIFTKV_IN_PROGRESS
	EINVAL       Status = C.SWIFTKV_EINVAL
	ENOMEM       Status = C.SWIFTKV_ENOMEM
	ENOTFOUND    Status = C.SWIFTKV_ENOTFOUND
	EBUSY        Status = C.SWIFTKV_EBUSY
	EIO          Status = C.SWIFTKV_EIO
	ECUDA        Status = C.SWIFTKV_ECUDA
	ENODEV       Status = C.SWIFTKV_ENODEV
	EPEER        Status = C.SWIFTKV_EPEER
	ETIMEDOUT    Status = C.SWIFTKV_ETIMEDOUT
	EVERSION     Status = C.SWIFTKV_EVERSION
	EUNSUPPORTED Status = C.SWIFTKV_EUNSUPPORTED
	EUSER        Status = C.SWIFTKV_EUSER
	ESTATE       Status = C.SWIFTKV_ESTATE
	EINTERNAL    Status = C.SWIFTKV_EINTERNAL
)

func (s Status) String() string { return C.GoString(C.swiftkv_status_string(C.swiftkv_status(s))) }

// Error is a failed call: its status and the library's message.
type Error struct {
	Status  Status
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Status, e.Message) }

// call runs one C call on a locked OS thread, so that the thread-local message read after a
// failure is this call's.
func call(f func() C.swiftkv_status) (Status, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	st := f()
	if st >= 0 {
		return Status(st), nil
	}
	return Status(st), &Error{Status(st), C.GoString(C.swiftkv_last_error_message())}
}

func check(f func() C.swiftkv_status) error {
	_, err := call(f)
	return err
}

// cnew allocates a zeroed T in C memory (structs that carry pointers must live there).
func cnew[T any]() *T {
	var zero T
	return (*T)(C.calloc(1, C.size_t(unsafe.Sizeof(zero))))
}

func cfree[T any](p *T) { C.free(unsafe.Pointer(p)) }

// cslice copies a Go slice into C memory; free it with C.free.
func cslice[T any](s []T) *T {
	if len(s) == 0 {
		return nil
	}
	var zero T
	p := C.malloc(C.size_t(uintptr(len(s)) * unsafe.Sizeof(zero)))
	copy(unsafe.Slice((*T)(p), len(s)), s)
	return (*T)(p)
}

// DType is a KV element type.
type DType int32

const (
	F16     DType = C.SWIFTKV_DTYPE_F16
	BF16    DType = C.SWIFTKV_DTYPE_BF16
	F32     DType = C.SWIFTKV_DTYPE_F32
	FP8E4M3 DType = C.SWIFTKV_DTYPE_FP8_E4M3
	FP8E5M2 DType = C.SWIFTKV_DTYPE_FP8_E5M2
	I8      DType = C.SWIFTKV_DTYPE_I8
)

// Size is the bytes of one element (0 for a value that is not a DType).
func (d DType) Size() uint32 { return uint32(C.swiftkv_dtype_size(C.swiftkv_dtype(d))) }

func (d DType) String() string {
	return enumName(int64(d), map[int64]string{int64(F16): "F16", int64(BF16): "BF16",
		int64(F32): "F32", int64(FP8E4M3): "FP8E4M3", int64(FP8E5M2): "FP8E5M2", int64(I8): "I8"},
		"DType")
}

// enumName is the constant's name, or what the value is when it names none.
func enumName(v int64, names map[int64]string, typ string) string {
	if n, ok := names[v]; ok {
		return n
	}
	return fmt.Sprintf("%s(%d)", typ, v)
}

// Tier is where a chunk lives.
type Tier uint32

const (
	Peer    Tier = C.SWIFTKV_TIER_PEER
	Host    Tier = C.SWIFTKV_TIER_HOST
	Disk    Tier = C.SWIFTKV_TIER_DISK
	Dropped Tier = C.SWIFTKV_TIER_DROPPED
	Remote  Tier = C.SWIFTKV_TIER_REMOTE // memory lent by another host (numbered after Dropped)
)

func (t Tier) String() string {
	return enumName(int64(t), map[int64]string{int64(Peer): "Peer", int64(Host): "Host",
		int64(Disk): "Disk", int64(Dropped): "Dropped", int64(Remote): "Remote"}, "Tier")
}

// TierOrder is swiftkv_tier_order: where the remote tier stands in the chunk cache's chain.
type TierOrder uint32

const (
	TierOrderRemoteFirst TierOrder = C.SWIFTKV_TIER_ORDER_REMOTE_FIRST // peer, remote, host, disk
	TierOrderHostFirst   TierOrder = C.SWIFTKV_TIER_ORDER_HOST_FIRST   // peer, host, remote, disk
)

func (o TierOrder) String() string {
	return enumName(int64(o), map[int64]string{int64(TierOrderRemoteFirst): "RemoteFirst",
		int64(TierOrderHostFirst): "HostFirst"}, "TierOrder")
}

// Role is what a registered model does: borrow memory and cache chunks, or lend its own.
type Role int32

const (
	Borrower Role = C.SWIFTKV_ROLE_BORROWER
	Lender   Role = C.SWIFTKV_ROLE_LENDER
)

func (r Role) String() string {
	return enumName(int64(r), map[int64]string{int64(Borrower): "Borrower",
		int64(Lender): "Lender"}, "Role")
}

// CudaAlloc is how a device elastic region gets its memory.
type CudaAlloc int32

const (
	CudaAllocAuto   CudaAlloc = C.SWIFTKV_CUDA_ALLOC_AUTO   // VMM where the device has it, else cudaMalloc
	CudaAllocVMM    CudaAlloc = C.SWIFTKV_CUDA_ALLOC_VMM    // VMM granules, committed as it grows
	CudaAllocMalloc CudaAlloc = C.SWIFTKV_CUDA_ALLOC_MALLOC // one cudaMalloc, shared by an IPC handle
)

func (a CudaAlloc) String() string {
	return enumName(int64(a), map[int64]string{int64(CudaAllocAuto): "CudaAllocAuto",
		int64(CudaAllocVMM): "CudaAllocVMM", int64(CudaAllocMalloc): "CudaAllocMalloc"}, "CudaAlloc")
}

// MemoryKind is the memory behind an elastic region.
type MemoryKind int32

const (
	MemoryHostMemfd    MemoryKind = C.SWIFTKV_MEMORY_HOST_MEMFD    // one memfd, passed to a borrower whole
	MemoryCudaVMM      MemoryKind = C.SWIFTKV_MEMORY_CUDA_VMM      // device granules, passed with each lease
	MemoryCudaIPC      MemoryKind = C.SWIFTKV_MEMORY_CUDA_IPC      // one cudaMalloc, shared by an IPC handle
	MemoryHostGranules MemoryKind = C.SWIFTKV_MEMORY_HOST_GRANULES // one memfd per granule, passed with each lease
)

func (k MemoryKind) String() string {
	return enumName(int64(k), map[int64]string{int64(MemoryHostMemfd): "MemoryHostMemfd",
		int64(MemoryCudaVMM): "MemoryCudaVMM", int64(MemoryCudaIPC): "MemoryCudaIPC",
		int64(MemoryHostGranules): "MemoryHostGranules"}, "MemoryKind")
}

const (
	DeviceHost = int32(C.SWIFTKV_DEVICE_HOST)
	TiersAll   = uint32(C.SWIFTKV_TIERS_ALL)
)

var (
	LeaseAll = uint64(C.swiftkv_go_lease_all())
	ModelAll = uint32(C.swiftkv_go_model_all())
)

// Version is MAJOR*10000 + MINOR*100 + PATCH.
func Version() uint32          { return uint32(C.swiftkv_version()) }
func VersionString() string    { return C.GoString(C.swiftkv_version_string()) }
func LastErrorMessage() string { return C.GoString(C.swiftkv_last_error_message()) }

// DeviceCount is the number of CUDA devices this process can use.
func DeviceCount() (uint32, error) {
	var n C.uint32_t
	err := check(func() C.swiftkv_status { return C.swiftkv_device_count(&n) })
	return uint32(n), err
}

// --- Geometry and planning --------------------------------------------------------------------

// ModelDesc is a model's KV geometry.
type ModelDesc struct {
	Name        string
	NumLayers   uint32
	NumKVHeads  uint32
	HeadDim     uint32
	BlockTokens uint32
	ChunkTokens uint32
	DType       DType
	Device      int32
	// Identity goes into every chunk key with the name: a weights revision, an adapter, a
	// tenant or a salt. Models differing only in it never share chunks. "" is none.
	Identity string
}

// NewModelDesc is a model with the library's defaults for the rest (swiftkv_model_desc_init: a
// host f16 model with 16-token blocks and 256-token chunks).
func NewModelDesc(name string, layers, kvHeads, headDim uint32) ModelDesc {
	var d C.swiftkv_model_desc
	C.swiftkv_model_desc_init(&d)
	return ModelDesc{name, layers, kvHeads, headDim, uint32(d.block_tokens),
		uint32(d.chunk_tokens), DType(d.dtype), int32(d.device), ""}
}

// cdesc returns the descriptor in C memory and a function that frees it.
func (m ModelDesc) cdesc() (*C.swiftkv_model_desc, func()) {
	d := cnew[C.swiftkv_model_desc]()
	d.size = C.uint32_t(unsafe.Sizeof(*d))
	d.version = C.SWIFTKV_MODEL_DESC_VERSION
	var name *C.char
	if m.Name != "" {
		name = C.CString(m.Name)
	}
	d.name = name
	d.num_layers = C.uint32_t(m.NumLayers)
	d.num_kv_heads = C.uint32_t(m.NumKVHeads)
	d.head_dim = C.uint32_t(m.HeadDim)
	d.block_tokens = C.uint32_t(m.BlockTokens)
	d.chunk_tokens = C.uint32_t(m.ChunkTokens)
	d.dtype = C.swiftkv_dtype(m.DType)
	d.device = C.int32_t(m.Device)
	var identity *C.char
	if m.Identity != "" {
		identity = C.CString(m.Identity)
	}
	d.identity = identity
	return d, func() { C.free(unsafe.Pointer(name)); C.free(unsafe.Pointer(identity)); cfree(d) }
}

// BytesPerToken is the KV bytes of one token over all layers.
func (m ModelDesc) BytesPerToken() (uint64, error) {
	d, free := m.cdesc()
	defer free()
	var n C.uint64_t
	err := check(func() C.swiftkv_status { return C.swiftkv_geometry_bytes_per_token(d, &n) })
	return uint64(n), err
}

// ChunkBytes is the bytes of one cached chunk.
func (m ModelDesc) ChunkBytes() (uint64, error) {
	n, err := m.BytesPerToken()
	return n * uint64(m.ChunkTokens), err
}

// MEU is the minimum elastic unit (Eq. 6-9) in blocks of the borrower and of the lender.
func MEU(borrower, lender ModelDesc) (uint64, uint64, error) {
	b, fb := borrower.cdesc()
	defer fb()
	l, fl := lender.cdesc()
	defer fl()
	var ob, ol C.uint64_t
	err := check(func() C.swiftkv_status { return C.swiftkv_geometry_meu(b, l, &ob, &ol) })
	return uint64(ob), uint64(ol), err
}

// LendUnit is the unit elastic regions lend in: borrower chunks and lender blocks.
func LendUnit(borrower, lender ModelDesc) (uint64, uint64, error) {
	b, fb := borrower.cdesc()
	defer fb()
	l, fl := lender.cdesc()
	defer fl()
	var oc, ol C.uint64_t
	err := check(func() C.swiftkv_status { return C.swiftkv_geometry_lend_unit(&oc, &ol, b, l) })
	return uint64(oc), uint64(ol), err
}

// CapacityPlan is a borrower's split of its KV memory (Eq. 1-5).
type CapacityPlan struct {
	StreamBlocks, RegularBlocks, MaxContextTokens, BaselineContextTokens, LenderFullBlocks uint64
}

func PlanBorrower(borrower ModelDesc, borrowerKVBytes uint64, lenderKVBytes []uint64) (CapacityPlan, error) {
	b, fb := borrower.cdesc()
	defer fb()
	lenders := cslice(lenderKVBytes)
	defer C.free(unsafe.Pointer(lenders))
	var out C.swiftkv_capacity_plan
	out.size = C.uint32_t(unsafe.Sizeof(out))
	out.version = C.SWIFTKV_CAPACITY_PLAN_VERSION
	err := check(func() C.swiftkv_status {
		return C.swiftkv_plan_borrower(b, C.uint64_t(borrowerKVBytes), (*C.uint64_t)(unsafe.Pointer(lenders)),
			C.size_t(len(lenderKVBytes)), &out)
	})
	return CapacityPlan{uint64(out.stream_blocks), uint64(out.regular_blocks),
		uint64(out.max_context_tokens), uint64(out.baseline_context_tokens),
		uint64(out.lender_full_blocks)}, err
}

// PlanScaleUp is Algorithm 1 ScaleUp: the lender's and the borrower's deltas in blocks.
func PlanScaleUp(owned uint64, blockTokens uint32, meuLender, meuBorrower, requestTokens uint64) (uint64, uint64, error) {
	var l, b C.uint64_t
	err := check(func() C.swiftkv_status {
		return C.swiftkv_plan_scale_up(C.uint64_t(owned), C.uint32_t(blockTokens), C.uint64_t(meuLender),
			C.uint64_t(meuBorrower), C.uint64_t(requestTokens), &l, &b)
	})
	return uint64(l), uint64(b), err
}

// PlanScaleDown is Algorithm 1 ScaleDown.
func PlanScaleDown(owned uint64, blockTokens uint32, meuLender, meuBorrower, maxTokens uint64) (uint64, uint64, error) {
	var l, b C.uint64_t
	err := check(func() C.swiftkv_status {
		return C.swiftkv_plan_scale_down(C.uint64_t(owned), C.uint32_t(blockTokens), C.uint64_t(meuLender),
			C.uint64_t(meuBorrower), C.uint64_t(maxTokens), &l, &b)
	})
	return uint64(l), uint64(b), err
}

// --- The context ----------------------------------------------------------------------------------

// Config is swiftkv_ctx_config; DefaultConfig gives the header's defaults.
type Config struct {
	DeviceMask             uint64
	HostBudgetBytes        uint64
	HostNUMANode           int32
	DiskPath               string
	DiskBudgetBytes        uint64
	EvictionLRU            bool // false: the retention policy (the default)
	DemoteFreePercent      uint32
	RecomputeTokenCost     float64
	RecomputeAttentionCost float64
	AttentionCostTable     []float64
	MaintenanceIntervalMs  uint32
	CoordEndpoint          string
	CoordHeartbeatMs       uint32
	CoordTimeoutMs         uint32
	DiskSegmentBytes       uint64 // 0: the library's default
	DiskSyncMs             uint32 // group commit period; 0: when a segment fills and at close
	TransferThreads        uint32 // host copy engine threads; 0: the library's default
	MaxOpenRequests        uint32 // requests open at once (1 to 2^20); Request beyond: EBUSY
	// With a disk tier the context moves host and lent-memory chunks to disk when it closes,
	// as far as the disk's free room goes, so that a later context on the same path finds them;
	// NoWriteBackOnClose drops them instead (the zero value keeps the library's default).
	NoWriteBackOnClose bool
	// Lending across nodes: UCX's transports as UCX_TLS names them ("" : what UCX picks), how a
	// borrower reaches a lender's memory, and the longest a batch of UCX reads or writes waits
	// with none of its operations completing.
	CoordUCXTransports string
	CoordRemotePath    RemotePath
	CoordRMATimeoutMs  uint32
	TierOrder          TierOrder
}

// RemotePath is swiftkv_remote_path: how a borrower reaches a lender in another process.
type RemotePath uint32

const (
	RemotePathAuto  RemotePath = C.SWIFTKV_REMOTE_PATH_AUTO  // mapped on this host, UCX elsewhere
	RemotePathUCX   RemotePath = C.SWIFTKV_REMOTE_PATH_UCX   // UCX whatever the host
	RemotePathLocal RemotePath = C.SWIFTKV_REMOTE_PATH_LOCAL // mapped only
)

// DefaultConfig is the library's defaults (swiftkv_ctx_config_init).
func DefaultConfig() Config {
	var c C.swiftkv_ctx_config
	C.swiftkv_ctx_config_init(&c)
	return Config{DeviceMask: uint64(c.device_mask), HostBudgetBytes: uint64(c.host_budget_bytes),
		HostNUMANode: int32(c.host_numa_node), DiskBudgetBytes: uint64(c.disk_budget_bytes),
		EvictionLRU:            c.eviction_policy == C.SWIFTKV_EVICT_LRU,
		DemoteFreePercent:      uint32(c.demote_free_percent),
		RecomputeTokenCost:     float64(c.recompute_token_cost),
		RecomputeAttentionCost: float64(c.recompute_attention_cost),
		MaintenanceIntervalMs:  uint32(c.maintenance_interval_ms),
		CoordHeartbeatMs:       uint32(c.coord_heartbeat_ms),
		CoordTimeoutMs:         uint32(c.coord_timeout_ms),
		DiskSegmentBytes:       uint64(c.disk_segment_bytes), DiskSyncMs: uint32(c.disk_sync_ms),
		TransferThreads: uint32(c.transfer_threads), MaxOpenRequests: uint32(c.max_open_requests),
		NoWriteBackOnClose: c.write_back_on_close == 0,
		CoordRemotePath:    RemotePath(c.coord_remote_path), CoordRMATimeoutMs: uint32(c.coord_rma_timeout_ms),
		TierOrder: TierOrder(c.tier_order)}
}

// ChunkEvent is a chunk that left a tier without the caller asking.
type ChunkEvent struct {
	Model    uint32
	From, To Tier
	Reason   uint32 // 0 evicted, 1 revoked, 2 corrupt
	KeyLo    uint64
	KeyHi    uint64
}

// Context is one per engine process; every method is safe from any goroutine.
//
// A Context belongs to the process that made it. A Go program cannot fork itself (the runtime
// forks only to exec), but C code it links can: in such a child every call on the context, its
// models, pools, requests and regions fails with ESTATE naming the fork, and ending it releases
// nothing (its memory, disk and threads are the parent's). The child makes a context of its own.
type Context struct {
	g      guard
	raw    *C.swiftkv_ctx
	evMu   sync.Mutex // guards events
	events cgo.Handle
	// The regions made in this context and not yet closed: Close ends them first, as the C
	// library requires. It holds their handles, not the Elastic values, so that a region the
	// program drops is still ended by its finalizer.
	regMu   sync.Mutex
	regions map[*regionHandle]struct{}
}

func NewContext(cfg Config) (*Context, error) {
	c := cnew[C.swiftkv_ctx_config]()
	defer cfree(c)
	c.size = C.uint32_t(unsafe.Sizeof(*c))
	c.version = C.SWIFTKV_CTX_CONFIG_VERSION
	c.device_mask = C.uint64_t(cfg.DeviceMask)
	c.host_budget_bytes = C.uint64_t(cfg.HostBudgetBytes)
	c.host_numa_node = C.int32_t(cfg.HostNUMANode)
	if cfg.DiskPath != "" {
		c.disk_path = C.CString(cfg.DiskPath)
		defer C.free(unsafe.Pointer(c.disk_path))
	}
	c.disk_budget_bytes = C.uint64_t(cfg.DiskBudgetBytes)
	c.eviction_policy = C.SWIFTKV_EVICT_RETENTION
	if cfg.EvictionLRU {
		c.eviction_policy = C.SWIFTKV_EVICT_LRU
	}
	c.demote_free_percent = C.uint32_t(cfg.DemoteFreePercent)
	c.recompute_token_cost = C.double(cfg.RecomputeTokenCost)
	c.recompute_attention_cost = C.double(cfg.RecomputeAttentionCost)
	if len(cfg.AttentionCostTable) > 0 {
		t := cslice(cfg.AttentionCostTable)
		defer C.free(unsafe.Pointer(t))
		c.attention_cost_table = (*C.double)(unsafe.Pointer(t))
		c.attention_cost_entries = C.uint32_t(len(cfg.AttentionCostTable))
	}
	c.maintenance_interval_ms = C.uint32_t(cfg.MaintenanceIntervalMs)
	if cfg.CoordEndpoint != "" {
		c.coord_endpoint = C.CString(cfg.CoordEndpoint)
		defer C.free(unsafe.Pointer(c.coord_endpoint))
	}
	c.coord_heartbeat_ms = C.uint32_t(cfg.CoordHeartbeatMs)
	c.coord_timeout_ms = C.uint32_t(cfg.CoordTimeoutMs)
	c.disk_segment_bytes = C.uint64_t(cfg.DiskSegmentBytes)
	c.disk_sync_ms = C.uint32_t(cfg.DiskSyncMs)
	c.transfer_threads = C.uint32_t(cfg.TransferThreads)
	c.max_open_requests = C.uint32_t(cfg.MaxOpenRequests)
	if cfg.NoWriteBackOnClose {
		c.write_back_on_close = 0
	} else {
		c.write_back_on_close = 1
	}
	if cfg.CoordUCXTransports != "" {
		c.coord_ucx_transports = C.CString(cfg.CoordUCXTransports)
		defer C.free(unsafe.Pointer(c.coord_ucx_transports))
	}
	c.coord_remote_path = C.swiftkv_remote_path(cfg.CoordRemotePath)
	c.coord_rma_timeout_ms = C.uint32_t(cfg.CoordRMATimeoutMs)
	c.tier_order = C.swiftkv_tier_order(cfg.TierOrder)
	ctx := &Context{}
	if err := check(func() C.swiftkv_status { return C.swiftkv_ctx_create(&ctx.raw, c) }); err != nil {
		return nil, err
	}
	runtime.SetFinalizer(ctx, func(c *Context) { c.Close() })
	return ctx, nil
}

// Close ends the context once the calls in flight on it have returned; regions, pools and
// requests made from it must be closed first (each keeps its context alive, so finalizers end
// them first). Not from inside the chunk event callback, which would wait for itself.
func (c *Context) Close() {
	if !c.g.close() {
		return
	}
	c.regMu.Lock()
	open := c.regions
	c.regions = nil
	c.regMu.Unlock()
	for r := range open {
		r.close()
	}
	C.swiftkv_ctx_destroy(c.raw)
	c.raw = nil
	c.evMu.Lock()
	ev := c.events
	c.events = 0
	c.evMu.Unlock()
	if ev != 0 {
		ev.Delete()
	}
}

// acquire enters a call on the context: its handle, and done, to call once the C call has
// returned (it keeps the context open and reachable until then).
func (c *Context) acquire() (*C.swiftkv_ctx, func(), error) {
	if !c.g.enter() {
		return nil, nil, &Error{ESTATE, "the context is closed"}
	}
	return c.raw, func() {
		c.g.leave()
		runtime.KeepAlive(c)
	}, nil
}

// Config is the configuration in effect.
func (c *Context) Config() (Config, error) {
	h, done, err := c.acquire()
	if err != nil {
		return Config{}, err
	}
	defer done()
	var v C.swiftkv_ctx_config
	v.size = C.uint32_t(unsafe.Sizeof(v))
	v.version = C.SWIFTKV_CTX_CONFIG_VERSION
	if err := check(func() C.swiftkv_status { return C.swiftkv_ctx_get_config(&v, h) }); err != nil {
		return Config{}, err
	}
	out := Config{DeviceMask: uint64(v.device_mask), HostBudgetBytes: uint64(v.host_budget_bytes),
		HostNUMANode: int32(v.host_numa_node), DiskBudgetBytes: uint64(v.disk_budget_bytes),
		EvictionLRU: v.eviction_policy == C.SWIFTKV_EVICT_LRU, DemoteFreePercent: uint32(v.demote_free_percent),
		RecomputeTokenCost: float64(v.recompute_token_cost), RecomputeAttentionCost: float64(v.recompute_attention_cost),
		MaintenanceIntervalMs: uint32(v.maintenance_interval_ms), CoordHeartbeatMs: uint32(v.coord_heartbeat_ms),
		CoordTimeoutMs: uint32(v.coord_timeout_ms), DiskSegmentBytes: uint64(v.disk_segment_bytes),
		DiskSyncMs: uint32(v.disk_sync_ms), TransferThreads: uint32(v.transfer_threads),
		MaxOpenRequests: uint32(v.max_open_requests), NoWriteBackOnClose: v.write_back_on_close == 0,
		CoordRemotePath: RemotePath(v.coord_remote_path), CoordRMATimeoutMs: uint32(v.coord_rma_timeout_ms),
		TierOrder: TierOrder(v.tier_order)}
	if v.coord_ucx_transports != nil {
		out.CoordUCXTransports = C.GoString(v.coord_ucx_transports)
	}
	if v.disk_path != nil {
		out.DiskPath = C.GoString(v.disk_path)
	}
	if v.coord_endpoint != nil {
		out.CoordEndpoint = C.GoString(v.coord_endpoint)
	}
	if v.attention_cost_entries > 0 {
		out.AttentionCostTable = append([]float64(nil), unsafe.Slice((*float64)(unsafe.Pointer(v.attention_cost_table)), int(v.attention_cost_entries))...)
	}
	return out, nil
}

func (c *Context) DeviceCount() (uint32, error) {
	h, done, err := c.acquire()
	if err != nil {
		return 0, err
	}
	defer done()
	var n C.uint32_t
	err = check(func() C.swiftkv_status { return C.swiftkv_ctx_device_count(&n, h) })
	return uint32(n), err
}

// Stats is the chunk cache's counts and counters (swiftkv_stats).
type Stats struct {
	Chunks, Bytes, CapacityBytes, Hits                                [3]uint64
	Misses, Stores, StoresRejected, Evictions, Demotions, Promotions  uint64
	LoadFailures, Revocations, CorruptFilesRemoved, DemotionsDeferred uint64
	// The disk tier's log (swiftkv_stats version 2).
	DiskFilesSkipped, DiskRecordsMismatched, DiskSegmentsCleaned uint64
	DiskBytesRelocated, DiskBytesAllocated                       uint64
	// Memory beside the budgets and open requests (swiftkv_stats version 3).
	IndexBytes, IndexCapacityChunks, RequestsOpen uint64
	// The remote tier: memory lent by other hosts (swiftkv_stats version 4).
	RemoteChunks, RemoteBytes, RemoteCapacityBytes, RemoteHits uint64
	// Segments the filesystem could not give, a full disk (swiftkv_stats version 5).
	DiskFullRefusals uint64
}

func (c *Context) Stats() (Stats, error) {
	h, done, err := c.acquire()
	if err != nil {
		return Stats{}, err
	}
	defer done()
	var s C.swiftkv_stats
	s.size = C.uint32_t(unsafe.Sizeof(s))
	s.version = C.SWIFTKV_STATS_VERSION
	if err := check(func() C.swiftkv_status { return C.swiftkv_stats_get(&s, h) }); err != nil {
		return Stats{}, err
	}
	var out Stats
	for i := 0; i < 3; i++ {
		out.Chunks[i], out.Bytes[i] = uint64(s.chunks[i]), uint64(s.bytes[i])
		out.CapacityBytes[i], out.Hits[i] = uint64(s.capacity_bytes[i]), uint64(s.hits[i])
	}
	out.Misses, out.Stores, out.StoresRejected = uint64(s.misses), uint64(s.stores), uint64(s.stores_rejected)
	out.Evictions, out.Demotions, out.Promotions = uint64(s.evictions), uint64(s.demotions), uint64(s.promotions)
	out.LoadFailures, out.Revocations = uint64(s.load_failures), uint64(s.revocations)
	out.CorruptFilesRemoved, out.DemotionsDeferred = uint64(s.corrupt_files_removed), uint64(s.demotions_deferred)
	out.DiskFilesSkipped, out.DiskRecordsMismatched = uint64(s.disk_files_skipped), uint64(s.disk_records_mismatched)
	out.DiskSegmentsCleaned, out.DiskBytesRelocated = uint64(s.disk_segments_cleaned), uint64(s.disk_bytes_relocated)
	out.DiskBytesAllocated = uint64(s.disk_bytes_allocated)
	out.IndexBytes, out.IndexCapacityChunks = uint64(s.index_bytes), uint64(s.index_capacity_chunks)
	out.RequestsOpen = uint64(s.requests_open)
	out.RemoteChunks, out.RemoteBytes = uint64(s.remote_chunks), uint64(s.remote_bytes)
	out.RemoteCapacityBytes, out.RemoteHits = uint64(s.remote_capacity_bytes), uint64(s.remote_hits)
	out.DiskFullRefusals = uint64(s.disk_full_refusals)
	return out, nil
}

// CoordStats is the coordinator's counts and counters (swiftkv_coord_stats).
type CoordStats struct {
	OfferedRegions, SessionsServed, LendersConnected, MessagesSent, MessagesReceived uint64
	MessagesDropped, HeartbeatsSent, HeartbeatsAnswered, ReclaimsSent, ReclaimsAcked uint64
	ReclaimNsTotal, ReclaimNsMax, LeasesLost, LendersLost                            uint64
	// Lending across nodes over UCX.
	RemoteSessions, RemoteLenders, GrantsRefused, RMABatches, RMABatchesFailed uint64
	RMABytesRead, RMABytesWritten                                              uint64
}

// MetricsText is the context's counters in Prometheus' text exposition format
// (swiftkv_metrics_text; the names are listed in docs/api.md).
func (c *Context) MetricsText() (string, error) {
	h, done, err := c.acquire()
	if err != nil {
		return "", err
	}
	defer done()
	var n C.size_t
	if err := check(func() C.swiftkv_status { return C.swiftkv_metrics_text(nil, 0, &n, h) }); err != nil {
		return "", err
	}
	for {
		buf := (*C.char)(C.malloc(n + 1))
		var got C.size_t
		err := check(func() C.swiftkv_status { return C.swiftkv_metrics_text(buf, n+1, &got, h) })
		if err == nil && got <= n {
			s := C.GoStringN(buf, C.int(got))
			C.free(unsafe.Pointer(buf))
			return s, nil
		}
		C.free(unsafe.Pointer(buf))
		if err != nil {
			return "", err
		}
		n = got // the counters grew between the two calls
	}
}

func (c *Context) CoordStats() (CoordStats, error) {
	h, done, err := c.acquire()
	if err != nil {
		return CoordStats{}, err
	}
	defer done()
	var s C.swiftkv_coord_stats
	s.size = C.uint32_t(unsafe.Sizeof(s))
	s.version = C.SWIFTKV_COORD_STATS_VERSION
	if err := check(func() C.swiftkv_status { return C.swiftkv_coord_stats_get(&s, h) }); err != nil {
		return CoordStats{}, err
	}
	return CoordStats{uint64(s.offered_regions), uint64(s.sessions_served), uint64(s.lenders_connected),
		uint64(s.messages_sent), uint64(s.messages_received), uint64(s.messages_dropped),
		uint64(s.heartbeats_sent), uint64(s.heartbeats_answered), uint64(s.reclaims_sent),
		uint64(s.reclaims_acked), uint64(s.reclaim_ns_total), uint64(s.reclaim_ns_max),
		uint64(s.leases_lost), uint64(s.lenders_lost), uint64(s.remote_sessions),
		uint64(s.remote_lenders), uint64(s.grants_refused), uint64(s.rma_batches),
		uint64(s.rma_batches_failed), uint64(s.rma_bytes_read), uint64(s.rma_bytes_written)}, nil
}

// ClearAll drops the unpinned chunks of every model in the tiers of tierMask.
func (c *Context) ClearAll(tierMask uint32) (uint64, error) {
	h, done, err := c.acquire()
	if err != nil {
		return 0, err
	}
	defer done()
	var n C.uint64_t
	err = check(func() C.swiftkv_status {
		return C.swiftkv_clear(&n, h, C.uint32_t(ModelAll), C.uint32_t(tierMask), nil, 0)
	})
	return uint64(n), err
}

// OnChunkEvent sets (nil: removes) the chunk event callback; it runs on a library thread.
func (c *Context) OnChunkEvent(f func(ChunkEvent)) error {
	h, done, err := c.acquire()
	if err != nil {
		return err
	}
	defer done()
	var handle cgo.Handle
	if f != nil {
		handle = cgo.NewHandle(f)
	}
	if err := check(func() C.swiftkv_status { return C.swiftkv_go_set_events(h, C.uintptr_t(handle)) }); err != nil {
		if handle != 0 {
			handle.Delete()
		}
		return err
	}
	c.evMu.Lock()
	old := c.events
	c.events = handle
	c.evMu.Unlock()
	if old != 0 {
		old.Delete() // the library no longer calls it
	}
	return nil
}

// Model is a model registered in a context.
type Model struct {
	ctx  *Context
	ID   uint32
	Desc ModelDesc
}

// RegisterModel registers a model as a Borrower or a Lender.
func (c *Context) RegisterModel(desc ModelDesc, role Role) (*Model, error) {
	h, done, err := c.acquire()
	if err != nil {
		return nil, err
	}
	defer done()
	d, free := desc.cdesc()
	defer free()
	cfg := cnew[C.swiftkv_model_config]()
	defer cfree(cfg)
	cfg.size = C.uint32_t(unsafe.Sizeof(*cfg))
	cfg.version = C.SWIFTKV_MODEL_CONFIG_VERSION
	cfg.desc = d
	cfg.role = C.swiftkv_role(role)
	var id C.uint32_t
	if err := check(func() C.swiftkv_status { return C.swiftkv_model_register(&id, h, cfg) }); err != nil {
		return nil, err
	}
	return &Model{c, uint32(id), desc}, nil
}

func (m *Model) Unregister() error {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return err
	}
	defer done()
	return check(func() C.swiftkv_status { return C.swiftkv_model_unregister(h, C.uint32_t(m.ID)) })
}

// Lookup is what a prompt can reuse, with each full chunk's tier. PrefixTokens load from token
// 0. [DroppedHeadTokens, DroppedHeadTokens+LoadableTokens) is the longest cached run (the
// earliest of equal ones): an engine recomputes the tokens before it, cached or not, loads it
// and computes the rest. DroppedHeadTokens is 0 when that run is the prefix.
type Lookup struct {
	Chunks, PrefixTokens, DroppedHeadTokens, LoadableTokens uint64
	ChunksPerTier                                           [3]uint64 // peer, host, disk
	RemoteChunks                                            uint64    // in the remote tier
	Residency                                               []Tier
}

func tokensPtr(t []uint32) *C.uint32_t {
	if len(t) == 0 {
		return nil
	}
	return (*C.uint32_t)(unsafe.Pointer(&t[0]))
}

func bytesPtr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

func (m *Model) Lookup(tokens []uint32) (Lookup, error) {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return Lookup{}, err
	}
	defer done()
	var out C.swiftkv_lookup_result
	out.size = C.uint32_t(unsafe.Sizeof(out))
	out.version = C.SWIFTKV_LOOKUP_RESULT_VERSION
	res := make([]byte, len(tokens)/int(m.Desc.ChunkTokens))
	err = check(func() C.swiftkv_status {
		return C.swiftkv_lookup(&out, (*C.uint8_t)(bytesPtr(res)), C.size_t(len(res)), h, C.uint32_t(m.ID),
			tokensPtr(tokens), C.size_t(len(tokens)))
	})
	return lookupOf(&out, res, err), err
}

// lookupOf reads a lookup's result; the residency only when the call succeeded.
func lookupOf(out *C.swiftkv_lookup_result, res []byte, err error) Lookup {
	l := Lookup{Chunks: uint64(out.chunks), PrefixTokens: uint64(out.prefix_tokens),
		DroppedHeadTokens: uint64(out.dropped_head_tokens), LoadableTokens: uint64(out.loadable_tokens)}
	for i := 0; i < 3; i++ {
		l.ChunksPerTier[i] = uint64(out.chunks_per_tier[i])
	}
	l.RemoteChunks = uint64(out.remote_chunks)
	if err == nil {
		for _, r := range res {
			l.Residency = append(l.Residency, Tier(r))
		}
	}
	return l
}

// Store stores the chunks of tokens from kv; the leading tokens cached afterwards. A chunk that
// cannot be written ends the call with an EIO error, and the count is then the leading tokens
// cached before it, which stay cached (as io.Writer reports a short write).
func (m *Model) Store(tokens []uint32, kv []byte) (uint64, error) {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return 0, err
	}
	defer done()
	var n C.uint64_t
	err = check(func() C.swiftkv_status {
		return C.swiftkv_store(&n, h, C.uint32_t(m.ID), tokensPtr(tokens), C.size_t(len(tokens)), bytesPtr(kv), C.size_t(len(kv)))
	})
	return uint64(n), err
}

// Retrieve copies cached chunks from startToken into kv; the tokens copied.
func (m *Model) Retrieve(tokens []uint32, startToken uint64, kv []byte) (uint64, error) {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return 0, err
	}
	defer done()
	var n C.uint64_t
	err = check(func() C.swiftkv_status {
		return C.swiftkv_retrieve(&n, h, C.uint32_t(m.ID), tokensPtr(tokens), C.size_t(len(tokens)),
			C.uint64_t(startToken), bytesPtr(kv), C.size_t(len(kv)))
	})
	return uint64(n), err
}

// Borrow takes a lease of an elastic region of this process; the lease id.
func (m *Model) Borrow(e *Elastic, maxUnits uint64) (uint64, error) {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return 0, err
	}
	defer done()
	var id C.uint64_t
	err = e.check(func(r *C.swiftkv_elastic) C.swiftkv_status {
		return C.swiftkv_borrow(&id, h, C.uint32_t(m.ID), r, C.uint64_t(maxUnits))
	})
	return uint64(id), err
}

// BorrowRemote takes a lease of the region offered as lenderName at endpoint.
func (m *Model) BorrowRemote(endpoint, lenderName string, maxUnits uint64) (uint64, error) {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return 0, err
	}
	defer done()
	ep, name := C.CString(endpoint), C.CString(lenderName)
	defer C.free(unsafe.Pointer(ep))
	defer C.free(unsafe.Pointer(name))
	var id C.uint64_t
	err = check(func() C.swiftkv_status {
		return C.swiftkv_borrow_remote(&id, h, C.uint32_t(m.ID), ep, name, C.uint64_t(maxUnits))
	})
	return uint64(id), err
}

func (m *Model) Pin(tokens []uint32) error {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return err
	}
	defer done()
	return check(func() C.swiftkv_status {
		return C.swiftkv_pin(h, C.uint32_t(m.ID), tokensPtr(tokens), C.size_t(len(tokens)))
	})
}

func (m *Model) Unpin(tokens []uint32) error {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return err
	}
	defer done()
	return check(func() C.swiftkv_status {
		return C.swiftkv_unpin(h, C.uint32_t(m.ID), tokensPtr(tokens), C.size_t(len(tokens)))
	})
}

// Clear drops the unpinned chunks of tokens (nil: all of this model's) in the tiers of the mask.
func (m *Model) Clear(tokens []uint32, tierMask uint32) (uint64, error) {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return 0, err
	}
	defer done()
	var n C.uint64_t
	err = check(func() C.swiftkv_status {
		return C.swiftkv_clear(&n, h, C.uint32_t(m.ID), C.uint32_t(tierMask), tokensPtr(tokens), C.size_t(len(tokens)))
	})
	return uint64(n), err
}

// Move moves the chunks of tokens to tier `to`; how many are there afterwards.
func (m *Model) Move(tokens []uint32, to Tier) (uint64, error) {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return 0, err
	}
	defer done()
	var n C.uint64_t
	err = check(func() C.swiftkv_status {
		return C.swiftkv_move(&n, h, C.uint32_t(m.ID), tokensPtr(tokens), C.size_t(len(tokens)), C.swiftkv_tier(to))
	})
	return uint64(n), err
}

// Chunks named by the caller (swiftkv_*_named): names holds the names of consecutive chunks,
// nameBytes bytes each (1 to 64), each already chained over everything before its chunk (an
// engine's block or page keys). The model's identity is still in every key.

// LookupNamed is Lookup for named chunks; token counts are chunks times ChunkTokens.
func (m *Model) LookupNamed(names []byte, nameBytes uint32) (Lookup, error) {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return Lookup{}, err
	}
	defer done()
	var out C.swiftkv_lookup_result
	out.size = C.uint32_t(unsafe.Sizeof(out))
	out.version = C.SWIFTKV_LOOKUP_RESULT_VERSION
	n := 0
	if nameBytes != 0 {
		n = len(names) / int(nameBytes)
	}
	res := make([]byte, n)
	err = check(func() C.swiftkv_status {
		return C.swiftkv_lookup_named(&out, (*C.uint8_t)(bytesPtr(res)), C.size_t(len(res)), h,
			C.uint32_t(m.ID), bytesPtr(names), C.size_t(len(names)), C.uint32_t(nameBytes))
	})
	return lookupOf(&out, res, err), err
}

// StoreNamed stores the named chunks from kv (a chunk's bytes per name); the leading chunks
// cached. firstChunk is the number of the first name's chunk in its sequence. On a write
// error the count is the leading chunks cached before it, which stay cached.
func (m *Model) StoreNamed(names []byte, nameBytes uint32, firstChunk uint64, kv []byte) (uint64, error) {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return 0, err
	}
	defer done()
	var n C.uint64_t
	err = check(func() C.swiftkv_status {
		return C.swiftkv_store_named(&n, h, C.uint32_t(m.ID), bytesPtr(names), C.size_t(len(names)),
			C.uint32_t(nameBytes), C.uint64_t(firstChunk), bytesPtr(kv), C.size_t(len(kv)))
	})
	return uint64(n), err
}

// RetrieveNamed copies the named chunks from the first on into kv; the chunks copied.
func (m *Model) RetrieveNamed(names []byte, nameBytes uint32, kv []byte) (uint64, error) {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return 0, err
	}
	defer done()
	var n C.uint64_t
	err = check(func() C.swiftkv_status {
		return C.swiftkv_retrieve_named(&n, h, C.uint32_t(m.ID), bytesPtr(names), C.size_t(len(names)),
			C.uint32_t(nameBytes), bytesPtr(kv), C.size_t(len(kv)))
	})
	return uint64(n), err
}

func (m *Model) PinNamed(names []byte, nameBytes uint32) error {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return err
	}
	defer done()
	return check(func() C.swiftkv_status {
		return C.swiftkv_pin_named(h, C.uint32_t(m.ID), bytesPtr(names), C.size_t(len(names)), C.uint32_t(nameBytes))
	})
}

func (m *Model) UnpinNamed(names []byte, nameBytes uint32) error {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return err
	}
	defer done()
	return check(func() C.swiftkv_status {
		return C.swiftkv_unpin_named(h, C.uint32_t(m.ID), bytesPtr(names), C.size_t(len(names)), C.uint32_t(nameBytes))
	})
}

// ClearNamed drops the unpinned named chunks in the tiers of the mask.
func (m *Model) ClearNamed(names []byte, nameBytes uint32, tierMask uint32) (uint64, error) {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return 0, err
	}
	defer done()
	var n C.uint64_t
	err = check(func() C.swiftkv_status {
		return C.swiftkv_clear_named(&n, h, C.uint32_t(m.ID), C.uint32_t(tierMask), bytesPtr(names),
			C.size_t(len(names)), C.uint32_t(nameBytes))
	})
	return uint64(n), err
}

// MoveNamed moves the named chunks to tier `to`; how many are there afterwards.
func (m *Model) MoveNamed(names []byte, nameBytes uint32, to Tier) (uint64, error) {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return 0, err
	}
	defer done()
	var n C.uint64_t
	err = check(func() C.swiftkv_status {
		return C.swiftkv_move_named(&n, h, C.uint32_t(m.ID), bytesPtr(names), C.size_t(len(names)),
			C.uint32_t(nameBytes), C.swiftkv_tier(to))
	})
	return uint64(n), err
}

// ChunkKeysNamed gives the library's keys of the named chunks, {key_lo, key_hi} each: what the
// chunk event callback reports for them. Computes only.
func (m *Model) ChunkKeysNamed(names []byte, nameBytes uint32) ([][2]uint64, error) {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return nil, err
	}
	defer done()
	n := 0
	if nameBytes != 0 {
		n = len(names) / int(nameBytes)
	}
	keys := make([]uint64, 2*n)
	var p *C.uint64_t
	if len(keys) > 0 {
		p = (*C.uint64_t)(unsafe.Pointer(&keys[0]))
	}
	err = check(func() C.swiftkv_status {
		return C.swiftkv_chunk_keys_named(p, C.size_t(len(keys)), h, C.uint32_t(m.ID), bytesPtr(names),
			C.size_t(len(names)), C.uint32_t(nameBytes))
	})
	if err != nil {
		return nil, err
	}
	out := make([][2]uint64, n)
	for i := range out {
		out[i] = [2]uint64{keys[2*i], keys[2*i+1]}
	}
	return out, nil
}

// --- The lender's elastic region ----------------------------------------------------------------------

// ElasticConfig is swiftkv_elastic_config.
type ElasticConfig struct {
	Lender         ModelDesc
	Borrower       *ModelDesc
	CapacityBlocks uint64
	OwnedBlocks    uint64
	WindowMs       uint64 // 0: the default 60000
	LeaseMs        uint64 // 0: the default 10000
	CudaAlloc      CudaAlloc
	KeepCommitted  bool
	// A lease asked back is renewed to at most this long after the asking, then expires
	// whether or not the borrower released it. 0: the default 30000.
	ReclaimDeadlineMs uint64
	// Host regions: 0 for one memfd, passed to a borrower in another process whole; else a
	// multiple of the page size, one memfd per granule, passed with each lease as VMM device
	// memory is (MemoryHostGranules).
	HostGranuleBytes uint64
}

// Elastic is a lender's elastic region; safe from any goroutine.
type Elastic struct {
	*regionHandle
	ctx *Context // the region lives in its context, which ends it first when it is closed
}

// regionHandle is a region's C handle and the guard of the calls on it, shared by the Elastic
// and the Context it was made in.
type regionHandle struct {
	g   guard
	raw *C.swiftkv_elastic
}

// close ends the region once the calls in flight on it have returned (the first close only).
func (r *regionHandle) close() {
	if !r.g.close() {
		return
	}
	C.swiftkv_elastic_destroy(r.raw)
	r.raw = nil
}

func (c *Context) NewElastic(cfg ElasticConfig) (*Elastic, error) {
	h, done, err := c.acquire()
	if err != nil {
		return nil, err
	}
	defer done()
	l, fl := cfg.Lender.cdesc()
	defer fl()
	ec := cnew[C.swiftkv_elastic_config]()
	defer cfree(ec)
	C.swiftkv_elastic_config_init(ec) // the library's defaults for what cfg leaves at zero
	ec.lender = l
	if cfg.Borrower != nil {
		b, fb := cfg.Borrower.cdesc()
		defer fb()
		ec.borrower = b
	}
	ec.capacity_blocks = C.uint64_t(cfg.CapacityBlocks)
	ec.owned_blocks = C.uint64_t(cfg.OwnedBlocks)
	if cfg.WindowMs != 0 {
		ec.window_ms = C.uint64_t(cfg.WindowMs)
	}
	if cfg.LeaseMs != 0 {
		ec.lease_ms = C.uint64_t(cfg.LeaseMs)
	}
	if cfg.ReclaimDeadlineMs != 0 {
		ec.reclaim_deadline_ms = C.uint64_t(cfg.ReclaimDeadlineMs)
	}
	ec.host_granule_bytes = C.uint64_t(cfg.HostGranuleBytes)
	ec.cuda_alloc = C.swiftkv_cuda_alloc(cfg.CudaAlloc)
	if cfg.KeepCommitted {
		ec.flags = C.SWIFTKV_ELASTIC_KEEP_COMMITTED
	}
	e := &Elastic{regionHandle: &regionHandle{}, ctx: c}
	if err := check(func() C.swiftkv_status { return C.swiftkv_elastic_create(&e.raw, h, ec) }); err != nil {
		return nil, err
	}
	// Known to the context before the call that made it returns: a Close of the context waits
	// for this call, then ends the region.
	c.regMu.Lock()
	if c.regions == nil {
		c.regions = make(map[*regionHandle]struct{})
	}
	c.regions[e.regionHandle] = struct{}{}
	c.regMu.Unlock()
	runtime.SetFinalizer(e, func(e *Elastic) { e.Close() })
	return e, nil
}

// Close ends the region and every lease on it, once the calls in flight on it have returned.
// Closing its Context closes it too.
func (e *Elastic) Close() {
	e.regionHandle.close()
	e.ctx.regMu.Lock()
	delete(e.ctx.regions, e.regionHandle)
	e.ctx.regMu.Unlock()
	runtime.KeepAlive(e.ctx)
}

// call runs f on the region's handle, which stays open and reachable until f returns.
func (e *Elastic) call(f func(r *C.swiftkv_elastic) C.swiftkv_status) (Status, error) {
	if !e.g.enter() {
		return ESTATE, &Error{ESTATE, "the region is closed"}
	}
	defer func() {
		e.g.leave()
		runtime.KeepAlive(e)
	}()
	return call(func() C.swiftkv_status { return f(e.raw) })
}

func (e *Elastic) check(f func(r *C.swiftkv_elastic) C.swiftkv_status) error {
	_, err := e.call(f)
	return err
}

// LayerView is one layer of the region as a paged cache.
type LayerView struct {
	Base                                                            uintptr
	PageStride, KOffset, VOffset, TokenStride, HeadStride, NumPages uint64
	Device                                                          int32
}

func (e *Elastic) LayerView(layer uint32) (LayerView, error) {
	var v C.swiftkv_layer_view
	v.size = C.uint32_t(unsafe.Sizeof(v))
	v.version = C.SWIFTKV_LAYER_VIEW_VERSION
	err := e.check(func(r *C.swiftkv_elastic) C.swiftkv_status {
		return C.swiftkv_elastic_layer_view(&v, r, C.uint32_t(layer))
	})
	return LayerView{uintptr(v.base), uint64(v.page_stride), uint64(v.k_offset), uint64(v.v_offset),
		uint64(v.token_stride), uint64(v.head_stride), uint64(v.num_pages), int32(v.device)}, err
}

// ScaleForRequest applies Algorithm 1 ScaleUp: status (OK or InProgress), lender blocks grown,
// borrower chunks lost.
func (e *Elastic) ScaleForRequest(requestTokens uint64) (Status, uint64, uint64, error) {
	var b, c C.uint64_t
	st, err := e.call(func(r *C.swiftkv_elastic) C.swiftkv_status {
		return C.swiftkv_elastic_scale_for_request(&b, &c, r, C.uint64_t(requestTokens))
	})
	return st, uint64(b), uint64(c), err
}

// Tick applies the periodic ScaleDown.
func (e *Elastic) Tick(inUseBlocks uint64) (Status, uint64, uint64, error) {
	var b, c C.uint64_t
	st, err := e.call(func(r *C.swiftkv_elastic) C.swiftkv_status {
		return C.swiftkv_elastic_tick(&b, &c, r, C.uint64_t(inUseBlocks))
	})
	return st, uint64(b), uint64(c), err
}

// Resize sets the owned part to ownedBlocks (whole lending units): status (OK, or InProgress
// while leases on the units it took back are given back), lender blocks grown or shrunk,
// borrower chunks.
func (e *Elastic) Resize(ownedBlocks uint64) (Status, uint64, uint64, error) {
	var b, c C.uint64_t
	st, err := e.call(func(r *C.swiftkv_elastic) C.swiftkv_status {
		return C.swiftkv_elastic_resize(&b, &c, r, C.uint64_t(ownedBlocks))
	})
	return st, uint64(b), uint64(c), err
}

// Lease is a lease on lent memory.
type Lease struct {
	ID, FirstBlock, Blocks, Chunks, Offset, Bytes uint64
	Data                                          uintptr
	ChunkStride, LayerStride, ExpiresNs           uint64
	ReclaimRequested                              bool
}

func toLease(l *C.swiftkv_lease) Lease {
	return Lease{uint64(l.id), uint64(l.first_block), uint64(l.blocks), uint64(l.chunks), uint64(l.offset),
		uint64(l.bytes), uintptr(l.data), uint64(l.chunk_stride), uint64(l.layer_stride), uint64(l.expires_ns),
		l.reclaim_requested != 0}
}

func (e *Elastic) Lend(maxUnits uint64) (Lease, error) {
	var l C.swiftkv_lease
	l.size = C.uint32_t(unsafe.Sizeof(l))
	l.version = C.SWIFTKV_LEASE_VERSION
	err := e.check(func(r *C.swiftkv_elastic) C.swiftkv_status {
		return C.swiftkv_elastic_lend(&l, r, C.uint64_t(maxUnits))
	})
	return toLease(&l), err
}

func (e *Elastic) Lease(id uint64) (Lease, error) {
	var l C.swiftkv_lease
	l.size = C.uint32_t(unsafe.Sizeof(l))
	l.version = C.SWIFTKV_LEASE_VERSION
	err := e.check(func(r *C.swiftkv_elastic) C.swiftkv_status { return C.swiftkv_elastic_lease_get(&l, r, C.uint64_t(id)) })
	return toLease(&l), err
}

func (e *Elastic) Renew(id uint64) error {
	return e.check(func(r *C.swiftkv_elastic) C.swiftkv_status { return C.swiftkv_elastic_renew(r, C.uint64_t(id)) })
}

func (e *Elastic) Release(id uint64) error {
	return e.check(func(r *C.swiftkv_elastic) C.swiftkv_status { return C.swiftkv_elastic_release(r, C.uint64_t(id)) })
}

func (e *Elastic) Reclaim(id uint64) error {
	return e.check(func(r *C.swiftkv_elastic) C.swiftkv_status { return C.swiftkv_elastic_reclaim(r, C.uint64_t(id)) })
}

// WaitReclaims blocks until no lease is asked back (each released by its borrower or expired);
// an Error with StatusETIMEDOUT after timeoutMs milliseconds.
func (e *Elastic) WaitReclaims(timeoutMs uint64) error {
	return e.check(func(r *C.swiftkv_elastic) C.swiftkv_status {
		return C.swiftkv_elastic_wait_reclaims(r, C.uint64_t(timeoutMs))
	})
}

func (e *Elastic) PendingReclaims() ([]uint64, error) {
	var n C.size_t
	if err := e.check(func(r *C.swiftkv_elastic) C.swiftkv_status { return C.swiftkv_elastic_pending_reclaims(nil, 0, &n, r) }); err != nil {
		return nil, err
	}
	ids := make([]uint64, int(n)+1)
	err := e.check(func(r *C.swiftkv_elastic) C.swiftkv_status {
		return C.swiftkv_elastic_pending_reclaims((*C.uint64_t)(unsafe.Pointer(&ids[0])), C.size_t(len(ids)), &n, r)
	})
	if int(n) < len(ids) {
		ids = ids[:n]
	}
	return ids, err
}

// ElasticStats is swiftkv_elastic_stats.
type ElasticStats struct {
	CapacityBlocks, OwnedBlocks, ReadyBlocks, ReclaimingBlocks, LentBlocks, FreeBlocks uint64
	UnitLenderBlocks, UnitBorrowerChunks, Leases, RegionBytes, CommittedBytes          uint64
	ScaleUps, ScaleDowns, LeasesGranted, LeasesExpired, ReclaimsRequested              uint64
	MemoryKind                                                                         MemoryKind
	Device                                                                             int32 // CUDA device, or DeviceHost
}

func (e *Elastic) Stats() (ElasticStats, error) {
	var s C.swiftkv_elastic_stats
	s.size = C.uint32_t(unsafe.Sizeof(s))
	s.version = C.SWIFTKV_ELASTIC_STATS_VERSION
	err := e.check(func(r *C.swiftkv_elastic) C.swiftkv_status { return C.swiftkv_elastic_stats_get(&s, r) })
	return ElasticStats{uint64(s.capacity_blocks), uint64(s.owned_blocks), uint64(s.ready_blocks),
		uint64(s.reclaiming_blocks), uint64(s.lent_blocks), uint64(s.free_blocks), uint64(s.unit_lender_blocks),
		uint64(s.unit_borrower_chunks), uint64(s.leases), uint64(s.region_bytes), uint64(s.committed_bytes),
		uint64(s.scale_ups), uint64(s.scale_downs), uint64(s.leases_granted), uint64(s.leases_expired),
		uint64(s.reclaims_requested), MemoryKind(s.memory_kind), int32(s.device)}, err
}

// Offer offers the region to other processes through the context's coordinator endpoint.
func (e *Elastic) Offer(name string) error {
	n := C.CString(name)
	defer C.free(unsafe.Pointer(n))
	return e.check(func(r *C.swiftkv_elastic) C.swiftkv_status { return C.swiftkv_elastic_offer(r, n) })
}
