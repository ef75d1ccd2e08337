package rnic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/mpa"
	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/xdpnet"
)

// kernelConn is a QP's connection on the kernel datapath: a kernel TCP
// socket under the QP's mpaConn, run as Linux siw runs its QPs. Its
// receive goroutine reads the socket, hands what arrived to the MPA layer
// and the QP engine (placement and completions happen there), and then
// sends what the QP owes (Read Responses, a Terminate). A post sends from
// the posting goroutine: whoever finds the transmit path idle takes it,
// fills a buffer with FPDUs and writes it to the socket without blocking;
// only what the socket would not take goes to a transmit goroutine, made
// for the purpose, that waits for room and carries on until nothing is
// left.
//
// The receive goroutine exists while the connection is in use. Once MPA
// startup is over, a read that has waited kernelIdleAfter for anything to
// arrive hands the socket to the idle set (idleSet: one epoll set for
// every idle connection of the process) and the goroutine ends: an idle QP
// holds no goroutine stack (issue 16). The idle set starts a receive
// goroutine again when the socket becomes readable (data, the peer's FIN,
// a reset), and closing the socket (closeSocket) does, so that every end
// of the connection still goes through the receive goroutine's ended.
//
// Locks: mu guards the MPA layer and the transmit state; a connection with
// a QP takes q.mu inside it for every call into the MPA layer, so the
// order is mu, then q.mu, and nothing holding q.mu takes mu. No lock is
// held across a system call that can block, and events the QP posts under
// q.mu are delivered after both are released. The idle set's lock is taken
// inside mu, and mu never inside it.
type kernelConn struct {
	nc *net.TCPConn
	rc syscall.RawConn

	mu  sync.Mutex
	llp *mpaConn
	// q is the QP; nil while a passive connection waits for its
	// consumer, and after a failed active open let go of it.
	q *QP
	// txBusy: a goroutine holds the transmit path; txAgain: there was
	// a Kick meanwhile, so it fills once more before letting go.
	txBusy, txAgain bool
	// finWanted: the MPA layer closed (Close), and the FIN follows what
	// it gave; finSent: it went out. rxDone: the receive goroutine
	// ended. closed: the socket is closed (after both, or at Abort).
	// released: the QP let go of the connection without a reset (see
	// release); the socket is closed as soon as our FIN is out.
	finWanted, finSent, rxDone, closed, released bool
	// err is why the stream ended (Err).
	err error
	// result receives the outcome of an active open, once.
	result chan error
	// req is the passive connection's request while it waits.
	req *ConnRequest
	// loops counts the receive and transmit goroutines.
	loops sync.WaitGroup
	mss   int
	// fionread asks the socket how many octets wait into waiting, for
	// readable; made once, as a call per look would allocate.
	fionread func(fd uintptr)
	waiting  int
	// pollMisses counts the polling runs in a row that found nothing
	// (poll); the receive goroutine's.
	pollMisses uint
	// idleOK: MPA startup is over and its read deadline gone, so a read
	// deadline is the idle timer's (see read). idleAt is the deadline
	// set last; the receive goroutine's. idleID names the connection in
	// the idle set while it is there (idle's lock).
	idleOK atomic.Bool
	idleAt time.Time
	idleID uint32
	// writeState is writeBusy while a goroutine writes octets Fill gave
	// and has not yet told the MPA layer the socket took them (wrote),
	// writeEndHeld if the receive side ended meanwhile: that end waits,
	// in heldErr, for the report. A peer that disconnects the moment
	// our last Send reaches it sends a FIN the receive goroutine may
	// read before the writer reports; handled first, it would flush a
	// Send the peer holds. The writer, which takes it over, runs the
	// held end. Atomic: a write's callback must not take mu (a Close
	// under mu waits for it).
	writeState atomic.Uint32
	heldErr    error
}

// writeState values.
const (
	writeIdle = iota
	writeBusy
	writeEndHeld
)

// kernelIdleAfter is how long a receive goroutine waits for something to
// read before it hands its socket to the idle set. Going there and back
// costs two epoll_ctl calls and a goroutine start, a few microseconds,
// against the 2 to 8 KiB of stack it saves; a second keeps that cost to
// connections quieter than one message a second.
const kernelIdleAfter = time.Second

// ioBufs are the connections' receive and transmit buffers: a connection
// holds one only while it reads or has something to write.
var ioBufs = sync.Pool{New: func() any { b := make([]byte, ioBuf); return &b }}

