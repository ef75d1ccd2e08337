package leakcheck

import (
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// fakeT records what Check reports instead of failing the real test.
type fakeT struct {
	testing.TB
	cleanups []func()
	errs     []string
}

func (f *fakeT) Helper()                        {}
func (f *fakeT) Name() string                   { return "fake" }
func (f *fakeT) Cleanup(fn func())              { f.cleanups = append(f.cleanups, fn) }
func (f *fakeT) Errorf(format string, a ...any) { f.errs = append(f.errs, format) }
func (f *fakeT) end() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

func short(t *testing.T) {
	old := settle
	settle = 200 * time.Millisecond
	t.Cleanup(func() { settle = old })
}

// A goroutine parked on a channel after the test is a leak; once it ends
// nothing is reported.
func TestCheckFindsParkedGoroutine(t *testing.T) {
	short(t)
	stop := make(chan struct{})
	done := make(chan struct{})
	ft := &fakeT{TB: t}
	Check(ft)
	go func() { <-stop; close(done) }()
	ft.end()
	if len(ft.errs) != 1 {
		t.Fatalf("a parked goroutine was not reported: %q", ft.errs)
	}
	close(stop)
	<-done
	if err := Find(); err != nil {
		t.Fatalf("after it ended: %v", err)
	}
}

// The pollers sleep in poll(2) through x/sys/unix: a goroutine left in a
// raw system call is a leak too (goleak ignores only cgo's syscall stacks).
func TestCheckFindsGoroutineInSyscall(t *testing.T) {
	short(t)
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	done := make(chan struct{})
	ft := &fakeT{TB: t}
	Check(ft)
	go func() {
		fds := []unix.PollFd{{Fd: int32(p[0]), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); err != unix.EINTR {
				break
			}
		}
		close(done)
	}()
	ft.end()
	if len(ft.errs) != 1 {
		t.Fatalf("a goroutine in poll(2) was not reported: %q", ft.errs)
	}
	unix.Close(p[1]) // POLLHUP wakes it
	<-done
}

// A goroutine that ends within the settle time is not a leak, and
// goroutines running before Check are not the test's.
func TestCheckWaitsForSettle(t *testing.T) {
	short(t)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { <-stop; close(done) }()
	ft := &fakeT{TB: t}
	Check(ft)
	go func() { time.Sleep(50 * time.Millisecond) }()
	ft.end()
	if len(ft.errs) != 0 {
		t.Fatalf("reported: %q", ft.errs)
	}
	close(stop)
	<-done
}

// The report carries the stack of the leaked goroutine, with where it was
// started.
func TestFindReportsStack(t *testing.T) {
	short(t)
	stop := make(chan struct{})
	done := make(chan struct{})
	go parked(stop, done)
	err := Find()
	close(stop)
	<-done
	if err == nil || !strings.Contains(err.Error(), "leakcheck.parked") || !strings.Contains(err.Error(), "created by") {
		t.Fatalf("report: %v", err)
	}
}

func parked(stop, done chan struct{}) { <-stop; close(done) }
