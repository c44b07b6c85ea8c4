package swiftkv

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"swiftkv.dev/bindings/swiftkv/internal/forkprobe"
)

func small() ModelDesc {
	m := NewModelDesc("go-model", 2, 2, 16)
	m.ChunkTokens = 32
	return m
}

func lender() ModelDesc { return NewModelDesc("go-lender", 3, 2, 16) }

func kvOf(seed uint64, n int) []byte {
	x := seed*0x9E3779B97F4A7C15 | 1
	b := make([]byte, n)
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
	return b
}

func tokensOf(seed uint32, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = seed*100003 + uint32(i)
	}
	return t
}

func newCtx(t *testing.T, cfg Config) *Context {
	t.Helper()
	c, err := NewContext(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// val unwraps a (value, error) pair; an error panics, which fails the test with its stack.
func val[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func noErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wantStatus(t *testing.T, err error, want Status) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || e.Status != want {
		t.Fatalf("want %v, got %v", want, err)
	}
	return e
}

func TestVersionStatusesGeometry(t *testing.T) {
	if Version() != 100 || VersionString() != "0.1.0" {
		t.Fatal(Version(), VersionString())
	}
	if F16.Size() != 2 || F32.Size() != 4 || I8.Size() != 1 || DType(99).Size() != 0 {
		t.Fatal("dtype sizes")
	}
	// Enums print their constant's name, or their type and value when they name none.
	for _, c := range []struct{ got, want string }{{BF16.String(), "BF16"},
		{Disk.String(), "Disk"}, {Lender.String(), "Lender"}, {Role(7).String(), "Role(7)"},
		{CudaAllocVMM.String(), "CudaAllocVMM"}, {fmt.Sprint(Host), "Host"},
		{CudaAlloc(0).String(), "CudaAllocAuto"}} {
		if c.got != c.want {
			t.Fatalf("%q, want %q", c.got, c.want)
		}
	}
	_, err := NewModelDesc("x", 0, 1, 1).BytesPerToken()
	e := wantStatus(t, err, EINVAL)
	if e.Message == "" || e.Message != LastErrorMessage() && false {
		t.Fatal(e)
	}
	if n := val(NewModelDesc("q", 64, 8, 128).BytesPerToken()); n != 262144 {
		t.Fatal(n)
	}
	b, l, err := MEU(NewModelDesc("a", 40, 8, 128), NewModelDesc("b", 36, 8, 128))
	if err != nil || b != 9 || l != 10 {
		t.Fatal(b, l, err)
	}
	c, lb, err := LendUnit(small(), lender())
	if err != nil || c != 3 || lb != 4 {
		t.Fatal(c, lb, err)
	}
	gib := uint64(1) << 30
	p := val(PlanBorrower(NewModelDesc("flat", 32, 32, 128), 40*gib, []uint64{20 * gib, 30 * gib}))
	if p.LenderFullBlocks != 6400 || p.StreamBlocks != 6400 || p.RegularBlocks != 4920 ||
		p.MaxContextTokens != 181120 || p.BaselineContextTokens != 81920 {
		t.Fatalf("%+v", p)
	}
	if l, b, err := PlanScaleUp(10, 16, 4, 3, 200); err != nil || l != 4 || b != 3 {
		t.Fatal(l, b, err)
	}
	_, _, err = PlanScaleDown(10, 0, 4, 3, 100)
	wantStatus(t, err, EINVAL)
	if n := val(DeviceCount()); n > 64 {
		t.Fatal(n)
	}
}

func TestConfigRoundTrip(t *testing.T) {
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.HostBudgetBytes = 1 << 20
	cfg.DiskPath, cfg.DiskBudgetBytes = dir, 1<<20
	cfg.EvictionLRU = true
	cfg.AttentionCostTable = []float64{1, 2}
	cfg.CoordTimeoutMs = 700
	cfg.DiskSegmentBytes, cfg.DiskSyncMs, cfg.TransferThreads = 1<<18, 250, 3
	cfg.MaxOpenRequests = 7
	cfg.NoWriteBackOnClose = true
	cfg.CoordUCXTransports, cfg.CoordRemotePath, cfg.CoordRMATimeoutMs = "tcp", RemotePathUCX, 900
	cfg.TierOrder = TierOrderHostFirst
	c := newCtx(t, cfg)
	got := val(c.Config())
	if !got.NoWriteBackOnClose || DefaultConfig().NoWriteBackOnClose {
		t.Fatalf("write-back on close: %+v", got)
	}
	if got.DiskPath != dir || !got.EvictionLRU || len(got.AttentionCostTable) != 2 ||
		got.CoordTimeoutMs != 700 || got.CoordHeartbeatMs != 100 || got.CoordEndpoint != "" ||
		got.DiskSegmentBytes != 1<<18 || got.DiskSyncMs != 250 || got.TransferThreads != 3 ||
		got.MaxOpenRequests != 7 || got.CoordUCXTransports != "tcp" ||
		got.CoordRemotePath != RemotePathUCX || got.CoordRMATimeoutMs != 900 ||
		got.TierOrder != TierOrderHostFirst || DefaultConfig().TierOrder != TierOrderRemoteFirst {
		t.Fatalf("%+v", got)
	}
	if d := DefaultConfig(); d.CoordRemotePath != RemotePathAuto || d.CoordRMATimeoutMs != 2000 {
		t.Fatalf("%+v", d)
	}
	if st := val(c.Stats()); st.DiskFilesSkipped != 0 || st.DiskBytesAllocated != 0 || st.DiskFullRefusals != 0 ||
		st.RequestsOpen != 0 || st.IndexBytes == 0 || st.IndexCapacityChunks == 0 {
		t.Fatalf("%+v", st)
	}
	bad := DefaultConfig()
	bad.MaintenanceIntervalMs = 0
	_, err := NewContext(bad)
	wantStatus(t, err, EINVAL)
	c.Close()
	_, err = c.Stats()
	wantStatus(t, err, ESTATE)
}

func TestLookupReportsTheLongestRun(t *testing.T) {
	cfg := DefaultConfig()
	cfg.HostBudgetBytes = 4 << 20
	c := newCtx(t, cfg)
	m := val(c.RegisterModel(small(), Borrower))
	cb := int(val(small().ChunkBytes()))
	tok := tokensOf(3, 128)
	kv := kvOf(3, 4*cb)
	if n := val(m.Store(tok, kv)); n != 128 {
		t.Fatal(n)
	}
	if n := val(m.Clear(tok[:64], TiersAll)); n != 2 {
		t.Fatal("cleared", n)
	}
	if n := val(m.Store(tok[:32], kv[:cb])); n != 32 { // chunk 1 alone is missing
		t.Fatal(n)
	}
	l := val(m.Lookup(tok))
	if l.PrefixTokens != 32 || l.DroppedHeadTokens != 64 || l.LoadableTokens != 64 ||
		l.Residency[1] != Dropped || l.Residency[2] != Host {
		t.Fatalf("%+v", l)
	}
	out := make([]byte, 2*cb)
	if n := val(m.Retrieve(tok, 64, out)); n != 64 || string(out) != string(kv[2*cb:]) {
		t.Fatal("retrieve", n)
	}
}

func TestCacheRoundTripAndController(t *testing.T) {
	cfg := DefaultConfig()
	cfg.HostBudgetBytes = 4 << 20
	c := newCtx(t, cfg)
	m := val(c.RegisterModel(small(), Borrower))
	cb := int(val(small().ChunkBytes()))
	tok := tokensOf(1, 128)
	kv := kvOf(1, 4*cb)
	if n := val(m.Store(tok, kv)); n != 128 {
		t.Fatal(n)
	}
	l := val(m.Lookup(tok))
	if l.Chunks != 4 || l.PrefixTokens != 128 || l.ChunksPerTier != [3]uint64{0, 4, 0} || l.Residency[3] != Host {
		t.Fatalf("%+v", l)
	}
	out := make([]byte, len(kv))
	if n := val(m.Retrieve(tok, 0, out)); n != 128 || string(out) != string(kv) {
		t.Fatal("retrieve", n)
	}
	_, err := m.Store(tok[:33], kv[:cb])
	wantStatus(t, err, EINVAL)
	_, err = c.RegisterModel(small(), Borrower)
	wantStatus(t, err, EBUSY)
	if err := m.Pin(tok); err != nil {
		t.Fatal(err)
	}
	if n := val(m.Clear(tok, TiersAll)); n != 0 {
		t.Fatal("pinned chunks were cleared")
	}
	if err := m.Unpin(tok); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, m.Unpin(tok), ENOTFOUND)
	_, err = m.Move(tok, Disk)
	wantStatus(t, err, EINVAL)
	if n := val(m.Move(tok, Host)); n != 4 {
		t.Fatal(n)
	}
	s := val(c.Stats())
	if s.Stores != 4 || s.Chunks[Host] != 4 {
		t.Fatalf("%+v", s)
	}
	if n := val(m.Clear(nil, TiersAll)); n != 4 {
		t.Fatal(n)
	}
	if n := val(c.ClearAll(TiersAll)); n != 0 {
		t.Fatal(n)
	}
	if err := m.Unregister(); err != nil {
		t.Fatal(err)
	}
}

// Chunks named by the caller: stored, found, loaded, pinned, moved and cleared by name; never
// found by the same bytes as tokens or under another identity; bad names are EINVAL.
func TestNamedChunks(t *testing.T) {
	cfg := DefaultConfig()
	cfg.HostBudgetBytes = 4 << 20
	c := newCtx(t, cfg)
	m := val(c.RegisterModel(small(), Borrower))
	cb := int(val(small().ChunkBytes()))
	names := make([]byte, 3*16)
	for i := range names {
		names[i] = byte(i*7 + 1)
	}
	kv := kvOf(5, 3*cb)
	if n := val(m.StoreNamed(names, 16, 0, kv)); n != 3 {
		t.Fatal(n)
	}
	l := val(m.LookupNamed(names, 16))
	if l.Chunks != 3 || l.PrefixTokens != 96 || l.Residency[2] != Host {
		t.Fatalf("%+v", l)
	}
	out := make([]byte, len(kv))
	if n := val(m.RetrieveNamed(names, 16, out)); n != 3 || string(out) != string(kv) {
		t.Fatal("named chunks did not come back")
	}
	asTokens := unsafe.Slice((*uint32)(unsafe.Pointer(&names[0])), len(names)/4)
	if l := val(m.Lookup(asTokens)); l.PrefixTokens != 0 {
		t.Fatalf("%+v", l)
	}
	tenantB := small()
	tenantB.Identity = "tenant-b"
	other := val(c.RegisterModel(tenantB, Borrower))
	if l := val(other.LookupNamed(names, 16)); l.PrefixTokens != 0 {
		t.Fatalf("%+v", l)
	}
	_, err := m.StoreNamed(names[:17], 16, 0, kv[:cb])
	wantStatus(t, err, EINVAL)
	_, err = m.LookupNamed(names, 65)
	wantStatus(t, err, EINVAL)
	noErr(t, m.PinNamed(names[:16], 16))
	if n := val(m.ClearNamed(names, 16, TiersAll)); n != 2 {
		t.Fatal(n)
	}
	noErr(t, m.UnpinNamed(names[:16], 16))
	if n := val(m.MoveNamed(names[:16], 16, Host)); n != 1 {
		t.Fatal(n)
	}
	if s := val(c.Stats()); s.Stores != 3 {
		t.Fatalf("%+v", s)
	}
	// The keys the chunk event callback reports: a named chunk evicted is known by its name.
	keys := val(m.ChunkKeysNamed(names, 16))
	if len(keys) != 3 || keys[0] == keys[1] {
		t.Fatalf("%v", keys)
	}
	small2 := DefaultConfig()
	small2.HostBudgetBytes = uint64(2 * cb)
	small2.EvictionLRU = true
	c2 := newCtx(t, small2)
	m2 := val(c2.RegisterModel(small(), Borrower))
	if n := val(m2.StoreNamed(names[:32], 16, 0, kv[:2*cb])); n != 2 {
		t.Fatal(n)
	}
	var mu sync.Mutex
	var seen []ChunkEvent
	noErr(t, c2.OnChunkEvent(func(e ChunkEvent) { mu.Lock(); seen = append(seen, e); mu.Unlock() }))
	if n := val(m2.StoreNamed(names[32:], 16, 2, kv[2*cb:])); n != 1 {
		t.Fatal(n)
	}
	noErr(t, c2.OnChunkEvent(nil))
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || seen[0].KeyLo != keys[0][0] || seen[0].KeyHi != keys[0][1] {
		t.Fatalf("%+v, want %v", seen, keys[0])
	}
	info := val(m2.ChunkInfoNamed(names, 16))
	if len(info) != 3 || info[0].Tier != Dropped || info[1].Tier != Host || info[2].Tier != Host {
		t.Fatalf("%+v", info)
	}
}

func TestIdentityKeepsModelsApart(t *testing.T) {
	cfg := DefaultConfig()
	cfg.HostBudgetBytes = 4 << 20
	c := newCtx(t, cfg)
	d1 := small()
	d1.Identity = "weights-rev-1"
	rev1 := val(c.RegisterModel(d1, Borrower))
	tok := tokensOf(2, 64)
	if n := val(rev1.Store(tok, kvOf(2, 2*int(val(small().ChunkBytes()))))); n != 64 {
		t.Fatal(n)
	}
	d2 := small()
	d2.Identity = "weights-rev-2"
	rev2 := val(c.RegisterModel(d2, Borrower))
	none := val(c.RegisterModel(small(), Borrower))
	if p1, p2, p0 := val(rev1.Lookup(tok)).PrefixTokens, val(rev2.Lookup(tok)).PrefixTokens,
		val(none.Lookup(tok)).PrefixTokens; p1 != 64 || p2 != 0 || p0 != 0 {
		t.Fatal(p1, p2, p0)
	}
	_, err := c.RegisterModel(d1, Borrower)
	wantStatus(t, err, EBUSY)
	text := val(c.MetricsText())
	if !strings.Contains(text, "\nswiftkv_stores_total 2\n") ||
		!strings.Contains(text, "swiftkv_chunks{tier=\"host\"} 2\n") {
		t.Fatal(text)
	}
}

func TestEventsThroughTheHandleTable(t *testing.T) {
	cb := val(small().ChunkBytes())
	cfg := DefaultConfig()
	cfg.HostBudgetBytes = 4 * cb
	cfg.EvictionLRU = true
	c := newCtx(t, cfg)
	var mu sync.Mutex
	var seen []ChunkEvent
	if err := c.OnChunkEvent(func(e ChunkEvent) { mu.Lock(); seen = append(seen, e); mu.Unlock() }); err != nil {
		t.Fatal(err)
	}
	m := val(c.RegisterModel(small(), Borrower))
	for i := 0; i < 8; i++ {
		val(m.Store(tokensOf(uint32(10+i), 32), kvOf(uint64(i), int(cb))))
	}
	if err := c.OnChunkEvent(nil); err != nil {
		t.Fatal(err)
	}
	s := val(c.Stats())
	mu.Lock()
	defer mu.Unlock()
	if len(seen) == 0 || uint64(len(seen)) != s.Evictions || seen[0].To != Dropped || seen[0].Model != m.ID {
		t.Fatalf("%d events, %d evictions, %+v", len(seen), s.Evictions, seen)
	}
}

func TestHostGranules(t *testing.T) {
	// One memfd per granule of four pages: the region says so, its physical memory follows
	// the granules in use, and a granule that is not whole pages is refused.
	cfg := DefaultConfig()
	cfg.HostBudgetBytes = 8 << 20
	c := newCtx(t, cfg)
	b := small()
	ec := ElasticConfig{Lender: lender(), Borrower: &b, CapacityBlocks: 64, OwnedBlocks: 8, HostGranuleBytes: 16384}
	e := val(c.NewElastic(ec))
	s := val(e.Stats())
	block := s.RegionBytes / 64
	if s.MemoryKind != MemoryHostGranules || s.Device != DeviceHost || s.CommittedBytes != (8*block+16383)/16384*16384 {
		t.Fatalf("%+v", s)
	}
	ec.HostGranuleBytes = 16385
	_, err := c.NewElastic(ec)
	wantStatus(t, err, EINVAL)
	e2 := val(c.NewElastic(ElasticConfig{Lender: lender(), Borrower: &b, CapacityBlocks: 64}))
	if s := val(e2.Stats()); s.MemoryKind != MemoryHostMemfd {
		t.Fatalf("%+v", s)
	}
}

func TestElasticRegionAndLocalBorrow(t *testing.T) {
	cfg := DefaultConfig()
	cfg.HostBudgetBytes = 8 << 20
	c := newCtx(t, cfg)
	b := small()
	e := val(c.NewElastic(ElasticConfig{Lender: lender(), Borrower: &b, CapacityBlocks: 64, OwnedBlocks: 8}))
	s := val(e.Stats())
	if s.CapacityBlocks != 64 || s.OwnedBlocks != 8 || s.FreeBlocks != 56 || s.UnitLenderBlocks != 4 || s.UnitBorrowerChunks != 3 {
		t.Fatalf("%+v", s)
	}
	if v := val(e.LayerView(2)); v.NumPages != 64 || v.Base == 0 {
		t.Fatalf("%+v", v)
	}
	_, err := e.LayerView(3)
	wantStatus(t, err, EINVAL)
	l := val(e.Lend(2))
	if l.Blocks != 8 || l.Chunks != 6 || l.FirstBlock != 56 {
		t.Fatalf("%+v", l)
	}
	if err := e.Renew(l.ID); err != nil {
		t.Fatal(err)
	}
	st, grown, lost, err := e.ScaleForRequest(64 * 16)
	if err != nil || st != InProgress || grown != 56 || lost != 42 {
		t.Fatal(st, grown, lost, err)
	}
	if ids := val(e.PendingReclaims()); len(ids) != 1 || ids[0] != l.ID {
		t.Fatal(ids)
	}
	if err := e.Release(l.ID); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, e.Renew(l.ID), ENOTFOUND)
	if st, _, _, err := e.Tick(64); err != nil || st != OK {
		t.Fatal(st, err)
	}
	// The owned part set by hand: down to 8 blocks (14 units given up), and a bad count refused.
	if st, shrunk, gained, err := e.Resize(8); err != nil || st != OK || shrunk != 56 || gained != 42 {
		t.Fatal(st, shrunk, gained, err)
	}
	_, _, _, err = e.Resize(9)
	wantStatus(t, err, EINVAL)
	if s := val(e.Stats()); s.OwnedBlocks != 8 {
		t.Fatalf("%+v", s)
	}
	_, err = e.Lease(l.ID)
	wantStatus(t, err, ENOTFOUND)
	wantStatus(t, e.Offer("x"), ESTATE)
	e.Close()

	m := val(c.RegisterModel(small(), Borrower))
	e2 := val(c.NewElastic(ElasticConfig{Lender: lender(), Borrower: &b, CapacityBlocks: 16, OwnedBlocks: 4}))
	defer e2.Close()
	val(m.Borrow(e2, 10))
	cb := int(val(small().ChunkBytes()))
	tok, kv := tokensOf(5, 9*32), kvOf(5, 9*cb)
	val(m.Store(tok, kv))
	// All nine went to the lease; the background thread may already have demoted ahead to host
	// memory until a quarter of the lease is free again (demote_free_percent 25: three chunks).
	if l := val(m.Lookup(tok)); l.ChunksPerTier[Peer]+l.ChunksPerTier[Host] != 9 || l.ChunksPerTier[Peer] < 6 {
		t.Fatalf("%+v", l)
	}
	if err := e2.Reclaim(LeaseAll); err != nil {
		t.Fatal(err)
	}
	// The borrower's thread answers while this one waits.
	if err := e2.WaitReclaims(5000); err != nil {
		t.Fatal(err)
	}
	if ids := val(e2.PendingReclaims()); len(ids) != 0 {
		t.Fatal("still asked back", ids)
	}
	out := make([]byte, len(kv))
	if n := val(m.Retrieve(tok, 0, out)); n != 9*32 || string(out) != string(kv) {
		t.Fatal("after reclaim", n)
	}
}

