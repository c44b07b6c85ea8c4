package swiftkv

// Engine-facing calls: pools, the connector's per-layer request, multi-token paged attention,
// and C memory for what the library keeps pointers to.

/*
#include <stdlib.h>
#include "swiftkv/swiftkv.h"
*/
import "C"

import (
	"runtime"
	"sync"
	"unsafe"
)

// HostBuffer is zeroed C memory: engine tensors and attention tensors the library reads after
// a call returns may not be Go memory.
type HostBuffer struct {
	ptr  unsafe.Pointer
	size int
}

// NewHostBuffer allocates `size` zeroed bytes, aligned for any element (free with Free).
func NewHostBuffer(size int) *HostBuffer {
	b := &HostBuffer{C.calloc(1, C.size_t(size)), size}
	runtime.SetFinalizer(b, (*HostBuffer).Free)
	return b
}

func (b *HostBuffer) Ptr() unsafe.Pointer { return b.ptr }
func (b *HostBuffer) Bytes() []byte       { return unsafe.Slice((*byte)(b.ptr), b.size) }
func (b *HostBuffer) Free() {
	if b.ptr != nil {
		C.free(b.ptr)
		b.ptr = nil
	}
}

// PoolLayout is swiftkv_pool_desc: per-layer bases and strides in elements.
type PoolLayout struct {
	NumPages, StreamFirst, StreamPages            uint32
	LayerBase                                     []unsafe.Pointer
	LayerSpanBytes                                uint64
	PageStride, KVStride, TokenStride, HeadStride int64
}

// Pool is a borrower's paged KV pool.
type Pool struct {
	model *Model
	ID    uint32
	once  sync.Once
}

// PoolCreate makes a pool: regular pages, then stream pages shared by every layer.
func (m *Model) PoolCreate(regularPages, streamPages uint32) (*Pool, error) {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return nil, err
	}
	defer done()
	var id C.uint32_t
	if err := check(func() C.swiftkv_status {
		return C.swiftkv_pool_create(&id, h, C.uint32_t(m.ID), C.uint32_t(regularPages), C.uint32_t(streamPages))
	}); err != nil {
		return nil, err
	}
	return &Pool{model: m, ID: uint32(id)}, nil
}

// PoolRegister registers the engine's own tensors; every base must stay valid (C or device
// memory) while the pool lives.
func (m *Model) PoolRegister(l PoolLayout) (*Pool, error) {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return nil, err
	}
	defer done()
	d := cnew[C.swiftkv_pool_desc]()
	defer cfree(d)
	bases := cslice(l.LayerBase)
	defer C.free(unsafe.Pointer(bases))
	d.size = C.uint32_t(unsafe.Sizeof(*d))
	d.version = C.SWIFTKV_POOL_DESC_VERSION
	d.num_pages, d.stream_first, d.stream_pages = C.uint32_t(l.NumPages), C.uint32_t(l.StreamFirst), C.uint32_t(l.StreamPages)
	d.layer_base = (*unsafe.Pointer)(unsafe.Pointer(bases))
	d.layer_span_bytes = C.uint64_t(l.LayerSpanBytes)
	d.page_stride, d.kv_stride = C.int64_t(l.PageStride), C.int64_t(l.KVStride)
	d.token_stride, d.head_stride = C.int64_t(l.TokenStride), C.int64_t(l.HeadStride)
	var id C.uint32_t
	if err := check(func() C.swiftkv_status { return C.swiftkv_pool_register(&id, h, C.uint32_t(m.ID), d) }); err != nil {
		return nil, err
	}
	return &Pool{model: m, ID: uint32(id)}, nil
}

