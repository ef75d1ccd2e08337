package scale

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// memGuard kills the daemons when together they hold more than a limit
// resident. A daemon that keeps megabytes per closed QP (the issue found 4
// MiB on the xdp datapath) grows by gigabytes a batch once churn has
// begun, and at ten thousand QPs would take the machine, and whatever
// else runs on it, down with it; the run reports the trip instead, and
// its steps after it fail.
type memGuard struct {
	limit int64

	mu      sync.Mutex    // guards procs and tripped
	procs   []*os.Process // the daemons watched
	tripped string        // why the guard killed them, once it has

	stop chan struct{}
	done chan struct{}
}

// guardInterval is how often the guard looks: at the gigabytes a second a
// daemon can fault in, a fifth of a second overshoots the limit by little.
const guardInterval = 200 * time.Millisecond

func startGuard(limit int64) *memGuard {
	g := &memGuard{limit: limit, stop: make(chan struct{}), done: make(chan struct{})}
	go g.loop()
	return g
}

// watch adds a daemon; forget removes one that has ended.
func (g *memGuard) watch(p *os.Process) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.procs = append(g.procs, p)
}

func (g *memGuard) forget(p *os.Process) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, q := range g.procs {
		if q == p {
			g.procs = append(g.procs[:i], g.procs[i+1:]...)
			return
		}
	}
}

// trip is why the guard killed the daemons, "" if it has not.
func (g *memGuard) trip() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.tripped
}

// close stops the guard and waits for its goroutine.
func (g *memGuard) close() {
	close(g.stop)
	<-g.done
}

func (g *memGuard) loop() {
	defer close(g.done)
	t := time.NewTicker(guardInterval)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
		}
		g.mu.Lock()
		var sum int64
		for _, p := range g.procs {
			if m, err := readMem(p.Pid); err == nil {
				sum += m.RSS
			}
		}
		if sum > g.limit && g.tripped == "" {
			// Killed through their os.Process, which knows when
			// one has been waited for: no PID reused since is hit.
			for _, p := range g.procs {
				_ = p.Kill()
			}
			g.tripped = fmt.Sprintf("memory guard: the daemons held %s resident, over the guard's %s: killed",
				mib(sum), mib(g.limit))
		}
		g.mu.Unlock()
	}
}

// defaultGuard is 40% of the machine's memory: room for both daemons'
// figures at the targets many times over, and for what else runs.
func defaultGuard() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 8 << 30
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			if fs := strings.Fields(rest); len(fs) == 2 {
				if kb, err := strconv.ParseInt(fs[0], 10, 64); err == nil {
					return kb << 10 * 4 / 10
				}
			}
		}
	}
	return 8 << 30
}