func newKernelConn(nc *net.TCPConn, llp *mpaConn) (*kernelConn, error) {
	_ = nc.SetNoDelay(true)
	rc, err := nc.SyscallConn()
	if err != nil {
		return nil, err
	}
	mss, err := effectiveMSS(rc)
	if err != nil {
		return nil, err
	}
	llp.WroteLater = true // a request completes once the socket took it
	kc := &kernelConn{nc: nc, rc: rc, llp: llp, mss: mss}
	kc.fionread = func(fd uintptr) { kc.waiting, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }
	return kc, nil
}

func effectiveMSS(rc syscall.RawConn) (int, error) {
	var mss int
	var serr error
	if err := rc.Control(func(fd uintptr) { mss, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG) }); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, fmt.Errorf("TCP_MAXSEG: %w", serr)
	}
	return min(mss, mpa.MaxULPDU), nil
}

// The stream methods run with kc.mu held.

func (kc *kernelConn) Kick()      { kc.txAgain = true }
func (kc *kernelConn) Close()     { kc.finWanted = true }
func (kc *kernelConn) MSS() int   { return kc.mss }
func (kc *kernelConn) Err() error { return kc.err }

// Abort resets the connection: SO_LINGER 0 makes close send RST, and a
// goroutine blocked on the socket returns.
func (kc *kernelConn) Abort() {
	if kc.closed {
		return
	}
	kc.closed = true
	if kc.err == nil {
		kc.err = tcp.ErrAborted
	}
	_ = kc.nc.SetLinger(0)
	kc.closeSocket()
}

// closeSocket closes the socket; a receive goroutine that parked (see
// park) runs again to see it closed and end the connection. kc.mu held.
func (kc *kernelConn) closeSocket() {
	kc.closed = true
	parked := idle.remove(kc)
	if parked {
		kc.unpark()
	}
	_ = kc.nc.Close()
	if parked {
		go kc.receive()
	}
}

var _ stream = (*kernelConn)(nil)

func (kc *kernelConn) mpa() *mpaConn { return kc.llp }

func (kc *kernelConn) addrs() (string, string) {
	return kc.nc.LocalAddr().String(), kc.nc.RemoteAddr().String()
}

// lock takes the connection's locks: mu, then the QP's.
func (kc *kernelConn) lock() *QP {
	kc.mu.Lock()
	q := kc.q
	if q != nil {
		q.mu.Lock()
	}
	return q
}

// unlock releases them; the QP's last, so that its events are delivered
// with no lock held.
func (kc *kernelConn) unlock(q *QP) {
	kc.mu.Unlock()
	if q != nil {
		q.unlock()
	}
}

// start runs the receive goroutine.
func (kc *kernelConn) start() {
	kc.loops.Add(1)
	go kc.receive()
}

// receive is the receive goroutine: started with the connection (loops
// counts it from then until the connection's end) and again each time the
// connection leaves the idle set.
func (kc *kernelConn) receive() {
	for {
		bp, n, err := kc.read()
		if n > 0 {
			buf := *bp
			kc.mu.Lock()
			q := kc.q
			kc.mu.Unlock()
			if q != nil && q.attr.BeforeReceive != nil {
				q.attr.BeforeReceive()
			}
			q = kc.lock()
			kc.llp.Receive(kc, buf[:n])
			ready := kc.llp.Ready()
			kc.unlock(q)
			kc.report()
			kc.kick()
			if ready && q != nil && q.attr.Poll != nil {
				kc.poll(q)
			}
		}
		if bp != nil {
			ioBufs.Put(bp)
		}
		if err != nil && kc.idleOK.Load() && isTimeout(err) {
			// Nothing arrived for kernelIdleAfter (or the deadline
			// passed while octets were being handled: then they
			// are read at once).
			if !kc.readable() && kc.park() {
				return // the idle set runs receive again
			}
			kc.idleAt = time.Time{}
			_ = kc.nc.SetReadDeadline(time.Time{})
			continue
		}
		if err != nil {
			if !kc.ended(err) {
				kc.loops.Done()
			} // else the writer ends the connection, and counts this goroutine out
			return
		}
	}
}

// park puts the socket in the idle set, which runs receive again when it
// is readable; false if the socket is closed or the set refused it (the
// caller goes on reading).
func (kc *kernelConn) park() bool {
	kc.mu.Lock()
	defer kc.mu.Unlock()
	if kc.closed {
		return false
	}
	if err := idle.add(kc); err != nil {
		kc.idleOK.Store(false) // a goroutine per connection, as before
		return false
	}
	return true
}

// unpark takes the socket out of the epoll set and its expired idle
// deadline off, for a receive goroutine to start; the caller took the
// connection out of the idle set.
func (kc *kernelConn) unpark() {
	_ = kc.rc.Control(func(fd uintptr) { idle.forget(int(fd)) })
	kc.idleAt = time.Time{}
	_ = kc.nc.SetReadDeadline(time.Time{})
}