// The borrower asks for UCX although the lender is on this host: every byte goes over UCX's tcp
// transport. Skipped by a libswiftkv without UCX.
func TestRemoteLenderOverUCX(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ep := "tcp://" + l.Addr().String()
	l.Close()
	lc := DefaultConfig()
	lc.HostBudgetBytes, lc.CoordEndpoint, lc.CoordHeartbeatMs, lc.CoordUCXTransports = 4<<20, ep, 20, "tcp"
	lctx := newCtx(t, lc)
	b := small()
	e := val(lctx.NewElastic(ElasticConfig{Lender: lender(), Borrower: &b, CapacityBlocks: 32, OwnedBlocks: 8}))
	defer e.Close()
	if err := e.Offer("pool-a"); err != nil {
		t.Fatal(err)
	}
	bc := DefaultConfig()
	bc.HostBudgetBytes, bc.CoordHeartbeatMs, bc.DemoteFreePercent = 4<<20, 20, 0
	bc.CoordUCXTransports, bc.CoordRemotePath = "tcp", RemotePathUCX
	bctx := newCtx(t, bc)
	m := val(bctx.RegisterModel(small(), Borrower))
	if _, err := m.BorrowRemote(ep, "pool-a", 6); err != nil {
		var se *Error
		if errors.As(err, &se) && se.Status == EUNSUPPORTED {
			t.Skip("this libswiftkv has no UCX")
		}
		t.Fatal(err)
	}
	cb := int(val(small().ChunkBytes()))
	tok, kv := tokensOf(8, 12*32), kvOf(8, 12*cb)
	val(m.Store(tok, kv))
	// Memory of another host is the remote tier.
	if l := val(m.Lookup(tok)); l.RemoteChunks != 12 || l.ChunksPerTier[Peer] != 0 || l.Residency[0] != Remote {
		t.Fatalf("%+v", l)
	}
	if st := val(bctx.Stats()); st.RemoteChunks != 12 || st.RemoteCapacityBytes == 0 {
		t.Fatalf("%+v", st)
	}
	out := make([]byte, len(kv))
	if n := val(m.Retrieve(tok, 0, out)); n != 12*32 || string(out) != string(kv) {
		t.Fatal("over UCX", n)
	}
	cs := val(bctx.CoordStats())
	if cs.RemoteLenders != 1 || cs.RMABytesWritten != uint64(12*cb) ||
		cs.RMABytesRead != uint64(12*cb) || cs.RMABatchesFailed != 0 {
		t.Fatalf("%+v", cs)
	}
	if ls := val(lctx.CoordStats()); ls.RemoteSessions != 1 {
		t.Fatalf("%+v", ls)
	}
}

