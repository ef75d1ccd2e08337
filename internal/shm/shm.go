// Package shm holds what softrnicd and its clients share in memory: memfd
// regions, eventfds, and the single-producer single-consumer rings that carry
// work requests to the daemon and events back, so that the data path needs
// no system call.
//
// Ring layout (one memfd, mapped by both sides):
//
//	0    producer index (u32, free-running)
//	64   consumer index (u32, free-running)
//	128  flags (u32): NeedWakeup on request rings, Armed on event rings
//	192  room wanted (u32, event rings): the daemon has events waiting
//	     for room; the client rings the doorbell when it takes one.
//	     Queued (request rings): the endpoint is on its ready queue
//	224  EP state (u32, send rings): the daemon publishes its endpoint's
//	     state (ctl.EP*) here, so that a client checks a post without a
//	     call; advisory (the daemon checks again)
//	256  entries, each EntrySize octets, Entries a power of two
//
// A session's rings are blocks of one region (Heap). An endpoint's two
// request rings are found by the daemon through a ready queue, a ring of
// endpoint slots (ReadyEntrySize octets each) per completion vector: the client
// that posts to rings whose need-wakeup flag is up puts the endpoint's
// slot on the queue unless it is there already (MarkQueued), and rings
// the queue's doorbell if the queue's own need-wakeup flag is up. A
// poller so looks only at the endpoints that have work, never at every
// ring of every session.
//
// Each side keeps its own copy of the ring's geometry and trusts nothing the
// other side writes: an index that claims more entries than the ring holds
// is a protocol violation, and entries are copied out before they are read.
package shm

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Layout constants.
const (
	HeaderSize = 256
	offProd    = 0
	offCons    = 64
	offFlags   = 128
	offWanted  = 192
	offState   = 224

	// NeedWakeup (request rings): the daemon sleeps; ring the doorbell.
	NeedWakeup = 1
	// Armed (event rings): the client waits; signal its eventfd.
	Armed = 1
)

// Errors.
var (
	ErrCorrupt = errors.New("shm: ring indices corrupted by the peer")
	ErrSeals   = errors.New("shm: memfd is not sealed against shrinking")
)

// Ring is one side's view of a ring.
type Ring struct {
	mem       []byte
	entries   uint32
	entrySize int
	// local is this side's own index (producer or consumer), the
	// authoritative copy; the shared one is only published.
	local uint32
}

// RingSize is the memfd size for a ring.
func RingSize(entries uint32, entrySize int) int { return HeaderSize + int(entries)*entrySize }

// NewRing views mem as a ring. entries must be a power of two and mem
// large enough; the caller knows both from its own records, not from mem.
func NewRing(mem []byte, entries uint32, entrySize int) (*Ring, error) {
	if entries == 0 || entries&(entries-1) != 0 || entrySize <= 0 || len(mem) < RingSize(entries, entrySize) {
		return nil, fmt.Errorf("shm: bad ring geometry: %d entries of %d in %d octets", entries, entrySize, len(mem))
	}
	return &Ring{mem: mem, entries: entries, entrySize: entrySize}, nil
}

// Entries is the ring's capacity.
func (r *Ring) Entries() uint32 { return r.entries }

func (r *Ring) word(off int) *uint32 { return (*uint32)(unsafe.Pointer(&r.mem[off])) }

func (r *Ring) slot(i uint32) []byte {
	off := HeaderSize + int(i&(r.entries-1))*r.entrySize
	return r.mem[off : off+r.entrySize : off+r.entrySize]
}

// Producer side.

// Reserve returns the next free entry to fill, or nil when the ring is full.
func (r *Ring) Reserve() ([]byte, error) {
	cons := atomic.LoadUint32(r.word(offCons))
	used := r.local - cons
	if used > r.entries {
		return nil, ErrCorrupt
	}
	if used == r.entries {
		return nil, nil
	}
	return r.slot(r.local), nil
}

// PublishState stores the endpoint's state in the header (the daemon).
func (r *Ring) PublishState(v uint32) { atomic.StoreUint32(r.word(offState), v) }

// State is the state PublishState stored last.
func (r *Ring) State() uint32 { return atomic.LoadUint32(r.word(offState)) }

// Room returns how many entries Reserve can fill before the consumer
// frees more.
func (r *Ring) Room() (int, error) {
	used := r.local - atomic.LoadUint32(r.word(offCons))
	if used > r.entries {
		return 0, ErrCorrupt
	}
	return int(r.entries - used), nil
}

// Commit publishes the entry Reserve returned.
func (r *Ring) Commit() {
	r.local++
	atomic.StoreUint32(r.word(offProd), r.local)
}

// Consumer side.

// Peek returns the next entry to consume, or nil when the ring is empty.
// The entry is in shared memory: copy it before validating it.
func (r *Ring) Peek() ([]byte, error) {
	prod := atomic.LoadUint32(r.word(offProd))
	avail := prod - r.local
	if avail > r.entries {
		return nil, ErrCorrupt
	}
	if avail == 0 {
		return nil, nil
	}
	return r.slot(r.local), nil
}

// Produced returns the producer's published index. Unlike Peek it reads
// only shared words, so a goroutine other than the consumer may ask: a
// change means entries were posted.
func (r *Ring) Produced() uint32 { return atomic.LoadUint32(r.word(offProd)) }

