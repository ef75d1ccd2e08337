// Package fdpass passes open files over Unix sockets (SCM_RIGHTS), for the
// control channel between softrnicd and its clients.
package fdpass

import (
	"os"

	"golang.org/x/sys/unix"
)

// Rights returns the control message that passes files, or nil for none.
func Rights(files []*os.File) []byte {
	if len(files) == 0 {
		return nil
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	return unix.UnixRights(fds...)
}

// OOBSpace is the control buffer size for receiving up to n files.
func OOBSpace(n int) int { return unix.CmsgSpace(n * 4) }

// Parse returns the files a control message passed, close-on-exec.
// Malformed control data yields no files.
func Parse(oob []byte, name string) []*os.File {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var out []*os.File
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			unix.CloseOnExec(fd)
			out = append(out, os.NewFile(uintptr(fd), name))
		}
	}
	return out
}

// Sender is the credentials the kernel attached to a message received on
// a socket with SO_PASSCRED (SCM_CREDENTIALS: the sending process, its
// real user and group, in the receiver's namespaces), nil if none came.
func Sender(oob []byte) *unix.Ucred {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	for _, m := range msgs {
		if c, err := unix.ParseUnixCredentials(&m); err == nil {
			return c
		}
	}
	return nil
}