func TestRemoteLender(t *testing.T) {
	ep := fmt.Sprintf("ipc://%s/lender", t.TempDir())
	lc := DefaultConfig()
	lc.HostBudgetBytes, lc.CoordEndpoint, lc.CoordHeartbeatMs = 4<<20, ep, 20
	lctx := newCtx(t, lc)
	b := small()
	e := val(lctx.NewElastic(ElasticConfig{Lender: lender(), Borrower: &b, CapacityBlocks: 32, OwnedBlocks: 8}))
	defer e.Close()
	if err := e.Offer("pool-a"); err != nil {
		t.Fatal(err)
	}
	bc := DefaultConfig()
	bc.HostBudgetBytes, bc.CoordHeartbeatMs, bc.DemoteFreePercent = 4<<20, 20, 0
	bctx := newCtx(t, bc)
	m := val(bctx.RegisterModel(small(), Borrower))
	lease := val(m.BorrowRemote(ep, "pool-a", 6))
	if l := val(e.Lease(lease)); l.Blocks != 24 {
		t.Fatalf("%+v", l)
	}
	cb := int(val(small().ChunkBytes()))
	tok, kv := tokensOf(6, 12*32), kvOf(6, 12*cb)
	val(m.Store(tok, kv))
	// A heartbeat goes every 20 ms; on a loaded machine its answer may take a while.
	for i := 0; i < 5000 && val(bctx.CoordStats()).HeartbeatsAnswered == 0; i++ {
		time.Sleep(time.Millisecond)
	}
	if cs := val(bctx.CoordStats()); cs.HeartbeatsAnswered == 0 || cs.LendersConnected != 1 {
		t.Fatalf("%+v", cs)
	}
	if st, _, _, err := e.ScaleForRequest(32 * 16); err != nil || st != InProgress {
		t.Fatal(st, err)
	}
	for i := 0; i < 5000 && val(e.Stats()).ReclaimingBlocks != 0; i++ {
		time.Sleep(time.Millisecond)
	}
	if cs := val(lctx.CoordStats()); cs.ReclaimsAcked != 1 || cs.ReclaimNsMax == 0 {
		t.Fatalf("%+v", cs)
	}
	out := make([]byte, len(kv))
	if n := val(m.Retrieve(tok, 0, out)); n != 12*32 || string(out) != string(kv) {
		t.Fatal("after the remote reclaim", n)
	}
	_, err := m.BorrowRemote(ep, "nobody", 1)
	wantStatus(t, err, ENOTFOUND)
}

