package xdpnet

import (
	"fmt"
	"sync"
	"time"

	"github.com/softrnic/softrnic/tcp"
)

// stallWatch is CheckStall's view of the loop: the heartbeat it last saw
// and since when the loop has shown no progress. mu makes concurrent
// CheckStall calls safe; the loop never takes it.
type stallWatch struct {
	mu      sync.Mutex
	beat    uint64
	since   time.Time // the heartbeat last moved or the loop was last idle
	stalled bool      // this episode was reported and has not ended
}

// CheckStall is the Poller's side of a watchdog: it reports whether the
// loop has stalled, that is, since at least after ago it has been inside
// one turn, or has left Do or Async calls (or frames handed over by other
// pollers) untaken. It reports each stall episode once and counts it in
// Stats.Stalls; the episode ends when the loop starts another turn, and a
// later stall is a new episode. A loop asleep in ppoll with nothing queued
// is idle, not stalled, however long it sleeps; a loop that has not
// started or has returned is neither.
//
// now is the watchdog's clock. CheckStall measures from its own calls, so
// call it regularly (softrnicd: once a second for a 5 s threshold): a
// stall is reported between after and after plus the interval. The loop
// pays for this one atomic store per turn (the heartbeat), nothing more.
func (p *Poller) CheckStall(now time.Time, after time.Duration) bool {
	w := &p.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	beat := p.beat.Load()
	if !p.looping.Load() || beat != w.beat || w.since.IsZero() || p.idle() {
		w.beat, w.since, w.stalled = beat, now, false
		return false
	}
	if w.stalled || now.Sub(w.since) < after {
		return false
	}
	w.stalled = true
	p.stalls.Add(1)
	return true
}

// idle reports whether the loop sleeps with nothing queued for it: no Do
// call, no Async function, no frame from another poller. Safe from any
// goroutine.
func (p *Poller) idle() bool {
	return p.sleeping.Load() && len(p.calls) == 0 && p.asyncPending.Load() == 0 && !p.handedWaiting()
}

// defaultConnStallAfter is how long a connection may wait on the wire with
// nothing acknowledged and nothing received before Config.Warn is told,
// once per episode, with the connection's state. Recovery on a lossy link
// takes seconds at most (RTOs back off from 200 ms); a connection that
// waits longer has lost its peer or is stuck.
const defaultConnStallAfter = 10 * time.Second

// Waiter is implemented by a connection's tcp.Handler whose protocol can
// wait on the peer while TCP is idle (an RDMA Read awaiting its response):
// Waiting says it does, Diag describes the protocol's state. Both run on
// the loop.
type Waiter interface {
	Waiting() bool
	Diag() string
}

// checkConn is the sweep's stall check of one connection: one that is
// Busy, or whose handler is Waiting, and whose acknowledged and received
// octets have not moved for Config.ConnStallAfter is reported with its state.
func (p *Poller) checkConn(now tcp.Time, f *flow, c *tcp.Conn) {
	una, in := c.Progress()
	if una != f.una || in != f.in || f.movedAt == 0 {
		f.una, f.in, f.movedAt, f.stallReport = una, in, now, false
		return
	}
	w, _ := c.Handler().(Waiter)
	if !c.Busy() && (w == nil || !w.Waiting()) {
		// Idle is not stalled: the clock starts, and a new episode
		// with it, at the next wait.
		f.movedAt, f.stallReport = now, false
		return
	}
	after := p.cfg.ConnStallAfter
	if after <= 0 {
		after = defaultConnStallAfter
	}
	if f.stallReport || now-f.movedAt < tcp.Time(after) {
		return
	}
	f.stallReport = true
	p.stats.ConnStalls++
	if p.cfg.Warn == nil {
		return
	}
	msg := fmt.Sprintf("%s queue %d: connection stalled for %v: tcp %s", p.cfg.Interface, p.cfg.Queue,
		now.Sub(f.movedAt).Round(time.Millisecond), c.Diag(now))
	if w != nil {
		msg += "; " + w.Diag()
	}
	p.cfg.Warn(msg)
}
