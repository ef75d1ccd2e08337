package xsk

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// The rings are tested over plain memory laid out as the kernel lays out a
// ring mapping, with a fake kernel on the other side that uses the same
// atomics the kernel's smp_load_acquire/smp_store_release pair with.

var testOffsets = ringOffsets{Producer: 0, Consumer: 64, Flags: 128, Desc: 192}

// ringMem is ring memory with the fake kernel's view of it.
type ringMem struct {
	mem       []byte
	size      uint32
	entrySize uint32
}

// newRingMem returns 8-byte aligned memory for a ring whose indices start
// at start.
func newRingMem(size, entrySize, start uint32) *ringMem {
	n := int(testOffsets.Desc) + int(size*entrySize)
	words := make([]uint64, (n+7)/8)
	m := &ringMem{
		mem:       unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8),
		size:      size,
		entrySize: entrySize,
	}
	atomic.StoreUint32(m.prod(), start)
	atomic.StoreUint32(m.cons(), start)
	return m
}

func (m *ringMem) prod() *uint32  { return (*uint32)(unsafe.Pointer(&m.mem[testOffsets.Producer])) }
func (m *ringMem) cons() *uint32  { return (*uint32)(unsafe.Pointer(&m.mem[testOffsets.Consumer])) }
func (m *ringMem) flags() *uint32 { return (*uint32)(unsafe.Pointer(&m.mem[testOffsets.Flags])) }
func (m *ringMem) slot(i uint32) unsafe.Pointer {
	return unsafe.Pointer(&m.mem[int(testOffsets.Desc)+int((i&(m.size-1))*m.entrySize)])
}

// kernelProduce plays the kernel producing into a consumer ring (RX,
// completion): it writes up to len(vals) entries that fit and publishes
// them. Each value becomes an address, or a Desc with that address and
// length.
func (m *ringMem) kernelProduce(vals []uint64) int {
	prod := atomic.LoadUint32(m.prod()) // the kernel's own index
	cons := atomic.LoadUint32(m.cons())
	n := min(uint32(len(vals)), m.size-(prod-cons))
	for i := uint32(0); i < n; i++ {
		if m.entrySize == addrSize {
			*(*uint64)(m.slot(prod + i)) = vals[i]
		} else {
			*(*Desc)(m.slot(prod + i)) = Desc{Addr: vals[i], Len: uint32(vals[i])}
		}
	}
	atomic.StoreUint32(m.prod(), prod+n)
	return int(n)
}

// kernelConsume plays the kernel consuming from a producer ring (fill, TX):
// it reads up to max published entries and releases them.
func (m *ringMem) kernelConsume(max int) []uint64 {
	cons := atomic.LoadUint32(m.cons())
	prod := atomic.LoadUint32(m.prod())
	n := min(uint32(max), prod-cons)
	out := make([]uint64, n)
	for i := uint32(0); i < n; i++ {
		if m.entrySize == addrSize {
			out[i] = *(*uint64)(m.slot(cons + i))
		} else {
			d := *(*Desc)(m.slot(cons + i))
			out[i] = d.Addr
		}
	}
	atomic.StoreUint32(m.cons(), cons+n)
	return out
}

func newFill(t testing.TB, size, start uint32) (*FillQueue, *ringMem) {
	t.Helper()
	m := newRingMem(size, addrSize, start)
	var q FillQueue
	if err := q.attach(m.mem, testOffsets, size); err != nil {
		t.Fatal(err)
	}
	return &q, m
}

func newTX(t testing.TB, size, start uint32) (*TXQueue, *ringMem) {
	t.Helper()
	m := newRingMem(size, descSize, start)
	var q TXQueue
	if err := q.attach(m.mem, testOffsets, size); err != nil {
		t.Fatal(err)
	}
	return &q, m
}

func newRX(t testing.TB, size, start uint32) (*RXQueue, *ringMem) {
	t.Helper()
	m := newRingMem(size, descSize, start)
	var q RXQueue
	if err := q.attach(m.mem, testOffsets, size); err != nil {
		t.Fatal(err)
	}
	return &q, m
}