// read waits for the socket to be readable and reads what it has into a
// pooled buffer taken only then: an idle connection holds none. After MPA
// startup, the wait is bounded by the idle deadline (kernelIdleAfter),
// moved on when less than half of it is left rather than at every wait.
func (kc *kernelConn) read() (bp *[]byte, n int, err error) {
	var rerr error
	err = kc.rc.Read(func(fd uintptr) bool {
		if bp == nil {
			bp = ioBufs.Get().(*[]byte)
		}
		n, rerr = unix.Read(int(fd), *bp)
		if rerr == unix.EAGAIN || rerr == unix.EINTR {
			ioBufs.Put(bp) // not held while waiting
			bp = nil
			if kc.idleOK.Load() {
				if now := time.Now(); kc.idleAt.Sub(now) < kernelIdleAfter/2 {
					kc.idleAt = now.Add(kernelIdleAfter)
					_ = kc.nc.SetReadDeadline(kc.idleAt)
				}
			}
			return false
		}
		return true
	})
	switch {
	case err != nil:
	case rerr != nil:
		err = os.NewSyscallError("read", rerr)
	case n == 0:
		err = io.EOF
	}
	if n < 0 {
		n = 0
	}
	if n == 0 && bp != nil {
		ioBufs.Put(bp)
		bp = nil
	}
	return bp, n, err
}

// poll runs the QP's Poll hook while nothing more has arrived, for at most
// PollFor, yielding the processor between looks (see QPAttr.Poll), until
// it finds work and then for afterWork after the last it found.
//
// It adapts: every run that finds nothing halves the next one's time, down
// to a single look, and a run that finds work restores PollFor. A peer
// that only streams to us (nobody answers) costs one look per read, not
// PollFor of a processor two applications may be sharing.
func (kc *kernelConn) poll(q *QP) {
	d := q.attr.PollFor
	if d == 0 {
		d = DefaultPollFor
	}
	d >>= kc.pollMisses
	found := q.attr.Poll()
	if !found && d >= minPoll {
		start := time.Now()
		deadline := start.Add(d)
		// The first microseconds look without yielding: an answer
		// that comes at once is taken at once, not after a system
		// call's worth of scheduler; after them each look yields, so
		// that an application sharing the core gets it.
		hot := start.Add(min(d, pollHot))
		for !found {
			now := time.Now()
			if now.After(deadline) {
				break
			}
			if now.After(hot) {
				if kc.readable() {
					break
				}
				_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			}
			found = q.attr.Poll()
		}
	}
	// Work found, the run looks on for a while for more: an application
	// that answers what arrived posts more than once (it gives the
	// receive back, then Sends its answer), and a run that ended at the
	// first post left the Send to a doorbell and a wake-up. Measured
	// between two namespaces (kernel datapath, make bench's pinning):
	// softrnic-perf send_lat 1 B 14-17 µs before, 12; write_lat 12.3,
	// 9.6-10.5; an sdp 1-octet round trip 21-53, 14.4-15.4; perftest's
	// ib_write_lat through the libraries 12.9 (typical, half the round
	// trip), 6.1. Streams were unchanged (sdp, write_bw, send_bw 64 KiB).
	if found {
		last := time.Now()
		deadline := last.Add(d)
		for now := last; now.Before(deadline) && now.Sub(last) < afterWork; now = time.Now() {
			if kc.readable() {
				break
			}
			_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			if q.attr.Poll() {
				last = now
			}
		}
	}
	switch {
	case found:
		kc.pollMisses = 0
	case kc.pollMisses < 16:
		kc.pollMisses++
	}
	if q.attr.PollDone != nil {
		q.attr.PollDone()
	}
}

// minPoll is the shortest polling run worth a look at the socket and a
// yield; below it a run is one look at the consumer's work. pollHot is
// how long a run looks before it starts yielding; afterWork, how long it
// looks on after the last work it found.
const (
	minPoll   = 2 * time.Microsecond
	pollHot   = 2 * time.Microsecond
	afterWork = 10 * time.Microsecond
)

// readable reports whether the socket has octets waiting.
func (kc *kernelConn) readable() bool {
	kc.waiting = 0
	if err := kc.rc.Control(kc.fionread); err != nil {
		return true // closed: let the read say so
	}
	return kc.waiting > 0
}

