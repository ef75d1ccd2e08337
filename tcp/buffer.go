package tcp

import (
	"math/bits"
	"sync"
)

// Buffer memory. A connection's send and receive buffers are rings that
// hold what is queued, not what could be: Options.SendBuffer and
// ReceiveBuffer bound them (and the receive window promises that much
// room), but a ring is taken from a shared pool only when octets must be
// held, grows by doubling as more are, and goes back to the pool as soon
// as it is empty. An idle connection holds no buffer, so ten thousand of
// them cost their state and nothing more (issue 16); a busy one takes
// rings from the pool without allocating, once the pool has them. The
// pool is sync.Pool's: what a burst left in it is freed by the next
// garbage collections.

// minRing is the smallest ring: an MPA startup frame, or a few FPDUs.
const minRing = 4 << 10

// ringClasses are the pooled ring sizes, minRing<<k for k below it (up to
// 1 GiB, the largest buffer Options allow).
const ringClasses = 19

// ringPool holds free rings by class; each entry is a *[]byte of exactly
// its class's size.
var ringPool [ringClasses]sync.Pool

// ring is the memory of a buffer.
type ring struct {
	b []byte
	// pb is b's handle in ringPool; nil for a ring of an odd size (a
	// buffer whose size is not a pooled class), which is left to the
	// garbage collector.
	pb *[]byte
}

// ringSize is the size of ring that holds need octets for a buffer of at
// most limit: the smallest class that does, or limit itself.
func ringSize(need, limit int) int {
	c := minRing
	if need > c {
		c = 1 << bits.Len(uint(need-1))
	}
	return min(c, limit)
}

// takeRing returns a ring of size n, from the pool when n is a class.
func takeRing(n int) ring {
	k := bits.Len(uint(n/minRing)) - 1
	if n%minRing != 0 || n != minRing<<k || k >= ringClasses {
		return ring{b: make([]byte, n)}
	}
	pb, _ := ringPool[k].Get().(*[]byte)
	if pb == nil {
		b := make([]byte, n)
		pb = &b
	}
	return ring{b: *pb, pb: pb}
}

// put gives the ring back; r is empty after.
func (r *ring) put() {
	if r.pb != nil {
		ringPool[bits.Len(uint(len(r.b)/minRing))-1].Put(r.pb)
	}
	*r = ring{}
}

// sendBuf holds the octets between SND.UNA and what the application has
// written: sent and unacknowledged, then not yet sent. Retransmissions are
// read from it. Its ring exists while it holds octets (see Buffer memory).
type sendBuf struct {
	r     ring
	size  int
	head  int // ring index of the octet at start
	n     int // octets held
	start Seq // sequence number of the first octet held
	// peak is the most octets held since the ring was taken, and next
	// the ring size the next busy period starts with: the last one's
	// peak, so that a stream which drains between messages does not
	// grow its ring from the smallest class again for each.
	peak, next int
}

func newSendBuf(size int) sendBuf { return sendBuf{size: size} }

func (s *sendBuf) free() int { return s.size - s.n }

// end is the sequence number after the last octet held.
func (s *sendBuf) end() Seq { return s.start.Add(s.n) }

// tail returns the contiguous free space after the last octet in the ring
// as it is; nil when the ring is full or there is none. It never grows the
// ring: a producer may have nothing to put there (write grows it).
func (s *sendBuf) tail() []byte {
	c := len(s.r.b)
	if s.n == c {
		return nil
	}
	t := (s.head + s.n) % c
	if t >= s.head {
		return s.r.b[t:]
	}
	return s.r.b[t:s.head]
}

// added counts k octets a producer put in the tail.
func (s *sendBuf) added(k int) {
	s.n += k
	s.peak = max(s.peak, s.n)
}

// grow makes the ring hold at least need octets (up to the buffer's size),
// moving what it holds to the start of a larger ring.
func (s *sendBuf) grow(need int) {
	c := ringSize(max(need, s.next), s.size)
	if c <= len(s.r.b) {
		return
	}
	nr := takeRing(c)
	if s.n > 0 {
		k := copy(nr.b[:s.n], s.r.b[s.head:])
		copy(nr.b[k:s.n], s.r.b)
	}
	s.r.put()
	s.r, s.head = nr, 0
}