func newCompletion(t testing.TB, size, start uint32) (*CompletionQueue, *ringMem) {
	t.Helper()
	m := newRingMem(size, addrSize, start)
	var q CompletionQueue
	if err := q.attach(m.mem, testOffsets, size); err != nil {
		t.Fatal(err)
	}
	return &q, m
}

func TestRingAttachChecks(t *testing.T) {
	m := newRingMem(8, descSize, 0)
	var q RXQueue
	for _, tc := range []struct {
		name string
		mem  []byte
		off  ringOffsets
		size uint32
		want string
	}{
		{"not a power of two", m.mem, testOffsets, 6, "power of two"},
		{"zero entries", m.mem, testOffsets, 0, "power of two"},
		{"too many entries", m.mem, testOffsets, 16, "does not fit"},
		{"short mapping", m.mem[:100], testOffsets, 8, "outside"},
		{"misaligned index", m.mem, ringOffsets{Producer: 2, Consumer: 64, Flags: 128, Desc: 192}, 8, "misaligned"},
		{"misaligned descriptors", m.mem[:len(m.mem)-8], ringOffsets{Producer: 0, Consumer: 64, Flags: 128, Desc: 188}, 8, "does not fit"},
		{"unaligned base", m.mem[4:], testOffsets, 4, "aligned"},
	} {
		err := q.attach(tc.mem, tc.off, tc.size)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: attach error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
	if err := q.attach(m.mem, testOffsets, 8); err != nil {
		t.Fatalf("valid ring: %v", err)
	}
}

func TestProducerFullAndEmpty(t *testing.T) {
	q, m := newFill(t, 8, 0)
	if q.Size() != 8 || q.Free() != 8 {
		t.Fatalf("size %d free %d, want 8 8", q.Size(), q.Free())
	}
	idx, n := q.Reserve(10)
	if idx != 0 || n != 8 {
		t.Fatalf("Reserve(10) on empty ring of 8 = (%d, %d), want (0, 8)", idx, n)
	}
	for i := uint32(0); i < n; i++ {
		q.Set(idx+i, uint64(i)*4096)
	}
	if _, n := q.Reserve(1); n != 0 {
		t.Fatalf("Reserve on a ring with every slot reserved got %d", n)
	}
	if got := atomic.LoadUint32(m.prod()); got != 0 {
		t.Fatalf("producer published %d before Submit", got)
	}
	q.Submit(8)
	if got := atomic.LoadUint32(m.prod()); got != 8 {
		t.Fatalf("producer %d after Submit(8), want 8", got)
	}
	if _, n := q.Reserve(1); n != 0 {
		t.Fatalf("Reserve on a full ring got %d", n)
	}
	got := m.kernelConsume(3)
	for i, a := range got {
		if a != uint64(i)*4096 {
			t.Fatalf("kernel read %#x at %d, want %#x", a, i, uint64(i)*4096)
		}
	}
	idx, n = q.Reserve(5)
	if idx != 8 || n != 3 {
		t.Fatalf("Reserve(5) after the kernel took 3 = (%d, %d), want (8, 3)", idx, n)
	}
	q.Cancel(2)
	if idx, n := q.Reserve(2); idx != 9 || n != 2 {
		t.Fatalf("Reserve(2) after Cancel(2) = (%d, %d), want (9, 2)", idx, n)
	}
	q.Submit(3)
	if got := atomic.LoadUint32(m.prod()); got != 11 {
		t.Fatalf("producer %d, want 11", got)
	}
	if q.Free() != 0 {
		t.Fatalf("Free %d on a full ring", q.Free())
	}
}

func TestConsumerFullAndEmpty(t *testing.T) {
	q, m := newRX(t, 4, 0)
	if _, n := q.Peek(1); n != 0 {
		t.Fatalf("Peek on an empty ring got %d", n)
	}
	if n := m.kernelProduce([]uint64{10, 11, 12, 13, 14}); n != 4 {
		t.Fatalf("kernel put %d entries into a ring of 4", n)
	}
	idx, n := q.Peek(8)
	if idx != 0 || n != 4 {
		t.Fatalf("Peek(8) = (%d, %d), want (0, 4)", idx, n)
	}
	for i := uint32(0); i < n; i++ {
		if d := q.Get(idx + i); d.Addr != uint64(10+i) || d.Len != 10+i {
			t.Fatalf("entry %d = %+v", i, d)
		}
	}
	if k := m.kernelProduce([]uint64{99}); k != 0 {
		t.Fatal("kernel overwrote peeked, unreleased entries")
	}
	q.Release(1)
	if got := atomic.LoadUint32(m.cons()); got != 1 {
		t.Fatalf("consumer %d after Release(1), want 1", got)
	}
	if k := m.kernelProduce([]uint64{14}); k != 1 {
		t.Fatal("kernel found no room after Release")
	}
	q.Release(3)
	idx, n = q.Peek(8)
	if idx != 4 || n != 1 || q.Get(idx).Addr != 14 {
		t.Fatalf("Peek after refill = (%d, %d)", idx, n)
	}
	q.Release(n)
	if _, n := q.Peek(1); n != 0 {
		t.Fatalf("Peek on a drained ring got %d", n)
	}
}

// TestCachedIndices checks that the other side's index is read only when the
// cached copy cannot satisfy a request.
func TestCachedIndices(t *testing.T) {
	t.Run("consumer", func(t *testing.T) {
		q, m := newCompletion(t, 16, 0)
		m.kernelProduce([]uint64{0, 1, 2, 3})
		if _, n := q.Peek(2); n != 2 { // cache empty: reads the producer
			t.Fatalf("Peek(2) = %d", n)
		}
		m.kernelProduce([]uint64{4, 5, 6, 7})
		if _, n := q.Peek(2); n != 2 || q.cachedProd != 4 {
			t.Fatalf("Peek(2) served from cache = %d, cached producer %d, want 2, 4", n, q.cachedProd)
		}
		idx, n := q.Peek(3) // only 0 cached left: refresh
		if idx != 4 || n != 3 || q.cachedProd != 8 {
			t.Fatalf("Peek(3) = (%d, %d), cached producer %d; want (4, 3), 8", idx, n, q.cachedProd)
		}
		for i := uint32(0); i < n; i++ {
			if a := q.Get(idx + i); a != uint64(4+i) {
				t.Fatalf("entry %d = %d", idx+i, a)
			}
		}
		q.Release(7)
	})
	t.Run("producer", func(t *testing.T) {
		q, m := newTX(t, 8, 0)
		_, n := q.Reserve(8)
		q.Submit(n)
		m.kernelConsume(8)
		if q.cachedCons != 0 {
			t.Fatal("consumer index read without a Reserve")
		}
		if _, n := q.Reserve(0); n != 0 || q.cachedCons != 0 {
			t.Fatal("Reserve(0) read the consumer index")
		}
		if _, n := q.Reserve(2); n != 2 || q.cachedCons != 8 {
			t.Fatalf("Reserve(2) on a full cache = %d, cached consumer %d; want 2, 8", n, q.cachedCons)
		}
		if _, n := q.Reserve(6); n != 6 {
			t.Fatalf("Reserve(6) = %d", n)
		}
		q.Submit(8)
	})
}

// TestWraparound drives every ring type across the 2^32 index boundary with
// random batch sizes and checks that what one side writes the other reads,
// in order.
func TestWraparound(t *testing.T) {
	const start = 0xffffffff - 40
	rng := rand.New(rand.NewPCG(1, 2))
	t.Run("fill", func(t *testing.T) {
		q, m := newFill(t, 16, start)
		var next, want uint64
		for round := 0; round < 200; round++ {
			idx, n := q.Reserve(uint32(rng.IntN(20)))
			for i := uint32(0); i < n; i++ {
				q.Set(idx+i, next)
				next++
			}
			q.Submit(n)
			for _, a := range m.kernelConsume(rng.IntN(20)) {
				if a != want {
					t.Fatalf("round %d: kernel read %d, want %d", round, a, want)
				}
				want++
			}
		}
		if p := atomic.LoadUint32(m.prod()); p > start {
			t.Fatalf("producer %#x never wrapped", p)
		}
	})
	t.Run("tx", func(t *testing.T) {
		q, m := newTX(t, 16, start)
		var next, want uint64
		for round := 0; round < 200; round++ {
			idx, n := q.Reserve(uint32(rng.IntN(20)))
			for i := uint32(0); i < n; i++ {
				q.Set(idx+i, Desc{Addr: next, Len: 60})
				next++
			}
			q.Submit(n)
			for _, a := range m.kernelConsume(rng.IntN(20)) {
				if a != want {
					t.Fatalf("round %d: kernel read %d, want %d", round, a, want)
				}
				want++
			}
		}
		if c := atomic.LoadUint32(m.cons()); c > start {
			t.Fatalf("consumer %#x never wrapped", c)
		}
	})
	t.Run("rx", func(t *testing.T) {
		q, m := newRX(t, 16, start)
		var next, want uint64
		for round := 0; round < 200; round++ {
			vals := make([]uint64, rng.IntN(20))
			for i := range vals {
				vals[i] = next + uint64(i)
			}
			next += uint64(m.kernelProduce(vals))
			idx, n := q.Peek(uint32(rng.IntN(20)))
			for i := uint32(0); i < n; i++ {
				if d := q.Get(idx + i); d.Addr != want {
					t.Fatalf("round %d: read %d, want %d", round, d.Addr, want)
				}
				want++
			}
			q.Release(n)
		}
		if c := atomic.LoadUint32(m.cons()); c > start {
			t.Fatalf("consumer %#x never wrapped", c)
		}
	})
	t.Run("completion", func(t *testing.T) {
		q, m := newCompletion(t, 16, start)
		var next, want uint64
		for round := 0; round < 200; round++ {
			vals := make([]uint64, rng.IntN(20))
			for i := range vals {
				vals[i] = next + uint64(i)
			}
			next += uint64(m.kernelProduce(vals))
			// Release in two parts to exercise partial releases.
			idx, n := q.Peek(uint32(rng.IntN(20)))
			for i := uint32(0); i < n; i++ {
				if a := q.Get(idx + i); a != want {
					t.Fatalf("round %d: read %d, want %d", round, a, want)
				}
				want++
			}
			q.Release(n / 2)
			q.Release(n - n/2)
		}
		if p := atomic.LoadUint32(m.prod()); p > start {
			t.Fatalf("producer %#x never wrapped", p)
		}
	})
}

func TestRingMisusePanics(t *testing.T) {
	mustPanic := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s did not panic", name)
			}
		}()
		f()
	}
	fq, _ := newFill(t, 8, 0)
	fq.Reserve(2)
	mustPanic("Submit beyond Reserve", func() { fq.Submit(3) })
	mustPanic("Cancel beyond Reserve", func() { fq.Cancel(3) })
	rx, m := newRX(t, 8, 0)
	m.kernelProduce([]uint64{1, 2})
	rx.Peek(1)
	mustPanic("Release beyond Peek", func() { rx.Release(2) })
}

