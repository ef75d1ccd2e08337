/*
 * The control protocol of softrnicd (package ctl), as much of it as this
 * library speaks: a 16-octet header (magic "SR", version, op, flags,
 * request id, status), then the op's body, every field in declaration
 * order, big-endian, strings as a 16-bit length and the octets.
 */
#include "srn.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

enum {
	CTL_MAGIC = 0x5352,
	CTL_VERSION = 4, /* ctl.Version */
	CTL_HEADER = 16,
	CTL_MAX = 65536,
	OP_HELLO = 1,
	STATUS_SUCCESS = 0,
};

const char *srn_socket_path(void)
{
	const char *p = getenv("SOFTRNIC_SOCKET");
	return p && *p ? p : "/run/softrnic/softrnic.sock";
}

/* A reader of a reply body that fails once anything is short. */
struct rd {
	const uint8_t *p, *end;
	int bad;
};

static const uint8_t *take(struct rd *r, size_t n)
{
	if (r->bad || (size_t)(r->end - r->p) < n) {
		r->bad = 1;
		return NULL;
	}
	const uint8_t *p = r->p;
	r->p += n;
	return p;
}

static uint64_t be(struct rd *r, size_t n)
{
	const uint8_t *p = take(r, n);
	uint64_t v = 0;
	for (size_t i = 0; p && i < n; i++)
		v = v << 8 | p[i];
	return v;
}

static void str(struct rd *r, char *dst, size_t cap)
{
	size_t n = be(r, 2);
	const uint8_t *p = take(r, n);
	if (!p)
		return;
	if (n >= cap)
		n = cap - 1;
	memcpy(dst, p, n);
	dst[n] = 0;
}

static void put16(uint8_t *b, uint16_t v) { b[0] = v >> 8; b[1] = v; }
static void put32(uint8_t *b, uint32_t v) { put16(b, v >> 16); put16(b + 2, v); }

/*
 * recv_reply reads one reply into buf (CTL_MAX octets) and closes the
 * descriptors it passes: no reply this library reads needs one yet (the
 * Hello's doorbell and shared region are not mapped). A failed read
 * leaves the control data unread: it is looked at only after success.
 */
static ssize_t recv_reply(int fd, uint8_t *buf)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(4 * sizeof(int))];
	} oob;
	memset(&oob, 0, sizeof(oob));
	struct iovec iov = {.iov_base = buf, .iov_len = CTL_MAX};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = oob.b, .msg_controllen = sizeof(oob.b)};
	ssize_t n;
	do
		n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return n;
	int e = errno;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		int *fds = (int *)CMSG_DATA(c);
		for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++)
			close(fds[i]);
	}
	errno = e;
	return n;
}

/* The DAT status of a failed reply as an errno value. */
static int status_errno(uint32_t st)
{
	switch (st) {
	case 1: return EINVAL;  /* INVALID_HANDLE */
	case 2: return EBUSY;   /* INVALID_STATE: in use */
	case 3: return EINVAL;  /* INVALID_PARAMETER */
	case 4: return ENOMEM;  /* INSUFFICIENT_RESOURCES */
	case 5: return EADDRNOTAVAIL;
	case 6: return EACCES;  /* PROTECTION_VIOLATION */
	case 7: return EOPNOTSUPP;
	case 8: return EOPNOTSUPP;
	case 9: return ETIMEDOUT;
	default: return EIO;
	}
}