// ended handles the end of the receive side: the peer's FIN, a reset, a
// timeout during MPA startup, or the socket closed by Abort. While a
// writer has octets to report (writeState) the end is held for it to
// run: held is true then.
func (kc *kernelConn) ended(err error) (held bool) {
	q := kc.lock()
	if kc.writeState.CompareAndSwap(writeBusy, writeEndHeld) {
		kc.heldErr = err
		kc.unlock(q)
		return true
	}
	kc.endLocked(q, err)
	return false
}

// writeDone ends a write's report (both locks held): a receive end held
// meanwhile runs now, and the locks are released either way.
func (kc *kernelConn) writeDone(q *QP) {
	if kc.writeState.Swap(writeIdle) != writeEndHeld {
		kc.unlock(q)
		return
	}
	err := kc.heldErr
	kc.heldErr = nil
	kc.endLocked(q, err)
	kc.loops.Done() // for the receive goroutine, which left it to us
}

// endLocked is ended's work, from its locks held; it releases them.
func (kc *kernelConn) endLocked(q *QP, err error) {
	switch {
	case errors.Is(err, io.EOF):
		kc.llp.Event(kc, tcp.EventPeerClosed)
	case !kc.llp.Ready() && kc.llp.Err == nil:
		// MPA startup cut short: the deadline, or a reset.
		if isTimeout(err) {
			kc.llp.Err = fmt.Errorf("mpa startup: %w", ErrTimedOut)
		} else {
			kc.llp.Err = fmt.Errorf("%w: %v", ddp.LLPConnectionLost, err)
		}
		kc.Abort()
	default:
		if kc.err == nil {
			kc.err = err
		}
		kc.llp.Event(kc, tcp.EventClosed)
		kc.Abort()
	}
	kc.rxDone = true
	closeNow := kc.finSent || q == nil && kc.llp.Err != nil
	if closeNow && !kc.closed {
		kc.closeSocket()
	}
	if kc.req != nil {
		// The peer left while the consumer decided: the answer fails.
		kc.req.gone.Store(true)
	}
	kc.unlock(q)
	kc.report()
	kc.kick()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// report delivers an active open's outcome once MPA startup succeeded or
// failed; no lock held.
func (kc *kernelConn) report() {
	if kc.result == nil {
		return
	}
	q := kc.lock()
	var err error
	switch {
	case kc.llp.Ready():
	case kc.llp.Rejected != nil:
		err = &RejectedError{PrivateData: kc.llp.Rejected}
	case kc.llp.Err != nil:
		err = kc.llp.Err
	case kc.rxDone:
		err = fmt.Errorf("%w: connection closed during MPA startup", ddp.LLPConnectionLost)
	default:
		kc.unlock(q)
		return
	}
	kc.unlock(q)
	select {
	case kc.result <- err:
	default:
	}
}

// kick sends what the QP has to send, from the calling goroutine while the
// socket takes it; no lock held. If another goroutine is sending, it fills
// once more before it lets go; if that one waits for room on a peer that
// reads nothing, an abort resets the connection now.
func (kc *kernelConn) kick() {
	q := kc.lock()
	if kc.txBusy {
		kc.txAgain = true
		if q != nil && q.abort && q.conn == llpConn(kc) {
			kc.Abort()
		}
		kc.unlock(q)
		return
	}
	kc.txBusy = true
	kc.unlock(q)
	bp := ioBufs.Get().(*[]byte)
	kc.transmit(bp, nil)
}

// transmit holds the transmit path: it writes rest (octets a write left),
// then fills and writes until the MPA layer has nothing more, and lets go.
// In the posting goroutine (not yet handed off) writes do not block: what
// the socket does not take whole goes, with the path, to a transmit
// goroutine.
func (kc *kernelConn) transmit(bp *[]byte, rest []byte) {
	blocking := rest != nil
	for {
		if len(rest) > 0 {
			if err := kc.writeAll(rest); err != nil {
				kc.writeFailed(err)
				break
			}
			rest = nil
		}
		q := kc.lock()
		kc.txAgain = false
		n := 0
		held := false
		switch {
		case q != nil && q.abort && q.conn == llpConn(kc):
			// An abortive disconnect, or no FIN from the peer.
			kc.Abort()
		case q != nil && q.batch > 0:
			// A batch of posts is open: what it posted goes at its
			// EndPosts, which this hands the path to.
			q.batchKick = true
			held = true
		case !kc.closed && !kc.finSent:
			n = kc.llp.Fill(kc, *bp)
			if n > 0 && !blocking {
				kc.writeState.Store(writeBusy) // written at once below
			}
		}
		kc.unlock(q)
		if hook := transmitHeldHook.Load(); held && hook != nil {
			(*hook)(kc)
		}
		if n == 0 {
			kc.mu.Lock()
			// A kick since this round began is filled for, held or
			// not: the batch that held this round may have ended
			// meanwhile, its EndPosts finding the path busy and
			// leaving only txAgain (a post then waited in the SQ,
			// unsent, until the connection ended). If the batch is
			// still open the next round hands it the path again.
			if kc.txAgain {
				kc.mu.Unlock()
				continue
			}
			kc.txBusy = false
			fin := !held && kc.finWanted && !kc.finSent && !kc.closed
			if fin {
				kc.finSent = true
			}
			kc.mu.Unlock()
			if fin {
				kc.sendFIN()
			}
			break
		}
		if blocking {
			rest = (*bp)[:n]
			continue
		}
		w, err := kc.writeNow((*bp)[:n])
		if hook := wroteHook.Load(); hook != nil {
			(*hook)(kc)
		}
		if err != nil {
			kc.writeFailed(err)
			break
		}
		if w < n {
			// The socket is full: a transmit goroutine waits for room.
			// It is counted before the report, which may run a held
			// end and count the receive goroutine out: loops must not
			// reach zero under a release waiting on it and then rise.
			kc.loops.Add(1)
			kc.wrote(w)
			go func() {
				defer kc.loops.Done()
				kc.transmit(bp, (*bp)[w:n])
			}()
			return
		}
		kc.wrote(w)
	}
	ioBufs.Put(bp)
}

// transmitHeldHook, when set (tests), runs in transmit after a round that
// found a batch of posts open has released the locks. Atomic: connections
// of earlier tests may still be transmitting when a test sets it.
var transmitHeldHook atomic.Pointer[func(*kernelConn)]

// wroteHook, when set (tests), runs in transmit between a write and its
// report (wrote).
var wroteHook atomic.Pointer[func(*kernelConn)]

// wrote tells the MPA layer the socket took n octets: the requests they
// carry complete now, not before (a consumer that sees its last Send
// complete and exits must not reset it out of our buffer). It ends the
// write (writeState).
func (kc *kernelConn) wrote(n int) {
	q := kc.lock()
	if n > 0 {
		kc.llp.Wrote(kc, n)
	}
	kc.writeDone(q)
}

// writeAll writes b whole, waiting for room, and reports each part the
// socket takes as it goes. Only the system call itself is a write in
// writeState's sense: while it waits for room, an end of the receive side
// is handled at once (its writes to the socket would wait for a peer that
// may never read again).
func (kc *kernelConn) writeAll(b []byte) error {
	for len(b) > 0 {
		var n int
		var werr error
		err := kc.rc.Write(func(fd uintptr) bool {
			kc.writeState.Store(writeBusy)
			n, werr = unix.SendmsgN(int(fd), b, nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
			if werr != unix.EAGAIN {
				return true
			}
			n, werr = 0, nil
			// Wait for room, unless an end came during the call:
			// then report (nothing) so that it runs.
			return !kc.writeState.CompareAndSwap(writeBusy, writeIdle)
		})
		if err == nil {
			err = werr
		}
		if err != nil {
			return err
		}
		kc.wrote(n)
		b = b[n:]
	}
	return nil
}

// writeNow writes what the socket takes at once.
func (kc *kernelConn) writeNow(b []byte) (int, error) {
	var n int
	var werr error
	err := kc.rc.Write(func(fd uintptr) bool {
		n, werr = unix.SendmsgN(int(fd), b, nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		return true
	})
	if err != nil {
		return 0, err
	}
	if werr == unix.EAGAIN {
		return 0, nil
	}
	if werr != nil {
		return 0, werr
	}
	return n, nil
}

// writeFailed ends the connection whose socket refused a write (reset,
// or closed by Abort), and lets go of the transmit path.
func (kc *kernelConn) writeFailed(err error) {
	q := kc.lock()
	if kc.err == nil {
		kc.err = err
	}
	if kc.llp.Ready() && q != nil {
		q.eng.LLPClosed(fmt.Errorf("%w: %w", ddp.LLPConnectionLost, err))
	}
	kc.Abort()
	kc.txBusy = false
	kc.writeDone(q)
}

// sendFIN half-closes the socket once everything is written; a connection
// whose receive side already ended, or with no QP (a refused or failed
// startup), is closed outright.
func (kc *kernelConn) sendFIN() {
	_ = kc.nc.CloseWrite()
	q := kc.lock()
	if (kc.rxDone || q == nil || kc.released) && !kc.closed {
		kc.closeSocket()
	}
	kc.unlock(q)
}

// idleNow ends MPA startup's read deadline: from now on the deadline is
// the idle timer's, and the read waiting now (the startup deadline's, or
// none) gets it too. kc.mu held.
func (kc *kernelConn) idleNow() {
	kc.idleOK.Store(true)
	_ = kc.nc.SetReadDeadline(time.Now().Add(kernelIdleAfter))
}

// release without abort leaves the rest of the close to the kernel: the
// socket is closed, not reset, once our FIN is out (at once if it is, or
// where sendFIN sends it), so that the kernel's TCP sends what is left and
// waits for the peer's FIN on its own timers, as for a socket Linux siw
// releases (and, as there, octets the peer sends after that close are
// answered with a reset). Waiting here for the peer's FIN instead held the
// caller (the daemon, under its session's lock) for closeTimeout when the
// peer delayed it. Octets of ours still waiting for room in the socket
// (a peer that stopped reading, its FIN sent or not) would hold release
// for ever: after releaseWait they are given up, and the connection reset.
func (kc *kernelConn) release(abort bool) {
	kc.mu.Lock()
	if abort {
		kc.Abort()
	} else {
		kc.released = true
		if kc.finSent && !kc.closed {
			kc.closeSocket()
		}
	}
	kc.mu.Unlock()
	if !abort {
		t := time.AfterFunc(releaseWait, func() {
			kc.mu.Lock()
			kc.Abort()
			kc.mu.Unlock()
		})
		defer t.Stop()
	}
	kc.loops.Wait()
}

// releaseWait bounds how long release waits for the octets of a released
// connection to be written, and its FIN with them.
const releaseWait = 500 * time.Millisecond

// connectKernel is Connect on the kernel datapath: a TCP connection, then
// MPA startup on the connection's receive goroutine; ctx carries Connect's
// deadline.
func (q *QP) connectKernel(ctx context.Context, raddr string, cfg mpa.Config, d *net.Dialer) ([]byte, error) {
	if d == nil {
		d = &net.Dialer{}
	}
	nc, err := d.DialContext(ctx, "tcp", raddr)
	if err != nil {
		// The dialer times out at the context's deadline, which can be
		// a moment before the context itself says so.
		if ctx.Err() != nil || isTimeout(err) {
			return nil, fmt.Errorf("connect %s: %w", raddr, ErrTimedOut)
		}
		// Out of descriptors or local ports is this host's failure,
		// not the path's: it must not reach the consumer as
		// UNREACHABLE.
		if errors.Is(err, unix.EADDRNOTAVAIL) { // connect(2): no ephemeral port left
			err = xdpnet.PortsError(err)
		}
		if lim := resourceError(err); errors.Is(lim, ErrResources) {
			return nil, fmt.Errorf("connect %s: %w", raddr, lim)
		}
		if errors.Is(err, unix.ECONNREFUSED) {
			return nil, fmt.Errorf("connect %s: %w: %w: %v", raddr, ErrUnreachable, ErrRefused, err)
		}
		return nil, fmt.Errorf("connect %s: %w: %v", raddr, ErrUnreachable, err)
	}
	return q.startKernel(ctx, nc.(*net.TCPConn), raddr, cfg)
}

// startKernel runs MPA startup as the initiator on tc, connected to
// raddr, and gives the QP the connection; ctx carries the deadline.
func (q *QP) startKernel(ctx context.Context, tc *net.TCPConn, raddr string, cfg mpa.Config) ([]byte, error) {
	kc, err := newKernelConn(tc, newMPAConn(q.eng, cfg, true))
	if err != nil {
		tc.Close()
		return nil, fmt.Errorf("connect %s: %w", raddr, err)
	}
	kc.result = make(chan error, 1)
	deadline, _ := ctx.Deadline()
	_ = tc.SetReadDeadline(deadline)
	q.mu.Lock()
	if q.busyLocked() { // Connect looked before unlocking
		q.unlock()
		tc.Close()
		return nil, ErrState
	}
	q.attach(kc.llp)
	q.conn, kc.q = kc, q
	q.unlock()
	kc.start()
	q = kc.lock()
	kc.llp.Event(kc, tcp.EventEstablished) // the Request
	kc.unlock(q)
	kc.kick()
	select {
	case err = <-kc.result:
		switch {
		case err == nil:
		case errors.As(err, new(*RejectedError)):
		case errors.Is(err, ErrTimedOut):
			err = fmt.Errorf("connect %s: no MPA Reply: %w", raddr, ErrTimedOut)
		default:
			err = fmt.Errorf("connect %s: MPA Reply: %w", raddr, err)
		}
	case <-ctx.Done():
		// The deadline, or the consumer went away: the peer sees a
		// reset.
		err = fmt.Errorf("connect %s: no MPA Reply: %w", raddr, ErrTimedOut)
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("connect %s: %w", raddr, ctx.Err())
		}
		kc.mu.Lock()
		if kc.llp.Ready() {
			err = nil // it came up as the wait ended
		} else {
			// A Reply read before the abort must not start the QP
			// now that Connect fails.
			kc.Abort()
			q.mu.Lock()
			kc.llp.Detach()
			q.mu.Unlock()
		}
		kc.mu.Unlock()
	}
	if err == nil {
		kc.mu.Lock()
		if !kc.closed {
			kc.idleNow()
		}
		kc.mu.Unlock()
		time.AfterFunc(nudgeDelay, q.nudgeIfSilent)
		return clone(kc.llp.Params.PeerPrivateData), nil
	}
	// The connection goes on alone to send what it owes (a Terminate
	// and FIN after a failed negotiation) and closes.
	kc.mu.Lock()
	q.mu.Lock()
	kc.llp.Detach()
	kc.q = nil
	if q.conn == llpConn(kc) {
		q.conn = nil
	}
	q.mu.Unlock()
	kc.mu.Unlock()
	return nil, err
}

// listenKernel is Listen on the kernel datapath.
func (d *Device) listenKernel(addr string, opts ListenOptions) (*Listener, error) {
	la, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w: %v", addr, ErrInvalidParam, err)
	}
	ln, err := net.ListenTCP("tcp", la)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	l := &Listener{dev: d, ln: ln, opts: opts, reqs: make(chan *ConnRequest, opts.Backlog), done: make(chan struct{}),
		starting: map[*kernelConn]struct{}{}}
	l.loops.Add(1)
	go l.acceptLoop()
	return l, nil
}

func (l *Listener) acceptLoop() {
	defer l.loops.Done()
	for {
		nc, err := l.ln.AcceptTCP()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			l.acceptFailed(err)               // the operator hears of it
			time.Sleep(10 * time.Millisecond) // e.g. EMFILE: do not spin
			continue
		}
		kc, err := newKernelConn(nc, newMPAConn(nil, mpa.Config{}, false))
		if err != nil {
			nc.Close()
			continue
		}
		kc.llp.OnRequest = func(_ *mpaConn, f *mpa.Frame) { l.kernelRequest(kc, f) }
		// The Request must come within RequestTimeout.
		_ = nc.SetReadDeadline(time.Now().Add(l.opts.RequestTimeout))
		l.startMu.Lock()
		select {
		case <-l.done:
			l.startMu.Unlock()
			nc.Close()
			return
		default:
		}
		l.starting[kc] = struct{}{}
		l.startMu.Unlock()
		kc.start()
	}
}

