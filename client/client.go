// Package client attaches an application to softrnicd with DAT-style verbs:
// an interface adapter (IA) per daemon, protection zones (PZ), local memory
// regions (LMR) over shared memory the daemon maps or over any memory of the
// process, which the daemon copies in and out (RegisterProcessMemory), event
// dispatchers (EVD), endpoints (EP), public and reserved service points
// (PSP, RSP) and connection requests (CR).
//
// Control verbs go over the daemon's Unix socket. The data path does not:
// posting a work request writes a ring in shared memory, and completions
// arrive in another; a system call happens only to wake a sleeping daemon
// or to sleep waiting for an event. The package needs no privileges.
package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/internal/fdpass"
	"github.com/softrnic/softrnic/internal/memreg"
	"github.com/softrnic/softrnic/internal/shm"
)

// Errors, testable with errors.Is; each carries the daemon's DAT status.
var (
	ErrInvalidHandle         = &ctl.Error{Status: ctl.InvalidHandle}
	ErrInvalidState          = &ctl.Error{Status: ctl.InvalidState}
	ErrInvalidParameter      = &ctl.Error{Status: ctl.InvalidParameter}
	ErrInsufficientResources = &ctl.Error{Status: ctl.InsufficientResources}
	ErrInvalidAddress        = &ctl.Error{Status: ctl.InvalidAddress}
	ErrProtectionViolation   = &ctl.Error{Status: ctl.ProtectionViolation}
	ErrNotImplemented        = &ctl.Error{Status: ctl.NotImplemented}
	ErrTimeout               = &ctl.Error{Status: ctl.Timeout}
	// ErrQueueFull: the EP's ring has no free entry (a DAT
	// INSUFFICIENT_RESOURCES); reap completions and post again.
	ErrQueueFull = fmt.Errorf("client: work queue full: %w", ErrInsufficientResources)
	// ErrClosed: the IA was closed or the daemon went away.
	ErrClosed = errors.New("client: interface adapter closed")
	// ErrDaemonGone: the daemon's end of the session closed (it exited or
	// was killed); waits and dequeues fail with it once the events
	// already delivered are taken.
	ErrDaemonGone = fmt.Errorf("client: softrnicd went away: %w", ErrClosed)
)

// Options for Open.
type Options struct {
	// Socket is the daemon's control socket: by default
	// /run/softrnic/IFACE.sock for Iface, and with neither the one
	// socket in /run/softrnic (ctl.FindSocket).
	Socket string
	Iface  string
	// Name identifies the application in the daemon's log.
	Name string
}

// IA is an open interface adapter: one session with a daemon.
type IA struct {
	conn     *net.UnixConn
	attr     ctl.IAAttr
	doorbell *os.File
	// region is the session's shared memory, every ring of its EPs and
	// EVDs; queues its EPs' ready queues by vector (objMu).
	region []byte
	queues map[uint32]*readyQueue

	mu     sync.Mutex // one request in flight on the socket
	nextID uint32
	closed bool

	objMu sync.Mutex
	eps   map[uint32]*EP
	evds  map[*EVD]struct{}

	// gone: the daemon hung up (see watch); stop wakes watch at Close.
	gone atomic.Bool
	// ended: Close ran; waiters return ErrClosed.
	ended   atomic.Bool
	stop    *os.File
	stopW   *os.File
	watched chan struct{}
}

