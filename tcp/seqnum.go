package tcp

// Seq is a TCP sequence number. Comparisons are modulo 2^32 (RFC 9293
// §3.4): a is before b when b-a, as a signed 32-bit value, is positive.
type Seq uint32

// LessThan: s comes before t.
func (s Seq) LessThan(t Seq) bool { return int32(s-t) < 0 }

// LessEq: s comes before t or is t.
func (s Seq) LessEq(t Seq) bool { return int32(s-t) <= 0 }

// InWindow: s is in [first, first+size).
func (s Seq) InWindow(first Seq, size uint32) bool { return uint32(s-first) < size }

// Add returns s advanced by n.
func (s Seq) Add(n int) Seq { return s + Seq(uint32(n)) }

// Sub returns s - t as a signed distance (negative when s is before t).
func (s Seq) Sub(t Seq) int { return int(int32(s - t)) }

// maxSeq returns the later of two sequence numbers.
func maxSeq(a, b Seq) Seq {
	if a.LessThan(b) {
		return b
	}
	return a
}

// minSeq returns the earlier of two sequence numbers.
func minSeq(a, b Seq) Seq {
	if a.LessThan(b) {
		return a
	}
	return b
}
