package xsk

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Desc is an RX or TX descriptor (struct xdp_desc): a packet of Len bytes at
// UMEM address Addr.
type Desc struct {
	// Addr is the UMEM offset of the packet's first byte. On RX it includes
	// the UMEM headroom and the kernel's XDP headroom.
	Addr uint64
	// Len is the packet's length in bytes.
	Len uint32
	// Options carries XDP_PKT_CONTD for multi-buffer packets (not used by
	// this package's sockets) and TX metadata flags; zero otherwise.
	Options uint32
}

// Sizes of ring entries.
const (
	addrSize = uint32(unsafe.Sizeof(uint64(0)))
	descSize = uint32(unsafe.Sizeof(Desc{}))
)

// ringOffsets says where a ring's fields lie in its mapping; the kernel
// reports them per ring with getsockopt(XDP_MMAP_OFFSETS).
type ringOffsets = unix.XDPRingOffset

// ring is what producer and consumer rings share: the mapped indices and
// flags, and the geometry.
type ring struct {
	producer *uint32 // written by the producer, read by the consumer
	consumer *uint32 // written by the consumer, read by the producer
	flags    *uint32 // XDP_RING_NEED_WAKEUP, written by the kernel
	mask     uint32  // size-1
	size     uint32  // entries, a power of two
	desc     unsafe.Pointer
}

// attach points r at a ring of size entries of entrySize bytes laid out in
// mem as off says. It checks bounds and alignment; it reads nothing.
func (r *ring) attach(mem []byte, off ringOffsets, size, entrySize uint32) error {
	if !isPowerOfTwo(size) {
		return fmt.Errorf("ring size %d is not a power of two", size)
	}
	n := uint64(len(mem))
	for _, f := range []uint64{off.Producer, off.Consumer, off.Flags} {
		if f%4 != 0 || f+4 > n {
			return fmt.Errorf("ring field at offset %d outside %d-byte mapping or misaligned", f, n)
		}
	}
	if off.Desc%8 != 0 || off.Desc+uint64(size)*uint64(entrySize) > n {
		return fmt.Errorf("ring of %d entries at offset %d does not fit %d-byte mapping", size, off.Desc, n)
	}
	base := unsafe.Pointer(unsafe.SliceData(mem))
	if uintptr(base)%8 != 0 {
		return fmt.Errorf("ring mapping at %p is not 8-byte aligned", base)
	}
	r.producer = (*uint32)(unsafe.Add(base, off.Producer))
	r.consumer = (*uint32)(unsafe.Add(base, off.Consumer))
	r.flags = (*uint32)(unsafe.Add(base, off.Flags))
	r.desc = unsafe.Add(base, off.Desc)
	r.size = size
	r.mask = size - 1
	return nil
}

// detach drops the pointers into the mapping, so that a use after Close
// panics on a nil pointer instead of faulting on unmapped memory.
func (r *ring) detach() {
	*r = ring{}
}

// needWakeup reports whether the kernel asked to be woken up for this ring.
func (r *ring) needWakeup() bool {
	return atomic.LoadUint32(r.flags)&unix.XDP_RING_NEED_WAKEUP != 0
}

// prodRing is the producer side: entries [tail, head) are reserved and being
// written, [cachedCons, tail) are published and not yet consumed as far as we
// know.
type prodRing struct {
	ring
	head       uint32 // next index to reserve
	tail       uint32 // producer index as last published
	cachedCons uint32 // consumer index as last read
}

func (r *prodRing) init() {
	r.tail = atomic.LoadUint32(r.producer)
	r.head = r.tail
	r.cachedCons = atomic.LoadUint32(r.consumer)
}

// reserve claims up to n free slots, re-reading the consumer index only when
// the cached one does not show n free.
func (r *prodRing) reserve(n uint32) (idx, count uint32) {
	free := r.size - (r.head - r.cachedCons)
	if free < n {
		r.cachedCons = atomic.LoadUint32(r.consumer)
		free = r.size - (r.head - r.cachedCons)
	}
	count = min(n, free)
	idx = r.head
	r.head += count
	return idx, count
}

// free returns how many slots a reserve could claim now.
func (r *prodRing) free() uint32 {
	r.cachedCons = atomic.LoadUint32(r.consumer)
	return r.size - (r.head - r.cachedCons)
}

// submit publishes the count oldest reserved slots. The descriptor writes
// before it happen before the consumer's load of the new index.
func (r *prodRing) submit(count uint32) {
	if count > r.head-r.tail {
		panic(fmt.Sprintf("xsk: submit of %d entries with %d reserved", count, r.head-r.tail))
	}
	if count == 0 {
		return
	}
	r.tail += count
	atomic.StoreUint32(r.producer, r.tail)
}

