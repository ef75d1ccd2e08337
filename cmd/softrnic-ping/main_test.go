package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/mpa"
)

// TestMain lets the test binary run as softrnic-ping.
func TestMain(m *testing.M) {
	if os.Getenv("SOFTRNIC_PING_MAIN") != "" {
		os.Args = append([]string{"softrnic-ping"}, strings.Fields(os.Getenv("SOFTRNIC_PING_ARGS"))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// pingCmd is softrnic-ping with args, killed if still running at ctx's end.
func pingCmd(ctx context.Context, args string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SOFTRNIC_PING_MAIN=1", "SOFTRNIC_PING_ARGS="+args)
	return cmd
}

// startDaemon runs a kernel-datapath daemon on loopback for the test; it
// returns the daemon and its socket.
func startDaemon(t *testing.T) (*daemon.Server, string) {
	sock := filepath.Join(t.TempDir(), "d.sock")
	d, err := daemon.New(daemon.Options{Iface: "lo", Socket: sock, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	go d.Serve()
	t.Cleanup(func() { d.Close() })
	return d, sock
}

// freePort is a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// output collects a process's output while it runs.
type output struct{ testenv.Buffer }

// waitFor reports whether the output has come to hold s within d.
func (o *output) waitFor(s string, d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if strings.Contains(o.String(), s) {
			return true
		}
	}
	return false
}

// server is a running softrnic-ping server.
type server struct {
	cmd    *exec.Cmd
	stderr *output
	exited chan error // Wait's result, once the process ends
}

// startServer starts a softrnic-ping server and returns once it listens.
// The server is killed when the test ends if still running.
func startServer(t *testing.T, args string) *server {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	s := &server{cmd: pingCmd(ctx, args), stderr: &output{}, exited: make(chan error, 1)}
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s.cmd.Stderr = s.stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.cmd.Process.Kill(); <-s.exited })
	listening := make(chan bool, 1)
	go func() {
		r := bufio.NewReader(out)
		line, _ := r.ReadString('\n')
		listening <- strings.Contains(line, "server listening")
		_, _ = io.Copy(io.Discard, r)
		s.exited <- s.cmd.Wait()
	}()
	select {
	case ok := <-listening:
		if !ok {
			t.Fatalf("server %q did not listen: %s", args, s.stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("server %q not listening after 30 s", args)
	}
	return s
}

// wait returns the server's exit, or fails the test if it runs on past d.
func (s *server) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case err := <-s.exited:
		s.exited <- err // for the cleanup
		return err
	case <-time.After(d):
		t.Fatalf("server still running after %v; stderr: %s", d, s.stderr)
		return nil
	}
}

// running fails the test if the server has exited.
func (s *server) running(t *testing.T, after string) {
	t.Helper()
	select {
	case err := <-s.exited:
		s.exited <- err
		t.Fatalf("server exited (%v) after %s; stderr: %s", err, after, s.stderr)
	default:
	}
}

// runClient runs a client of -C 3 validated pings and returns its error and
// output.
func runClient(t *testing.T, sock string, port int, extra string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := pingCmd(ctx, fmt.Sprintf("-c -a 127.0.0.1 -p %d -C 3 -V --timeout 30s --socket %s %s", port, sock, extra)).CombinedOutput()
	return string(out), err
}

// mpaRequest is a valid MPA Request, as an iWARP initiator opens with.
func mpaRequest(t *testing.T) []byte {
	f := mpa.Frame{Revision: 1, CRC: true}
	b, err := f.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rawClient connects to the server's port over plain TCP and runs do.
func rawClient(t *testing.T, port int, do func(c *net.TCPConn)) {
	c, err := net.DialTimeout("tcp4", fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	do(c.(*net.TCPConn))
}

// TestPersistentServerOutlivesFailedClients: a server with -P serves a
// proper client after each of several clients that fail at some point of
// the connection, and after a client that ends normally (whose
// DISCONNECTED must not be taken for the next client's accept); only the
// daemon's loss ends it.
func TestPersistentServerOutlivesFailedClients(t *testing.T) {
	d, sock := startDaemon(t)
	port := freePort(t)
	srv := startServer(t, fmt.Sprintf("-s -P -p %d --timeout 150s --socket %s", port, sock))

	for _, tc := range []struct {
		name string
		fail func(t *testing.T)
		// report is what the server must say on stderr, if anything.
		report string
	}{
		{"a client that ends normally", func(t *testing.T) {
			if out, err := runClient(t, sock, port, ""); err != nil {
				t.Fatalf("client: %v\n%s", err, out)
			}
		}, ""},
		{"not iWARP: an HTTP request", func(t *testing.T) {
			rawClient(t, port, func(c *net.TCPConn) {
				_, _ = c.Write([]byte("GET / HTTP/1.1\r\nHost: softrnic\r\n\r\n"))
				_, _ = io.Copy(io.Discard, c)
			})
		}, ""},
		{"half an MPA Request, then FIN", func(t *testing.T) {
			rawClient(t, port, func(c *net.TCPConn) {
				_, _ = c.Write(mpaRequest(t)[:10])
				_ = c.CloseWrite()
				_, _ = io.Copy(io.Discard, c)
			})
		}, ""},
		{"an MPA Request, then RST before the Reply", func(t *testing.T) {
			rawClient(t, port, func(c *net.TCPConn) {
				_, _ = c.Write(mpaRequest(t))
				_ = c.SetLinger(0)
			})
		}, ""},
		{"an MPA Request, then RST after the Reply", func(t *testing.T) {
			rawClient(t, port, func(c *net.TCPConn) {
				_, _ = c.Write(mpaRequest(t))
				_, _ = io.ReadFull(c, make([]byte, mpa.FrameHeaderLen))
				_ = c.SetLinger(0)
			})
		}, ""},
		{"a client whose buffer exceeds the server's", func(t *testing.T) {
			if out, err := runClient(t, sock, port, "-S 200"); err == nil {
				t.Fatalf("a client of -S 200 was served by a server of -S 64:\n%s", out)
			}
		}, "exceeds ours of 64 (-S); serving the next client"},
		{"a client killed mid-ping", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cl := pingCmd(ctx, fmt.Sprintf("-c -a 127.0.0.1 -p %d -C 0 -v --timeout 30s --socket %s", port, sock))
			out := &output{}
			cl.Stdout = out
			if err := cl.Start(); err != nil {
				t.Fatal(err)
			}
			if !out.waitFor("ping data", 30*time.Second) {
				t.Errorf("no ping in 30 s: %s", out)
			}
			_ = cl.Process.Kill()
			_ = cl.Wait()
		}, ""},
	} {
		ok := t.Run(tc.name, func(t *testing.T) {
			tc.fail(t)
			if out, err := runClient(t, sock, port, ""); err != nil {
				t.Fatalf("the next client: %v\n%s\nserver: %s", err, out, srv.stderr)
			}
			srv.running(t, tc.name)
			if tc.report != "" && !strings.Contains(srv.stderr.String(), tc.report) {
				t.Fatalf("server's stderr lacks %q: %s", tc.report, srv.stderr)
			}
		})
		if !ok {
			return // the cases after it would try a server that may be gone
		}
	}

	t.Logf("the server's reports:\n%s", srv.stderr)

	// The daemon's loss ends even a persistent server, with an error.
	d.Close()
	if err := srv.wait(t, 30*time.Second); err == nil || !strings.Contains(srv.stderr.String(), "went away") {
		t.Fatalf("server after the daemon's end: %v; stderr: %s", err, srv.stderr)
	}
}

// TestServerWithoutPersistent: without -P the server serves one client and
// ends: with success after a client that ends normally, with an error
// after one that fails.
func TestServerWithoutPersistent(t *testing.T) {
	_, sock := startDaemon(t)
	port := freePort(t)
	srv := startServer(t, fmt.Sprintf("-s -p %d --timeout 60s --socket %s", port, sock))
	if out, err := runClient(t, sock, port, ""); err != nil {
		t.Fatalf("client: %v\n%s", err, out)
	}
	if err := srv.wait(t, 30*time.Second); err != nil {
		t.Fatalf("server after a good client: %v; stderr: %s", err, srv.stderr)
	}

	port = freePort(t)
	srv = startServer(t, fmt.Sprintf("-s -p %d --timeout 60s --socket %s", port, sock))
	if out, err := runClient(t, sock, port, "-S 200"); err == nil {
		t.Fatalf("a client of -S 200 was served by a server of -S 64:\n%s", out)
	}
	if err := srv.wait(t, 30*time.Second); err == nil || !strings.Contains(srv.stderr.String(), "exceeds ours") {
		t.Fatalf("server after a failed client: %v; stderr: %s", err, srv.stderr)
	}
}

// readFrame reads one MPA startup frame (Request or Reply) from c.
func readFrame(t *testing.T, c net.Conn, reply bool) mpa.Frame {
	t.Helper()
	b := make([]byte, 0, 1024)
	buf := make([]byte, 1024)
	for {
		if n, err := mpa.FrameLen(b); err == nil && n > 0 && len(b) >= n {
			f, _, err := mpa.ParseFrame(b, reply)
			if err != nil {
				t.Fatalf("MPA frame: %v", err)
			}
			return f
		}
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("reading an MPA frame (%d octets so far): %v", len(b), err)
		}
		b = append(b, buf[:n]...)
	}
}

// The MPA options reach the wire: the client's Request carries the
// revision, the peer-to-peer bit and the RTR messages it offers (read here
// by a plain TCP listener), and the server's Reply the RTR it picks or,
// with none in common, those it accepts.
func TestMPAOptionsOnTheWire(t *testing.T) {
	_, sock := startDaemon(t)
	for _, c := range []struct {
		args    string
		rev     uint8
		p2p     bool
		offered mpa.RTR
	}{
		{"", 2, false, 0},
		{"--mpa-rev 1", 1, false, 0},
		{"--p2p", 2, true, mpa.RTRWrite | mpa.RTRRead},
		{"--p2p --rtr read", 2, true, mpa.RTRRead},
		{"--p2p --rtr write,send", 2, true, mpa.RTRWrite | mpa.RTRSend},
	} {
		t.Run("client "+c.args, func(t *testing.T) {
			l, err := net.Listen("tcp4", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			got := make(chan mpa.Frame, 1)
			go func() {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
				got <- readFrame(t, conn, false)
			}()
			out, err := runClient(t, sock, l.Addr().(*net.TCPAddr).Port, "-C 1 "+c.args)
			if err == nil {
				t.Fatalf("a client whose server never answered succeeded: %s", out)
			}
			select {
			case f := <-got:
				if f.Revision != c.rev || f.PeerToPeer != c.p2p || f.RTR != c.offered {
					t.Fatalf("Request revision %d, p2p %v, RTR %v; want %d, %v, %v", f.Revision, f.PeerToPeer, f.RTR, c.rev, c.p2p, c.offered)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("no MPA Request; client said %s", out)
			}
		})
	}
	for _, c := range []struct {
		args           string
		offered, reply mpa.RTR
	}{
		{"--p2p", mpa.RTRWrite | mpa.RTRRead, mpa.RTRWrite},
		{"--p2p --rtr read", mpa.RTRWrite | mpa.RTRRead, mpa.RTRRead},
		{"--p2p --rtr read", mpa.RTRWrite | mpa.RTRSend, mpa.RTRRead}, // none in common: what it accepts
		{"--p2p --rtr send,read", mpa.RTRSend, mpa.RTRSend},
	} {
		t.Run(fmt.Sprintf("server %s offered %v", c.args, c.offered), func(t *testing.T) {
			port := freePort(t)
			startServer(t, fmt.Sprintf("-s -a 127.0.0.1 -p %d -P --socket %s %s", port, sock, c.args))
			rawClient(t, port, func(conn *net.TCPConn) {
				req := mpa.Frame{Revision: 2, Enhanced: true, IRD: 1, ORD: 1, PeerToPeer: true, RTR: c.offered}
				b, err := req.Append(nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := conn.Write(b); err != nil {
					t.Fatal(err)
				}
				f := readFrame(t, conn, true)
				if !f.PeerToPeer || f.RTR != c.reply {
					t.Fatalf("Reply p2p %v, RTR %v; want p2p, RTR %v", f.PeerToPeer, f.RTR, c.reply)
				}
			})
		})
	}
}

// Two softrnic-pings agree on every MPA variant; a client offering only an
// RTR the server does not accept is refused with the Terminate it sent
// (RFC 6581 §9.2: no matching RTR), which it prints; bad options are
// usage errors.
func TestMPAOptionsBetweenPings(t *testing.T) {
	_, sock := startDaemon(t)
	for _, c := range []struct{ server, client string }{
		{"--mpa-rev 1", "--mpa-rev 1"},
		{"", "--mpa-rev 1"},
		{"--p2p", "--p2p"},
		{"--p2p --rtr read", "--p2p"},
		{"--p2p", "--p2p --rtr read"},
	} {
		t.Run(c.server+"/"+c.client, func(t *testing.T) {
			port := freePort(t)
			srv := startServer(t, fmt.Sprintf("-s -a 127.0.0.1 -p %d --socket %s %s", port, sock, c.server))
			if out, err := runClient(t, sock, port, c.client); err != nil {
				t.Fatalf("client: %v\n%s\nserver: %s", err, out, srv.stderr)
			}
			if err := srv.wait(t, 30*time.Second); err != nil {
				t.Fatalf("server: %v: %s", err, srv.stderr)
			}
		})
	}
	t.Run("no RTR in common", func(t *testing.T) {
		port := freePort(t)
		srv := startServer(t, fmt.Sprintf("-s -a 127.0.0.1 -p %d -P --socket %s --p2p --rtr write", port, sock))
		out, err := runClient(t, sock, port, "--p2p --rtr read")
		if err == nil || !strings.Contains(out, "connect: NON_PEER_REJECTED (Terminate: ") || !strings.Contains(out, "RTR") {
			t.Fatalf("want the refusal with its Terminate named, got %v: %s", err, out)
		}
		srv.running(t, "a refused client")
	})
	for _, args := range []string{"--p2p --mpa-rev 1", "--rtr write", "--p2p --rtr bogus", "--mpa-rev 3"} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := pingCmd(ctx, "-c -a 127.0.0.1 --socket "+sock+" "+args).CombinedOutput()
		cancel()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "usage:") {
			t.Errorf("%q: want a usage error (exit 2), got %v: %s", args, err, out)
		}
	}
}