// kernelRequest runs on a passive connection's receive goroutine, kc.mu
// held, with its MPA Request: it is queued for Accept.
func (l *Listener) kernelRequest(kc *kernelConn, f *mpa.Frame) {
	l.startMu.Lock()
	delete(l.starting, kc)
	l.startMu.Unlock()
	// The consumer's answer is timed by the request's timer; the
	// initiator may not speak before our Reply.
	_ = kc.nc.SetReadDeadline(time.Time{})
	cr := l.newRequest(kc, nil, f)
	select {
	case <-l.done:
	default:
		select {
		case l.reqs <- cr:
			return
		default: // backlog full
		}
	}
	cr.answer()
	kc.llp.Reject(nil)
}

// closeKernel stops a kernel-datapath listener: connections still in MPA
// startup have nobody to go to and are reset now.
func (l *Listener) closeKernel() {
	l.ln.Close()
	l.startMu.Lock()
	starting := l.starting
	l.starting = map[*kernelConn]struct{}{}
	l.startMu.Unlock()
	for kc := range starting {
		kc.mu.Lock()
		if kc.llp.Err == nil && !kc.llp.Ready() && kc.req == nil {
			kc.Abort()
		}
		kc.mu.Unlock()
	}
	for kc := range starting {
		kc.loops.Wait()
	}
}