// Open connects to the daemon.
func Open(ctx context.Context, opts Options) (*IA, error) {
	path := opts.Socket
	if path == "" && opts.Iface != "" {
		path = ctl.DefaultSocket(opts.Iface)
	} else if path == "" {
		var err error
		if path, err = ctl.FindSocket(); err != nil {
			return nil, fmt.Errorf("open IA: %v: %w", err, ErrInvalidParameter)
		}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, openWait)
		defer cancel()
	}
	c, err := dial(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("open IA: connect to softrnicd at %s: %w", path, err)
	}
	ia := &IA{conn: c.(*net.UnixConn), eps: map[uint32]*EP{}, evds: map[*EVD]struct{}{}, queues: map[uint32]*readyQueue{},
		watched: make(chan struct{})}
	// The Hello is bounded as the connect is: a daemon (or whatever
	// holds the socket) that accepts and never answers fails the Open
	// when its context ends.
	deadline, _ := ctx.Deadline()
	_ = c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	var reply ctl.HelloReply
	files, err := ia.call(ctl.OpHello, &ctl.Hello{Client: opts.Name}, nil, &reply)
	if !stop() && err == nil {
		err = ctx.Err() // the deadline may be set now, after the reply
	}
	if err != nil {
		c.Close()
		closeAll(files)
		if cerr := ctx.Err(); cerr != nil || !time.Now().Before(deadline) {
			// (The socket's deadline may pass a moment before the
			// context's timer says so.)
			if cerr == nil {
				cerr = context.DeadlineExceeded
			}
			return nil, fmt.Errorf("open IA: softrnicd at %s gave no answer to Hello: %w", path, cerr)
		}
		return nil, fmt.Errorf("open IA: %w", err)
	}
	_ = c.SetDeadline(time.Time{})
	if len(files) != 2 {
		c.Close()
		closeAll(files)
		return nil, fmt.Errorf("open IA: daemon passed %d descriptors, want the doorbell and the shared region", len(files))
	}
	ia.attr, ia.doorbell = reply.IA, files[0]
	ia.region, err = mapRegion(files[1], reply.Region)
	files[1].Close()
	if err != nil {
		c.Close()
		ia.doorbell.Close()
		return nil, fmt.Errorf("open IA: %w", err)
	}
	if ia.stop, ia.stopW, err = os.Pipe(); err != nil {
		ia.Close()
		return nil, fmt.Errorf("open IA: %w", err)
	}
	go ia.watch()
	return ia, nil
}

// openWait bounds Open (the connect, then the Hello) when its context
// sets no deadline, as the C library's socket timeouts bound its open.
const openWait = 10 * time.Second

// dial connects to the daemon's socket. A daemon whose backlog is full (a
// burst of clients, or the daemon stopped) refuses at once with EAGAIN,
// where a blocking connect would wait: it is tried again, more slowly each
// time, until the context ends.
func dial(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	pause := time.Millisecond
	for {
		c, err := d.DialContext(ctx, "unixpacket", path)
		if err == nil || !errors.Is(err, syscall.EAGAIN) {
			return c, err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("its backlog stayed full (is it stopped?): %w", err)
		case <-t.C:
		}
		pause = min(2*pause, 100*time.Millisecond)
	}
}

// watch waits for the daemon to hang up on the session, without reading
// the socket (the requests' replies are call's), and then wakes every
// waiter so that it sees ErrDaemonGone instead of sleeping forever.
func (ia *IA) watch() {
	defer close(ia.watched)
	rc, err := ia.conn.SyscallConn()
	if err != nil {
		return
	}
	var fd int
	_ = rc.Control(func(f uintptr) { fd = int(f) })
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}, {Fd: int32(ia.stop.Fd()), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil || fds[1].Revents != 0 {
			return // Close
		}
		if fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0 {
			break
		}
	}
	ia.gone.Store(true)
	ia.wakeAll()
}

// wakeAll wakes every waiter on the session's EVDs.
func (ia *IA) wakeAll() {
	ia.objMu.Lock()
	evds := make([]*EVD, 0, len(ia.evds))
	for e := range ia.evds {
		evds = append(evds, e)
	}
	ia.objMu.Unlock()
	for _, e := range evds {
		e.wake()
	}
}

// Gone reports whether the daemon has hung up on the session.
func (ia *IA) Gone() bool { return ia.gone.Load() }

// Attr are the IA's attributes (dat_ia_query).
func (ia *IA) Attr() ctl.IAAttr { return ia.attr }

