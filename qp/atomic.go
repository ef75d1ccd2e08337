package qp

import (
	"encoding/binary"
	"sync"
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
		nv, store, err := atomicResult(old, f)
		if err != nil || !store {
			return old, err
		}
		if atomic.CompareAndSwapUint64(p, old, nv) {
			return old, nil
		}
	}
}

// atomicResult is what an atomic makes of the target's value old: the new
// value, and whether it is stored (a Compare and Swap that does not match
// stores nothing).
func atomicResult(old uint64, f *ddp.AtomicRequestFields) (nv uint64, store bool, err error) {
	switch f.Op {
	case ddp.AtomicFetchAdd:
		return maskedAdd(old, f.AddSwapData, f.AddSwapMask), true, nil
	case ddp.AtomicCmpSwap:
		if (old^f.CompareData)&f.CompareMask != 0 {
			return old, false, nil
		}
		return old&^f.AddSwapMask | f.AddSwapData&f.AddSwapMask, true, nil
	}
	return 0, false, ddp.RDMAPUnexpectedOpcode
}

// procAtomicMu makes the atomics on process-backed regions atomic with
// respect to each other, whatever region or QP they come through: each
// reads the target from the process, operates and writes it back under
// it. Atomics are rare and short, and no other path takes it. (Nothing
// makes them atomic with respect to the process's own stores, as with an
// RNIC's atomics and the host CPU's.)
var procAtomicMu sync.Mutex

// executeProcAtomic is executeAtomic on target, a part of the shadow of m,
// a process-backed region: word, the request's own 8 octets, carries the
// value, as the shadow may be filled for a Read of the same octets
// meanwhile.
func executeProcAtomic(m *MR, target []byte, word *[8]byte, f *ddp.AtomicRequestFields) (uint64, error) {
	procAtomicMu.Lock()
	defer procAtomicMu.Unlock()
	addr := m.procAddr(target)
	if err := m.Proc.ReadAt(word[:], addr); err != nil {
		return 0, err
	}
	old := binary.NativeEndian.Uint64(word[:])
	nv, store, err := atomicResult(old, f)
	if err != nil || !store {
		return old, err
	}
	binary.NativeEndian.PutUint64(word[:], nv)
	return old, m.Proc.WriteAt(word[:], addr)
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
