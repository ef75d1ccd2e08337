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
	if h.DDPVersion() != DDPVersion {
		if h.Tagged() {
			return Segment{}, DDPTaggedBadVersion
		}
		return Segment{}, DDPUntaggedBadVersion
	}
	if h.RDMAPVersion() != RDMAPVersion {
		return Segment{}, RDMAPInvalidVersion
	}
	info := h.Opcode().Info()
	if !info.Defined || info.Tagged != h.Tagged() {
		return Segment{}, RDMAPUnexpectedOpcode
	}
	if !h.Tagged() && Untagged(b).QN() != info.QN {
		return Segment{}, DDPUntaggedInvalidQN
	}
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
