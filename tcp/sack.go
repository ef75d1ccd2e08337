package tcp

// dupThresh is DupThresh of RFC 6675 §2 and RFC 5681 §3.2.
const dupThresh = 3

// maxScoreboard bounds the SACKed ranges the sender remembers.
const maxScoreboard = 256

// scoreboard is the sender's record of SACKed ranges above SND.UNA (RFC
// 6675 §3): sorted, disjoint, not adjacent.
type scoreboard struct {
	s      []span
	sacked int // octets covered
}

// reset forgets every range, and the list's memory with them: a
// connection past its loss episodes holds none (see Buffer memory).
func (sb *scoreboard) reset() { sb.s, sb.sacked = nil, 0 }

// empty: nothing is SACKed.
func (sb *scoreboard) empty() bool { return len(sb.s) == 0 }

// highest is the end of the highest SACKed range.
func (sb *scoreboard) highest() Seq { return sb.s[len(sb.s)-1].end }

// add records a SACK block, already checked to lie in (SND.UNA, SND.MAX].
// It returns whether it covered anything new.
func (sb *scoreboard) add(b span) bool {
	l, _, added, ok := mergeSpan(sb.s, b, maxScoreboard)
	if !ok || added == 0 {
		return false
	}
	sb.s = l
	sb.sacked += added
	return true
}

// release forgets what lies below una (cumulatively acknowledged).
func (sb *scoreboard) release(una Seq) {
	k := 0
	for k < len(sb.s) && sb.s[k].end.LessEq(una) {
		sb.sacked -= sb.s[k].len()
		k++
	}
	switch {
	case k == len(sb.s):
		sb.reset()
		return
	case k > 0:
		sb.s = sb.s[:copy(sb.s, sb.s[k:])]
	}
	if len(sb.s) > 0 && sb.s[0].start.LessThan(una) {
		sb.sacked -= una.Sub(sb.s[0].start)
		sb.s[0].start = una
	}
}

// lostBelow returns the sequence number under which every un-SACKed octet
// counts as lost (RFC 6675 §4 IsLost: more than (DupThresh-1)*SMSS octets
// SACKed above it, or DupThresh discontiguous SACKed ranges above it, with
// thresh as DupThresh).
// ok is false when nothing is lost.
func (sb *scoreboard) lostBelow(mss, thresh int) (Seq, bool) {
	above := 0
	for i := len(sb.s) - 1; i >= 0; i-- {
		r := sb.s[i]
		above += r.len()
		// Every hole below r has r and the ranges above it SACKed
		// above it; holes are never inside a range.
		if len(sb.s)-i >= thresh || above > (thresh-1)*mss {
			return r.start, true
		}
	}
	return 0, false
}

// nextHole returns the first un-SACKed range at or after from and before
// limit, at most max octets long.
func (sb *scoreboard) nextHole(from, limit Seq, max int) (span, bool) {
	for _, r := range sb.s {
		if r.end.LessEq(from) {
			continue
		}
		if from.LessThan(r.start) {
			end := minSeq(r.start, limit)
			if !from.LessThan(end) {
				return span{}, false
			}
			if end.Sub(from) > max {
				end = from.Add(max)
			}
			return span{from, end}, true
		}
		from = r.end // inside a SACKed range: skip it
	}
	return span{}, false
}

// holeOctets counts un-SACKed octets in [from, to).
func (sb *scoreboard) holeOctets(from, to Seq) int {
	if !from.LessThan(to) {
		return 0
	}
	n := to.Sub(from)
	for _, r := range sb.s {
		lo, hi := maxSeq(r.start, from), minSeq(r.end, to)
		if lo.LessThan(hi) {
			n -= hi.Sub(lo)
		}
	}
	return n
}
