package systest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/internal/topology"
	"github.com/softrnic/softrnic/mpa"
)

// TestHostilePeers holds softrnicd to issue 14: no peer can stall the RNIC.
// A scripted kernel TCP socket in the other namespace misbehaves during MPA
// startup or after it, in each of the two roles, against a softrnicd on
// each datapath (xdp with one queue, so one poller). For every case:
//
//   - the consumer (this process, over package client) gets the event or
//     error the case names within its timeout (see hostileCases for what
//     each expects and why);
//   - a verified stream through the same daemon, on another QP of the same
//     poller, to a well-behaved softrnicd (kernel datapath) keeps moving:
//     no gap of more than streamMaxGap while the case runs, and more blocks
//     after it;
//   - a new good connection through the same daemon (into the same PSP in
//     the responder role) works afterwards;
//   - SIGTERM ends the daemon within 2 s, with the hostile connection and
//     the applications' sessions still open.
//
// A hang does not hang the test: when the stream stops for streamStall or
// the case overruns caseDeadline, the daemon gets SIGQUIT and its goroutine
// dump goes into the log with the case's failure; likewise when SIGTERM
// does not end it in time.
//
// Each case starts its own daemon under test (so that SIGTERM is measured
// per case and one case's damage does not spill into the next); the
// namespaces and the well-behaved daemon are shared. The 50 cases take
// about a minute on the 2-core development machine. Run one datapath or
// one case with -run, e.g. -run 'TestHostilePeers/xdp/initiator/non-iWARP'.
func TestHostilePeers(t *testing.T) {
	pair := topology.NewTest(t, topology.Options{Queues: 1})
	dir, err := os.MkdirTemp("", "srn-hostile-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	build(t, dir)
	good, err := startDaemonProc(pair.B, dir, "softrnicd B (kernel, well-behaved)", dir+"/b.sock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if d, ok := good.terminate(5 * time.Second); !ok {
			good.kill()
			t.Errorf("the well-behaved daemon ignored SIGTERM for %v", d)
		}
	})
	env := &hostileEnv{pair: pair, dir: dir, good: good}
	start := time.Now()
	for _, dp := range []string{"kernel", "xdp"} {
		t.Run(dp, func(t *testing.T) {
			for _, c := range hostileCases {
				t.Run(c.role.String()+"/"+c.name, func(t *testing.T) {
					if !good.running() {
						t.Fatalf("the well-behaved daemon has gone:\n%s", tail(good.out.String(), 4000))
					}
					env.run(t, dp, c)
				})
			}
		})
	}
	var sum strings.Builder
	fmt.Fprintf(&sum, "%-7s %-9s %-34s %-6s %8s %8s  %s\n", "path", "role", "case", "result", "case", "SIGTERM", "first problem")
	for _, r := range env.results {
		res := "ok"
		if r.failed {
			res = "FAIL"
		}
		term := "-"
		if r.term > 0 {
			term = r.term.Round(time.Millisecond).String()
		}
		fmt.Fprintf(&sum, "%-7s %-9s %-34s %-6s %8v %8s  %s\n", r.dp, r.role, r.name, res, r.took.Round(10*time.Millisecond), term, r.first)
	}
	t.Logf("hostile peers: %d cases in %v\n%s", len(env.results), time.Since(start).Round(time.Second), sum.String())
}

// role is the daemon's side of the hostile connection.
type role int

const (
	// initiator: our consumer connects to the hostile server.
	initiator role = iota
	// responder: the hostile client connects to our consumer's PSP.
	responder
)

func (r role) String() string { return [...]string{"initiator", "responder"}[r] }

// crWant says whether a hostile client's connection reaches the consumer
// as a connection request.
type crWant int

const (
	crNever  crWant = iota // no request reaches the consumer
	crAlways               // the request was valid: it reaches the consumer
	crMaybe                // either is right (the peer left right after a valid Request)
)

// hostileCase is one misbehaviour in one role.
type hostileCase struct {
	name string
	role role
	// expect says what the consumer must see, and why that is right.
	expect string
	// attr changes the consumer EP's attributes.
	attr func(*client.EPAttr)
	// rcvbuf is the hostile socket's SO_RCVBUF, set before the handshake.
	rcvbuf int
	// peer is the hostile peer's script on its connected socket: the
	// server's accepted connection (initiator role) or the client's
	// (responder role). Its error fails the case.
	peer func(p *peerConn) error
	// want is the initiator's connect outcome, and wantPD the private
	// data the EP must then hold (a rejection's).
	want   client.ConnEvent
	wantPD []byte
	// cr is whether the responder's consumer gets a request.
	cr crWant
	// after runs on the consumer once the connection is up (initiator:
	// want Established; responder: a request accepted).
	after func(c *consumer) error
}

// Timeouts the consumer uses.
const (
	connectTimeout = 2 * time.Second
	// eventSlack is how long after its timeout an outcome may come;
	// promptly bounds an outcome that is not a timeout.
	eventSlack = 2 * time.Second
	promptly   = time.Second
	// quietWait: how long a responder consumer waits to be sure no
	// request comes.
	quietWait = time.Second
	// abortLimit bounds the consumer's abortive disconnect: DISCONNECTED
	// and every outstanding request's completion within it.
	abortLimit = 2 * time.Second
	termLimit  = 2 * time.Second
	// streamMaxGap is the longest the stream may wait for a block while a
	// case runs; streamStall is when the watcher takes it for a hang.
	streamMaxGap = 1500 * time.Millisecond
	streamStall  = 3 * time.Second
	caseDeadline = 30 * time.Second
)

var (
	consumerPD = []byte("softrnic consumer: hello")
	rejectPD   = []byte("hostile peer: go away, and here is why")
	sendProbe  = []byte("CRC and markers as the peer asked")
	httpAnswer = []byte("HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 11\r\nConnection: close\r\n\r\nBad Request")
	httpAsk    = []byte("GET / HTTP/1.1\r\nHost: softrnic.test\r\nUser-Agent: hostile\r\n\r\n")
)

