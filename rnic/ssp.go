package rnic

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/internal/repair"
	"github.com/softrnic/softrnic/mpa"
	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/xdpnet"
)

// Stream → RDMA on a TCP connection the application made (seeds 000 and
// 004): the passive side's Socket Service Point waits on the connection
// for the peer's MPA Request, the active side's SocketConnect sends it.
// Before the switch the connection carried the application's own stream;
// the switch is the MPA Request in one direction and the Reply in the
// other. On the kernel datapath the socket itself becomes the QP's LLP; on
// the xdp datapath the connection is taken over from the kernel into the
// TCP engine (takeover.go).
//
// A failed switch resets the connection: it never goes back to streaming
// (seed 004). So a socket comes back to its owner only from a Socket
// Service Point freed before any octet of the switch was taken from it.

// ErrSocketDown: the socket of a Socket Service Point is not connected, or
// its connection ended, before the peer's MPA Request (DAT's
// DAT_CONNECTION_EVENT_SOCKET_DOWN).
var ErrSocketDown = errors.New("rnic: socket down")

// ErrNotMPA: what the peer sent after the streaming phase is not an MPA
// Request; the connection is reset.
var ErrNotMPA = errors.New("rnic: the peer sent no MPA Request")

// SocketPointOptions configure ServeSocket.
type SocketPointOptions struct {
	// FinalMessage is sent on the socket before the point waits for the
	// MPA Request: the last streaming octets, after which the peer may
	// answer with its Request (seed 000's final_sm_msg).
	FinalMessage []byte
	// RequestTimeout bounds the consumer's answer once the Request came
	// (DefaultMPATimeout if 0). The wait for the Request itself has no
	// bound: it ends with the socket or with Free.
	RequestTimeout time.Duration
	// Checked: the caller has asked CheckSocket about the socket already
	// (ServeSocket does otherwise).
	Checked bool
}

// SocketPoint is a Socket Service Point: one connected TCP socket on which
// at most one connection request is awaited.
type SocketPoint struct {
	dev  *Device
	nc   *net.TCPConn
	rc   syscall.RawConn
	opts SocketPointOptions
	l    *Listener // the request's plumbing (its device and options)

	mu sync.Mutex
	// freed: Free was called; taken: the serving goroutine began to
	// read the Request off the socket, which cannot be given back now;
	// partial: part of the final message went out before Free stopped
	// it, and neither can a socket whose stream is cut so.
	freed, taken, partial bool
	// result receives the request or the error that ended the wait,
	// once.
	result chan spResult
	ended  chan struct{}
}

type spResult struct {
	cr  *ConnRequest
	err error
}

// ServeSocket makes nc a Socket Service Point: it sends opts.FinalMessage,
// then waits for the peer's MPA Request, which Request returns as a
// ConnRequest to accept or reject. nc must be a TCP socket whose local
// address is this device's; a socket that is not connected, or whose
// connection ends before the Request, makes Request return ErrSocketDown.
// From here nc belongs to the point: Free gives it back while no Request
// octet was read.
func (d *Device) ServeSocket(nc *net.TCPConn, opts SocketPointOptions) (*SocketPoint, error) {
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = DefaultMPATimeout
	}
	rc, err := nc.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("socket service point: %w: %v", ErrInvalidParam, err)
	}
	// A socket that is not connected is SOCKET_DOWN at once (seed 000:
	// the point is made, then goes non-operational), not refused.
	if !opts.Checked && connected(rc) == nil {
		if err := d.CheckSocket(nc); err != nil {
			return nil, fmt.Errorf("socket service point: %w", err)
		}
	}
	sp := &SocketPoint{dev: d, nc: nc, rc: rc, opts: opts, result: make(chan spResult, 1), ended: make(chan struct{}),
		l: &Listener{dev: d, opts: ListenOptions{RequestTimeout: opts.RequestTimeout}, done: make(chan struct{})}}
	go sp.serve()
	return sp, nil
}

