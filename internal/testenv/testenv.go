// Package testenv says whether a test can use what it needs from the host
// (root, network namespaces, external tools) and how to react when it cannot.
//
// Outside CI a test whose needs are not met is skipped with a message that names
// what is missing. In CI (the CI environment variable is set to anything but
// "false" or "0") the same test fails instead: CI runs as root with every tool
// installed by the project's own scripts, so a missing need there is a defect.
package testenv

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
)

// InCI reports whether the tests run under CI.
func InCI() bool {
	v := os.Getenv("CI")
	return v != "" && v != "false" && v != "0"
}

// Unmet skips the test outside CI and fails it in CI, with the reason.
func Unmet(t testing.TB, format string, args ...any) {
	t.Helper()
	if InCI() {
		t.Fatalf("CI requires this test to run, but: "+format, args...)
	}
	t.Skipf("skipped: "+format, args...)
}

// RequireRoot stops the test (see Unmet) unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unmet(t, "needs root (network namespaces, veth, packet capture); run `sudo make test`")
	}
}

// RequireTool returns the path of an executable, or stops the test (see Unmet).
func RequireTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Unmet(t, "needs %q on PATH (`make deps` installs it)", name)
	}
	return p
}

// FullSocket listens on a SOCK_SEQPACKET Unix socket at path that never
// accepts by itself and whose backlog is full: one connection waits in it,
// and a non-blocking connect gets EAGAIN (checked), as with a daemon
// stopped or busy under a burst of clients. The test's end closes it.
func FullSocket(t testing.TB, path string) *FullListener {
	t.Helper()
	sock := func() int {
		fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC|syscall.SOCK_NONBLOCK, 0)
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
	l := &FullListener{fd: sock()}
	addr := &syscall.SockaddrUnix{Name: path}
	if err := syscall.Bind(l.fd, addr); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(l.fd, 0); err != nil {
		t.Fatal(err)
	}
	l.waiting = sock()
	if err := syscall.Connect(l.waiting, addr); err != nil {
		t.Fatalf("the connection that fills the backlog: %v", err)
	}
	probe := sock()
	err := syscall.Connect(probe, addr)
	syscall.Close(probe)
	if err != syscall.EAGAIN {
		t.Fatalf("a connect to a full backlog: %v, want EAGAIN", err)
	}
	t.Cleanup(l.Close)
	return l
}

// FullListener is FullSocket's listener.
type FullListener struct {
	mu          sync.Mutex
	fd, waiting int
	closed      bool
}

// Drain accepts the connections waiting and closes them: the next
// connect finds room, and a client that connected finds its peer gone.
func (l *FullListener) Drain() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	for {
		fd, _, err := syscall.Accept4(l.fd, syscall.SOCK_CLOEXEC)
		if err != nil {
			return
		}
		syscall.Close(fd)
	}
}

// Close closes the listener and leaves its file, as a daemon killed does.
func (l *FullListener) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		syscall.Close(l.waiting)
		syscall.Close(l.fd)
	}
}

// Buffer collects output (a log, a process's stderr) that goroutines or
// a process write while the test reads it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String is what has been written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// FreePrivilegedPort is a port below 1024 free on 127.0.0.1 now, from
// a start that differs by process, so that tests run at once rarely meet.
func FreePrivilegedPort(t testing.TB) int {
	t.Helper()
	for p := 600 + os.Getpid()%300; p < 1024; p++ {
		if l, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", p)); err == nil {
			l.Close()
			return p
		}
	}
	t.Fatal("no free privileged port")
	return 0
}
