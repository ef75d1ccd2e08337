package bpf

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// Errors returned by Attach, testable with errors.Is. The kernel's own error
// (an errno) is wrapped beside them.
var (
	// ErrNoInterface: the interface named in Options does not exist in the
	// network namespace of the calling thread.
	ErrNoInterface = errors.New("no such interface")
	// ErrPermission: loading or attaching needs root (CAP_BPF, CAP_NET_ADMIN
	// and, on old kernels, CAP_SYS_RESOURCE for the memlock limit).
	ErrPermission = errors.New("permission denied: loading XDP needs root (CAP_BPF and CAP_NET_ADMIN)")
	// ErrModeNotSupported: the interface refused the requested XDP mode.
	ErrModeNotSupported = errors.New("XDP mode not supported")
	// ErrClosed: the Steering has been closed.
	ErrClosed = errors.New("steering closed")
)

// Mode is how the program is attached to the interface.
type Mode int

const (
	// ModeAuto tries ModeNative and falls back to ModeGeneric.
	ModeAuto Mode = iota
	// ModeNative runs the program in the driver, before an skb exists
	// (XDP_FLAGS_DRV_MODE). On veth it needs the peer's MTU ≤ 3506.
	ModeNative
	// ModeGeneric runs the program on the skb in the core receive path
	// (XDP_FLAGS_SKB_MODE); every driver supports it, at a cost.
	ModeGeneric
)

// String returns "auto", "native" or "generic".
func (m Mode) String() string {
	switch m {
	case ModeAuto:
		return "auto"
	case ModeNative:
		return "native"
	case ModeGeneric:
		return "generic"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Options say where and how to attach the program.
type Options struct {
	// Interface is the name of the interface to attach to, looked up in
	// the network namespace of the calling OS thread. Takes precedence
	// over Ifindex.
	Interface string
	// Ifindex is the index of the interface, used when Interface is empty.
	// Like the name, it is resolved in the calling thread's namespace.
	Ifindex int
	// Mode picks native or generic XDP; the zero value is ModeAuto.
	Mode Mode
}

// Steering is the steering program attached to one interface, with the maps
// the daemon fills. Its methods are safe for concurrent use. The program
// stays attached until Close, or until the process exits.
type Steering struct {
	objs    steerObjects
	link    link.Link
	mode    Mode
	ifindex int
	ifname  string

	mu     sync.Mutex // guards closed against Close racing the map methods
	closed bool
}

// Attach loads the steering program and its maps and attaches it to the
// interface with a BPF link. Call it on an OS thread in the interface's
// network namespace (runtime.LockOSThread plus setns, or the process's own
// namespace); the maps and the link may then be used from any goroutine.
func Attach(opts Options) (*Steering, error) {
	ifindex, ifname, err := resolve(opts)
	if err != nil {
		return nil, fmt.Errorf("bpf: attach: %w", err)
	}
	switch opts.Mode {
	case ModeAuto, ModeNative, ModeGeneric:
	default:
		return nil, fmt.Errorf("bpf: attach to %s: invalid mode %v", ifname, opts.Mode)
	}

	s, err := load(ifindex, ifname)
	if err != nil {
		return nil, err
	}
	switch opts.Mode {
	case ModeNative, ModeGeneric:
		err = s.attach(opts.Mode)
	case ModeAuto:
		err = s.attach(ModeNative)
		if err != nil && !errors.Is(err, ErrPermission) && !errors.Is(err, ErrNoInterface) {
			if gerr := s.attach(ModeGeneric); gerr != nil {
				err = errors.Join(err, gerr)
			} else {
				err = nil
			}
		}
	}
	if err != nil {
		s.objs.Close()
		return nil, err
	}
	return s, nil
}

// load loads the program and its maps into the kernel, not yet attached.
func load(ifindex int, ifname string) (*Steering, error) {
	// A no-op on kernels that account BPF memory to the cgroup (5.11+).
	// It fails without privileges too; then loading says why, and the
	// memlock error only joins in if loading fails.
	memlockErr := rlimit.RemoveMemlock()
	s := &Steering{ifindex: ifindex, ifname: ifname}
	if err := loadSteerObjects(&s.objs, nil); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			// The full log says which instruction the verifier refused.
			return nil, fmt.Errorf("bpf: load steering program: %+v", verr)
		}
		if memlockErr != nil {
			err = fmt.Errorf("%w (and raising RLIMIT_MEMLOCK: %w)", err, memlockErr)
		}
		return nil, fmt.Errorf("bpf: load steering program: %w", permission(err))
	}
	return s, nil
}