// Consumed returns the consumer's published index; like Produced, safe
// beside the consumer.
func (r *Ring) Consumed() uint32 { return atomic.LoadUint32(r.word(offCons)) }

// Release frees the entry Peek returned.
func (r *Ring) Release() {
	r.local++
	atomic.StoreUint32(r.word(offCons), r.local)
}

// Flags reads the flags word.
func (r *Ring) Flags() uint32 { return atomic.LoadUint32(r.word(offFlags)) }

// SetFlags writes the flags word.
func (r *Ring) SetFlags(v uint32) { atomic.StoreUint32(r.word(offFlags), v) }

// SwapFlags writes the flags word and returns the old value.
func (r *Ring) SwapFlags(v uint32) uint32 { return atomic.SwapUint32(r.word(offFlags), v) }

// WantRoom (producer of an event ring) asks to be woken when the consumer
// takes an entry. Set it, then try Reserve again before sleeping: either
// that finds room or the consumer's RoomWanted sees the request.
func (r *Ring) WantRoom() { atomic.StoreUint32(r.word(offWanted), 1) }

// RoomWanted (consumer) reports, after Release, whether the producer asked
// to be woken, and clears the request: true once per request.
func (r *Ring) RoomWanted() bool {
	return atomic.LoadUint32(r.word(offWanted)) != 0 && atomic.SwapUint32(r.word(offWanted), 0) != 0
}

// MarkQueued (producer of a request ring) reports whether the ring's
// endpoint must go on its ready queue: false while it is there already.
// Commit the entries first: the consumer clears the mark before it looks
// at the rings, so either it sees the entries or the producer sees the
// mark cleared and queues the endpoint again.
func (r *Ring) MarkQueued() bool {
	w := r.word(offWanted)
	return atomic.LoadUint32(w) == 0 && atomic.SwapUint32(w, 1) == 0
}

// ClearQueued (consumer) takes the endpoint off its ready queue, before
// it looks at the rings.
func (r *Ring) ClearQueued() { atomic.StoreUint32(r.word(offWanted), 0) }

// ReadyEntrySize is the size of a ready queue's entry, an endpoint slot.
const ReadyEntrySize = 4

// Push (producer of a ready queue) adds slot; false when the queue is
// full, which a queue as deep as its endpoints are many never is.
func (r *Ring) Push(slot uint32) (bool, error) {
	b, err := r.Reserve()
	if b == nil || err != nil {
		return false, err
	}
	ne.PutUint32(b, slot)
	r.Commit()
	return true, nil
}

// Pop (consumer of a ready queue) takes the next slot.
func (r *Ring) Pop() (slot uint32, ok bool, err error) {
	b, err := r.Peek()
	if b == nil || err != nil {
		return 0, false, err
	}
	slot = ne.Uint32(b)
	r.Release()
	return slot, true, nil
}

// Memfd is a memfd mapped into this process.
type Memfd struct {
	File *os.File
	Mem  []byte
}

// NewMemfd creates, sizes, seals against shrinking (so a peer cannot make
// the mapping fault under the other side) and maps a memfd.
func NewMemfd(name string, size int) (*Memfd, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	if err := f.Truncate(int64(size)); err != nil {
		f.Close()
		return nil, fmt.Errorf("memfd size: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		f.Close()
		return nil, fmt.Errorf("memfd seal: %w", err)
	}
	m, err := Map(f, 0, size)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Memfd{File: f, Mem: m}, nil
}

// Close unmaps and closes.
func (m *Memfd) Close() error {
	err := unix.Munmap(m.Mem)
	if cerr := m.File.Close(); err == nil {
		err = cerr
	}
	return err
}

// CheckSealed verifies that a memfd from the other side cannot shrink below
// end, so mapping [0, end) is safe.
func CheckSealed(f *os.File, end int64) error {
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrSeals, err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return ErrSeals
	}
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() < end {
		return fmt.Errorf("shm: memfd of %d octets, %d needed", st.Size(), end)
	}
	return nil
}

// Map maps length octets of f from offset, shared.
func Map(f *os.File, offset int64, length int) ([]byte, error) {
	m, err := unix.Mmap(int(f.Fd()), offset, length, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap: %w", err)
	}
	return m, nil
}

// Unmap releases a mapping from Map or MapAnon.
func Unmap(b []byte) error { return unix.Munmap(b) }

// MapAnon maps length octets of private anonymous memory that reserves no
// swap: pages cost memory only once touched.
func MapAnon(length int) ([]byte, error) {
	m, err := unix.Mmap(-1, 0, length, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("mmap: %w", err)
	}
	return m, nil
}

// NewEventfd returns a non-blocking eventfd as a file Go's poller can wait
// on.
func NewEventfd() (*os.File, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	return os.NewFile(uintptr(fd), "eventfd"), nil
}

var one = [8]byte{1}

// Signal adds one to an eventfd.
func Signal(f *os.File) error {
	_, err := f.Write(one[:])
	return err
}

// Wait blocks until an eventfd is signalled and resets it.
func Wait(f *os.File) error {
	var b [8]byte
	_, err := f.Read(b[:])
	return err
}
