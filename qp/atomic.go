package qp

import (
	"sync/atomic"
	"unsafe"

	"github.com/softrnic/softrnic/ddp"
)

// executeAtomic performs an RFC 7306 atomic on the 8 octets of target, in
// host byte order, atomically with respect to every other atomic of this
// host (they all use the processor's compare-and-swap), and returns the
// original value.
func executeAtomic(target []byte, f *ddp.AtomicRequestFields) (uint64, error) {
	if len(target) != 8 || uintptr(unsafe.Pointer(&target[0]))%8 != 0 {
		return 0, ddp.RDMAPCatastrophicLocalStream
	}
	p := (*uint64)(unsafe.Pointer(&target[0]))
	for {
		old := atomic.LoadUint64(p)
		var nv uint64
		switch f.Op {
		case ddp.AtomicFetchAdd:
			nv = maskedAdd(old, f.AddSwapData, f.AddSwapMask)
		case ddp.AtomicCmpSwap:
			if (old^f.CompareData)&f.CompareMask != 0 {
				return old, nil
			}
			nv = old&^f.AddSwapMask | f.AddSwapData&f.AddSwapMask
		default:
			return 0, ddp.RDMAPUnexpectedOpcode
		}
		if atomic.CompareAndSwapUint64(p, old, nv) {
			return old, nil
		}
	}
}

// maskedAdd adds b to a as independent fields: a 1 in mask marks the most
// significant bit of a field, and the carry out of it is dropped (RFC 7306
// §5.1.1). A zero mask is a plain 64-bit add.
func maskedAdd(a, b, mask uint64) uint64 {
	if mask == 0 {
		return a + b
	}
	var sum, carry uint64
	for i := uint(0); i < 64; i++ {
		x, y := a>>i&1, b>>i&1
		sum |= (x ^ y ^ carry) << i
		carry = x&y | x&carry | y&carry
		if mask>>i&1 != 0 {
			carry = 0
		}
	}
	return sum
}
