package scale

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/completion"
)

// The client processes. Each is an ordinary application of its host's
// daemon, using nothing but the client package, so that what the
// orchestrator measures is what any application holding that many
// endpoints would cost. One command a line on standard input, one JSON
// answer a line on standard output:
//
//	active (host A)   connect COUNT BATCH | close | await-disconnects SECONDS |
//	                  data PORT STAG VA SIZE | stats | quit
//	passive (host B)  status | wait-live COUNT SECONDS | await-data SECONDS |
//	                  stats | quit
//
// The passive process accepts every connection request onto an EP of its
// own with a receive posted, and frees each EP whose connection ends; the
// active one creates, connects, disconnects and frees EPs when told.

// Roles of the client processes.
const (
	Active  = "active"
	Passive = "passive"
)

// ClientOptions configure a client process.
type ClientOptions struct {
	// Role is Active or Passive.
	Role string
	// Socket is the host's daemon's control socket.
	Socket string
	// Peer is the passive side's address, host:port (Active).
	Peer string
	// Port is the port to listen on (Passive).
	Port uint16
	// DataSize is the size of the RDMA Write target (Passive).
	DataSize int
	// ConnectTimeout is each Connect's own timeout (Active).
	ConnectTimeout time.Duration
}

// Shape of every EP: the issue's, an application's idle connection with
// one receive posted (iWARP has no RNR retry, so a connection that may
// receive a Send always has one).
const (
	epDepth = 4
	epIRD   = 1
	epORD   = 1
	// Each EP's receive takes a slot of the receive buffer; slots are
	// reused round-robin, which is harmless: only the data checks'
	// connections ever receive.
	slotSize  = 64
	recvSlots = 1 << 14
	// msgLen is the data check's Send: the size written, then its
	// SHA-256.
	msgLen = 8 + sha256.Size
	// dataCookie marks the data check's own work requests, apart from the
	// receives' cookies (slot numbers).
	dataCookie = 1 << 62
	// evdDepth holds a batch's connection events (a thousand) though the
	// drains take them as they come, and no more: every slot of an EVD
	// ring the daemon has written stays in its RSS (shared memory), and
	// a deeper ring would add its megabytes to what after churn is
	// compared to a fresh daemon's few. A ring that fills holds the
	// daemon's events until the drain makes room.
	evdDepth = 1 << 10
)

// endpoint is one EP of a client process and how far its connection got.
type endpoint struct {
	ep          *client.EP
	established bool
	// ended is the connection event that ended the connection or the
	// attempt (DISCONNECTED, BROKEN, a rejection...), 0 while neither.
	ended client.ConnEvent
	at    time.Time // when established or ended last changed
}

// live is an endpoint whose connection is up.
func (e *endpoint) live() bool { return e.established && e.ended == 0 }

// proc is a client process's state.
type proc struct {
	opts             ClientOptions
	ia               *client.IA
	pz               *client.PZ
	recvBuf, dataBuf *client.Buffer
	recvLMR, dataLMR *client.LMR
	dto, conn, cr    *client.EVD
	drains           sync.WaitGroup

	// mu guards what follows: the drains record events under it and the
	// command loop reads them. No request to the daemon is made while it
	// is held (one can take a while on a busy daemon, and a drain
	// blocked behind it would let events pile up).
	mu       sync.Mutex
	eps      map[uint32]*endpoint // by EP handle
	nextSlot int
	failures map[string]int
	// Counts for status: requests and accepts (passive), connections
	// up and EPs freed (both).
	requests, accepted, establishedCount, freed int
	// flushed counts receives completed without data (flushed at close).
	flushed int
	// dtoDone holds the data checks' completions by cookie (active), and
	// dataSeq numbers the checks.
	dtoDone map[uint64]completion.Status
	dataSeq uint64
	// results are the passive side's checks of the Writes, oldest first.
	results []DataResult
	// marked are the connections mark-live found up (active).
	marked []*endpoint
	// changed is poked (never blocking) after every change under mu;
	// the command loop, the only waiter, sleeps on it.
	changed chan struct{}
}

