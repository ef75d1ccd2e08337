package daemon

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/internal/procmem"
	"github.com/softrnic/softrnic/internal/testenv"
)

// readableAddr is the start of a readable and writable mapping of process
// pid (the tests register it for writing): its stack, which stays so. (The
// first writable mapping of a program just exec'd may be the part of its
// data that the dynamic loader turns read-only next, RELRO.)
func readableAddr(t *testing.T, pid int) uint64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || !strings.HasPrefix(fields[1], "rw") || fields[5] != "[stack]" {
			continue
		}
		start, _, _ := strings.Cut(fields[0], "-")
		if a, err := strconv.ParseUint(start, 16, 64); err == nil {
			return a
		}
	}
	t.Fatalf("no readable mapping in process %d", pid)
	return 0
}

// loServer is a daemon on lo, served until the test's end.
func loServer(t *testing.T) *Server {
	t.Helper()
	srv, err := New(Options{Iface: "lo", Socket: filepath.Join(t.TempDir(), "d.sock"), Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, srv)
	return srv
}

// sleeper is a process that sleeps, killed (and waited for, if the test
// has not) at the test's end.
func sleeper(t *testing.T) *exec.Cmd {
	t.Helper()
	c := exec.Command("sleep", "60")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Process.Kill()
		c.Wait()
	})
	return c
}

// sessionOf is a session, not yet served, of the process pid, as if it had
// connected (the pidfd taken now): its socket's other end is closed at
// once.
func sessionOf(t *testing.T, srv *Server, pid int) *session {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fds[1])
	f := os.NewFile(uintptr(fds[0]), "session")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	s, err := newSession(srv, c.(*net.UnixConn), 1, &unix.Ucred{Pid: int32(pid), Uid: uint32(os.Getuid())}, os.NewFile(uintptr(pidfd), "pidfd"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The memory a session registered is its process's until the process
// exits, and dead from then on, though the session lives on (its socket
// may be a fork child's): registrations are refused as bad addresses, and
// the region reads nothing, so that no access can reach a process that is
// later given the PID. The session's end closes the pidfd and its watcher
// (TestMain's leak check).
func TestSessionProcessMemoryDiesWithTheProcess(t *testing.T) {
	srv := loServer(t)
	child := sleeper(t)
	pid := child.Process.Pid
	va := readableAddr(t, pid)

	s := sessionOf(t, srv, pid)
	defer s.close()
	r, _, err := s.createPZ()
	if err != nil {
		t.Fatal(err)
	}
	pz := r.(*ctl.CreatePZReply).PZ
	register := func(va, length uint64) (*ctl.RegisterLMRReply, error) {
		r, _, err := s.registerProcessMemory(&ctl.RegisterProcessMemory{PZ: pz, VA: va, Length: length, Access: ctl.AccessLocalWrite})
		if err != nil {
			return nil, err
		}
		return r.(*ctl.RegisterLMRReply), nil
	}
	reg, err := register(va+3, 16)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	l := s.objects[reg.LMR].(*lmr)
	counts := s.counts
	s.mu.Unlock()
	if l.mr.Proc == nil || l.mr.Base != va+3 || len(l.mr.Buf) != 16 || l.mr.STag != reg.STag {
		t.Fatalf("registered %+v", l.mr.MR)
	}
	if c := counts(); c["lmr"] != 1 {
		t.Fatalf("counts %v", c)
	}
	// What the engine reads is the child's memory.
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	viaProc := make([]byte, 16)
	if _, err := mem.ReadAt(viaProc, int64(va+3)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 16)
	if err := l.mr.Proc.ReadAt(got, va+3); err != nil || string(got) != string(viaProc) {
		t.Fatalf("read %x (%v), the child has %x", got, err, viaProc)
	}

	if err := child.Process.Signal(unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.proc.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("the process's exit was not seen")
	}
	if err := l.mr.Proc.ReadAt(got, va+3); !errors.Is(err, procmem.ErrExited) {
		t.Fatalf("reading the memory of the exited process: %v", err)
	}
	if _, err := register(va+3, 16); !errors.Is(err, &ctl.Error{Status: ctl.InvalidAddress}) {
		t.Fatalf("registering memory of the exited process: %v", err)
	}
}

// A session's process memory is its process's, never that of one given
// the PID after it exited: here the PID is given, through ns_last_pid, to
// another process of the same user, which a registration (from a fork
// child that holds the socket on, say) would otherwise open and read.
func TestSessionProcessMemoryNeverOfAReusedPID(t *testing.T) {
	const lastPID = "/proc/sys/kernel/ns_last_pid"
	testenv.RequireRoot(t) // to write ns_last_pid
	srv := loServer(t)
	first := sleeper(t)
	pid := first.Process.Pid
	s := sessionOf(t, srv, pid)
	defer s.close()
	first.Process.Kill()
	first.Wait()

	// Give the PID to another process: the kernel hands out the one
	// after ns_last_pid, if nothing forks in between.
	var second *exec.Cmd
	for try := 0; try < 100 && second == nil; try++ {
		if err := os.WriteFile(lastPID, []byte(strconv.Itoa(pid-1)), 0); err != nil {
			t.Fatal(err)
		}
		if c := sleeper(t); c.Process.Pid == pid {
			second = c
		} else {
			c.Process.Kill()
			c.Wait()
		}
	}
	if second == nil {
		t.Fatalf("PID %d was not given again in 100 tries", pid)
	}
	va := readableAddr(t, pid)
	r, _, err := s.createPZ()
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = s.registerProcessMemory(&ctl.RegisterProcessMemory{PZ: r.(*ctl.CreatePZReply).PZ, VA: va, Length: 16, Access: ctl.AccessLocalWrite})
	if !errors.Is(err, &ctl.Error{Status: ctl.InvalidAddress}) {
		t.Fatalf("registering memory of PID %d, now another process's: %v, want INVALID_ADDRESS", pid, err)
	}
}

// A privileged port is the client's only with CAP_NET_BIND_SERVICE in its
// effective set, read off /proc/PID/status.
func TestHasCapability(t *testing.T) {
	for _, c := range []struct {
		status string
		want   bool
	}{
		{"Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n", true}, // root
		{"CapEff:\t0000000000000400\n", true},                                      // bit 10 alone
		{"CapEff:\t0000000000000000\nCapBnd:\t000001ffffffffff\n", false},          // bounding set only
		{"CapEff:\tnot hex\n", false},
		{"Name:\tx\n", false},
	} {
		if got := hasCapability(c.status, unix.CAP_NET_BIND_SERVICE); got != c.want {
			t.Errorf("%q: %v, want %v", c.status, got, c.want)
		}
	}
}
