package daemon

import (
	"log/slog"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// trimmer gives memory back to the system once a wave of connections has
// come and gone. Go's heap keeps what it freed for reuse and returns it
// only slowly, so a daemon that served ten thousand QPs would hold their
// memory long after they closed (and pools hold buffers until a GC or
// two). When many QPs were made or freed since the last trim and none
// for a while, the trimmer collects and returns what is free at once
// (debug.FreeOSMemory): a cost of milliseconds, paid once per wave, never
// on the data path.
type trimmer struct {
	// changes counts QPs made and freed since the last trim; last is
	// when the latest was, in unix nanoseconds.
	changes atomic.Int64
	last    atomic.Int64
	stopc   chan struct{}
	done    sync.WaitGroup
	trims   atomic.Int64
	log     *slog.Logger
}

const (
	// trimAfter QPs made or freed since the last trim make a wave.
	trimAfter = 500
	// trimQuiet is how long no QP came or went: the wave is over.
	trimQuiet = time.Second
	// trimEvery is how often the trimmer looks.
	trimEvery = 250 * time.Millisecond
)

func startTrimmer(log *slog.Logger) *trimmer {
	t := &trimmer{stopc: make(chan struct{}), log: log}
	t.done.Add(1)
	go t.run()
	return t
}

// note counts a QP made or freed. Any goroutine; a server without a
// trimmer (tests that build one by hand) counts nothing.
func (t *trimmer) note() {
	if t == nil {
		return
	}
	t.changes.Add(1)
	t.last.Store(time.Now().UnixNano())
}

func (t *trimmer) run() {
	defer t.done.Done()
	tick := time.NewTicker(trimEvery)
	defer tick.Stop()
	for {
		select {
		case <-t.stopc:
			return
		case <-tick.C:
		}
		if t.changes.Load() < trimAfter || time.Since(time.Unix(0, t.last.Load())) < trimQuiet {
			continue
		}
		t.changes.Store(0)
		// Pools (I/O buffers, TCP rings) keep what was put back until
		// the second collection after: two, then the one that returns
		// the memory.
		runtime.GC()
		runtime.GC()
		debug.FreeOSMemory()
		t.trims.Add(1)
		if t.log != nil {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			t.log.Debug("memory returned after a wave of QPs", "heap_inuse", ms.HeapInuse, "heap_released", ms.HeapReleased,
				"stacks", ms.StackInuse, "gc_meta", ms.GCSys, "other", ms.OtherSys, "goroutines", runtime.NumGoroutine())
		}
	}
}

func (t *trimmer) stop() {
	close(t.stopc)
	t.done.Wait()
}
