package header

import "encoding/binary"

// TCP option kinds and lengths (RFC 9293 §3.2, RFC 7323 §2.2 and §3.2,
// RFC 2018 §2 and §3).
const (
	tcpOptEOL       = 0
	tcpOptNOP       = 1
	tcpOptMSS       = 2
	tcpOptWS        = 3
	tcpOptSACKPerm  = 4
	tcpOptSACK      = 5
	tcpOptTimestamp = 8

	tcpOptMSSLen       = 4
	tcpOptWSLen        = 3
	tcpOptSACKPermLen  = 2
	tcpOptTimestampLen = 10
	tcpOptSACKBaseLen  = 2
	tcpOptSACKBlockLen = 8
)

// MaxSACKBlocks is the most SACK blocks an option list can carry: 4 take 34
// octets, and a fifth would not fit in the 40 of option space (RFC 2018 §3).
const MaxSACKBlocks = 4

// MaxWindowScale is the largest window scale shift (RFC 7323 §2.3).
const MaxWindowScale = 14

// SACKBlock is one block of a SACK option: the sequence numbers of the first
// octet received and of the octet just after the last (RFC 2018 §3).
type SACKBlock struct {
	Start, End uint32
}

// TCPOptions are the options of one segment that the engine understands.
// Each Has... flag says whether the option was present; the value beside it
// means nothing otherwise.
type TCPOptions struct {
	MSS            uint16 // Maximum Segment Size, SYN only (RFC 9293 §3.7.1)
	HasMSS         bool
	WindowScale    uint8 // shift count, SYN only (RFC 7323 §2)
	HasWindowScale bool
	SACKPermitted  bool // SYN only (RFC 2018 §2)
	HasTimestamp   bool // RFC 7323 §3
	TSVal, TSEcr   uint32
	SACK           [MaxSACKBlocks]SACKBlock // RFC 2018 §3; SACK[:NumSACK] are set
	NumSACK        int
}

// ParseTCPOptions fills o from the option list b (TCP.Options) and reports
// whether the list is well formed; o is cleared first. It never allocates
// and accepts any bytes.
//
// RFC 9293 §3.2: every option but End of Option List and No-Operation has a
// length octet; options the implementation does not know are skipped by it
// and ignored without error; an illegal length (e.g., zero) must be handled,
// the suggested procedure being to reset the connection and log the cause.
// So the list is malformed, and false returned, when a length octet is
// missing, below 2 or runs past the end, or when an option the engine knows
// has a length other than its own; o then holds what came before the fault
// and must not be used. End of Option List ends the walk. A window scale
// above 14 is read as 14 (RFC 7323 §2.3). A later copy of an option
// overrides an earlier one.
func ParseTCPOptions(b []byte, o *TCPOptions) bool {
	*o = TCPOptions{}
	for len(b) > 0 {
		switch b[0] {
		case tcpOptEOL:
			return true
		case tcpOptNOP:
			b = b[1:]
			continue
		}
		if len(b) < 2 {
			return false
		}
		n := int(b[1])
		if n < 2 || n > len(b) {
			return false
		}
		v := b[2:n]
		switch b[0] {
		case tcpOptMSS:
			if n != tcpOptMSSLen {
				return false
			}
			o.MSS, o.HasMSS = binary.BigEndian.Uint16(v), true
		case tcpOptWS:
			if n != tcpOptWSLen {
				return false
			}
			// RFC 7323 §2.3: a shift above 14 MUST be used as 14.
			o.WindowScale, o.HasWindowScale = min(v[0], MaxWindowScale), true
		case tcpOptSACKPerm:
			if n != tcpOptSACKPermLen {
				return false
			}
			o.SACKPermitted = true
		case tcpOptSACK:
			// RFC 2018 §3: length 2+8n for n blocks; more than 4 cannot fit.
			k := (n - tcpOptSACKBaseLen) / tcpOptSACKBlockLen
			if (n-tcpOptSACKBaseLen)%tcpOptSACKBlockLen != 0 || k < 1 || k > MaxSACKBlocks {
				return false
			}
			for i := range k {
				w := v[i*tcpOptSACKBlockLen:]
				o.SACK[i] = SACKBlock{binary.BigEndian.Uint32(w), binary.BigEndian.Uint32(w[4:])}
			}
			o.NumSACK = k
		case tcpOptTimestamp:
			if n != tcpOptTimestampLen {
				return false
			}
			o.TSVal, o.TSEcr = binary.BigEndian.Uint32(v), binary.BigEndian.Uint32(v[4:])
			o.HasTimestamp = true
		}
		b = b[n:]
	}
	return true
}

