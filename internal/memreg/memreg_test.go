package memreg

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func anon(t *testing.T, n int, prot int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, prot, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(b) })
	return b
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// mapping returns the /proc/self/maps line covering a.
func mapping(t *testing.T, a uintptr) vma {
	t.Helper()
	maps, err := readMaps()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range maps {
		if v.start <= a && a < v.end {
			return v
		}
	}
	t.Fatalf("%#x not mapped", a)
	return vma{}
}

func fileBlocks(t *testing.T, s *Space) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(s.file.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks
}

// A registered range keeps its contents and addresses, is shared with the
// memfd at offset == address both ways, and after deregistration is private
// again with the contents the daemon wrote, the memfd pages released.
func TestRegisterMovesInPlaceAndBack(t *testing.T) {
	s, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	page := os.Getpagesize()
	b := anon(t, 8*page, unix.PROT_READ|unix.PROT_WRITE)
	for i := range b {
		b[i] = byte(i * 7)
	}
	want := append([]byte(nil), b...)
	before := fileBlocks(t, s)
	// Pages 1..5 (page-aligned: no page holds anything else, and all
	// come back; TestEdgePagesStay does unaligned ranges).
	lo, n := addr(b)+uintptr(page), uintptr(5*page)
	if err := s.Register(lo, n, true); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, want) {
		t.Fatal("contents changed by registration")
	}
	if v := mapping(t, lo); !s.ours(v) || !v.shared() || v.prot() != unix.PROT_READ|unix.PROT_WRITE {
		t.Fatalf("after Register the range is mapped %+v", v)
	}
	if v := mapping(t, addr(b)); s.ours(v) {
		t.Fatal("page 0, outside the range, moved")
	}
	// The daemon's view: the memfd at offset == address.
	got := make([]byte, n)
	if _, err := unix.Pread(int(s.File().Fd()), got, int64(lo)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want[page:page+int(n)]) {
		t.Fatal("memfd does not hold the range at offset == address")
	}
	b[page+200] = 0xAA // the process writes; the daemon sees it
	if _, err := unix.Pread(int(s.File().Fd()), got[:1], int64(addr(b))+int64(page)+200); err != nil || got[0] != 0xAA {
		t.Fatalf("process write not visible in the memfd: %v %#x", err, got[0])
	}
	// The daemon writes; the process sees it, and keeps it after.
	if _, err := unix.Pwrite(int(s.File().Fd()), []byte{0x55}, int64(addr(b))+int64(3*page)); err != nil {
		t.Fatal(err)
	}
	if b[3*page] != 0x55 {
		t.Fatal("memfd write not visible to the process")
	}
	want[page+200], want[3*page] = 0xAA, 0x55
	if fileBlocks(t, s) <= before {
		t.Fatal("memfd holds no pages while registered")
	}
	if err := s.Unregister(lo, n); err != nil {
		t.Fatal(err)
	}
	if v := mapping(t, lo); s.ours(v) || v.shared() {
		t.Fatalf("after Unregister the range is still mapped %+v", v)
	}
	if !bytes.Equal(b, want) {
		t.Fatal("contents lost by deregistration")
	}
	if got := fileBlocks(t, s); got != before {
		t.Fatalf("memfd holds %d blocks after deregistration, %d before", got, before)
	}
	if s.Registered() != 0 {
		t.Fatalf("%d pages still counted", s.Registered())
	}
}

// Overlapping registrations share pages; a page leaves only with its last.
func TestOverlappingRegistrations(t *testing.T) {
	s, _ := Default()
	page := uintptr(os.Getpagesize())
	b := anon(t, int(6*page), unix.PROT_READ|unix.PROT_WRITE)
	a := addr(b)
	if err := s.Register(a, 3*page, true); err != nil {
		t.Fatal(err)
	}
	if err := s.Register(a+2*page, 3*page, false); err != nil {
		t.Fatal(err)
	}
	b[2*page] = 9
	if err := s.Unregister(a, 3*page); err != nil {
		t.Fatal(err)
	}
	if s.ours(mapping(t, a)) {
		t.Fatal("page 0 still on the memfd with no registration")
	}
	if !s.ours(mapping(t, a+2*page)) {
		t.Fatal("page 2 left the memfd while the second registration holds it")
	}
	if err := s.Unregister(a+2*page, 3*page); err != nil {
		t.Fatal(err)
	}
	if s.ours(mapping(t, a+2*page)) || b[2*page] != 9 {
		t.Fatal("page 2 not back, or its contents lost")
	}
	if err := s.Unregister(a, page); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("unregistering an unregistered range: %v", err)
	}
}

