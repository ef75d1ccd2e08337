package impair

import (
	"encoding/binary"
	"math"
	"slices"
	"testing"
	"time"
)

// run pushes n numbered packets, one every gap, popping whatever is due
// before each push and everything left after the last, and returns the
// numbers in the order they left with the time each left.
func run(t *testing.T, s *Stage, n int, gap time.Duration) (order []uint32, at []time.Duration) {
	t.Helper()
	var pkt [64]byte
	dst := make([]byte, 2048)
	now := time.Duration(0)
	drain := func() {
		for {
			k, ok := s.Pop(now, dst)
			if !ok {
				return
			}
			if k != len(pkt) {
				t.Fatalf("popped %d octets, pushed %d", k, len(pkt))
			}
			order = append(order, binary.BigEndian.Uint32(dst))
			at = append(at, now)
		}
	}
	for i := range n {
		drain()
		binary.BigEndian.PutUint32(pkt[:], uint32(i))
		s.Push(now, pkt[:])
		drain()
		now += gap
	}
	for i := 0; s.Len() > 0; i++ {
		next, ok := s.Next()
		if !ok || i > 10*n+10 {
			t.Fatalf("%d packets held and Next says %v, %v", s.Len(), next, ok)
		}
		now = max(now, next)
		drain()
	}
	if _, ok := s.Next(); ok {
		t.Fatal("Next reports a packet in an empty Stage")
	}
	return order, at
}

func TestZeroPassesEverythingInOrder(t *testing.T) {
	if !(Config{}).IsZero() || (Config{Delay: 1}).IsZero() {
		t.Fatal("IsZero")
	}
	s := New(Config{Seed: 1})
	order, at := run(t, s, 10000, time.Microsecond)
	for i, x := range order {
		if x != uint32(i) || at[i] != time.Duration(i)*time.Microsecond {
			t.Fatalf("packet %d left as number %d at %v", i, x, at[i])
		}
	}
	if len(order) != 10000 || s.Stats != (Stats{Pushed: 10000, Delivered: 10000}) {
		t.Fatalf("%d out; stats %v", len(order), s.Stats)
	}
}

func TestDeterministic(t *testing.T) {
	c := Config{Loss: 0.05, Duplicate: 0.05, Reorder: 0.05, Delay: time.Millisecond, Jitter: 500 * time.Microsecond, Seed: 42}
	o1, a1 := run(t, New(c), 5000, 10*time.Microsecond)
	o2, a2 := run(t, New(c), 5000, 10*time.Microsecond)
	if !slices.Equal(o1, o2) || !slices.Equal(a1, a2) {
		t.Fatal("same seed, different output")
	}
	c.Seed = 43
	o3, _ := run(t, New(c), 5000, 10*time.Microsecond)
	if slices.Equal(o1, o3) {
		t.Fatal("different seeds, same output")
	}
}

// within checks that count is within 5 standard deviations of n*p.
func within(t *testing.T, what string, count uint64, n int, p float64) {
	t.Helper()
	mean := float64(n) * p
	sd := math.Sqrt(float64(n) * p * (1 - p))
	if math.Abs(float64(count)-mean) > 5*sd+1 {
		t.Errorf("%s: %d of %d, want about %.0f (p=%g)", what, count, n, mean, p)
	}
}

func TestProbabilities(t *testing.T) {
	const n = 100000
	for _, c := range []Config{
		{Loss: 0.01}, {Loss: 0.05}, {Duplicate: 0.02}, {Reorder: 0.02, ReorderAfter: 5},
		{Loss: 0.03, Duplicate: 0.03, Reorder: 0.03, Delay: time.Millisecond, Jitter: time.Millisecond},
	} {
		t.Run(c.String(), func(t *testing.T) {
			c.Seed = 7
			s := New(c)
			order, _ := run(t, s, n, 10*time.Microsecond)
			st := s.Stats
			within(t, "lost", st.Lost, n, c.Loss)
			within(t, "duplicated", st.Duplicated, int(n-st.Lost), c.Duplicate)
			copies := int(n - st.Lost + st.Duplicated)
			within(t, "reordered", st.Reordered, copies, c.Reorder)
			if st.Pushed != n || st.Delivered != uint64(copies) || uint64(len(order)) != st.Delivered || st.Overflow != 0 {
				t.Errorf("%d out; stats %v", len(order), st)
			}
			// Every packet not lost leaves, duplicates twice.
			seen := make([]int, n)
			for _, x := range order {
				seen[x]++
			}
			var lost, dup int
			for _, k := range seen {
				switch k {
				case 0:
					lost++
				case 2:
					dup++
				}
			}
			if uint64(lost) != st.Lost || uint64(dup) != st.Duplicated {
				t.Errorf("output shows %d lost and %d duplicated; stats %v", lost, dup, st)
			}
			// Without Reorder, order is kept.
			if c.Reorder == 0 && !slices.IsSorted(order) {
				t.Error("reordered without Reorder")
			}
			if c.Reorder > 0 && slices.IsSorted(order) {
				t.Error("Reorder reordered nothing")
			}
		})
	}
}

