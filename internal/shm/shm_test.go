package shm

import (
	"errors"
	"sync"
	"testing"
	"time"
)

func TestRingAcrossTwoMappings(t *testing.T) {
	m, err := NewMemfd("ring", RingSize(8, SQESize))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// The consumer maps the same memfd a second time, as the daemon does.
	other, err := Map(m.File, 0, RingSize(8, SQESize))
	if err != nil {
		t.Fatal(err)
	}
	defer Unmap(other)
	prod, _ := NewRing(m.Mem, 8, SQESize)
	cons, _ := NewRing(other, 8, SQESize)

	const n = 100000
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := uint64(0); i < n; {
			slot, err := prod.Reserve()
			if err != nil {
				t.Error(err)
				return
			}
			if slot == nil {
				continue
			}
			e := SQE{Op: 1, ID: i, NSGE: 1, SGL: [RingSGE]SGE{{LKey: uint32(i), Length: 8, Addr: i * 3}}}
			e.Encode(slot)
			prod.Commit()
			i++
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for i := uint64(0); i < n; {
		slot, err := cons.Peek()
		if err != nil {
			t.Fatal(err)
		}
		if slot == nil {
			if time.Now().After(deadline) {
				t.Fatalf("stuck at %d", i)
			}
			continue
		}
		e := DecodeSQE(slot)
		if e.ID != i || e.SGL[0].LKey != uint32(i) || e.SGL[0].Addr != i*3 {
			t.Fatalf("entry %d: %+v", i, e)
		}
		cons.Release()
		i++
	}
	wg.Wait()
}

func TestRingRejectsCorruptIndices(t *testing.T) {
	m, _ := NewMemfd("ring", RingSize(4, EVESize))
	defer m.Close()
	r, _ := NewRing(m.Mem, 4, EVESize)
	// A hostile producer index claims 1000 entries.
	*r.word(offProd) = 1000
	if _, err := r.Peek(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("peek: %v", err)
	}
	// A hostile consumer index claims entries were consumed that never were.
	w, _ := NewRing(m.Mem, 4, EVESize)
	*w.word(offCons) = 7
	if _, err := w.Reserve(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("reserve: %v", err)
	}
	if _, err := NewRing(m.Mem, 3, EVESize); err == nil {
		t.Fatal("3 entries accepted")
	}
}

func TestMemfdSeals(t *testing.T) {
	m, err := NewMemfd("x", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := CheckSealed(m.File, 4096); err != nil {
		t.Fatal(err)
	}
	if err := CheckSealed(m.File, 8192); err == nil {
		t.Fatal("range past the end accepted")
	}
	if err := m.File.Truncate(0); err == nil {
		t.Fatal("a sealed memfd shrank")
	}
}

func TestEventfd(t *testing.T) {
	f, err := NewEventfd()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	done := make(chan error)
	go func() { done <- Wait(f) }()
	time.Sleep(10 * time.Millisecond)
	if err := Signal(f); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no wake-up")
	}
}

func TestEntryRoundTrips(t *testing.T) {
	var b [SQESize]byte
	s := SQE{Op: 3, Flags: 5, NSGE: 2, InvalidateSTag: 9, ID: 1 << 60, RemoteSTag: 0x1234, RemoteTO: 1 << 40, Compare: 7, Swap: 8,
		Immediate: [8]byte{1, 2}, SGL: [RingSGE]SGE{{1, 2, 3}, {4, 5, 6}}}
	s.Encode(b[:])
	if DecodeSQE(b[:]) != s {
		t.Fatal("SQE")
	}
	r := RQE{ID: 5, NSGE: 4, SGL: [RQSGE]SGE{{1, 2, 3}, {4, 5, 6}, {7, 8, 9}, {10, 11, 12}}}
	r.Encode(b[:RQESize])
	if DecodeRQE(b[:RQESize]) != r {
		t.Fatal("RQE")
	}
	e := EVE{Kind: EventDTO, Status: 4, Opcode: 2, Flags: EVESolicited, EP: 3, ID: 99, ByteLen: 100, Invalidated: 7,
		Immediate: [8]byte{9}, Handle: 11, Event: 12, Cause: 0x010203}
	e.Encode(b[:EVESize])
	if DecodeEVE(b[:EVESize]) != e {
		t.Fatal("EVE")
	}
}

// A producer that found the ring full asks for a wake-up; the consumer
// sees the request once, after it takes an entry, and not otherwise.
func TestRoomWanted(t *testing.T) {
	m, err := NewMemfd("ring", RingSize(2, EVESize))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	prod, _ := NewRing(m.Mem, 2, EVESize)
	cons, _ := NewRing(m.Mem, 2, EVESize)
	for range 2 {
		slot, err := prod.Reserve()
		if slot == nil || err != nil {
			t.Fatalf("reserve: %v", err)
		}
		prod.Commit()
	}
	if cons.RoomWanted() {
		t.Fatal("room wanted before anyone asked")
	}
	if slot, _ := prod.Reserve(); slot != nil {
		t.Fatal("a full ring gave a slot")
	}
	prod.WantRoom()
	if slot, _ := cons.Peek(); slot == nil {
		t.Fatal("nothing to take")
	}
	cons.Release()
	if !cons.RoomWanted() || cons.RoomWanted() {
		t.Fatal("the request is seen exactly once")
	}
	if slot, _ := prod.Reserve(); slot == nil {
		t.Fatal("no room after the consumer took an entry")
	}
}