// RunClient runs a client process: it sets up, prints its ready line, then
// answers the commands on in until quit or the end of in.
func RunClient(ctx context.Context, o ClientOptions, in io.Reader, out io.Writer) error {
	if o.Role != Active && o.Role != Passive {
		return fmt.Errorf("role %q: want %s or %s", o.Role, Active, Passive)
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 30 * time.Second
	}
	p := &proc{opts: o, eps: map[uint32]*endpoint{}, failures: map[string]int{}, dtoDone: map[uint64]completion.Status{},
		changed: make(chan struct{}, 1)}
	ready, err := p.setup(ctx)
	if err != nil {
		if p.ia != nil {
			p.ia.Close()
			p.drains.Wait()
		}
		return err
	}
	defer func() { p.ia.Close(); p.drains.Wait() }()
	enc := json.NewEncoder(out)
	if err := enc.Encode(ready); err != nil {
		return err
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if f[0] == "quit" {
			return enc.Encode(struct{}{})
		}
		if err := enc.Encode(p.command(f)); err != nil {
			return err
		}
	}
	return sc.Err()
}

// Ready is a client process's first line.
type Ready struct {
	Ready bool `json:"ready"`
	// The passive side's RDMA Write target, for the data checks.
	STag uint32 `json:"stag,omitempty"`
	VA   uint64 `json:"va,omitempty"`
	Size int    `json:"size,omitempty"`
}

func (p *proc) setup(ctx context.Context) (Ready, error) {
	var err error
	if p.ia, err = client.Open(ctx, client.Options{Socket: p.opts.Socket, Name: "softrnic-scale " + p.opts.Role}); err != nil {
		return Ready{}, err
	}
	if p.pz, err = p.ia.CreatePZ(); err != nil {
		return Ready{}, err
	}
	if p.recvBuf, err = p.ia.Alloc(recvSlots * slotSize); err != nil {
		return Ready{}, err
	}
	if p.recvLMR, err = p.pz.RegisterLMR(p.recvBuf, client.LocalWrite); err != nil {
		return Ready{}, err
	}
	if p.dto, err = p.ia.CreateEVD(client.EVDOptions{Depth: evdDepth, Kind: client.DTOEvents}); err != nil {
		return Ready{}, err
	}
	if p.conn, err = p.ia.CreateEVD(client.EVDOptions{Depth: evdDepth, Kind: client.ConnectionEvents}); err != nil {
		return Ready{}, err
	}
	p.drain(p.dto, p.onDTO)
	p.drain(p.conn, p.onConn)
	if p.opts.Role == Active {
		return Ready{Ready: true}, nil
	}
	if p.dataBuf, err = p.ia.Alloc(p.opts.DataSize); err != nil {
		return Ready{}, err
	}
	if p.dataLMR, err = p.pz.RegisterLMR(p.dataBuf, client.LocalWrite|client.RemoteWrite); err != nil {
		return Ready{}, err
	}
	if p.cr, err = p.ia.CreateEVD(client.EVDOptions{Depth: evdDepth, Kind: client.CREvents}); err != nil {
		return Ready{}, err
	}
	// The drain before the PSP: requests start arriving as soon as it
	// listens.
	p.drain(p.cr, p.onRequest)
	if _, err = p.ia.CreatePSP(p.opts.Port, p.cr, false); err != nil {
		return Ready{}, err
	}
	return Ready{Ready: true, STag: p.dataLMR.Context, VA: p.dataLMR.Address(0), Size: p.opts.DataSize}, nil
}

// drain takes evd's events as they come and hands each to fn, until the
// IA is closed or the daemon goes.
func (p *proc) drain(evd *client.EVD, fn func(client.Event)) {
	p.drains.Add(1)
	go func() {
		defer p.drains.Done()
		for {
			ev, err := evd.Wait(context.Background())
			if err != nil {
				if !errors.Is(err, client.ErrClosed) {
					fmt.Fprintf(os.Stderr, "softrnic-scale %s: EVD: %v\n", p.opts.Role, err)
				}
				return
			}
			fn(ev)
		}
	}()
}

// poke wakes the command loop; p.mu held.
func (p *proc) poke() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// fail counts a failure by its cause; p.mu held. Causes are the daemon's
// messages, which may name objects: past 32 distinct ones the rest are
// counted together so that a run of failures cannot grow the answer
// without bound.
func (p *proc) fail(what string, err error) {
	cause := what + ": " + err.Error()
	if _, ok := p.failures[cause]; !ok && len(p.failures) >= 32 {
		cause = what + ": other causes"
	}
	p.failures[cause]++
	p.poke()
}

