package scale

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/softrnic/softrnic/internal/topology"
)

// The processes the orchestrator starts: two daemons and two client
// processes, each run in its host's namespace under prlimit, so that it
// has the descriptor limit a systemd service would give it rather than
// this shell's. `ip netns exec` and prlimit both exec what they run: the
// PID the orchestrator holds is the daemon's or the client's own, which
// is what /proc is read for.

// daemon is a running softrnicd.
type daemon struct {
	cmd    *exec.Cmd
	sock   string
	log    string
	exited chan struct{} // closed once cmd.Wait returned
	err    error         // cmd.Wait's, once exited is closed
}

// startDaemon starts softrnicd on h with the datapath, its xdp poller on
// cpu, and its warnings in logPath, under the guard's watch, and waits
// until it answers on sock.
func startDaemon(g *memGuard, h topology.Host, bin, datapath, sock, cpu, nofile, logPath string) (*daemon, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := h.Command("prlimit", "--nofile="+nofile, "--", filepath.Join(bin, "softrnicd"), "--iface", h.Link,
		"--socket", sock, "--log-level", "warn", "--datapath", datapath, "--cpus", cpu)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start softrnicd on %s: %w", h.Namespace, err)
	}
	d := &daemon{cmd: cmd, sock: sock, log: logPath, exited: make(chan struct{})}
	g.watch(cmd.Process)
	go func() { d.err = cmd.Wait(); g.forget(cmd.Process); close(d.exited) }()
	// The socket file may be an earlier daemon's: wait until one answers.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		select {
		case <-d.exited:
			return nil, fmt.Errorf("softrnicd on %s exited at start: %v: %s", h.Namespace, d.err, tail(logPath))
		default:
		}
		if c, err := net.Dial("unixpacket", sock); err == nil {
			c.Close()
			return d, nil
		}
		if time.Now().After(deadline) {
			d.kill()
			return nil, fmt.Errorf("softrnicd on %s never answered on %s: %s", h.Namespace, sock, tail(logPath))
		}
	}
}

func (d *daemon) pid() int { return d.cmd.Process.Pid }

// kill ends the daemon, if it still runs, and waits for it.
func (d *daemon) kill() {
	_ = d.cmd.Process.Kill()
	<-d.exited
}

// terminate sends SIGTERM and waits up to limit for the daemon to exit;
// past it the daemon is killed. It returns how long the daemon took and
// whether it exited by itself.
func (d *daemon) terminate(limit time.Duration) (time.Duration, bool) {
	t0 := time.Now()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		d.kill()
		return 0, false
	}
	select {
	case <-d.exited:
		return time.Since(t0), true
	case <-time.After(limit):
		d.kill()
		return time.Since(t0), false
	}
}

// tail is the end of a log file, for an error message.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// logLine is a slog text line's level and message.
var logLine = regexp.MustCompile(`level=(\w+) msg=("(?:[^"\\]|\\.)*"|\S+)`)

// logSummary is the distinct warnings and errors in a daemon's log, most
// frequent first, each with its count and first occurrence: a daemon
// failing at a limit says so there (or, as the issue found, does not).
func logSummary(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return []string{err.Error()}
	}
	defer f.Close()
	type entry struct {
		n     int
		first string
	}
	seen := map[string]*entry{}
	var order []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		key := line
		if m := logLine.FindStringSubmatch(line); m != nil {
			key = m[1] + " " + m[2]
		}
		if e := seen[key]; e != nil {
			e.n++
			continue
		}
		if len(line) > 300 {
			line = line[:300] + "…"
		}
		seen[key] = &entry{n: 1, first: line}
		order = append(order, key)
		if len(order) >= 64 {
			break
		}
	}
	slices.SortStableFunc(order, func(a, b string) int { return seen[b].n - seen[a].n })
	var out []string
	for _, k := range order[:min(len(order), 8)] {
		out = append(out, fmt.Sprintf("%d× %s", seen[k].n, seen[k].first))
	}
	return out
}

