// Package rnic is the device: resource tables (protection domains, memory
// regions and their STags, completion queues, queue pairs), the LLP a QP runs
// on, and the connection manager.
//
// One QP, two LLPs. A QP (qp.go) runs the datapath-independent RDMAP/DDP
// engine (package qp) over an mpaConn (mpaconn.go): the resumable MPA
// startup, fed octets as they arrive, then the engine's FPDUs. The stream
// under it is chosen when the device opens: a kernel TCP socket
// (kernelConn, llp_kernel.go; Open) or a connection of softrnic's TCP
// engine on an xdpnet poller (engineConn, llp_engine.go; OpenXDP). Both
// post each connection event in one place (QP.attach: Established where
// the QP reaches RTS; the close timer where our FIN goes out).
//
// The life of an RDMA Write, kernel datapath (as Linux siw: sent from the
// posting context, placed in the receive context):
//
//  1. The consumer's goroutine (softrnicd: the EP's ring loop, woken by the
//     client's doorbell, or the receive goroutine polling the ring, step 6)
//     calls QP.PostSend: q.mu, the engine queues the request, unlock.
//  2. Same goroutine: kernelConn.kick takes the transmit path (kc.mu, then
//     q.mu; no hand-off when it is idle), mpaConn.Fill has the engine build
//     FPDUs into a pooled buffer, unlock, and one non-blocking sendmsg
//     gives them to the kernel. Only if the socket does not take them all
//     does a transmit goroutine start, to wait for room (hand-off, rare).
//  3. Kernel TCP and the wire.
//  4. The peer's receive goroutine wakes in read (the one wake-up of the
//     direction, as for any TCP application): BeforeReceive (softrnicd:
//     receives queued in the client's ring go in first), then kc.mu and
//     q.mu, mpaConn.Receive → the engine places the payload in the
//     registered memory and makes any completion, unlock.
//  5. Same goroutine: events go to the consumer (QP.unlock), completions
//     are forwarded (Completed: softrnicd writes them to the client's
//     event ring and signals it if it sleeps), and whatever the QP owes
//     (a Read Response, a Terminate) is sent as in 2.
//  6. Same goroutine: Poll, for up to PollFor while nothing more arrives,
//     takes the answer an application posts to what it received and sends
//     it as in 1–2, with no wake-up on either side.
//
// Per direction: one wake-up (4), or two when the post finds the ring loop
// asleep (1); a round trip between two applications that answer each
// other, two, as kernel TCP's ping-pong. (Before issue 15: four hand-offs
// per direction — doorbell goroutine, session loop, transmit loop, peer's
// receive loop — and a needless wake of the peer's transmit loop.)
//
// The life of an RDMA Write, xdp datapath (one pinned poller per CPU):
//
//  1. The client's post lands in the EP's ring, which its QP's poller
//     polls (softrnicd's ringSource; a doorbell only if it sleeps):
//     QP.PostSend under q.mu on the poller, then engineConn.kick queues a
//     serve on the same poller.
//  2. Same poller, same turn: serve → tcp.Conn.Kick; the TCP engine's
//     Output calls engineConn.Fill (q.mu) → mpaConn.Fill → the engine's
//     FPDUs straight into the TCP send buffer, segmented into UMEM frames
//     on the AF_XDP TX ring, one sendto kick per batch.
//  3. veth, the peer's XDP program steers the segments to its AF_XDP
//     socket.
//  4. The peer's poller (spinning, or woken by its socket) runs
//     tcp.Stack.Input → engineConn.Receive (q.mu) → mpaConn.Receive →
//     the engine places from the receive frame; completions are forwarded
//     by the EVD's source on the same poller.
//
// No goroutine hand-off on either side while the pollers spin.
//
// Callbacks and locks. No callback re-enters a lock its caller holds:
//   - the TCP engine calls Handlers only from the poller's Input, Advance
//     and Output, never from a Conn method and never nested (tcp/events.go),
//     so engineConn may take the QP's mutex in its callbacks, and code that
//     holds that mutex may call any Conn method;
//   - a kernelConn takes its mutex and then the QP's around every call into
//     its mpaConn; nothing holding the QP's mutex takes the connection's;
//   - the QP engine's events, raised under the QP's mutex, are queued and
//     handed to the consumer (OnEvent, Events) by QP.unlock after the mutex
//     is released, in order; Completed and Poll run with no lock held;
//   - a CQ's Handler runs under the QP's mutex and may only wake a poller.
package rnic

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/qp"
	"github.com/softrnic/softrnic/tcp"
)

// Errors of the device verbs.
var (
	ErrInvalidHandle = errors.New("rnic: invalid handle")
	ErrBusy          = errors.New("rnic: resource in use")
	ErrResources     = errors.New("rnic: insufficient resources")
	ErrInvalidParam  = errors.New("rnic: invalid parameter")
	ErrClosed        = errors.New("rnic: device closed")
)

// Limits of a device.
const (
	MaxSTagIndex = 1<<24 - 1
	MaxQPs       = 1 << 16
)