// waitFor waits until cond, called with p.mu held, holds or d has passed,
// and reports whether it held. It gives up early once the daemon has
// gone: no event will come.
func (p *proc) waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	gone := time.NewTicker(time.Second)
	defer gone.Stop()
	for {
		p.mu.Lock()
		ok := cond()
		p.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-p.changed:
		case <-gone.C:
			if p.ia.Gone() {
				p.mu.Lock()
				defer p.mu.Unlock()
				return cond()
			}
		case <-deadline.C:
			p.mu.Lock()
			defer p.mu.Unlock()
			return cond()
		}
	}
}

// newEP creates an EP of the benchmark's shape with its receive posted.
func (p *proc) newEP() (*endpoint, error) {
	ep, err := p.ia.CreateEP(client.EPAttr{PZ: p.pz, RecvEVD: p.dto, RequestEVD: p.dto, ConnectEVD: p.conn,
		SQDepth: epDepth, RQDepth: epDepth, IRD: epIRD, ORD: epORD})
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	slot := p.nextSlot
	p.nextSlot = (p.nextSlot + 1) % recvSlots
	p.mu.Unlock()
	if err := ep.PostRecv(uint64(slot), []client.Segment{{LMR: p.recvLMR, Offset: uint64(slot * slotSize), Length: slotSize}}); err != nil {
		_ = ep.Free()
		return nil, fmt.Errorf("post receive: %w", err)
	}
	e := &endpoint{ep: ep}
	p.mu.Lock()
	p.eps[ep.Handle()] = e
	p.mu.Unlock()
	return e, nil
}

// free frees e's EP and forgets it.
func (p *proc) free(e *endpoint) error {
	err := e.ep.Free()
	p.mu.Lock()
	delete(p.eps, e.ep.Handle())
	p.freed++
	p.poke()
	p.mu.Unlock()
	return err
}

// onConn records a connection event. The passive side frees an EP whose
// connection ended, as a server does; the active side's are freed by the
// commands that ended them.
func (p *proc) onConn(ev client.Event) {
	if ev.Type != client.ConnectionEvent || ev.EP == nil {
		return
	}
	p.mu.Lock()
	e := p.eps[ev.EP.Handle()]
	if e == nil {
		p.mu.Unlock()
		return
	}
	e.at = time.Now()
	if ev.Conn == client.Established {
		e.established = true
		p.establishedCount++
		p.poke()
		p.mu.Unlock()
		return
	}
	e.ended = ev.Conn
	if p.opts.Role == Active {
		p.poke()
		p.mu.Unlock()
		return
	}
	if !e.established {
		p.fail("accepted connection", errors.New(ev.Conn.String()))
	}
	p.mu.Unlock()
	if err := p.free(e); err != nil {
		p.mu.Lock()
		p.fail("free EP", err)
		p.mu.Unlock()
	}
}

// onRequest accepts a connection request onto a new EP with its receive
// posted before the Accept, since the peer may send at once.
func (p *proc) onRequest(ev client.Event) {
	if ev.Type != client.ConnectionRequest || ev.CR == nil {
		return
	}
	p.mu.Lock()
	p.requests++
	p.mu.Unlock()
	e, err := p.newEP()
	if err != nil {
		p.mu.Lock()
		p.fail("create EP", err)
		p.mu.Unlock()
		_ = ev.CR.Reject(nil)
		return
	}
	if err := ev.CR.Accept(e.ep, nil); err != nil {
		p.mu.Lock()
		p.fail("accept", err)
		p.mu.Unlock()
		_ = p.free(e)
		return
	}
	p.mu.Lock()
	p.accepted++
	p.poke()
	p.mu.Unlock()
}

