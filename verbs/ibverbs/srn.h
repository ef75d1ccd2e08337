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
#include <pthread.h>
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

/* A session with the daemon: its socket, one request at a time. */
struct srn_session {
	int fd;
	pthread_mutex_t mu;
	uint32_t next_id;
};

/*
 * srn_call makes one request (op, with body) and reads the reply's body
 * into reply (at most cap octets; its length in *got). It returns 0, or
 * an errno value: the daemon's refusal mapped from its DAT status,
 * ENODEV when the daemon has gone, ETIMEDOUT when it does not answer,
 * EPROTO for a reply that is not one.
 */
int srn_call(struct srn_session *s, uint16_t op, const uint8_t *body, size_t len, uint8_t *reply, size_t cap, size_t *got);

/* The session of a context this library opened. */
struct srn_session *srn_session_of(struct ibv_context *ctx);

/* Control operations (ctl.Op). */
enum {
	SRN_OP_CREATE_PZ = 3,
	SRN_OP_FREE_PZ = 4,
};

/* Big-endian fields. */
static inline void srn_put32(uint8_t *b, uint32_t v)
{
	b[0] = v >> 24; b[1] = v >> 16; b[2] = v >> 8; b[3] = v;
}
static inline uint32_t srn_get32(const uint8_t *b)
{
	return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

#endif
