package shrink

import "testing"

// A map emptied to a quarter of a large peak is replaced by one sized to
// what it holds, with every entry kept; a small one is left alone.
func TestMap(t *testing.T) {
	m := map[int]int{}
	most := 0
	for i := range 4 * From {
		m[i] = i
	}
	orig := m
	for i := range 3*From - 1 {
		delete(m, i)
		m = Map(m, &most)
	}
	if len(m) != From+1 || most != 4*From {
		t.Fatalf("before a quarter: %d entries, high-water %d", len(m), most)
	}
	delete(m, 3*From-1)
	m = Map(m, &most)
	if len(m) != From || most != From {
		t.Fatalf("at a quarter: %d entries, high-water %d", len(m), most)
	}
	delete(orig, 3*From) // the old map is no longer the table
	if _, ok := m[3*From]; !ok {
		t.Fatal("the copy shares the old map")
	}
	for i := 3 * From; i < 4*From; i++ {
		if m[i] != i {
			t.Fatalf("entry %d lost", i)
		}
	}
	small, smallMost := map[int]int{1: 1, 2: 2}, 0
	delete(small, 1)
	if s := Map(small, &smallMost); len(s) != 1 || smallMost != 2 {
		t.Fatal("a small map was copied")
	}
}