func TestOpenRequestsAreBounded(t *testing.T) {
	cfg := DefaultConfig()
	cfg.HostBudgetBytes = 4 << 20
	cfg.MaxOpenRequests = 1
	c := newCtx(t, cfg)
	m := val(c.RegisterModel(small(), Borrower))
	pool := val(m.PoolCreate(4, 0))
	defer pool.Close()
	r := val(m.Begin(pool, tokensOf(1, 32), []int32{0, 1}, 0))
	_, err := m.Begin(pool, tokensOf(2, 32), []int32{2, 3}, 0)
	wantStatus(t, err, EBUSY)
	if st := val(c.Stats()); st.RequestsOpen != 1 {
		t.Fatalf("%+v", st)
	}
	val(r.Finish())
	r = val(m.Begin(pool, tokensOf(2, 32), []int32{2, 3}, 0))
	val(r.Finish())
	if st := val(c.Stats()); st.RequestsOpen != 0 {
		t.Fatalf("%+v", st)
	}
}

func TestPoolsAndTheConnector(t *testing.T) {
	cfg := DefaultConfig()
	cfg.HostBudgetBytes = 4 << 20
	c := newCtx(t, cfg)
	m := val(c.RegisterModel(small(), Borrower))
	pool := val(m.PoolCreate(8, 2))
	lay := val(pool.Layout())
	first := unsafe.Add(lay.LayerBase[0], int64(lay.StreamFirst)*lay.PageStride*2)
	second := unsafe.Add(lay.LayerBase[1], int64(lay.StreamFirst)*lay.PageStride*2)
	*(*uint16)(first) = 7
	if *(*uint16)(second) != 7 {
		t.Fatal("stream pages are not shared by the layers")
	}
	if err := pool.Close(); err != nil {
		t.Fatal(err)
	}

	const pagesN, page = 8, 16 * 2 * 16
	bufs := []*HostBuffer{NewHostBuffer(2 * pagesN * page * 2), NewHostBuffer(2 * pagesN * page * 2)}
	defer bufs[0].Free()
	defer bufs[1].Free()
	layer := func(l int) []uint16 { return unsafe.Slice((*uint16)(bufs[l].Ptr()), 2*pagesN*page) }
	p := val(m.PoolRegister(PoolLayout{NumPages: pagesN, LayerBase: []unsafe.Pointer{bufs[0].Ptr(), bufs[1].Ptr()},
		LayerSpanBytes: 2 * pagesN * page * 2, PageStride: page, KVStride: pagesN * page, TokenStride: 32, HeadStride: 16}))
	defer p.Close()
	tok := tokensOf(7, 96)
	pages := []int32{5, 1, 7, 0, 3, 2}
	at := func(c int, pg int32, off int) int { return c*pagesN*page + int(pg)*page + off }
	value := func(l, c, tk, i int) uint16 { return uint16(l*7919 + c*104729 + tk*97 + i) }
	r := val(m.Begin(p, tok, pages, 0))
	if err := r.StartLoad(nil); err != nil {
		t.Fatal(err)
	}
	for l := 0; l < 2; l++ {
		if v := val(r.WaitLayerLoad(uint32(l), nil)); v != 0 {
			t.Fatal(v)
		}
		for tk := 0; tk < 96; tk++ {
			for c := 0; c < 2; c++ {
				for i := 0; i < 32; i++ {
					layer(l)[at(c, pages[tk/16], (tk%16)*32+i)] = value(l, c, tk, i)
				}
			}
		}
		if err := r.SaveLayer(uint32(l), nil); err != nil {
			t.Fatal(err)
		}
	}
	if n := val(r.WaitSave(nil)); n != 96 {
		t.Fatal(n)
	}
	if info := val(r.Finish()); info.SavedTokens != 96 {
		t.Fatalf("%+v", info)
	}
	for l := 0; l < 2; l++ {
		for i := range layer(l) {
			layer(l)[i] = 0
		}
	}
	pages2 := []int32{4, 6, 0, 1, 2, 3}
	r2 := val(m.Begin(p, tok, pages2, 0))
	noErr(t, r2.StartLoad(nil))
	for l := 0; l < 2; l++ {
		if v := val(r2.WaitLayerLoad(uint32(l), nil)); v != 96 {
			t.Fatal(v)
		}
		noErr(t, r2.SaveLayer(uint32(l), nil))
	}
	val(r2.WaitSave(nil))
	if info := val(r2.Info()); info.LoadEndTokens != 96 {
		t.Fatalf("%+v", info)
	}
	val(r2.Finish())
	for l := 0; l < 2; l++ {
		for tk := 0; tk < 96; tk++ {
			for c := 0; c < 2; c++ {
				for i := 0; i < 32; i++ {
					if layer(l)[at(c, pages2[tk/16], (tk%16)*32+i)] != value(l, c, tk, i) {
						t.Fatalf("layer %d token %d differs", l, tk)
					}
				}
			}
		}
	}
	// The other shapes: save-only stores what pages2 holds under other tokens; load-only brings
	// it back into the first pages, saving nothing.
	tok2 := tokensOf(8, 96)
	rs := val(m.BeginShaped(p, tok2, pages2, 0, SaveOnly))
	wantStatus(t, rs.StartLoad(nil), ESTATE)
	for l := 0; l < 2; l++ {
		noErr(t, rs.SaveLayer(uint32(l), nil))
	}
	if n := val(rs.WaitSave(nil)); n != 96 {
		t.Fatal(n)
	}
	val(rs.Finish())
	for l := 0; l < 2; l++ {
		for i := range layer(l) {
			layer(l)[i] = 0
		}
	}
	rl := val(m.BeginShaped(p, tok2, pages, 0, LoadOnly))
	noErr(t, rl.StartLoad(nil))
	for l := 0; l < 2; l++ {
		if v := val(rl.WaitLayerLoad(uint32(l), nil)); v != 96 {
			t.Fatal(v)
		}
	}
	wantStatus(t, rl.SaveLayer(0, nil), ESTATE)
	val(rl.Finish())
	for l := 0; l < 2; l++ {
		for tk := 0; tk < 96; tk++ {
			for c := 0; c < 2; c++ {
				for i := 0; i < 32; i++ {
					if layer(l)[at(c, pages[tk/16], (tk%16)*32+i)] != value(l, c, tk, i) {
						t.Fatalf("load-only: layer %d token %d differs", l, tk)
					}
				}
			}
		}
	}
	// Chunks named by the caller: saved from the first pages under names (no tokens), loaded by
	// the names into pages2 byte for byte; other names load nothing.
	names := make([]byte, 3*32)
	for i := range names {
		names[i] = byte(i*13 + 5)
	}
	rn := val(m.BeginNamed(p, 96, names, 32, pages, 0, SaveOnly))
	for l := 0; l < 2; l++ {
		noErr(t, rn.SaveLayer(uint32(l), nil))
	}
	if n := val(rn.WaitSave(nil)); n != 96 {
		t.Fatal(n)
	}
	val(rn.Finish())
	for l := 0; l < 2; l++ {
		for i := range layer(l) {
			layer(l)[i] = 0
		}
	}
	rn = val(m.BeginNamed(p, 96, names, 32, pages2, 0, LoadOnly))
	noErr(t, rn.StartLoad(nil))
	for l := 0; l < 2; l++ {
		if v := val(rn.WaitLayerLoad(uint32(l), nil)); v != 96 {
			t.Fatal(v)
		}
	}
	val(rn.Finish())
	for l := 0; l < 2; l++ {
		for tk := 0; tk < 96; tk++ {
			for c := 0; c < 2; c++ {
				for i := 0; i < 32; i++ {
					if layer(l)[at(c, pages2[tk/16], (tk%16)*32+i)] != value(l, c, tk, i) {
						t.Fatalf("named: layer %d token %d differs", l, tk)
					}
				}
			}
		}
	}
	other := make([]byte, 3*32)
	rn = val(m.BeginNamed(p, 96, other, 32, pages2, 0, LoadOnly))
	if info := val(rn.Info()); info.LoadEndTokens != 0 {
		t.Fatalf("%+v", info)
	}
	val(rn.Finish())
	_, err := m.BeginNamed(p, 96, names[:64], 32, pages2, 0, LoadOnly)
	wantStatus(t, err, EINVAL)
	// An engine holding the first block itself (its own prefix cache) loads from token 16, inside
	// the first chunk: its block is left as it is, the rest arrives.
	for l := 0; l < 2; l++ {
		for i := range layer(l) {
			layer(l)[i] = 0
		}
	}
	rb := val(m.BeginShaped(p, tok, pages2, 16, LoadOnly))
	noErr(t, rb.StartLoad(nil))
	for l := 0; l < 2; l++ {
		if v := val(rb.WaitLayerLoad(uint32(l), nil)); v != 96 {
			t.Fatal(v)
		}
	}
	if info := val(rb.Finish()); info.LoadBeginTokens != 16 {
		t.Fatalf("%+v", info)
	}
	for l := 0; l < 2; l++ {
		for tk := 0; tk < 96; tk++ {
			for c := 0; c < 2; c++ {
				for i := 0; i < 32; i++ {
					want := value(l, c, tk, i)
					if tk < 16 {
						want = 0
					}
					if layer(l)[at(c, pages2[tk/16], (tk%16)*32+i)] != want {
						t.Fatalf("load from 16: layer %d token %d", l, tk)
					}
				}
			}
		}
	}
	_, err = m.Begin(p, tok[:64], []int32{0, 0, 1, 2}, 0)
	wantStatus(t, err, EINVAL)
	_, err = m.Begin(p, tok[:64], []int32{0, 1, 2, 3}, 8) // inside a block
	wantStatus(t, err, EINVAL)
	r3 := val(m.Begin(p, tok[:32], []int32{0, 1}, 0))
	_, err = r3.WaitLayerLoad(0, nil)
	wantStatus(t, err, ESTATE)
	wantStatus(t, p.Close(), EBUSY)
	val(r3.Finish())
}