// Close ends the session. The daemon aborts its connections and frees
// every object it owned; the process's mappings stay until Free or exit.
func (ia *IA) Close() error {
	ia.mu.Lock()
	defer ia.mu.Unlock()
	if ia.closed {
		return nil
	}
	ia.closed = true
	ia.doorbell.Close()
	ia.objMu.Lock()
	for _, q := range ia.queues {
		q.doorbell.Close() // a post after Close fails: os.File is safe for that
	}
	ia.objMu.Unlock()
	if ia.stopW != nil {
		// watch polls the socket's descriptor: it ends before the
		// socket closes.
		ia.stopW.Close()
		<-ia.watched
		ia.stop.Close()
	}
	// Waiters on the session's EVDs return ErrClosed, as they would
	// ErrDaemonGone, instead of sleeping to their deadlines.
	ia.ended.Store(true)
	ia.wakeAll()
	return ia.conn.Close()
}

// mapRegion maps the session's region, which must be sealed at its size:
// the daemon's rings in it can then never fault here. The mapping stays
// for the life of the process, as the rings' did (Close).
func mapRegion(f *os.File, size uint64) ([]byte, error) {
	if size == 0 || size > 1<<31 {
		return nil, fmt.Errorf("shared region of %d octets", size)
	}
	if err := shm.CheckSealed(f, int64(size)); err != nil {
		return nil, err
	}
	return shm.Map(f, 0, int(size))
}

// block is n octets of the region at off, or an error if the daemon named
// memory outside it.
func (ia *IA) block(off uint32, n int) ([]byte, error) {
	if n <= 0 || uint64(off)+uint64(n) > uint64(len(ia.region)) {
		return nil, fmt.Errorf("daemon placed %d octets at %#x, outside the shared region of %d", n, off, len(ia.region))
	}
	return ia.region[off : int(off)+n : int(off)+n], nil
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// call sends one request and waits for its reply.
func (ia *IA) call(op ctl.Op, req any, fds []*os.File, reply any) ([]*os.File, error) {
	ia.mu.Lock()
	defer ia.mu.Unlock()
	if ia.closed {
		return nil, ErrClosed
	}
	ia.nextID++
	id := ia.nextID
	msg, err := ctl.Marshal(ctl.Header{Op: op, ID: id}, req)
	if err != nil {
		return nil, err
	}
	// The session is the daemon's to end, not ours (ia.closed): a
	// request it can no longer take because it hung up means it went
	// away, which Gone says from now on, before the watcher may have seen
	// the hang-up. Any other failure to send (a descriptor already
	// closed, too many passed, no memory for now) is this request's.
	if _, _, err := ia.conn.WriteMsgUnix(msg, fdpass.Rights(fds), nil); err != nil {
		if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ENOTCONN) {
			ia.gone.Store(true)
			return nil, fmt.Errorf("%v: %w: %v", op, ErrDaemonGone, err)
		}
		return nil, fmt.Errorf("%v: sending the request: %w", op, err)
	}
	buf := make([]byte, ctl.MaxMessage)
	oob := make([]byte, fdpass.OOBSpace(4))
	n, oobn, _, _, err := ia.conn.ReadMsgUnix(buf, oob)
	if err != nil || n == 0 {
		ia.gone.Store(true)
		return nil, fmt.Errorf("%v: %w", op, ErrDaemonGone)
	}
	files := fdpass.Parse(oob[:oobn], "softrnic")
	h, body, err := ctl.ParseHeader(buf[:n])
	if err != nil || h.ID != id || h.Op != op {
		closeAll(files)
		return nil, fmt.Errorf("%v: bad reply from the daemon: %v", op, err)
	}
	if h.Status != ctl.Success {
		closeAll(files)
		var eb ctl.ErrorBody
		_ = ctl.Unmarshal(body, &eb)
		return nil, &ctl.Error{Status: h.Status, Message: eb.Message}
	}
	if reply == nil {
		reply = &struct{}{}
	}
	if err := ctl.Unmarshal(body, reply); err != nil {
		closeAll(files)
		return nil, fmt.Errorf("%v: bad reply body: %w", op, err)
	}
	return files, nil
}