// serve sends the final message and waits for the Request. A wait that
// Free stopped leaves the socket for Free to give back; any other failure
// closes it (ErrNotMPA has reset it).
func (sp *SocketPoint) serve() {
	defer close(sp.ended)
	cr, err := sp.await()
	if err != nil {
		sp.mu.Lock()
		if sp.freed && !sp.taken && !sp.partial && !errors.Is(err, ErrNotMPA) {
			err = ErrClosed // Free stopped the wait: not the socket's end
		}
		sp.mu.Unlock()
		if !errors.Is(err, ErrClosed) {
			_ = sp.nc.Close()
		}
	}
	sp.result <- spResult{cr: cr, err: err}
}

func (sp *SocketPoint) await() (*ConnRequest, error) {
	if err := connected(sp.rc); err != nil {
		return nil, err
	}
	if err := addressed(sp.nc); err != nil {
		return nil, err
	}
	if msg := sp.opts.FinalMessage; len(msg) > 0 {
		n, err := sp.nc.Write(msg)
		if err != nil {
			// Free (the deadline) while the peer read nothing gives
			// the socket back; once part of it went, the stream is
			// no longer the one the application left.
			sp.mu.Lock()
			sp.partial = n > 0
			sp.mu.Unlock()
			return nil, fmt.Errorf("%w: final message (%d of %d octets sent): %v", ErrSocketDown, n, len(msg), err)
		}
	}
	if err := sp.peekRequest(); err != nil {
		if errors.Is(err, ErrNotMPA) {
			sp.abort()
		}
		return nil, err
	}
	sp.mu.Lock()
	if sp.freed {
		sp.mu.Unlock()
		return nil, ErrClosed
	}
	sp.taken = true
	sp.mu.Unlock()
	if sp.dev.xdp != nil {
		return sp.engineRequest()
	}
	return sp.kernelRequest()
}

// addressed checks the connection knows its addresses: net.FileConn reads
// them once, and a socket passed while it was still connecting has none
// for good, even once connected.
func addressed(tc *net.TCPConn) error {
	if ra, ok := tc.RemoteAddr().(*net.TCPAddr); !ok || ra == nil {
		return fmt.Errorf("%w: not connected when it was passed", ErrSocketDown)
	}
	if la, ok := tc.LocalAddr().(*net.TCPAddr); !ok || la == nil {
		return fmt.Errorf("%w: no local address when it was passed", ErrSocketDown)
	}
	return nil
}

// connected checks the socket has a peer and is ESTABLISHED (one the peer
// half-closed cannot bring its Request any more).
func connected(rc syscall.RawConn) error {
	var err error
	cerr := rc.Control(func(fd uintptr) {
		if _, e := unix.Getpeername(int(fd)); e != nil {
			err = fmt.Errorf("%w: not connected: %v", ErrSocketDown, e)
			return
		}
		info, e := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if e != nil {
			err = fmt.Errorf("%w: TCP_INFO: %v", ErrSocketDown, e)
			return
		}
		if info.State != repair.Established {
			err = fmt.Errorf("%w: TCP state %s", ErrSocketDown, repair.StateName(info.State))
		}
	})
	if cerr != nil {
		return fmt.Errorf("%w: %v", ErrSocketDown, cerr)
	}
	return err
}