// Layout is where the pool's layers are (for a library-made pool, where the library put them).
func (p *Pool) Layout() (PoolLayout, error) {
	h, done, err := p.model.ctx.acquire()
	if err != nil {
		return PoolLayout{}, err
	}
	defer done()
	var d C.swiftkv_pool_desc
	d.size = C.uint32_t(unsafe.Sizeof(d))
	d.version = C.SWIFTKV_POOL_DESC_VERSION
	var model C.uint32_t
	if err := check(func() C.swiftkv_status { return C.swiftkv_pool_get(&d, &model, h, C.uint32_t(p.ID)) }); err != nil {
		return PoolLayout{}, err
	}
	bases := unsafe.Slice(d.layer_base, int(p.model.Desc.NumLayers))
	return PoolLayout{uint32(d.num_pages), uint32(d.stream_first), uint32(d.stream_pages),
		append([]unsafe.Pointer(nil), bases...), uint64(d.layer_span_bytes), int64(d.page_stride),
		int64(d.kv_stride), int64(d.token_stride), int64(d.head_stride)}, nil
}

// Close ends the pool (EBUSY while a request uses it).
func (p *Pool) Close() error {
	h, done, err := p.model.ctx.acquire()
	if err != nil {
		return err
	}
	defer done()
	return check(func() C.swiftkv_status { return C.swiftkv_pool_destroy(h, C.uint32_t(p.ID)) })
}

// Request is one engine request through the connector.
type Request struct {
	ctx  *Context
	ID   uint64
	done bool
}

// RequestInfo is swiftkv_request_info.
type RequestInfo struct {
	LoadBeginTokens, LoadEndTokens, ValidEndTokens, SaveTokens, SavedTokens uint64
	LayersLoaded, LayersSaved                                               uint32
	StreamOrdered                                                           bool
}

func toInfo(i *C.swiftkv_request_info) RequestInfo {
	return RequestInfo{uint64(i.load_begin_tokens), uint64(i.load_end_tokens), uint64(i.valid_end_tokens),
		uint64(i.save_tokens), uint64(i.saved_tokens), uint32(i.layers_loaded), uint32(i.layers_saved),
		i.stream_ordered != 0}
}

// RequestShape is what a request does (swiftkv_request_shape).
type RequestShape uint32

const (
	// LoadAndSave: per layer WaitLayerLoad(l) then SaveLayer(l), then WaitSave.
	LoadAndSave RequestShape = C.SWIFTKV_REQUEST_LOAD_AND_SAVE
	// LoadOnly: StartLoad, then WaitLayerLoad(l) for every layer; nothing saved.
	LoadOnly RequestShape = C.SWIFTKV_REQUEST_LOAD_ONLY
	// SaveOnly: SaveLayer(l) for every layer, then WaitSave; nothing loaded.
	SaveOnly RequestShape = C.SWIFTKV_REQUEST_SAVE_ONLY
)

// Begin begins a request over the pool's pages (pages[b] holds tokens [b*B, (b+1)*B)).
func (m *Model) Begin(p *Pool, tokens []uint32, pages []int32, loadFromTokens uint64) (*Request, error) {
	return m.BeginShaped(p, tokens, pages, loadFromTokens, LoadAndSave)
}

// BeginShaped is Begin for a request of the given shape.
func (m *Model) BeginShaped(p *Pool, tokens []uint32, pages []int32, loadFromTokens uint64,
	shape RequestShape) (*Request, error) {
	return m.begin(p, tokens, uint64(len(tokens)), nil, 0, pages, loadFromTokens, shape)
}

// BeginNamed begins a request of nTokens tokens whose full chunks are named by the caller:
// names holds one name of nameBytes bytes per full chunk; the tokens themselves are not needed.
func (m *Model) BeginNamed(p *Pool, nTokens uint64, names []byte, nameBytes uint32, pages []int32,
	loadFromTokens uint64, shape RequestShape) (*Request, error) {
	return m.begin(p, nil, nTokens, names, nameBytes, pages, loadFromTokens, shape)
}

