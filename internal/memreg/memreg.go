// Package memreg lets softrnicd reach ordinary process memory: a malloc'ed
// buffer, a static array, anonymous memory a program mapped itself. The
// daemon maps only memfds, so registering a range moves its pages, in
// place, onto one sparse memfd per process in which every page sits at the
// offset equal to its virtual address:
//
//  1. the range's current contents are written into the memfd at offset
//     == address (pwrite: one kernel copy);
//  2. the memfd is mapped over the range with MAP_SHARED|MAP_FIXED and the
//     range's own protection, so the process keeps its addresses and its
//     data, and every later write is seen by the daemon's mapping of the
//     same pages (and the other way round): no copy per operation.
//
// Because a page's place in the memfd is its address, overlapping and
// repeated registrations need no bookkeeping beyond a reference count per
// page: a page already on the memfd is left alone. When the last
// registration of a page goes, the page is copied back onto private
// anonymous memory (mremap over the range: readers never see a hole) and
// its memfd page is punched out, so deregistered memory costs nothing and
// free() works as before.
//
// A range's first and last pages may hold other data of the process (a
// malloc'ed buffer's neighbours), which another thread may write at any
// time. In a C program (HoldNeighbours: the DAT provider's consumers)
// those pages move with their accesses held for the few microseconds of
// the move (a userfaultfd, uffd.go): no write is lost. A Go program cannot
// hold goroutines so (the runtime's stop-the-world would wait for them):
// there they move by plain copy, like the rest. At deregistration
// they stay on the memfd, unreferenced (moving them back would race their
// writers again), until the process no longer maps them; a later
// registration finds them there.
//
// What it changes for the process (the price of needing no kernel module):
//   - Registration costs a copy of the range (about memcpy speed) and a
//     page-table rebuild; deregistration the same. Registered memory is
//     shared memory (shmem) while registered: it counts as such, and
//     transparent huge pages do not apply to it.
//   - The range itself must not be written by other threads while it is
//     being registered or deregistered (its pages are copied; such writes
//     are lost). RDMA programs register memory before handing it out.
//     In a Go program, or without a userfaultfd (a seccomp policy may
//     forbid it), the first and last pages move by plain copy too, and
//     the same applies to the other data on them: register page-aligned
//     memory (an mmap'ed buffer) where other goroutines write nearby.
//   - After fork the child shares registered pages (and kept first and
//     last pages) with the parent instead of copying them on write; a
//     process that loaded softrnic's client must exec after fork anyway.
//   - The memory must be the process's own, readable, and writable if
//     the registration asks for write access; a shared mapping of some
//     other file is refused (moving it would cut it off from its file), and
//     so is memory mapped at the address of a registration the process
//     freed without deregistering (ErrReplaced: the old registration's peer
//     would reach the new memory). The daemon can reach only what the
//     process put in its memfd, so a process can never register memory
//     that is not its own.
package memreg

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// spaceSize is the memfd's size: every user address of a 5-level paging
// x86-64 or arm64 process (below 2^57) has its page in it. It is sparse:
// only registered pages take memory.
const spaceSize = 1 << 57

// Errors, testable with errors.Is.
var (
	ErrNotMapped   = errors.New("memreg: range not mapped in this process")
	ErrNotReadable = errors.New("memreg: range not readable")
	ErrNotWritable = errors.New("memreg: range not writable and write access asked")
	ErrShared      = errors.New("memreg: range is a shared mapping of another file")
	ErrRange       = errors.New("memreg: empty or wrapping range")
	ErrNotHeld     = errors.New("memreg: range was not registered")
	ErrReplaced    = errors.New("memreg: range was unmapped and mapped again while registered; deregister the old registration first")
)

// Space is a process's registration memfd. Its methods are safe for
// concurrent use.
type Space struct {
	// mu serializes registration and deregistration (each reads the
	// process's mappings and changes them) and guards runs.
	mu   sync.Mutex
	file *os.File
	dev  uint64
	ino  uint64
	// runs are the registered pages: disjoint [start, end) ranges in
	// address order, each with its reference count (> 0).
	runs []run
	// kept are pages left on the memfd with no reference: a
	// deregistered range's first and last pages, which hold other data of
	// the process too (Unregister). Each Unregister releases those the
	// process no longer maps.
	kept []run
	// uffd holds a partly registered page's accesses while it moves
	// (uffd.go), if hold; -1 if the process may have no userfaultfd.
	uffd  int
	mover Mover // s.mu
}