// peekRequest waits, without taking an octet from the socket, until a
// whole MPA Request is in its receive queue: so that Free can give the
// socket back as it was, and so that a peer that sends something else is
// told apart at its first octets.
func (sp *SocketPoint) peekRequest() error {
	buf := make([]byte, mpa.FrameHeaderLen+mpa.MaxPrivateData)
	var perr error
	err := sp.rc.Read(func(fd uintptr) bool {
		n, _, e := unix.Recvfrom(int(fd), buf, unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch {
		case e == unix.EAGAIN || e == unix.EINTR:
			return false
		case e != nil:
			perr = fmt.Errorf("%w: %v", ErrSocketDown, e)
			return true
		case n == 0:
			perr = fmt.Errorf("%w: the peer closed the connection", ErrSocketDown)
			return true
		}
		if !isKeyPrefix(buf[:n]) {
			perr = fmt.Errorf("%w: %q", ErrNotMPA, buf[:min(n, mpa.KeyLen)])
			return true
		}
		_, _, e = mpa.ParseFrame(buf[:n], false)
		switch {
		case errors.Is(e, mpa.ErrShortFrame):
			// More to come, unless the peer closed or reset: a peek
			// gives the same octets again whatever came after them.
			if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil && info.State != repair.Established {
				perr = fmt.Errorf("%w: the peer ended the connection after %d octets of an MPA Request (TCP %s)",
					ErrSocketDown, n, repair.StateName(info.State))
				return true
			}
			return false
		case e != nil:
			perr = fmt.Errorf("%w: %v", ErrNotMPA, e)
		}
		return true
	})
	if perr != nil {
		return perr
	}
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return ErrClosed // Free
		}
		return fmt.Errorf("%w: %v", ErrSocketDown, err)
	}
	return nil
}

// isKeyPrefix: b starts as an MPA Request's key does, as far as it goes.
func isKeyPrefix(b []byte) bool {
	n := min(len(b), mpa.KeyLen)
	return string(b[:n]) == string(mpa.KeyRequest[:n])
}

// kernelRequest reads the Request, now whole in the socket, with the
// kernel datapath's machinery, and returns it as a ConnRequest.
func (sp *SocketPoint) kernelRequest() (*ConnRequest, error) {
	kc, err := newKernelConn(sp.nc, newMPAConn(nil, mpa.Config{}, false))
	if err != nil {
		sp.abort()
		return nil, fmt.Errorf("%w: %v", ErrSocketDown, err)
	}
	got := make(chan *ConnRequest, 1)
	kc.llp.OnRequest = func(_ *mpaConn, f *mpa.Frame) { got <- sp.l.newRequest(kc, nil, f) }
	// The Request is in the socket already: a moment is plenty.
	_ = sp.nc.SetReadDeadline(time.Now().Add(DefaultMPATimeout))
	kc.start()
	select {
	case cr := <-got:
		_ = sp.nc.SetReadDeadline(time.Time{})
		return cr, nil
	case <-time.After(DefaultMPATimeout + time.Second):
	}
	// Not a Request after all (the receive goroutine ended the
	// connection with the MPA layer's error).
	kc.mu.Lock()
	err = kc.llp.Err
	kc.Abort()
	kc.mu.Unlock()
	kc.loops.Wait()
	return nil, fmt.Errorf("%w: %v", ErrNotMPA, err)
}

// engineRequest takes the connection, its Request now whole in the
// kernel's receive queue, over into the first poller's TCP engine
// (xdpnet.TakeOver): the Request is among the unread octets the engine
// gets first, and makes the ConnRequest at once. Accept moves the
// connection to the QP's poller, as any passive connection.
func (sp *SocketPoint) engineRequest() (*ConnRequest, error) {
	p := sp.dev.xdp.pollers[0]
	id, err := xdpnet.TupleOf(sp.nc)
	if err != nil {
		sp.abort()
		return nil, fmt.Errorf("%w: %v", ErrSocketDown, err)
	}
	ec := newEngineConn(p, nil, newMPAConn(nil, mpa.Config{}, false))
	ec.id = id
	got := make(chan *ConnRequest, 1)
	// On the loop, inside TakeOver's Import.
	ec.llp.OnRequest = func(_ *mpaConn, f *mpa.Frame) { got <- sp.l.newRequest(nil, ec, f) }
	c, stats, err := p.TakeOver(sp.nc, ec)
	if err != nil {
		// Refused after CheckSocket passed (the connection changed
		// meanwhile), or lost in the handover: a failed switch.
		sp.abort()
		return nil, fmt.Errorf("%w: take over: %v", ErrSocketDown, err)
	}
	sp.dev.noteTakeover(stats)
	select {
	case cr := <-got:
		return cr, nil
	default:
	}
	// The Request was whole in the kernel's queue: not a Request after
	// all (the MPA layer ended the connection with its error).
	var why error
	_ = p.Do(func(*tcp.Stack, tcp.Time) { why = ec.llp.Err; c.Abort() })
	return nil, fmt.Errorf("%w: %v", ErrNotMPA, why)
}

