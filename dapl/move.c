/*
 * A registered range's first or last page moves onto the registration
 * memfd with other threads' accesses to it held (internal/memreg/uffd.go
 * says how and why). In C: while the page is held, no Go code of this
 * thread runs, so a stop-the-world of the Go runtime (which would wait for
 * a consumer thread held inside one of our callbacks) never waits for us.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <linux/userfaultfd.h>
#include "srn.h"

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

/* srn_move_held returns 0 once [start, start+len) is the memfd's, -1 if
 * the page could not be held (the caller moves it plainly), or an errno
 * after putting the page back. */
int srn_move_held(int uffd, int memfd, uintptr_t start, uintptr_t len, int prot)
{
	struct uffdio_register reg = {.range = {.start = start, .len = len}, .mode = UFFDIO_REGISTER_MODE_MISSING};
	struct uffdio_range rng = {.start = start, .len = len};
	void *tmp;
	uintptr_t off;
	int err;

	if (ioctl(uffd, UFFDIO_REGISTER, &reg) != 0)
		return -1;
	/* glibc reads a new address for MREMAP_DONTUNMAP too: none, the
	 * kernel picks one. */
	tmp = mremap((void *)start, len, len, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, (void *)0);
	if (tmp == MAP_FAILED) {
		ioctl(uffd, UFFDIO_UNREGISTER, &rng);
		ioctl(uffd, UFFDIO_WAKE, &rng);
		return -1;
	}
	/* Held: nothing may fail without putting the contents back. */
	for (off = 0; off < len;) {
		ssize_t w = pwrite(memfd, (char *)tmp + off, len - off, (off_t)(start + off));
		if (w <= 0) {
			err = w < 0 ? errno : EIO;
			goto put_back;
		}
		off += (uintptr_t)w;
	}
	if (mmap((void *)start, len, prot, MAP_SHARED | MAP_FIXED, memfd, (off_t)start) == MAP_FAILED) {
		err = errno;
		goto put_back;
	}
	ioctl(uffd, UFFDIO_UNREGISTER, &rng);
	ioctl(uffd, UFFDIO_WAKE, &rng);
	munmap(tmp, len);
	return 0;
put_back:
	mremap(tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)start);
	ioctl(uffd, UFFDIO_UNREGISTER, &rng);
	ioctl(uffd, UFFDIO_WAKE, &rng);
	return err;
}