// Mover moves [start, end) onto memfd (at offset start, mapped with prot)
// with other threads' accesses to it held meanwhile through uffd, a
// userfaultfd (uffd.go): held false means it could not hold them and did
// nothing (the page then moves plainly); an error, that it put the page
// back.
type Mover func(uffd, memfd int, start, end uintptr, prot int) (held bool, err error)

// HoldNeighbours makes registrations hold the accesses of other threads to
// a range's first and last pages while they move, with m. m must not run
// Go code while a page is held: a thread of the Go runtime held in a page
// fault (a goroutine, or a C thread inside a callback into Go) cannot stop
// for the runtime's stop-the-world, and a registering goroutine that waits
// on the runtime (as a return from a system call does) would wait for it
// for good. The DAT provider passes a C function; a Go program moves the
// edge pages plainly and must not write beside memory it registers
// meanwhile.
func (s *Space) HoldNeighbours(m Mover) {
	s.mu.Lock()
	s.mover = m
	s.mu.Unlock()
}

type run struct {
	start, end uintptr
	refs       int
}

var (
	defaultOnce  sync.Once
	defaultSpace *Space
	defaultErr   error
)

// Default is the process's Space, created at first use. One per process:
// two would disagree about which memfd a page lives on.
func Default() (*Space, error) {
	defaultOnce.Do(func() { defaultSpace, defaultErr = open() })
	return defaultSpace, defaultErr
}

func open() (*Space, error) {
	fd, err := unix.MemfdCreate("softrnic-registered", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memreg: memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "softrnic-registered")
	if err := unix.Ftruncate(fd, spaceSize); err != nil {
		f.Close()
		return nil, fmt.Errorf("memreg: size the memfd: %w", err)
	}
	// The daemon insists on F_SEAL_SHRINK: a mapping of it can then never
	// fault past the end.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		f.Close()
		return nil, fmt.Errorf("memreg: seal the memfd: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("memreg: stat the memfd: %w", err)
	}
	return &Space{file: f, dev: st.Dev, ino: st.Ino, uffd: openUffd()}, nil
}

// File is the memfd to pass to the daemon; a registration of addr is at
// offset addr in it.
func (s *Space) File() *os.File { return s.file }

var pageSize = uintptr(os.Getpagesize())

func pages(addr, length uintptr) (uintptr, uintptr, error) {
	if length == 0 || addr+length < addr || addr+length > spaceSize {
		return 0, 0, fmt.Errorf("%w: %#x+%d", ErrRange, addr, length)
	}
	return addr &^ (pageSize - 1), (addr + length + pageSize - 1) &^ (pageSize - 1), nil
}

// Register moves the pages of [addr, addr+length) onto the memfd (those
// not there already) and counts a reference on them. With write, the
// range must be writable.
func (s *Space) Register(addr, length uintptr, write bool) error {
	a, b, err := pages(addr, length)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	maps, err := readMaps()
	if err != nil {
		return err
	}
	pieces, err := s.cover(maps, a, b)
	if err != nil {
		return fmt.Errorf("register %#x+%d: %w", addr, length, err)
	}
	for _, p := range pieces {
		if !p.v.readable() {
			return fmt.Errorf("register %#x+%d: %w at %#x", addr, length, ErrNotReadable, p.start)
		}
		if write && !p.v.writable() {
			return fmt.Errorf("register %#x+%d: %w at %#x", addr, length, ErrNotWritable, p.start)
		}
		if p.v.shared() && !s.ours(p.v) {
			return fmt.Errorf("register %#x+%d: %w at %#x (%s)", addr, length, ErrShared, p.start, p.v.path)
		}
		// A registered page no longer the memfd's: the process freed
		// the memory of a registration it kept, and new memory sits at
		// its address. Moving the new memory onto the memfd would hand
		// it to the old registration's peer.
		if !s.ours(p.v) && s.anyHeld(p.start, p.end) {
			return fmt.Errorf("register %#x+%d: %w at %#x", addr, length, ErrReplaced, p.start)
		}
	}
	for _, p := range pieces {
		if s.ours(p.v) {
			continue
		}
		// The first and last pages may hold other data of the process
		// (malloc puts other objects beside a buffer), which another
		// thread may write while the page moves: those move with their
		// accesses held (uffd.go). The middle is the range's own. A
		// failure leaves the pieces already moved on the memfd,
		// unreferenced and intact: still the process's memory.
		for i, r := range splitEdges(p.start, p.end) {
			move := s.moveInHeld
			if i == 0 && r[1]-r[0] > pageSize {
				move = s.moveIn
			}
			if err := move(r[0], r[1], p.v.prot()); err != nil {
				return fmt.Errorf("register %#x+%d: %w", addr, length, err)
			}
		}
	}
	s.add(a, b)
	return nil
}