func (m *Model) begin(p *Pool, tokens []uint32, nTokens uint64, names []byte, nameBytes uint32,
	pages []int32, loadFromTokens uint64, shape RequestShape) (*Request, error) {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return nil, err
	}
	defer done()
	d := cnew[C.swiftkv_request_desc]()
	defer cfree(d)
	ct, cp := cslice(tokens), cslice(pages)
	defer C.free(unsafe.Pointer(ct))
	defer C.free(unsafe.Pointer(cp))
	d.size = C.uint32_t(unsafe.Sizeof(*d))
	d.version = C.SWIFTKV_REQUEST_DESC_VERSION
	d.pool = C.uint32_t(p.ID)
	d.tokens = (*C.uint32_t)(unsafe.Pointer(ct))
	d.n_tokens = C.uint64_t(nTokens)
	if names != nil {
		cn := cslice(names)
		defer C.free(unsafe.Pointer(cn))
		d.names = unsafe.Pointer(cn)
		d.names_bytes = C.uint64_t(len(names))
		d.name_bytes = C.uint32_t(nameBytes)
	}
	d.pages = (*C.int32_t)(unsafe.Pointer(cp))
	d.n_pages = C.uint64_t(len(pages))
	d.load_from_tokens = C.uint64_t(loadFromTokens)
	d.shape = C.swiftkv_request_shape(shape)
	var id C.uint64_t
	if err := check(func() C.swiftkv_status { return C.swiftkv_request_begin(&id, h, d) }); err != nil {
		return nil, err
	}
	r := &Request{ctx: m.ctx, ID: uint64(id)}
	runtime.SetFinalizer(r, func(r *Request) { r.Finish() })
	return r, nil
}

// StartLoad starts the loads; stream is a CUDA stream for device pools (nil on the host).
func (r *Request) StartLoad(stream unsafe.Pointer) error {
	h, done, err := r.ctx.acquire()
	if err != nil {
		return err
	}
	defer done()
	return check(func() C.swiftkv_status { return C.swiftkv_start_load(h, C.uint64_t(r.ID), stream) })
}

// WaitLayerLoad waits for layer l; the end of the valid loaded tokens.
func (r *Request) WaitLayerLoad(layer uint32, stream unsafe.Pointer) (uint64, error) {
	h, done, err := r.ctx.acquire()
	if err != nil {
		return 0, err
	}
	defer done()
	var v C.uint64_t
	err = check(func() C.swiftkv_status {
		return C.swiftkv_wait_layer_load(&v, h, C.uint64_t(r.ID), C.uint32_t(layer), stream)
	})
	return uint64(v), err
}

func (r *Request) SaveLayer(layer uint32, stream unsafe.Pointer) error {
	h, done, err := r.ctx.acquire()
	if err != nil {
		return err
	}
	defer done()
	return check(func() C.swiftkv_status {
		return C.swiftkv_save_layer(h, C.uint64_t(r.ID), C.uint32_t(layer), stream)
	})
}

// batchOf is the context of a batch and its request ids: one context for all (EINVAL otherwise).
func batchOf(requests []*Request) (*Context, []uint64, error) {
	if len(requests) == 0 {
		return nil, nil, nil
	}
	ids := make([]uint64, len(requests))
	for i, r := range requests {
		if r.ctx != requests[0].ctx {
			return nil, nil, &Error{EINVAL, "the requests of a batch belong to one context"}
		}
		ids[i] = r.ID
	}
	return requests[0].ctx, ids, nil
}