// cancel gives back the count newest reserved, unsubmitted slots.
func (r *prodRing) cancel(count uint32) {
	if count > r.head-r.tail {
		panic(fmt.Sprintf("xsk: cancel of %d entries with %d reserved", count, r.head-r.tail))
	}
	r.head -= count
}

// consRing is the consumer side: entries [tail, head) are peeked and being
// read, [head, cachedProd) are available as far as we know.
type consRing struct {
	ring
	head       uint32 // next index to peek
	tail       uint32 // consumer index as last published
	cachedProd uint32 // producer index as last read
}

func (r *consRing) init() {
	r.tail = atomic.LoadUint32(r.consumer)
	r.head = r.tail
	r.cachedProd = atomic.LoadUint32(r.producer)
}

// peek claims up to n filled entries, re-reading the producer index only
// when the cached one does not show n available. The producer's descriptor
// writes happen before our reads of the entries returned.
func (r *consRing) peek(n uint32) (idx, count uint32) {
	avail := r.cachedProd - r.head
	if avail < n {
		r.cachedProd = atomic.LoadUint32(r.producer)
		avail = r.cachedProd - r.head
	}
	count = min(n, avail)
	idx = r.head
	r.head += count
	return idx, count
}

// release hands the count oldest peeked entries back to the producer. Our
// reads of them happen before the producer's load of the new index.
func (r *consRing) release(count uint32) {
	if count > r.head-r.tail {
		panic(fmt.Sprintf("xsk: release of %d entries with %d peeked", count, r.head-r.tail))
	}
	if count == 0 {
		return
	}
	r.tail += count
	atomic.StoreUint32(r.consumer, r.tail)
}

func (r *ring) addrs() []uint64 { return unsafe.Slice((*uint64)(r.desc), r.size) }
func (r *ring) descs() []Desc   { return unsafe.Slice((*Desc)(r.desc), r.size) }

// FillQueue is the fill ring: we give the kernel frame addresses to receive
// into. It is not safe for concurrent use.
type FillQueue struct {
	prodRing
	entries []uint64
}

func (q *FillQueue) attach(mem []byte, off ringOffsets, size uint32) error {
	if err := q.ring.attach(mem, off, size, addrSize); err != nil {
		return err
	}
	q.entries = q.addrs()
	q.init()
	return nil
}

func (q *FillQueue) detach() { q.ring.detach(); q.entries = nil }

// Reserve claims up to n free slots and returns the index of the first and
// how many it got (0 when the ring is full). Write them with Set and publish
// them with Submit.
func (q *FillQueue) Reserve(n uint32) (idx, count uint32) { return q.reserve(n) }

// Set writes frame address addr into slot idx, which Reserve returned. The
// frame passes to the kernel at Submit.
func (q *FillQueue) Set(idx uint32, addr uint64) { q.entries[idx&q.mask] = addr }

// Submit publishes the count oldest reserved slots to the kernel.
func (q *FillQueue) Submit(count uint32) { q.submit(count) }

// Cancel gives back the count newest reserved slots without publishing them.
func (q *FillQueue) Cancel(count uint32) { q.cancel(count) }

// Free returns how many slots are free now, reading the kernel's index.
func (q *FillQueue) Free() uint32 { return q.free() }

// Size returns the number of slots in the ring.
func (q *FillQueue) Size() uint32 { return q.size }

// NeedWakeup reports whether the kernel has run out of fill entries and
// waits for a wakeup (Socket.KickFill) after new ones are submitted. It is
// only set on sockets bound with need_wakeup.
func (q *FillQueue) NeedWakeup() bool { return q.needWakeup() }

// Refill moves up to limit frames from fl into the ring and publishes them,
// returning how many it moved.
func (q *FillQueue) Refill(fl *FreeList, limit uint32) uint32 {
	idx, n := q.reserve(min(limit, uint32(fl.Len())))
	for i := uint32(0); i < n; i++ {
		addr, _ := fl.Alloc()
		q.entries[(idx+i)&q.mask] = addr
	}
	q.submit(n)
	return n
}

// CompletionQueue is the completion ring: the kernel returns the addresses
// of frames it has transmitted. It is not safe for concurrent use.
type CompletionQueue struct {
	consRing
	entries []uint64
}