// Unregister drops a reference on the pages of [addr, addr+length); the
// pages no registration holds any more go back to private anonymous memory
// (if the process still maps them from the memfd) and leave the memfd.
func (s *Space) Unregister(addr, length uintptr) error {
	a, b, err := pages(addr, length)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.held(a, b) {
		return fmt.Errorf("unregister %#x+%d: %w", addr, length, ErrNotHeld)
	}
	freed := s.remove(a, b)
	if len(freed) == 0 {
		return nil
	}
	maps, err := readMaps()
	if err != nil {
		return err // the pages stay on the memfd, unreferenced: intact
	}
	// The pages partly outside [addr, addr+length) hold other data of the
	// process, which another thread may be writing: they stay on the
	// memfd, unreferenced (a later registration finds them there). The
	// others go back onto private memory and leave the memfd; so do the
	// pages the process no longer maps from it (it freed a buffer before
	// deregistering it).
	inner := [2]uintptr{(addr + pageSize - 1) &^ (pageSize - 1), (addr + length) &^ (pageSize - 1)}
	var first error
	punch := func(lo, hi uintptr) {
		if lo >= hi {
			return
		}
		err := unix.Fallocate(int(s.file.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(lo), int64(hi-lo))
		if err != nil && first == nil {
			first = fmt.Errorf("memreg: release pages: %w", err)
		}
	}
	for _, r := range freed {
		at := r.start
		for _, v := range maps {
			if !s.ours(v) || v.end <= r.start || v.start >= r.end {
				continue
			}
			lo, hi := max(v.start, r.start), min(v.end, r.end)
			punch(at, lo) // not mapped from the memfd
			at = hi
			mlo, mhi := max(lo, inner[0]), min(hi, inner[1])
			if mlo >= mhi {
				s.kept = append(s.kept, run{lo, hi, 0}) // edge pages only
				continue
			}
			s.kept = append(s.kept, run{lo, mlo, 0}, run{mhi, hi, 0})
			if err := s.moveOut(mlo, mhi, v.prot()); err != nil {
				if first == nil {
					first = err
				}
				s.kept = append(s.kept, run{mlo, mhi, 0}) // still mapped from the memfd
				continue
			}
			punch(mlo, mhi)
		}
		punch(at, r.end)
	}
	// Kept pages that are registered again stay; so do those the
	// process still maps from the memfd; the others go.
	var kept []run
	for _, k := range s.kept {
		if k.start >= k.end || s.anyHeld(k.start, k.end) {
			continue
		}
		at := k.start
		for _, v := range maps {
			if !s.ours(v) || v.end <= k.start || v.start >= k.end {
				continue
			}
			lo, hi := max(v.start, k.start), min(v.end, k.end)
			punch(at, lo)
			kept = append(kept, run{lo, hi, 0})
			at = hi
		}
		punch(at, k.end)
	}
	s.kept = merge0(kept)
	return first
}

// merge0 sorts and joins overlapping or adjacent unreferenced runs.
func merge0(rs []run) []run {
	sort.Slice(rs, func(i, j int) bool { return rs[i].start < rs[j].start })
	var out []run
	for _, r := range rs {
		if n := len(out); n > 0 && r.start <= out[n-1].end {
			out[n-1].end = max(out[n-1].end, r.end)
			continue
		}
		out = append(out, r)
	}
	return out
}

// anyHeld: some page of [a, b) has a reference.
func (s *Space) anyHeld(a, b uintptr) bool {
	for _, r := range s.runs {
		if r.start < b && a < r.end {
			return true
		}
	}
	return false
}

// Registered reports the pages registered now, for tests and diagnostics.
func (s *Space) Registered() (pages int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.runs {
		pages += int((r.end - r.start) / pageSize)
	}
	return pages
}

// splitEdges cuts [start, end) into its middle, its first page and its
// last page, in that order (a range of one or two pages: its pages).
func splitEdges(start, end uintptr) [][2]uintptr {
	switch end - start {
	case pageSize:
		return [][2]uintptr{{start, end}}
	case 2 * pageSize:
		return [][2]uintptr{{start, start + pageSize}, {start + pageSize, end}}
	}
	return [][2]uintptr{{start + pageSize, end - pageSize}, {start, start + pageSize}, {end - pageSize, end}}
}

// moveIn puts [start, end) on the memfd at offset start and maps it there.
func (s *Space) moveIn(start, end uintptr, prot int) error {
	fd := s.file.Fd()
	for off := start; off < end; {
		n, _, errno := unix.Syscall6(unix.SYS_PWRITE64, fd, off, end-off, off, 0, 0)
		if errno != 0 {
			return fmt.Errorf("memreg: copy %#x into the memfd: %w", off, errno)
		}
		if n == 0 {
			return fmt.Errorf("memreg: copy %#x into the memfd: short write", off)
		}
		off += n
	}
	_, _, errno := unix.Syscall6(unix.SYS_MMAP, start, end-start, uintptr(prot), unix.MAP_SHARED|unix.MAP_FIXED, fd, start)
	if errno != 0 {
		return fmt.Errorf("memreg: map the memfd over %#x-%#x: %w", start, end, errno)
	}
	return nil
}

// moveOut copies [start, end) from the memfd into fresh private anonymous
// memory and moves that over the range in one step.
func (s *Space) moveOut(start, end uintptr, prot int) error {
	n := int(end - start)
	// Not unix.Mmap: its bookkeeping would keep the moved mapping.
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("memreg: anonymous memory for %#x-%#x: %w", start, end, err)
	}
	tmp := unsafe.Slice((*byte)(p), n)
	for done := 0; done < n; {
		m, err := unix.Pread(int(s.file.Fd()), tmp[done:], int64(start)+int64(done))
		if err != nil || m == 0 {
			_ = unix.MunmapPtr(p, uintptr(n))
			return fmt.Errorf("memreg: copy %#x out of the memfd: %v", start, err)
		}
		done += m
	}
	if err := unix.Mprotect(tmp, prot); err != nil {
		_ = unix.MunmapPtr(p, uintptr(n))
		return fmt.Errorf("memreg: protect the copy of %#x: %w", start, err)
	}
	_, _, errno := unix.Syscall6(unix.SYS_MREMAP, uintptr(p), uintptr(n), uintptr(n), unix.MREMAP_MAYMOVE|unix.MREMAP_FIXED, start, 0)
	if errno != 0 {
		_ = unix.MunmapPtr(p, uintptr(n))
		return fmt.Errorf("memreg: move the copy over %#x-%#x: %w", start, end, errno)
	}
	return nil
}