// PZ is a protection zone.
type PZ struct {
	ia *IA
	h  uint32
}

// CreatePZ creates a protection zone.
func (ia *IA) CreatePZ() (*PZ, error) {
	var r ctl.CreatePZReply
	if _, err := ia.call(ctl.OpCreatePZ, &struct{}{}, nil, &r); err != nil {
		return nil, fmt.Errorf("create PZ: %w", err)
	}
	return &PZ{ia: ia, h: r.PZ}, nil
}

// Free frees the PZ; it fails while LMRs or EPs use it.
func (pz *PZ) Free() error {
	if _, err := pz.ia.call(ctl.OpFreePZ, &ctl.Handle{H: pz.h}, nil, nil); err != nil {
		return fmt.Errorf("free PZ: %w", err)
	}
	return nil
}

// Buffer is memory the daemon can map: a sealed memfd mapped here.
type Buffer struct {
	mem *shm.Memfd
	// Bytes is the memory.
	Bytes []byte
}

// Alloc returns size octets of registrable memory (rounded up to pages).
func (ia *IA) Alloc(size int) (*Buffer, error) {
	page := os.Getpagesize()
	n := (size + page - 1) / page * page
	if n == 0 {
		return nil, fmt.Errorf("alloc: %w: size %d", ErrInvalidParameter, size)
	}
	m, err := shm.NewMemfd("softrnic-buf", n)
	if err != nil {
		return nil, fmt.Errorf("alloc: %w", err)
	}
	return &Buffer{mem: m, Bytes: m.Mem[:size]}, nil
}

// Free unmaps the buffer; deregister its LMRs first.
func (b *Buffer) Free() error { return b.mem.Close() }

// Access rights of an LMR.
type Access uint8

// Rights.
const (
	LocalWrite   Access = ctl.AccessLocalWrite
	RemoteRead   Access = ctl.AccessRemoteRead
	RemoteWrite  Access = ctl.AccessRemoteWrite
	RemoteAtomic Access = ctl.AccessRemoteAtomic
)

// LMR is a registered local memory region.
type LMR struct {
	pz  *PZ
	h   uint32
	buf *Buffer
	// mem is the range of ordinary memory RegisterMemory moved onto the
	// process's registration memfd, released at Free.
	mem struct{ addr, length uintptr }
	// Context is the STag: the LMR context locally and the RMR context a
	// peer uses to reach this memory.
	Context uint32
	va      uint64
}

// RegisterLMR registers a whole Buffer with the given rights.
func (pz *PZ) RegisterLMR(b *Buffer, access Access) (*LMR, error) {
	va := uint64(uintptrOf(b.mem.Mem))
	req := &ctl.RegisterLMR{PZ: pz.h, Offset: 0, Length: uint64(len(b.mem.Mem)), VA: va, Access: uint8(access)}
	var r ctl.RegisterLMRReply
	if _, err := pz.ia.call(ctl.OpRegisterLMR, req, []*os.File{b.mem.File}, &r); err != nil {
		return nil, fmt.Errorf("register LMR: %w", err)
	}
	return &LMR{pz: pz, h: r.LMR, buf: b, Context: r.STag, va: va}, nil
}

