package tcp

// sendBuf holds the octets between SND.UNA and what the application has
// written: sent and unacknowledged, then not yet sent. Retransmissions are
// read from it.
type sendBuf struct {
	// b is allocated on first use: an idle connection holds no buffer.
	b     []byte
	size  int
	head  int // ring index of the octet at start
	n     int // octets held
	start Seq // sequence number of the first octet held
}

func newSendBuf(size int) sendBuf { return sendBuf{size: size} }

func (s *sendBuf) free() int { return s.size - s.n }

// end is the sequence number after the last octet held.
func (s *sendBuf) end() Seq { return s.start.Add(s.n) }

// tail returns the contiguous free space after the last octet.
func (s *sendBuf) tail() []byte {
	if s.n == s.size {
		return nil
	}
	if s.b == nil {
		s.b = make([]byte, s.size)
	}
	t := (s.head + s.n) % len(s.b)
	if t >= s.head {
		return s.b[t:]
	}
	return s.b[t:s.head]
}

// write appends as much of p as fits.
func (s *sendBuf) write(p []byte) int {
	total := 0
	for len(p) > 0 {
		t := s.tail()
		if len(t) == 0 {
			break
		}
		k := copy(t, p)
		s.n += k
		total += k
		p = p[k:]
	}
	return total
}

// read copies held octets from seq on into dst.
func (s *sendBuf) read(dst []byte, seq Seq) int {
	off := seq.Sub(s.start)
	if off < 0 || off >= s.n {
		return 0
	}
	want := min(len(dst), s.n-off)
	i := (s.head + off) % len(s.b)
	k := copy(dst[:want], s.b[i:])
	if k < want {
		k += copy(dst[k:want], s.b)
	}
	return k
}

// release drops the octets before seq (acknowledged).
func (s *sendBuf) release(seq Seq) {
	k := seq.Sub(s.start)
	if k <= 0 {
		return
	}
	k = min(k, s.n)
	s.head = (s.head + k) % len(s.b)
	s.n -= k
	s.start = s.start.Add(k)
	if s.n == 0 {
		s.head = 0
	}
}

// span is a range of sequence space [start, end).
type span struct{ start, end Seq }

func (s span) len() int { return s.end.Sub(s.start) }

// contains reports whether b lies within s.
func (s span) contains(b span) bool { return s.start.LessEq(b.start) && b.end.LessEq(s.end) }

// maxOOO bounds the out-of-order ranges a receive buffer tracks; a segment
// that would need more is dropped (the sender retransmits it). A window
// of 4 MiB holds about 2900 segments: at 1% loss and 1% reordering, 32
// ranges were too few, and every segment beyond them was dropped and sent
// again (a Linux sender retransmitted 2762 segments for 217 lost).
const maxOOO = 256

// recvBuf holds received octets the consumer has not taken, followed by
// out-of-order octets at their place in sequence space.
type recvBuf struct {
	// b is allocated when octets must be held: an idle connection, or one
	// whose consumer takes everything in order, holds no buffer.
	b    []byte
	size int
	head int // ring index of the octet at start
	// start is the first octet not consumed; [start, start+n) is in
	// order and waiting for the consumer; RCV.NXT = start+n.
	start Seq
	n     int
	// ooo are the out-of-order ranges held beyond RCV.NXT, sorted,
	// disjoint and not adjacent; last is the range most recently added
	// to, reported first in SACK (RFC 2018 §4).
	ooo  []span
	last int
}

func newRecvBuf(size int) recvBuf { return recvBuf{size: size, last: -1} }

// window is the space from RCV.NXT to the end of the buffer.
func (r *recvBuf) window() int { return r.size - r.n }

// rightEdge is the sequence number after the last octet the buffer can hold.
func (r *recvBuf) rightEdge() Seq { return r.start.Add(r.size) }

// skip passes over k octets at RCV.NXT that the consumer took straight
// from the segment, as if they had been put and consumed.
func (r *recvBuf) skip(k int) {
	if r.b != nil {
		r.head = (r.head + k) % len(r.b)
	}
	r.start = r.start.Add(k)
}

