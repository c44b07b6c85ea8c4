package swiftkv

import (
	"net"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
)

// Handles that become unreachable while their calls run: with the collector forced to run all
// the time, a finalizer that closed a context or region under a call in flight would free
// memory the call is using. Every call must finish cleanly, and a child (region, pool,
// request) keeps its context alive, so finalizers end children first.
func TestHandlesLiveThroughTheirCalls(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(1))
	var stop atomic.Bool
	var gc sync.WaitGroup
	gc.Add(1)
	go func() {
		defer gc.Done()
		for !stop.Load() {
			runtime.GC()
		}
	}()
	defer func() {
		stop.Store(true)
		gc.Wait()
	}()
	// A socket that accepts and never answers: a borrow from it waits in C for the timeout.
	silent, err := net.Listen("unix", filepath.Join(t.TempDir(), "silent"))
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	endpoint := "ipc://" + silent.Addr().String()
	b := small()
	chunk := int(val(b.ChunkBytes()))
	kv := kvOf(1, 4*chunk)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 12; i++ {
				// Nothing below is closed by hand: each handle's last use is its last call.
				cfg := DefaultConfig()
				cfg.HostBudgetBytes = 1 << 20
				cfg.CoordTimeoutMs = 30
				c, err := NewContext(cfg)
				if err != nil {
					t.Error(err)
					return
				}
				m, err := c.RegisterModel(b, Borrower)
				if err != nil {
					t.Error(err)
					return
				}
				tokens := tokensOf(uint32(w*1000+i), 4*32)
				if n, err := m.Store(tokens, kv); err != nil || n != 4*32 {
					t.Error(n, err)
					return
				}
				e, err := c.NewElastic(ElasticConfig{Lender: lender(), Borrower: &b, CapacityBlocks: 64})
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := e.Lend(1); err != nil {
					t.Error(err)
					return
				}
				if err := e.Reclaim(LeaseAll); err != nil {
					t.Error(err)
					return
				}
				// The region's last use: a call that waits in C.
				if err := e.WaitReclaims(30); err == nil {
					t.Error("a reclaim nobody answers was answered")
					return
				}
				p, err := m.PoolCreate(8, 0)
				if err != nil {
					t.Error(err)
					return
				}
				pages := []int32{0, 1, 2, 3, 4, 5, 6, 7}
				if _, err := m.Begin(p, tokens, pages, 0); err != nil {
					t.Error(err)
					return
				}
				if l, err := m.Lookup(tokens); err != nil || l.PrefixTokens != 4*32 {
					t.Error(l, err)
					return
				}
				// The context's last use: a call that waits in C.
				if _, err := m.BorrowRemote(endpoint, "x", 1); err == nil {
					t.Error("a silent lender lent")
					return
				}
			}
		}(w)
	}
	wg.Wait()
}

// Close from another goroutine waits for a call in flight on the handle, and later calls say
// the handle is closed.
func TestCloseWaitsForCallsInFlight(t *testing.T) {
	cfg := DefaultConfig()
	cfg.HostBudgetBytes = 1 << 20
	c := newCtx(t, cfg)
	b := small()
	e := val(c.NewElastic(ElasticConfig{Lender: lender(), Borrower: &b, CapacityBlocks: 64}))
	val(e.Lend(1))
	noErr(t, e.Reclaim(LeaseAll))
	waited := make(chan error)
	go func() { waited <- e.WaitReclaims(200) }()
	for {
		e.g.mu.Lock()
		n := e.g.inflight
		e.g.mu.Unlock()
		if n > 0 {
			break
		}
		runtime.Gosched()
	}
	e.Close()
	// The wait ran its whole 200 ms on an open region: a region destroyed under it would have
	// ended the lease, and the wait with it, early and without ETIMEDOUT.
	wantStatus(t, <-waited, ETIMEDOUT)
	_, err := e.Stats()
	wantStatus(t, err, ESTATE)
	c.Close()
	_, err = c.Stats()
	wantStatus(t, err, ESTATE)
}

// Closing a context ends the regions made in it that are still open, before the context
// itself (the C library needs them gone first): later calls on them say they are closed, and
// their own Close, or their finalizer, does nothing more.
func TestContextCloseEndsItsRegions(t *testing.T) {
	cfg := DefaultConfig()
	cfg.HostBudgetBytes = 4 << 20
	c, err := NewContext(cfg)
	noErr(t, err)
	b := small()
	kept := val(c.NewElastic(ElasticConfig{Lender: lender(), Borrower: &b, CapacityBlocks: 64}))
	val(kept.Lend(1))
	for i := 0; i < 8; i++ { // dropped without Close: the finalizers find them ended
		val(c.NewElastic(ElasticConfig{Lender: lender(), Borrower: &b, CapacityBlocks: 64}))
	}
	c.Close()
	_, err = kept.Stats()
	wantStatus(t, err, ESTATE)
	kept.Close()
	runtime.GC()
	runtime.GC()
	// A finalizer run after its context is gone would have crashed the program by now; one
	// more context made and closed shows the library still works.
	c2, err := NewContext(cfg)
	noErr(t, err)
	e := val(c2.NewElastic(ElasticConfig{Lender: lender(), Borrower: &b, CapacityBlocks: 64}))
	val(e.Lend(1))
	c2.Close()
	e.Close()
}