// randomBytes are 64 octets that are not an MPA frame (fixed seed).
func randomBytes() []byte {
	r := rand.New(rand.NewPCG(14, 14))
	b := make([]byte, 64)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// validReply is the Reply a well-behaved responder gives to req.
func validReply(req *mpa.Frame, cfg mpa.Config) ([]byte, error) {
	if cfg.IRD == 0 && cfg.ORD == 0 {
		cfg.IRD, cfg.ORD = 8, 8
	}
	reply, _, err := cfg.Accept(req)
	if err != nil {
		return nil, err
	}
	return reply.Append(nil)
}

// validRequest is the Request a well-behaved initiator sends.
func validRequest(cfg mpa.Config) []byte {
	if cfg.IRD == 0 && cfg.ORD == 0 {
		cfg.IRD, cfg.ORD = 8, 8
	}
	cfg.PrivateData = []byte("hostile peer")
	f, err := cfg.Request()
	if err != nil {
		panic(err)
	}
	wire, _ := f.Append(nil)
	return wire
}

// pdOverrun makes a startup frame announce 100 octets of private data and
// returns its header with the 40 octets that follow (its own, then zeros).
func pdOverrun(wire []byte) []byte {
	out := append([]byte(nil), wire...)
	out[18], out[19] = 0, 100
	out = append(out, make([]byte, 40)...)
	return out[:mpa.FrameHeaderLen+40]
}

// readRequest reads the daemon's MPA Request and checks it is one.
func readRequest(p *peerConn) (mpa.Frame, error) {
	req, _, err := p.readStartup(false, 3*time.Second)
	if err != nil {
		return req, fmt.Errorf("the daemon's MPA Request: %w", err)
	}
	if !bytes.Equal(req.PrivateData, consumerPD) {
		return req, fmt.Errorf("the daemon's MPA Request carries %q, want the consumer's %q", req.PrivateData, consumerPD)
	}
	return req, nil
}

// readReply reads the daemon's MPA Reply and checks it accepts.
func readReply(p *peerConn) (mpa.Frame, error) {
	f, _, err := p.readStartup(true, 3*time.Second)
	if err != nil {
		return f, fmt.Errorf("the daemon's MPA Reply: %w", err)
	}
	if f.Reject {
		return f, errors.New("the daemon rejected a valid Request")
	}
	return f, nil
}

var hostileCases = []hostileCase{
	// ---- the daemon is the initiator: the hostile peer is a server ----
	{
		name: "non-iWARP", role: initiator,
		expect: "NON_PEER_REJECTED: something answered, but not an iWARP peer's consumer (DAT: any failure but timeout, unreachable host or the peer's reject); the daemon closes the connection",
		peer: func(p *peerConn) error {
			if _, err := readRequest(p); err != nil {
				return err
			}
			if err := p.write(httpAnswer); err != nil {
				return err
			}
			return p.expectClosed(connectTimeout + eventSlack)
		},
		want: client.NonPeerRejected,
	},
	{
		name: "random bytes", role: initiator,
		expect: "NON_PEER_REJECTED, and the daemon closes the connection",
		peer: func(p *peerConn) error {
			if _, err := readRequest(p); err != nil {
				return err
			}
			if err := p.write(randomBytes()); err != nil {
				return err
			}
			return p.expectClosed(connectTimeout + eventSlack)
		},
		want: client.NonPeerRejected,
	},
	{
		name: "truncated Reply then silence", role: initiator,
		expect: "TIMED_OUT at the consumer's connect timeout (the peer is there but never finishes), and the daemon closes the connection then",
		peer: func(p *peerConn) error {
			req, err := readRequest(p)
			if err != nil {
				return err
			}
			reply, err := validReply(&req, mpa.Config{CRC: req.CRC})
			if err != nil {
				return err
			}
			if err := p.write(reply[:10]); err != nil {
				return err
			}
			return p.expectClosed(connectTimeout + eventSlack)
		},
		want: client.TimedOut,
	},
	{
		name: "RST mid-Request", role: initiator,
		expect: "NON_PEER_REJECTED: the host answered and then reset (not UNREACHABLE: that is for a host that cannot be reached)",
		peer: func(p *peerConn) error {
			if _, err := p.readFull(10, 3*time.Second); err != nil {
				return fmt.Errorf("the start of the daemon's Request: %w", err)
			}
			return p.reset()
		},
		want: client.NonPeerRejected,
	},
	{
		name: "RST mid-Reply", role: initiator,
		expect: "NON_PEER_REJECTED",
		peer: func(p *peerConn) error {
			req, err := readRequest(p)
			if err != nil {
				return err
			}
			reply, err := validReply(&req, mpa.Config{CRC: req.CRC})
			if err != nil {
				return err
			}
			if err := p.write(reply[:10]); err != nil {
				return err
			}
			time.Sleep(100 * time.Millisecond)
			return p.reset()
		},
		want: client.NonPeerRejected,
	},
	{
		name: "FIN before the Reply", role: initiator,
		expect: "NON_PEER_REJECTED",
		peer: func(p *peerConn) error {
			if _, err := readRequest(p); err != nil {
				return err
			}
			return p.c.Close()
		},
		want: client.NonPeerRejected,
	},
	{
		name: "Reject with private data", role: initiator,
		expect: "PEER_REJECTED, the EP DISCONNECTED holding the peer's private data; the Reject alone decides it (the peer keeps the connection open)",
		peer: func(p *peerConn) error {
			req, err := readRequest(p)
			if err != nil {
				return err
			}
			cfg := mpa.Config{CRC: req.CRC, PrivateData: rejectPD}
			rej, err := cfg.Reject(&req)
			if err != nil {
				return err
			}
			wire, _ := rej.Append(nil)
			if err := p.write(wire); err != nil {
				return err
			}
			return p.hold()
		},
		want: client.PeerRejected, wantPD: rejectPD,
	},
	{
		name: "Reply PD_Length past its end", role: initiator,
		expect: "NON_PEER_REJECTED: the Reply announces 100 octets of private data, 40 follow, then FIN",
		peer: func(p *peerConn) error {
			req, err := readRequest(p)
			if err != nil {
				return err
			}
			reply, err := validReply(&req, mpa.Config{CRC: req.CRC})
			if err != nil {
				return err
			}
			if err := p.write(pdOverrun(reply)); err != nil {
				return err
			}
			return p.c.Close()
		},
		want: client.NonPeerRejected,
	},
	{
		name: "CRC and markers not offered", role: initiator,
		expect: "ESTABLISHED: the consumer asked for neither, the Reply sets C and M; RFC 5044 §7.1.1 lets either side require CRC and each side require markers in what it receives, so the connection runs with both and the consumer's first Send carries a valid CRC and markers",
		attr:   func(a *client.EPAttr) { a.NoCRC = true },
		peer: func(p *peerConn) error {
			defer p.signal()
			req, err := readRequest(p)
			if err != nil {
				return err
			}
			if req.CRC || req.Markers {
				return fmt.Errorf("the consumer asked for no CRC and no markers, the Request has C=%v M=%v", req.CRC, req.Markers)
			}
			reply, err := validReply(&req, mpa.Config{CRC: true, Markers: true})
			if err != nil {
				return err
			}
			if err := p.write(reply); err != nil {
				return err
			}
			ulpdu, err := p.readULPDU(true, true, 3*time.Second)
			if err != nil {
				return fmt.Errorf("the consumer's Send, framed with CRC and markers: %w", err)
			}
			if err := checkSend(ulpdu, sendProbe); err != nil {
				return err
			}
			p.signal()
			return p.hold()
		},
		want: client.Established, after: sendProbeThenAbort,
	},
	{
		name: "p2p Reply without RTR", role: initiator,
		expect: "NON_PEER_REJECTED: the consumer asked for peer-to-peer mode, the Reply echoes A with no RTR type; RFC 6581 §9.2: the initiator sends a Terminate (LLP, no matching RTR) and closes",
		attr:   func(a *client.EPAttr) { a.PeerToPeer = true },
		peer: func(p *peerConn) error {
			req, err := readRequest(p)
			if err != nil {
				return err
			}
			if !req.PeerToPeer || req.RTR == 0 {
				return fmt.Errorf("the consumer asked for peer-to-peer mode, the Request has A=%v RTR %v", req.PeerToPeer, req.RTR)
			}
			reply := mpa.Frame{Reply: true, CRC: req.CRC, Revision: 2, Enhanced: true, IRD: req.ORD, ORD: req.IRD, PeerToPeer: true}
			wire, err := reply.Append(nil)
			if err != nil {
				return err
			}
			if err := p.write(wire); err != nil {
				return err
			}
			ulpdu, err := p.readULPDU(req.CRC, false, connectTimeout+eventSlack)
			if err != nil {
				return fmt.Errorf("the daemon's Terminate: %w", err)
			}
			if err := checkTerminate(ulpdu, ddp.LLPNoMatchingRTR); err != nil {
				return err
			}
			return p.expectClosed(2 * time.Second)
		},
		want: client.NonPeerRejected,
	},
	{
		name: "zero window", role: initiator, rcvbuf: 4096,
		expect: "ESTABLISHED; the peer stops reading with a small receive buffer, so the consumer's Sends stop completing; its abortive disconnect ends the EP (DISCONNECTED; BROKEN is taken too, see abort) and every outstanding Send completes (flushed) within 2 s",
		peer:   zeroWindowServer(true),
		want:   client.Established, after: floodThenAbort,
	},
	{
		name: "never ACKs", role: initiator,
		expect: "ESTABLISHED; after the Reply the peer's TCP sees nothing more (a socket filter drops it all), so nothing we send is acknowledged; the consumer's abortive disconnect ends the EP (DISCONNECTED or BROKEN) and every outstanding Send completes within 2 s (TCP's own timeout would take minutes)",
		peer:   neverACKsServer(true),
		want:   client.Established, after: unackedThenAbort,
	},

	{
		name: "zero window, left to SIGTERM", role: initiator, rcvbuf: 4096,
		expect: "as zero window, but the consumer leaves the stuck connection (its FIN can never go out behind the queued data) and the daemon gets SIGTERM: it must still end within 2 s",
		peer:   zeroWindowServer(false),
		want:   client.Established, after: floodThenLeave,
	},

	// ---- the daemon is the responder: the hostile peer is a client ----
	{
		name: "non-iWARP", role: responder,
		expect: "no connection request reaches the consumer; the daemon closes the connection at once (RFC 5044 §7.1.2)",
		peer: func(p *peerConn) error {
			if err := p.write(httpAsk); err != nil {
				return err
			}
			return p.expectClosed(2 * time.Second)
		},
		cr: crNever,
	},
	{
		name: "random bytes", role: responder,
		expect: "no connection request; the daemon closes the connection at once",
		peer: func(p *peerConn) error {
			if err := p.write(randomBytes()); err != nil {
				return err
			}
			return p.expectClosed(2 * time.Second)
		},
		cr: crNever,
	},
	{
		name: "truncated Request then silence", role: responder,
		expect: "no connection request (the daemon drops the connection after its 10 s request timeout, which the case does not wait for)",
		peer: func(p *peerConn) error {
			if err := p.write(validRequest(mpa.Config{CRC: true})[:10]); err != nil {
				return err
			}
			return p.hold()
		},
		cr: crNever,
	},
	{
		name: "RST mid-Request", role: responder,
		expect: "no connection request",
		peer: func(p *peerConn) error {
			if err := p.write(validRequest(mpa.Config{CRC: true})[:10]); err != nil {
				return err
			}
			time.Sleep(100 * time.Millisecond)
			return p.reset()
		},
		cr: crNever,
	},
	{
		name: "RST mid-Reply", role: responder,
		expect: "the request reaches the consumer; after its accept the peer resets as the Reply arrives: the accept fails, or the EP ends with BROKEN or DISCONNECTED within 2 s",
		peer: func(p *peerConn) error {
			if err := p.write(validRequest(mpa.Config{CRC: true})); err != nil {
				return err
			}
			if _, err := p.readFull(10, 5*time.Second); err != nil {
				return fmt.Errorf("the start of the daemon's Reply: %w", err)
			}
			return p.reset()
		},
		cr: crAlways, after: expectEnd,
	},
	{
		name: "FIN before the Reply", role: responder,
		expect: "the request may reach the consumer (it was whole); if it does, the accept fails or the EP ends with BROKEN or DISCONNECTED within 2 s",
		peer: func(p *peerConn) error {
			if err := p.write(validRequest(mpa.Config{CRC: true})); err != nil {
				return err
			}
			return p.c.Close()
		},
		cr: crMaybe, after: expectEnd,
	},
	{
		name: "Request PD_Length past its end", role: responder,
		expect: "no connection request; the Request announces 100 octets of private data, 40 follow, then FIN: the daemon closes the connection at once",
		peer: func(p *peerConn) error {
			if err := p.write(pdOverrun(validRequest(mpa.Config{CRC: true}))); err != nil {
				return err
			}
			if err := p.c.CloseWrite(); err != nil {
				return err
			}
			return p.expectClosed(2 * time.Second)
		},
		cr: crNever,
	},
	{
		name: "CRC and markers not offered", role: responder,
		expect: "ESTABLISHED after accept: the consumer's EP asks for no CRC, the Request requires CRC and markers; the Reply carries C=1 (CRC is on if either asks) and the consumer's first Send reaches the peer with a valid CRC and markers",
		attr:   func(a *client.EPAttr) { a.NoCRC = true },
		peer: func(p *peerConn) error {
			defer p.signal()
			if err := p.write(validRequest(mpa.Config{CRC: true, Markers: true})); err != nil {
				return err
			}
			reply, err := readReply(p)
			if err != nil {
				return err
			}
			if !reply.CRC || reply.Markers {
				return fmt.Errorf("the Reply has C=%v M=%v, want C=1 (the Request asked) and M=0 (the consumer did not)", reply.CRC, reply.Markers)
			}
			if err := p.write(firstFPDU(reply)); err != nil {
				return err
			}
			ulpdu, err := p.readULPDU(true, true, 3*time.Second)
			if err != nil {
				return fmt.Errorf("the consumer's Send, framed with CRC and markers: %w", err)
			}
			if err := checkSend(ulpdu, sendProbe); err != nil {
				return err
			}
			p.signal()
			return p.hold()
		},
		cr: crAlways, after: sendProbeThenAbort,
	},
	{
		name: "p2p Request without RTR", role: responder,
		expect: "the request reaches the consumer; the Reply echoes A and names the RTR types the daemon takes (RFC 6581 §9.2); the peer then Terminates (no matching RTR) and closes: the accept fails or the EP ends with BROKEN or DISCONNECTED within 2 s",
		attr:   func(a *client.EPAttr) { a.PeerToPeer = true },
		peer: func(p *peerConn) error {
			req := mpa.Frame{CRC: true, Revision: 2, Enhanced: true, IRD: 8, ORD: 8, PeerToPeer: true, PrivateData: []byte("hostile peer")}
			wire, err := req.Append(nil)
			if err != nil {
				return err
			}
			if err := p.write(wire); err != nil {
				return err
			}
			reply, err := readReply(p)
			if err != nil {
				return err
			}
			if !reply.PeerToPeer || reply.RTR == 0 {
				return fmt.Errorf("the Reply has A=%v RTR %v, want A echoed and the daemon's RTR types", reply.PeerToPeer, reply.RTR)
			}
			if err := p.write(terminateFPDU(ddp.LLPNoMatchingRTR, true, reply.Markers)); err != nil {
				return err
			}
			return p.c.Close()
		},
		cr: crAlways, after: expectEnd,
	},
	{
		name: "zero window", role: responder, rcvbuf: 4096,
		expect: "ESTABLISHED after accept; the peer stops reading, the consumer's Sends stop completing; its abortive disconnect ends the EP (DISCONNECTED; BROKEN is taken too, see abort) and every outstanding Send completes within 2 s",
		peer:   zeroWindowClient(true),
		cr:     crAlways, after: floodThenAbort,
	},
	{
		name: "never ACKs", role: responder,
		expect: "ESTABLISHED after accept; the peer sends its first FPDU and then its TCP sees nothing more; the consumer's abortive disconnect ends the EP (DISCONNECTED or BROKEN) and every outstanding Send completes within 2 s",
		peer:   neverACKsClient(true),
		cr:     crAlways, after: unackedThenAbort,
	},
	{
		name: "never ACKs, left to SIGTERM", role: responder,
		expect: "as never ACKs, but the consumer leaves the connection with its unacknowledged Sends and the daemon gets SIGTERM: it must still end within 2 s",
		peer:   neverACKsClient(false),
		cr:     crAlways, after: unackedThenLeave,
	},
}

// firstFPDU is the initiator's first FPDU, a zero-length RDMA Write (what
// the daemon itself nudges with; it touches no memory), framed as reply
// negotiated: a responder sends nothing before it (RFC 5044 §7.1.2).
func firstFPDU(reply mpa.Frame) []byte {
	hdr := make([]byte, ddp.TaggedHeaderLen)
	ddp.Tagged(hdr).Encode(&ddp.TaggedFields{Last: true, Opcode: ddp.OpWrite, STag: 1})
	// The initiator requested CRC in every Request here.
	return mpa.NewFramer(true, reply.Markers).Append(nil, hdr, nil)
}

// The peers that stop the daemon's sending after startup. With
// checkAbort, once the consumer has aborted, the peer checks, without
// reading, that the daemon reset the connection within 2 s (the consumer's
// events alone do not say the connection is gone). Without, it holds the
// connection stuck until the case's end, after the daemon's SIGTERM.

// zeroWindowServer: a valid Reply, then the peer never reads (its receive
// buffer is small, see rcvbuf).
func zeroWindowServer(checkAbort bool) func(*peerConn) error {
	return func(p *peerConn) error {
		defer p.signal()
		req, err := readRequest(p)
		if err != nil {
			return err
		}
		reply, err := validReply(&req, mpa.Config{CRC: req.CRC})
		if err != nil {
			return err
		}
		if err := p.write(reply); err != nil {
			return err
		}
		return p.stuck(checkAbort)
	}
}

// zeroWindowClient: a valid Request, the first FPDU, then never a read.
func zeroWindowClient(checkAbort bool) func(*peerConn) error {
	return func(p *peerConn) error {
		defer p.signal()
		if err := p.write(validRequest(mpa.Config{CRC: true})); err != nil {
			return err
		}
		reply, err := readReply(p)
		if err != nil {
			return err
		}
		if err := p.write(firstFPDU(reply)); err != nil {
			return err
		}
		return p.stuck(checkAbort)
	}
}

// neverACKsServer: a socket filter that drops everything the peer's TCP
// would receive, then a valid Reply.
func neverACKsServer(checkAbort bool) func(*peerConn) error {
	return func(p *peerConn) error {
		defer p.signal()
		req, err := readRequest(p)
		if err != nil {
			return err
		}
		reply, err := validReply(&req, mpa.Config{CRC: req.CRC})
		if err != nil {
			return err
		}
		if err := p.dropInput(); err != nil {
			return fmt.Errorf("socket filter: %w", err)
		}
		if err := p.write(reply); err != nil {
			return err
		}
		return p.stuck(checkAbort)
	}
}

// neverACKsClient: a valid Request, the first FPDU after the Reply, then
// the filter.
func neverACKsClient(checkAbort bool) func(*peerConn) error {
	return func(p *peerConn) error {
		defer p.signal()
		if err := p.write(validRequest(mpa.Config{CRC: true})); err != nil {
			return err
		}
		reply, err := readReply(p)
		if err != nil {
			return err
		}
		if err := p.write(firstFPDU(reply)); err != nil {
			return err
		}
		if err := p.dropInput(); err != nil {
			return fmt.Errorf("socket filter: %w", err)
		}
		return p.stuck(checkAbort)
	}
}

// stuck lets the consumer go on and holds the connection until it is done;
// with checkAbort it then checks that the consumer's abort reset it.
func (p *peerConn) stuck(checkAbort bool) error {
	p.signal()
	p.hold()
	if !checkAbort {
		return nil
	}
	return p.expectReset(2 * time.Second)
}

// consumer is the application under test's side of one hostile connection.
type consumer struct {
	e    *endpoint
	peer *peerConn
	log  *caseLog
	// acceptErr: the responder consumer's accept failed; connected:
	// ESTABLISHED has been seen (the initiator's connect gave it).
	acceptErr error
	connected bool
	// posted and completed count the EP's Sends.
	posted, completed int
}

// waitPeer waits for the hostile script's signal.
func (c *consumer) waitPeer() error {
	select {
	case <-c.peer.ready:
		return nil
	case <-time.After(5 * time.Second):
		return errors.New("the hostile peer never got ready")
	}
}

// established waits for ESTABLISHED on an accepted EP (the initiator has it
// already).
func (c *consumer) established() error {
	if c.connected {
		return nil
	}
	if c.acceptErr != nil {
		return fmt.Errorf("accept: %w", c.acceptErr)
	}
	ev, err := c.e.waitConn(3 * time.Second)
	if err != nil {
		return fmt.Errorf("no ESTABLISHED after accept: %w", err)
	}
	if ev != client.Established {
		return fmt.Errorf("after accept: %v, want ESTABLISHED", ev)
	}
	c.connected = true
	return nil
}

// reap takes the completions waiting, checking that they succeeded.
func (c *consumer) reap() error {
	for range 1024 {
		ev, ok, err := c.e.req.Dequeue()
		if err != nil || !ok {
			return err
		}
		c.completed++
		if ev.Status != completion.Success {
			return fmt.Errorf("Send %d completed %v before any disconnect", ev.Cookie, ev.Status)
		}
	}
	return nil
}

// abort disconnects abortively and requires the EP to end and every
// outstanding Send to complete within abortLimit. The DAT reference says a
// consumer's own disconnect, abrupt or graceful, ends in DISCONNECTED
// (BROKEN is for link and DTO errors); the engine reports an abort as
// BROKEN today and the client tests take either, so this does too and
// logs which came: promptness is what this test holds.
func (c *consumer) abort() error {
	start := time.Now()
	outstanding := c.posted - c.completed
	if err := c.e.ep.Disconnect(false); err != nil {
		return fmt.Errorf("abortive disconnect: %w", err)
	}
	ev, err := c.e.waitConn(abortLimit)
	if err != nil {
		return fmt.Errorf("no connection event within %v of the abortive disconnect: %w", abortLimit, err)
	}
	if ev != client.Disconnected && ev != client.Broken {
		return fmt.Errorf("abortive disconnect gave %v, want DISCONNECTED (or BROKEN)", ev)
	}
	took := time.Since(start)
	statuses := map[completion.Status]int{}
	for n := 0; n < outstanding; n++ {
		rest := abortLimit - time.Since(start)
		cev, err := waitEvent(c.e.req, max(rest, time.Millisecond))
		if err != nil {
			return fmt.Errorf("%d of %d outstanding Sends completed within %v of the abortive disconnect", n, outstanding, abortLimit)
		}
		statuses[cev.Status]++
	}
	c.log.Logf("consumer: abortive disconnect: %v after %v; %d outstanding Sends completed %v", ev, took.Round(time.Millisecond), outstanding, statuses)
	return nil
}

// sendProbeThenAbort: one Send the peer checks for CRC and markers.
func sendProbeThenAbort(c *consumer) error {
	if err := c.established(); err != nil {
		return err
	}
	copy(c.e.a.buf.Bytes, sendProbe)
	if err := c.e.ep.PostSend(1, []client.Segment{{LMR: c.e.a.lmr, Length: uint32(len(sendProbe))}}, client.Signaled); err != nil {
		return err
	}
	c.posted++
	if err := c.waitPeer(); err != nil {
		return err
	}
	// The Send's completion may still be on its way: give it a moment.
	for deadline := time.Now().Add(time.Second); c.completed < c.posted && time.Now().Before(deadline); {
		if err := c.reap(); err != nil {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
	return c.abort()
}

// floodThenAbort posts 64 KiB Sends until the peer's zero window stops them
// completing, then aborts.
func floodThenAbort(c *consumer) error {
	if err := flood(c); err != nil {
		return err
	}
	return c.abort()
}

// floodThenLeave floods as floodThenAbort does and leaves the stuck
// connection to the daemon's SIGTERM.
func floodThenLeave(c *consumer) error { return flood(c) }

func flood(c *consumer) error {
	if err := c.established(); err != nil {
		return err
	}
	if err := c.waitPeer(); err != nil {
		return err
	}
	const size, window = 64 << 10, 48
	start, last := time.Now(), time.Now()
	for {
		for c.posted-c.completed < window && c.posted < 4096 {
			err := c.e.ep.PostSend(uint64(c.posted), []client.Segment{{LMR: c.e.a.lmr, Length: size}}, client.Signaled)
			if errors.Is(err, client.ErrQueueFull) {
				break
			}
			if err != nil {
				return fmt.Errorf("post Send %d: %w", c.posted, err)
			}
			c.posted++
		}
		before := c.completed
		if err := c.reap(); err != nil {
			return err
		}
		if c.completed > before {
			last = time.Now()
		}
		if time.Since(last) > 500*time.Millisecond && c.posted > c.completed {
			break // the window is shut
		}
		if time.Since(start) > 8*time.Second || c.posted >= 4096 {
			return fmt.Errorf("the Sends never stopped completing: %d posted, %d completed in %v; the peer's zero window held nothing back",
				c.posted, c.completed, time.Since(start).Round(time.Millisecond))
		}
		time.Sleep(2 * time.Millisecond)
	}
	c.log.Logf("consumer: zero window after %d Sends completed (%d MiB), %d outstanding", c.completed, c.completed*size>>20, c.posted-c.completed)
	return nil
}

// unackedThenAbort posts 1 MiB of Sends that are never acknowledged, waits
// a second, then aborts.
func unackedThenAbort(c *consumer) error {
	if err := unacked(c); err != nil {
		return err
	}
	return c.abort()
}

// unackedThenLeave leaves the unacknowledged Sends to the daemon's SIGTERM.
func unackedThenLeave(c *consumer) error { return unacked(c) }

func unacked(c *consumer) error {
	if err := c.established(); err != nil {
		return err
	}
	if err := c.waitPeer(); err != nil {
		return err
	}
	const size, n = 64 << 10, 16
	for range n {
		if err := c.e.ep.PostSend(uint64(c.posted), []client.Segment{{LMR: c.e.a.lmr, Length: size}}, client.Signaled); err != nil {
			return fmt.Errorf("post Send %d: %w", c.posted, err)
		}
		c.posted++
	}
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if err := c.reap(); err != nil {
			return err
		}
	}
	c.log.Logf("consumer: %d of %d Sends completed with no ACK from the peer in 1 s", c.completed, c.posted)
	return nil
}

// expectEnd: the accept failed, or the EP ends (BROKEN or DISCONNECTED)
// within abortLimit, possibly after ESTABLISHED.
func expectEnd(c *consumer) error {
	if c.acceptErr != nil {
		c.log.Logf("consumer: accept failed: %v", c.acceptErr)
		return nil
	}
	start := time.Now()
	var seen []client.ConnEvent
	for range 4 {
		ev, err := c.e.waitConn(max(abortLimit-time.Since(start), time.Millisecond))
		if err != nil {
			return fmt.Errorf("the EP did not end within %v (events %v)", abortLimit, seen)
		}
		seen = append(seen, ev)
		switch ev {
		case client.Established:
			continue
		case client.Broken, client.Disconnected:
			c.log.Logf("consumer: events %v within %v", seen, time.Since(start).Round(time.Millisecond))
			return nil
		}
		return fmt.Errorf("events %v, want the EP to end BROKEN or DISCONNECTED", seen)
	}
	return fmt.Errorf("events %v", seen)
}

// hostileEnv is what the cases share: the namespaces, the built commands,
// the well-behaved daemon, and the results for the summary.
type hostileEnv struct {
	pair    *topology.Pair
	dir     string
	good    *daemonProc
	n       int
	results []caseResult
}

type caseResult struct {
	dp, role, name string
	failed         bool
	took, term     time.Duration
	first          string
}

// caseRun is one case on one datapath.
type caseRun struct {
	env  *hostileEnv
	c    hostileCase
	dut  *daemonProc
	log  *caseLog
	idx  uint16
	mu   sync.Mutex
	undo []func()
	// s is the stream, once running.
	s atomic.Pointer[stream]
}

func (x *caseRun) later(f func()) {
	x.mu.Lock()
	x.undo = append(x.undo, f)
	x.mu.Unlock()
}

func (x *caseRun) cleanup() {
	x.mu.Lock()
	undo := x.undo
	x.undo = nil
	x.mu.Unlock()
	for i := len(undo) - 1; i >= 0; i-- {
		undo[i]()
	}
}

// hang reports a stall and takes the daemon's stacks (it exits).
func (x *caseRun) hang(format string, args ...any) {
	if x.log.hung(format, args...) {
		x.dut.dumpStacks()
	}
}

func (env *hostileEnv) run(t *testing.T, dp string, c hostileCase) {
	start := time.Now()
	env.n++
	x := &caseRun{env: env, c: c, log: &caseLog{}, idx: uint16(env.n)}
	args := []string{"--datapath", dp}
	if dp == "xdp" {
		args = append(args, "--pollers", "1")
	}
	var err error
	x.dut, err = startDaemonProc(env.pair.A, env.dir, "softrnicd A ("+dp+", under test)", fmt.Sprintf("%s/a%d.sock", env.dir, x.idx), args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("expect: %s", c.expect)

	bodyDone := make(chan struct{})
	go func() {
		defer close(bodyDone)
		defer func() {
			if r := recover(); r != nil {
				x.log.Errorf("case body panicked: %v", r)
			}
		}()
		x.body()
	}()
	tick := time.NewTicker(100 * time.Millisecond)
	deadline := time.NewTimer(caseDeadline)
watch:
	for {
		select {
		case <-bodyDone:
			break watch
		case <-deadline.C:
			x.hang("the case still runs after %v", caseDeadline)
			select {
			case <-bodyDone:
			case <-time.After(10 * time.Second):
				x.log.Errorf("the case body is still stuck 10 s after the daemon's SIGQUIT; abandoned")
			}
			break watch
		case <-tick.C:
			if s := x.s.Load(); s != nil && x.dut.running() {
				if d := s.stalled(); d > streamStall {
					x.hang("the stream through the daemon under test has made no progress for %v", d.Round(time.Millisecond))
				}
			}
		}
	}
	tick.Stop()
	deadline.Stop()
	if s := x.s.Load(); s != nil {
		s.halt()
	}

	// SIGTERM with the hostile connection and the sessions still open.
	var term time.Duration
	if x.dut.running() {
		d, ok := x.dut.terminate(termLimit)
		term = d
		switch {
		case !ok:
			x.log.hung("SIGTERM did not end the daemon within %v", termLimit)
			x.dut.dumpStacks()
		case x.dut.err != nil:
			x.log.Errorf("the daemon exited %v after SIGTERM (%v)", x.dut.err, d.Round(time.Millisecond))
		default:
			x.log.Logf("SIGTERM ended the daemon in %v", d.Round(time.Millisecond))
		}
	} else {
		x.log.Errorf("the daemon under test was not running at the end: %v", x.dut.err)
	}
	x.cleanup()

	errs, notes, hang := x.log.snapshot()
	for _, n := range notes {
		t.Log(n)
	}
	for _, e := range errs {
		t.Error(e)
	}
	if len(errs) > 0 {
		out := x.dut.out.String()
		if hang != "" {
			t.Logf("daemon under test, log with its goroutine dump (%s):\n%s", hang, out)
		} else {
			t.Logf("daemon under test, log:\n%s", tail(out, 8000))
		}
	}
	r := caseResult{dp: dp, role: c.role.String(), name: c.name, failed: len(errs) > 0, took: time.Since(start), term: term}
	if len(errs) > 0 {
		r.first = errs[0]
		if len(r.first) > 110 {
			r.first = r.first[:110] + "…"
		}
	}
	env.results = append(env.results, r)
}

// body runs the case: stream up, the hostile connection, the stream's
// verdict, a new good connection. It reports to x.log only.
func (x *caseRun) body() {
	pair := x.env.pair
	open := func(sock, name string, size int) *app {
		a, err := openApp(sock, name, size)
		if err != nil {
			x.log.Errorf("open %s: %v", name, err)
			return nil
		}
		x.later(func() { a.ia.Close() })
		return a
	}
	sa := open(x.dut.sock, "stream-A", 64<<10)
	sb := open(x.env.good.sock, "stream-B", 64<<10)
	ca := open(x.dut.sock, "consumer", 4<<20)
	if sa == nil || sb == nil || ca == nil {
		return
	}
	streamCR, err := sb.ia.CreateEVD(client.EVDOptions{Depth: 16, Kind: client.CREvents})
	if err != nil {
		x.log.Errorf("stream CR EVD: %v", err)
		return
	}
	streamPort := 20000 + x.idx
	if _, err := sb.ia.CreatePSP(streamPort, streamCR, false); err != nil {
		x.log.Errorf("stream PSP on B: %v", err)
		return
	}
	s, err := runStream(sa, sb, pair.B.Addr.Addr(), streamPort, streamCR)
	if err != nil {
		x.log.Errorf("%v", err)
		return
	}
	x.s.Store(s)
	for deadline := time.Now().Add(5 * time.Second); s.count.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			x.hang("the stream never verified a block")
			return
		}
	}
	s.openWindow()

	var hostile net.Addr
	var psp *pspOnA
	if x.c.role == initiator {
		hostile = x.initiatorPhase(ca)
	} else {
		psp, hostile = x.responderPhase(ca)
	}

	// The stream kept moving throughout, and moves after.
	c0 := s.count.Load()
	gap := s.window()
	for deadline := time.Now().Add(streamMaxGap); s.count.Load() < c0+3 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if err := s.failure(); err != nil {
		x.log.Errorf("the verified stream broke: %v", err)
	}
	if gap > streamMaxGap {
		x.log.Errorf("the verified stream stood still for %v during the case", gap.Round(time.Millisecond))
	}
	if s.count.Load() < c0+3 {
		x.log.Errorf("the verified stream did not move after the case")
	}
	x.log.Logf("stream: %d blocks verified, longest wait during the case %v", s.count.Load(), gap.Round(time.Millisecond))
	if !x.dut.running() {
		return
	}

	// A new connection works.
	if x.c.role == initiator {
		if err := x.goodConnect(ca, sb, streamPort, streamCR); err != nil {
			x.log.Errorf("new connection after the case: %v", err)
		}
	} else if psp != nil {
		if err := x.goodAccept(ca, sb, psp, hostile); err != nil {
			x.log.Errorf("new connection into the same PSP after the case: %v", err)
		}
	}
}

// initiatorPhase: the consumer connects to the hostile server.
func (x *caseRun) initiatorPhase(ca *app) net.Addr {
	pair, c := x.env.pair, x.c
	port := 21000 + x.idx
	ln, err := peerListen(pair.B, port, c.rcvbuf)
	if err != nil {
		x.log.Errorf("hostile listener: %v", err)
		return nil
	}
	x.later(func() { ln.Close() })
	finish := make(chan struct{})
	peerDone := make(chan error, 1)
	peers := make(chan *peerConn, 1)
	go func() {
		_ = ln.SetDeadline(time.Now().Add(5 * time.Second))
		conn, err := ln.AcceptTCP()
		if err != nil {
			peers <- nil
			peerDone <- fmt.Errorf("the daemon never connected: %w", err)
			return
		}
		x.later(func() { conn.SetLinger(0); conn.Close() })
		_ = conn.SetDeadline(time.Now().Add(25 * time.Second))
		p := newPeerConn(conn, x.log, finish)
		peers <- p
		err = c.peer(p)
		p.signal()
		peerDone <- err
	}()
	e, err := ca.endpoint(c.attr)
	if err != nil {
		x.log.Errorf("consumer EP: %v", err)
		close(finish)
		return nil
	}
	start := time.Now()
	if err := e.ep.Connect(netip.AddrPortFrom(pair.B.Addr.Addr(), port).String(), consumerPD, connectTimeout); err != nil {
		x.log.Errorf("connect: %v", err)
	}
	ev, err := e.waitConn(connectTimeout + eventSlack)
	took := time.Since(start)
	switch {
	case err != nil:
		x.log.Errorf("no connection event within %v of Connect (want %v): %v", connectTimeout+eventSlack, c.want, err)
	case ev != c.want:
		x.log.Errorf("connect gave %v after %v, want %v", ev, took.Round(time.Millisecond), c.want)
	case ev != client.TimedOut && took > promptly:
		// The peer's answer (or its going away) says it all: the
		// consumer must not wait for its timeout to hear.
		x.log.Errorf("connect gave %v only after %v, want it within %v", ev, took.Round(time.Millisecond), promptly)
	default:
		x.log.Logf("consumer: connect gave %v after %v", ev, took.Round(time.Millisecond))
	}
	if err == nil && c.wantPD != nil {
		info, qerr := e.ep.Query()
		switch {
		case qerr != nil:
			x.log.Errorf("query EP: %v", qerr)
		case !bytes.Equal(info.PrivateData, c.wantPD):
			x.log.Errorf("the rejected EP holds private data %q, want the peer's %q", info.PrivateData, c.wantPD)
		case info.State != client.DisconnectedState:
			x.log.Errorf("the rejected EP is %v, want DISCONNECTED", info.State)
		}
	}
	p := <-peers
	if err == nil && ev == client.Established {
		if c.after != nil && p != nil {
			if aerr := c.after(&consumer{e: e, peer: p, log: x.log, connected: true}); aerr != nil {
				x.log.Errorf("consumer: %v", aerr)
			}
		} else {
			_ = e.ep.Disconnect(false)
		}
	}
	close(finish)
	select {
	case err := <-peerDone:
		if err != nil {
			x.log.Errorf("hostile peer: %v", err)
		}
	case <-time.After(8 * time.Second):
		x.log.Errorf("the hostile peer's script did not end")
	}
	if p == nil {
		return nil
	}
	return p.c.LocalAddr()
}

// pspOnA is the consumer's PSP and its request EVD.
type pspOnA struct {
	port uint16
	cr   *client.EVD
}

// responderPhase: the hostile client connects to the consumer's PSP.
func (x *caseRun) responderPhase(ca *app) (*pspOnA, net.Addr) {
	pair, c := x.env.pair, x.c
	crEVD, err := ca.ia.CreateEVD(client.EVDOptions{Depth: 16, Kind: client.CREvents})
	if err != nil {
		x.log.Errorf("CR EVD: %v", err)
		return nil, nil
	}
	psp := &pspOnA{port: 22000 + x.idx, cr: crEVD}
	if _, err := ca.ia.CreatePSP(psp.port, crEVD, false); err != nil {
		x.log.Errorf("PSP: %v", err)
		return nil, nil
	}
	conn, err := peerDial(pair.B, netip.AddrPortFrom(pair.A.Addr.Addr(), psp.port), c.rcvbuf)
	if err != nil {
		x.log.Errorf("the hostile client could not connect to the PSP: %v", err)
		return psp, nil
	}
	x.later(func() { conn.SetLinger(0); conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(25 * time.Second))
	hostile := conn.LocalAddr()
	finish := make(chan struct{})
	p := newPeerConn(conn, x.log, finish)
	peerDone := make(chan error, 1)
	go func() {
		err := c.peer(p)
		p.signal()
		peerDone <- err
	}()

	wait := quietWait
	if c.cr != crNever {
		wait = 3 * time.Second
	}
	ev, err := waitEvent(crEVD, wait)
	switch {
	case err != nil && c.cr == crAlways:
		x.log.Errorf("no connection request within %v for a valid Request", wait)
	case err != nil:
		x.log.Logf("consumer: no connection request within %v", wait)
	case ev.CR == nil:
		x.log.Errorf("the request EVD gave %+v", ev)
	case c.cr == crNever:
		info, _ := ev.CR.Query()
		x.log.Errorf("a connection request reached the consumer (from %s, private data %q)", info.RemoteAddr, info.PrivateData)
		_ = ev.CR.Reject(nil)
	default:
		e, eerr := ca.endpoint(c.attr)
		if eerr != nil {
			x.log.Errorf("consumer EP: %v", eerr)
			break
		}
		cons := &consumer{e: e, peer: p, log: x.log}
		cons.acceptErr = ev.CR.Accept(e.ep, nil)
		if c.after != nil {
			if aerr := c.after(cons); aerr != nil {
				x.log.Errorf("consumer: %v", aerr)
			}
		}
	}
	close(finish)
	select {
	case err := <-peerDone:
		if err != nil {
			x.log.Errorf("hostile peer: %v", err)
		}
	case <-time.After(8 * time.Second):
		x.log.Errorf("the hostile peer's script did not end")
	}
	return psp, hostile
}

// goodConnect: the consumer's IA connects a new EP to the well-behaved
// daemon and moves a verified message.
func (x *caseRun) goodConnect(ca, sb *app, port uint16, cr *client.EVD) error {
	ae, err := ca.endpoint(nil)
	if err != nil {
		return err
	}
	be, err := sb.endpoint(nil)
	if err != nil {
		return err
	}
	if err := be.ep.PostRecv(7, []client.Segment{{LMR: sb.lmr, Offset: goodOff, Length: goodLen}}); err != nil {
		return err
	}
	if err := ae.ep.Connect(netip.AddrPortFrom(x.env.pair.B.Addr.Addr(), port).String(), nil, 3*time.Second); err != nil {
		return err
	}
	ev, err := waitEvent(cr, 4*time.Second)
	if err != nil || ev.CR == nil {
		return fmt.Errorf("no connection request at the good peer: %v", err)
	}
	if err := ev.CR.Accept(be.ep, nil); err != nil {
		return err
	}
	return exchange(ae, be, 0, goodOff)
}

// goodAccept: the well-behaved daemon connects into the consumer's PSP,
// the one the hostile peer abused, and a verified message moves. B, the
// initiator, sends: a responder sends nothing before the initiator's first
// FPDU (RFC 5044 §7.1.2).
func (x *caseRun) goodAccept(ca, sb *app, psp *pspOnA, hostile net.Addr) error {
	ae, err := ca.endpoint(nil)
	if err != nil {
		return err
	}
	be, err := sb.endpoint(nil)
	if err != nil {
		return err
	}
	if err := ae.ep.PostRecv(7, []client.Segment{{LMR: ca.lmr, Length: goodLen}}); err != nil {
		return err
	}
	if err := be.ep.Connect(netip.AddrPortFrom(x.env.pair.A.Addr.Addr(), psp.port).String(), nil, 3*time.Second); err != nil {
		return err
	}
	for range 3 {
		ev, err := waitEvent(psp.cr, 4*time.Second)
		if err != nil || ev.CR == nil {
			return fmt.Errorf("no connection request from the good peer: %v", err)
		}
		info, _ := ev.CR.Query()
		if hostile != nil && info.RemoteAddr == hostile.String() {
			x.log.Errorf("a late connection request from the hostile peer reached the consumer")
			_ = ev.CR.Reject(nil)
			continue
		}
		if err := ev.CR.Accept(ae.ep, nil); err != nil {
			return err
		}
		return exchange(be, ae, goodOff, 0)
	}
	return errors.New("no request from the good peer")
}

// exchange waits for both EPs to be connected, sends goodLen octets of a
// pattern from a's buffer at srcOff to b (which has a receive posted at
// dstOff of its buffer), checks them, and a disconnects abortively.
func exchange(a, b *endpoint, srcOff, dstOff uint64) error {
	src, dst := a.a.buf.Bytes[srcOff:srcOff+goodLen], b.a.buf.Bytes[dstOff:dstOff+goodLen]
	for _, e := range []*endpoint{a, b} {
		ev, err := e.waitConn(4 * time.Second)
		if err != nil || ev != client.Established {
			return fmt.Errorf("connection: %v %v", ev, err)
		}
	}
	pattern(src, 77)
	if err := a.ep.PostSend(7, []client.Segment{{LMR: a.a.lmr, Offset: srcOff, Length: goodLen}}, client.Signaled); err != nil {
		return err
	}
	ev, err := waitEvent(b.recv, 3*time.Second)
	if err != nil || ev.Status != completion.Success || ev.Length != uint32(len(src)) {
		sent, _, _ := a.req.Dequeue()
		sa, _ := a.ep.State()
		sb, _ := b.ep.State()
		return fmt.Errorf("receive: %v (status %v, %d octets); the sender's completion: %v (status %v); EPs %v and %v",
			err, ev.Status, ev.Length, sent.Type, sent.Status, sa, sb)
	}
	if !bytes.Equal(dst, src) {
		return errors.New("the message arrived altered")
	}
	if ev, err := waitEvent(a.req, 3*time.Second); err != nil || ev.Status != completion.Success {
		return fmt.Errorf("send completion: %+v %v", ev, err)
	}
	if err := a.ep.Disconnect(false); err != nil {
		return err
	}
	if ev, err := a.waitConn(3 * time.Second); err != nil || (ev != client.Disconnected && ev != client.Broken) {
		return fmt.Errorf("disconnect: %v %v", ev, err)
	}
	if _, err := b.waitConn(3 * time.Second); err != nil {
		return fmt.Errorf("the peer's EP never ended: %v", err)
	}
	return nil
}
