package xdpnet

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/internal/impair"
	"github.com/softrnic/softrnic/tcp"
)

const (
	// maxSleep bounds one sleep, so that sweeps and neighbour refreshes
	// happen without a timer; waitCompletion bounds it while TX frames
	// are all in flight (their completions do not wake poll).
	maxSleep       = time.Second
	waitCompletion = 200 * time.Microsecond
	sweepInterval  = 100 * time.Millisecond

	// defaultSpin is the longest spin after work. The loop starts at
	// spinMin and grows towards it only under load (see Run): measured on
	// two cores, two daemons and two perftest-style processes, a fixed
	// 50 µs spin made an 8-byte RDMA Write round trip 173 µs (median)
	// against 94 µs with 1 µs, while a fixed 2 µs spin cut a 64 KiB Write
	// stream to a third. Since the poller takes posts and forwards
	// completions itself, a 10 µs minimum catches an application's next
	// post or Read response without a sleep: 8-byte Read round trip
	// 28-30 µs against 68-95 µs with 2 µs, bandwidth unchanged; 25 µs
	// was worse again.
	defaultSpin = 50 * time.Microsecond
	spinMin     = 10 * time.Microsecond
	// yieldHog and the backoffs: see yield.
	yieldHog        = 200 * time.Microsecond
	yieldBackoffMin = 10 * time.Millisecond
	yieldBackoffMax = 2 * time.Second
	quickWake       = 20 * time.Microsecond
)

// Run is the loop. It returns when ctx is done (nil) or the datapath
// fails. It locks its goroutine to an OS thread in the Poller's network
// namespace and leaves that thread locked, so that the thread ends with
// it (never the process's main thread, which Go cannot end: see
// offMainThread). Run may be called once.
func (p *Poller) Run(ctx context.Context) error {
	return offMainThread(func() error { return p.run(ctx) })
}

// offMainThread runs f, which locks its goroutine to a thread it changes
// and never unlocks, on a thread other than the process's main thread: a
// locked goroutine that ends on the main thread leaves it parked, still in
// the namespace (and with the affinity) f gave it, for the life of the
// process.
func offMainThread(f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if unix.Gettid() != unix.Getpid() {
		return f() // f's own lock keeps the thread
	}
	// Holding the main thread here, the new goroutine cannot run on it.
	errc := make(chan error, 1)
	go func() { errc <- f() }()
	return <-errc
}

func (p *Poller) run(ctx context.Context) error {
	p.mu.Lock()
	if p.closed.Load() || p.running {
		p.mu.Unlock()
		return fmt.Errorf("xdpnet: run: %w", ErrClosed)
	}
	p.running = true
	p.mu.Unlock()
	defer close(p.stopped)
	defer p.quitOnce.Do(func() { close(p.quit) })
	runtime.LockOSThread() // never unlocked: the thread may have changed namespace
	if err := unix.Setns(p.nsfd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("xdpnet: run: enter network namespace: %w", err)
	}
	if p.cfg.Pin {
		var set unix.CPUSet
		set.Set(p.cfg.CPU)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return fmt.Errorf("xdpnet: run: pin to CPU %d: %w", p.cfg.CPU, err)
		}
	}
	stop := context.AfterFunc(ctx, p.requestStop)
	defer stop()
	if p.cfg.Group == nil {
		p.start = time.Now()
	}
	lastWork := p.now()
	// The spin adapts between spinMin and Config.Spin: a sleep that ends
	// soon (work arrives within quickWake) means the loop is under load,
	// and the next spin doubles; a longer one halves it. Under a stream
	// the loop stops paying for sleeping and waking on every ACK; with
	// sparse work it gives the CPU back at once.
	maxSpin := tcp.Time(p.cfg.Spin)
	minSpin := min(tcp.Time(spinMin), maxSpin)
	spin := minSpin
	var y yielding
	p.looping.Store(true)
	defer p.looping.Store(false)
	for {
		if p.stopReq.Load() {
			p.shutdown()
			return nil
		}
		work, err := p.turn()
		if err != nil {
			p.shutdown()
			return err
		}
		now := p.now()
		if work {
			lastWork = now
			continue
		}
		if now-lastWork < spin {
			if now >= y.again {
				p.yield(now, &y)
			}
			continue
		}
		slept, err := p.sleep(now)
		if err != nil {
			p.shutdown()
			return err
		}
		lastWork = p.now()
		if slept {
			p.stats.Slept += time.Duration(lastWork - now)
		}
		if lastWork-now < tcp.Time(quickWake) {
			spin = min(spin*2, maxSpin)
		} else {
			spin = max(spin/2, minSpin)
		}
	}
}

// now is the engine's clock: time since Run started, plus a second so that
// it is never the zero Time.
func (p *Poller) now() tcp.Time { return tcp.Time(time.Since(p.start)) + tcp.Time(time.Second) }