// acceptKernel connects q to a passive connection of the kernel datapath:
// the MPA Reply goes out from here, and the receive goroutine, which held
// the initiator's first FPDUs in the socket until now, feeds q.
// Accept has taken q (ConnRequest.take).
func (cr *ConnRequest) acceptKernel(q *QP, private []byte) error {
	kc := cr.kc
	kc.mu.Lock()
	q.mu.Lock()
	q.attach(kc.llp)
	kc.q = q
	err := kc.llp.Accept(q.eng, q.mpaConfig(private))
	if err == nil && !kc.llp.Ready() {
		err = kc.llp.Err
	}
	if err != nil {
		kc.llp.Detach()
		kc.q = nil
		if cr.gone.Load() {
			err = fmt.Errorf("%w: the peer closed the connection", ddp.LLPConnectionLost)
		}
	} else {
		q.conn = kc
		kc.req = nil
		kc.idleNow()
	}
	kc.mu.Unlock()
	q.unlock()
	kc.kick()
	if err != nil {
		return fmt.Errorf("accept: %w", err)
	}
	return nil
}

// rejectKernel refuses a passive connection of the kernel datapath.
func (cr *ConnRequest) rejectKernel(private []byte) error {
	kc := cr.kc
	kc.mu.Lock()
	kc.llp.Reject(clone(private))
	kc.mu.Unlock()
	kc.kick()
	return nil
}

