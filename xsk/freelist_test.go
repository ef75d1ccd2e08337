package xsk

import "testing"

func TestFreeList(t *testing.T) {
	f := NewFreeList(4096, 4, 3) // frames 4, 5, 6
	if f.Len() != 3 || f.Cap() != 3 {
		t.Fatalf("Len %d Cap %d, want 3 3", f.Len(), f.Cap())
	}
	var got []uint64
	for {
		a, ok := f.Alloc()
		if !ok {
			break
		}
		got = append(got, a)
	}
	want := []uint64{4 * 4096, 5 * 4096, 6 * 4096}
	if len(got) != len(want) {
		t.Fatalf("allocated %#x, want %#x", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("allocated %#x, want %#x", got, want)
		}
	}
	// An address inside the frame (an RX descriptor's) frees the frame.
	f.Free(5*4096 + 256 + 14)
	f.Free(4 * 4096)
	if a, _ := f.Alloc(); a != 4*4096 {
		t.Fatalf("Alloc after frees = %#x, want the last freed %#x", a, 4*4096)
	}
	dst := make([]uint64, 4)
	if n := f.AllocN(dst); n != 1 || dst[0] != 5*4096 {
		t.Fatalf("AllocN = %d %#x", n, dst[:n])
	}
	if n := f.AllocN(dst); n != 0 {
		t.Fatalf("AllocN on an empty list = %d", n)
	}
}

func TestFreeListPanics(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    func()
	}{
		{"double free", func() {
			f := NewFreeList(2048, 0, 2)
			a, _ := f.Alloc()
			f.Free(a)
			f.Free(a + 100)
		}},
		{"free of a never allocated frame", func() { NewFreeList(2048, 0, 2).Free(0) }},
		{"below the range", func() { NewFreeList(2048, 8, 2).Free(7 * 2048) }},
		{"above the range", func() { NewFreeList(2048, 8, 2).Free(10 * 2048) }},
		{"frame size", func() { NewFreeList(3000, 0, 2) }},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", tc.name)
				}
			}()
			tc.f()
		}()
	}
}

func TestFreeListLarge(t *testing.T) {
	f := NewFreeList(2048, 100, 1000)
	addrs := make([]uint64, 1000)
	if n := f.AllocN(addrs); n != 1000 {
		t.Fatalf("AllocN = %d", n)
	}
	seen := map[uint64]bool{}
	for _, a := range addrs {
		if a%2048 != 0 || a < 100*2048 || a >= 1100*2048 || seen[a] {
			t.Fatalf("bad or repeated address %#x", a)
		}
		seen[a] = true
	}
	for _, a := range addrs {
		f.Free(a)
	}
	if f.Len() != 1000 {
		t.Fatalf("Len %d after freeing all", f.Len())
	}
}