// The batch hooks: two requests of one step saved, then loaded into other pages, every element
// checked; a bad batch (one request not started, one named twice, two contexts) changes nothing.
func TestBatchHooks(t *testing.T) {
	cfg := DefaultConfig()
	cfg.HostBudgetBytes = 4 << 20
	c := newCtx(t, cfg)
	m := val(c.RegisterModel(small(), Borrower))
	pool := val(m.PoolCreate(12, 0))
	defer pool.Close()
	lay := val(pool.Layout())
	elem := func(l int, pg int32, kv, tk, i int64) *uint16 {
		return (*uint16)(unsafe.Add(lay.LayerBase[l],
			2*(int64(pg)*lay.PageStride+kv*lay.KVStride+tk*lay.TokenStride+i)))
	}
	value := func(seq, l int, kv int64, tk int, i int64) uint16 {
		return uint16(seq*31 + l*7919 + int(kv)*104729 + tk*97 + int(i))
	}
	toks := [][]uint32{tokensOf(31, 64), tokensOf(32, 64)}
	step := func(pages [][]int32, write bool) [][]uint64 {
		rs := []*Request{val(m.Begin(pool, toks[0], pages[0], 0)), val(m.Begin(pool, toks[1], pages[1], 0))}
		for _, r := range rs {
			noErr(t, r.StartLoad(nil))
		}
		var valid [][]uint64
		for l := 0; l < 2; l++ {
			valid = append(valid, val(WaitLayerLoadBatch(rs, uint32(l), nil)))
			for seq, p := range pages {
				for tk := 0; tk < 64; tk++ {
					for kv := int64(0); kv < 2; kv++ {
						for i := int64(0); i < 32; i++ {
							at := elem(l, p[tk/16], kv, int64(tk%16), i)
							if write {
								*at = value(seq, l, kv, tk, i)
							} else if *at != value(seq, l, kv, tk, i) {
								t.Fatalf("request %d layer %d token %d differs", seq, l, tk)
							}
						}
					}
				}
			}
			noErr(t, SaveLayerBatch(rs, uint32(l), nil))
		}
		for _, r := range rs {
			n := val(r.WaitSave(nil))
			if (write && n != 64) || (!write && n != 0) {
				t.Fatal(n)
			}
			val(r.Finish())
		}
		return valid
	}
	if v := step([][]int32{{0, 1, 2, 3}, {4, 5, 6, 7}}, true); fmt.Sprint(v) != "[[0 0] [0 0]]" {
		t.Fatal(v)
	}
	if v := step([][]int32{{9, 2, 7, 4}, {0, 11, 3, 8}}, false); fmt.Sprint(v) != "[[64 64] [64 64]]" {
		t.Fatal(v)
	}

	a := val(m.Begin(pool, toks[0], []int32{0, 1, 2, 3}, 0))
	b := val(m.Begin(pool, toks[1], []int32{4, 5, 6, 7}, 0))
	noErr(t, a.StartLoad(nil))
	_, err := WaitLayerLoadBatch([]*Request{a, b}, 0, nil)
	wantStatus(t, err, ESTATE)
	if !strings.Contains(err.Error(), "before start_load") {
		t.Fatal(err)
	}
	if info := val(a.Info()); info.LayersLoaded != 0 {
		t.Fatalf("%+v", info)
	}
	_, err = WaitLayerLoadBatch([]*Request{a, a}, 0, nil)
	wantStatus(t, err, EINVAL)
	c2 := newCtx(t, cfg)
	m2 := val(c2.RegisterModel(small(), Borrower))
	pool2 := val(m2.PoolCreate(4, 0))
	other := val(m2.Begin(pool2, toks[0], []int32{0, 1, 2, 3}, 0))
	noErr(t, other.StartLoad(nil))
	_, err = WaitLayerLoadBatch([]*Request{a, other}, 0, nil)
	wantStatus(t, err, EINVAL)
	val(other.Finish())
	noErr(t, pool2.Close())
	noErr(t, b.StartLoad(nil))
	if v := val(WaitLayerLoadBatch([]*Request{a, b}, 0, nil)); fmt.Sprint(v) != "[64 64]" {
		t.Fatal(v)
	}
	if v := val(WaitLayerLoadBatch(nil, 0, nil)); len(v) != 0 {
		t.Fatal(v)
	}
	noErr(t, SaveLayerBatch([]*Request{b, a}, 0, nil))
	if info := val(b.Info()); info.LayersSaved != 1 {
		t.Fatalf("%+v", info)
	}
	val(a.Finish())
	val(b.Finish())
}

