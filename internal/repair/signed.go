package repair

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Segments signed with TCP-MD5 (RFC 2385) or TCP-AO (RFC 5925) carry an
// option the engine cannot compute: such a connection cannot be taken
// over. Neither has a getsockopt that tells (TCP_MD5SIG is set-only):
// TCP-AO answers TCP_AO_INFO, and TCP-MD5 keys show in sock_diag's
// INET_DIAG_MD5SIG, which the kernel gives a CAP_NET_ADMIN requester in
// the socket's own network namespace.

// Linux constants the installed headers may predate.
const (
	tcpAOInfo        = 40 // TCP_AO_INFO (Linux 6.7)
	inetDiagInfo     = 2  // INET_DIAG_INFO
	inetDiagMD5Sig   = 18 // INET_DIAG_MD5SIG
	inetDiagReqLen   = 56 // struct inet_diag_req_v2
	inetDiagMsgLen   = 72 // struct inet_diag_msg
	inetDiagNoCookie = ^uint32(0)
)

// signed says whether the connection on fd signs its segments, and with
// what.
func signed(fd int) (string, error) {
	var ao [48]byte // struct tcp_ao_info_opt
	l := uint32(len(ao))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, tcpAOInfo,
		uintptr(unsafe.Pointer(&ao[0])), uintptr(unsafe.Pointer(&l)), 0)
	if e == 0 {
		return "TCP-AO", nil
	}
	md5, err := hasMD5Keys(fd)
	if err != nil {
		return "", err
	}
	if md5 {
		return "TCP-MD5", nil
	}
	return "", nil
}

// hasMD5Keys asks sock_diag, in the socket's namespace, for the
// connection's entry and looks for INET_DIAG_MD5SIG in it.
func hasMD5Keys(fd int) (bool, error) {
	local, err := unix.Getsockname(fd)
	if err != nil {
		return false, err
	}
	peer, err := unix.Getpeername(fd)
	if err != nil {
		return false, err
	}
	l4, ok1 := local.(*unix.SockaddrInet4)
	p4, ok2 := peer.(*unix.SockaddrInet4)
	if !ok1 || !ok2 {
		return false, errors.New("not IPv4")
	}
	nl, err := diagSocketFor(fd)
	if err != nil {
		return false, fmt.Errorf("sock_diag: %w", err)
	}
	defer unix.Close(nl)

	req := make([]byte, unix.SizeofNlMsghdr+inetDiagReqLen)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST)
	r := req[unix.SizeofNlMsghdr:]
	// The auxiliary attributes (INET_DIAG_MD5SIG among them) come with
	// INET_DIAG_INFO's.
	r[0], r[1], r[2] = unix.AF_INET, unix.IPPROTO_TCP, 1<<(inetDiagInfo-1)
	ne.PutUint32(r[4:], ^uint32(0)) // every state
	id := r[8:]
	binary.BigEndian.PutUint16(id[0:], uint16(l4.Port))
	binary.BigEndian.PutUint16(id[2:], uint16(p4.Port))
	copy(id[4:8], l4.Addr[:])
	copy(id[20:24], p4.Addr[:])
	ne.PutUint32(id[40:], inetDiagNoCookie)
	ne.PutUint32(id[44:], inetDiagNoCookie)
	if err := unix.Sendto(nl, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return false, fmt.Errorf("sock_diag: %w", err)
	}
	buf := make([]byte, 16<<10)
	n, _, err := unix.Recvfrom(nl, buf, 0)
	if err != nil {
		return false, fmt.Errorf("sock_diag: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return false, fmt.Errorf("sock_diag: %w", err)
	}
	for _, m := range msgs {
		switch m.Header.Type {
		case unix.NLMSG_ERROR:
			if len(m.Data) >= 4 {
				if errno := int32(ne.Uint32(m.Data)); errno != 0 {
					return false, fmt.Errorf("sock_diag: %w", unix.Errno(-errno))
				}
			}
		case unix.SOCK_DIAG_BY_FAMILY:
			if len(m.Data) < inetDiagMsgLen {
				return false, errors.New("sock_diag: short answer")
			}
			for a := m.Data[inetDiagMsgLen:]; len(a) >= 4; {
				alen, atype := int(ne.Uint16(a)), ne.Uint16(a[2:])
				if alen < 4 || alen > len(a) {
					break
				}
				if atype == inetDiagMD5Sig {
					return true, nil
				}
				a = a[min(len(a), (alen+3)&^3):]
			}
			return false, nil
		}
	}
	return false, errors.New("sock_diag: no answer for the connection")
}

// diagSocketFor makes a sock_diag netlink socket in the network namespace
// of the socket fd (SIOCGSKNS): the daemon and a test may be elsewhere.
func diagSocketFor(fd int) (int, error) {
	nsfd, err := unix.IoctlRetInt(fd, unix.SIOCGSKNS)
	if err != nil {
		return -1, fmt.Errorf("SIOCGSKNS: %w", err)
	}
	defer unix.Close(nsfd)
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, err}
			return
		}
		defer self.Close()
		if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, fmt.Errorf("setns: %w", err)}
			return
		}
		nl, serr := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			// The thread stays locked and dies with the goroutine:
			// it must not run anything else in the other namespace.
			if serr == nil {
				unix.Close(nl)
			}
			done <- result{-1, fmt.Errorf("setns back: %w", err)}
			return
		}
		runtime.UnlockOSThread()
		done <- result{nl, serr}
	}()
	r := <-done
	return r.fd, r.err
}
