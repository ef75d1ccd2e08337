// Package impair degrades one direction of a link the way tc-netem would:
// loss, duplication, reordering, delay and jitter, all drawn from a seeded
// generator. It runs in the process that forwards the packets, which is
// where the packets between a kernel peer and a userspace engine pass
// anyway (the TUN device of topology.TunPeer), and it is how the tests get
// a bad network on kernels built without sch_netem.
//
// A Stage is one direction. The forwarder hands it every packet with Push,
// takes out what is due with Pop, and sleeps until Next. Time is injected:
// each call takes now, a monotonic instant the caller counts from an epoch
// of its choosing, so a test can drive a Stage with a manual clock and
// replay it exactly from its seed.
//
// Nothing here is safe for concurrent use: one goroutine owns a Stage.
package impair

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// Config describes the impairments of one direction. The zero value
// passes every packet at once and in order.
type Config struct {
	// Loss, Duplicate and Reorder are per-packet probabilities. A
	// duplicated packet leaves twice; each copy may be reordered on its
	// own.
	Loss, Duplicate, Reorder float64
	// A reordered packet is held back until ReorderAfter packets that
	// entered after it have left (default 3), or for ReorderDelay past
	// the time it was due (default 10 ms), whichever comes first.
	ReorderAfter int
	ReorderDelay time.Duration
	// Delay is added to every packet, and a uniform variation in
	// [-Jitter, +Jitter] on top (never below zero). Jitter alone never
	// reorders: a packet is never due before the one that entered ahead
	// of it (tc-netem's behaviour with a rate set). Reordering is
	// Reorder's business.
	Delay, Jitter time.Duration
	// Limit bounds the packets held at once; packets beyond it are
	// dropped and counted in Stats.Overflow (default 10000).
	Limit int
	// Seed keys the generator: the same seed and the same calls give
	// the same packets out at the same times.
	Seed uint64
}

// IsZero reports whether c impairs nothing, so a forwarder may bypass the
// Stage altogether.
func (c Config) IsZero() bool {
	return c.Loss <= 0 && c.Duplicate <= 0 && c.Reorder <= 0 && c.Delay <= 0 && c.Jitter <= 0
}

func (c Config) String() string {
	if c.IsZero() {
		return "none"
	}
	s := ""
	add := func(f string, args ...any) {
		if s != "" {
			s += " "
		}
		s += fmt.Sprintf(f, args...)
	}
	if c.Loss > 0 {
		add("loss=%g%%", c.Loss*100)
	}
	if c.Duplicate > 0 {
		add("dup=%g%%", c.Duplicate*100)
	}
	if c.Reorder > 0 {
		add("reorder=%g%%/%d/%v", c.Reorder*100, c.ReorderAfter, c.ReorderDelay)
	}
	if c.Delay > 0 || c.Jitter > 0 {
		add("delay=%v±%v", c.Delay, c.Jitter)
	}
	return s
}

// Stats count what a Stage did with the packets pushed into it.
type Stats struct {
	// Pushed packets came in; Delivered went out (duplicates counted
	// twice).
	Pushed, Delivered uint64
	// Lost were dropped at random, Overflow for want of room.
	Lost, Overflow uint64
	// Duplicated packets were sent twice; Reordered copies were held
	// back.
	Duplicated, Reordered uint64
	// LastDuplicated: the packet pushed last was sent twice (a
	// connection's final ACK sent twice reaches a peer that has, at the
	// first, let the connection go, and is rightly answered with a
	// reset).
	LastDuplicated bool
}

func (s Stats) String() string {
	return fmt.Sprintf("pushed %d delivered %d lost %d overflow %d duplicated %d reordered %d",
		s.Pushed, s.Delivered, s.Lost, s.Overflow, s.Duplicated, s.Reordered)
}

// packet is a copy of a pushed packet, owned by the Stage until Pop copies
// it out and recycles the buffer.
type packet struct {
	b      []byte
	due    time.Duration
	serial uint64
	// Held (reordered) packets only: how many later packets must still
	// leave before it; due is then the fall-back deadline.
	left int
}

// Stage is one direction of an impaired link.
type Stage struct {
	cfg Config
	rng *rand.Rand
	// fifo holds the packets in order of entry, which is also the order
	// of their due times (see Config.Jitter); fifo[head:] are live.
	fifo []*packet
	head int
	// held are the reordered packets, in order of entry.
	held    []*packet
	lastDue time.Duration
	serial  uint64
	// free recycles packet buffers; it never holds more than Limit.
	free  []*packet
	Stats Stats
}

// New returns a Stage applying c.
func New(c Config) *Stage {
	if c.ReorderAfter <= 0 {
		c.ReorderAfter = 3
	}
	if c.ReorderDelay <= 0 {
		c.ReorderDelay = 10 * time.Millisecond
	}
	if c.Limit <= 0 {
		c.Limit = 10000
	}
	return &Stage{
		cfg: c,
		rng: rand.New(rand.NewPCG(c.Seed, c.Seed^0x6a09e667f3bcc909)),
	}
}

// Config returns the configuration with defaults filled in.
func (s *Stage) Config() Config { return s.cfg }

// Len is the number of packets held.
func (s *Stage) Len() int { return len(s.fifo) - s.head + len(s.held) }