// RegisterMemory registers length octets of this process's own memory at
// addr: memory from malloc, a static array, or an anonymous mapping, not
// only a Buffer. Its pages move in place onto the process's registration
// memfd, which the daemon maps (internal/memreg says how, and what it costs:
// a copy of the range now and at Free, none per operation; writes other
// threads make to the range meanwhile are lost). The range must be mapped,
// readable, and writable if access asks for local or remote writes; the
// tagged offset of octet i is addr+i. Memory the Go runtime manages (a
// slice from make) must stay referenced until Free.
func (pz *PZ) RegisterMemory(addr uintptr, length int, access Access) (*LMR, error) {
	if length <= 0 {
		return nil, fmt.Errorf("register memory: %w: length %d", ErrInvalidParameter, length)
	}
	sp, err := memreg.Default()
	if err != nil {
		return nil, fmt.Errorf("register memory: %w", err)
	}
	write := access&(LocalWrite|RemoteWrite|RemoteAtomic) != 0
	if err := sp.Register(addr, uintptr(length), write); err != nil {
		return nil, fmt.Errorf("register memory: %w: %w", ErrInvalidParameter, err)
	}
	req := &ctl.RegisterLMR{PZ: pz.h, Offset: uint64(addr), Length: uint64(length), VA: uint64(addr), Access: uint8(access)}
	var r ctl.RegisterLMRReply
	if _, err := pz.ia.call(ctl.OpRegisterLMR, req, []*os.File{sp.File()}, &r); err != nil {
		_ = sp.Unregister(addr, uintptr(length))
		return nil, fmt.Errorf("register memory: %w", err)
	}
	l := &LMR{pz: pz, h: r.LMR, Context: r.STag, va: uint64(addr)}
	l.mem.addr, l.mem.length = addr, uintptr(length)
	return l, nil
}

// RegisterProcessMemory registers length octets of this process's own
// memory at addr, which the daemon reaches through /proc/PID/mem
// (internal/procmem): nothing moves, nothing is shared or pinned, so the
// range may be any octets the process has (a field inside a heap object),
// and after fork the child's pages are its own and the registration
// stays the parent's. Each operation costs a copy between the process and
// the daemon (RegisterMemory costs none per operation). The first and last
// octet must be readable now, else the registration fails with
// ErrInvalidAddress; memory that goes away later makes the operations on
// it fail (a local protection error, or a Terminate for the peer's). The
// daemon needs ptrace access to the process (the same uid and, under Yama,
// prctl(PR_SET_PTRACER), or CAP_SYS_PTRACE), else ErrProtectionViolation.
// The tagged offset of octet i is addr+i. Memory of the Go runtime must be
// on the heap (a slice that escapes, never a variable the compiler may keep
// on a goroutine's stack, which moves as the stack grows) and stay
// referenced until Free.
func (pz *PZ) RegisterProcessMemory(addr uintptr, length int, access Access) (*LMR, error) {
	if length <= 0 {
		return nil, fmt.Errorf("register process memory: %w: length %d", ErrInvalidParameter, length)
	}
	req := &ctl.RegisterProcessMemory{PZ: pz.h, VA: uint64(addr), Length: uint64(length), Access: uint8(access)}
	var r ctl.RegisterLMRReply
	if _, err := pz.ia.call(ctl.OpRegisterProcessMemory, req, nil, &r); err != nil {
		return nil, fmt.Errorf("register process memory: %w", err)
	}
	return &LMR{pz: pz, h: r.LMR, Context: r.STag, va: uint64(addr)}, nil
}

// RegisterBytes is RegisterMemory of b.
func (pz *PZ) RegisterBytes(b []byte, access Access) (*LMR, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("register memory: %w: empty slice", ErrInvalidParameter)
	}
	return pz.RegisterMemory(uintptrOf(b), len(b), access)
}

// Address is the tagged offset of byte off of the region, what a peer puts
// in RDMA requests along with Context.
func (l *LMR) Address(off uint64) uint64 { return l.va + off }

// Free deregisters; it fails while a request uses the region.
func (l *LMR) Free() error {
	if _, err := l.pz.ia.call(ctl.OpFreeLMR, &ctl.Handle{H: l.h}, nil, nil); err != nil {
		// With the session gone the daemon's mapping is gone too: the
		// memory comes back all the same.
		if !errors.Is(err, ErrClosed) || l.mem.length == 0 {
			return fmt.Errorf("free LMR: %w", err)
		}
	}
	if l.mem.length != 0 {
		sp, err := memreg.Default()
		if err == nil {
			err = sp.Unregister(l.mem.addr, l.mem.length)
		}
		l.mem.length = 0
		if err != nil {
			return fmt.Errorf("free LMR: %w", err)
		}
	}
	return nil
}