// WaitLayerLoadBatch is WaitLayerLoad(layer) for every request of a step in one call
// (swiftkv_wait_layer_load_batch): each request is checked first, and a bad one fails the call
// with none of them changed. It returns the valid ends, in order.
func WaitLayerLoadBatch(requests []*Request, layer uint32, stream unsafe.Pointer) ([]uint64, error) {
	c, ids, err := batchOf(requests)
	if err != nil || c == nil {
		return []uint64{}, err
	}
	h, done, err := c.acquire()
	if err != nil {
		return nil, err
	}
	defer done()
	out := make([]uint64, len(ids))
	err = check(func() C.swiftkv_status {
		return C.swiftkv_wait_layer_load_batch((*C.uint64_t)(unsafe.Pointer(&out[0])), h,
			(*C.uint64_t)(unsafe.Pointer(&ids[0])), C.size_t(len(ids)), C.uint32_t(layer), stream)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// SaveLayerBatch is SaveLayer(layer) for every request of a step in one call
// (swiftkv_save_layer_batch), checked as WaitLayerLoadBatch is.
func SaveLayerBatch(requests []*Request, layer uint32, stream unsafe.Pointer) error {
	c, ids, err := batchOf(requests)
	if err != nil || c == nil {
		return err
	}
	h, done, err := c.acquire()
	if err != nil {
		return err
	}
	defer done()
	return check(func() C.swiftkv_status {
		return C.swiftkv_save_layer_batch(h, (*C.uint64_t)(unsafe.Pointer(&ids[0])), C.size_t(len(ids)),
			C.uint32_t(layer), stream)
	})
}

func (r *Request) WaitSave(stream unsafe.Pointer) (uint64, error) {
	h, done, err := r.ctx.acquire()
	if err != nil {
		return 0, err
	}
	defer done()
	var n C.uint64_t
	err = check(func() C.swiftkv_status { return C.swiftkv_wait_save(&n, h, C.uint64_t(r.ID), stream) })
	return uint64(n), err
}

func (r *Request) Info() (RequestInfo, error) {
	h, done, err := r.ctx.acquire()
	if err != nil {
		return RequestInfo{}, err
	}
	defer done()
	var i C.swiftkv_request_info
	i.size = C.uint32_t(unsafe.Sizeof(i))
	i.version = C.SWIFTKV_REQUEST_INFO_VERSION
	err = check(func() C.swiftkv_status { return C.swiftkv_request_info_get(&i, h, C.uint64_t(r.ID)) })
	return toInfo(&i), err
}

// Finish ends the request (waiting for its copies) and returns its final info.
func (r *Request) Finish() (RequestInfo, error) {
	if r.done {
		return RequestInfo{}, nil
	}
	h, done, err := r.ctx.acquire()
	if err != nil {
		return RequestInfo{}, err
	}
	defer done()
	r.done = true
	var i C.swiftkv_request_info
	i.size = C.uint32_t(unsafe.Sizeof(i))
	i.version = C.SWIFTKV_REQUEST_INFO_VERSION
	err = check(func() C.swiftkv_status { return C.swiftkv_request_finish(&i, h, C.uint64_t(r.ID)) })
	return toInfo(&i), err
}

// --- Multi-token paged attention ----------------------------------------------------------------

// AttentionDesc is swiftkv_attention_desc.
type AttentionDesc struct {
	Device                                      int32
	DType                                       DType
	NumQOHeads, NumKVHeads, HeadDim, PageTokens uint32
	Causal                                      bool
	KVChunkTokens                               uint32
	SmScale, LogitsSoftCap                      float32
}

func NewAttentionDesc(qoHeads, kvHeads, headDim uint32, dtype DType) AttentionDesc {
	return AttentionDesc{DeviceHost, dtype, qoHeads, kvHeads, headDim, 16, true, 0, 0, 0}
}

func (a AttentionDesc) raw() C.swiftkv_attention_desc {
	var d C.swiftkv_attention_desc
	d.size = C.uint32_t(unsafe.Sizeof(d))
	d.version = C.SWIFTKV_ATTENTION_DESC_VERSION
	d.device, d.dtype = C.int32_t(a.Device), C.swiftkv_dtype(a.DType)
	d.num_qo_heads, d.num_kv_heads, d.head_dim = C.uint32_t(a.NumQOHeads), C.uint32_t(a.NumKVHeads), C.uint32_t(a.HeadDim)
	d.page_tokens, d.kv_chunk_tokens = C.uint32_t(a.PageTokens), C.uint32_t(a.KVChunkTokens)
	if a.Causal {
		d.causal = 1
	}
	d.sm_scale, d.logits_soft_cap = C.float(a.SmScale), C.float(a.LogitsSoftCap)
	return d
}

// WorkspaceSize is the workspace any batch of at most maxRequests and maxQTokens needs.
func (a AttentionDesc) WorkspaceSize(maxRequests uint32, maxQTokens uint64) (uint64, error) {
	d := a.raw()
	var n C.uint64_t
	err := check(func() C.swiftkv_status {
		return C.swiftkv_attention_workspace_size(&n, &d, C.uint32_t(maxRequests), C.uint64_t(maxQTokens))
	})
	return uint64(n), err
}

// AttentionPlan is a plan over one batch.
type AttentionPlan struct {
	raw C.swiftkv_attention_plan
}

// NewAttentionPlan plans a batch into the workspace (256-byte aligned C or device memory).
func NewAttentionPlan(a AttentionDesc, qoIndptr, kvIndptr, kvLastPageLen []int32, workspace unsafe.Pointer,
	workspaceBytes uint64, stream unsafe.Pointer) (*AttentionPlan, error) {
	if len(qoIndptr) != len(kvLastPageLen)+1 || len(kvIndptr) != len(qoIndptr) {
		return nil, &Error{EINVAL, "qo_indptr and kv_indptr need one entry more than kv_last_page_len"}
	}
	d := a.raw()
	p := &AttentionPlan{}
	p.raw.size = C.uint32_t(unsafe.Sizeof(p.raw))
	p.raw.version = C.SWIFTKV_ATTENTION_PLAN_VERSION
	qo, kv, last := cslice(qoIndptr), cslice(kvIndptr), cslice(kvLastPageLen)
	defer C.free(unsafe.Pointer(qo))
	defer C.free(unsafe.Pointer(kv))
	defer C.free(unsafe.Pointer(last))
	err := check(func() C.swiftkv_status {
		return C.swiftkv_attention_plan_make(&p.raw, &d, (*C.int32_t)(unsafe.Pointer(qo)), (*C.int32_t)(unsafe.Pointer(kv)),
			(*C.int32_t)(unsafe.Pointer(last)), C.uint32_t(len(kvLastPageLen)), workspace,
			C.uint64_t(workspaceBytes), stream)
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// KVTokens and QTokens are the plan's counts.
func (p *AttentionPlan) KVTokens() uint64 { return uint64(p.raw.kv_tokens) }
func (p *AttentionPlan) QTokens() uint64  { return uint64(p.raw.q_tokens) }

// AttentionArgs are the tensors of one run: addresses of C or device memory, strides in elements.
type AttentionArgs struct {
	Q                                   unsafe.Pointer
	QTokenStride, QHeadStride           int64
	KBase, VBase                        unsafe.Pointer
	PageStride, TokenStride, HeadStride int64
	NumPages                            uint32
	KVIndices                           unsafe.Pointer
	Out                                 unsafe.Pointer
	OutTokenStride, OutHeadStride       int64
	LSE                                 unsafe.Pointer
}

// Run runs the plan over the tensors.
func (p *AttentionPlan) Run(args AttentionArgs, workspace unsafe.Pointer, stream unsafe.Pointer) error {
	a := cnew[C.swiftkv_attention_args]()
	defer cfree(a)
	a.size = C.uint32_t(unsafe.Sizeof(*a))
	a.version = C.SWIFTKV_ATTENTION_ARGS_VERSION
	a.q = args.Q
	a.q_token_stride, a.q_head_stride = C.int64_t(args.QTokenStride), C.int64_t(args.QHeadStride)
	a.k_base, a.v_base = args.KBase, args.VBase
	a.page_stride, a.token_stride, a.head_stride = C.int64_t(args.PageStride), C.int64_t(args.TokenStride), C.int64_t(args.HeadStride)
	a.num_pages = C.uint32_t(args.NumPages)
	a.kv_indices = (*C.int32_t)(args.KVIndices)
	a.out = args.Out
	a.out_token_stride, a.out_head_stride = C.int64_t(args.OutTokenStride), C.int64_t(args.OutHeadStride)
	a.lse = (*C.float)(args.LSE)
	return check(func() C.swiftkv_status {
		return C.swiftkv_attention_run(&p.raw, a, workspace, stream)
	})
}
