package shm

import (
	"fmt"
	"math/bits"
	"os"

	"golang.org/x/sys/unix"
)

// Heap carves one shared region into the rings of a session: a buddy
// allocator of power-of-two blocks, so that ten thousand endpoints cost
// one memfd and one mapping instead of ten thousand of each, and rings
// sit back to back (a small ring needs no page of its own). The region
// is sparse: only pages a ring touches take memory, and a freed block
// that is, or merges into, a whole page or more is punched out of the
// memfd (MADV_REMOVE), so memory returns to the system however many
// endpoints came and went. Not safe for concurrent use: the daemon's
// session lock guards it.
type Heap struct {
	mem      []byte
	minOrder int
	// free[o] holds the offsets of the free blocks of 1<<(minOrder+o)
	// octets; a block's buddy is found by offset when it is freed.
	free []map[uint32]struct{}
	page int
	used int
}

// NewHeap carves mem, whose length is a power of two of at least
// minBlock (itself a power of two) and at most 2 GiB.
func NewHeap(mem []byte, minBlock int) (*Heap, error) {
	if minBlock <= 0 || minBlock&(minBlock-1) != 0 || len(mem) < minBlock || len(mem)&(len(mem)-1) != 0 || uint64(len(mem)) > 1<<31 {
		return nil, fmt.Errorf("shm: heap of %d octets in blocks of %d", len(mem), minBlock)
	}
	h := &Heap{mem: mem, minOrder: bits.TrailingZeros(uint(minBlock)), page: os.Getpagesize()}
	h.free = make([]map[uint32]struct{}, bits.TrailingZeros(uint(len(mem)))-h.minOrder+1)
	for i := range h.free {
		h.free[i] = map[uint32]struct{}{}
	}
	h.free[len(h.free)-1][0] = struct{}{}
	return h, nil
}

// order is the free-list index of a block holding n octets, -1 when none
// is large enough.
func (h *Heap) order(n int) int {
	o := 0
	if n > 1<<h.minOrder {
		o = bits.Len(uint(n-1)) - h.minOrder
	}
	if o >= len(h.free) {
		return -1
	}
	return o
}

func (h *Heap) size(o int) int { return 1 << (h.minOrder + o) }

// Alloc returns the offset of a free block of at least n octets, whose
// first HeaderSize octets are zero (a ring's indices and flags start at
// zero whoever used the block before); ok is false when the region is
// full.
func (h *Heap) Alloc(n int) (off uint32, ok bool) {
	want := h.order(n)
	if want < 0 || n <= 0 {
		return 0, false
	}
	o := want
	for o < len(h.free) && len(h.free[o]) == 0 {
		o++
	}
	if o == len(h.free) {
		return 0, false
	}
	for off = range h.free[o] {
		break
	}
	delete(h.free[o], off)
	// Split down to the size wanted, the upper halves staying free.
	for o > want {
		o--
		h.free[o][off+uint32(h.size(o))] = struct{}{}
	}
	clear(h.mem[off : int(off)+min(HeaderSize, h.size(want))])
	h.used += h.size(want)
	return off, true
}

// Free returns the block at off that Alloc gave for n octets.
func (h *Heap) Free(off uint32, n int) {
	o := h.order(n)
	if o < 0 || int(off)%h.size(o) != 0 {
		panic(fmt.Sprintf("shm: free of %d octets at %#x", n, off))
	}
	h.used -= h.size(o)
	// A page or more that a ring used goes back to the system now; a
	// smaller block once its buddies make up a whole page (below). The
	// free blocks it merges with were punched when they were freed.
	if h.size(o) >= h.page {
		h.punch(off, h.size(o))
	}
	for o < len(h.free)-1 {
		buddy := off ^ uint32(h.size(o))
		if _, ok := h.free[o][buddy]; !ok {
			break
		}
		delete(h.free[o], buddy)
		off = min(off, buddy)
		o++
		if h.size(o) == h.page {
			h.punch(off, h.page)
		}
	}
	h.free[o][off] = struct{}{}
}

// punch gives the pages of a free block back: reading them yields zeros,
// in both processes.
func (h *Heap) punch(off uint32, n int) {
	_ = unix.Madvise(h.mem[off:int(off)+n], unix.MADV_REMOVE)
}

// Used is the octets allocated.
func (h *Heap) Used() int { return h.used }

// Mem is the block at off of n octets.
func (h *Heap) Mem(off uint32, n int) []byte { return h.mem[off : int(off)+n : int(off)+n] }
