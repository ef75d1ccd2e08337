package xdpnet

import (
	"fmt"
	"os"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/tcp"
)

// Source is work the loop polls besides its socket: an application's send
// and receive rings in shared memory (the design's "SQ doorbell → qp" on
// the poller), or the completions it forwards to an application. A busy
// loop takes posted work requests while it spins, so a post needs no
// wake-up at all; a sleeping one is woken by the producer through
// Doorbell, or by Wake. The methods run on the loop and must not block.
type Source interface {
	// Poll takes the work waiting and reports whether there was any.
	Poll() bool
	// Sleeping is called before the loop sleeps: the source asks its
	// producer to signal (a need-wakeup flag) and reports whether work
	// arrived since Poll last looked, which keeps the loop awake.
	Sleeping() bool
	// Awake is called once the loop no longer sleeps: the producer need
	// not signal.
	Awake()
}

// Doorbell returns a new descriptor of the eventfd the loop sleeps on: a
// Source's producer that finds the need-wakeup flag up writes to it, and
// the loop wakes without another thread in between.
func (p *Poller) Doorbell() (*os.File, error) {
	fd, err := unix.FcntlInt(uintptr(p.eventfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("xdpnet: doorbell: %w", err)
	}
	return os.NewFile(uintptr(fd), "softrnic-poller-doorbell"), nil
}

// AddSource makes the loop poll s on every turn until RemoveSource.
func (p *Poller) AddSource(s Source) error {
	return p.Do(func(*tcp.Stack, tcp.Time) { p.sources = append(p.sources, s) })
}

// RemoveSource stops polling s; once it returns the loop never calls s
// again (also when the loop has stopped: ErrClosed).
func (p *Poller) RemoveSource(s Source) error {
	return p.Do(func(*tcp.Stack, tcp.Time) {
		if i := slices.Index(p.sources, s); i >= 0 {
			p.sources = slices.Delete(p.sources, i, i+1)
		}
	})
}

// pollSources polls every source; it reports whether any had work.
func (p *Poller) pollSources() bool {
	work := false
	for _, s := range p.sources {
		if s.Poll() {
			work = true
		}
	}
	return work
}

// sourcesSleeping tells the sources the loop is about to sleep; it reports
// whether one of them has work, in which case it must not.
func (p *Poller) sourcesSleeping() bool {
	work := false
	for _, s := range p.sources {
		if s.Sleeping() {
			work = true
		}
	}
	return work
}

func (p *Poller) sourcesAwake() {
	for _, s := range p.sources {
		s.Awake()
	}
}