// ours: the mapping is the memfd with every page at its own address.
func (s *Space) ours(v vma) bool {
	return v.ino == s.ino && v.dev == s.dev && v.off == uint64(v.start)
}

type piece struct {
	start, end uintptr
	v          vma
}

// cover splits [a, b) along the process's mappings; a gap is an error.
func (s *Space) cover(maps []vma, a, b uintptr) ([]piece, error) {
	var out []piece
	at := a
	i := sort.Search(len(maps), func(i int) bool { return maps[i].end > at })
	for ; at < b; i++ {
		if i >= len(maps) || maps[i].start > at {
			return nil, fmt.Errorf("%w at %#x", ErrNotMapped, at)
		}
		end := min(maps[i].end, b)
		out = append(out, piece{start: at, end: end, v: maps[i]})
		at = end
	}
	return out, nil
}

// add counts one reference on every page of [a, b).
func (s *Space) add(a, b uintptr) {
	var out []run
	at := a
	for _, r := range s.runs {
		if r.end <= at || r.start >= b {
			out = append(out, r)
			continue
		}
		if r.start < at {
			out = append(out, run{r.start, at, r.refs})
			r.start = at
		}
		if at < r.start {
			out = append(out, run{at, r.start, 1})
		}
		end := min(r.end, b)
		out = append(out, run{r.start, end, r.refs + 1})
		if r.end > end {
			out = append(out, run{end, r.end, r.refs})
		}
		at = end
	}
	if at < b {
		out = append(out, run{at, b, 1})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start < out[j].start })
	s.runs = merge(out)
}