func TestAttentionOnTheHost(t *testing.T) {
	a := NewAttentionDesc(4, 2, 64, F32)
	const nPages, pt, hk, d, tq = 4, 16, 2, 64, 3
	kvLen := 16 + 5
	f32 := func(b *HostBuffer, n int) []float32 { return unsafe.Slice((*float32)(b.Ptr()), n) }
	kb, vb := NewHostBuffer(nPages*pt*hk*d*4), NewHostBuffer(nPages*pt*hk*d*4)
	qb, ob := NewHostBuffer(tq*4*d*4), NewHostBuffer(tq*4*d*4)
	idx := NewHostBuffer(8)
	for _, b := range []*HostBuffer{kb, vb, qb, ob, idx} {
		defer b.Free()
	}
	k, v, q, out := f32(kb, nPages*pt*hk*d), f32(vb, nPages*pt*hk*d), f32(qb, tq*4*d), f32(ob, tq*4*d)
	for i := range k {
		k[i] = float32(i*37%101)/101 - 0.5
		v[i] = float32(i*53%89)/89 - 0.5
	}
	for i := range q {
		q[i] = float32(i*29%71)/71 - 0.5
	}
	pages := unsafe.Slice((*int32)(idx.Ptr()), 2)
	pages[0], pages[1] = 3, 1
	ws := val(a.WorkspaceSize(1, tq))
	wsb := NewHostBuffer(int(ws) + 256)
	defer wsb.Free()
	wsp := unsafe.Add(wsb.Ptr(), (256-uintptr(wsb.Ptr())%256)%256) // 256-byte aligned
	plan := val(NewAttentionPlan(a, []int32{0, tq}, []int32{0, 2}, []int32{5}, wsp, ws, nil))
	if plan.KVTokens() != uint64(kvLen) || plan.QTokens() != tq {
		t.Fatal(plan.KVTokens(), plan.QTokens())
	}
	args := AttentionArgs{Q: qb.Ptr(), QTokenStride: 4 * d, QHeadStride: d, KBase: kb.Ptr(), VBase: vb.Ptr(),
		PageStride: pt * hk * d, TokenStride: hk * d, HeadStride: d, NumPages: nPages, KVIndices: idx.Ptr(),
		Out: ob.Ptr(), OutTokenStride: 4 * d, OutHeadStride: d}
	if err := plan.Run(args, wsp, nil); err != nil {
		t.Fatal(err)
	}
	at := func(base []float32, tk, h, i int) float64 {
		p := int(pages[tk/pt])
		return float64(base[((p*pt+tk%pt)*hk+h)*d+i])
	}
	worst := 0.0
	for qi := 0; qi < tq; qi++ {
		limit := kvLen - tq + qi + 1
		for h := 0; h < 4; h++ {
			kh := h / 2
			s := make([]float64, limit)
			mx := math.Inf(-1)
			for j := range s {
				for i := 0; i < d; i++ {
					s[j] += float64(q[(qi*4+h)*d+i]) * at(k, j, kh, i)
				}
				s[j] /= 8
				mx = math.Max(mx, s[j])
			}
			z := 0.0
			for j := range s {
				s[j] = math.Exp(s[j] - mx)
				z += s[j]
			}
			for i := 0; i < d; i++ {
				want := 0.0
				for j := range s {
					want += s[j] / z * at(v, j, kh, i)
				}
				worst = math.Max(worst, math.Abs(float64(out[(qi*4+h)*d+i])-want))
			}
		}
	}
	if worst > 1e-5 {
		t.Fatal("max error", worst)
	}
	pages[1] = 9
	wantStatus(t, plan.Run(args, wsp, nil), EINVAL)
}