// write appends as much of p as fits.
func (s *sendBuf) write(p []byte) int {
	p = p[:min(len(p), s.free())]
	if s.n+len(p) > len(s.r.b) {
		s.grow(s.n + len(p))
	}
	total := 0
	for len(p) > 0 {
		k := copy(s.tail(), p)
		s.added(k)
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
	i := (s.head + off) % len(s.r.b)
	k := copy(dst[:want], s.r.b[i:])
	if k < want {
		k += copy(dst[k:want], s.r.b)
	}
	return k
}

// release drops the octets before seq (acknowledged); the ring goes back
// to the pool once nothing is held.
func (s *sendBuf) release(seq Seq) {
	k := seq.Sub(s.start)
	if k <= 0 {
		return
	}
	k = min(k, s.n)
	s.n -= k
	s.start = s.start.Add(k)
	if s.n == 0 {
		s.drop()
		return
	}
	s.head = (s.head + k) % len(s.r.b)
}

// drop gives the ring back and forgets what it held (all acknowledged, or
// the connection is over).
func (s *sendBuf) drop() {
	if s.r.b != nil && s.peak > 0 {
		// A ring taken for a fill that found nothing to send has no
		// busy period to remember: the last one's size stands.
		s.next = s.peak
	}
	s.r.put()
	s.start = s.start.Add(s.n)
	s.head, s.n, s.peak = 0, 0, 0
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
// out-of-order octets at their place in sequence space. Its ring exists
// while it holds octets (see Buffer memory): an idle connection, or one
// whose consumer takes everything in order, holds none. The window
// advertised is its size, a promise of room and not memory already
// taken: octets that arrive within it are given a ring as they come.
type recvBuf struct {
	r    ring
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
	if len(r.r.b) > 0 {
		r.head = (r.head + k) % len(r.r.b)
	}
	r.start = r.start.Add(k)
}

// put copies p to its place at sequence number seq, which must lie inside
// the buffer, growing the ring to reach it.
func (r *recvBuf) put(seq Seq, p []byte) {
	if len(p) == 0 {
		return
	}
	off := seq.Sub(r.start)
	if off+len(p) > len(r.r.b) {
		r.grow(off + len(p))
	}
	i := (r.head + off) % len(r.r.b)
	k := copy(r.r.b[i:], p)
	if k < len(p) {
		copy(r.r.b, p[k:])
	}
}

// grow makes the ring reach need octets past start, moving what it holds
// (in order, then out of order up to the last range) to the start of a
// larger one.
func (r *recvBuf) grow(need int) {
	old := len(r.r.b)
	nr := takeRing(ringSize(need, r.size))
	if old > 0 {
		ext := r.n
		if len(r.ooo) > 0 {
			ext = max(ext, r.ooo[len(r.ooo)-1].end.Sub(r.start))
		}
		ext = min(ext, old)
		k := copy(nr.b[:ext], r.r.b[r.head:])
		copy(nr.b[k:ext], r.r.b)
	}
	r.r.put()
	r.r, r.head = nr, 0
}

// consume drops k octets from the front (taken by the consumer); the ring
// goes back to the pool once nothing is held.
func (r *recvBuf) consume(k int) {
	if k == 0 {
		return
	}
	r.head = (r.head + k) % len(r.r.b)
	r.start = r.start.Add(k)
	r.n -= k
	r.dropIfEmpty()
}

// dropIfEmpty gives the ring back when it holds nothing, in order or out
// of it: after the consumer took octets, and after in-order octets the
// handler took directly covered the last out-of-order range (else a peer
// could leave a full ring on an idle connection with one stray octet).
func (r *recvBuf) dropIfEmpty() {
	if r.n == 0 && len(r.ooo) == 0 && r.r.b != nil {
		r.drop()
	}
}

// drop gives the ring back and forgets the out-of-order ranges: nothing
// is held in order (consumed, or the connection is over).
func (r *recvBuf) drop() {
	r.r.put()
	r.head = 0
	r.ooo, r.last = nil, -1
}

// peek returns the first contiguous run of in-order octets.
func (r *recvBuf) peek() []byte {
	if r.n == 0 {
		return nil
	}
	end := r.head + r.n
	if end <= len(r.r.b) {
		return r.r.b[r.head:end]
	}
	return r.r.b[r.head:]
}

// addOOO records [seq, seq+len(p)) beyond RCV.NXT and copies it in. It
// returns false when the range cannot be tracked (too many holes).
func (r *recvBuf) addOOO(seq Seq, p []byte) bool {
	_, ok := r.addOOOCount(seq, p)
	return ok
}

// addOOOCount is addOOO, also saying how many of the octets were new.
func (r *recvBuf) addOOOCount(seq Seq, p []byte) (int, bool) {
	l, i, added, ok := mergeSpan(r.ooo, span{seq, seq.Add(len(p))}, maxOOO)
	if !ok {
		return 0, false
	}
	r.ooo, r.last = l, i
	r.put(seq, p)
	return added, true
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
	r.dropIfEmpty()
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
