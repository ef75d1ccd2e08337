package daemon

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/internal/testenv"
)

// privHelper is the environment variable that runs the test binary as one
// of the processes of TestPrivilegedPortNotThroughExec (privHelperMain).
const privHelper = "SOFTRNIC_DAEMON_PRIV_HELPER"

// A process that may not bind a privileged port does not get one from
// the daemon by executing a privileged program after it opened its
// session: the unprivileged process connects, hands the socket to a
// child, and execs a set-user-ID-root copy of sleep(1), whose capabilities
// /proc then shows under the session's PID; the child, still unprivileged,
// asks for the port. The old check read the capabilities of whatever the
// session's PID ran by then, and reserved it.
func TestPrivilegedPortNotThroughExec(t *testing.T) {
	dir, sock, port := privRig(t)
	self := filepath.Join(dir, "helper")
	suid := filepath.Join(dir, "sleep")
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	copyFile(t, sleep, suid, os.ModeSetuid|0o755)
	got := runPrivHelper(t, dir, self, "parent", "child: after exec: ", "SRN_SOCK="+sock, "SRN_SUID="+suid, "SRN_PORT="+strconv.Itoa(port))
	if !strings.Contains(got, "child: the parent runs as euid 0") {
		t.Fatalf("the set-user-ID program did not make the parent root (a nosuid mount?), so this tests nothing:\n%s", got)
	}
	if !strings.Contains(got, "child: after exec: "+ctl.ProtectionViolation.String()) {
		t.Fatalf("an unprivileged process's child asked for privileged port %d after the process exec'd a set-user-ID program:\n%s", port, got)
	}
}

// privRig is a daemon whose socket nobody can reach, in a directory of
// its own holding a copy of the test binary (helper), and a privileged
// port free now.
func privRig(t *testing.T) (dir, sock string, port int) {
	testenv.RequireRoot(t)
	dir, err := os.MkdirTemp("", "srn-priv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// nobody must reach the directory, the test binary and the socket.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, os.Args[0], filepath.Join(dir, "helper"), 0o755)
	sock = filepath.Join(dir, "d.sock")
	srv, err := New(Options{Iface: "lo", Socket: sock, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, srv)
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	return dir, sock, testenv.FreePrivilegedPort(t)
}

// runPrivHelper runs the helper binary in mode as nobody with env, and
// returns its processes' output once it holds done, within 60 s.
func runPrivHelper(t *testing.T, dir, self, mode, done string, env ...string) string {
	t.Helper()
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), privHelper+"="+mode), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	outFile, err := os.Create(filepath.Join(dir, "out-"+mode))
	if err != nil {
		t.Fatal(err)
	}
	defer outFile.Close()
	cmd.Stdout, cmd.Stderr = outFile, outFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	defer func() { cmd.Process.Kill(); <-exited }()
	out := func() string { b, _ := os.ReadFile(outFile.Name()); return string(b) }
	deadline := time.After(60 * time.Second)
	for !strings.Contains(out(), done) {
		select {
		case <-deadline:
			t.Fatalf("no answer from the helper in 60 s:\n%s", out())
		case <-exited:
			if !strings.Contains(out(), done) {
				t.Fatalf("the helper exited without an answer:\n%s", out())
			}
		case <-time.After(20 * time.Millisecond):
		}
	}
	return out()
}

// Nor by executing, itself, a set-user-ID program that becomes root and
// executes a plain one, which then sends the request: the session's own
// process sends it, running the same program before and after the
// daemon's look, with every capability, yet it connected as nobody.
// (The check that read the program's set-user-ID bit let it through.)
func TestPrivilegedPortNotThroughADoubleExec(t *testing.T) {
	dir, sock, port := privRig(t)
	self := filepath.Join(dir, "helper")
	wrap := filepath.Join(dir, "wrap")
	copyFile(t, os.Args[0], wrap, os.ModeSetuid|0o755)
	got := runPrivHelper(t, dir, self, "double", "sender: after double exec: ", "SRN_SOCK="+sock, "SRN_WRAP="+wrap, "SRN_SELF="+self,
		"SRN_PORT="+strconv.Itoa(port))
	if !strings.Contains(got, "sender: euid 0, CAP_NET_BIND_SERVICE true") {
		t.Fatalf("the set-user-ID wrapper did not make the sender root (a nosuid mount?), so this tests nothing:\n%s", got)
	}
	if !strings.Contains(got, "sender: after double exec: "+ctl.ProtectionViolation.String()) {
		t.Fatalf("a process that connected as nobody got privileged port %d after becoming root by a double exec:\n%s", port, got)
	}
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(to, mode); err != nil { // after the write: the set-user-ID bit
		t.Fatal(err)
	}
}