func (q *CompletionQueue) attach(mem []byte, off ringOffsets, size uint32) error {
	if err := q.ring.attach(mem, off, size, addrSize); err != nil {
		return err
	}
	q.entries = q.addrs()
	q.init()
	return nil
}

func (q *CompletionQueue) detach() { q.ring.detach(); q.entries = nil }

// Peek claims up to n completed addresses and returns the index of the first
// and how many it got (0 when the ring is empty). Read them with Get and
// hand the slots back with Release.
func (q *CompletionQueue) Peek(n uint32) (idx, count uint32) { return q.peek(n) }

// Get returns the frame address in slot idx, which Peek returned. The frame
// belongs to the caller from Peek on.
func (q *CompletionQueue) Get(idx uint32) uint64 { return q.entries[idx&q.mask] }

// Release hands the count oldest peeked slots back to the kernel.
func (q *CompletionQueue) Release(count uint32) { q.release(count) }

// Size returns the number of slots in the ring.
func (q *CompletionQueue) Size() uint32 { return q.size }

// Drain moves up to limit completed frames into fl, returning how many.
func (q *CompletionQueue) Drain(fl *FreeList, limit uint32) uint32 {
	idx, n := q.peek(limit)
	for i := uint32(0); i < n; i++ {
		fl.Free(q.entries[(idx+i)&q.mask])
	}
	q.release(n)
	return n
}

// RXQueue is the RX ring: the kernel hands us received packets. It is not
// safe for concurrent use.
type RXQueue struct {
	consRing
	entries []Desc
}

func (q *RXQueue) attach(mem []byte, off ringOffsets, size uint32) error {
	if err := q.ring.attach(mem, off, size, descSize); err != nil {
		return err
	}
	q.entries = q.descs()
	q.init()
	return nil
}

func (q *RXQueue) detach() { q.ring.detach(); q.entries = nil }

// Peek claims up to n received descriptors and returns the index of the
// first and how many it got (0 when the ring is empty). Read them with Get
// and hand the slots back with Release.
func (q *RXQueue) Peek(n uint32) (idx, count uint32) { return q.peek(n) }

// Get returns the descriptor in slot idx, which Peek returned. Its frame
// belongs to the caller from Peek on; releasing the slot does not return the
// frame to the kernel (the fill ring does).
func (q *RXQueue) Get(idx uint32) Desc { return q.entries[idx&q.mask] }

// Release hands the count oldest peeked slots back to the kernel.
func (q *RXQueue) Release(count uint32) { q.release(count) }

// Size returns the number of slots in the ring.
func (q *RXQueue) Size() uint32 { return q.size }

// TXQueue is the TX ring: we hand the kernel packets to send. It is not safe
// for concurrent use.
type TXQueue struct {
	prodRing
	entries    []Desc
	alwaysKick bool // bound without need_wakeup: every Submit needs a Kick
}

func (q *TXQueue) attach(mem []byte, off ringOffsets, size uint32) error {
	if err := q.ring.attach(mem, off, size, descSize); err != nil {
		return err
	}
	q.entries = q.descs()
	q.init()
	return nil
}

func (q *TXQueue) detach() { q.ring.detach(); q.entries = nil }

// Reserve claims up to n free slots and returns the index of the first and
// how many it got (0 when the ring is full). Write them with Set and publish
// them with Submit.
func (q *TXQueue) Reserve(n uint32) (idx, count uint32) { return q.reserve(n) }

// Set writes d into slot idx, which Reserve returned. The frame passes to the
// kernel at Submit and comes back on the completion ring.
func (q *TXQueue) Set(idx uint32, d Desc) { q.entries[idx&q.mask] = d }

// Submit publishes the count oldest reserved slots to the kernel. In copy
// mode, and whenever NeedWakeup says so, the kernel sends them only when
// kicked (Socket.Kick).
func (q *TXQueue) Submit(count uint32) { q.submit(count) }

// Cancel gives back the count newest reserved slots without publishing them.
func (q *TXQueue) Cancel(count uint32) { q.cancel(count) }

// Free returns how many slots are free now, reading the kernel's index.
func (q *TXQueue) Free() uint32 { return q.free() }

// Size returns the number of slots in the ring.
func (q *TXQueue) Size() uint32 { return q.size }

// NeedWakeup reports whether the kernel waits for Socket.Kick to send what
// was submitted: the ring's flag on a socket bound with need_wakeup (in copy
// mode the flag is always set), and always true on a socket bound without.
func (q *TXQueue) NeedWakeup() bool { return q.alwaysKick || q.needWakeup() }

func isPowerOfTwo(n uint32) bool { return n != 0 && n&(n-1) == 0 }
