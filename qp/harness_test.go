package qp

import (
	"bytes"
	"math/rand/v2"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/mpa"
)

// memTable is a test STag table.
type memTable struct {
	mu   sync.Mutex
	mrs  map[uint32]*MR
	next uint32
	// hosts: the process memory of process-backed regions (regProc).
	hosts [][]byte
}

func (m *memTable) Lookup(stag uint32) *MR {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mrs[stag]
}

// guarded maps n octets between two inaccessible pages, so that a write one
// octet outside the buffer kills the test process instead of passing.
func guarded(t testing.TB, n int) []byte {
	t.Helper()
	page := unix.Getpagesize()
	size := (n + page - 1) / page * page
	mem, err := unix.Mmap(-1, 0, size+2*page, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Mprotect(mem[page:page+size], unix.PROT_READ|unix.PROT_WRITE); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	// Right-align the buffer against the trailing guard page.
	return mem[page+size-n : page+size : page+size]
}

// reg registers a guarded region of n octets at tagged base 0x10000.
func (m *memTable) reg(t testing.TB, pd uint32, n int, access Access) *MR {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mrs == nil {
		m.mrs = map[uint32]*MR{}
	}
	m.next++
	mr := &MR{STag: m.next<<8 | 0x5a, PD: pd, Access: access, Base: 0x10000, Buf: guarded(t, n)}
	m.mrs[mr.STag] = mr
	return mr
}

type side struct {
	q        *QP
	scq, rcq *completion.CQ
	mem      *memTable
	events   []Event
	sentTot  uint64
}

type pairOpts struct {
	ird, ord   int
	sq, rq     int
	crc        bool
	markers    bool
	emss       int
	chunk      int // max octets per Receive call; 0: whole
	cqDepth    int
	connectOff bool
}

func newSide(t testing.TB, qpn, pd uint32, o pairOpts) *side {
	s := &side{mem: &memTable{}}
	var err error
	if s.scq, err = completion.New(completion.Options{Depth: o.cqDepth}); err != nil {
		t.Fatal(err)
	}
	if s.rcq, err = completion.New(completion.Options{Depth: o.cqDepth}); err != nil {
		t.Fatal(err)
	}
	s.q, err = New(Config{QPN: qpn, PD: pd, SQDepth: o.sq, RQDepth: o.rq, IRD: o.ird, ORD: o.ord, MaxInline: MaxInline,
		SendCQ: s.scq, RecvCQ: s.rcq, Mem: s.mem, Events: func(e Event) { s.events = append(s.events, e) }})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newPair(t testing.TB, o pairOpts) (a, b *side) {
	if o.ird == 0 {
		o.ird, o.ord = 4, 4
	}
	if o.sq == 0 {
		o.sq, o.rq = 64, 64
	}
	if o.emss == 0 {
		o.emss = 1448
	}
	if o.cqDepth == 0 {
		o.cqDepth = 256
	}
	a, b = newSide(t, 1, 7, o), newSide(t, 2, 9, o)
	if !o.connectOff {
		p := mpa.Params{CRC: o.crc, MarkersTx: o.markers, MarkersRx: o.markers}
		if err := a.q.Connect(p, o.emss, true); err != nil {
			t.Fatal(err)
		}
		if err := b.q.Connect(p, o.emss, false); err != nil {
			t.Fatal(err)
		}
	}
	return a, b
}

// link carries FPDUs between two engines as a lossless, in-order LLP would,
// in random chunks.
type link struct {
	a, b      *side
	rng       *rand.Rand
	chunk     int
	buf       []byte
	corruptAt int
	fromA     int
	// closed after a side sent its Terminate: the LLP goes down.
	closed bool
}

func newLink(a, b *side, chunk int) *link {
	return &link{a: a, b: b, rng: rand.New(rand.NewPCG(uint64(chunk), 99)), chunk: chunk, buf: make([]byte, 0, 256<<10)}
}

func (l *link) deliver(to *side, b []byte) {
	for len(b) > 0 {
		k := len(b)
		if l.chunk > 0 {
			k = min(k, 1+l.rng.IntN(l.chunk))
		}
		to.q.Receive(b[:k])
		b = b[k:]
	}
}

// pump moves data until both engines are quiet.
func (l *link) pump() {
	for round := 0; round < 1_000_000; round++ {
		moved := false
		for _, dir := range [2][2]*side{{l.a, l.b}, {l.b, l.a}} {
			from, to := dir[0], dir[1]
			n := from.q.Transmit(l.buf[:cap(l.buf)])
			if n == 0 {
				continue
			}
			moved = true
			data := l.buf[:n]
			if from == l.a && l.corruptAt > 0 && l.fromA < l.corruptAt && l.fromA+n >= l.corruptAt {
				data[l.corruptAt-l.fromA-1] ^= 0x40
			}
			if from == l.a {
				l.fromA += n
			}
			l.deliver(to, data)
			from.sentTot += uint64(n)
			from.q.Sent(from.sentTot)
		}
		// After a Terminate is out, the sender closes the LLP; the peer
		// sees the connection end.
		for _, dir := range [2][2]*side{{l.a, l.b}, {l.b, l.a}} {
			if dir[0].q.State() == Error && dir[1].q.State() != Error && !l.closed {
				l.closed = true
				dir[1].q.LLPClosed(nil)
			}
		}
		if !moved {
			return
		}
	}
	panic("pump: no quiescence")
}

func poll(cq *completion.CQ) []completion.Completion {
	out := make([]completion.Completion, cq.Len())
	n := cq.Poll(out)
	return out[:n]
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

func mustEqual(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: %d octets differ from the %d expected", what, len(got), len(want))
	}
}
