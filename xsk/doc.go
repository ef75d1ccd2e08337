// Package xsk is the project's AF_XDP layer: UMEM, the four rings (fill,
// completion, RX, TX), need_wakeup, batching and statistics, written on
// golang.org/x/sys/unix. It knows no protocol: frames are bytes at addresses
// in the UMEM.
//
// # Pieces
//
//   - UMEM (umem.go): a memfd-backed region of equal frames. It is registered
//     with the kernel (XDP_UMEM_REG) on the first socket made over it, so the
//     registration socket lives in that socket's network namespace.
//   - Socket (socket.go): one AF_XDP socket bound to (ifindex, queue id) with
//     its RX and TX rings. Every socket over a UMEM after the first binds with
//     XDP_SHARED_UMEM. A socket on a queue that no other socket of the UMEM
//     uses gets its own fill and completion rings (the kernel requires this
//     since 5.10); a socket on a queue already used shares that socket's
//     buffer pool and with it its fill and completion rings.
//   - Rings (ring.go): FillQueue and TXQueue are produced by us, RXQueue and
//     CompletionQueue by the kernel. They are views over memory with no
//     kernel calls, so they are tested over plain memory.
//   - FreeList (freelist.go): a LIFO of free frame addresses.
//
// # Batching
//
// Every ring is driven in batches, with cached copies of the other side's
// index refreshed only when the cache cannot satisfy a request, and our own
// index published once per batch:
//
//	idx, n := rx.Peek(64)             // consumer: claim up to 64 entries
//	for i := uint32(0); i < n; i++ {
//		d := rx.Get(idx + i)           // read descriptor idx+i
//		...
//	}
//	rx.Release(n)                     // hand the slots back to the kernel
//
//	idx, n = tx.Reserve(k)            // producer: claim up to k free slots
//	for i := uint32(0); i < n; i++ {
//		tx.Set(idx+i, desc)            // write descriptor idx+i
//	}
//	tx.Submit(n)                      // publish them to the kernel
//	if tx.NeedWakeup() {
//		s.Kick()
//	}
//
// Indices are free-running 32-bit counters that wrap; only their difference
// is meaningful, and a ring's size is a power of two so that index&mask is
// the slot.
//
// # Frame ownership
//
// A frame address is owned by exactly one party at a time: a FreeList (or
// whatever the caller keeps), the kernel (from fill-ring Submit until it comes
// back on the RX ring; from TX Submit until it comes back on the completion
// ring), or the caller (from RX or completion Peek until it passes the frame
// on). The package checks none of this on the data path; FreeList panics on a
// double free.
//
// # Goroutines
//
// The package starts no goroutine. A Socket's rings, and a FreeList, belong
// to one goroutine (a poller) and are not safe for concurrent use; sockets
// that share a queue share its fill and completion rings, so they belong to
// the same goroutine too. NewSocket, Socket.Close and UMEM.Close may be
// called from any goroutine, but a socket must not be closed while its owner
// still uses its rings.
//
// Raw system calls stay in this package (sys.go); callers see typed methods.
package xsk
