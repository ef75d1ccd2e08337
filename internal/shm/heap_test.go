package shm

import (
	"testing"

	"golang.org/x/sys/unix"
)

func newTestHeap(t *testing.T, size int) (*Heap, *Memfd) {
	t.Helper()
	m, err := NewMemfd("heap-test", size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	h, err := NewHeap(m.Mem, 512)
	if err != nil {
		t.Fatal(err)
	}
	return h, m
}

// Blocks never overlap, come back zeroed where a ring's header is, fill
// the region exactly, and merge back into one block when all are freed.
func TestHeapCarvesAndMerges(t *testing.T) {
	const size = 1 << 20
	h, _ := newTestHeap(t, size)
	sizes := []int{768, 512, 4096 + 256, 100, 70000, 1}
	type block struct {
		off uint32
		n   int
	}
	var got []block
	for i := 0; ; i++ {
		n := sizes[i%len(sizes)]
		off, ok := h.Alloc(n)
		if !ok {
			break
		}
		b := h.Mem(off, n)
		for j, c := range b[:min(n, HeaderSize)] {
			if c != 0 {
				t.Fatalf("block at %#x: octet %d is %#x, not zero", off, j, c)
			}
		}
		for j := range b {
			b[j] = byte(i) | 1 // dirty it, and mark whose it is
		}
		got = append(got, block{off, n})
	}
	for i, b := range got {
		for j, c := range h.Mem(b.off, b.n) {
			if c != byte(i)|1 {
				t.Fatalf("block %d at %#x overwritten at %d", i, b.off, j)
			}
		}
	}
	if h.Used() > size || size-h.Used() >= 128<<10 {
		t.Fatalf("%d of %d octets used when full", h.Used(), size)
	}
	for _, b := range got {
		h.Free(b.off, b.n)
	}
	if h.Used() != 0 {
		t.Fatalf("%d octets used after freeing all", h.Used())
	}
	if off, ok := h.Alloc(size); !ok || off != 0 {
		t.Fatal("the freed blocks did not merge back into the whole region")
	}
	if _, ok := h.Alloc(1); ok {
		t.Fatal("allocated from a full region")
	}
}

// Freed memory goes back to the system: the memfd holds no page once
// every block on it is free, whatever their sizes.
func TestHeapReturnsPages(t *testing.T) {
	h, m := newTestHeap(t, 8<<20)
	var offs []uint32
	for range 2000 {
		off, ok := h.Alloc(768)
		if !ok {
			t.Fatal("region full")
		}
		b := h.Mem(off, 768)
		for i := range b {
			b[i] = 1 // touch it
		}
		offs = append(offs, off)
	}
	if kb := memfdKB(t, m); kb < 1000 {
		t.Fatalf("2000 rings of 768 octets hold %d KiB", kb)
	}
	for _, off := range offs {
		h.Free(off, 768)
	}
	if kb := memfdKB(t, m); kb != 0 {
		t.Fatalf("%d KiB still held after every block was freed", kb)
	}
}

// memfdKB is the memory a memfd holds: its blocks, not its size.
func memfdKB(t *testing.T, m *Memfd) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(m.File.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks / 2
}
