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
	self := filepath.Join(dir, "helper")
	suid := filepath.Join(dir, "sleep")
	copyFile(t, os.Args[0], self, 0o755)
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	copyFile(t, sleep, suid, os.ModeSetuid|0o755)
	sock := filepath.Join(dir, "d.sock")
	srv, err := New(Options{Iface: "lo", Socket: sock, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, srv)
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	port := testenv.FreePrivilegedPort(t)
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), privHelper+"=parent", "SRN_SOCK="+sock, "SRN_SUID="+suid, "SRN_PORT="+strconv.Itoa(port))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	outFile, err := os.Create(filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer outFile.Close()
	cmd.Stdout, cmd.Stderr = outFile, outFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	defer func() { cmd.Process.Kill(); <-done }()
	out := func() string { b, _ := os.ReadFile(outFile.Name()); return string(b) }
	deadline := time.After(60 * time.Second)
	for !strings.Contains(out(), "child: ") {
		select {
		case <-deadline:
			t.Fatalf("no answer from the child in 60 s:\n%s", out())
		case <-time.After(20 * time.Millisecond):
		}
	}
	got := out()
	if !strings.Contains(got, "child: after exec: "+ctl.ProtectionViolation.String()) {
		t.Fatalf("an unprivileged process's child asked for privileged port %d after the process exec'd a set-user-ID program:\n%s", port, got)
	}
}

// exeOf says a set-user-ID program is one whose exec may have given the
// capabilities /proc shows, and a plain one is not.
func TestExeOfSetUserID(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	suid := filepath.Join(dir, "sleep")
	copyFile(t, sleep, suid, os.ModeSetuid|0o755)
	for _, c := range []struct {
		prog string
		want bool
	}{{sleep, false}, {suid, true}} {
		cmd := exec.Command(c.prog, "30")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		e, err := exeOf(fmt.Sprintf("/proc/%d", cmd.Process.Pid))
		cmd.Process.Kill()
		cmd.Wait()
		if err != nil || e.privileged != c.want {
			t.Errorf("%s: privileged %v (%v), want %v", c.prog, e.privileged, err, c.want)
		}
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
		port, _ := strconv.Atoi(os.Getenv("SRN_PORT"))
		st, err := rawCall(c, ctl.OpReservePort, &ctl.ReservePort{Port: uint16(port)})
		if err != nil {
			fail(err)
		}
		fmt.Printf("child: after exec: %v\n", st)
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