// onDTO counts flushed receives, records the data check's completions
// (active) and verifies the data check's Write when its Send arrives
// (passive): a Send is placed after the Write before it on the same
// connection (RFC 5040 §5.5), so the target holds the Write by then.
func (p *proc) onDTO(ev client.Event) {
	if ev.Type != client.DTOCompletion {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.poke()
	if ev.Cookie&dataCookie != 0 {
		p.dtoDone[ev.Cookie] = ev.Status
		return
	}
	if ev.Status != completion.Success || ev.Length == 0 {
		p.flushed++
		return
	}
	if p.opts.Role != Passive {
		return
	}
	r := DataResult{}
	off := int(ev.Cookie) * slotSize
	switch {
	case ev.Cookie >= recvSlots || ev.Length != msgLen:
		r.Err = fmt.Sprintf("a %d-octet Send on slot %d, want %d octets", ev.Length, ev.Cookie, msgLen)
	default:
		msg := p.recvBuf.Bytes[off : off+msgLen]
		r.Bytes = int(binary.LittleEndian.Uint64(msg))
		r.Want = hex.EncodeToString(msg[8:])
		if r.Bytes > len(p.dataBuf.Bytes) {
			r.Err = fmt.Sprintf("the Write was %d octets, more than the %d-octet target", r.Bytes, len(p.dataBuf.Bytes))
			break
		}
		got := sha256.Sum256(p.dataBuf.Bytes[:r.Bytes])
		r.Got = hex.EncodeToString(got[:])
		r.Verified = r.Got == r.Want
	}
	p.results = append(p.results, r)
}

// command runs one command and returns its answer.
func (p *proc) command(f []string) any {
	bad := func(format string, args ...any) any { return commandError{fmt.Sprintf(format, args...)} }
	ints := func(want int) ([]uint64, bool) {
		if len(f) != want+1 {
			return nil, false
		}
		v := make([]uint64, want)
		for i := range v {
			n, err := strconv.ParseUint(f[i+1], 10, 64)
			if err != nil {
				return nil, false
			}
			v[i] = n
		}
		return v, true
	}
	seconds := func(n uint64) time.Duration { return time.Duration(n) * time.Second }
	switch {
	case f[0] == "stats":
		s, err := p.ia.Stats()
		if err != nil {
			return bad("stats: %v", err)
		}
		return s
	case f[0] == "connect" && p.opts.Role == Active:
		if v, ok := ints(2); ok && v[0] > 0 && v[1] > 0 {
			return p.connect(int(v[0]), int(v[1]))
		}
	case f[0] == "close" && p.opts.Role == Active:
		return p.closeAll()
	case f[0] == "mark-live" && p.opts.Role == Active:
		return p.markLive()
	case f[0] == "await-disconnects" && p.opts.Role == Active:
		if v, ok := ints(1); ok {
			return p.awaitDisconnects(seconds(v[0]))
		}
	case f[0] == "data" && p.opts.Role == Active:
		if v, ok := ints(4); ok && v[0] <= 1<<16-1 && v[1] <= 1<<32-1 && v[3] > 0 && v[3] <= 1<<31 {
			return p.data(uint16(v[0]), uint32(v[1]), v[2], int(v[3]))
		}
	case f[0] == "status" && p.opts.Role == Passive:
		return p.status()
	case f[0] == "wait-live" && p.opts.Role == Passive:
		if v, ok := ints(2); ok {
			p.waitFor(seconds(v[1]), func() bool { return len(p.eps) == int(v[0]) })
			return p.status()
		}
	case f[0] == "await-data" && p.opts.Role == Passive:
		if v, ok := ints(1); ok {
			return p.awaitData(seconds(v[0]))
		}
	}
	return bad("%s: no such command for the %s side, or bad arguments", strings.Join(f, " "), p.opts.Role)
}

// commandError answers a command that could not run at all.
type commandError struct {
	Err string `json:"command_error"`
}

// Batch is one batch of connections set up.
type Batch struct {
	// Start is how many connections were up when the batch began.
	Start int `json:"start"`
	// Size is how many it tried, Established how many came up.
	Size        int `json:"size"`
	Established int `json:"established"`
	// CreateSeconds is the time to create the batch's EPs and post
	// their receives; Seconds from the first Connect to the last
	// outcome, and Rate Established over Seconds.
	CreateSeconds float64 `json:"create_seconds"`
	Seconds       float64 `json:"seconds"`
	Rate          float64 `json:"qps_per_second"`
}

// ConnectReply answers connect.
type ConnectReply struct {
	Batches []Batch `json:"batches"`
	// Live is how many connections are up after the command.
	Live int `json:"live"`
	// Failures counts the failures since the last answer by cause.
	Failures map[string]int `json:"failures,omitempty"`
}

// takeFailures returns the failures counted since the last call.
func (p *proc) takeFailures() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.failures
	p.failures = map[string]int{}
	if len(f) == 0 {
		return nil
	}
	return f
}