// Device is one software RNIC.
type Device struct {
	mu     sync.Mutex
	closed bool
	nextPD uint32
	pds    map[uint32]*PD
	qps    map[uint32]*QP
	// qpsMost is qps' high-water mark (shrink).
	qpsMost int

	stags stagTable
	// xdp is the accelerated datapath; nil on the kernel datapath.
	xdp *xdpPath
	// warn receives what the device must tell the operator because no
	// caller hears it (SetWarn; XDPOptions.Warn).
	warn atomic.Pointer[func(msg string)]
	// takeovers: the connections taken over from the kernel (ssp.go).
	takeMu    sync.Mutex
	takeovers Takeovers
}

// SetWarn makes f receive the device's warnings for the operator: what
// fails where no caller hears it, such as a peer's connection request lost
// to a limit of this host (descriptors: the kernel datapath's accept). f
// must not block. On the accelerated datapath XDPOptions.Warn is the
// default.
func (d *Device) SetWarn(f func(msg string)) { d.warn.Store(&f) }

// warnf gives the operator a warning, if anyone listens.
func (d *Device) warnf(format string, args ...any) {
	if f := d.warn.Load(); f != nil && *f != nil {
		(*f)(fmt.Sprintf(format, args...))
	}
}

// Open returns a new device.
func Open() *Device {
	return &Device{pds: map[uint32]*PD{}, qps: map[uint32]*QP{}}
}

// Close aborts every QP and frees every resource.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	qps := make([]*QP, 0, len(d.qps))
	for _, q := range d.qps {
		qps = append(qps, q)
	}
	d.mu.Unlock()
	DestroyQPs(qps)
	if d.xdp != nil {
		// Aborted connections send their RSTs before the loops stop.
		for _, p := range d.xdp.pollers {
			_ = p.Do(func(*tcp.Stack, tcp.Time) {})
		}
		d.xdp.close()
	}
	return nil
}

// destroyWorkers bounds the Destroys DestroyQPs runs at once.
const destroyWorkers = 64

// DestroyQPs destroys every QP of qps as Destroy does, several at a time:
// it returns when all are destroyed. On the accelerated datapath each
// Destroy waits for its poller to let go of the connection, a round trip
// to the poller's loop: one after the other, 9,000 live QPs took 1.6 s
// (about 180 µs each), and a daemon closing a session of 10,000 1.3 s,
// while concurrent ones share the loop's turns (10,000 in 34 ms). A
// consumer that ends many QPs at once (a session that closes, a daemon
// that stops) calls this rather than Destroy in a loop.
func DestroyQPs(qps []*QP) {
	if len(qps) <= 1 {
		for _, q := range qps {
			q.Destroy()
		}
		return
	}
	next := make(chan *QP)
	var wg sync.WaitGroup
	for range min(len(qps), destroyWorkers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for q := range next {
				q.Destroy()
			}
		}()
	}
	for _, q := range qps {
		next <- q
	}
	close(next)
	wg.Wait()
}

// PD is a protection domain.
type PD struct {
	dev  *Device
	id   uint32
	refs atomic.Int32
}

// AllocPD creates a protection domain.
func (d *Device) AllocPD() (*PD, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	d.nextPD++
	pd := &PD{dev: d, id: d.nextPD}
	d.pds[pd.id] = pd
	return pd, nil
}

// ID is the PD's number.
func (pd *PD) ID() uint32 { return pd.id }

// Free releases the PD; it fails while regions or QPs use it.
func (pd *PD) Free() error {
	if pd.refs.Load() > 0 {
		return fmt.Errorf("free PD %d: %w", pd.id, ErrBusy)
	}
	pd.dev.mu.Lock()
	delete(pd.dev.pds, pd.id)
	pd.dev.mu.Unlock()
	return nil
}

// stagTable maps STags to regions. An STag is a 24-bit index and an 8-bit
// key; the key of an index changes each time the index is reused, so a stale
// STag never finds the new region.
//
// Lookup runs for every tagged segment, on every poller at once, and takes
// no lock: the regions sit in chunks of atomic pointers, and the list of
// chunks is replaced, never changed, when it grows. Writers (register,
// deregister) take mu. (A read lock per segment made the pollers' CPUs
// bounce its cache line between them.)
type stagTable struct {
	chunks atomic.Pointer[[]*stagChunk]
	mu     sync.Mutex
	keys   []uint8 // by index; its length is the next index never made free
	free   []uint32
}

const stagChunkSize = 1024

type stagChunk [stagChunkSize]atomic.Pointer[qp.MR]

func (t *stagTable) Lookup(stag uint32) *qp.MR {
	idx := stag >> 8
	cs := t.chunks.Load()
	if cs == nil || int(idx/stagChunkSize) >= len(*cs) {
		return nil
	}
	m := (*cs)[idx/stagChunkSize][idx%stagChunkSize].Load()
	if m == nil || m.STag != stag {
		return nil
	}
	return m
}