// clientProc is a running client process (client.go) and the
// orchestrator's end of its pipes.
type clientProc struct {
	role  string
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan []byte   // its answers, closed when its output ends
	done  chan struct{} // closed by stop: the reader gives up a line it cannot hand over
	log   string
	// broken is set once an answer did not come in time: the next line
	// would be that answer, not the next command's.
	broken error
}

// startClient starts a client process on h and reads its ready line.
func startClient(h topology.Host, bin, nofile, logPath string, o ClientOptions) (*clientProc, Ready, error) {
	args := []string{"--nofile=" + nofile, "--", filepath.Join(bin, "softrnic-scale"), "client", "--role", o.Role, "--socket", o.Socket}
	switch o.Role {
	case Active:
		args = append(args, "--peer", o.Peer, "--connect-timeout", o.ConnectTimeout.String())
	case Passive:
		args = append(args, "--port", fmt.Sprint(o.Port), "--data-size", fmt.Sprint(o.DataSize))
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, Ready{}, err
	}
	defer logf.Close()
	cmd := h.Command("prlimit", args...)
	cmd.Stderr = logf
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, Ready{}, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, Ready{}, err
	}
	cmd.Stdout = w
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		return nil, Ready{}, fmt.Errorf("start the %s client: %w", o.Role, err)
	}
	c := &clientProc{role: o.Role, cmd: cmd, in: in, lines: make(chan []byte), done: make(chan struct{}), log: logPath}
	go c.read(r)
	var ready Ready
	if err := c.recv(30*time.Second, &ready); err != nil || !ready.Ready {
		c.stop()
		return nil, Ready{}, fmt.Errorf("the %s client did not get ready: %v: %s", o.Role, err, tail(logPath))
	}
	return c, ready, nil
}

// read hands each line of the process's output to lines until it ends or
// stop gives up on it.
func (c *clientProc) read(r *os.File) {
	defer close(c.lines)
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := slices.Clone(sc.Bytes())
		select {
		case c.lines <- line:
		case <-c.done:
			return
		}
	}
}

func (c *clientProc) pid() int { return c.cmd.Process.Pid }

// send writes one command.
func (c *clientProc) send(command string) error {
	if c.broken != nil {
		return c.broken
	}
	if _, err := io.WriteString(c.in, command+"\n"); err != nil {
		return fmt.Errorf("%s client: %s: %w: %s", c.role, command, err, tail(c.log))
	}
	return nil
}

// recv reads the next answer into reply, waiting up to d.
func (c *clientProc) recv(d time.Duration, reply any) error {
	if c.broken != nil {
		return c.broken
	}
	select {
	case line, ok := <-c.lines:
		if !ok {
			c.broken = fmt.Errorf("%s client exited: %s", c.role, tail(c.log))
			return c.broken
		}
		var ce commandError
		if err := json.Unmarshal(line, &ce); err == nil && ce.Err != "" {
			return fmt.Errorf("%s client: %s", c.role, ce.Err)
		}
		if err := json.Unmarshal(line, reply); err != nil {
			return fmt.Errorf("%s client: answer %q: %w", c.role, line, err)
		}
		return nil
	case <-time.After(d):
		c.broken = fmt.Errorf("%s client: no answer within %v: %s", c.role, d, tail(c.log))
		return c.broken
	}
}

// call sends a command and reads its answer.
func (c *clientProc) call(d time.Duration, reply any, command string) error {
	if err := c.send(command); err != nil {
		return err
	}
	return c.recv(d, reply)
}

// stop asks the process to quit, kills it if it has not within 10 s (a
// client whose daemon is gone may be stuck in a request), and waits for
// it and its reader.
func (c *clientProc) stop() {
	var ack struct{}
	if c.call(10*time.Second, &ack, "quit") != nil {
		_ = c.cmd.Process.Kill()
	}
	c.in.Close()
	close(c.done)
	waited := make(chan error, 1)
	go func() { waited <- c.cmd.Wait() }()
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-waited
	}
	for range c.lines {
	}
}
