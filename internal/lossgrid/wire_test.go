package lossgrid

import (
	"testing"
	"time"

	"github.com/softrnic/softrnic/header"
)

// seg builds a TCP segment of the sender: seq, flags and n octets.
func seg(seq uint32, flags uint8, n int) header.TCP {
	b := make([]byte, header.TCPMinLen+n)
	t := header.TCP(b)
	t.Encode(&header.TCPFields{SrcPort: 1000, DstPort: 5001, Seq: seq, Flags: flags, Window: 1000})
	return t
}

func TestWireCountsRetransmissionsSpuriousAndRTOs(t *testing.T) {
	var w wire
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	w.sent(0, seg(999, header.TCPFlagSYN, 0)) // ISN 999: data starts at 1000
	for i := range 4 {
		s := seg(1000+uint32(i)*100, header.TCPFlagACK, 100)
		w.sent(ms(1+i), s)
		if i != 1 { // the link drops the second
			w.delivered(s)
		}
	}
	// A fast retransmission of the lost one: not spurious, no RTO.
	w.sent(ms(10), seg(1100, header.TCPFlagACK, 100))
	// A retransmission of delivered octets: spurious.
	w.sent(ms(11), seg(1200, header.TCPFlagACK, 100))
	// Silence, then a retransmission across a delivered and a lost
	// range: an RTO, and not spurious (part of it was never delivered).
	w.sent(ms(311), seg(1000, header.TCPFlagACK, 200))
	want := WireStats{DataSegments: 7, Retransmits: 3, Spurious: 1, RTOs: 1, RTOSeconds: 0.3}
	got := w.WireStats
	if got.RTOSeconds < 0.299 || got.RTOSeconds > 0.301 {
		t.Errorf("RTO seconds %v, want 0.3", got.RTOSeconds)
	}
	got.RTOSeconds = want.RTOSeconds
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

func TestSpansMergeAndCover(t *testing.T) {
	var s spans
	for _, r := range [][2]uint32{{10, 20}, {30, 40}, {0, 5}, {20, 30}, {50, 60}, {4, 10}, {55, 70}} {
		s.add(r[0], r[1])
	}
	if len(s) != 2 || s[0] != (span{0, 40}) || s[1] != (span{50, 70}) {
		t.Fatalf("spans %v", s)
	}
	cases := []struct {
		a, b uint32
		want bool
	}{{0, 40, true}, {5, 6, true}, {39, 41, false}, {40, 50, false}, {50, 70, true}, {60, 71, false}}
	for _, c := range cases {
		if got := s.covers(c.a, c.b); got != c.want {
			t.Errorf("covers(%d, %d) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

func TestPatternChecksEveryOffset(t *testing.T) {
	b := make([]byte, 1000)
	for _, off := range []uint64{0, 3, 8, 4095} {
		fill(7, off, b)
		if err := check(7, off, b); err != nil {
			t.Fatalf("off %d: %v", off, err)
		}
		if err := check(7, off+8, b); err == nil {
			t.Fatalf("off %d: data shifted by a word passed", off)
		}
		for _, k := range []int{0, 5, 500, 999} {
			b[k] ^= 1
			if err := check(7, off, b); err == nil {
				t.Fatalf("off %d: octet %d flipped passed", off, k)
			}
			b[k] ^= 1
		}
	}
}
