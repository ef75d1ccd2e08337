package mpa

import (
	"encoding/binary"
	"fmt"

	"github.com/softrnic/softrnic/ddp"
)

// StreamError is a framing error found in the received FPDU stream. Err is
// the LLP Terminate cause (CRC error, marker error) to report; after one, the
// parser delivers nothing more (RFC 5044 §8).
type StreamError struct {
	// Offset is the position in the FPDU stream of the FPDU at fault.
	Offset uint64
	Err    ddp.TerminateError
	Detail string
}

func (e *StreamError) Error() string {
	return fmt.Sprintf("mpa: FPDU at stream offset %d: %v: %s", e.Offset, e.Err, e.Detail)
}

// Unwrap gives the Terminate cause to errors.Is and errors.As.
func (e *StreamError) Unwrap() error { return e.Err }

// EventKind says what Parser.Next found.
type EventKind uint8

// Events.
const (
	// NeedMore: the input is used up with nothing to report.
	NeedMore EventKind = iota
	// Data: Event.Data holds ULPDU octets (markers removed, possibly none),
	// a sub-slice of the input, starting at Event.Offset within an ULPDU
	// of Event.ULPDULen octets; Event.End says the FPDU is complete.
	Data
)

// Event is one step of parsing.
type Event struct {
	Kind     EventKind
	Data     []byte
	Offset   int
	ULPDULen int
	// End: every octet of the FPDU has been delivered and its CRC, if
	// negotiated, verified. An FPDU that arrives whole in one input comes
	// as a single Data event with End set.
	End bool
}

type parseState uint8

const (
	stHeader parseState = iota
	stPayload
	stPad
	stCRC
	stFailed
)

// Parser reads one direction's FPDU stream, given in whatever pieces TCP
// delivers: a byte at a time, many FPDUs at once, or with a marker splitting
// a header. It never blocks and never buffers payload: ULPDU octets come back
// as sub-slices of the input, so the layer above can place them straight
// from the receive frame. Only the 2-byte length, a marker and the CRC are
// ever kept across calls.
//
// The CRC of an FPDU is checked only when its last octet arrives; the layer
// above must treat placed data as tentative until the End event.
type Parser struct {
	crc     bool
	markers bool

	state parseState
	// pos is the position of the next octet in the FPDU stream (see
	// Framer.pos); stream counts the same without wrapping, for errors.
	pos    uint32
	stream uint64
	// fpdu is the stream position of the current FPDU's ULPDU_Length.
	fpdu       uint32
	fpduOffset uint64

	have    int // octets of the current small field (header, marker, CRC) kept
	small   [4]byte
	inMark  bool // the current small field is a marker
	crcAcc  uint32
	ulpdu   int
	done    int // ULPDU octets delivered so far
	padLeft int
	// badMarker records a marker that disagrees with the ULPDU_Length
	// framing; it is reported at the end of the FPDU, after the CRC,
	// which takes precedence (RFC 5044 §8, code 3).
	badMarker string
	failed    error
}

// NewParser returns a Parser for a direction with the negotiated CRC and
// marker settings, positioned at the start of the FPDU stream.
func NewParser(crc, markers bool) *Parser { return &Parser{crc: crc, markers: markers} }

// Offset is the number of stream octets parsed so far: after an End event,
// where the next FPDU (or the marker before it) starts.
func (p *Parser) Offset() uint64 { return p.stream }

// Incomplete reports whether the octets parsed so far end inside an FPDU
// (or a marker): a stream that closes here lost the rest of it.
func (p *Parser) Incomplete() bool {
	return p.state != stHeader || p.have > 0
}

// Next consumes octets from b and reports the first thing that happens. It
// returns how many octets it used; call it again with the rest. After an
// error, the parser is failed and returns the same error.
func (p *Parser) Next(b []byte) (int, Event, error) {
	if p.failed != nil {
		return 0, Event{}, p.failed
	}
	used := 0
	for used < len(b) {
		// A marker is due at every multiple of 512 in the stream.
		if p.markers && (p.inMark || p.pos%MarkerInterval == 0) {
			n := p.readMarker(b[used:])
			used += n
			continue
		}
		switch p.state {
		case stHeader:
			if p.have == 0 {
				if n, ev, ok, err := p.whole(b[used:]); ok || err != nil {
					return used + n, ev, err
				}
			}
			k := min(len(b)-used, HeaderLen-p.have)
			copy(p.small[p.have:], b[used:used+k])
			p.feedCRC(b[used : used+k])
			p.advance(k)
			used += k
			if p.have == 0 {
				p.fpdu = p.pos - uint32(k)
				p.fpduOffset = p.stream - uint64(k)
			}
			p.have += k
			if p.have < HeaderLen {
				continue
			}
			p.have = 0
			p.ulpdu = int(binary.BigEndian.Uint16(p.small[:HeaderLen]))
			p.done = 0
			p.padLeft = PadLen(p.ulpdu)
			p.state = stPayload
			if p.ulpdu == 0 {
				p.state = stPad
			}
		case stPayload:
			k := min(len(b)-used, p.ulpdu-p.done)
			if p.markers {
				k = min(k, int(MarkerInterval-p.pos%MarkerInterval))
			}
			data := b[used : used+k]
			p.feedCRC(data)
			p.advance(k)
			used += k
			ev := Event{Kind: Data, Data: data, Offset: p.done, ULPDULen: p.ulpdu}
			p.done += k
			if p.done == p.ulpdu {
				p.state = stPad
			}
			return used, ev, nil
		case stPad:
			k := min(len(b)-used, p.padLeft)
			p.feedCRC(b[used : used+k])
			p.advance(k)
			used += k
			p.padLeft -= k
			if p.padLeft == 0 {
				p.state = stCRC
			}
		case stCRC:
			k := min(len(b)-used, CRCLen-p.have)
			copy(p.small[p.have:], b[used:used+k])
			p.advance(k)
			used += k
			p.have += k
			if p.have < CRCLen {
				continue
			}
			p.have = 0
			if err := p.endFPDU(); err != nil {
				return used, Event{}, err
			}
			return used, Event{Kind: Data, Offset: p.done, ULPDULen: p.ulpdu, End: true}, nil
		}
	}
	return used, Event{}, nil
}