// What a process does not own, or may not write, is refused; nothing moves.
func TestRegisterRefuses(t *testing.T) {
	s, _ := Default()
	page := uintptr(os.Getpagesize())
	b := anon(t, int(4*page), unix.PROT_READ|unix.PROT_WRITE)
	if err := unix.MunmapPtr(unsafe.Pointer(&b[page]), page); err != nil {
		t.Fatal(err)
	}
	if err := s.Register(addr(b), 3*page, false); !errors.Is(err, ErrNotMapped) {
		t.Fatalf("range with a hole: %v", err)
	}
	if s.ours(mapping(t, addr(b))) {
		t.Fatal("a refused registration moved pages")
	}
	ro := anon(t, int(page), unix.PROT_READ)
	if err := s.Register(addr(ro), page, true); !errors.Is(err, ErrNotWritable) {
		t.Fatalf("writable registration of read-only memory: %v", err)
	}
	if err := s.Register(addr(ro), page, false); err != nil {
		t.Fatalf("read-only registration of read-only memory: %v", err)
	}
	if v := mapping(t, addr(ro)); !s.ours(v) || v.prot() != unix.PROT_READ {
		t.Fatalf("read-only memory moved as %+v", v)
	}
	if err := s.Unregister(addr(ro), page); err != nil {
		t.Fatal(err)
	}
	none := anon(t, int(page), unix.PROT_NONE)
	if err := s.Register(addr(none), page, false); !errors.Is(err, ErrNotReadable) {
		t.Fatalf("PROT_NONE memory: %v", err)
	}
	sh, err := unix.Mmap(-1, 0, int(page), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(sh)
	if err := s.Register(addr(sh), page, true); !errors.Is(err, ErrShared) {
		t.Fatalf("shared mapping: %v", err)
	}
	for _, r := range [][2]uintptr{{0x1000, 0}, {^uintptr(0) - 10, 100}, {1 << 58, page}} {
		if err := s.Register(r[0], r[1], false); !errors.Is(err, ErrRange) {
			t.Fatalf("range %#x+%d: %v", r[0], r[1], err)
		}
	}
}

// A buffer the process unmapped before deregistering: the pages are
// released and whatever is mapped there later is left alone.
func TestUnregisterAfterUnmap(t *testing.T) {
	s, _ := Default()
	page := uintptr(os.Getpagesize())
	before := fileBlocks(t, s)
	b, err := unix.Mmap(-1, 0, int(2*page), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	b[0] = 1
	a := addr(b)
	if err := s.Register(a, 2*page, true); err != nil {
		t.Fatal(err)
	}
	if err := unix.Munmap(b); err != nil {
		t.Fatal(err)
	}
	if err := s.Unregister(a, 2*page); err != nil {
		t.Fatal(err)
	}
	if got := fileBlocks(t, s); got > before {
		t.Fatalf("memfd holds %d blocks, %d before", got, before)
	}
}

// An unaligned range's first and last pages hold other data of the
// process: deregistration leaves them on the memfd (another thread may be
// writing them), unreferenced and intact, and releases them once the
// process no longer maps them.
func TestEdgePagesStay(t *testing.T) {
	s, _ := Default()
	page := os.Getpagesize()
	b, err := unix.Mmap(-1, 0, 8*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = byte(i)
	}
	before := fileBlocks(t, s)
	lo, n := addr(b)+uintptr(page)+100, uintptr(4*page)
	if err := s.Register(lo, n, true); err != nil {
		t.Fatal(err)
	}
	b[page+50] = 7 // a neighbour's write on the first page, outside the range
	if err := s.Unregister(lo, n); err != nil {
		t.Fatal(err)
	}
	if !s.ours(mapping(t, lo)) || !s.ours(mapping(t, lo+n)) {
		t.Fatal("an edge page left the memfd")
	}
	for _, p := range []uintptr{2, 3, 4} {
		if s.ours(mapping(t, addr(b)+p*uintptr(page))) {
			t.Fatalf("inner page %d still on the memfd", p)
		}
	}
	for i := range b {
		want := byte(i)
		if i == page+50 {
			want = 7
		}
		if b[i] != want {
			t.Fatalf("octet %d is %d, want %d", i, b[i], want)
		}
	}
	if got := fileBlocks(t, s); got != before+int64(2*page/512) {
		t.Fatalf("memfd holds %d blocks, %d before: want the two edge pages only", got, before)
	}
	// The process frees the buffer; the next deregistration anywhere
	// releases the kept pages.
	if err := unix.Munmap(b); err != nil {
		t.Fatal(err)
	}
	c := anon(t, 4*page, unix.PROT_READ|unix.PROT_WRITE)
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.Register(addr(c), uintptr(page), true))
	must(s.Unregister(addr(c), uintptr(page)))
	if got := fileBlocks(t, s); got > before {
		t.Fatalf("memfd holds %d blocks, %d before: kept pages of an unmapped buffer not released", got, before)
	}
}

// Another thread writing the pages a registration moves (the neighbours of
// an unaligned buffer, on its first and last pages) loses no write.
func TestConcurrentNeighbourWrites(t *testing.T) {
	s, _ := Default()
	if s.uffd < 0 {
		t.Skip("skipped: no userfaultfd for this process; neighbours' writes during a move can be lost (package comment)")
	}
	// The writer here is a goroutine, and the mover Go (goMover), which
	// HoldNeighbours is not for: a stop-the-world while the writer is
	// held would never end. No garbage collection runs meanwhile, and the
	// writer, held with its P, leaves others to the registering goroutine.
	s.HoldNeighbours(goMover)
	defer s.HoldNeighbours(nil)
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(4, runtime.GOMAXPROCS(0))))
	page := os.Getpagesize()
	type counters struct{ first, last *uint64 }
	var target, using atomic.Pointer[counters] // what the writer is to use, and uses
	var seen atomic.Uint64                     // increments on the current target
	stop := make(chan struct{})
	lost := make(chan string, 1)
	go func() {
		defer close(lost)
		defer using.Store(nil)
		var cur *counters
		var want uint64
		for {
			select {
			case <-stop:
				return
			default:
			}
			c := target.Load()
			using.Store(c)
			if c == nil {
				runtime.Gosched()
				continue
			}
			if c != cur {
				cur, want = c, atomic.LoadUint64(c.first)
			}
			want++
			if a, l := atomic.AddUint64(c.first, 1), atomic.AddUint64(c.last, 1); a != want || l != want {
				lost <- fmt.Sprintf("counters at %d and %d, want %d", a, l, want)
				return
			}
			seen.Add(1)
		}
	}()
	for i := 0; i < 200; i++ {
		// A fresh buffer each time: its edge pages move anew.
		b, err := unix.Mmap(-1, 0, 6*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			t.Fatal(err)
		}
		c := &counters{(*uint64)(unsafe.Pointer(&b[page+8])), (*uint64)(unsafe.Pointer(&b[4*page+64]))}
		target.Store(c)
		for n := seen.Load(); seen.Load() < n+10; {
			select {
			case msg := <-lost:
				t.Fatalf("iteration %d: a neighbour's write was lost: %s", i, msg)
			default:
			}
			runtime.Gosched()
		}
		lo, n := addr(b)+uintptr(page)+32, uintptr(3*page)
		if err := s.Register(lo, n, true); err != nil {
			t.Fatal(err)
		}
		if err := s.Unregister(lo, n); err != nil {
			t.Fatal(err)
		}
		target.Store(nil)
		for using.Load() != nil {
			runtime.Gosched() // until the writer has let go of b
		}
		if err := unix.Munmap(b); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	if msg, ok := <-lost; ok {
		t.Fatalf("a neighbour's write was lost: %s", msg)
	}
}