// idleSet holds the sockets of kernel connections whose receive goroutine
// parked: one epoll set for the process, and one goroutine, running while
// the set is not empty, that waits on it and runs a connection's receive
// goroutine again when its socket is readable. Each socket is in the epoll
// set once (EPOLLONESHOT), under the number of its entry in conns; number
// 0 is an eventfd that wakes the goroutine to end when the set empties.
type idleSet struct {
	once sync.Once
	err  error
	epfd int
	wake int
	// mu guards conns, next and running; taken inside a connection's
	// mu, never the other way.
	mu      sync.Mutex
	conns   map[uint32]*kernelConn
	next    uint32
	running bool
}

var idle idleSet

// open makes the epoll set and the eventfd, once.
func (w *idleSet) open() error {
	w.once.Do(func() {
		if w.epfd, w.err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); w.err != nil {
			w.err = os.NewSyscallError("epoll_create1", w.err)
			return
		}
		if w.wake, w.err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); w.err != nil {
			w.err = os.NewSyscallError("eventfd", w.err)
			return
		}
		ev := unix.EpollEvent{Events: unix.EPOLLIN}
		if err := unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, w.wake, &ev); err != nil {
			w.err = os.NewSyscallError("epoll_ctl", err)
			return
		}
		w.conns = map[uint32]*kernelConn{}
	})
	return w.err
}

