package qp

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/ddp"
)

// Access rights of a memory region.
type Access uint8

// Rights. Local read is implied.
const (
	LocalWrite Access = 1 << iota
	RemoteRead
	RemoteWrite
	RemoteAtomic
)

// MR is a registered memory region: Buf holds the bytes the tagged offsets
// [Base, Base+len(Buf)) address. The device's STag table owns MRs; the
// engine only checks and places.
type MR struct {
	STag   uint32
	PD     uint32
	Access Access
	Base   uint64
	Buf    []byte
	// Proc, when set, makes the region the octets [Base, Base+len(Buf))
	// of a process's address space (its addresses are the tagged
	// offsets), reached through Proc by copies, and Buf a shadow of them
	// that the engine addresses as it does any region's bytes (slice,
	// the SGEs of work requests). The shadow holds data only while the
	// engine reads it: a range is filled from the process just before,
	// fetchAhead at a time (fetch: a Send's or Write's SGEs as they go
	// out, after any Fence; the source of a Read Response as it is
	// served, after the requests before it). What
	// the engine places (a peer's Write or Send, a Read Response, an
	// atomic's result) goes to the process in order, gathered up to a
	// message's end (stage.go) or at once (store), not through the
	// shadow, which stays untouched (and unbacked) where nothing is
	// read. An atomic on such
	// a region reads, operates and writes back (executeProcAtomic). Holds
	// cover it as any region: the shadow may go once Deregister succeeds.
	Proc ProcessMemory

	invalid atomic.Bool // invalidated locally or by Send with Invalidate
	dead    atomic.Bool // deregistered
	// inflight counts work requests that reference the region and
	// placements under way; deregistration fails while it is non-zero.
	inflight atomic.Int32

	// The shadow of a process-backed region gives its pages back once
	// nothing holds the region and fetches since the last time spanned
	// shadowTrimAt or more, so that the daemon does not keep a copy of
	// all the data that ever went out. The last release hands the region
	// to the trimmer goroutine (trimShadow), off the datapath. Fetches
	// take shadowMu shared, the trim and Deregister exclusive: a fetch by
	// a new holder waits for the pages to go, a trim never drops what a
	// holder fetched, and none touches the shadow of a region
	// deregistered (its owner may unmap it then).
	shadowMu sync.RWMutex
	// fetchNotLo and fetchHi bound the offsets in Buf fetched since the
	// last trim: ^fetchNotLo the lowest, so that the zero value of both
	// is "nothing".
	fetchNotLo, fetchHi atomic.Uint64
	shadowBig           atomic.Bool // the bounds span shadowTrimAt or more
	trimQueued          atomic.Bool // in shadowTrims
}

// shadowTrimAt is how much of a shadow may have been fetched before the
// last release of the region gives its pages back: little enough that
// the daemon's memory stays near what is in flight, much enough that a
// program that sends the same buffer again and again (a latency test)
// never pays for it.
const shadowTrimAt = 4 << 20

// ProcessMemory is the memory of a process that regions stand for (MR.Proc),
// by its virtual addresses: in the daemon package internal/procmem, which
// copies through /proc/PID/mem. ReadAt and WriteAt copy every octet
// or fail (the memory was unmapped since registration, the process is gone)
// and never panic; the engine calls them with the region held, from the
// goroutine that drives the QP, and they must allocate nothing when they
// succeed (the engine's datapath allocates nothing).
type ProcessMemory interface {
	ReadAt(dst []byte, addr uint64) error
	WriteAt(src []byte, addr uint64) error
}

// Memory finds regions by STag for the engine. Lookup returns nil for an
// STag whose index is free or whose key does not match.
type Memory interface {
	Lookup(stag uint32) *MR
}

// Errors of memory regions.
var (
	ErrBusy = errors.New("qp: memory region in use by an operation in flight")
)

// Valid reports whether the region may be used: registered and not
// invalidated.
func (m *MR) Valid() bool { return !m.invalid.Load() && !m.dead.Load() }

