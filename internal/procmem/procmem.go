// Package procmem reaches the memory of another process, a client of the
// daemon, through /proc/PID/mem: one copy each way, nothing shared,
// nothing pinned, so the client may register any range it has (a 16-octet
// field inside a heap object) and its pages stay its own across fork(2).
//
// A PID names a process only while it lives, and a process may exec a
// set-user-ID program a daemon running as root must never read or write.
// So the memory file is opened first and the process checked after
// (OpenOwned: still the owner's plain process, every ID the owner's): the
// file reaches the memory image the process had when it was opened, so an
// exec after the check leaves it reading nothing, and a process that
// reuses the PID is never reached. A pidfd marks the memory dead from the
// moment the process exits; every access first loads that flag, an atomic
// load and no system call.
//
// Goroutines: Open starts one, watch, which waits for the pidfd to become
// readable on the runtime's poller (no thread is held while it waits),
// marks the memory dead and ends. Close ends it too and waits for it.
//
// Opening /proc/PID/mem needs what ptrace(2) calls PTRACE_MODE_ATTACH: the
// same uid and a Yama ptrace_scope the process allows (prctl
// PR_SET_PTRACER), or CAP_SYS_PTRACE.
package procmem

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrExited: the process has exited (or the Process was closed); its
// memory is gone.
var ErrExited = errors.New("procmem: the process has exited")

// AccessError is a failed read or write: the memory is not mapped with the
// needed rights (EFAULT), the process is gone (ESRCH, ErrExited) or may not
// be accessed (EPERM). errors.Is tests the cause.
type AccessError struct {
	Op   string // "read" or "write"
	Pid  int
	Addr uint64 // where the access failed
	Len  int    // octets left to copy
	Err  error
}

func (e *AccessError) Error() string {
	return fmt.Sprintf("procmem: %s of %d octets at %#x of process %d: %v", e.Op, e.Len, e.Addr, e.Pid, e.Err)
}

// Unwrap gives the cause.
func (e *AccessError) Unwrap() error { return e.Err }

// Process is the memory of one process.
type Process struct {
	pid   int
	dead  atomic.Bool
	pidfd *os.File
	// mem is /proc/PID/mem, opened before the owner was checked: it
	// reaches the memory image the process had then, never the one an
	// exec gives it later (a set-user-ID program's), nor a process that
	// reuses the PID.
	mem *os.File
	// exited: the pidfd reported the exit (not merely Close).
	exited atomic.Bool
	done   chan struct{} // closed when watch ends
	close  sync.Once
}

// Open opens the memory of the process pid (in the caller's PID
// namespace) and starts watching for its exit.
func Open(pid int) (*Process, error) { return OpenOwned(pid, nil) }

// Owner is whom a process must belong to: the user and group a daemon's
// client connected as (SO_PEERCRED).
type Owner struct{ UID, GID uint32 }

// ErrNotOwner: the process is not (or no longer) the owner's: another
// user's, a set-user-ID or set-group-ID program, or one with capabilities
// its owner's processes lack.
var ErrNotOwner = errors.New("procmem: the process is not its owner's to share")

// OpenOwned is Open for a daemon that may be root: with owner set, the
// process must be owner's plainly, every user and group ID (real,
// effective, saved, filesystem) equal to owner's and, unless owner is
// root, no effective capability. The memory is opened first and the
// process checked after: an exec before the open is seen by the check, an
// exec after it leaves the opened memory behind with the old image.
func OpenOwned(pid int, owner *Owner) (*Process, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("procmem: open process %d: %w", pid, unix.ESRCH)
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("procmem: pidfd_open %d: %w", pid, err)
	}
	return open(os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", pid)), pid, owner)
}

