package lossgrid

import (
	"sort"
	"time"

	"github.com/softrnic/softrnic/header"
)

// WireStats are what the link saw of the data direction, the same way
// whoever the sender is: counted where the sender's segments enter the
// impairment and where they leave it towards the receiver.
type WireStats struct {
	// DataSegments the sender sent (payload > 0), Retransmits of them
	// re-sending octets it had sent before.
	DataSegments, Retransmits uint64
	// Spurious retransmissions re-sent only octets the link had already
	// delivered to the receiver.
	Spurious uint64
	// RTOs are retransmissions after the sender was silent RTOGap or
	// longer with data outstanding (a retransmission timeout: the
	// minimum RTO of both stacks is 200 ms, and every other recovery
	// is clocked by ACKs or by a probe at about two round trips);
	// RTOSeconds sums those silences.
	RTOs       uint64
	RTOSeconds float64
}

// RTOGap is the sender silence that marks a retransmission timeout.
const RTOGap = 150 * time.Millisecond

// wire taps one direction of one connection. Offsets are from the
// sender's initial sequence number, learnt from its SYN.
type wire struct {
	synSeen  bool
	isn      uint32
	sndMax   uint32        // offset one past the highest octet sent
	lastData time.Duration // when the last data segment was sent
	dlv      spans         // octets delivered to the receiver
	WireStats
}

// sent takes a segment of the sender as it enters the link at now.
func (w *wire) sent(now time.Duration, t header.TCP) {
	if t.Flags()&header.TCPFlagSYN != 0 {
		w.synSeen, w.isn = true, t.Seq()+1
		return
	}
	n := len(t.Payload())
	if !w.synSeen || n == 0 {
		return
	}
	off := t.Seq() - w.isn
	end := off + uint32(n)
	w.DataSegments++
	if int32(off-w.sndMax) < 0 {
		w.Retransmits++
		if w.dlv.covers(off, end) {
			w.Spurious++
		}
		if gap := now - w.lastData; w.lastData > 0 && gap >= RTOGap {
			w.RTOs++
			w.RTOSeconds += gap.Seconds()
		}
	}
	if int32(end-w.sndMax) > 0 {
		w.sndMax = end
	}
	w.lastData = now
}

// delivered takes a segment of the sender as the link hands it to the
// receiver.
func (w *wire) delivered(t header.TCP) {
	n := len(t.Payload())
	if !w.synSeen || n == 0 || t.Flags()&header.TCPFlagSYN != 0 {
		return
	}
	off := t.Seq() - w.isn
	w.dlv.add(off, off+uint32(n))
}

// spans is a set of octet ranges [start, end), sorted and merged. A bulk
// stream's delivered octets are one range per hole the link made, and
// holes close as they are repaired.
type spans []span

type span struct{ start, end uint32 }

func (s *spans) add(start, end uint32) {
	v := *s
	// The first span that ends at or after start.
	i := sort.Search(len(v), func(i int) bool { return v[i].end >= start })
	j := i
	for j < len(v) && v[j].start <= end {
		start, end = min(start, v[j].start), max(end, v[j].end)
		j++
	}
	if i == j {
		v = append(v, span{})
		copy(v[i+1:], v[i:])
		v[i] = span{start, end}
	} else {
		v[i] = span{start, end}
		v = append(v[:i+1], v[j:]...)
	}
	*s = v
}

// covers: every octet of [start, end) is in the set.
func (s spans) covers(start, end uint32) bool {
	i := sort.Search(len(s), func(i int) bool { return s[i].end > start })
	return i < len(s) && s[i].start <= start && end <= s[i].end
}