// Invalidate marks the region invalid (local invalidate, or a peer's Send
// with Invalidate).
func (m *MR) Invalidate() { m.invalid.Store(true) }

// Revalidate makes an invalidated region usable again (fast registration).
func (m *MR) Revalidate() { m.invalid.Store(false) }

// Deregister marks the region dead unless an operation holds it. After it
// returns nil no placement can touch Buf, so the owner may unmap it.
func (m *MR) Deregister() error {
	// Not while a trim works on the shadow: once this returns nil the
	// owner may unmap it. A fetch holds the lock too, but also holds the
	// region: that is busy at once, never a wait on the fetch's read of
	// the process (which may block, on a FUSE mapping say), with the
	// caller's session locked. Nor a wait in Lock: a fetch that came
	// after it and waits for a read lock is let in before it when the
	// trim lets go, so a trim is waited out by trying again (it only
	// works on memory), and a fetch seen on the way is busy.
	for pause := 10 * time.Microsecond; !m.shadowMu.TryLock(); pause = min(2*pause, time.Millisecond) {
		if m.inflight.Load() > 0 {
			return ErrBusy
		}
		time.Sleep(pause) // asleep, not spinning: a trim of a GiB takes about 80 ms
	}
	defer m.shadowMu.Unlock()
	if m.inflight.Load() > 0 {
		return ErrBusy
	}
	m.dead.Store(true)
	// A placement that raced past the first check holds the region now
	// and will see dead on its next acquire: hand the region back.
	if m.inflight.Load() > 0 {
		m.dead.Store(false)
		return ErrBusy
	}
	return nil
}

// hold takes a reference for an operation; false if the region is gone.
func (m *MR) hold() bool {
	m.inflight.Add(1)
	if m.dead.Load() {
		m.inflight.Add(-1)
		return false
	}
	return true
}

func (m *MR) release() {
	if m.inflight.Add(-1) == 0 && m.shadowBig.Load() && m.trimQueued.CompareAndSwap(false, true) {
		select {
		case shadowTrims <- m:
			if trimming.CompareAndSwap(false, true) {
				go trimmer()
			}
		default: // the trimmer is behind: a later release asks again
			m.trimQueued.Store(false)
		}
	}
}

// shadowTrims are the regions whose shadows the trimmer is to trim; a
// trimmer runs while trimming is set, and ends when it finds none.
var (
	shadowTrims = make(chan *MR, 256)
	trimming    atomic.Bool
)

func trimmer() {
	for {
		select {
		case m := <-shadowTrims:
			m.trimQueued.Store(false)
			m.trimShadow()
		default:
			trimming.Store(false)
			// One queued between the look and the store is this
			// trimmer's still, unless a new one took it.
			if len(shadowTrims) == 0 || !trimming.CompareAndSwap(false, true) {
				return
			}
		}
	}
}

// trimShadow gives back the whole pages of the shadow that fetches filled,
// unless a holder came meanwhile (it may use them) or the region is
// deregistered (the shadow may be gone).
func (m *MR) trimShadow() {
	m.shadowMu.Lock()
	defer m.shadowMu.Unlock()
	if m.inflight.Load() != 0 || m.dead.Load() || !m.shadowBig.Load() {
		return
	}
	page := uintptr(unix.Getpagesize())
	base := uintptr(unsafe.Pointer(unsafe.SliceData(m.Buf)))
	lo := (base + uintptr(^m.fetchNotLo.Load()) + page - 1) &^ (page - 1)
	hi := (base + uintptr(min(m.fetchHi.Load(), uint64(len(m.Buf))))) &^ (page - 1)
	if hi > lo {
		// Anonymous private memory reads as zeros again; nothing reads
		// it before a fetch fills it.
		_ = unix.Madvise(m.Buf[lo-base:hi-base], unix.MADV_DONTNEED)
	}
	m.fetchNotLo.Store(0)
	m.fetchHi.Store(0)
	m.shadowBig.Store(false)
}