// add puts kc's socket in the set; kc.mu held. A socket already readable
// is reported at once: nothing that arrived before is missed.
func (w *idleSet) add(kc *kernelConn) error {
	if err := w.open(); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		w.next++
		if w.next != 0 && w.conns[w.next] == nil {
			break
		}
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT, Fd: int32(w.next)}
	var cerr error
	if err := kc.rc.Control(func(fd uintptr) { cerr = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, int(fd), &ev) }); err != nil {
		return err
	}
	if cerr != nil {
		return os.NewSyscallError("epoll_ctl", cerr)
	}
	kc.idleID = w.next
	w.conns[w.next] = kc
	if !w.running {
		w.running = true
		go w.run()
	}
	return nil
}

// remove takes kc out of the set if it is there, and reports whether it
// was: the caller then runs its receive goroutine. kc.mu held.
func (w *idleSet) remove(kc *kernelConn) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if kc.idleID == 0 || w.conns[kc.idleID] != kc {
		return false
	}
	delete(w.conns, kc.idleID)
	kc.idleID = 0
	if len(w.conns) == 0 && w.running {
		var one [8]byte
		one[0] = 1
		_, _ = unix.Write(w.wake, one[:]) // the goroutine ends
	}
	return true
}

// forget takes a socket out of the epoll set (it stays there, disarmed,
// after its event).
func (w *idleSet) forget(fd int) { _ = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, fd, nil) }

// run waits for the set's sockets to become readable and runs their
// receive goroutines again; it ends when the set is empty.
func (w *idleSet) run() {
	var evs [64]unix.EpollEvent
	var woken []*kernelConn
	for {
		n, err := unix.EpollWait(w.epfd, evs[:], -1)
		if err == unix.EINTR {
			continue
		}
		woken = woken[:0]
		w.mu.Lock()
		if err != nil {
			// The set is unusable: every parked connection goes back
			// to a goroutine of its own.
			for id, kc := range w.conns {
				delete(w.conns, id)
				kc.idleID = 0
				woken = append(woken, kc)
			}
		}
		for _, ev := range evs[:max(n, 0)] {
			id := uint32(ev.Fd)
			if id == 0 {
				var b [8]byte
				_, _ = unix.Read(w.wake, b[:])
				continue
			}
			if kc := w.conns[id]; kc != nil {
				delete(w.conns, id)
				kc.idleID = 0
				woken = append(woken, kc)
			}
		}
		stop := len(w.conns) == 0
		if stop {
			w.running = false
		}
		w.mu.Unlock()
		for i, kc := range woken {
			kc.unpark()
			go kc.receive()
			woken[i] = nil
		}
		if stop {
			return
		}
	}
}