func TestOneContextManyGoroutines(t *testing.T) {
	cfg := DefaultConfig()
	cfg.HostBudgetBytes = 16 << 20
	c := newCtx(t, cfg)
	cb := int(val(small().ChunkBytes()))
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			d := small()
			d.Name = fmt.Sprintf("g%d", g)
			m, err := c.RegisterModel(d, Borrower)
			if err != nil {
				errs <- err
				return
			}
			for round := 0; round < 20; round++ {
				tok, kv := tokensOf(uint32(g*1000+round), 64), kvOf(uint64(g*1000+round), 2*cb)
				if n, err := m.Store(tok, kv); err != nil || n != 64 {
					errs <- fmt.Errorf("store %d %v", n, err)
					return
				}
				out := make([]byte, len(kv))
				if n, err := m.Retrieve(tok, 0, out); err != nil || n != 64 || string(out) != string(kv) {
					errs <- fmt.Errorf("retrieve %d %v", n, err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if s := val(c.Stats()); s.Stores != 4*20*2 {
		t.Fatal(s.Stores)
	}
}

func TestMain(m *testing.M) {
	os.Setenv("SWIFTKV_LOG", "off")
	os.Exit(m.Run())
}

// A disk that fails in the middle of a store: the error comes with the leading tokens cached,
// and those read back bit-exact. The failure is a file size limit, which holds for the whole
// process, so the case runs in a child of the test binary.
func TestFailedStoreSaysWhatItKept(t *testing.T) {
	if os.Getenv("SWIFTKV_GO_STORE_CHILD") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestFailedStoreSaysWhatItKept$")
		cmd.Env = append(os.Environ(), "SWIFTKV_GO_STORE_CHILD="+t.TempDir(), "SWIFTKV_LOG=off")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "child ok") {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return
	}
	cfg := DefaultConfig()
	cfg.DiskPath, cfg.DiskBudgetBytes = os.Getenv("SWIFTKV_GO_STORE_CHILD"), 1<<20
	ctx := newCtx(t, cfg)
	m := val(ctx.RegisterModel(small(), Borrower))
	chunk := int(val(small().ChunkBytes()))
	if n := val(m.Store(tokensOf(9, 32), kvOf(9, chunk))); n != 32 {
		t.Fatalf("first store cached %d", n)
	}
	signal.Ignore(syscall.SIGXFSZ)
	noErr(t, syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: 32768, Max: 32768}))
	tokens, kv := tokensOf(8, 8*32), kvOf(8, 8*chunk)
	n, err := m.Store(tokens, kv)
	var e *Error
	if !errors.As(err, &e) || e.Status != EIO {
		t.Fatalf("store: %v", err)
	}
	if n == 0 || n >= 8*32 || n%32 != 0 {
		t.Fatalf("cached %d tokens", n)
	}
	if l := val(m.Lookup(tokens)); l.PrefixTokens != n {
		t.Fatalf("lookup finds %d, store said %d", l.PrefixTokens, n)
	}
	out := make([]byte, len(kv))
	if got := val(m.Retrieve(tokens, 0, out)); got != n {
		t.Fatalf("retrieved %d of %d", got, n)
	}
	kept := int(n/32) * chunk
	if string(out[:kept]) != string(kv[:kept]) {
		t.Fatal("the kept chunks differ")
	}
	fmt.Println("child ok")
}

// A borrower that keeps renewing a lease asked back, and never releases it, loses it: the lease
// (300 ms) is renewed to at most 100 ms after the asking, so renewing every 20 ms meets
// ETIMEDOUT soon after the 300 ms first granted.
func TestReclaimDeadline(t *testing.T) {
	cfg := DefaultConfig()
	cfg.HostBudgetBytes = 8 << 20
	c := newCtx(t, cfg)
	b := small()
	e := val(c.NewElastic(ElasticConfig{Lender: lender(), Borrower: &b, CapacityBlocks: 64,
		LeaseMs: 300, ReclaimDeadlineMs: 100}))
	defer e.Close()
	l := val(e.Lend(1))
	noErr(t, e.Reclaim(l.ID))
	var err error
	for i := 0; i < 250 && err == nil; i++ {
		time.Sleep(20 * time.Millisecond)
		err = e.Renew(l.ID)
	}
	wantStatus(t, err, ETIMEDOUT)
	if p := val(e.PendingReclaims()); len(p) != 0 {
		t.Fatalf("still pending: %v", p)
	}
}

