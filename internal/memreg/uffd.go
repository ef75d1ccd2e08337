package memreg

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A page that holds other objects of the process besides the range being
// registered (the first and last pages of a malloc'ed buffer hold its
// neighbours) may be written by another thread while it moves. Copying it
// and then mapping the memfd over it would lose such a write. Instead the
// page's writers are made to wait for the few microseconds of the move,
// with a userfaultfd (linux/userfaultfd.h):
//
//  1. the page is registered for missing-page faults;
//  2. mremap(MREMAP_DONTUNMAP) takes its contents away, atomically,
//     leaving the address mapped but empty: from here any access to it
//     blocks in the kernel on the userfaultfd (which nobody reads);
//  3. the contents go into the memfd and the memfd is mapped over the
//     page;
//  4. UFFDIO_WAKE lets the blocked accesses retry: they find the memfd's
//     page, with the contents and every write made before step 2.
//
// Without a userfaultfd (a kernel or seccomp policy without it) the page
// moves by copy and remap, and the package comment's caveat applies.

// linux/userfaultfd.h
const (
	uffdAPI             = 0xaa
	uffdUserModeOnly    = 1
	uffdRegisterMissing = 1
	ioctlUffdAPI        = 3<<30 | 24<<16 | 0xaa<<8 | 0x3f // _IOWR(0xAA, 0x3F, struct uffdio_api)
	ioctlUffdRegister   = 3<<30 | 32<<16 | 0xaa<<8        // _IOWR(0xAA, 0x00, struct uffdio_register)
	ioctlUffdUnregister = 2<<30 | 16<<16 | 0xaa<<8 | 0x01 // _IOR(0xAA, 0x01, struct uffdio_range)
	ioctlUffdWake       = 2<<30 | 16<<16 | 0xaa<<8 | 0x02 // _IOR(0xAA, 0x02, struct uffdio_range)
)

type uffdioAPI struct{ api, features, ioctls uint64 }
type uffdioRange struct{ start, len uint64 }
type uffdioRegister struct {
	rng          uffdioRange
	mode, ioctls uint64
}

// openUffd returns a userfaultfd, or -1 if this process may have none. A
// privileged one also holds the kernel's own accesses (another thread's
// read(2) into the page) until the move is done; a user-mode-only one,
// which any process may have, makes those fail with EFAULT instead.
func openUffd() int {
	for _, flags := range []uintptr{unix.O_CLOEXEC | unix.O_NONBLOCK, unix.O_CLOEXEC | unix.O_NONBLOCK | uffdUserModeOnly} {
		fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, flags, 0, 0)
		if errno != 0 {
			continue
		}
		api := uffdioAPI{api: uffdAPI}
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, ioctlUffdAPI, uintptr(unsafe.Pointer(&api))); errno != 0 {
			unix.Close(int(fd))
			continue
		}
		return int(fd)
	}
	return -1
}

// moveInHeld is moveIn with the page's accesses held meanwhile by the
// Space's Mover (HoldNeighbours); it falls back to moveIn where there is
// none or it cannot hold them. s.mu held.
func (s *Space) moveInHeld(start, end uintptr, prot int) error {
	if s.uffd < 0 || s.mover == nil {
		return s.moveIn(start, end, prot)
	}
	held, err := s.mover(s.uffd, int(s.file.Fd()), start, end, prot)
	if !held && err == nil {
		return s.moveIn(start, end, prot) // not anonymous memory: no holding
	}
	if err != nil {
		return fmt.Errorf("memreg: move %#x-%#x: %w", start, end, err)
	}
	return nil
}