func TestNeedWakeupFlag(t *testing.T) {
	fq, fm := newFill(t, 8, 0)
	tq, tm := newTX(t, 8, 0)
	if fq.NeedWakeup() || tq.NeedWakeup() {
		t.Fatal("need_wakeup set on fresh rings")
	}
	atomic.StoreUint32(fm.flags(), 1)
	atomic.StoreUint32(tm.flags(), 1)
	if !fq.NeedWakeup() || !tq.NeedWakeup() {
		t.Fatal("need_wakeup not seen")
	}
}

func TestRefillAndDrain(t *testing.T) {
	fl := NewFreeList(2048, 0, 10)
	fq, fm := newFill(t, 8, 0)
	if n := fq.Refill(fl, 100); n != 8 || fl.Len() != 2 {
		t.Fatalf("Refill = %d leaving %d, want 8 leaving 2", n, fl.Len())
	}
	got := fm.kernelConsume(8)
	for i, a := range got {
		if a != uint64(i)*2048 {
			t.Fatalf("fill entry %d = %#x", i, a)
		}
	}
	cq, cm := newCompletion(t, 8, 0)
	cm.kernelProduce(got[:5])
	if n := cq.Drain(fl, 3); n != 3 || fl.Len() != 5 {
		t.Fatalf("Drain(3) = %d leaving %d free, want 3, 5", n, fl.Len())
	}
	if n := cq.Drain(fl, 100); n != 2 || fl.Len() != 7 {
		t.Fatalf("Drain = %d leaving %d free, want 2, 7", n, fl.Len())
	}
}

