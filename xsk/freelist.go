package xsk

import (
	"fmt"
	"math/bits"
)

// FreeList holds the addresses of free UMEM frames, last freed first out (the
// frame most recently touched is the warmest in cache). It covers a range of
// frames, so that pollers sharing one UMEM each own a disjoint part of it. It
// is not safe for concurrent use.
//
// Addresses handed out are frame bases. Free takes any address inside a
// frame, as RX descriptors (which include headroom) and completion entries
// carry, and panics when the frame is outside the list's range or already
// free: either is a broken ownership invariant.
type FreeList struct {
	stack []uint64
	free  []uint64 // bit per frame of the range: set while on the stack
	shift uint     // log2 of the frame size: frame numbers without a division
	first uint64   // frame number of the range's first frame
	count uint64
}

// NewFreeList returns a list holding frames first to first+count-1 of a UMEM
// whose frames are frameSize bytes (a power of two), all free.
func NewFreeList(frameSize, first, count uint32) *FreeList {
	if !isPowerOfTwo(frameSize) {
		panic(fmt.Sprintf("xsk: frame size %d is not a power of two", frameSize))
	}
	f := &FreeList{
		stack: make([]uint64, 0, count),
		free:  make([]uint64, (count+63)/64),
		shift: uint(bits.TrailingZeros32(frameSize)),
		first: uint64(first),
		count: uint64(count),
	}
	// Push in reverse so that Alloc hands out the lowest address first.
	for i := int64(count) - 1; i >= 0; i-- {
		f.stack = append(f.stack, (f.first+uint64(i))<<f.shift)
		f.free[i/64] |= 1 << (i % 64)
	}
	return f
}

// Alloc takes a free frame and returns its base address; ok is false when
// none is left.
func (f *FreeList) Alloc() (addr uint64, ok bool) {
	n := len(f.stack)
	if n == 0 {
		return 0, false
	}
	addr = f.stack[n-1]
	f.stack = f.stack[:n-1]
	i := addr>>f.shift - f.first
	f.free[i/64] &^= 1 << (i % 64)
	return addr, true
}

// AllocN fills dst with free frame addresses and returns how many it wrote.
func (f *FreeList) AllocN(dst []uint64) int {
	n := 0
	for n < len(dst) {
		a, ok := f.Alloc()
		if !ok {
			break
		}
		dst[n] = a
		n++
	}
	return n
}

// Free returns the frame that contains addr to the list.
func (f *FreeList) Free(addr uint64) {
	base := addr >> f.shift << f.shift
	i := addr>>f.shift - f.first // wraps to a huge value below the range
	if i >= f.count {
		panic(fmt.Sprintf("xsk: free of address %#x outside frames %d..%d", addr, f.first, f.first+f.count-1))
	}
	bit := uint64(1) << (i % 64)
	if f.free[i/64]&bit != 0 {
		panic(fmt.Sprintf("xsk: double free of frame at %#x", base))
	}
	f.free[i/64] |= bit
	f.stack = append(f.stack, base)
}

// Len returns the number of free frames.
func (f *FreeList) Len() int { return len(f.stack) }

// Cap returns the number of frames in the list's range.
func (f *FreeList) Cap() int { return int(f.count) }