// connect sets up count more connections, batch at a time: each batch's
// EPs are made, then all connected (Connect only starts a connection) and
// their outcomes awaited on the connect EVD. A batch in which none comes
// up ends the command: the next would fail the same way.
func (p *proc) connect(count, batch int) ConnectReply {
	var r ConnectReply
	for done := 0; done < count; {
		n := min(batch, count-done)
		b := Batch{Start: p.liveCount(), Size: n}
		t0 := time.Now()
		eps := make([]*endpoint, 0, n)
		for range n {
			e, err := p.newEP()
			if err != nil {
				p.mu.Lock()
				p.fail("create EP", err)
				p.mu.Unlock()
				continue
			}
			eps = append(eps, e)
		}
		start := time.Now()
		b.CreateSeconds = start.Sub(t0).Seconds()
		tried := eps[:0]
		for _, e := range eps {
			if err := e.ep.Connect(p.opts.Peer, nil, p.opts.ConnectTimeout); err != nil {
				p.mu.Lock()
				p.fail("connect", err)
				p.mu.Unlock()
				_ = p.free(e)
				continue
			}
			tried = append(tried, e)
		}
		// Each Connect has its own timeout; past it and a margin an
		// attempt is counted as lost by the daemon.
		p.waitFor(p.opts.ConnectTimeout+10*time.Second, func() bool {
			for _, e := range tried {
				if !e.established && e.ended == 0 {
					return false
				}
			}
			return true
		})
		last := start
		p.mu.Lock()
		var gone []*endpoint
		for _, e := range tried {
			switch {
			case e.live():
				b.Established++
			case e.ended != 0 && !e.established:
				p.fail("connect event", errors.New(e.ended.String()))
				gone = append(gone, e)
			case e.ended != 0:
				p.fail("connection ended during its batch", errors.New(e.ended.String()))
				gone = append(gone, e)
			default:
				p.fail("connect", fmt.Errorf("no outcome within %v", p.opts.ConnectTimeout+10*time.Second))
				gone = append(gone, e)
			}
			if e.at.After(last) {
				last = e.at
			}
		}
		p.mu.Unlock()
		for _, e := range gone {
			_ = p.free(e)
		}
		b.Seconds = last.Sub(start).Seconds()
		if b.Seconds > 0 {
			b.Rate = float64(b.Established) / b.Seconds
		}
		r.Batches = append(r.Batches, b)
		done += n
		if b.Established == 0 {
			break
		}
	}
	r.Live = p.liveCount()
	r.Failures = p.takeFailures()
	return r
}

func (p *proc) liveCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, e := range p.eps {
		if e.live() {
			n++
		}
	}
	return n
}

// CloseReply answers close.
type CloseReply struct {
	// Disconnected is how many live connections were disconnected, Seen
	// how many of them had their disconnect event, within Seconds.
	Disconnected int     `json:"disconnected"`
	Seen         int     `json:"seen"`
	Seconds      float64 `json:"seconds"`
	// Freed is how many EPs were freed: all of them.
	Freed    int            `json:"freed"`
	Failures map[string]int `json:"failures,omitempty"`
}

// closeAll disconnects every live connection gracefully, waits for the
// disconnect events, and frees every EP.
func (p *proc) closeAll() CloseReply {
	var r CloseReply
	t0 := time.Now()
	p.mu.Lock()
	all := make([]*endpoint, 0, len(p.eps))
	for _, e := range p.eps {
		all = append(all, e)
	}
	p.mu.Unlock()
	var live []*endpoint
	for _, e := range all {
		p.mu.Lock()
		up := e.live()
		p.mu.Unlock()
		if !up {
			continue
		}
		if err := e.ep.Disconnect(true); err != nil {
			p.mu.Lock()
			p.fail("disconnect", err)
			p.mu.Unlock()
			continue
		}
		live = append(live, e)
	}
	r.Disconnected = len(live)
	p.waitFor(60*time.Second, func() bool { return countEnded(live) == len(live) })
	p.mu.Lock()
	r.Seen = countEnded(live)
	p.mu.Unlock()
	r.Seconds = time.Since(t0).Seconds()
	for _, e := range all {
		if err := p.free(e); err != nil {
			p.mu.Lock()
			p.fail("free EP", err)
			p.mu.Unlock()
			continue
		}
		r.Freed++
	}
	r.Failures = p.takeFailures()
	return r
}