// procAddr is the process address of b, a non-empty part of m.Buf (the
// shadow of a process-backed region).
func (m *MR) procAddr(b []byte) uint64 {
	off := uintptr(unsafe.Pointer(unsafe.SliceData(b))) - uintptr(unsafe.Pointer(unsafe.SliceData(m.Buf)))
	return m.Base + uint64(off)
}

// fetch fills b, a part of the shadow of a process-backed region, from the
// process.
func (m *MR) fetch(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	m.shadowMu.RLock()
	defer m.shadowMu.RUnlock()
	addr := m.procAddr(b)
	lo := addr - m.Base
	hi := lo + uint64(len(b))
	for {
		n := m.fetchNotLo.Load()
		if n >= ^lo || m.fetchNotLo.CompareAndSwap(n, ^lo) {
			break
		}
	}
	for {
		h := m.fetchHi.Load()
		if h >= hi || m.fetchHi.CompareAndSwap(h, hi) {
			break
		}
	}
	if l, h := ^m.fetchNotLo.Load(), m.fetchHi.Load(); h > l && h-l >= shadowTrimAt {
		m.shadowBig.Store(true)
	}
	return m.Proc.ReadAt(b, addr)
}

// store writes data to the process where at, a part of the shadow of a
// process-backed region at least as long, stands: a placement.
func (m *MR) store(at, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	return m.Proc.WriteAt(data, m.procAddr(at))
}

// procOf is m if it is process-backed, else nil.
func procOf(m *MR) *MR {
	if m != nil && m.Proc != nil {
		return m
	}
	return nil
}

// slice returns the bytes for [to, to+n) or false when out of bounds, with
// overflow-safe arithmetic.
func (m *MR) slice(to uint64, n uint64) ([]byte, bool) {
	if to < m.Base {
		return nil, false
	}
	off := to - m.Base
	size := uint64(len(m.Buf))
	if off > size || n > size-off {
		return nil, false
	}
	return m.Buf[off : off+n], true
}

// placeTarget resolves a tagged placement of n octets at to in stag for the
// peer, checking what RFC 5041 §7.1 and RFC 5040 §7 require in their order:
// a known, valid STag; the QP's protection domain; the access right; the
// bounds. On success the region is held and must be released.
func placeTarget(mem Memory, pd, stag uint32, to, n uint64, need Access) (*MR, []byte, error) {
	m := mem.Lookup(stag)
	if m == nil || !m.Valid() {
		return nil, nil, ddp.DDPTaggedInvalidSTag
	}
	if m.PD != pd {
		return nil, nil, ddp.DDPTaggedNotAssoc
	}
	if m.Access&need != need {
		return nil, nil, ddp.RDMAPAccessRights
	}
	if to+n < to {
		return nil, nil, ddp.DDPTaggedTOWrap
	}
	b, ok := m.slice(to, n)
	if !ok {
		return nil, nil, ddp.DDPTaggedBaseOrBounds
	}
	if !m.hold() {
		return nil, nil, ddp.DDPTaggedInvalidSTag
	}
	return m, b, nil
}

// sourceTarget resolves the source of an RDMA Read or the target of an
// atomic: RDMAP checks them (RFC 5040 §7, remote protection errors).
func sourceTarget(mem Memory, pd, stag uint32, to, n uint64, need Access) (*MR, []byte, error) {
	m := mem.Lookup(stag)
	if m == nil || !m.Valid() {
		return nil, nil, ddp.RDMAPInvalidSTag
	}
	if m.PD != pd {
		return nil, nil, ddp.RDMAPSTagNotAssociated
	}
	if m.Access&need != need {
		return nil, nil, ddp.RDMAPAccessRights
	}
	if to+n < to {
		return nil, nil, ddp.RDMAPTOWrap
	}
	b, ok := m.slice(to, n)
	if !ok {
		return nil, nil, ddp.RDMAPBaseOrBounds
	}
	if !m.hold() {
		return nil, nil, ddp.RDMAPInvalidSTag
	}
	return m, b, nil
}