// Takeovers count the connections the device took over from the kernel
// (xdp datapath), with the last one's figures.
type Takeovers struct {
	Count uint64
	Last  xdpnet.TakeoverStats
}

// Takeovers returns the device's takeovers so far.
func (d *Device) Takeovers() Takeovers {
	d.takeMu.Lock()
	defer d.takeMu.Unlock()
	return d.takeovers
}

func (d *Device) noteTakeover(s xdpnet.TakeoverStats) {
	d.takeMu.Lock()
	d.takeovers.Count++
	d.takeovers.Last = s
	d.takeMu.Unlock()
}

// CheckSocket says whether a connection given for stream → RDMA can be
// switched on this device, before anything is done to it: on the xdp
// datapath, whether it can be taken over from the kernel (IPv4 TCP,
// ESTABLISHED, nothing the engine cannot carry, its address the RNIC's,
// its peer reached through the RNIC's interface, and TCP_REPAIR
// permitted: repair mode entered and left, without a window probe). The
// kernel datapath runs on the socket itself and takes any.
func (d *Device) CheckSocket(tc *net.TCPConn) error {
	if d.xdp == nil {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidParam, err)
	}
	if err := connected(rc); err != nil {
		return fmt.Errorf("%w: %w", repair.ErrNotConnected, err)
	}
	id, err := xdpnet.TupleOf(tc)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidParam, err)
	}
	if id.LocalAddr != d.xdp.addr {
		return fmt.Errorf("%w: the connection's address %v is not the RNIC's (%v): its packets do not arrive on its interface",
			repair.ErrRefused, id.LocalAddr, d.xdp.addr)
	}
	s, err := repair.Enter(rc)
	if err != nil {
		return err
	}
	if err := s.Abandon(); err != nil {
		return fmt.Errorf("repair: leave repair mode: %w", err)
	}
	return d.xdp.pollers[0].Reachable(id.RemoteAddr, time.Second)
}

// abort resets the connection (SO_LINGER 0): a failed switch.
func (sp *SocketPoint) abort() {
	_ = sp.nc.SetLinger(0)
	_ = sp.nc.Close()
}

