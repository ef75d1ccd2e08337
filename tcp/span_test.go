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
