package mpa

import (
	"bytes"
	"errors"
	"testing"

	"github.com/softrnic/softrnic/ddp"
)

func TestFrameVectors(t *testing.T) {
	cases := []struct {
		name string
		f    Frame
		wire string
	}{
		// RFC 5044 rev 1, CRC asked, 3 octets of private data.
		{"v1 request", Frame{CRC: true, Revision: 1, PrivateData: []byte("abc")},
			"4d504120494420526571204672616d65 40 01 0003 616263"},
		// A v1 reply with markers and reject, no private data.
		{"v1 reject", Frame{Reply: true, Markers: true, Reject: true, Revision: 1},
			"4d504120494420526570204672616d65 a0 01 0000"},
		// Linux siw as rping client with mpa_crc_required=1: flags 0x50
		// (C and S), IRD/ORD 1/1 (interop notes in shared/interop).
		{"siw request", Frame{CRC: true, Revision: 2, Enhanced: true, IRD: 1, ORD: 1},
			"4d504120494420526571204672616d65 50 02 0004 0001 0001"},
		// siw with peer_to_peer=1: Request 80 01 c0 01 (A; C and D).
		{"siw p2p request", Frame{Revision: 2, Enhanced: true, IRD: 1, ORD: 1, PeerToPeer: true, RTR: RTRWrite | RTRRead},
			"4d504120494420526571204672616d65 10 02 0004 8001 c001"},
		// and its Reply 80 01 80 01 (A; C: zero-length Write), with
		// private data after the enhanced words.
		{"siw p2p reply", Frame{Reply: true, Revision: 2, Enhanced: true, IRD: 1, ORD: 1, PeerToPeer: true, RTR: RTRWrite, PrivateData: []byte{9}},
			"4d504120494420526570204672616d65 10 02 0005 8001 8001 09"},
		{"send RTR", Frame{Revision: 2, Enhanced: true, IRD: 0x3fff, ORD: 16, PeerToPeer: true, RTR: RTRSend},
			"4d504120494420526571204672616d65 10 02 0004 ffff 0010"},
	}
	for _, c := range cases {
		got, err := c.f.Append(nil)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		want := unhex(t, c.wire)
		if !bytes.Equal(got, want) {
			t.Errorf("%s:\n got %x\nwant %x", c.name, got, want)
			continue
		}
		back, n, err := ParseFrame(want, c.f.Reply)
		if err != nil || n != len(want) {
			t.Fatalf("%s: parse: %v (n %d)", c.name, err, n)
		}
		if back.Reply != c.f.Reply || back.Markers != c.f.Markers || back.CRC != c.f.CRC ||
			back.Reject != c.f.Reject || back.Revision != c.f.Revision || back.Enhanced != c.f.Enhanced ||
			back.IRD != c.f.IRD || back.ORD != c.f.ORD || back.PeerToPeer != c.f.PeerToPeer ||
			back.RTR != c.f.RTR || !bytes.Equal(back.PrivateData, c.f.PrivateData) {
			t.Errorf("%s: parsed %+v, want %+v", c.name, back, c.f)
		}
	}
}

func TestParseFrameErrors(t *testing.T) {
	good, _ := (&Frame{Revision: 2, Enhanced: true, IRD: 4, ORD: 4, PrivateData: []byte("hi")}).Append(nil)
	mod := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	cases := []struct {
		name  string
		b     []byte
		reply bool
		want  error
	}{
		{"short header", good[:19], false, ErrShortFrame},
		{"short private data", good[:len(good)-1], false, ErrShortFrame},
		{"reply key in a request", good, true, ErrBadKey},
		{"bad key", mod(func(b []byte) []byte { b[3] = 'x'; return b }), false, ErrBadKey},
		{"bad key known from 16 octets", []byte("GET / HTTP/1.1\r\n"), false, ErrBadKey},
		{"bad key before a huge PD_Length", []byte("GET / HTTP/1.1\r\nHost: a\r\n"), false, ErrBadKey},
		{"revision 0", mod(func(b []byte) []byte { b[17] = 0; return b }), false, ErrBadRevision},
		{"revision 3", mod(func(b []byte) []byte { b[17] = 3; return b }), false, ErrBadRevision},
		{"private data 513", mod(func(b []byte) []byte { b[18], b[19] = 0x02, 0x01; return b }), false, ErrPrivateData},
		{"S without room", mod(func(b []byte) []byte { b[19] = 2; return b[:22] }), false, ErrEnhancedMissing},
	}
	for _, c := range cases {
		_, _, err := ParseFrame(c.b, c.reply)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
		if c.want != ErrShortFrame && !errors.Is(err, ddp.LLPInvalidFrame) {
			t.Errorf("%s: %v does not map to the invalid-frame Terminate code", c.name, err)
		}
	}
	// Res bits and R in a Request are not checked on receipt.
	b := mod(func(b []byte) []byte { b[16] |= 0x2f; return b })
	f, _, err := ParseFrame(b, false)
	if err != nil || f.Reject {
		t.Fatalf("reserved bits: %+v %v", f, err)
	}
	// Exactly 512 octets of private data are allowed; 513 are not sent.
	big := Frame{Revision: 2, Enhanced: true, PrivateData: make([]byte, 508)}
	if w, err := big.Append(nil); err != nil || len(w) != FrameHeaderLen+512 {
		t.Fatalf("512 octets: %v", err)
	}
	big.PrivateData = make([]byte, 509)
	if _, err := big.Append(nil); !errors.Is(err, ErrPrivateData) {
		t.Fatalf("513 octets: %v", err)
	}
	if _, err := (&Frame{Revision: 1, Enhanced: true}).Append(nil); err == nil {
		t.Fatal("enhanced rev 1 encoded")
	}
}

