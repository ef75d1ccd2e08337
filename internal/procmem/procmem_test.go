package procmem

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/internal/leakcheck"
)

// TestMain fails the run if a watcher outlives its Process's Close.
func TestMain(m *testing.M) { os.Exit(leakcheck.Main(m)) }

func self(t *testing.T) *Process {
	t.Helper()
	p, err := Open(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func addr(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

// Reads and writes reach exactly the octets asked for, at any alignment,
// and allocate nothing.
func TestReadWriteOwnMemory(t *testing.T) {
	p := self(t)
	mem := bytes.Repeat([]byte{0xee}, 64)
	field := mem[13:29] // 16 octets, unaligned
	if err := p.WriteAt([]byte("sixteen octets!!"), addr(field)); err != nil {
		t.Fatal(err)
	}
	if string(field) != "sixteen octets!!" || mem[12] != 0xee || mem[29] != 0xee {
		t.Fatalf("memory after the write: %q", mem)
	}
	got := make([]byte, 16)
	if err := p.ReadAt(got, addr(field)); err != nil || string(got) != "sixteen octets!!" {
		t.Fatalf("read %q, %v", got, err)
	}
	if err := p.Probe(addr(field), 16); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() {
		_ = p.ReadAt(got, addr(field))
		_ = p.WriteAt(got, addr(field))
	}); n != 0 {
		t.Fatalf("%v allocations per read and write", n)
	}
}

// Memory the process does not have fails with EFAULT, never a crash, also
// when only the end of the range is missing.
func TestUnmappedMemory(t *testing.T) {
	p := self(t)
	page := os.Getpagesize()
	m, err := unix.Mmap(-1, 0, 2*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.MunmapPtr(unsafe.Pointer(&m[0]), uintptr(page))
	if err := unix.MunmapPtr(unsafe.Pointer(&m[page]), uintptr(page)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 32)
	var ae *AccessError
	err = p.ReadAt(buf, addr(m)+uint64(page)-16) // straddles the hole
	if !errors.As(err, &ae) || !errors.Is(err, unix.EFAULT) || ae.Addr != addr(m)+uint64(page) || ae.Len != 16 {
		t.Fatalf("read across the end of the mapping: %v", err)
	}
	if err := p.WriteAt(buf, addr(m)+uint64(page)); !errors.Is(err, unix.EFAULT) {
		t.Fatalf("write into the hole: %v", err)
	}
	if err := p.Probe(addr(m), uint64(page)+1); !errors.Is(err, unix.EFAULT) {
		t.Fatalf("probe whose last octet is unmapped: %v", err)
	}
	if err := p.Probe(addr(m), 0); err == nil {
		t.Fatal("probe of 0 octets")
	}
	if p.Dead() {
		t.Fatal("a bad address killed the memory")
	}
}

// The memory of a process dies when it exits, before its parent reaps it
// (so before its PID can be reused), and stays dead.
func TestExitKillsMemory(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	reaped := false
	defer func() {
		if !reaped {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	p, err := Open(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Dead() {
		t.Fatal("dead while the child runs")
	}
	// A live process's unmapped address is a fault, not death.
	var b [8]byte
	if err := p.ReadAt(b[:], 8); !errors.Is(err, unix.EFAULT) || p.Dead() {
		t.Fatalf("reading address 8 of a live child: %v (dead %v)", err, p.Dead())
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("the child's exit was not seen")
	}
	// Still a zombie: the PID is not free yet.
	if err := unix.Kill(cmd.Process.Pid, 0); err != nil {
		t.Fatalf("the child was reaped before the test did: %v", err)
	}
	if !p.Dead() || !p.exited.Load() {
		t.Fatal("memory not dead after the exit")
	}
	if err := p.ReadAt(b[:], 8); !errors.Is(err, ErrExited) {
		t.Fatalf("read after the exit: %v", err)
	}
	if err := p.WriteAt(b[:], 8); !errors.Is(err, ErrExited) {
		t.Fatalf("write after the exit: %v", err)
	}
	cmd.Wait()
	reaped = true
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// Close kills the memory of a live process and ends the watcher.
func TestCloseKillsMemory(t *testing.T) {
	p, err := Open(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	if err := p.ReadAt(b, addr(b)); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
	default:
		t.Fatal("watcher still running after Close")
	}
	if p.exited.Load() {
		t.Fatal("Close taken for the process's exit")
	}
	if err := p.ReadAt(b, addr(b)); !errors.Is(err, ErrExited) {
		t.Fatalf("read after Close: %v", err)
	}
	if _, err := Open(0); !errors.Is(err, unix.ESRCH) {
		t.Fatalf("Open(0): %v", err)
	}
}

// A process that is not plainly its owner's is refused: another user's
// (here: the test's own process, claimed for uid 12345).
func TestOpenOwnedRefusesAnotherUsersProcess(t *testing.T) {
	_, err := OpenOwned(os.Getpid(), &Owner{UID: 12345, GID: 12345})
	if !errors.Is(err, ErrNotOwner) {
		t.Fatalf("a process claimed for another user: %v, want ErrNotOwner", err)
	}
	p, err := OpenOwned(os.Getpid(), &Owner{UID: uint32(os.Getuid()), GID: uint32(os.Getgid())})
	if err != nil {
		t.Fatalf("the test's own process for its own user: %v", err)
	}
	p.Close()
}

// The memory opened is the image the process had: once it execs another
// program (a set-user-ID one would be root's), every access fails.
func TestExecLeavesTheMemoryBehind(t *testing.T) {
	cmd := exec.Command("sh", "-c", "read x; exec sleep 30")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	p, err := OpenOwned(cmd.Process.Pid, &Owner{UID: uint32(os.Getuid()), GID: uint32(os.Getgid())})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// An address the shell has mapped: the start of its first mapping.
	maps, err := os.ReadFile("/proc/" + itoa(cmd.Process.Pid) + "/maps")
	if err != nil {
		t.Fatal(err)
	}
	var start uint64
	for _, c := range maps {
		if c == '-' {
			break
		}
		start = start<<4 | uint64(hexval(c))
	}
	var b [8]byte
	if err := p.ReadAt(b[:], start); err != nil {
		t.Fatalf("reading the shell at %#x: %v", start, err)
	}
	in.Write([]byte("go\n"))
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := p.ReadAt(b[:], start); err != nil {
			break // the image the memory file reaches is gone
		}
		if time.Now().After(deadline) {
			t.Fatalf("the memory of %d still reads 10 s after its exec", cmd.Process.Pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func hexval(c byte) byte {
	if c >= 'a' {
		return c - 'a' + 10
	}
	return c - '0'
}

// Protected tells memory mapped for the access asked from memory that is
// not: a read-only page is fit for reading only, a PROT_NONE page or a
// hole for nothing, whichever page of the range it is.
func TestProtected(t *testing.T) {
	p := self(t)
	page := os.Getpagesize()
	m, err := unix.Mmap(-1, 0, 4*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	a := addr(m)
	if err := unix.Mprotect(m[page:2*page], unix.PROT_READ); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mprotect(m[2*page:3*page], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		off, n int
		write  bool
		ok     bool
	}{
		{0, page, true, true},
		{13, page - 20, false, true},
		{page - 1, 2, false, true},  // into the read-only page
		{page - 1, 2, true, false},  // writing it
		{page + 5, 16, true, false}, // a field inside it
		{page, page, false, true},
		{2*page - 1, 2, false, false}, // into PROT_NONE
		{3*page + 1, 8, true, true},
		{0, 4 * page, false, false},
	} {
		err := p.Protected(a+uint64(c.off), uint64(c.n), c.write)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, unix.EFAULT)) {
			t.Errorf("%d octets at +%d, write %v: %v, want ok %v", c.n, c.off, c.write, err, c.ok)
		}
	}
	// Beyond the mapping's end (the page after it is nobody's here).
	if err := unix.MunmapPtr(unsafe.Pointer(&m[3*page]), uintptr(page)); err != nil {
		t.Fatal(err)
	}
	if err := p.Protected(a+uint64(3*page)-8, 16, false); !errors.Is(err, unix.EFAULT) {
		t.Errorf("a range into a hole: %v", err)
	}
	if err := p.Protected(a, 0, false); err == nil {
		t.Error("0 octets")
	}
}