int srn_call(struct srn_session *s, uint16_t op, const uint8_t *body, size_t len, uint8_t *reply, size_t cap, size_t *got)
{
	if (len > CTL_MAX - CTL_HEADER)
		return EINVAL;
	uint8_t *msg = malloc(CTL_MAX);
	if (!msg)
		return ENOMEM;
	pthread_mutex_lock(&s->mu);
	uint32_t id = ++s->next_id;
	memset(msg, 0, CTL_HEADER);
	put16(msg, CTL_MAGIC);
	put16(msg + 2, CTL_VERSION);
	put16(msg + 4, op);
	put32(msg + 8, id);
	if (len)
		memcpy(msg + CTL_HEADER, body, len);
	int err = 0;
	ssize_t n;
	if (send(s->fd, msg, CTL_HEADER + len, MSG_NOSIGNAL) < 0) {
		err = errno == EAGAIN ? ETIMEDOUT : ENODEV; /* the daemon is gone */
		goto out;
	}
	n = recv_reply(s->fd, msg);
	if (n <= 0) {
		err = n < 0 && errno == EAGAIN ? ETIMEDOUT : ENODEV;
		goto out;
	}
	struct rd r = {.p = msg, .end = msg + n};
	if (n < CTL_HEADER || be(&r, 2) != CTL_MAGIC || be(&r, 2) != CTL_VERSION || be(&r, 2) != op) {
		err = EPROTO;
		goto out;
	}
	be(&r, 2);
	if (be(&r, 4) != id) {
		err = EPROTO;
		goto out;
	}
	uint32_t st = be(&r, 4);
	if (st != STATUS_SUCCESS) {
		err = status_errno(st);
		goto out;
	}
	size_t rest = r.end - r.p;
	if (rest > cap) {
		err = EPROTO;
		goto out;
	}
	if (rest)
		memcpy(reply, r.p, rest);
	if (got)
		*got = rest;
out:
	pthread_mutex_unlock(&s->mu);
	free(msg);
	return err;
}

int srn_hello(const char *client, struct srn_ia *ia)
{
	const char *path = srn_socket_path();
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(sa.sun_path)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	/* A daemon that does not answer is no device, not a hang. */
	struct timeval tmo = {.tv_sec = 10};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tmo, sizeof(tmo));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tmo, sizeof(tmo));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		goto fail;

	size_t cn = strlen(client);
	if (cn > 256)
		cn = 256;
	uint8_t req[CTL_HEADER + 2 + 256];
	memset(req, 0, CTL_HEADER);
	put16(req, CTL_MAGIC);
	put16(req + 2, CTL_VERSION);
	put16(req + 4, OP_HELLO);
	put32(req + 8, 1); /* request id */
	put16(req + CTL_HEADER, cn);
	memcpy(req + CTL_HEADER + 2, client, cn);
	if (send(fd, req, CTL_HEADER + 2 + cn, MSG_NOSIGNAL) < 0)
		goto fail;

	uint8_t *buf = malloc(CTL_MAX);
	if (!buf)
		goto fail;
	ssize_t n = recv_reply(fd, buf);
	if (n < 0) {
		free(buf);
		goto fail;
	}
	struct rd r = {.p = buf, .end = buf + (n > 0 ? n : 0)};
	int err = EPROTO;
	if (n < CTL_HEADER || be(&r, 2) != CTL_MAGIC || be(&r, 2) != CTL_VERSION || be(&r, 2) != OP_HELLO) {
		free(buf);
		errno = EPROTO;
		goto fail;
	}
	be(&r, 2); /* flags */
	be(&r, 4); /* id */
	if (be(&r, 4) != STATUS_SUCCESS) {
		free(buf);
		errno = ECONNREFUSED;
		goto fail;
	}
	be(&r, 4); /* session */
	str(&r, ia->name, sizeof(ia->name));
	str(&r, ia->datapath, sizeof(ia->datapath));
	str(&r, ia->address, sizeof(ia->address));
	ia->max_ep = be(&r, 4);
	ia->max_evd = be(&r, 4);
	ia->max_evd_depth = be(&r, 4);
	ia->max_lmr_size = be(&r, 8);
	ia->max_private = be(&r, 2);
	ia->max_sge = be(&r, 1);
	ia->max_ird = be(&r, 2);
	ia->max_ord = be(&r, 2);
	ia->max_sq = be(&r, 4);
	ia->max_rq = be(&r, 4);
	str(&r, ia->version, sizeof(ia->version));
	be(&r, 8); /* region size */
	if (r.bad || r.p != r.end) {
		free(buf);
		errno = err;
		goto fail;
	}
	free(buf);
	return fd;
fail:;
	int e = errno;
	close(fd);
	errno = e;
	return -1;
}