// privHelperMain is the test binary run as a helper: "parent" (as nobody)
// opens a session, starts "child" with the socket, and execs the
// set-user-ID program; the child waits for the exec, asks for the port,
// and prints the daemon's answer.
func privHelperMain(mode string) {
	fail := func(err error) { fmt.Printf("%s: %v\n", mode, err); os.Exit(1) }
	switch mode {
	case "parent":
		f := helloSession(fail)
		child := exec.Command(os.Args[0], "-test.run=^$")
		child.Env = append(os.Environ(), privHelper+"=child", fmt.Sprintf("SRN_PARENT=%d", os.Getpid()))
		child.ExtraFiles = []*os.File{f}
		child.Stdout, child.Stderr = os.Stdout, os.Stderr
		if err := child.Start(); err != nil {
			fail(err)
		}
		suid := os.Getenv("SRN_SUID")
		fail(syscall.Exec(suid, []string{"sleep", "60"}, os.Environ()))
	case "child":
		f := os.NewFile(3, "session")
		fc, err := net.FileConn(f)
		if err != nil {
			fail(err)
		}
		c := fc.(*net.UnixConn)
		// (Its exe link is root's to read once it runs the program.)
		comm := fmt.Sprintf("/proc/%s/comm", os.Getenv("SRN_PARENT"))
		for i := 0; ; i++ {
			if b, _ := os.ReadFile(comm); string(b) == "sleep\n" {
				break
			}
			if i == 3000 {
				fail(fmt.Errorf("the parent never exec'd %s", os.Getenv("SRN_SUID")))
			}
			time.Sleep(10 * time.Millisecond)
		}
		if status, err := os.ReadFile(fmt.Sprintf("/proc/%s/status", os.Getenv("SRN_PARENT"))); err == nil {
			if euid, ok := effectiveUID(string(status)); ok {
				fmt.Printf("child: the parent runs as euid %d\n", euid)
			}
		}
		port, _ := strconv.Atoi(os.Getenv("SRN_PORT"))
		st, err := rawCall(c, ctl.OpReservePort, &ctl.ReservePort{Port: uint16(port)})
		if err != nil {
			fail(err)
		}
		fmt.Printf("child: after exec: %v\n", st)
		os.Exit(0)
	case "double":
		// as nobody: a session, kept across the execs
		f := helloSession(fail)
		if _, err := unix.FcntlInt(f.Fd(), unix.F_SETFD, 0); err != nil {
			fail(err)
		}
		env := withEnv(os.Environ(), privHelper+"=wrap", fmt.Sprintf("SRN_FD=%d", f.Fd()))
		fail(syscall.Exec(os.Getenv("SRN_WRAP"), []string{"wrap", "-test.run=^$"}, env))
	case "wrap":
		// the set-user-ID copy: root for good, then a plain program
		if err := syscall.Setuid(0); err != nil {
			fail(err)
		}
		env := withEnv(os.Environ(), privHelper+"=sender")
		fail(syscall.Exec(os.Getenv("SRN_SELF"), []string{"sender", "-test.run=^$"}, env))
	case "sender":
		fd, _ := strconv.Atoi(os.Getenv("SRN_FD"))
		fc, err := net.FileConn(os.NewFile(uintptr(fd), "session"))
		if err != nil {
			fail(err)
		}
		status, _ := os.ReadFile("/proc/self/status")
		fmt.Printf("sender: euid %d, CAP_NET_BIND_SERVICE %v\n", os.Geteuid(), hasCapability(string(status), unix.CAP_NET_BIND_SERVICE))
		port, _ := strconv.Atoi(os.Getenv("SRN_PORT"))
		st, err := rawCall(fc.(*net.UnixConn), ctl.OpReservePort, &ctl.ReservePort{Port: uint16(port)})
		if err != nil {
			fail(err)
		}
		fmt.Printf("sender: after double exec: %v\n", st)
		os.Exit(0)
	}
	fail(fmt.Errorf("unknown helper mode"))
}

// rawCall sends one request on a session's socket and returns the status
// of its reply (the descriptors passed with it are closed).
func rawCall(c *net.UnixConn, op ctl.Op, req any) (ctl.Status, error) {
	msg, err := ctl.Marshal(ctl.Header{Op: op, ID: uint32(op)}, req)
	if err != nil {
		return 0, err
	}
	if _, _, err := c.WriteMsgUnix(msg, nil, nil); err != nil {
		return 0, err
	}
	buf, oob := make([]byte, ctl.MaxMessage), make([]byte, 256)
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, io.EOF
	}
	if msgs, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			fds, _ := syscall.ParseUnixRights(&m)
			for _, fd := range fds {
				syscall.Close(fd)
			}
		}
	}
	h, body, err := ctl.ParseHeader(buf[:n])
	if err == nil && h.Status != ctl.Success {
		var eb ctl.ErrorBody
		_ = ctl.Unmarshal(body, &eb)
		fmt.Fprintf(os.Stderr, "%v: %s\n", op, eb.Message)
	}
	return h.Status, err
}

// effectiveUID is the effective user of a /proc/PID/status.
func effectiveUID(status string) (int, bool) {
	for _, line := range strings.Split(status, "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "Uid:" {
			n, err := strconv.Atoi(f[2])
			return n, err == nil
		}
	}
	return 0, false
}

// withEnv is env with the variables set (syscall.Exec passes duplicates
// on, and the first one counts).
func withEnv(env []string, set ...string) []string {
	out := make([]string, 0, len(env)+len(set))
	for _, kv := range env {
		keep := true
		for _, s := range set {
			if k, _, _ := strings.Cut(s, "="); strings.HasPrefix(kv, k+"=") {
				keep = false
			}
		}
		if keep {
			out = append(out, kv)
		}
	}
	return append(out, set...)
}

// helloSession opens a session with the daemon at $SRN_SOCK (a Hello) and
// returns its socket as a file, to be kept across an exec.
func helloSession(fail func(error)) *os.File {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: os.Getenv("SRN_SOCK"), Net: "unixpacket"})
	if err != nil {
		fail(err)
	}
	if st, err := rawCall(c, ctl.OpHello, &ctl.Hello{Client: "priv"}); err != nil || st != ctl.Success {
		fail(fmt.Errorf("hello: %v %v", st, err))
	}
	f, err := c.File()
	if err != nil {
		fail(err)
	}
	return f
}
