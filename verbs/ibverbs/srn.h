/*
 * softrnic's libibverbs.so.1: the verbs ABI of Debian's rdma-core over
 * softrnicd, with no kernel RDMA device (issue 22). Internal header.
 *
 * Exported symbols: a name the library exports in one version only, as
 * the default, is defined under its name with EXPORT; a name that also has
 * compat versions (verbs/abi: Versioned) is defined under another name and
 * bound to its node with SYMVER_DEFAULT, as rdma-core's util/symver.h
 * does. Every other symbol of the table is defined in stubs.c, which make
 * generate writes (verbs/abi/gen) for the names no source here defines.
 */
#ifndef SRN_VERBS_H
#define SRN_VERBS_H

#include <infiniband/verbs.h>
#include <stdint.h>

#define EXPORT __attribute__((visibility("default")))
#define SYMVER_DEFAULT(impl, name, node) __asm__(".symver " #impl ", " #name "@@" node)
#define SYMVER_COMPAT(impl, name, node) __asm__(".symver " #impl ", " #name "@" node)

/* What softrnicd says of its interface adapter (ctl.IAAttr). */
struct srn_ia {
	char name[64];     /* the interface */
	char datapath[16]; /* kernel or xdp */
	char address[64];  /* its IP address */
	uint32_t max_ep, max_evd, max_evd_depth;
	uint64_t max_lmr_size;
	uint16_t max_private;
	uint8_t max_sge;
	uint16_t max_ird, max_ord;
	uint32_t max_sq, max_rq;
	char version[64];
};

/*
 * srn_hello opens a session with the daemon (the socket is
 * $SOFTRNIC_SOCKET, else /run/softrnic/softrnic.sock) and reads its
 * attributes; the session's socket is returned (close-on-exec), or -1
 * with errno set. The descriptors the daemon passes (doorbell, shared
 * region) are closed: nothing maps them yet.
 */
int srn_hello(const char *client, struct srn_ia *ia);
/* srn_socket_path is where srn_hello connects. */
const char *srn_socket_path(void);

#endif
