package rnic

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Issue 16: Connect tells its consumer as soon as the connection holds
// what it needs of this host (ConnectOptions.Started), before it waits on
// the network; a limit of this host met there is named and wraps
// ErrResources, in Started and in Connect's error, so that the daemon can
// answer INSUFFICIENT_RESOURCES rather than pass it off as the peer's
// rejection.
func TestConnectStartedAndLimits(t *testing.T) { onBothDatapaths(t, testConnectStartedAndLimits) }

func testConnectStartedAndLimits(t *testing.T, f *fabric) {
	srv, cli := f.hosts(t)
	ln := f.listen(t, srv, ListenOptions{})
	go func() {
		for {
			cr, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			_ = cr.Accept(srv.qp(QPAttr{}), nil)
		}
	}()
	// started records the calls of a Started.
	type started struct {
		mu    sync.Mutex
		calls int
		err   error
	}
	connect := func(q *QP) (*started, error) {
		st := &started{}
		_, err := q.Connect(context.Background(), f.connectAddr(ln), ConnectOptions{Timeout: 10 * time.Second,
			Started: func(err error) {
				st.mu.Lock()
				st.calls++
				st.err = err
				st.mu.Unlock()
			}})
		return st, err
	}
	st, err := connect(cli.qp(QPAttr{}))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	if st.calls != 1 || st.err != nil {
		t.Fatalf("Started called %d times, last with %v; want once with nil", st.calls, st.err)
	}
	if f.datapath == "kernel" {
		// The kernel datapath's dial keeps its errno only as text
		// (connectKernel, ErrUnreachable): the limit is asserted on the
		// accelerated datapath, which reserves a port per connection.
		return
	}
	var old syscall.Rlimit
	must(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old))
	low := old
	low.Cur = uint64(openFDCount(t) + 4)
	must(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low))
	defer func() { must(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old)) }()
	for range 16 {
		if st, err = connect(cli.qp(QPAttr{})); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrResources) || !strings.Contains(err.Error(), "RLIMIT_NOFILE") {
		t.Fatalf("connect at the descriptor limit: %v; want ErrResources naming RLIMIT_NOFILE", err)
	}
	if errors.Is(err, ErrUnreachable) || errors.Is(err, ErrTimedOut) {
		t.Errorf("connect at the descriptor limit: %v: a local shortage taken for the path's", err)
	}
	if st.calls != 1 || !errors.Is(st.err, ErrResources) {
		t.Errorf("Started called %d times, last with %v; want once with ErrResources", st.calls, st.err)
	}
	t.Logf("at the limit: %v", err)
}

// The warnings of a listener whose connections could not be taken are
// spaced, and say how many there were.
func TestAcceptFailedWarnsOncePerInterval(t *testing.T) {
	d := Open()
	defer d.Close()
	var mu sync.Mutex
	var warned []string
	d.SetWarn(func(msg string) {
		mu.Lock()
		warned = append(warned, msg)
		mu.Unlock()
	})
	ln, err := d.Listen("127.0.0.1:0", ListenOptions{})
	must(t, err)
	defer ln.Close()
	emfile := &os.SyscallError{Syscall: "accept4", Err: syscall.EMFILE}
	for range 5 {
		ln.acceptFailed(emfile)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(warned) != 1 || !strings.Contains(warned[0], "RLIMIT_NOFILE") || !strings.Contains(warned[0], "1 connection requests") {
		t.Fatalf("warnings %q; want one naming RLIMIT_NOFILE", warned)
	}
}

// openFDCount is the number of descriptors the process holds.
func openFDCount(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	must(t, err)
	return len(ents)
}