// countEnded is how many of eps have ended; p.mu held.
func countEnded(eps []*endpoint) int {
	n := 0
	for _, e := range eps {
		if e.ended != 0 {
			n++
		}
	}
	return n
}

// MarkReply answers mark-live.
type MarkReply struct {
	// Live is how many connections are up.
	Live int `json:"live"`
	// EndedBefore counts, by event, the connections that had come up
	// and ended on their own before the command: none should.
	EndedBefore map[string]int `json:"ended_before,omitempty"`
}

// markLive notes the connections up now, for await-disconnects to watch.
// The orchestrator has the answer before it stops the peer's daemon, so
// that no disconnect the signal causes can pass for one that came before
// it, however late this process reads its commands.
func (p *proc) markLive() MarkReply {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marked = p.marked[:0]
	r := MarkReply{EndedBefore: map[string]int{}}
	for _, e := range p.eps {
		switch {
		case e.live():
			p.marked = append(p.marked, e)
		case e.established:
			r.EndedBefore[e.ended.String()]++
		}
	}
	r.Live = len(p.marked)
	if len(r.EndedBefore) == 0 {
		r.EndedBefore = nil
	}
	return r
}

// DisconnectReply answers await-disconnects.
type DisconnectReply struct {
	// Live is how many connections mark-live found up, Seen how many
	// of them have since had an event ending them.
	Live int `json:"live"`
	Seen int `json:"seen"`
	// LastUnixNano is when the last of them came (the orchestrator
	// takes it from its signal); LastSeconds is that, filled in by the
	// orchestrator.
	LastUnixNano int64   `json:"last_unix_nano"`
	LastSeconds  float64 `json:"-"`
	// Events counts the events by name (DISCONNECTED, BROKEN).
	Events map[string]int `json:"events"`
	// EndedBefore counts, by event, the connections that had come up
	// and ended on their own before mark-live: none should.
	EndedBefore map[string]int `json:"ended_before,omitempty"`
}

// awaitDisconnects waits up to d for every connection mark-live found up
// to end.
func (p *proc) awaitDisconnects(d time.Duration) DisconnectReply {
	p.mu.Lock()
	live := slices.Clone(p.marked)
	p.mu.Unlock()
	p.waitFor(d, func() bool { return countEnded(live) == len(live) })
	r := DisconnectReply{Live: len(live), Events: map[string]int{}}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range live {
		if e.ended == 0 {
			continue
		}
		r.Seen++
		r.Events[e.ended.String()]++
		r.LastUnixNano = max(r.LastUnixNano, e.at.UnixNano())
	}
	return r
}

// DataReply answers data: the active side's part of a data check.
type DataReply struct {
	OK      bool    `json:"ok"`
	Bytes   int     `json:"bytes"`
	SHA256  string  `json:"sha256"`
	Seconds float64 `json:"seconds"`
	Err     string  `json:"error,omitempty"`
}

