package client_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/internal/leakcheck"
)

// TestMain lets the test binary act as a client process for crash tests.
// As the test binary it fails the run if a goroutine the tests started (an
// IA's watcher, a daemon's loops) is still running after the tests closed
// their IAs and daemons; the child is killed, so it is not checked.
func TestMain(m *testing.M) {
	if os.Getenv("SOFTRNIC_TEST_CHILD") != "" {
		if err := child(); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(leakcheck.Main(m))
}

// child connects to the server named in the environment and RDMA-writes to
// it until killed (at most 60 s).
func child() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ia, err := client.Open(ctx, client.Options{Socket: os.Getenv("SOFTRNIC_SOCKET"), Name: "crash-child"})
	if err != nil {
		return err
	}
	pz, _ := ia.CreatePZ()
	buf, _ := ia.Alloc(1 << 20)
	lmr, err := pz.RegisterLMR(buf, client.LocalWrite)
	if err != nil {
		return err
	}
	req, _ := ia.CreateEVD(client.EVDOptions{Depth: 64, Kind: client.DTOEvents})
	conn, _ := ia.CreateEVD(client.EVDOptions{Depth: 8, Kind: client.ConnectionEvents})
	ep, err := ia.CreateEP(client.EPAttr{PZ: pz, RecvEVD: req, RequestEVD: req, ConnectEVD: conn, SQDepth: 32, RQDepth: 4})
	if err != nil {
		return err
	}
	if err := ep.Connect(os.Getenv("SOFTRNIC_SERVER"), nil, 10*time.Second); err != nil {
		return err
	}
	if ev, err := conn.Wait(ctx); err != nil || ev.Conn != client.Established {
		return fmt.Errorf("connect: %v %v", ev.Conn, err)
	}
	stag, _ := strconv.ParseUint(os.Getenv("SOFTRNIC_STAG"), 10, 32)
	to, _ := strconv.ParseUint(os.Getenv("SOFTRNIC_TO"), 10, 64)
	fmt.Println("connected")
	for i := uint64(0); ctx.Err() == nil; i++ {
		err := ep.PostWrite(i, []client.Segment{{LMR: lmr, Length: 1 << 20}}, client.RemoteBuffer{Context: uint32(stag), Address: to}, client.Signaled)
		if err != nil {
			if _, err := req.Wait(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	must(t, err)
	return len(ents)
}

func TestClientKilledMidTransfer(t *testing.T) {
	sock, srv := startDaemon(t)
	server := newApp(t, sock, "server")
	port := freePort(t)
	_, err := server.ia.CreatePSP(port, server.cr, false)
	must(t, err)
	// The EP that will accept exists before the counts are taken: what
	// the child leaves behind is then the difference.
	sep := server.ep(t)
	before := srv.Counts()
	fdsBefore := openFDs(t)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SOFTRNIC_TEST_CHILD=1", "SOFTRNIC_SOCKET="+sock, "SOFTRNIC_SERVER="+addr(port),
		fmt.Sprintf("SOFTRNIC_STAG=%d", server.lmr.Context), fmt.Sprintf("SOFTRNIC_TO=%d", server.lmr.Address(0)))
	out, err := cmd.StdoutPipe()
	must(t, err)
	cmd.Stderr = os.Stderr
	must(t, cmd.Start())
	defer cmd.Process.Kill()

	ev := wait(t, server.cr)
	must(t, ev.CR.Accept(sep, nil))
	if ev := wait(t, server.conn); ev.Conn != client.Established {
		t.Fatalf("%v", ev.Conn)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "connected" {
		t.Fatalf("child: %q %v", line, err)
	}
	time.Sleep(200 * time.Millisecond) // mid-transfer
	must(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()

	// The peer learns the connection is gone.
	if ev := wait(t, server.conn); ev.Conn != client.Disconnected && ev.Conn != client.Broken {
		t.Fatalf("server saw %v", ev.Conn)
	}
	// Within a second the daemon has freed everything the child owned:
	// counts back to what they were.
	deadline := time.Now().Add(time.Second)
	for {
		now := srv.Counts()
		if now["sessions"] == before["sessions"] && now["ep"] == before["ep"] && now["pz"] == before["pz"] &&
			now["lmr"] == before["lmr"] && now["evd"] == before["evd"] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("one second after the kill: %v, before: %v", now, before)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The child's descriptors (socket, memfds, eventfds, TCP) are closed
	// within the second too (the last a moment after the counts: the
	// goroutines of its QP close their socket as they end), and so is
	// the server EP's connection to it.
	for {
		fds := openFDs(t)
		if fds <= fdsBefore {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d descriptors open, %d before the child", fds, fdsBefore)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// rawSession speaks the control protocol directly, as a hostile client.
func rawSession(t *testing.T, sock string) *net.UnixConn {
	c, err := net.Dial("unixpacket", sock)
	must(t, err)
	t.Cleanup(func() { c.Close() })
	return c.(*net.UnixConn)
}

func rawCall(c *net.UnixConn, op ctl.Op, body any) (ctl.Status, error) {
	msg, err := ctl.Marshal(ctl.Header{Op: op, ID: 1}, body)
	if err != nil {
		return 0, err
	}
	if _, err := c.Write(msg); err != nil {
		return 0, err
	}
	buf := make([]byte, ctl.MaxMessage)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, _, _, _, err := c.ReadMsgUnix(buf, make([]byte, 256))
	if err != nil {
		return 0, err
	}
	h, _, err := ctl.ParseHeader(buf[:n])
	return h.Status, err
}

func TestHandlesAreSessionLocal(t *testing.T) {
	sock, _ := startDaemon(t)
	a := newApp(t, sock, "a")
	ep := a.ep(t)
	c := rawSession(t, sock)
	if st, err := rawCall(c, ctl.OpHello, &ctl.Hello{Client: "intruder"}); err != nil || st != ctl.Success {
		t.Fatalf("hello: %v %v", st, err)
	}
	for _, op := range []ctl.Op{ctl.OpFreeEP, ctl.OpQueryEP, ctl.OpResetEP} {
		if st, err := rawCall(c, op, &ctl.Handle{H: ep.Handle()}); err != nil || st != ctl.InvalidHandle {
			t.Fatalf("%v on another session's EP: %v %v", op, st, err)
		}
	}
	if st, err := rawCall(c, ctl.OpConnect, &ctl.Connect{EP: ep.Handle(), Addr: "127.0.0.1:1", TimeoutUS: 1}); err != nil || st != ctl.InvalidHandle {
		t.Fatalf("connect another session's EP: %v %v", st, err)
	}
	if s := state(t, ep); s != client.Unconnected {
		t.Fatalf("the owner's EP: %v", s)
	}
}

func TestGarbageOnTheControlSocket(t *testing.T) {
	sock, srv := startDaemon(t)
	a := newApp(t, sock, "a")
	r := rand.New(rand.NewPCG(3, 4))
	good, _ := ctl.Marshal(ctl.Header{Op: ctl.OpCreatePZ, ID: 1}, &ctl.Connect{EP: 1, Addr: "127.0.0.1:9", PrivateData: []byte("x")})
	for i := 0; i < 300; i++ {
		c, err := net.Dial("unixpacket", sock)
		must(t, err)
		var msg []byte
		switch i % 3 {
		case 0:
			msg = make([]byte, r.IntN(200))
			for j := range msg {
				msg[j] = byte(r.Uint32())
			}
		case 1:
			msg = good[:r.IntN(len(good))]
		default:
			msg = append([]byte(nil), good...)
			msg[r.IntN(len(msg))] ^= byte(1 + r.IntN(255))
		}
		_, _ = c.Write(msg)
		// Either an error reply or a closed session; never a hang.
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, ctl.MaxMessage)
		n, err := c.Read(buf)
		if err == nil && n > 0 {
			if _, _, perr := ctl.ParseHeader(buf[:n]); perr != nil {
				t.Fatalf("message %d: unparseable reply", i)
			}
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("message %d (%x): no answer and no close", i, msg)
		}
		c.Close()
	}
	// The daemon still serves.
	if _, err := a.ia.CreatePZ(); err != nil {
		t.Fatalf("after garbage: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for srv.Counts()["sessions"] != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("sessions left over: %v", srv.Counts())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// When the daemon goes away (here it stops; a SIGKILL looks the same from
// the socket), an application sleeping in Wait wakes with ErrDaemonGone
// instead of sleeping forever, and Dequeue says so too.
func TestDaemonGoneWakesWaiters(t *testing.T) {
	sock, srv := startDaemon(t)
	ia, err := client.Open(context.Background(), client.Options{Socket: sock, Name: "gone"})
	if err != nil {
		t.Fatal(err)
	}
	defer ia.Close()
	evd, err := ia.CreateEVD(client.EVDOptions{Depth: 16, Kind: client.DTOEvents})
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := evd.Wait(context.Background())
		waited <- err
	}()
	time.Sleep(50 * time.Millisecond)
	srv.Close() // startDaemon's cleanup closes it again, which is harmless
	select {
	case err := <-waited:
		if !errors.Is(err, client.ErrDaemonGone) {
			t.Fatalf("Wait: %v, want ErrDaemonGone", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait still sleeps after the daemon went away")
	}
	if _, ok, err := evd.Dequeue(); ok || !errors.Is(err, client.ErrDaemonGone) {
		t.Fatalf("Dequeue: %v %v", ok, err)
	}
	if !ia.Gone() {
		t.Fatal("Gone is false")
	}
}
