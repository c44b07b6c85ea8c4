package swiftkv

import "sync"

// guard keeps a C handle alive through the calls made on it. Every call enters before it reads
// the handle and leaves after the C call returned; close refuses new calls and waits for those
// in flight. Together with runtime.KeepAlive on the owner after each call, a finalizer (which
// calls close) can never free a handle under a running call, and a Close from another goroutine
// waits for the calls instead of racing them.
type guard struct {
	mu       sync.Mutex
	idle     sync.Cond
	inflight int
	closed   bool
}

// enter counts a call in; false once the handle is closed.
func (g *guard) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.inflight++
	return true
}

func (g *guard) leave() {
	g.mu.Lock()
	g.inflight--
	if g.inflight == 0 && g.idle.L != nil {
		g.idle.Broadcast()
	}
	g.mu.Unlock()
}

// close marks the handle closed and waits for the calls in flight; true for the first close
// only (the caller then frees the handle). Must not be called from inside a call on the same
// handle (a callback), which would wait for itself.
func (g *guard) close() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.closed = true
	if g.idle.L == nil {
		g.idle.L = &g.mu
	}
	for g.inflight > 0 {
		g.idle.Wait()
	}
	return true
}