// attach links the loaded program to the interface in one mode.
func (s *Steering) attach(m Mode) error {
	flags := link.XDPDriverMode
	if m == ModeGeneric {
		flags = link.XDPGenericMode
	}
	l, err := link.AttachXDP(link.XDPOptions{
		Program:   s.objs.XdpSteer,
		Interface: s.ifindex,
		Flags:     flags,
	})
	if err != nil {
		return fmt.Errorf("bpf: attach XDP to %s (%v mode): %w", s.ifname, m, classify(err))
	}
	s.link, s.mode = l, m
	return nil
}

// resolve turns Options into an interface index and a name for messages.
func resolve(opts Options) (int, string, error) {
	if opts.Interface != "" {
		ifi, err := net.InterfaceByName(opts.Interface)
		if err != nil {
			return 0, "", fmt.Errorf("%w: %q: %w", ErrNoInterface, opts.Interface, err)
		}
		return ifi.Index, ifi.Name, nil
	}
	if opts.Ifindex <= 0 {
		return 0, "", fmt.Errorf("%w: neither Interface nor Ifindex given", ErrNoInterface)
	}
	ifi, err := net.InterfaceByIndex(opts.Ifindex)
	if err != nil {
		return 0, "", fmt.Errorf("%w: index %d: %w", ErrNoInterface, opts.Ifindex, err)
	}
	return ifi.Index, ifi.Name, nil
}

// permission marks EPERM/EACCES errors with ErrPermission.
func permission(err error) error {
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) || errors.Is(err, os.ErrPermission) {
		return fmt.Errorf("%w: %w", ErrPermission, err)
	}
	return err
}

// classify marks an attach error with the sentinel it stands for and, where
// the kernel's reason is known to hide behind a bare errno (BPF links get no
// netlink extended ack), says it in words.
func classify(err error) error {
	switch {
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return fmt.Errorf("%w: %w", ErrPermission, err)
	case errors.Is(err, unix.ENODEV):
		return fmt.Errorf("%w: %w", ErrNoInterface, err)
	case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOTSUP):
		return fmt.Errorf("%w (the driver has no such XDP mode): %w", ErrModeNotSupported, err)
	case errors.Is(err, unix.ERANGE):
		return fmt.Errorf("%w (MTU too large for native XDP; on veth the peer's MTU must be ≤ 3506): %w",
			ErrModeNotSupported, err)
	case errors.Is(err, unix.EBUSY), errors.Is(err, unix.EEXIST):
		return fmt.Errorf("another XDP program is attached to the interface: %w", err)
	}
	return err
}

// Mode reports the mode the program is attached in: ModeNative or
// ModeGeneric, never ModeAuto.
func (s *Steering) Mode() Mode { return s.mode }

// Close detaches the program and releases the maps; AF_XDP sockets placed
// with SetSocket stay open (they belong to the caller). Frames in flight
// finish in the kernel stack. Close is safe to call twice.
func (s *Steering) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var errs []error
	if s.link != nil {
		if err := s.link.Close(); err != nil {
			errs = append(errs, fmt.Errorf("detach XDP from %s: %w", s.ifname, err))
		}
	}
	if err := s.objs.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close maps: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bpf: close: %w", err)
	}
	return nil
}