// tcpOptionsLayout returns the length EncodeTCPOptions writes for o and the
// number of SACK blocks that fit in it.
func tcpOptionsLayout(o *TCPOptions) (n, sack int) {
	if o.HasMSS {
		n += 4
	}
	if o.HasTimestamp {
		n += 12 // SACK-permitted rides in the two octets of padding
	} else if o.SACKPermitted {
		n += 4
	}
	if o.HasWindowScale {
		n += 4
	}
	sack = min(max(o.NumSACK, 0), MaxSACKBlocks, (TCPMaxOptionsLen-n-4)/tcpOptSACKBlockLen)
	if sack > 0 {
		n += 4 + sack*tcpOptSACKBlockLen
	}
	return n, sack
}

// TCPOptionsLen returns the number of octets EncodeTCPOptions writes for o:
// a multiple of 4, at most 40.
func TCPOptionsLen(o *TCPOptions) int {
	n, _ := tcpOptionsLayout(o)
	return n
}

// EncodeTCPOptions writes o into dst as Linux lays options out
// (tcp_options_write) and returns the length written, which TCPOptionsLen
// gives beforehand; dst must be at least that long. Each option is aligned
// on its own 32-bit word, so no trailing padding is ever needed:
//
//	MSS                                  kind 2, len 4
//	SACK-permitted, timestamps           kind 4, len 2; kind 8, len 10
//	  or NOP, NOP, timestamps            without SACK-permitted
//	NOP, NOP, SACK-permitted             without timestamps
//	NOP, window scale                    kind 3, len 3
//	NOP, NOP, SACK blocks                kind 5, len 2+8n
//
// A SYN sets the first four as negotiated; other segments carry timestamps
// and SACK blocks. The option space is 40 octets (RFC 9293 §3.1), so only as
// many of o.SACK[:o.NumSACK] are written as fit: 4 alone, 3 beside
// timestamps (RFC 2018 §3), fewer if SYN options are also set. The first
// blocks are kept, so put the most recent one first (RFC 2018 §4).
func EncodeTCPOptions(dst []byte, o *TCPOptions) int {
	n, sack := tcpOptionsLayout(o)
	if n == 0 {
		return 0
	}
	_ = dst[n-1]
	i := 0
	word := func(a, b, c, d byte) {
		dst[i], dst[i+1], dst[i+2], dst[i+3] = a, b, c, d
		i += 4
	}
	u32 := func(v uint32) {
		binary.BigEndian.PutUint32(dst[i:], v)
		i += 4
	}
	if o.HasMSS {
		word(tcpOptMSS, tcpOptMSSLen, byte(o.MSS>>8), byte(o.MSS))
	}
	if o.HasTimestamp {
		if o.SACKPermitted {
			word(tcpOptSACKPerm, tcpOptSACKPermLen, tcpOptTimestamp, tcpOptTimestampLen)
		} else {
			word(tcpOptNOP, tcpOptNOP, tcpOptTimestamp, tcpOptTimestampLen)
		}
		u32(o.TSVal)
		u32(o.TSEcr)
	} else if o.SACKPermitted {
		word(tcpOptNOP, tcpOptNOP, tcpOptSACKPerm, tcpOptSACKPermLen)
	}
	if o.HasWindowScale {
		word(tcpOptNOP, tcpOptWS, tcpOptWSLen, o.WindowScale)
	}
	if sack > 0 {
		word(tcpOptNOP, tcpOptNOP, tcpOptSACK, byte(tcpOptSACKBaseLen+sack*tcpOptSACKBlockLen))
		for _, s := range o.SACK[:sack] {
			u32(s.Start)
			u32(s.End)
		}
	}
	return i
}