// halvesOf is f16 values in [0.5, 1): finite, as a codec's input must be.
func halvesOf(seed uint64, n int) []byte {
	b := kvOf(seed, n)
	for i := 0; i+1 < n; i += 2 {
		v := 0x3800 + (uint16(b[i])<<2 | uint16(i/2)&3)
		b[i], b[i+1] = byte(v), byte(v>>8)
	}
	return b
}

func TestCompression(t *testing.T) {
	cfg := DefaultConfig()
	cfg.HostBudgetBytes = 4 << 20
	c := newCtx(t, cfg)
	m := val(c.RegisterModel(small(), Borrower))
	cb := int(val(small().ChunkBytes()))
	tok := tokensOf(31, 64)
	kv := halvesOf(31, 2*cb)
	wantStatus(t, m.SetCompression(Compression{Host: Codec{Kind: CodecKivi, Bits: 3, Group: 32}}), EINVAL)
	// A lossy codec for a model that takes exact bytes only: chunks it could never load.
	wantStatus(t, m.SetCompression(Compression{Host: Codec{Kind: CodecFP8}}), EINVAL)
	noErr(t, m.SetCompression(Compression{AcceptLossy: true, Host: Codec{Kind: CodecFP8}}))
	if n := val(m.Store(tok, kv)); n != 64 {
		t.Fatal(n)
	}
	info := val(m.ChunkInfo(tok))
	if len(info) != 2 || info[0].Tier != Host || info[0].Codec.Kind != CodecFP8 || !info[0].Lossy ||
		info[0].StoredBytes >= uint64(cb) {
		t.Fatalf("%+v", info)
	}
	s := val(c.CodecStats())
	if s.Chunks[CodecFP8][Host] != 2 || s.RawBytes[CodecFP8][Host] != uint64(2*cb) {
		t.Fatalf("%+v", s)
	}
	out := make([]byte, len(kv))
	noErr(t, m.SetCompression(Compression{})) // exact bytes again: the lossy chunks stay, refused
	if n := val(m.Retrieve(tok, 0, out)); n != 0 {
		t.Fatal("a lossy chunk returned where exact bytes were asked", n)
	}
	if s := val(c.CodecStats()); s.LossyRefused != 1 {
		t.Fatal(s.LossyRefused)
	}
	noErr(t, m.SetCompression(Compression{AcceptLossy: true, Host: Codec{Kind: CodecFP8}}))
	if n := val(m.Retrieve(tok, 0, out)); n != 64 || string(out) == string(kv) {
		t.Fatal("retrieve", n)
	}
	_, err := m.Compress(tok, Codec{Kind: CodecKivi, Bits: 5, Group: 32})
	wantStatus(t, err, EINVAL)
	_, err = m.Compress(tokensOf(32, 32), Codec{})
	wantStatus(t, err, ENOTFOUND)
	if n := val(m.Compress(tok, Codec{Kind: CodecKivi, Bits: 4, Group: 32})); n != 2 {
		t.Fatal(n)
	}
	if i := val(m.ChunkInfo(tok)); i[1].Codec != (Codec{Kind: CodecKivi, Bits: 4, Group: 32}) || !i[1].Lossy {
		t.Fatalf("%+v", i)
	}
}

// Adaptive mode: exact while quality is worth the most, compressed by the policy once it is
// worth nothing; bad parameters are EINVAL; the policy chooses only in adaptive mode.
func TestCompressionAdaptive(t *testing.T) {
	cfg := DefaultConfig()
	cfg.HostBudgetBytes = 4 << 20
	c := newCtx(t, cfg)
	m := val(c.RegisterModel(small(), Borrower))
	cb := int(val(small().ChunkBytes()))
	tok := tokensOf(33, 64)
	kv := halvesOf(33, 2*cb)
	_, err := m.CompressByPolicy(tok)
	wantStatus(t, err, EINVAL)
	k4 := Codec{Kind: CodecKivi, Bits: 4, Group: 8}
	a := DefaultAdaptive()
	if a.Alpha != 1 || a.HostGBps != 25 {
		t.Fatalf("%+v", a)
	}
	a.Alpha = 1e6
	a.Methods = []Method{{Codec: k4, Quality: -1, DecodeGBps: 1e6}}
	wantStatus(t, m.SetCompression(Compression{Adaptive: &a}), EINVAL) // lossy, exact asked
	wantStatus(t, m.SetCompression(Compression{AcceptLossy: true, Host: Codec{Kind: CodecFP8}, Adaptive: &a}), EINVAL)
	many := a
	many.Methods = make([]Method, 9)
	for i := range many.Methods {
		many.Methods[i] = MeasuredMethod(Codec{Kind: CodecFP8})
	}
	wantStatus(t, m.SetCompression(Compression{AcceptLossy: true, Adaptive: &many}), EINVAL)
	noErr(t, m.SetCompression(Compression{AcceptLossy: true, Adaptive: &a}))
	if n := val(m.Store(tok, kv)); n != 64 {
		t.Fatal(n)
	}
	for _, i := range val(m.ChunkInfo(tok)) {
		if i.Codec.Kind != CodecRaw {
			t.Fatalf("%+v", i)
		}
	}
	a.Alpha = 0
	noErr(t, m.SetCompression(Compression{AcceptLossy: true, Adaptive: &a}))
	if n := val(m.CompressByPolicy(tok)); n != 2 {
		t.Fatal(n)
	}
	for _, i := range val(m.ChunkInfo(tok)) {
		if i.Codec != k4 || !i.Lossy || i.StoredBytes >= uint64(cb) {
			t.Fatalf("%+v", i)
		}
	}
}

// A context used in the child of a fork (made by C code the program links): every call is
// ESTATE naming the fork and its destroy releases nothing; the parent's chunks stay right.
// Before, the child's stores went over the parent's newest chunks in the shared host slabs.
func TestAForkCannotUseTheParentsContext(t *testing.T) {
	cfg := DefaultConfig()
	cfg.HostBudgetBytes = 4 << 20
	c := newCtx(t, cfg)
	m := val(c.RegisterModel(small(), Borrower))
	cb := int(val(small().ChunkBytes()))
	tok, kv := tokensOf(3, 128), kvOf(3, 4*cb)
	if n := val(m.Store(tok, kv)); n != 128 {
		t.Fatal(n)
	}
	if code := forkprobe.StoreInChild(unsafe.Pointer(c.raw), m.ID, tokensOf(4, 64), kvOf(4, 2*cb)); code != 0 {
		t.Fatalf("the child exited %d", code)
	}
	out := make([]byte, len(kv))
	if n := val(m.Retrieve(tok, 0, out)); n != 128 || string(out) != string(kv) {
		t.Fatal("the parent's chunks after the fork", n)
	}
	if l := val(m.Lookup(tokensOf(4, 64))); l.PrefixTokens != 0 {
		t.Fatalf("the child's refused store is in the parent's context: %+v", l)
	}
}
