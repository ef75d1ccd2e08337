// Package leakcheck fails tests that leave goroutines running after the
// objects that started them (a Device, a Listener, a daemon Server, a client
// IA) have been closed: Close must stop what Open started.
//
// It is go.uber.org/goleak with the project's settle time and ignore list in
// one place, so that every package checks the same way:
//
//   - Main, from a package's TestMain, runs the tests and then requires that
//     no goroutine but the test framework's and the runtime's is left.
//   - Check, at the start of a test (or of a helper that starts a daemon),
//     requires at the test's end that no goroutine started during the test
//     is still running. It names the test that leaked, which Main cannot; it
//     is wrong for tests that call t.Parallel, whose neighbours' goroutines
//     it would count.
//
// A goroutine may take a little while to notice that its object was closed
// (a loop wakes from poll(2), a socket read returns): both wait up to Settle
// for the goroutines to end before they report the ones still running, each
// with its full stack and the "created by" line that says where it started.
package leakcheck

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Settle is how long goroutines get to end after the tests (Main) or the
// test (Check) returned. Close should stop a loop within milliseconds; a
// second covers a loop that sleeps in poll(2) with a timeout of its own and
// the scheduling delays of a loaded 2-core CI host, and still fails a leak
// quickly.
const Settle = 2 * time.Second

// settle is Settle; this package's own tests shorten it.
var settle = Settle

// ignored are goroutines that outlive any test by design. goleak itself
// already ignores the testing package's own goroutines (RunTests, T.Run and
// T.Parallel waiting for their subtests), os/signal's receiver loop, the
// goroutine an execution trace runs on and goroutines parked in a cgo call.
// Each entry here says why it is not a leak.
var ignored = []goleak.Option{
	// None yet. An entry names the function with goleak.IgnoreTopFunction
	// (the goroutine is parked in it) or goleak.IgnoreAnyFunction (it is
	// on the stack), fully qualified, and says why that goroutine may
	// live for the whole test binary: a package-level worker that is
	// started once and shared by every user, never one per object.
}

// Find waits up to Settle for goroutines to end and returns an error that
// lists, with their stacks, those still running and not ignored. Goroutines
// matched by extra are ignored too.
func Find(extra ...goleak.Option) error {
	opts := append(append([]goleak.Option(nil), ignored...), extra...)
	deadline := time.Now().Add(settle)
	for {
		// goleak.Find itself retries for about 0.4 s with a growing
		// sleep before it reports.
		err := goleak.Find(opts...)
		if err == nil || time.Now().After(deadline) {
			return err
		}
	}
}

// Main runs the package's tests, then fails the run if goroutines are left.
// It returns the exit code for os.Exit:
//
//	func TestMain(m *testing.M) { os.Exit(leakcheck.Main(m)) }
//
// Leaks are looked for even when a test failed: a test that stops early must
// still close what it opened (t.Cleanup runs on failure too).
func Main(m *testing.M) int {
	code := m.Run()
	if err := Find(); err != nil {
		fmt.Fprintf(os.Stderr, "leakcheck: goroutines still running %v after the tests ended: %v\n", Settle, err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Check makes t fail if goroutines started after this call are still
// running Settle after t and its cleanups ended. Call it first in the test,
// or in a helper before it registers the Close of what it starts: cleanups
// run last-in first-out, so the check runs after every Close.
func Check(t testing.TB) {
	t.Helper()
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		if err := Find(before); err != nil {
			t.Errorf("leakcheck: goroutines started by %s still running %v after it ended: %v", t.Name(), Settle, err)
		}
	})
}
