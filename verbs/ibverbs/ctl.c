/*
 * The control protocol of softrnicd (package ctl), as much of it as this
 * library speaks: a 16-octet header (magic "SR", version, op, flags,
 * request id, status), then the op's body, every field in declaration
 * order, big-endian, strings as a 16-bit length and the octets.
 */
#define _GNU_SOURCE
#include "srn.h"

#include <errno.h>
#include <glob.h>
#include <poll.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

enum {
	CTL_MAGIC = 0x5352,
	CTL_VERSION = 7, /* ctl.Version */
	CTL_HEADER = 16,
	CTL_MAX = 65536,
	OP_HELLO = 1,
	STATUS_SUCCESS = 0,
};

/* answers says whether a daemon listens on the socket at path (a socket
 * file a killed daemon left behind refuses). The connect does not wait: a
 * daemon whose backlog is full (EAGAIN) is alive, only busy, and a
 * blocking connect would wait for it to accept, for ever if it is stopped. */
static int answers(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(sa.sun_path))
		return 0;
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return 0;
	int ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 || errno == EAGAIN;
	close(fd);
	return ok;
}

/*
 * srn_socket_path: $SOFTRNIC_SOCKET, else the one daemon socket in
 * /run/softrnic (softrnicd listens on /run/softrnic/IFACE.sock); of
 * several there, the one a daemon answers on, if only one does (the others
 * left by daemons killed). With none, or several live ones, it names the
 * pattern's path, which a connect then fails on, and says once on stderr
 * why when there are several sockets: none answers, or the library cannot
 * guess which daemon is meant.
 */
const char *srn_socket_path(void)
{
	static __thread char found[sizeof(((struct sockaddr_un *)0)->sun_path)];
	static int warned;
	const char *p = getenv("SOFTRNIC_SOCKET");
	if (p && *p)
		return p;
	glob_t g;
	if (glob(SRN_SOCKET_DIR "/*.sock", 0, NULL, &g) != 0)
		return SRN_SOCKET_DIR "/*.sock";
	size_t socks = 0, live = 0;
	for (size_t i = 0; i < g.gl_pathc; i++) {
		struct stat st;
		if (stat(g.gl_pathv[i], &st) == 0 && S_ISSOCK(st.st_mode) && strlen(g.gl_pathv[i]) < sizeof(found))
			socks++;
	}
	for (size_t i = 0; i < g.gl_pathc; i++) {
		struct stat st;
		if (stat(g.gl_pathv[i], &st) != 0 || !S_ISSOCK(st.st_mode) || strlen(g.gl_pathv[i]) >= sizeof(found))
			continue;
		if (socks == 1 || answers(g.gl_pathv[i])) { /* one alone needs no look */
			if (live++ == 0)
				strcpy(found, g.gl_pathv[i]);
		}
	}
	globfree(&g);
	if (live == 1)
		return found;
	if (live > 1 && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
		fprintf(stderr, "softrnic: %zu daemons answer in " SRN_SOCKET_DIR "; set SOFTRNIC_SOCKET to the one to use\n",
			live);
	else if (live == 0 && socks > 1 && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
		fprintf(stderr,
			"softrnic: %zu sockets in " SRN_SOCKET_DIR " and no daemon answers on any; is softrnicd running? "
			"(SOFTRNIC_SOCKET names another)\n",
			socks);
	return SRN_SOCKET_DIR "/*.sock";
}

static void str(struct srn_r *r, char *dst, size_t cap)
{
	size_t n = 0;
	srn_rbytes(r, dst, cap - 1, &n);
	dst[n] = 0;
}

static void put16(uint8_t *b, uint16_t v) { b[0] = v >> 8; b[1] = v; }
static void put32(uint8_t *b, uint32_t v) { put16(b, v >> 16); put16(b + 2, v); }

/*
 * recv_reply reads one reply into buf (CTL_MAX octets). Up to max of the
 * descriptors it passes go to fds (*nfds of them), the rest are closed. A
 * failed read leaves the control data unread: it is looked at only after
 * success.
 */
static ssize_t recv_reply(int fd, uint8_t *buf, int *fds, int max, int *nfds)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(4 * sizeof(int))];
	} oob;
	memset(&oob, 0, sizeof(oob));
	struct iovec iov = {.iov_base = buf, .iov_len = CTL_MAX};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = oob.b, .msg_controllen = sizeof(oob.b)};
	ssize_t n;
	*nfds = 0;
	do
		n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return n;
	int e = errno;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		int got[4];
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		if (k > 4)
			k = 4;
		memcpy(got, CMSG_DATA(c), k * sizeof(int));
		for (size_t i = 0; i < k; i++) {
			if (*nfds < max)
				fds[(*nfds)++] = got[i];
			else
				close(got[i]);
		}
	}
	errno = e;
	return n;
}

