package xsk

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/internal/testenv"
)

// BenchmarkHandoff measures what one hand-off between two threads costs
// on this host: one thread finishes its turn and the other, waiting,
// takes the next. BenchmarkXSKPingPong has two of them per round trip,
// between busy-polling threads on CPUs of their own. A round trip through
// two daemons has four more: the application's post to its daemon's
// poller and the poller's completion to the application, on each host;
// where the applications and the pollers share the CPUs, they are the
// hand-offs of threads sharing one. Kernel TCP makes none of those: its
// protocol runs in the sending call and the receiver's softirq, and a
// round trip costs it two wake-ups. This is the ceiling make bench reads
// the xdp datapath's round trips against.
//
// The waiter looks at a shared word and either yields the CPU between
// looks (how the pollers and the libraries spin: "yield") or sleeps in
// ppoll on an eventfd the other end writes (how a poller sleeps:
// "eventfd"); the two threads on one CPU or on two. Reported in
// µs/hand-off: b.N round trips, or as many as fit in 20 s.
func BenchmarkHandoff(b *testing.B) {
	if runtime.NumCPU() < 2 {
		testenv.Unmet(b, "needs two CPUs, has %d", runtime.NumCPU())
	}
	for _, wait := range []string{"yield", "eventfd"} {
		for _, cpus := range []struct {
			name string
			a, b int
		}{{"one-cpu", 1, 1}, {"two-cpus", 0, 1}} {
			b.Run(wait+"/"+cpus.name, func(b *testing.B) {
				benchmarkHandoff(b, wait == "eventfd", cpus.a, cpus.b)
			})
		}
	}
}

func benchmarkHandoff(b *testing.B, sleep bool, cpuA, cpuB int) {
	var turn atomic.Int64 // the hand-off's number: even is A's, odd B's
	var efd [2]int
	for i := range efd {
		fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
		if err != nil {
			b.Fatal(err)
		}
		efd[i] = fd
		defer unix.Close(fd)
	}
	deadline := time.Now().Add(20 * time.Second)
	var stop atomic.Bool
	one := []byte{1, 0, 0, 0, 0, 0, 0, 0}
	// side plays hand-offs me, me+2, ... up to 2n, giving each to the
	// other side (the eventfd written only when the other sleeps).
	side := func(me int, n int) int {
		var buf [8]byte
		done := 0
		for i := int64(me); i < int64(2*n); i += 2 {
			for turn.Load() != i {
				if stop.Load() {
					return done
				}
				if !sleep {
					_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
					continue
				}
				fds := []unix.PollFd{{Fd: int32(efd[me]), Events: unix.POLLIN}}
				ts := unix.NsecToTimespec(int64(10 * time.Millisecond))
				_, _ = unix.Ppoll(fds, &ts, nil)
				_, _ = unix.Read(efd[me], buf[:])
			}
			turn.Store(i + 1)
			if sleep {
				_, _ = unix.Write(efd[1-me], one)
			}
			done++
			if done%1024 == 0 && time.Now().After(deadline) {
				stop.Store(true)
				return done
			}
		}
		return done
	}
	b.ResetTimer()
	start := time.Now()
	var doneB int
	errc := make(chan error, 1)
	go func() { errc <- pinned(cpuB, func() { doneB = side(1, b.N) }) }()
	var doneA int
	if err := pinned(cpuA, func() { doneA = side(0, b.N) }); err != nil {
		b.Fatal(err)
	}
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	handoffs := min(2*doneA, 2*doneB+1)
	if handoffs == 0 {
		b.Fatal("no hand-off completed")
	}
	b.ReportMetric(float64(elapsed.Nanoseconds())/float64(handoffs)/1e3, "µs/hand-off")
	b.ReportMetric(0, "ns/op")
	if doneA < b.N {
		b.Logf("%d of %d round trips before the deadline", doneA, b.N)
	}
}