// connect runs both sides of MPA startup through the wire encoding.
func connect(t *testing.T, ini, resp Config) (pi, pr Params, ierr, rerr error) {
	t.Helper()
	req, err := ini.Request()
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	wire, _ := req.Append(nil)
	gotReq, _, err := ParseFrame(wire, false)
	if err != nil {
		t.Fatalf("parse request: %v", err)
	}
	reply, pr, rerr := resp.Accept(&gotReq)
	wire, err = reply.Append(nil)
	if err != nil {
		t.Fatalf("reply: %v", err)
	}
	gotReply, _, err := ParseFrame(wire, true)
	if err != nil {
		t.Fatalf("parse reply: %v", err)
	}
	pi, ierr = ini.Complete(&gotReply)
	return
}

func TestNegotiation(t *testing.T) {
	t.Run("CRC if either asks, markers per direction", func(t *testing.T) {
		pi, pr, ierr, rerr := connect(t, Config{CRC: true, Markers: true}, Config{})
		if ierr != nil || rerr != nil {
			t.Fatal(ierr, rerr)
		}
		if !pi.CRC || !pr.CRC {
			t.Error("CRC not on")
		}
		if !pi.MarkersRx || pi.MarkersTx || !pr.MarkersTx || pr.MarkersRx {
			t.Errorf("markers: initiator %+v responder %+v", pi, pr)
		}
		pi, pr, _, _ = connect(t, Config{}, Config{})
		if pi.CRC || pr.CRC {
			t.Error("CRC on though nobody asked")
		}
		// The Reply says what is in force, so strict initiators see it.
		req, _ := (&Config{CRC: true}).Request()
		if reply, _, _ := (&Config{}).Accept(&req); !reply.CRC {
			t.Error("a Reply to a Request asking CRC has C clear")
		}
	})
	t.Run("private data both ways", func(t *testing.T) {
		pi, pr, _, _ := connect(t, Config{PrivateData: []byte("ping")}, Config{PrivateData: []byte("pong")})
		if string(pr.PeerPrivateData) != "ping" || string(pi.PeerPrivateData) != "pong" {
			t.Errorf("%q %q", pr.PeerPrivateData, pi.PeerPrivateData)
		}
	})
	t.Run("IRD and ORD", func(t *testing.T) {
		pi, pr, ierr, rerr := connect(t, Config{IRD: 8, ORD: 16}, Config{IRD: 4, ORD: 2})
		if ierr != nil || rerr != nil {
			t.Fatal(ierr, rerr)
		}
		// initiator ORD <= responder IRD; responder ORD <= initiator IRD.
		if pi.ORD != 4 || pi.IRD != 8 || pr.IRD != 4 || pr.ORD != 2 {
			t.Errorf("initiator %d/%d responder %d/%d", pi.IRD, pi.ORD, pr.IRD, pr.ORD)
		}
		// The responder wants more reads than the initiator accepts.
		_, pr, _, rerr = connect(t, Config{IRD: 1, ORD: 1}, Config{IRD: 4, ORD: 8})
		if !errors.Is(rerr, ddp.LLPInsufficientIRD) || pr.ORD != 1 {
			t.Errorf("responder ORD above initiator IRD: %v, ORD %d", rerr, pr.ORD)
		}
		// 0x3FFF leaves it to the ULPs.
		pi, pr, ierr, rerr = connect(t, Config{IRD: MaxIRDORD, ORD: MaxIRDORD}, Config{IRD: 3, ORD: 5})
		if ierr != nil || rerr != nil || pr.IRD != 3 || pr.ORD != 5 || pi.ORD != MaxIRDORD {
			t.Errorf("0x3FFF: %v %v initiator %+v responder %+v", ierr, rerr, pi, pr)
		}
	})
	t.Run("initiator rejects a reply ORD above its IRD", func(t *testing.T) {
		ini := Config{IRD: 1, ORD: 1}
		reply := Frame{Reply: true, Revision: 2, Enhanced: true, IRD: 1, ORD: 4}
		if _, err := ini.Complete(&reply); !errors.Is(err, ddp.LLPInsufficientIRD) {
			t.Fatal(err)
		}
	})
	t.Run("peer to peer", func(t *testing.T) {
		pi, pr, ierr, rerr := connect(t, Config{PeerToPeer: true, IRD: 1, ORD: 1}, Config{PeerToPeer: true, IRD: 1, ORD: 1})
		if ierr != nil || rerr != nil || !pi.PeerToPeer || !pr.PeerToPeer || pi.RTR != RTRWrite || pr.RTR != RTRWrite {
			t.Fatalf("%v %v %+v %+v", ierr, rerr, pi, pr)
		}
		pi, pr, ierr, _ = connect(t, Config{PeerToPeer: true, RTR: RTRSend | RTRRead, IRD: 1, ORD: 1}, Config{RTR: RTRRead | RTRSend, IRD: 1, ORD: 1})
		if ierr != nil || pi.RTR != RTRRead || pr.RTR != RTRRead {
			t.Fatalf("read RTR: %v %+v %+v", ierr, pi, pr)
		}
		// A zero-length Read needs ORD at the initiator and IRD at the
		// responder: without them it is neither offered nor picked.
		pi, pr, ierr, _ = connect(t, Config{PeerToPeer: true, RTR: RTRSend | RTRRead, IRD: 1, ORD: 1}, Config{RTR: RTRRead | RTRSend, IRD: 0, ORD: 1})
		if ierr != nil || pi.RTR != RTRSend || pr.RTR != RTRSend {
			t.Fatalf("read RTR with responder IRD 0: %v %+v %+v", ierr, pi, pr)
		}
		if req, _ := (&Config{PeerToPeer: true, RTR: RTRWrite | RTRRead}).Request(); req.RTR != RTRWrite {
			t.Fatalf("ORD 0 offers %v, want write", req.RTR)
		}
		if _, err := (&Config{PeerToPeer: true, RTR: RTRRead}).Request(); err == nil {
			t.Fatal("a Request offering only a Read RTR with ORD 0")
		}
		// A responder that takes only a Read RTR but has IRD 0 takes
		// nothing: it refuses rather than name Read to a lenient
		// initiator that would send it.
		readOnly, _ := (&Config{PeerToPeer: true, RTR: RTRRead, IRD: 1, ORD: 1}).Request()
		if _, _, err := (&Config{RTR: RTRRead, IRD: 0, ORD: 1}).Accept(&readOnly); !errors.Is(err, ddp.LLPNoMatchingRTR) {
			t.Fatalf("Read-only responder with IRD 0: %v", err)
		}
		// A responder (not ours) that picks Read with IRD 0.
		ini := Config{PeerToPeer: true, RTR: RTRRead, IRD: 1, ORD: 1}
		if _, err := ini.Complete(&Frame{Reply: true, Revision: 2, Enhanced: true, IRD: 0, ORD: 1, PeerToPeer: true, RTR: RTRRead}); !errors.Is(err, ddp.LLPInsufficientIRD) {
			t.Fatalf("Read RTR picked with IRD 0: %v", err)
		}
		// No RTR in common: the responder lists its own, the initiator
		// must send Terminate "no matching RTR option".
		_, pr, ierr, _ = connect(t, Config{PeerToPeer: true, RTR: RTRSend}, Config{RTR: RTRWrite})
		if !errors.Is(ierr, ddp.LLPNoMatchingRTR) || pr.RTR != 0 {
			t.Fatalf("no common RTR: %v, responder %+v", ierr, pr)
		}
	})
	t.Run("revision 1 peers", func(t *testing.T) {
		// A v1 Request gets a v1 Reply from a v2 responder (RFC 6581 §10).
		pi, pr, ierr, rerr := connect(t, Config{Revision: 1, CRC: true}, Config{IRD: 4, ORD: 4})
		if ierr != nil || rerr != nil || pi.Revision != 1 || pr.Revision != 1 || pr.Enhanced || !pr.CRC {
			t.Fatalf("%v %v %+v %+v", ierr, rerr, pi, pr)
		}
		// A v2 initiator accepts a v1 responder's Reply.
		pi, _, ierr, _ = connect(t, Config{IRD: 4, ORD: 4}, Config{Revision: 1})
		if ierr != nil || pi.Enhanced || pi.Revision != 1 || pi.ORD != 4 {
			t.Fatalf("v1 reply: %v %+v", ierr, pi)
		}
		// A reply above the request's revision is a protocol error.
		ini := Config{Revision: 1}
		if _, err := ini.Complete(&Frame{Reply: true, Revision: 2}); !errors.Is(err, ddp.LLPInvalidFrame) {
			t.Fatalf("v2 reply to v1: %v", err)
		}
	})
	t.Run("reject", func(t *testing.T) {
		ini := Config{PrivateData: []byte("let me in")}
		req, _ := ini.Request()
		resp := Config{PrivateData: []byte("no")}
		reply, err := resp.Reject(&req)
		if err != nil {
			t.Fatal(err)
		}
		wire, _ := reply.Append(nil)
		got, _, err := ParseFrame(wire, true)
		if err != nil || !got.Reject {
			t.Fatalf("%+v %v", got, err)
		}
		p, err := ini.Complete(&got)
		if !errors.Is(err, ErrRejected) || string(p.PeerPrivateData) != "no" {
			t.Fatalf("%v %q", err, p.PeerPrivateData)
		}
	})
}
