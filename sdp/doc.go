// Package sdp is the Sockets Direct Protocol over softrnic: stream sockets
// whose octets travel as RDMA messages between two hosts that both run
// softrnicd, with plain kernel TCP whenever either end cannot (seeds 001
// and 002: SDP and the Offload Sockets Framework).
//
// Programs swap net.Dial and net.Listen for a Dialer and Listen and get a
// net.Conn and a net.Listener that behave as TCP's:
//
//	ln, err := sdp.Listen("tcp", ":7000")        // was net.Listen
//	c, err := sdp.Dial("tcp", "192.0.2.1:7000")  // was net.Dial
//
// # Wire
//
// The messages are those of the InfiniBand Architecture's Annex A4 as
// OpenFabrics' ib_sdp sent them: every message starts with the 16-octet
// big-endian Base Sockets Direct Header (BSDH: MID, Flags, Bufs, Len, MSeq,
// MSeqAck), and each is one RDMA Send into a receive buffer the peer
// posted (Bcopy). See wire.go for the encodings.
//
// Hello and HelloAck ride in the MPA Request's and Reply's private data.
// That is softrnic's choice for iWARP: no iWARP peer defines SDP's
// connection setup (the iWARP SDP draft was never finished), and it
// follows the precedent of rdma_cm, which carries ib_sdp's Hello in the
// connection manager's private data on InfiniBand. With MPA revision 2
// the daemon puts its IRD/ORD words first; the Hello follows them.
//
// # Credits
//
// A Send with no receive posted is fatal in iWARP (there is no
// receiver-not-ready retry), so no message goes without a credit: credits
// = MSeqAck − next MSeq + 1 + Bufs, from the peer's latest message. Two
// credits are kept for messages that carry no data, and the last one only
// for a message that gives credits and carries none (Annex A4 CA4-82): a
// zero-length Data message, the credit update, or an answer (RdmaRdCompl,
// SendSM, …) that advertises receives posted since our last message.
//
// # Accepting SDP and TCP on one port
//
// Listen opens a kernel TCP listener, so that one port and one accept
// queue serve both kinds of client. Each accepted connection is looked at
// (MSG_PEEK) until its first octets say what it is: an MPA Request (an
// SDP client, through its daemon) goes to the local daemon as a Socket
// Service Point, which takes the connection over and answers it as an
// RDMA connection (on the xdp datapath the daemon's engine takes the live
// connection from the kernel, so XDP steering starts only then); anything
// else is handed to Accept as the TCP connection it is, with nothing
// consumed. A client that sends nothing is TCP once DetectTimeout passes:
// a protocol in which the server speaks first waits that long once.
// A client the listener will not offload (Policy, SOFTRNIC_SDP=off, or
// no daemon to be had) is looked at all the same: its MPA Request is answered with a Reply whose
// Reject bit is set (RFC 5044 §7.1.1), so that it falls back to TCP at
// once, and the application never reads MPA octets.
package sdp
