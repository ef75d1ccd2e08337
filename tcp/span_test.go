package tcp

import (
	"math/rand/v2"
	"testing"
)

// mergeSpan against a bitmap: random ranges near a wrapping base, the
// list stays sorted, disjoint and non-adjacent, covers exactly the union,
// and reports the octets each insert added.
func TestMergeSpanAgainstBitmap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 200; round++ {
		base := Seq(rng.Uint32())
		var l []span
		bits := make([]bool, 2000)
		for k := 0; k < 40; k++ {
			lo := rng.IntN(1900)
			n := 1 + rng.IntN(100)
			want := 0
			for i := lo; i < lo+n; i++ {
				if !bits[i] {
					want++
				}
			}
			nl, _, added, ok := mergeSpan(l, span{base.Add(lo), base.Add(lo + n)}, 8)
			if !ok {
				continue // the list was full and the range needed an entry
			}
			for i := lo; i < lo+n; i++ {
				bits[i] = true
			}
			l = nl
			if added != want {
				t.Fatalf("round %d: added %d, want %d", round, added, want)
			}
			covered := make([]bool, len(bits))
			for i, s := range l {
				if !s.start.LessThan(s.end) || (i > 0 && !l[i-1].end.LessThan(s.start)) {
					t.Fatalf("round %d: list not sorted, disjoint and non-adjacent: %v", round, l)
				}
				for q := s.start; q != s.end; q++ {
					covered[q.Sub(base)] = true
				}
			}
			for i := range bits {
				if bits[i] != covered[i] {
					t.Fatalf("round %d: octet %d covered %v, want %v", round, i, covered[i], bits[i])
				}
			}
		}
	}
}

// One stray octet at the far edge of the window makes the receive ring
// as large as the window; in-order octets the handler takes straight
// from their segments then cover it. Nothing is held after: the ring
// goes back to the pool, not kept for the idle connection's life.
func TestStrayOctetLeavesNoRing(t *testing.T) {
	const window = 4 << 20
	r := newRecvBuf(window)
	r.start = Seq(1000)
	if !r.addOOO(r.start.Add(window-1), []byte{1}) {
		t.Fatal("the stray octet was not tracked")
	}
	if len(r.r.b) < window {
		t.Fatalf("ring of %d octets for an octet %d past RCV.NXT", len(r.r.b), window-1)
	}
	r.skip(window - 1) // taken straight from the segments
	r.advance(0)       // RCV.NXT reaches the stray octet
	if r.n != 1 {
		t.Fatalf("%d octets in order, want the stray one", r.n)
	}
	r.consume(1)
	if r.r.b != nil || len(r.ooo) != 0 {
		t.Fatalf("after the last octet was taken the ring is %d octets, %d ranges", len(r.r.b), len(r.ooo))
	}
	// Covered by a segment the handler took whole: advance(0) with
	// nothing in order and nothing out of order.
	r2 := newRecvBuf(window)
	r2.addOOO(r2.start.Add(window-1), []byte{1})
	r2.skip(window)
	r2.advance(0)
	if r2.r.b != nil {
		t.Fatalf("a ring of %d octets stays on a connection that holds nothing", len(r2.r.b))
	}
}