// data is the data check: a new connection to the passive side on port
// (of the peer's host), an RDMA Write of size random octets into its
// target, then a Send of their size and SHA-256, which the passive side
// checks the target against. The connection is disconnected and freed
// after.
func (p *proc) data(port uint16, stag uint32, va uint64, size int) (r DataReply) {
	t0 := time.Now()
	r.Bytes = size
	defer func() { r.Seconds = time.Since(t0).Seconds() }()
	fail := func(format string, args ...any) DataReply {
		r.Err = fmt.Sprintf(format, args...)
		return r
	}
	buf, err := p.ia.Alloc(size + msgLen)
	if err != nil {
		return fail("alloc: %v", err)
	}
	defer buf.Free()
	rng := rand.NewChaCha8([32]byte{byte(size), byte(t0.UnixNano())})
	_, _ = rng.Read(buf.Bytes[:size])
	sum := sha256.Sum256(buf.Bytes[:size])
	r.SHA256 = hex.EncodeToString(sum[:])
	binary.LittleEndian.PutUint64(buf.Bytes[size:], uint64(size))
	copy(buf.Bytes[size+8:], sum[:])
	lmr, err := p.pz.RegisterLMR(buf, client.LocalWrite)
	if err != nil {
		return fail("register: %v", err)
	}
	defer lmr.Free()
	e, err := p.newEP()
	if err != nil {
		return fail("create EP: %v", err)
	}
	defer func() {
		p.mu.Lock()
		up := e.live()
		p.mu.Unlock()
		if up && e.ep.Disconnect(true) == nil {
			p.waitFor(10*time.Second, func() bool { return e.ended != 0 })
		}
		_ = p.free(e)
	}()
	host, _, err := net.SplitHostPort(p.opts.Peer)
	if err != nil {
		return fail("peer %q: %v", p.opts.Peer, err)
	}
	if err := e.ep.Connect(net.JoinHostPort(host, strconv.Itoa(int(port))), nil, p.opts.ConnectTimeout); err != nil {
		return fail("connect: %v", err)
	}
	p.waitFor(p.opts.ConnectTimeout+10*time.Second, func() bool { return e.established || e.ended != 0 })
	p.mu.Lock()
	up, ended := e.live(), e.ended
	p.dataSeq++
	write, send := dataCookie|p.dataSeq<<2, dataCookie|p.dataSeq<<2|1
	p.mu.Unlock()
	if !up {
		return fail("connect: %v", ended)
	}
	if err := e.ep.PostWrite(write, []client.Segment{{LMR: lmr, Length: uint32(size)}}, client.RemoteBuffer{Context: stag, Address: va}, client.Signaled); err != nil {
		return fail("post Write: %v", err)
	}
	if err := e.ep.PostSend(send, []client.Segment{{LMR: lmr, Offset: uint64(size), Length: msgLen}}, client.Signaled); err != nil {
		return fail("post Send: %v", err)
	}
	done := p.waitFor(60*time.Second, func() bool {
		_, w := p.dtoDone[write]
		_, s := p.dtoDone[send]
		return w && s
	})
	p.mu.Lock()
	ws, ss := p.dtoDone[write], p.dtoDone[send]
	delete(p.dtoDone, write)
	delete(p.dtoDone, send)
	p.mu.Unlock()
	if !done {
		return fail("the Write and Send did not both complete within 60 s")
	}
	if ws != completion.Success || ss != completion.Success {
		return fail("Write %v, Send %v", ws, ss)
	}
	r.OK = true
	return r
}

// DataResult is the passive side's check of one data check's Write.
type DataResult struct {
	Verified bool   `json:"verified"`
	Bytes    int    `json:"bytes"`
	Want     string `json:"want_sha256,omitempty"`
	Got      string `json:"got_sha256,omitempty"`
	Err      string `json:"error,omitempty"`
}

// awaitData waits up to d for the next data check's Send and returns what
// it found.
func (p *proc) awaitData(d time.Duration) DataResult {
	if !p.waitFor(d, func() bool { return len(p.results) > 0 }) {
		return DataResult{Err: fmt.Sprintf("no data check's Send arrived within %v", d)}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.results[0]
	p.results = p.results[1:]
	return r
}

// Status is the passive side's counts so far.
type Status struct {
	// Requests received; Accepted: the Accept call succeeded;
	// Established: the connection came up.
	Requests    int `json:"requests"`
	Accepted    int `json:"accepted"`
	Established int `json:"established"`
	// Live is how many EPs it holds, Freed how many it has freed.
	Live    int `json:"live"`
	Freed   int `json:"freed"`
	Flushed int `json:"flushed_receives"`
	// Failures counts the failures since the last answer by cause.
	Failures map[string]int `json:"failures,omitempty"`
}

func (p *proc) status() Status {
	f := p.takeFailures()
	p.mu.Lock()
	defer p.mu.Unlock()
	return Status{Requests: p.requests, Accepted: p.accepted, Established: p.establishedCount, Live: len(p.eps),
		Freed: p.freed, Flushed: p.flushed, Failures: f}
}