// slot is where index idx lives, the chunk list grown to hold it; t.mu held.
func (t *stagTable) slot(idx uint32) *atomic.Pointer[qp.MR] {
	var cs []*stagChunk
	if p := t.chunks.Load(); p != nil {
		cs = *p
	}
	if int(idx/stagChunkSize) >= len(cs) {
		grown := append(append([]*stagChunk(nil), cs...), new(stagChunk))
		t.chunks.Store(&grown)
		cs = grown
	}
	return &cs[idx/stagChunkSize][idx%stagChunkSize]
}

// insert gives m an STag and makes it found. Neither part of the STag
// follows from another region's: the index is drawn at random from the
// free ones (the free list grows a chunk's worth at a time), and each
// index's key starts at random, then steps on at each reuse, so that a
// stale STag names nothing for 255 reuses of its index. A peer that knows
// its own STags cannot name another connection's region by counting (it
// would also need the region's PZ).
func (t *stagTable) insert(m *qp.MR) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.free) == 0 {
		// Index 0 is never used: STag 0 is reserved in many stacks,
		// and the RTR STag 1 must not name a real region.
		if len(t.keys) == 0 {
			t.keys = append(t.keys, 0)
		}
		base := len(t.keys)
		if base > MaxSTagIndex {
			return ErrResources
		}
		n := min(stagChunkSize-base%stagChunkSize, MaxSTagIndex+1-base)
		for i := range n {
			t.keys = append(t.keys, uint8(rand.Uint32()))
			t.free = append(t.free, uint32(base+i))
		}
	}
	j := rand.IntN(len(t.free))
	idx := t.free[j]
	t.free[j] = t.free[len(t.free)-1]
	t.free = t.free[:len(t.free)-1]
	t.keys[idx]++
	m.STag = idx<<8 | uint32(t.keys[idx])
	t.slot(idx).Store(m) // publishes m.STag with it
	return nil
}

func (t *stagTable) remove(m *qp.MR) {
	t.mu.Lock()
	defer t.mu.Unlock()
	idx := m.STag >> 8
	if idx == 0 || int(idx) >= len(t.keys) {
		return
	}
	if s := t.slot(idx); s.Load() == m {
		s.Store(nil)
		t.free = append(t.free, idx)
	}
}

// MR is a registered memory region.
type MR struct {
	*qp.MR
	pd *PD
}

// RegisterMR registers buf, addressed by tagged offsets from base, with the
// given rights. The caller keeps buf alive and unchanged in size until
// Deregister succeeds.
func (d *Device) RegisterMR(pd *PD, buf []byte, base uint64, access qp.Access) (*MR, error) {
	return d.registerMR(pd, &qp.MR{Access: access, Base: base, Buf: buf})
}

// registerMR checks and publishes r, whole before any lookup can find it.
func (d *Device) registerMR(pd *PD, r *qp.MR) (*MR, error) {
	if pd == nil || pd.dev != d {
		return nil, fmt.Errorf("register MR: %w", ErrInvalidHandle)
	}
	if r.Base+uint64(len(r.Buf)) < r.Base {
		return nil, fmt.Errorf("register MR: base %#x + %d wraps: %w", r.Base, len(r.Buf), ErrInvalidParam)
	}
	// Remote write and atomics need local write (as in verbs).
	if r.Access&(qp.RemoteWrite|qp.RemoteAtomic) != 0 && r.Access&qp.LocalWrite == 0 {
		return nil, fmt.Errorf("register MR: remote write or atomic without local write: %w", ErrInvalidParam)
	}
	r.PD = pd.id
	m := &MR{MR: r, pd: pd}
	if err := d.stags.insert(m.MR); err != nil {
		return nil, fmt.Errorf("register MR: %w", err)
	}
	pd.refs.Add(1)
	return m, nil
}

// RegisterProcessMR registers the octets [va, va+len(shadow)) of a process,
// which the engine reaches through mem (qp.MR.Proc), with the given rights;
// shadow is the engine's copy of them, which it fills and addresses as
// operations need. The caller keeps shadow mapped, and mem usable, until
// Deregister succeeds.
func (d *Device) RegisterProcessMR(pd *PD, shadow []byte, mem qp.ProcessMemory, va uint64, access qp.Access) (*MR, error) {
	if mem == nil || len(shadow) == 0 {
		return nil, fmt.Errorf("register process MR: no memory: %w", ErrInvalidParam)
	}
	return d.registerMR(pd, &qp.MR{Access: access, Base: va, Buf: shadow, Proc: mem})
}

// Deregister removes the region; it fails with ErrBusy while a work request
// or a placement uses it.
func (m *MR) Deregister() error {
	if err := m.MR.Deregister(); err != nil {
		return fmt.Errorf("deregister STag %#x: %w", m.STag, ErrBusy)
	}
	m.pd.dev.stags.remove(m.MR)
	m.pd.refs.Add(-1)
	return nil
}

// CreateCQ creates a completion queue bound to a completion vector.
func (d *Device) CreateCQ(depth, vector int) (*completion.CQ, error) {
	cq, err := completion.New(completion.Options{Depth: depth, Vector: vector})
	if err != nil {
		return nil, fmt.Errorf("create CQ: %w: %v", ErrInvalidParam, err)
	}
	return cq, nil
}
