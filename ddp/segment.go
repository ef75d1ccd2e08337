package ddp

// Segment is one DDP segment checked by ParseSegment: views into the bytes it
// was parsed from, valid as long as they are.
type Segment struct {
	Header Header
	// Body is the fixed RDMAP body after the DDP header: a Read Request, an
	// atomic request or response, immediate data, or a Terminate (whose
	// length varies: check Terminate.IsValid). Nil for other opcodes.
	Body []byte
	// Payload is the ULP payload of Writes, Read Responses and Sends.
	Payload []byte
}

// Opcode returns the segment's RDMAP opcode.
func (s *Segment) Opcode() Opcode { return s.Header.Opcode() }

// ParseSegment checks a DDP segment (one ULPDU) in the order a receiver must:
// header length, DDP version (RFC 5041 §7.1), RDMAP version and opcode
// (RFC 5040 §7.2), queue number, and the length of fixed bodies. The error,
// if any, is the TerminateError to report.
func ParseSegment(b []byte) (Segment, error) {
	h := Header(b)
	if !h.IsValid() {
		// Too short to hold the header its T bit announces: the segment
		// cannot be attributed to any buffer.
		return Segment{}, DDPLocalCatastrophic
	}
	if err := CheckHeader(h); err != nil {
		return Segment{}, err
	}
	info := h.Opcode().Info()
	s := Segment{Header: h[:h.Len()]}
	rest := b[h.Len():]
	switch {
	case info.Payload:
		s.Payload = rest
	case h.Opcode() == OpTerminate:
		s.Body = rest
	default:
		if len(rest) != info.BodyLen {
			return Segment{}, RDMAPOperationUnspecified
		}
		s.Body = rest
	}
	return s, nil
}

// CheckHeader makes the receive checks that need only a whole, valid DDP
// header: DDP version, RDMAP version, opcode and queue number.
func CheckHeader(h Header) error {
	if h.DDPVersion() != DDPVersion {
		if h.Tagged() {
			return DDPTaggedBadVersion
		}
		return DDPUntaggedBadVersion
	}
	if h.RDMAPVersion() != RDMAPVersion {
		return RDMAPInvalidVersion
	}
	info := h.Opcode().Info()
	if !info.Defined || info.Tagged != h.Tagged() {
		return RDMAPUnexpectedOpcode
	}
	if !h.Tagged() && Untagged(h).QN() != info.QN {
		return DDPUntaggedInvalidQN
	}
	return nil
}