// TestReorderAfter: a held packet leaves right after ReorderAfter later
// packets, or at its deadline when they do not come.
func TestReorderAfter(t *testing.T) {
	s := New(Config{Reorder: 1e-9, ReorderAfter: 5, ReorderDelay: time.Second})
	s.cfg.Reorder = 1 // hold the first packet only
	var pkt [64]byte
	s.Push(0, pkt[:])
	s.cfg.Reorder = 0
	dst := make([]byte, 64)
	for i := 1; i <= 7; i++ {
		binary.BigEndian.PutUint32(pkt[:], uint32(i))
		s.Push(0, pkt[:])
	}
	var order []uint32
	for {
		if _, ok := s.Pop(0, dst); !ok {
			break
		}
		order = append(order, binary.BigEndian.Uint32(dst))
	}
	if want := []uint32{1, 2, 3, 4, 5, 0, 6, 7}; !slices.Equal(order, want) {
		t.Errorf("order %v, want %v", order, want)
	}

	// Alone, it waits for ReorderDelay past its due time.
	s = New(Config{Reorder: 1, ReorderAfter: 5, ReorderDelay: 3 * time.Millisecond, Delay: time.Millisecond})
	s.Push(0, pkt[:])
	if next, ok := s.Next(); !ok || next != 4*time.Millisecond {
		t.Fatalf("Next %v %v, want 4ms", next, ok)
	}
	if _, ok := s.Pop(4*time.Millisecond-1, dst); ok {
		t.Fatal("held packet left early")
	}
	if _, ok := s.Pop(4*time.Millisecond, dst); !ok {
		t.Fatal("held packet did not leave at its deadline")
	}
}

// TestDelayJitter: every packet leaves at least Delay-Jitter and at most
// Delay+Jitter after it entered (or behind the packet ahead of it), in
// order.
func TestDelayJitter(t *testing.T) {
	const delay, jitter, gap = 5 * time.Millisecond, time.Millisecond, 100 * time.Microsecond
	s := New(Config{Delay: delay, Jitter: jitter, Seed: 3})
	order, at := run(t, s, 20000, gap)
	if !slices.IsSorted(order) || len(order) != 20000 {
		t.Fatalf("%d packets, sorted %v", len(order), slices.IsSorted(order))
	}
	var early, late int
	prev := time.Duration(0)
	for i, x := range order {
		in := time.Duration(x) * gap
		d := at[i] - in
		if d < delay-jitter {
			early++
		}
		if d > delay+jitter+gap {
			late++
		}
		if at[i] < prev {
			t.Fatalf("packet %d left at %v, before the previous at %v", x, at[i], prev)
		}
		prev = at[i]
	}
	if early > 0 || late > 0 {
		t.Errorf("%d packets early, %d late", early, late)
	}

	// Plain delay: exactly Delay.
	s = New(Config{Delay: delay})
	order, at = run(t, s, 1000, gap)
	for i, x := range order {
		if at[i] != time.Duration(x)*gap+delay {
			t.Fatalf("packet %d left at %v, want %v", x, at[i], time.Duration(x)*gap+delay)
		}
	}
}

func TestLimit(t *testing.T) {
	s := New(Config{Delay: time.Second, Limit: 10})
	var pkt [64]byte
	for range 15 {
		s.Push(0, pkt[:])
	}
	if s.Len() != 10 || s.Stats.Overflow != 5 {
		t.Fatalf("held %d, overflow %d", s.Len(), s.Stats.Overflow)
	}
	dst := make([]byte, 64)
	n := 0
	for {
		if _, ok := s.Pop(time.Second, dst); !ok {
			break
		}
		n++
	}
	if n != 10 {
		t.Fatalf("popped %d", n)
	}
}

// TestBuffersRecycled: steady traffic through a delay allocates nothing
// once the Stage has warmed up.
func TestBuffersRecycled(t *testing.T) {
	s := New(Config{Delay: time.Millisecond, Reorder: 0.1, Duplicate: 0.1, Seed: 5})
	pkt := make([]byte, 1500)
	dst := make([]byte, 2048)
	now := time.Duration(0)
	step := func() {
		s.Push(now, pkt)
		for {
			if _, ok := s.Pop(now, dst); !ok {
				break
			}
		}
		now += 10 * time.Microsecond
	}
	for range 5000 {
		step()
	}
	if a := testing.AllocsPerRun(1000, step); a > 0.01 {
		t.Errorf("%v allocations per packet", a)
	}
}

func TestParse(t *testing.T) {
	c, err := Parse("loss=1%, reorder=0.02,duplicate=0.5%,delay=2ms,jitter=500us,seed=7")
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Loss: 0.01, Reorder: 0.02, Duplicate: 0.005, Delay: 2 * time.Millisecond, Jitter: 500 * time.Microsecond, Seed: 7}
	if c != want {
		t.Fatalf("got %+v, want %+v", c, want)
	}
	if c, err := Parse("none"); err != nil || !c.IsZero() {
		t.Fatalf("none: %+v %v", c, err)
	}
	for _, bad := range []string{
		"loss", "loss=2", "loss=x", "delay=-1ms", "seed=-3", "rate=1",
		"loss=NaN", "loss=nan%", "duplicate=NaN", "reorder=NaN%", "loss=Inf", "reorder=-0.1",
	} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// LastDuplicated says whether the packet pushed last went twice.
func TestLastDuplicated(t *testing.T) {
	s := New(Config{Seed: 1, Duplicate: 0.5})
	seen := map[bool]bool{}
	for i := range 200 {
		before := s.Stats.Duplicated
		s.Push(time.Duration(i), []byte{byte(i)})
		if got, want := s.Stats.LastDuplicated, s.Stats.Duplicated > before; got != want {
			t.Fatalf("packet %d: LastDuplicated %v, but it went %d times", i, got, 1+s.Stats.Duplicated-before)
		}
		seen[s.Stats.LastDuplicated] = true
	}
	if !seen[true] || !seen[false] {
		t.Fatalf("200 packets at 50%%: LastDuplicated only ever %v", seen)
	}
}