// Push takes a packet entering the link at now. The Stage copies it: pkt
// stays the caller's.
func (s *Stage) Push(now time.Duration, pkt []byte) {
	c := &s.cfg
	s.Stats.Pushed++
	if c.Loss > 0 && s.rng.Float64() < c.Loss {
		s.Stats.Lost++
		return
	}
	copies := 1
	s.Stats.LastDuplicated = false
	if c.Duplicate > 0 && s.rng.Float64() < c.Duplicate {
		copies = 2
		s.Stats.Duplicated++
		s.Stats.LastDuplicated = true
	}
	due := now + c.Delay
	if c.Jitter > 0 {
		due += time.Duration(s.rng.Int64N(int64(2*c.Jitter)+1)) - c.Jitter
	}
	due = max(due, now, s.lastDue)
	s.lastDue = due
	for range copies {
		if s.Len() >= c.Limit {
			s.Stats.Overflow++
			return
		}
		p := s.alloc(len(pkt))
		copy(p.b, pkt)
		s.serial++
		p.serial = s.serial
		p.due = due
		if c.Reorder > 0 && s.rng.Float64() < c.Reorder {
			s.Stats.Reordered++
			p.left = c.ReorderAfter
			p.due = due + c.ReorderDelay
			s.held = append(s.held, p)
			continue
		}
		p.left = 0
		s.fifo = append(s.fifo, p)
	}
}

// Pop copies the next packet due at now into dst and returns its length;
// ok is false when none is due. A packet longer than dst is cut to it.
func (s *Stage) Pop(now time.Duration, dst []byte) (n int, ok bool) {
	// A held packet whose overtakers have gone, or whose deadline has
	// passed, leaves first.
	for i, p := range s.held {
		if p.due <= now {
			s.held = append(s.held[:i], s.held[i+1:]...)
			return s.deliver(p, dst), true
		}
	}
	if s.head == len(s.fifo) || s.fifo[s.head].due > now {
		return 0, false
	}
	p := s.fifo[s.head]
	s.fifo[s.head] = nil
	s.head++
	if s.head == len(s.fifo) {
		s.fifo, s.head = s.fifo[:0], 0
	} else if s.head >= 1024 && s.head*2 >= len(s.fifo) {
		k := copy(s.fifo, s.fifo[s.head:])
		clear(s.fifo[k:])
		s.fifo, s.head = s.fifo[:k], 0
	}
	// p overtakes the held packets that entered before it.
	for _, h := range s.held {
		if h.serial < p.serial && h.left > 0 {
			h.left--
			if h.left == 0 {
				h.due = min(h.due, p.due)
			}
		}
	}
	return s.deliver(p, dst), true
}

// Next is the earliest time a packet is due; ok is false when the Stage
// is empty.
func (s *Stage) Next() (t time.Duration, ok bool) {
	if s.head < len(s.fifo) {
		t, ok = s.fifo[s.head].due, true
	}
	for _, p := range s.held {
		if !ok || p.due < t {
			t, ok = p.due, true
		}
	}
	return t, ok
}

func (s *Stage) deliver(p *packet, dst []byte) int {
	n := copy(dst, p.b)
	s.Stats.Delivered++
	s.free = append(s.free, p)
	return n
}

func (s *Stage) alloc(n int) *packet {
	if k := len(s.free); k > 0 {
		p := s.free[k-1]
		s.free[k-1] = nil
		s.free = s.free[:k-1]
		if cap(p.b) >= n {
			p.b = p.b[:n]
			return p
		}
	}
	return &packet{b: make([]byte, n, max(n, 2048))}
}

// Parse reads a configuration written as comma-separated key=value pairs,
// tc-netem's quantities with our names: loss, duplicate and reorder as
// fractions or percentages ("0.01" or "1%"), delay and jitter as Go
// durations, seed as an integer. "" and "none" are the zero Config.
func Parse(s string) (Config, error) {
	var c Config
	if s == "" || s == "none" {
		return c, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return c, fmt.Errorf("impair: %q: want key=value", kv)
		}
		prob := func(dst *float64) error {
			num, pct := strings.CutSuffix(v, "%")
			f, err := strconv.ParseFloat(num, 64)
			if err == nil && pct {
				f /= 100
			}
			// Written so that NaN, which fails every comparison, fails.
			if err != nil || !(f >= 0 && f <= 1) {
				return fmt.Errorf("impair: %s=%q: want a probability (0.01 or 1%%)", k, v)
			}
			*dst = f
			return nil
		}
		dur := func(dst *time.Duration) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return fmt.Errorf("impair: %s=%q: want a duration (2ms)", k, v)
			}
			*dst = d
			return nil
		}
		var err error
		switch k {
		case "loss":
			err = prob(&c.Loss)
		case "duplicate":
			err = prob(&c.Duplicate)
		case "reorder":
			err = prob(&c.Reorder)
		case "delay":
			err = dur(&c.Delay)
		case "jitter":
			err = dur(&c.Jitter)
		case "seed":
			c.Seed, err = strconv.ParseUint(v, 10, 64)
			if err != nil {
				err = fmt.Errorf("impair: seed=%q: want an integer", v)
			}
		default:
			err = fmt.Errorf("impair: unknown key %q (loss, duplicate, reorder, delay, jitter, seed)", k)
		}
		if err != nil {
			return c, err
		}
	}
	return c, nil
}
