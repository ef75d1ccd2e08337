package daemon

import (
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/xdpnet"
)

// defaultStallAfter is how long a loop may hold work without progress
// before the watchdog reports it (Options.StallAfter).
const defaultStallAfter = 5 * time.Second

// maxStacks bounds the goroutine dump logged with a stall.
const maxStacks = 1 << 20

// watchdog finds loops that have work and make no progress: the xdp
// pollers (xdpnet.Poller.CheckStall) and the sessions' poll loops
// (loopBeat). One goroutine looks at all of them every tick, a fifth of
// the threshold and at most a second; a loop pays one atomic store per
// turn. A stall is logged once per episode, as an error with the loop's
// name and every goroutine's stack (so that a deadlock in the field can
// be diagnosed from the log), and counted; a loop that recovers and
// stalls again is a new episode. A deadlock often takes more than one
// loop: those found at the same tick share one record.
type watchdog struct {
	log     *slog.Logger
	after   time.Duration
	pollers []*xdpnet.Poller

	mu    sync.Mutex // guards loops; the loops take it at start and end only
	loops map[*loopBeat]struct{}

	stalls atomic.Uint64
	quit   chan struct{}
	done   chan struct{}
}

// startWatchdog starts the watchdog goroutine; stop ends it.
func startWatchdog(log *slog.Logger, after time.Duration, pollers []*xdpnet.Poller) *watchdog {
	if after <= 0 {
		after = defaultStallAfter
	}
	w := &watchdog{log: log, after: after, pollers: pollers, loops: map[*loopBeat]struct{}{},
		quit: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

// stop ends the goroutine and waits for it. Safe to call twice.
func (w *watchdog) stop() {
	select {
	case <-w.quit:
	default:
		close(w.quit)
	}
	<-w.done
}

func (w *watchdog) run() {
	defer close(w.done)
	every := min(max(w.after/5, time.Millisecond), time.Second)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-w.quit:
			return
		case now := <-tick.C:
			w.check(now)
		}
	}
}

// check looks at every loop once.
func (w *watchdog) check(now time.Time) {
	var stalled []string
	for _, p := range w.pollers {
		if p.CheckStall(now, w.after) {
			stalled = append(stalled, p.Name())
		}
	}
	w.mu.Lock()
	for b := range w.loops {
		if b.check(now, w.after) {
			stalled = append(stalled, b.name)
		}
	}
	w.mu.Unlock()
	if len(stalled) == 0 {
		return
	}
	total := w.stalls.Add(uint64(len(stalled)))
	w.log.Error("stall: a loop has work and has made no progress; the stacks of all goroutines follow",
		"loops", strings.Join(stalled, "; "), "after", w.after, "stalls", total, "stacks", allStacks())
}

// allStacks is runtime.Stack of every goroutine, at most maxStacks octets.
func allStacks() string {
	for n := 64 << 10; ; n *= 2 {
		buf := make([]byte, n)
		m := runtime.Stack(buf, true)
		if m < n {
			return string(buf[:m])
		}
		if n >= maxStacks {
			return string(buf[:m]) + "\n... (truncated)"
		}
	}
}

// watch registers a loop under a name for its log records; the loop
// reports with the loopBeat and calls unwatch when it ends. Nil-safe.
func (w *watchdog) watch(name string) *loopBeat {
	b := &loopBeat{name: name}
	if w == nil {
		return b
	}
	w.mu.Lock()
	w.loops[b] = struct{}{}
	w.mu.Unlock()
	return b
}

func (w *watchdog) unwatch(b *loopBeat) {
	if w == nil {
		return
	}
	w.mu.Lock()
	delete(w.loops, b)
	w.mu.Unlock()
}

// loopBeat is a watched loop's heartbeat. The loop calls busy as it starts
// a round of work and idle before it sleeps with nothing to do: one atomic
// store each, no lock, no clock. The watchdog's check does the rest.
type loopBeat struct {
	name string
	n    uint64        // the loop's: rounds started, times two
	beat atomic.Uint64 // n, with the low bit set while the loop sleeps idle

	// The watchdog's, under its mu.
	seen    uint64
	since   time.Time // the beat last moved or the loop was last idle
	stalled bool      // this episode was reported and has not ended
}

func (b *loopBeat) busy() {
	b.n += 2
	b.beat.Store(b.n)
}

func (b *loopBeat) idle() { b.beat.Store(b.n | 1) }

// check reports, once per episode, a loop that has been busy without
// starting a new round for at least after.
func (b *loopBeat) check(now time.Time, after time.Duration) bool {
	beat := b.beat.Load()
	if beat != b.seen || beat&1 != 0 || b.since.IsZero() {
		b.seen, b.since, b.stalled = beat, now, false
		return false
	}
	if b.stalled || now.Sub(b.since) < after {
		return false
	}
	b.stalled = true
	return true
}

// Stalls is the number of stall episodes the watchdog has seen, over the
// xdp pollers and the sessions' poll loops.
func (s *Server) Stalls() uint64 { return s.watch.stalls.Load() }

// Dump logs the state of every QP of the device at warn level, one line
// each (rnic.Device.Dump), with the sessions' and pollers' counters: what
// softrnicd does on SIGUSR1, for a connection that stopped.
func (s *Server) Dump() {
	lines := s.dev.Dump()
	s.log.Warn("state dump", "qps", len(lines), "goroutines", runtime.NumGoroutine())
	for _, l := range lines {
		s.log.Warn("state dump", "qp", l)
	}
	for _, p := range s.watch.pollers {
		st := p.Stats()
		s.log.Warn("state dump", "poller", p.Name(), "flows", st.Flows, "conn_stalls", st.ConnStalls, "stalls", st.Stalls,
			"turns", st.Turns, "sleeps", st.Sleeps)
	}
}
