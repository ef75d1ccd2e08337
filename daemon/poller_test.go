package daemon

import (
	"errors"
	"fmt"
	"testing"

	"github.com/softrnic/softrnic/internal/shm"
	"github.com/softrnic/softrnic/qp"
)

// Taking a send ring entry into a work request allocates nothing, and
// entries the engine must not see are refused.
func TestToSendWR(t *testing.T) {
	var scratch [shm.RingSGE]qp.SGE
	e := shm.SQE{ID: 7, Op: shm.SQWrite, Flags: shm.WRSignaled, NSGE: 2, RemoteSTag: 9, RemoteTO: 64}
	e.SGL[0] = shm.SGE{LKey: 1, Addr: 2, Length: 3}
	e.SGL[1] = shm.SGE{LKey: 4, Addr: 5, Length: 6}
	wr, err := toSendWR(&e, scratch[:])
	if err != nil || wr.Op != qp.OpWrite || wr.Flags != qp.Signaled || len(wr.SGL) != 2 || wr.SGL[1] != (qp.SGE{LKey: 4, Addr: 5, Length: 6}) || wr.RemoteTO != 64 {
		t.Fatalf("%+v %v", wr, err)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = toSendWR(&e, scratch[:]) }); n != 0 {
		t.Fatalf("toSendWR allocates %.0f times", n)
	}
	for _, bad := range []shm.SQE{{Op: shm.NumSQOps}, {NSGE: shm.RingSGE + 1}, {Flags: 0x80}} {
		if _, err := toSendWR(&bad, scratch[:]); !errors.Is(err, qp.ErrInvalidWR) {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
}

// A session's step costs nothing for objects nobody handed over: an
// application that registers thousands of buffers does not slow its own
// posts down. (The step used to walk every object, twice, at every turn.)
func BenchmarkSessionStep(b *testing.B) {
	for _, lmrs := range []int{0, 4096} {
		b.Run(fmt.Sprintf("lmrs=%d", lmrs), func(b *testing.B) {
			s := &session{objects: map[uint32]any{}}
			for range lmrs {
				if _, err := s.add(&lmr{}); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := s.add(&evd{}); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				s.step()
			}
		})
	}
}

// The session's loop visits only what was handed to it: the EPs and EVDs
// whose owners run the data path are not its to scan, however many.
func TestStepVisitsOnlyWhatWasHandedOver(t *testing.T) {
	s := &session{objects: map[uint32]any{}, wake: make(chan struct{}, 1)}
	add := func() *ep {
		e := &ep{}
		h, err := s.add(e)
		if err != nil {
			t.Fatal(err)
		}
		e.h = h
		e.handOff.Store(true)
		return e
	}
	var others []*ep
	for range 1000 {
		others = append(others, add())
	}
	e := add()
	s.handOff(e)
	s.step()
	if e.handOff.Load() {
		t.Fatal("the EP handed over was not seen to")
	}
	for _, o := range others {
		if !o.handOff.Load() {
			t.Fatal("the step visited an EP nobody handed over")
		}
	}
}