// OpenPidfd is OpenOwned of the process pidfd names, pid its number in
// the caller's PID namespace: for a caller that took the pidfd when it met
// the process (a daemon, as its client connected: SO_PEERPIDFD), so that a
// process that exited since, whose PID the kernel may have given to
// another, is never opened (ESRCH). pidfd stays the caller's.
func OpenPidfd(pidfd *os.File, pid int, owner *Owner) (*Process, error) {
	if pidfd == nil || pid <= 0 {
		return nil, fmt.Errorf("procmem: open process %d: %w", pid, unix.ESRCH)
	}
	fd, err := unix.FcntlInt(pidfd.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("procmem: dup pidfd of %d: %w", pid, err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("procmem: pidfd of %d: %w", pid, err)
	}
	return open(os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", pid)), pid, owner)
}

// open opens the memory of process pid, which the non-blocking pidfd f
// names (f is the Process's, or closed on failure).
func open(f *os.File, pid int, owner *Owner) (*Process, error) {
	mem, err := os.OpenFile(fmt.Sprintf("/proc/%d/mem", pid), os.O_RDWR, 0)
	if err != nil {
		f.Close()
		if errors.Is(err, os.ErrNotExist) {
			err = unix.ESRCH
		}
		return nil, fmt.Errorf("procmem: open the memory of %d: %w", pid, err)
	}
	if owner != nil {
		if err := checkOwner(pid, owner); err != nil {
			f.Close()
			mem.Close()
			return nil, err
		}
	}
	// Still the process the pidfd names, not exited: the PID was not
	// reused between the pidfd's taking and the open of its memory.
	if readable(int(f.Fd())) {
		f.Close()
		mem.Close()
		return nil, fmt.Errorf("procmem: process %d: %w", pid, unix.ESRCH)
	}
	// A non-blocking descriptor goes on the runtime's poller; one that
	// did not would make watch see "closed" at once and call the memory
	// of a live process dead.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		mem.Close()
		return nil, fmt.Errorf("procmem: pidfd of %d cannot be polled: %w", pid, err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		mem.Close()
		return nil, fmt.Errorf("procmem: pidfd of %d: %w", pid, err)
	}
	p := &Process{pid: pid, pidfd: f, mem: mem, done: make(chan struct{})}
	go p.watch(rc)
	return p, nil
}

// watch waits until the process exits or Close closes the pidfd, and
// marks the memory dead.
func (p *Process) watch(rc syscall.RawConn) {
	defer close(p.done)
	err := rc.Read(func(fd uintptr) bool { return readable(int(fd)) })
	p.dead.Store(true)
	if err == nil {
		p.exited.Store(true)
	}
}

// readable reports whether the pidfd says the process has exited (POLLIN;
// an error or hang-up counts too: the memory is not to be trusted).
func readable(fd int) bool {
	fds := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds[:], 0)
		if err == unix.EINTR {
			continue
		}
		return err != nil || n > 0
	}
}

// Pid is the process's PID.
func (p *Process) Pid() int { return p.pid }

// Dead reports whether the memory is gone: the process exited, or Close.
func (p *Process) Dead() bool { return p.dead.Load() }

// Exited is closed once the memory is dead, by the process's exit or by
// Close; Dead is then true.
func (p *Process) Exited() <-chan struct{} { return p.done }

// Close marks the memory dead, stops watching and waits for the watcher to
// end. It is safe to call more than once and while accesses run: they fail
// with ErrExited.
func (p *Process) Close() error {
	var err error
	p.close.Do(func() {
		p.dead.Store(true)
		err = p.pidfd.Close() // wakes watch
		<-p.done
		p.mem.Close()
	})
	return err
}

// maxIO bounds one system call's copy (the kernel copies at most
// MAX_RW_COUNT, a little under 2 GiB, per call).
const maxIO = 1 << 30

// ReadAt fills dst with the process's octets at addr, all of them or an
// *AccessError. It allocates nothing unless it fails.
func (p *Process) ReadAt(dst []byte, addr uint64) error { return p.copy(dst, addr, false) }

// WriteAt writes src to the process's memory at addr, all of it or an
// *AccessError (after which some octets may have been written). It
// allocates nothing unless it fails.
func (p *Process) WriteAt(src []byte, addr uint64) error { return p.copy(src, addr, true) }