static void close_fds(int *fds, int n)
{
	for (int i = 0; i < n; i++)
		close(fds[i]);
}

/* The DAT status of a failed reply as an errno value. */
static int status_errno(uint32_t st)
{
	switch (st) {
	case 1: return EINVAL;  /* INVALID_HANDLE */
	case 2: return EBUSY;   /* INVALID_STATE: in use */
	case 3: return EINVAL;  /* INVALID_PARAMETER */
	case 4: return ENOMEM;  /* INSUFFICIENT_RESOURCES */
	case 5: return EFAULT;  /* INVALID_ADDRESS */
	case 6: return EACCES;  /* PROTECTION_VIOLATION */
	case 7: return EOPNOTSUPP;
	case 8: return EOPNOTSUPP;
	case 9: return ETIMEDOUT;
	default: return EIO;
	}
}

/* exchange sends one request and reads its reply's header; the body is
 * left in msg at *body (rest octets). Called with the session's lock. */
static int exchange(int fd, uint32_t id, uint16_t op, const uint8_t *body, size_t len, uint8_t *msg, struct srn_r *r,
		    int *fds, int max, int *nfds)
{
	memset(msg, 0, CTL_HEADER);
	put16(msg, CTL_MAGIC);
	put16(msg + 2, CTL_VERSION);
	put16(msg + 4, op);
	put32(msg + 8, id);
	if (len)
		memcpy(msg + CTL_HEADER, body, len);
	*nfds = 0;
	if (send(fd, msg, CTL_HEADER + len, MSG_NOSIGNAL) < 0)
		return errno == EAGAIN ? ETIMEDOUT : ENODEV; /* the daemon is gone */
	ssize_t n = recv_reply(fd, msg, fds, max, nfds);
	if (n <= 0)
		return n < 0 && errno == EAGAIN ? ETIMEDOUT : ENODEV;
	r->p = msg;
	r->end = msg + n;
	r->bad = 0;
	if (n < CTL_HEADER || srn_rn(r, 2) != CTL_MAGIC || srn_rn(r, 2) != CTL_VERSION || srn_rn(r, 2) != op)
		return EPROTO;
	srn_rn(r, 2); /* flags */
	if (srn_rn(r, 4) != id)
		return EPROTO;
	uint32_t st = srn_rn(r, 4);
	return st == STATUS_SUCCESS ? 0 : status_errno(st);
}

int srn_call_fds(struct srn_session *s, uint16_t op, const uint8_t *body, size_t len, uint8_t *reply, size_t cap,
		 size_t *got, int *fds, int max, int *nfds)
{
	if (len > CTL_MAX - CTL_HEADER)
		return EINVAL;
	uint8_t *msg = malloc(CTL_MAX);
	if (!msg)
		return ENOMEM;
	struct srn_r r;
	int err;
	pthread_mutex_lock(&s->mu);
	if (s->broken || getpid() != s->pid) {
		/* A session whose reply never came is out of step with its
		 * daemon for good; and a fork child's requests would be its
		 * parent's (the daemon reaches the memory of the process that
		 * opened the session). */
		*nfds = 0;
		err = ENODEV;
	} else {
		err = exchange(s->fd, ++s->next_id, op, body, len, msg, &r, fds, max, nfds);
		if (err == ETIMEDOUT || err == EPROTO)
			s->broken = 1;
		if (err == ENODEV)
			__atomic_store_n(&s->gone, 1, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&s->mu);
	if (!err) {
		size_t rest = r.end - r.p;
		if (rest > cap) {
			err = EPROTO;
		} else {
			if (rest)
				memcpy(reply, r.p, rest);
			if (got)
				*got = rest;
		}
	}
	if (err) {
		close_fds(fds, *nfds);
		*nfds = 0;
	}
	free(msg);
	return err;
}

int srn_call(struct srn_session *s, uint16_t op, const uint8_t *body, size_t len, uint8_t *reply, size_t cap, size_t *got)
{
	int fds[4], n = 0;
	int err = srn_call_fds(s, op, body, len, reply, cap, got, fds, 4, &n);
	close_fds(fds, n);
	return err;
}

uint8_t *srn_block(struct srn_session *s, uint32_t off, size_t n)
{
	if (!s->region || n == 0 || (uint64_t)off + n > s->region_len)
		return NULL;
	return s->region + off;
}

/*
 * The daemon reaches registered memory through /proc/PID/mem. Under Yama's ptrace_scope 1 a daemon of our own uid
 * without CAP_SYS_PTRACE may do so only when named our ptracer; a daemon
 * of root needs nothing, and we leave the process's setting alone then.
 */
static void allow_daemon(int fd, struct srn_session *s)
{
	struct ucred cr;
	socklen_t n = sizeof(cr);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &n) < 0)
		return;
	s->daemon_pid = cr.pid;
	if (cr.uid != 0 && cr.pid > 0)
		prctl(PR_SET_PTRACER, (unsigned long)cr.pid, 0, 0, 0);
}

