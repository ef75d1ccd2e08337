// Package capture records packets with tcpdump inside a test host's network
// namespace, for tests that check what went on the wire.
package capture

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/softrnic/softrnic/internal/topology"
)

// Capture is a running tcpdump.
type Capture struct {
	path   string
	cmd    *exec.Cmd
	done   chan error
	stderr *strings.Builder
}

// Start runs tcpdump on iface inside host, writing every packet that
// matches the BPF filter to path, and returns once tcpdump is listening.
func Start(host topology.Host, iface, filter, path string) (*Capture, error) {
	// A 32 MiB buffer: bursts on veth or lo must not be dropped by the
	// capture, which would look like data lost on the wire.
	args := []string{"-i", iface, "-B", "32768", "-w", path, "-U", "--immediate-mode", "-s", "0", "-n"}
	if filter != "" {
		args = append(args, filter)
	}
	cmd := host.Command("tcpdump", args...)
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("capture: start tcpdump: %w", err)
	}
	c := &Capture{path: path, cmd: cmd, done: make(chan error, 1), stderr: &strings.Builder{}}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(errPipe)
		signalled := false
		for sc.Scan() {
			line := sc.Text()
			c.stderr.WriteString(line + "\n")
			if !signalled && strings.Contains(line, "listening on") {
				close(ready)
				signalled = true
			}
		}
		_, _ = io.Copy(io.Discard, errPipe)
		c.done <- cmd.Wait()
	}()
	select {
	case <-ready:
		return c, nil
	case err := <-c.done:
		return nil, fmt.Errorf("capture: tcpdump exited: %v: %s", err, c.stderr.String())
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-c.done
		return nil, errors.New("capture: tcpdump not listening after 10 s")
	}
}

// Stop ends the capture once tcpdump has written every packet it saw, and
// fails if any packet the filter matched is missing from the file.
func (c *Capture) Stop() error {
	// tcpdump lags behind the wire on a busy machine, and packets still in
	// its ring when it is interrupted are lost: wait for the file to stop
	// growing first.
	last, stable := int64(-1), 0
	for deadline := time.Now().Add(10 * time.Second); stable < 5 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		st, err := os.Stat(c.path)
		if err == nil && st.Size() == last {
			stable++
		} else {
			stable = 0
		}
		if err == nil {
			last = st.Size()
		}
	}
	// ip netns exec execs tcpdump, so the signal reaches it directly.
	_ = c.cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-c.done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			return err
		}
		var captured, received int
		for _, line := range strings.Split(c.stderr.String(), "\n") {
			fmt.Sscanf(line, "%d packets captured", &captured)
			fmt.Sscanf(line, "%d packets received by filter", &received)
		}
		if captured < received {
			return fmt.Errorf("capture: tcpdump wrote %d of the %d packets it matched", captured, received)
		}
		return nil
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
		return errors.New("capture: tcpdump did not stop on SIGINT")
	}
}

// Report is what tcpdump printed, its packet counts at the end.
func (c *Capture) Report() string { return c.stderr.String() }