func TestParseMapsLine(t *testing.T) {
	v, err := parseMapsLine("7f00a000-7f00c000 rw-s 7f00a000 00:01 4242    /memfd:softrnic-registered (deleted)")
	if err != nil {
		t.Fatal(err)
	}
	if v.start != 0x7f00a000 || v.end != 0x7f00c000 || !v.shared() || v.off != 0x7f00a000 || v.ino != 4242 ||
		v.dev != unix.Mkdev(0, 1) || v.path != "/memfd:softrnic-registered (deleted)" {
		t.Fatalf("%+v", v)
	}
	for _, bad := range []string{"", "x-y rw-p 0 0:0 0", "1000-2000 rw 0 00:00 0", "1000-2000 rw-p 0 0000 0"} {
		if _, err := parseMapsLine(bad); err == nil {
			t.Fatalf("%q parsed", bad)
		}
	}
}

// BenchmarkRegister: moving 64 MiB of touched anonymous memory onto the
// memfd and back (one Register and one Unregister per iteration); the
// octets/s are of the range, each moved twice.
func BenchmarkRegister(b *testing.B) {
	s, err := Default()
	if err != nil {
		b.Fatal(err)
	}
	const n = 64 << 20
	m, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(m)
	for i := 0; i < n; i += 4096 {
		m[i] = byte(i)
	}
	b.SetBytes(n)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := s.Register(addr(m), n, true); err != nil {
			b.Fatal(err)
		}
		if err := s.Unregister(addr(m), n); err != nil {
			b.Fatal(err)
		}
	}
}

// A range over several mappings of different protection moves piece by
// piece, each keeping its protection, and comes back the same way.
func TestRegisterAcrossMappings(t *testing.T) {
	s, _ := Default()
	page := os.Getpagesize()
	b := anon(t, 8*page, unix.PROT_READ|unix.PROT_WRITE)
	for i := range b {
		b[i] = byte(i >> 12)
	}
	if err := unix.Mprotect(b[3*page:5*page], unix.PROT_READ); err != nil {
		t.Fatal(err)
	}
	if err := s.Register(addr(b)+10, uintptr(8*page-20), false); err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{unix.PROT_READ | unix.PROT_WRITE, unix.PROT_READ, unix.PROT_READ | unix.PROT_WRITE} {
		at := addr(b) + uintptr([]int{0, 3, 6}[i]*page)
		if v := mapping(t, at); !s.ours(v) || v.prot() != want {
			t.Fatalf("piece %d: %+v, want ours with protection %#x", i, v, want)
		}
	}
	if err := s.Unregister(addr(b)+10, uintptr(8*page-20)); err != nil {
		t.Fatal(err)
	}
	for i := range b {
		if b[i] != byte(i>>12) {
			t.Fatalf("octet %d changed", i)
		}
	}
	if v := mapping(t, addr(b)+uintptr(4*page)); s.ours(v) || v.prot() != unix.PROT_READ {
		t.Fatalf("the read-only piece came back as %+v", v)
	}
	b[7*page] = 1 // writable again
}