// held: every page of [a, b) has a reference.
func (s *Space) held(a, b uintptr) bool {
	at := a
	for _, r := range s.runs {
		if r.end <= at {
			continue
		}
		if r.start > at {
			return false
		}
		at = r.end
		if at >= b {
			return true
		}
	}
	return at >= b
}

// remove drops a reference on every page of [a, b) (held) and returns the
// ranges left with none.
func (s *Space) remove(a, b uintptr) (freed []run) {
	var out []run
	for _, r := range s.runs {
		if r.end <= a || r.start >= b {
			out = append(out, r)
			continue
		}
		if r.start < a {
			out = append(out, run{r.start, a, r.refs})
			r.start = a
		}
		end := min(r.end, b)
		if r.refs > 1 {
			out = append(out, run{r.start, end, r.refs - 1})
		} else {
			freed = append(freed, run{r.start, end, 0})
		}
		if r.end > end {
			out = append(out, run{end, r.end, r.refs})
		}
	}
	s.runs = merge(out)
	return merge(freed)
}

// merge joins adjacent runs with the same count.
func merge(rs []run) []run {
	var out []run
	for _, r := range rs {
		if n := len(out); n > 0 && out[n-1].end == r.start && out[n-1].refs == r.refs {
			out[n-1].end = r.end
			continue
		}
		out = append(out, r)
	}
	return out
}

// vma is one line of /proc/self/maps.
type vma struct {
	start, end uintptr
	perms      string
	off        uint64
	dev, ino   uint64
	path       string
}

func (v vma) readable() bool { return v.perms[0] == 'r' }
func (v vma) writable() bool { return v.perms[1] == 'w' }
func (v vma) shared() bool   { return v.perms[3] == 's' }

func (v vma) prot() int {
	p := unix.PROT_NONE
	if v.perms[0] == 'r' {
		p |= unix.PROT_READ
	}
	if v.perms[1] == 'w' {
		p |= unix.PROT_WRITE
	}
	if v.perms[2] == 'x' {
		p |= unix.PROT_EXEC
	}
	return p
}

// readMaps parses /proc/self/maps, in address order.
func readMaps() ([]vma, error) {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return nil, fmt.Errorf("memreg: %w", err)
	}
	var out []vma
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" {
			continue
		}
		v, err := parseMapsLine(line)
		if err != nil {
			return nil, fmt.Errorf("memreg: /proc/self/maps: %w: %q", err, line)
		}
		out = append(out, v)
	}
	return out, nil
}

// parseMapsLine reads "start-end perms offset major:minor inode [path]".
func parseMapsLine(line string) (vma, error) {
	f := strings.Fields(line)
	if len(f) < 5 {
		return vma{}, errors.New("short line")
	}
	lo, hi, ok := strings.Cut(f[0], "-")
	if !ok || len(f[1]) < 4 {
		return vma{}, errors.New("bad range or permissions")
	}
	start, err1 := strconv.ParseUint(lo, 16, 64)
	end, err2 := strconv.ParseUint(hi, 16, 64)
	off, err3 := strconv.ParseUint(f[2], 16, 64)
	maj, min, ok2 := strings.Cut(f[3], ":")
	major, err4 := strconv.ParseUint(maj, 16, 32)
	minor, err5 := strconv.ParseUint(min, 16, 32)
	ino, err6 := strconv.ParseUint(f[4], 10, 64)
	if err := errors.Join(err1, err2, err3, err4, err5, err6); err != nil || !ok2 {
		return vma{}, fmt.Errorf("bad field: %v", err)
	}
	v := vma{start: uintptr(start), end: uintptr(end), perms: f[1], off: off, dev: unix.Mkdev(uint32(major), uint32(minor)), ino: ino}
	if len(f) > 5 {
		v.path = strings.Join(f[5:], " ")
	}
	return v, nil
}
