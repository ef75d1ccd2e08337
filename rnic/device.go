// Package rnic is the device: resource tables (protection domains, memory
// regions and their STags, completion queues, queue pairs), the LLP a QP runs
// on, and the connection manager.
//
// Goroutines, for the kernel-TCP datapath (the architecture of Linux siw):
// every connected QP has a receive loop, which reads from its socket and
// feeds the engine, and a transmit loop, which pulls FPDUs from the engine
// and writes them, woken by posts and by the receive loop. Both take the
// QP's mutex around engine calls and never hold it across a system call.
// A Listener has one accept loop that reads MPA Requests and hands
// connection requests to the consumer.
//
// On the accelerated datapath a QP's connection is an engineConn, the
// Handler the TCP engine calls on the poller that owns it (xdp.go).
//
// Callbacks and locks. No callback re-enters a lock its caller holds:
//   - the TCP engine calls Handlers only from the poller's Input, Advance
//     and Output, never from a Conn method and never nested (tcp/events.go),
//     so engineConn may take the QP's mutex in its callbacks, and code that
//     holds that mutex may call any Conn method;
//   - the QP engine's events, raised under the QP's mutex, are queued and
//     handed to the consumer (OnEvent, Events) by QP.unlock after the mutex
//     is released, in order;
//   - a CQ's Handler runs under the QP's mutex and may only wake a poller.
package rnic

import (
	"errors"
	"fmt"
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
	qpn    uint32
	qps    map[uint32]*QP

	stags stagTable
	// xdp is the accelerated datapath; nil on the kernel datapath.
	xdp *xdpPath
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
	for _, q := range qps {
		q.Destroy()
	}
	if d.xdp != nil {
		// Aborted connections send their RSTs before the loops stop.
		for _, p := range d.xdp.pollers {
			_ = p.Do(func(*tcp.Stack, tcp.Time) {})
		}
		d.xdp.close()
	}
	return nil
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
	keys   []uint8 // by index; its length is the next index never used
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

func (t *stagTable) insert(m *qp.MR) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	var idx uint32
	if n := len(t.free); n > 0 {
		idx = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		// Index 0 is never used: STag 0 is reserved in many stacks,
		// and the RTR STag 1 must not name a real region.
		if len(t.keys) == 0 {
			t.keys = append(t.keys, 0)
		}
		if len(t.keys) > MaxSTagIndex {
			return ErrResources
		}
		idx = uint32(len(t.keys))
		t.keys = append(t.keys, 0)
	}
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
	if pd == nil || pd.dev != d {
		return nil, fmt.Errorf("register MR: %w", ErrInvalidHandle)
	}
	if base+uint64(len(buf)) < base {
		return nil, fmt.Errorf("register MR: base %#x + %d wraps: %w", base, len(buf), ErrInvalidParam)
	}
	// Remote write and atomics need local write (as in verbs).
	if access&(qp.RemoteWrite|qp.RemoteAtomic) != 0 && access&qp.LocalWrite == 0 {
		return nil, fmt.Errorf("register MR: remote write or atomic without local write: %w", ErrInvalidParam)
	}
	m := &MR{MR: &qp.MR{PD: pd.id, Access: access, Base: base, Buf: buf}, pd: pd}
	if err := d.stags.insert(m.MR); err != nil {
		return nil, fmt.Errorf("register MR: %w", err)
	}
	pd.refs.Add(1)
	return m, nil
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