// Request waits for the point's one connection request: the ConnRequest,
// or ErrSocketDown (the socket was not connected or its connection ended;
// it was closed), ErrNotMPA (the peer sent something else; the connection
// was reset) or ErrClosed (Free) — or ctx's error. It returns the same
// outcome to every caller.
func (sp *SocketPoint) Request(ctx context.Context) (*ConnRequest, error) {
	select {
	case r := <-sp.result:
		sp.result <- r // for the next caller
		return r.cr, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Free ends the point. A request already returned by Request is not
// affected; while none was, the wait stops, and the socket comes back to
// the caller as it was if no octet of the Request was taken from it (nil
// otherwise: then it is the request's, or was closed with the point's
// failure).
func (sp *SocketPoint) Free() *net.TCPConn {
	sp.mu.Lock()
	if sp.freed {
		sp.mu.Unlock()
		return nil
	}
	sp.freed = true
	taken := sp.taken
	sp.mu.Unlock()
	if !taken {
		// Interrupt a wait for the Request or a final message that the
		// peer does not read.
		_ = sp.nc.SetDeadline(time.Now())
	}
	<-sp.ended
	r := <-sp.result
	sp.result <- r
	if errors.Is(r.err, ErrClosed) {
		_ = sp.nc.SetDeadline(time.Time{})
		return sp.nc
	}
	return nil
}

// SocketConnect is Connect over tc, a connection the application made and
// may have used for its own stream (seed 000's dat_iw_socket_connect):
// once the peer acknowledged every octet the application wrote on it
// (seed 004: RDMA-mode transmit starts only then), the MPA Request goes
// out on it, and the rest is Connect's. tc belongs to the QP from the
// call: a failure resets it (a failed switch never goes back to
// streaming). A socket that is not connected fails with ErrSocketDown.
func (q *QP) SocketConnect(ctx context.Context, tc *net.TCPConn, opts ConnectOptions) (_ []byte, err error) {
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("socket connect: %w: %v", ErrInvalidParam, err)
	}
	fail := func(err error) ([]byte, error) {
		_ = tc.SetLinger(0)
		_ = tc.Close()
		return nil, err
	}
	ctx, cancel, cfg, _, err := q.prepareConnect(ctx, opts)
	if err != nil {
		return fail(fmt.Errorf("socket connect: %w", err))
	}
	defer cancel()
	if err := connected(rc); err != nil {
		return fail(fmt.Errorf("socket connect: %w", err))
	}
	if err := addressed(tc); err != nil {
		return fail(fmt.Errorf("socket connect: %w", err))
	}
	raddr := tc.RemoteAddr().String()
	if err := waitSent(ctx, rc); err != nil {
		return fail(fmt.Errorf("socket connect %s: %w", raddr, err))
	}
	if q.dev.xdp != nil {
		return q.socketConnectEngine(ctx, tc, raddr, cfg, fail)
	}
	return q.startKernel(ctx, tc, raddr, cfg)
}

// socketConnectEngine is SocketConnect on the xdp datapath: the
// connection is taken over into the QP's poller (xdpnet.TakeOver), whose
// engine sends the MPA Request at once, as after its own handshake.
func (q *QP) socketConnectEngine(ctx context.Context, tc *net.TCPConn, raddr string, cfg mpa.Config,
	fail func(error) ([]byte, error)) ([]byte, error) {
	id, err := xdpnet.TupleOf(tc)
	if err != nil {
		return fail(fmt.Errorf("socket connect: %w: %v", ErrInvalidParam, err))
	}
	p := q.Poller()
	q.mu.Lock()
	if q.busyLocked() {
		q.unlock()
		return fail(ErrState)
	}
	ec := q.activeEngineConn(p, cfg)
	ec.id = id
	q.unlock()
	c, stats, err := p.TakeOver(tc, ec)
	if err != nil {
		q.letGo(ec)
		return fail(fmt.Errorf("socket connect %s: take over: %w", raddr, err))
	}
	q.dev.noteTakeover(stats)
	select {
	case err = <-ec.result:
	case <-ctx.Done():
		_ = p.Do(func(*tcp.Stack, tcp.Time) { c.Abort() })
		err = fmt.Errorf("socket connect %s: %w", raddr, ErrTimedOut)
	}
	if err != nil {
		q.letGo(ec)
		var rej *RejectedError
		if errors.As(err, &rej) || errors.Is(err, ErrTimedOut) {
			return nil, err
		}
		return nil, fmt.Errorf("socket connect %s: %w", raddr, err)
	}
	time.AfterFunc(nudgeDelay, q.nudgeIfSilent)
	return clone(ec.llp.Params.PeerPrivateData), nil
}

// waitSent waits until the peer has acknowledged everything written on
// the socket (SIOCOUTQ: write_seq − snd_una is 0), within ctx.
func waitSent(ctx context.Context, rc syscall.RawConn) error {
	for wait := 50 * time.Microsecond; ; wait = min(2*wait, 10*time.Millisecond) {
		var n int
		var ierr error
		if err := rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) }); err != nil {
			return fmt.Errorf("%w: %v", ErrSocketDown, err)
		}
		if ierr != nil {
			return fmt.Errorf("%w: SIOCOUTQ: %v", ErrSocketDown, ierr)
		}
		if n == 0 {
			return nil
		}
		if err := connected(rc); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d streaming octets still unacknowledged: %w", n, ErrTimedOut)
		case <-time.After(wait):
		}
	}
}