// whole is the fast path: an FPDU that lies entirely in b, with no marker
// inside it, is checked with one CRC pass and delivered as one event.
func (p *Parser) whole(b []byte) (int, Event, bool, error) {
	if len(b) < HeaderLen {
		return 0, Event{}, false, nil
	}
	n := int(binary.BigEndian.Uint16(b))
	total := FPDULen(n)
	if len(b) < total || p.markers && total > int(MarkerInterval-p.pos%MarkerInterval) {
		return 0, Event{}, false, nil
	}
	p.fpdu = p.pos
	p.fpduOffset = p.stream
	p.ulpdu = n
	p.feedCRC(b[:total-CRCLen])
	copy(p.small[:CRCLen], b[total-CRCLen:total])
	p.advance(total)
	if err := p.endFPDU(); err != nil {
		return total, Event{}, true, err
	}
	return total, Event{Kind: Data, Data: b[HeaderLen : HeaderLen+n], ULPDULen: n, End: true}, true, nil
}

// readMarker consumes up to a whole marker and checks its FPDUPTR once it is
// complete.
func (p *Parser) readMarker(b []byte) int {
	if !p.inMark {
		p.inMark = true
		p.have = 0
		if p.state == stHeader {
			// Between FPDUs: this marker opens the next FPDU, whose
			// CRC covers it (RFC 5044 §4.4 rule 2). Headers start
			// 4-aligned, so no header octet has been read yet.
			p.crcAcc = 0
		}
	}
	// A marker may interrupt the 2-byte header or CRC field only at a
	// 4-octet boundary, which those fields never straddle, so the small
	// buffer is free while the marker is read.
	k := min(len(b), MarkerLen-p.have)
	copy(p.small[p.have:], b[:k])
	p.feedCRC(b[:k])
	p.advance(k)
	p.have += k
	if p.have < MarkerLen {
		return k
	}
	p.inMark = false
	p.have = 0
	ptr := uint32(binary.BigEndian.Uint16(p.small[2:4])) &^ 3 // low bits are treated as zero (§4.2)
	markerPos := p.pos - MarkerLen
	if p.state == stHeader {
		if ptr != 0 && p.badMarker == "" {
			p.badMarker = fmt.Sprintf("marker between FPDUs has FPDUPTR %d, want 0", ptr)
		}
	} else if want := markerPos - p.fpdu; ptr != want&0xffff && p.badMarker == "" {
		p.badMarker = fmt.Sprintf("marker FPDUPTR %d, ULPDU_Length framing says %d", ptr, want)
	}
	return k
}

func (p *Parser) feedCRC(b []byte) {
	if p.crc {
		p.crcAcc = updateCRC(p.crcAcc, b)
	}
}

func (p *Parser) advance(k int) {
	p.pos += uint32(k)
	p.stream += uint64(k)
}

func (p *Parser) endFPDU() error {
	var err error
	switch {
	case p.crc && WireCRC(p.small[:CRCLen]) != p.crcAcc:
		err = &StreamError{Offset: p.fpduOffset, Err: ddp.LLPCRC,
			Detail: fmt.Sprintf("CRC %08x on the wire, %08x computed", WireCRC(p.small[:CRCLen]), p.crcAcc)}
	case p.badMarker != "":
		err = &StreamError{Offset: p.fpduOffset, Err: ddp.LLPMarker, Detail: p.badMarker}
	}
	if err != nil {
		p.failed = err
		p.state = stFailed
		return err
	}
	p.state = stHeader
	p.crcAcc = 0
	return nil
}

// Assembler collects whole ULPDUs from a Parser, copying them. It is for
// tools and tests that want messages rather than placement; the datapath
// uses Parser directly.
type Assembler struct {
	p   *Parser
	cur []byte
}

// NewAssembler returns an Assembler over a new Parser.
func NewAssembler(crc, markers bool) *Assembler {
	return &Assembler{p: NewParser(crc, markers)}
}

// Feed parses b and appends every ULPDU it completes to out.
func (a *Assembler) Feed(b []byte, out [][]byte) ([][]byte, error) {
	for len(b) > 0 {
		n, ev, err := a.p.Next(b)
		b = b[n:]
		if err != nil {
			return out, err
		}
		if ev.Kind != Data {
			continue
		}
		if a.cur == nil {
			a.cur = make([]byte, 0, ev.ULPDULen)
		}
		a.cur = append(a.cur, ev.Data...)
		if ev.End {
			out = append(out, a.cur)
			a.cur = nil
		}
	}
	return out, nil
}
