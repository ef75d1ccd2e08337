package xdpnet

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/internal/topology"
)

// TestNAPIPolicy feeds the adaptive policy counter samples at known rates:
// it turns threaded after napiOnSamples samples in a row at napiOnRate or
// more, back after napiOffSamples in a row below napiOffRate, and a sample
// that breaks a run starts the count again.
func TestNAPIPolicy(t *testing.T) {
	start := time.Unix(1000, 0)
	p := napiPolicy{at: start}
	now, frames := start, uint64(0)
	// step takes one sample at rate frames per second and reports what
	// the policy said.
	step := func(rate int) (bool, bool) {
		now = now.Add(napiSample)
		frames += uint64(rate) * uint64(napiSample) / uint64(time.Second)
		return p.sample(frames, now)
	}
	expect := func(what string, rate, samples int, wantChangeAtLast bool, want bool) {
		t.Helper()
		for i := 1; i <= samples; i++ {
			threaded, change := step(rate)
			last := i == samples
			if change != (last && wantChangeAtLast) {
				t.Fatalf("%s: sample %d of %d at %d/s: change %v", what, i, samples, rate, change)
			}
			if last && threaded != want {
				t.Fatalf("%s: threaded %v after %d samples at %d/s, want %v", what, threaded, samples, rate, want)
			}
		}
	}
	expect("a ping-pong", 50_000, 50, false, false)
	expect("a stream's first samples", 2*napiOnRate, napiOnSamples-1, false, false)
	expect("a dip", napiOnRate-1, 1, false, false)
	expect("the stream again", 2*napiOnRate, napiOnSamples, true, true)
	expect("between the thresholds", (napiOnRate+napiOffRate)/2, 100, false, true)
	expect("a pause", 0, napiOffSamples-1, false, true)
	expect("a burst", napiOnRate, 1, false, true)
	expect("the end of the stream", 0, napiOffSamples, true, false)
	// A clock that did not move changes nothing.
	if threaded, change := p.sample(frames+1e9, now); change || threaded {
		t.Fatalf("a sample at the same instant: threaded %v, change %v", threaded, change)
	}
}

func TestParseNAPIMode(t *testing.T) {
	for _, m := range []NAPIMode{NAPIAuto, NAPIAdaptive, NAPIThreaded, NAPISoftirq, NAPIKeep} {
		got, err := ParseNAPIMode(m.String())
		if err != nil || got != m {
			t.Errorf("ParseNAPIMode(%q) = %v, %v", m.String(), got, err)
		}
	}
	if _, err := ParseNAPIMode("fast"); err == nil || !strings.Contains(err.Error(), "adaptive") {
		t.Errorf("ParseNAPIMode(fast): %v, want an error naming the modes", err)
	}
}

// TestNAPIControl applies each mode to a veth end that has the steering
// program attached, from a thread that entered its namespace without
// ip netns exec (so /sys is not the namespace's and StartNAPI mounts its
// own), and reads the setting back the way an operator would. The adaptive
// mode is driven by a counter the test advances as a stream would.
func TestNAPIControl(t *testing.T) {
	tp := topology.NewTest(t, topology.Options{MTU: 1500})
	ifi, err := tp.B.Interface()
	if err != nil {
		t.Fatal(err)
	}
	read := func() string {
		t.Helper()
		out, err := tp.B.Command("cat", "/sys/class/net/"+tp.B.Link+"/threaded").CombinedOutput()
		if err != nil {
			t.Fatalf("read threaded: %v: %s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	var steer *bpf.Steering
	if err := tp.B.Do(func() error {
		var err error
		steer, err = bpf.Attach(bpf.Options{Interface: tp.B.Link, Mode: bpf.ModeNative})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { steer.Close() })
	if got := read(); got != "0" {
		t.Fatalf("threaded is %q before the test", got)
	}
	start := func(mode NAPIMode, frames func() uint64) *NAPIControl {
		t.Helper()
		var c *NAPIControl
		if err := tp.B.Do(func() error {
			var err error
			c, err = StartNAPI(tp.B.Link, ifi.Index, mode, frames)
			return err
		}); err != nil {
			t.Fatalf("StartNAPI %v: %v", mode, err)
		}
		return c
	}

	c := start(NAPIThreaded, nil)
	if got := read(); got != "1" {
		t.Errorf("threaded mode: sysfs says %q", got)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "0" {
		t.Errorf("after Close: sysfs says %q, want the original 0", got)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}

	// auto is adaptive on veth.
	var frames atomic.Uint64
	streaming := atomic.Bool{}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if streaming.Load() {
					frames.Add(2 * napiOnRate / 1000 * 2) // well above the rate, whatever the tick's jitter
				}
			}
		}
	}()
	c = start(NAPIAuto, frames.Load)
	defer c.Close()
	if c.Mode() != NAPIAdaptive {
		t.Fatalf("auto on veth became %v", c.Mode())
	}
	if got := read(); got != "0" {
		t.Errorf("adaptive, idle: sysfs says %q", got)
	}
	waitFor := func(want string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for read() != want {
			if time.Now().After(deadline) {
				th, sw := c.Threaded()
				t.Fatalf("sysfs threaded never became %s (control: threaded %v after %d switches)", want, th, sw)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	streaming.Store(true)
	waitFor("1")
	streaming.Store(false)
	waitFor("0")
	if th, sw := c.Threaded(); th || sw != 2 {
		t.Errorf("control says threaded %v after %d switches, want false after 2", th, sw)
	}

	// Adaptive without a counter, or an unknown mode, is refused.
	for _, m := range []NAPIMode{NAPIAdaptive, NAPIKeep + 1} {
		if _, err := StartNAPI(tp.B.Link, ifi.Index, m, nil); err == nil {
			t.Errorf("StartNAPI(%v) without a counter: no error", m)
		}
	}
	// A wrong index is refused, not applied to whatever has the name.
	if err := tp.B.Do(func() error {
		_, err := StartNAPI(tp.B.Link, ifi.Index+1000, NAPIThreaded, nil)
		return err
	}); !errors.Is(err, ErrNAPI) {
		t.Errorf("StartNAPI with a wrong index: %v, want ErrNAPI", err)
	}
}