// TestConcurrentRings runs the fake kernel in its own goroutine against each
// kind of ring, across the wrap, so that the race detector checks the
// ordering the atomics give the descriptor accesses.
func TestConcurrentRings(t *testing.T) {
	const (
		total = 200000
		start = 0xffffffff - 1000
	)
	deadline := time.Now().Add(20 * time.Second)

	t.Run("rx", func(t *testing.T) {
		q, m := newRX(t, 64, start)
		done := make(chan struct{})
		go func() { // the kernel
			defer close(done)
			rng := rand.New(rand.NewPCG(3, 4))
			var next uint64
			buf := make([]uint64, 32)
			for next < total && time.Now().Before(deadline) {
				k := min(uint64(1+rng.IntN(len(buf))), total-next)
				for i := range k {
					buf[i] = next + i
				}
				next += uint64(m.kernelProduce(buf[:k]))
			}
		}()
		var want uint64
		for want < total && time.Now().Before(deadline) {
			idx, n := q.Peek(16)
			for i := uint32(0); i < n; i++ {
				if d := q.Get(idx + i); d.Addr != want || d.Len != uint32(want) {
					t.Fatalf("read %+v, want addr %d", d, want)
				}
				want++
			}
			q.Release(n)
		}
		<-done
		if want != total {
			t.Fatalf("consumed %d of %d before the deadline", want, total)
		}
	})
	t.Run("fill", func(t *testing.T) {
		q, m := newFill(t, 64, start)
		errc := make(chan error, 1)
		go func() { // the kernel
			var want uint64
			for want < total && time.Now().Before(deadline) {
				for _, a := range m.kernelConsume(24) {
					if a != want {
						errc <- fmt.Errorf("kernel read %d, want %d", a, want)
						return
					}
					want++
				}
			}
			if want != total {
				errc <- fmt.Errorf("kernel consumed %d of %d before the deadline", want, total)
				return
			}
			errc <- nil
		}()
		var next uint64
		for next < total && time.Now().Before(deadline) {
			idx, n := q.Reserve(uint32(min(16, total-next)))
			for i := uint32(0); i < n; i++ {
				q.Set(idx+i, next)
				next++
			}
			q.Submit(n)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	})
}

// BenchmarkRXRing measures the consumer's cost per descriptor over plain
// memory: Peek of a batch of 64, Get of each, Release; the fake kernel only
// advances the producer index.
func BenchmarkRXRing(b *testing.B) {
	q, m := newRX(b, 4096, 0)
	for i := uint32(0); i < 4096; i++ {
		*(*Desc)(m.slot(i)) = Desc{Addr: uint64(i) * 4096, Len: 64}
	}
	var sum uint64
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; {
		atomic.AddUint32(m.prod(), 64)
		idx, n := q.Peek(64)
		for i := uint32(0); i < n; i++ {
			sum += q.Get(idx + i).Addr
		}
		q.Release(n)
		done += int(n)
	}
	if sum == 1 {
		b.Log(sum)
	}
}
