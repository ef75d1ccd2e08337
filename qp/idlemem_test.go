package qp

import (
	"runtime"
	"testing"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/mpa"
)

// Issue 16: an idle QP holds its state, a pointer per work-queue slot and
// the entries of what is posted (the daemon's idle endpoints have a
// receive posted), not an entry's worth of memory per slot of its depths:
// about 1.2 KiB at depths 4 and IRD/ORD 4 after it moved Sends, Writes,
// Reads and atomics both ways. The bound has room for the race detector
// and is far below the 6 KiB per QP that preallocated entries took at
// those depths, and the 900-octet send entry of one slot held idle.
func TestIdleQPHoldsNoEntries(t *testing.T) {
	const n, perQP = 200, 1536
	mem := &memTable{}
	newCQ := func() *completion.CQ {
		cq, err := completion.New(completion.Options{Depth: 8 * n})
		if err != nil {
			t.Fatal(err)
		}
		return cq
	}
	scq, rcq := newCQ(), newCQ()
	const pd = 7
	buf := mem.reg(t, pd, 64, LocalWrite|RemoteWrite|RemoteRead|RemoteAtomic)
	sge := []SGE{{LKey: buf.STag, Addr: buf.Base, Length: 8}}
	newQP := func(qpn uint32) *QP {
		q, err := New(Config{QPN: qpn, PD: pd, SQDepth: 4, RQDepth: 4, IRD: 4, ORD: 4,
			SendCQ: scq, RecvCQ: rcq, Mem: mem})
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	recv := func(q *QP) {
		if err := q.PostRecv(&RecvWR{ID: 1, SGL: sge}); err != nil {
			t.Fatal(err)
		}
	}
	var out [64]completion.Completion
	drainCQs := func() {
		for scq.Poll(out[:]) > 0 {
		}
		for rcq.Poll(out[:]) > 0 {
		}
	}
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	qps := make([]*QP, 0, 2*n)
	for i := range n {
		a, b := newQP(uint32(2*i+1)), newQP(uint32(2*i+2))
		for _, q := range []*QP{a, b} {
			if err := q.Connect(mpa.Params{CRC: true}, 1448, q == a); err != nil {
				t.Fatal(err)
			}
			recv(q)
		}
		l := newLink(&side{q: a}, &side{q: b}, 0)
		for _, q := range []*QP{a, b} {
			for _, wr := range []SendWR{
				{Op: OpSend, SGL: sge},
				{Op: OpWrite, SGL: sge, RemoteSTag: buf.STag, RemoteTO: buf.Base + 8},
				{Op: OpRead, SGL: sge, RemoteSTag: buf.STag, RemoteTO: buf.Base + 16},
				{Op: OpFetchAdd, SGL: sge, RemoteSTag: buf.STag, RemoteTO: buf.Base + 24, Add: 1},
			} {
				if err := q.PostSend(&wr); err != nil {
					t.Fatal(err)
				}
			}
		}
		l.pump()
		drainCQs()
		for _, q := range []*QP{a, b} {
			if q.State() != RTS || q.sq.len() != 0 || q.rq.len() != 0 {
				t.Fatalf("QP %d: %v with %d sends and %d receives left", q.QPN(), q.State(), q.sq.len(), q.rq.len())
			}
			recv(q) // idle, as the daemon's endpoints are, with a receive posted
		}
		qps = append(qps, a, b)
	}
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m1)
	per := float64(int64(m1.HeapAlloc)-int64(m0.HeapAlloc)) / float64(len(qps))
	t.Logf("%.0f B per idle QP", per)
	if per > perQP {
		t.Errorf("%.0f B per idle QP, want at most %d", per, perQP)
	}
	runtime.KeepAlive(qps)
}
