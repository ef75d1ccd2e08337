package xdpnet

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/tcp"
)

// ResourceError is err wrapped with ErrResources and the limit it names if
// a limit of the host caused it (see resourceErr), err itself otherwise:
// for callers that make their own sockets (rnic's kernel datapath).
func ResourceError(err error) error { return resourceErr(err) }

// resourceErr is err wrapped with ErrResources and the limit it names, if
// it is what the kernel says at one: the operator reads which limit to
// raise, and callers (rnic, the daemon) tell a shortage here from a peer's
// answer with errors.Is. Other errors come back as they are.
func resourceErr(err error) error {
	switch {
	case err == nil || errors.Is(err, ErrResources):
		return err
	case errors.Is(err, unix.EMFILE):
		var rl unix.Rlimit
		if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil {
			return fmt.Errorf("%w: the process's descriptor limit (RLIMIT_NOFILE %d; systemd LimitNOFILE=): %w",
				ErrResources, rl.Cur, err)
		}
		return fmt.Errorf("%w: the process's descriptor limit (RLIMIT_NOFILE): %w", ErrResources, err)
	case errors.Is(err, unix.ENFILE):
		return fmt.Errorf("%w: the system's descriptor limit (fs.file-max%s): %w", ErrResources, sysctl("fs/file-max"), err)
	case errors.Is(err, unix.E2BIG):
		// A full BPF hash map refuses a new key with E2BIG.
		return fmt.Errorf("%w: the steering program's flow table is full: %w", ErrResources, err)
	case errors.Is(err, unix.ENOMEM), errors.Is(err, unix.ENOBUFS):
		return fmt.Errorf("%w: kernel memory: %w", ErrResources, err)
	}
	return err
}

// PortsError is the error of a connection that found no local port free
// (err is what the kernel said): it wraps ErrResources and names the
// range to widen.
func PortsError(err error) error { return portsErr(err) }

// portsErr is the error of a reservation that found no local port free.
func portsErr(err error) error {
	return fmt.Errorf("%w: no local port left (net.ipv4.ip_local_port_range%s): %w",
		ErrResources, sysctl("net/ipv4/ip_local_port_range"), err)
}

// sysctl is " " and the value of a setting under /proc/sys, for messages;
// "" if it cannot be read (in the namespace of the calling thread).
func sysctl(name string) string {
	b, err := os.ReadFile("/proc/sys/" + name)
	if err != nil {
		return ""
	}
	return " " + strings.Join(strings.Fields(string(b)), "-")
}

// limitWarnEvery spaces the warnings about limits a peer's connection ran
// into (no error goes back to anyone there): one per interval, with the
// number since the last.
const limitWarnEvery = 10 * time.Second

// warnLimit tells Config.Warn that a peer's connection was dropped for a
// limit of the host (err names it); on the loop.
func (p *Poller) warnLimit(now tcp.Time, what func() (string, error)) {
	p.limitDrops++
	if p.cfg.Warn == nil || (p.limitWarned != 0 && now-p.limitWarned < tcp.Time(limitWarnEvery)) {
		return
	}
	msg, err := what()
	p.cfg.Warn(fmt.Sprintf("%s queue %d: %s (%d since the last warning): %v", p.cfg.Interface, p.cfg.Queue, msg, p.limitDrops, err))
	p.limitWarned, p.limitDrops = now, 0
}