int srn_session_gone(struct srn_session *s)
{
	if (srn_session_dead(s))
		return 1;
	struct pollfd p = {.fd = s->fd, .events = POLLRDHUP};
	if (s->fd < 0 || (poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)))) {
		__atomic_store_n(&s->gone, 1, __ATOMIC_RELAXED);
		return 1;
	}
	return 0;
}

int srn_session_open(struct srn_session *s, const char *client, struct srn_ia *ia, int map)
{
	memset(s, 0, sizeof(*s));
	s->fd = s->doorbell = -1;
	const char *path = srn_socket_path();
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(sa.sun_path))
		return ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return errno;
	/* A daemon that does not answer is no device, not a hang. */
	struct timeval tmo = {.tv_sec = 10};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tmo, sizeof(tmo));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tmo, sizeof(tmo));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		close(fd);
		return e;
	}
	size_t cn = strlen(client);
	if (cn > 256)
		cn = 256;
	uint8_t body[2 + 256];
	put16(body, cn);
	memcpy(body + 2, client, cn);
	uint8_t *msg = malloc(CTL_MAX);
	if (!msg) {
		close(fd);
		return ENOMEM;
	}
	struct srn_r r;
	int fds[2], nfds = 0;
	int err = exchange(fd, 1, OP_HELLO, body, 2 + cn, msg, &r, fds, 2, &nfds);
	if (err == EPROTO || (err && err != ENODEV && err != ETIMEDOUT))
		err = err == EPROTO ? EPROTO : ECONNREFUSED;
	uint64_t region = 0;
	if (!err) {
		srn_rn(&r, 4); /* session */
		str(&r, ia->name, sizeof(ia->name));
		str(&r, ia->datapath, sizeof(ia->datapath));
		str(&r, ia->address, sizeof(ia->address));
		ia->max_ep = srn_rn(&r, 4);
		ia->max_evd = srn_rn(&r, 4);
		ia->max_evd_depth = srn_rn(&r, 4);
		ia->max_lmr_size = srn_rn(&r, 8);
		ia->max_private = srn_rn(&r, 2);
		ia->max_sge = srn_rn(&r, 1);
		ia->max_ird = srn_rn(&r, 2);
		ia->max_ord = srn_rn(&r, 2);
		ia->max_sq = srn_rn(&r, 4);
		ia->max_rq = srn_rn(&r, 4);
		str(&r, ia->version, sizeof(ia->version));
		srn_rbytes(&r, ia->cpus, sizeof(ia->cpus), &ia->ncpus);
		region = srn_rn(&r, 8);
		if (r.bad || r.p != r.end)
			err = EPROTO;
	}
	free(msg);
	if (!err && map) {
		/* the doorbell, then the region's memfd, sealed at its size */
		struct stat st;
		int seals = nfds == 2 ? fcntl(fds[1], F_GET_SEALS) : -1;
		if (nfds != 2 || region == 0 || region > 1u << 31 || fstat(fds[1], &st) < 0 || (uint64_t)st.st_size < region ||
		    seals < 0 || !(seals & F_SEAL_SHRINK)) {
			err = EPROTO;
		} else {
			void *m = mmap(NULL, region, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1], 0);
			if (m == MAP_FAILED) {
				err = errno;
			} else {
				/* a child has no session: the rings are not its */
				madvise(m, region, MADV_DONTFORK);
				s->region = m;
				s->region_len = region;
				s->doorbell = fds[0];
				close(fds[1]);
				nfds = 0;
			}
		}
	}
	close_fds(fds, nfds);
	if (err) {
		close(fd);
		return err;
	}
	s->fd = fd;
	s->pid = getpid();
	s->next_id = 1; /* the Hello's */
	pthread_mutex_init(&s->mu, NULL);
	if (map)
		allow_daemon(fd, s);
	return 0;
}

void srn_session_close(struct srn_session *s)
{
	if (s->region)
		munmap(s->region, s->region_len);
	if (s->doorbell >= 0)
		close(s->doorbell);
	if (s->fd >= 0)
		close(s->fd);
	pthread_mutex_destroy(&s->mu);
	s->region = NULL;
	s->fd = s->doorbell = -1;
}