// turn is one round of the loop; it reports whether it found work.
func (p *Poller) turn() (bool, error) {
	p.stats.Turns++
	p.beat.Store(p.stats.Turns)
	work := false
	// All the calls queued, up to the channel's capacity: callers that
	// queue many at once (a device destroying its QPs) each wait for
	// a turn, and a turn's own work is not cheap.
	for range cap(p.calls) {
		select {
		case c := <-p.calls:
			p.callsQueued.Add(-1)
			c.fn(p.stack, p.now())
			// Do callers may read Stats next: publish first.
			p.publishStats()
			close(c.done)
			work = true
			continue
		default:
		}
		break
	}
	// Sources first: a work request posted there kicks its connection
	// through Async, served in this same turn.
	if len(p.sources) > 0 && p.pollSources() {
		work = true
	}
	if p.runAsync() {
		work = true
	}
	if p.receive() {
		work = true
	}
	now := p.now()
	if len(p.in) > 0 && p.receiveHandoffs(now) {
		work = true
	}
	if p.rxStage != nil && p.receiveImpaired(now) {
		work = true
	}
	p.stack.Advance(now)
	sent, err := p.transmit(now)
	if err != nil {
		return work, err
	}
	if sent {
		work = true
	}
	if now-p.lastSweep >= tcp.Time(sweepInterval) {
		p.lastSweep = now
		p.stats.NetlinkEvents += uint64(p.neigh.follow())
		p.sweep(now)
		p.checkOffloads()
		p.publishStats()
	}
	return work, nil
}

// sleep waits in ppoll on the socket and the eventfds until a frame, a
// call, a doorbell or the next timer; slept is false when work came first
// and it did not wait. Run, which reads the clock around it, counts
// Stats.Slept.
func (p *Poller) sleep(now tcp.Time) (slept bool, err error) {
	d := maxSleep
	if t, ok := p.stack.NextTimer(); ok {
		d = min(d, max(time.Duration(t-now), 0))
	}
	if p.more || p.inFlight > 0 {
		d = min(d, waitCompletion)
	}
	for _, st := range []*impair.Stage{p.rxStage, p.txStage} {
		if st == nil {
			continue
		}
		if t, ok := st.Next(); ok {
			d = min(d, max(t-time.Duration(now), 0))
		}
	}
	if len(p.calls) > 0 || d == 0 {
		return false, nil
	}
	// Do and Async callers and other pollers handing frames over look
	// at sleeping after queueing: either they see it and wake us, or we
	// see their work here. woken goes down first, so that this sleep
	// gets its own wakeup.
	p.woken.Store(false)
	p.sleeping.Store(true)
	defer p.sleeping.Store(false)
	if len(p.sources) > 0 {
		defer p.sourcesAwake()
		if p.sourcesSleeping() {
			return false, nil
		}
	}
	if p.callsQueued.Load() > 0 || p.asyncPending.Load() > 0 || p.handedWaiting() {
		return false, nil
	}
	p.stats.Sleeps++
	ts := unix.NsecToTimespec(int64(d))
	fds := [3]unix.PollFd{
		{Fd: int32(p.sock.FD()), Events: unix.POLLIN},
		{Fd: int32(p.eventfd), Events: unix.POLLIN},
		{Fd: int32(p.doorbell), Events: unix.POLLIN},
	}
	_, err = unix.Ppoll(fds[:], &ts, nil)
	if err != nil && !errors.Is(err, unix.EINTR) {
		return true, fmt.Errorf("xdpnet: ppoll: %w", err)
	}
	if fds[0].Revents&(unix.POLLERR|unix.POLLNVAL) != 0 {
		return true, fmt.Errorf("xdpnet: ppoll: socket revents %#x", fds[0].Revents)
	}
	var b [8]byte
	if fds[1].Revents&unix.POLLIN != 0 {
		p.stats.Wakeups++
		_, _ = unix.Read(p.eventfd, b[:])
	}
	if fds[2].Revents&unix.POLLIN != 0 {
		p.stats.Doorbells++
		_, _ = unix.Read(p.doorbell, b[:])
	}
	return true, nil
}

// yield lets a thread waiting for this CPU run during a spin: the
// application whose next post the spin hopes to catch may need the CPU to
// make it (sched_yield returns at once when nothing waits). A thread that
// does not yield back keeps the CPU for a scheduler slice, milliseconds
// with work waiting here: after such a yield the loop spins without
// yielding for a while, twice as long after each such yield in a row (a
// busy-polling application), from yieldBackoffMin up to yieldBackoffMax.
// y is the loop's state.
func (p *Poller) yield(now tcp.Time, y *yielding) {
	_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	if y.yielded(now, p.now()) {
		p.stats.YieldBackoffs++
	}
}

// yielding is Run's state for yield.
type yielding struct {
	again   tcp.Time // no yield before
	backoff tcp.Time // the last backoff, 0 after a yield that came back soon
}

// yielded records a yield from start to end and reports whether it backs
// off.
func (y *yielding) yielded(start, end tcp.Time) bool {
	if end-start <= tcp.Time(yieldHog) {
		y.backoff = 0
		return false
	}
	y.backoff = min(max(2*y.backoff, tcp.Time(yieldBackoffMin)), tcp.Time(yieldBackoffMax))
	y.again = end + y.backoff
	return true
}

// requestStop makes Run return at its next turn.
func (p *Poller) requestStop() {
	p.stopReq.Store(true)
	p.wake()
}

// shutdown runs on the loop as Run ends: listeners closed, flows and
// listen ports removed from the steering program, reservations released.
// Connections still open are abandoned: their segments then reach the
// kernel, which resets them.
func (p *Poller) shutdown() {
	for port := range p.listens {
		p.closeListener(port)
	}
	for len(p.flowList) > 0 {
		p.removeFlow(p.flowList[len(p.flowList)-1])
	}
	p.publishStats()
}