// put copies p to its place at sequence number seq, which must lie inside
// the buffer.
func (r *recvBuf) put(seq Seq, p []byte) {
	if len(p) == 0 {
		return
	}
	if r.b == nil {
		r.b = make([]byte, r.size)
		r.head = 0
	}
	off := seq.Sub(r.start)
	i := (r.head + off) % len(r.b)
	k := copy(r.b[i:], p)
	if k < len(p) {
		copy(r.b, p[k:])
	}
}

// consume drops k octets from the front (taken by the consumer).
func (r *recvBuf) consume(k int) {
	if k == 0 {
		return
	}
	r.head = (r.head + k) % len(r.b)
	r.start = r.start.Add(k)
	r.n -= k
}

// peek returns the first contiguous run of in-order octets.
func (r *recvBuf) peek() []byte {
	if r.n == 0 {
		return nil
	}
	end := r.head + r.n
	if end <= len(r.b) {
		return r.b[r.head:end]
	}
	return r.b[r.head:]
}

// addOOO records [seq, seq+len(p)) beyond RCV.NXT and copies it in. It
// returns false when the range cannot be tracked (too many holes).
func (r *recvBuf) addOOO(seq Seq, p []byte) bool {
	l, i, _, ok := mergeSpan(r.ooo, span{seq, seq.Add(len(p))}, maxOOO)
	if !ok {
		return false
	}
	r.ooo, r.last = l, i
	r.put(seq, p)
	return true
}

// mergeSpan inserts b into l, a sorted list of disjoint, non-adjacent
// ranges of at most limit entries, merging the ranges it touches. It
// returns the list, the index of the range holding b, the octets b
// added, and false (l unchanged) when b needs an entry of its own in a
// full list.
func mergeSpan(l []span, b span, limit int) ([]span, int, int, bool) {
	// The first range that ends at or after b.start, by bisection: the
	// list can be long while a window has many holes.
	i, hi := 0, len(l)
	for i < hi {
		m := int(uint(i+hi) >> 1)
		if l[m].end.LessThan(b.start) {
			i = m + 1
		} else {
			hi = m
		}
	}
	j, merged, old := i, b, 0
	for j < len(l) && l[j].start.LessEq(merged.end) {
		merged.start = minSeq(merged.start, l[j].start)
		merged.end = maxSeq(merged.end, l[j].end)
		old += l[j].len()
		j++
	}
	if i == j && len(l) >= limit {
		return l, 0, 0, false
	}
	// Replace l[i:j] by the merged range.
	if i == j {
		l = append(l, span{})
		copy(l[i+1:], l[i:])
	} else if j > i+1 {
		l = append(l[:i+1], l[j:]...)
	}
	l[i] = merged
	return l, i, merged.len() - old, true
}

// advance moves RCV.NXT over octets now in order: the ones just put at
// RCV.NXT (k of them) and any out-of-order range they reach.
func (r *recvBuf) advance(k int) {
	r.n += k
	nxt := r.start.Add(r.n)
	for len(r.ooo) > 0 && r.ooo[0].start.LessEq(nxt) {
		if nxt.LessThan(r.ooo[0].end) {
			r.n += r.ooo[0].end.Sub(nxt)
			nxt = r.ooo[0].end
		}
		r.ooo = r.ooo[:copy(r.ooo, r.ooo[1:])]
		r.last--
	}
	if r.last < 0 && len(r.ooo) > 0 {
		r.last = 0
	}
}

// sackBlocks fills dst with the out-of-order ranges, the most recent first
// (RFC 2018 §4), and returns how many.
func (r *recvBuf) sackBlocks(dst []span) int {
	if len(r.ooo) == 0 {
		return 0
	}
	n := 0
	if r.last >= 0 && r.last < len(r.ooo) {
		dst[n] = r.ooo[r.last]
		n++
	}
	for i := len(r.ooo) - 1; i >= 0 && n < len(dst); i-- {
		if i != r.last {
			dst[n] = r.ooo[i]
			n++
		}
	}
	return n
}