func (p *Process) copy(b []byte, addr uint64, write bool) error {
	for len(b) > 0 {
		if p.dead.Load() {
			return p.fail(write, addr, len(b), ErrExited)
		}
		n := min(len(b), maxIO)
		if addr > 1<<63-1-uint64(n) {
			return p.fail(write, addr, len(b), unix.EFAULT) // no user address
		}
		// Through the os.File, whose reference count keeps the
		// descriptor from being closed (and its number reused) under
		// a copy that Close races.
		var got int
		var err error
		if write {
			got, err = p.mem.WriteAt(b[:n], int64(addr))
		} else {
			got, err = p.mem.ReadAt(b[:n], int64(addr))
		}
		if got > 0 && got < n {
			err = nil // the next round reports the fault
		}
		switch {
		case errors.Is(err, os.ErrClosed):
			p.dead.Store(true)
			return p.fail(write, addr, len(b), ErrExited)
		case errors.Is(err, unix.EIO), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			// What /proc/PID/mem answers for an address with no
			// mapping, and once the memory image is gone (a write
			// of nothing: os.File.WriteAt says ErrUnexpectedEOF).
			return p.fail(write, addr, len(b), unix.EFAULT)
		case errors.Is(err, unix.ESRCH):
			// Gone before the watcher saw it: dead for good, as
			// the number may name another process later.
			p.dead.Store(true)
			return p.fail(write, addr, len(b), ErrExited)
		case err != nil:
			return p.fail(write, addr, len(b), err)
		case got <= 0:
			// A partial copy stops at the first page that faults;
			// the kernel reports the fault on the next call, but a
			// call that copies nothing is the fault itself (or the
			// memory image is gone: the process exec'd or exited).
			return p.fail(write, addr, len(b), unix.EFAULT)
		}
		b = b[got:]
		addr += uint64(got)
	}
	return nil
}

func (p *Process) fail(write bool, addr uint64, n int, err error) error {
	op := "read"
	if write {
		op = "write"
	}
	return &AccessError{Op: op, Pid: p.pid, Addr: addr, Len: n, Err: err}
}

// Probe checks that the first and the last octet of [addr, addr+length)
// are readable now (the octets between are not looked at: the range may
// change at any time, and every access is checked again).
func (p *Process) Probe(addr, length uint64) error {
	if length == 0 || addr+length < addr {
		return &AccessError{Op: "probe", Pid: p.pid, Addr: addr, Err: unix.EINVAL}
	}
	var b [1]byte
	if err := p.ReadAt(b[:], addr); err != nil {
		return err
	}
	return p.ReadAt(b[:], addr+length-1)
}

// Protected checks that every page of [addr, addr+length) is mapped
// readable and, if write, writable, as /proc/PID/maps says now: the
// memory's own file writes through any protection (the kernel forces it),
// so a registration for writing is held to the protection a kernel
// device's pinning would be (EFAULT otherwise).
func (p *Process) Protected(addr, length uint64, write bool) error {
	if length == 0 || addr+length < addr {
		return &AccessError{Op: "probe", Pid: p.pid, Addr: addr, Err: unix.EINVAL}
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", p.pid))
	if err != nil || readable(int(p.pidfd.Fd())) {
		// gone, or exited since: the maps may be another's
		return &AccessError{Op: "probe", Pid: p.pid, Addr: addr, Len: int(min(length, 1<<30)), Err: unix.ESRCH}
	}
	at, end := addr, addr+length
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 2 || at >= end {
			break
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		stop, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || stop <= at {
			continue
		}
		if start > at || f[1][0] != 'r' || (write && f[1][1] != 'w') {
			break
		}
		at = stop
	}
	if at < end {
		return &AccessError{Op: "probe", Pid: p.pid, Addr: at, Len: int(min(end-at, 1<<30)), Err: unix.EFAULT}
	}
	return nil
}

// checkOwner reads /proc/PID/status: Uid and Gid (real, effective, saved,
// filesystem) all owner's, and CapEff empty unless owner is root.
func checkOwner(pid int, owner *Owner) error {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return fmt.Errorf("procmem: process %d: %w", pid, unix.ESRCH)
	}
	want := map[string]uint32{"Uid:": owner.UID, "Gid:": owner.GID}
	seen := 0
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if id, ok := want[f[0]]; ok {
			seen++
			if len(f) != 5 {
				return fmt.Errorf("%w: process %d: %q", ErrNotOwner, pid, line)
			}
			for _, v := range f[1:] {
				if n, err := strconv.ParseUint(v, 10, 32); err != nil || uint32(n) != id {
					return fmt.Errorf("%w: process %d has %s, the session's owner %d", ErrNotOwner, pid, line, id)
				}
			}
		}
		if f[0] == "CapEff:" && owner.UID != 0 {
			seen++
			if c, err := strconv.ParseUint(f[1], 16, 64); err != nil || c != 0 {
				return fmt.Errorf("%w: process %d has capabilities (%s)", ErrNotOwner, pid, line)
			}
		}
	}
	if seen != len(want)+map[bool]int{true: 0, false: 1}[owner.UID == 0] {
		return fmt.Errorf("%w: process %d: status without its IDs", ErrNotOwner, pid)
	}
	return nil
}
