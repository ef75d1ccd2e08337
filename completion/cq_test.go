package completion

import (
	"errors"
	"sync"
	"testing"
)

func TestCQOrderAndOverrun(t *testing.T) {
	cq, err := New(Options{Depth: 3})
	if err != nil {
		t.Fatal(err)
	}
	for id := uint64(1); id <= 3; id++ {
		if err := cq.Push(Completion{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	if cq.Len() != 3 {
		t.Fatalf("Len %d, want 3", cq.Len())
	}
	if err := cq.Push(Completion{ID: 4}); !errors.Is(err, ErrOverrun) || !cq.Overrun() {
		t.Fatalf("push into a full CQ: %v, overrun %v", err, cq.Overrun())
	}
	out := make([]Completion, 2)
	if n := cq.Poll(out); n != 2 || out[0].ID != 1 || out[1].ID != 2 || cq.Len() != 1 {
		t.Fatalf("poll: %d %v, Len %d", n, out, cq.Len())
	}
	if n := cq.Poll(out); n != 1 || out[0].ID != 3 || cq.Len() != 0 {
		t.Fatalf("poll: %d %v, Len %d", n, out, cq.Len())
	}
	if _, err := New(Options{Depth: 0}); err == nil {
		t.Fatal("depth 0 accepted")
	}
	if _, err := New(Options{Depth: 1, Vector: -1}); err == nil {
		t.Fatal("negative vector accepted")
	}
}

// Arming is one-shot; a completion already waiting fires at once (none is
// lost between a poll that found nothing and the arm), and solicited-only
// arming ignores successful unsolicited completions.
func TestCQArm(t *testing.T) {
	fired := 0
	cq, err := New(Options{Depth: 8, Handler: func(*CQ) { fired++ }})
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(cq.Push(Completion{ID: 1}))
	if fired != 0 {
		t.Fatal("an unarmed CQ fired")
	}
	cq.Arm(false)
	if fired != 1 {
		t.Fatal("arming with a completion waiting did not fire")
	}
	must(cq.Push(Completion{ID: 2}))
	if fired != 1 {
		t.Fatal("arming is not one-shot")
	}
	cq.Poll(make([]Completion, 8))
	cq.Arm(true)
	must(cq.Push(Completion{ID: 3}))
	if fired != 1 {
		t.Fatal("solicited-only arm fired for an unsolicited success")
	}
	must(cq.Push(Completion{ID: 4, Solicited: true}))
	if fired != 2 {
		t.Fatal("solicited-only arm did not fire for a solicited completion")
	}
	cq.Arm(true)
	must(cq.Push(Completion{ID: 5, Status: FlushError}))
	if fired != 3 {
		t.Fatal("solicited-only arm did not fire for a failed completion")
	}
	select {
	case <-cq.Notify():
	default:
		t.Fatal("no notification on the channel")
	}
}

// Len is read without the lock (pollers ask on every turn) while others
// push and poll.
func TestCQLenConcurrent(t *testing.T) {
	cq, err := New(Options{Depth: 64})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for pushed := 0; pushed < 10000; {
			if cq.Len() < 64 && cq.Push(Completion{}) == nil {
				pushed++
			}
		}
	}()
	go func() {
		defer wg.Done()
		out := make([]Completion, 4)
		for taken := 0; taken < 10000; {
			taken += cq.Poll(out)
		}
	}()
	for range 10000 {
		if n := cq.Len(); n < 0 || n > 64 {
			t.Errorf("Len %d out of 0..64", n)
			break
		}
	}
	wg.Wait()
	if cq.Len() != 0 {
		t.Fatalf("Len %d after all were taken", cq.Len())
	}
}
