/*
 * softrnic's librdmacm.so.1: the RDMA connection manager's ABI of Debian's
 * rdma-core over softrnicd (issue 22), with no kernel module.
 *
 * Every id is bound to the process's one context of the one device (as
 * rdma-core's ids are to the device their address names): a context of
 * softrnic's libibverbs, whose daemon session carries the ids' endpoints,
 * listeners and events. An event channel is an EVD of connection events
 * and connection requests in that session, and a queue of the events
 * this library makes itself (address and route resolution); its
 * descriptor is an epoll set over both, so that an application can poll
 * it and make it non-blocking as a kernel channel's.
 *
 * What the calls do, in DAT's terms: rdma_listen is a PSP; a connection
 * request is a CR, accepted or rejected on it; rdma_connect connects the
 * QP's endpoint; iWARP resolves no route, so route resolution is
 * immediate, and address resolution checks that the host has a route.
 */
#define _GNU_SOURCE
#include "srn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

EXPORT const char *rdma_event_str(enum rdma_cm_event_type event)
{
	static const char *const names[] = {
		[RDMA_CM_EVENT_ADDR_RESOLVED] = "RDMA_CM_EVENT_ADDR_RESOLVED",
		[RDMA_CM_EVENT_ADDR_ERROR] = "RDMA_CM_EVENT_ADDR_ERROR",
		[RDMA_CM_EVENT_ROUTE_RESOLVED] = "RDMA_CM_EVENT_ROUTE_RESOLVED",
		[RDMA_CM_EVENT_ROUTE_ERROR] = "RDMA_CM_EVENT_ROUTE_ERROR",
		[RDMA_CM_EVENT_CONNECT_REQUEST] = "RDMA_CM_EVENT_CONNECT_REQUEST",
		[RDMA_CM_EVENT_CONNECT_RESPONSE] = "RDMA_CM_EVENT_CONNECT_RESPONSE",
		[RDMA_CM_EVENT_CONNECT_ERROR] = "RDMA_CM_EVENT_CONNECT_ERROR",
		[RDMA_CM_EVENT_UNREACHABLE] = "RDMA_CM_EVENT_UNREACHABLE",
		[RDMA_CM_EVENT_REJECTED] = "RDMA_CM_EVENT_REJECTED",
		[RDMA_CM_EVENT_ESTABLISHED] = "RDMA_CM_EVENT_ESTABLISHED",
		[RDMA_CM_EVENT_DISCONNECTED] = "RDMA_CM_EVENT_DISCONNECTED",
		[RDMA_CM_EVENT_DEVICE_REMOVAL] = "RDMA_CM_EVENT_DEVICE_REMOVAL",
		[RDMA_CM_EVENT_MULTICAST_JOIN] = "RDMA_CM_EVENT_MULTICAST_JOIN",
		[RDMA_CM_EVENT_MULTICAST_ERROR] = "RDMA_CM_EVENT_MULTICAST_ERROR",
		[RDMA_CM_EVENT_ADDR_CHANGE] = "RDMA_CM_EVENT_ADDR_CHANGE",
		[RDMA_CM_EVENT_TIMEWAIT_EXIT] = "RDMA_CM_EVENT_TIMEWAIT_EXIT",
	};
	if ((int)event < 0 || (int)event >= (int)(sizeof(names) / sizeof(names[0])) || !names[event])
		return "UNKNOWN EVENT";
	return names[event];
}

enum {
	EVD_DEPTH = 1024,
	CONNECT_TIMEOUT_US = 15000000, /* then UNREACHABLE */
	/* A peer that refuses (nothing listens yet) is tried again for this
	 * long: perftest's server listens for its test connection only after
	 * the exchange that sends the client to connect it (ctl.Connect). */
	RETRY_REFUSED_US = 5000000,
	MAX_PDATA = 512,
};

struct cm_id;

struct cm_event {
	struct rdma_cm_event ev;
	struct cm_event *next;
	struct cm_id *owner; /* whose count of unacknowledged events it is in, once returned */
	uint8_t pdata[MAX_PDATA];
};

struct cm_channel {
	struct rdma_event_channel ch; /* the epoll set */
	int local;                    /* eventfd: events this library made */
	struct srn_evd evd;
	struct cm_event *head, *tail; /* made here, not yet returned */
	struct cm_id *ids;
	int destroyed; /* rdma_destroy_event_channel came while ids had it */
	int own;       /* a synchronous id's: rdma_destroy_event_channel leaves it to the id */
	/* rdma_get_cm_event calls in it. A channel freed under them (its
	 * synchronous id or itself destroyed: freed) leaves them waiting,
	 * as rdma-core's do, and is kept, descriptors and all, until the
	 * last one leaves: none reads a channel freed under it, or a
	 * descriptor reused by another. */
	int waiters;
	int freed;
	struct cm_channel *next_chan; /* in chans, until freed */
};

struct cm_id {
	struct rdma_cm_id id;
	struct cm_channel *chan;
	struct cm_id *next;
	uint32_t psp; /* listening */
	uint32_t reserve; /* the daemon's reservation of the id's port until it listens, or 0 */
	uint32_t cr;  /* a connection request to accept or reject */
	int events;   /* returned and not acknowledged */
	int addr_resolved;
	int dead;
	int removed; /* DEVICE_REMOVAL made for it */
	uint32_t ep; /* its QP's endpoint, whose events are the id's; 0 once the QP is destroyed */
	int live;    /* rdma_connect or rdma_accept went to the daemon */
	int ended;   /* told how its connection ended (DISCONNECTED, REJECTED...) */
	/* A synchronous id (no channel given): chan is its own, made with it
	 * and freed with it, and each call that makes an event waits for it
	 * (complete), leaving it in id.event until the next. */
	int sync;
	struct ibv_qp_init_attr *qp_init_attr; /* rdma_create_ep's, for the QPs of rdma_get_request */
	uint8_t *connect;                      /* rdma_addrinfo's ai_connect: private data's first octets */
	size_t connect_len;
};

/* One lock for the library's ids, channels and the shared context; a
 * waiter for acknowledgements sleeps on acked. It is never held across
 * a call into libibverbs that takes a lock of its own beyond the
 * session's, which nothing here holds while calling back. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t acked = PTHREAD_COND_INITIALIZER;
static struct ibv_context *verbs; /* the process's context */
static struct ibv_pd *verbs_pd;   /* its PD for ids given none (rdma_cm_id.pd), made on first use */
static struct ibv_context *verbs_pd_of; /* the context verbs_pd is of */
static int channels;              /* how many channels there are */
static struct cm_channel *chans;  /* they, listed */

/* context opens the shared context of the device on first use; mu held.
 * A context whose daemon has gone is given up once no channel is left
 * (each of its ids was told DEVICE_REMOVAL), and a new one opened, so
 * that a restarted daemon serves the process again. The old one is left
 * open, not closed: the application may still hold a PD or CQ of it. */
static struct ibv_context *context(void)
{
	if (verbs && channels == 0 && srn_session_gone(&srn_ctx(verbs)->sess))
		verbs = NULL;
	if (verbs)
		return verbs;
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list)
		return NULL;
	if (n < 1) {
		ibv_free_device_list(list);
		errno = ENODEV;
		return NULL;
	}
	verbs = ibv_open_device(list[0]);
	int e = errno;
	ibv_free_device_list(list);
	errno = e;
	if (verbs && !srn_ctx(verbs)) {
		/* not our libibverbs: nothing here can drive it */
		ibv_close_device(verbs);
		verbs = NULL;
		errno = ENODEV;
	}
	return verbs;
}

static struct srn_context *ctx(void) { return srn_ctx(verbs); }

static void signal_fd(int fd)
{
	uint64_t one = 1;
	ssize_t n = write(fd, &one, sizeof(one));
	(void)n; /* a full counter is readable already */
}

/* post queues an event this library made; mu held. */
static void post(struct cm_channel *c, struct cm_event *e)
{
	e->next = NULL;
	if (c->tail)
		c->tail->next = e;
	else
		c->head = e;
	c->tail = e;
	signal_fd(c->local);
}

static struct cm_event *new_event(struct cm_id *id, enum rdma_cm_event_type type, int status)
{
	struct cm_event *e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	e->ev.id = &id->id;
	e->ev.event = type;
	e->ev.status = status;
	return e;
}

static int renew(void);

/* make_channel makes a channel: an application's, or a synchronous
 * id's own. */
static struct cm_channel *make_channel(int own)
{
	pthread_mutex_lock(&mu);
	struct cm_channel *c = NULL;
	int rerr = renew();
	if (rerr) {
		errno = rerr;
		goto out;
	}
	if (!context())
		goto out;
	c = calloc(1, sizeof(*c));
	if (!c) {
		errno = ENOMEM;
		goto out;
	}
	int err = srn_evd_create(&ctx()->sess, EVD_DEPTH, SRN_EVD_CONNECTION | SRN_EVD_CR, &c->evd);
	if (err) {
		free(c);
		c = NULL;
		errno = err;
		goto out;
	}
	/* the set: the daemon's events, this library's, and the session's
	 * socket, which wakes it when the daemon hangs up (DEVICE_REMOVAL) */
	c->ch.fd = epoll_create1(EPOLL_CLOEXEC);
	c->local = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	struct epoll_event a = {.events = EPOLLIN, .data.u32 = 0}, b = {.events = EPOLLIN, .data.u32 = 1},
			   hup = {.events = EPOLLRDHUP, .data.u32 = 2};
	if (c->ch.fd < 0 || c->local < 0 || epoll_ctl(c->ch.fd, EPOLL_CTL_ADD, c->evd.notify, &a) < 0 ||
	    epoll_ctl(c->ch.fd, EPOLL_CTL_ADD, c->local, &b) < 0 ||
	    epoll_ctl(c->ch.fd, EPOLL_CTL_ADD, ctx()->sess.fd, &hup) < 0) {
		err = errno;
		if (c->ch.fd >= 0)
			close(c->ch.fd);
		if (c->local >= 0)
			close(c->local);
		srn_evd_free(&c->evd);
		free(c);
		c = NULL;
		errno = err;
		goto out;
	}
	srn_evd_arm(&c->evd);
	c->own = own;
	channels++;
	c->next_chan = chans;
	chans = c;
out:
	pthread_mutex_unlock(&mu);
	return c;
}

/*
 * renew moves the channels to a new context when the daemon has gone and
 * no id is left on any of them (each was told DEVICE_REMOVAL and
 * destroyed): a program that keeps its channel for its life goes on with
 * a restarted daemon, as with a kernel device that comes back. Each
 * channel's EVD is made anew on the new session; its eventfd takes the
 * old one's descriptor number (dup2), so that a thread about to read it
 * reads the new one, never a descriptor the number was given to since.
 * Every new EVD is made, and added to its channel's epoll set, before any
 * channel is moved: when one cannot be, none is, the new context is closed
 * and the next call tries again, rather than some channels left for ever
 * on the old session's EVDs or with a set that misses the new one.
 * mu held; 0 or an errno value.
 */
static int renew(void)
{
	if (!verbs || !srn_session_gone(&ctx()->sess))
		return 0;
	int n = 0;
	for (struct cm_channel *c = chans; c; c = c->next_chan, n++)
		if (c->ids)
			return ENODEV; /* the old context is still some id's */
	struct ibv_context *old = verbs;
	int old_fd = ctx()->sess.fd;
	verbs = NULL;
	if (!context()) {
		int e = errno;
		verbs = old;
		return e;
	}
	struct srn_evd *fresh = calloc(n ? n : 1, sizeof(*fresh));
	int err = fresh ? 0 : ENOMEM, made = 0, added = 0;
	for (; !err && made < n; made++)
		err = srn_evd_create(&ctx()->sess, EVD_DEPTH, SRN_EVD_CONNECTION | SRN_EVD_CR, &fresh[made]);
	if (err && made > 0)
		made--; /* the one that failed was not made */
	/* Each channel's epoll set takes the new eventfd and the new
	 * session's socket now, so that nothing is left to fail once the
	 * channels move. The eventfd's entry outlives its number's close
	 * below: its file stays open under the number dup2 gives it. */
	struct cm_channel *c = chans;
	for (; !err && c; c = c->next_chan, added++) {
		struct epoll_event a = {.events = EPOLLIN, .data.u32 = 0}, hup = {.events = EPOLLRDHUP, .data.u32 = 2};
		if (epoll_ctl(c->ch.fd, EPOLL_CTL_ADD, fresh[added].notify, &a) < 0)
			err = errno;
		else if (epoll_ctl(c->ch.fd, EPOLL_CTL_ADD, ctx()->sess.fd, &hup) < 0) {
			err = errno;
			epoll_ctl(c->ch.fd, EPOLL_CTL_DEL, fresh[added].notify, NULL);
		}
	}
	if (err) {
		c = chans;
		for (int k = 0; k < added && c; k++, c = c->next_chan) {
			epoll_ctl(c->ch.fd, EPOLL_CTL_DEL, fresh[k].notify, NULL);
			epoll_ctl(c->ch.fd, EPOLL_CTL_DEL, ctx()->sess.fd, NULL);
		}
		while (made > 0)
			srn_evd_free(&fresh[--made]);
		free(fresh);
		ibv_close_device(verbs); /* nothing holds it yet: mu was held since it opened */
		verbs = old;
		return err;
	}
	/* Commit: nothing here can fail but a dup2 interrupted, after which
	 * the channel's eventfd keeps its new number (the old one stays
	 * open, unsignalled). */
	int i = 0;
	for (c = chans; c; c = c->next_chan, i++) {
		struct srn_evd *f = &fresh[i];
		if (dup2(f->notify, c->evd.notify) >= 0) {
			close(f->notify);
			f->notify = c->evd.notify;
		}
		pthread_spin_destroy(&c->evd.lock); /* the old EVD: its ring was the old session's */
		c->evd = *f;
		epoll_ctl(c->ch.fd, EPOLL_CTL_DEL, old_fd, NULL);
		srn_evd_arm(&c->evd);
		signal_fd(c->local); /* a waiter looks again */
	}
	free(fresh);
	return 0;
}

EXPORT struct rdma_event_channel *rdma_create_event_channel(void)
{
	struct cm_channel *c = make_channel(0);
	return c ? &c->ch : NULL;
}

/* release frees a channel nothing uses any more. */
static void release(struct cm_channel *c)
{
	srn_evd_free(&c->evd);
	close(c->ch.fd);
	close(c->local);
	while (c->head) {
		struct cm_event *e = c->head;
		c->head = e->next;
		free(e);
	}
	free(c);
}

/* free_channel ends a channel: at once, or, when threads wait in it
 * (rdma_get_cm_event), once the last of them has left. */
static void free_channel(struct cm_channel *c)
{
	pthread_mutex_lock(&mu);
	channels--;
	for (struct cm_channel **p = &chans; *p; p = &(*p)->next_chan) {
		if (*p == c) {
			*p = c->next_chan;
			break;
		}
	}
	c->freed = 1;
	int busy = c->waiters > 0;
	pthread_mutex_unlock(&mu);
	if (!busy)
		release(c);
}

/* rdma_destroy_event_channel: ids must be destroyed first; a program
 * that destroys them after (perftest does on its error paths) finds its
 * ids still whole, and the channel goes with the last of them. A thread
 * waiting in it goes on waiting (rdma_get_cm_event). A synchronous id's
 * channel (id->channel) is the id's, and goes with it. */
EXPORT void rdma_destroy_event_channel(struct rdma_event_channel *ch)
{
	if (!ch)
		return;
	struct cm_channel *c = (struct cm_channel *)ch;
	pthread_mutex_lock(&mu);
	int own = c->own, busy = c->ids != NULL;
	if (!own)
		c->destroyed = busy;
	pthread_mutex_unlock(&mu);
	if (!own && !busy)
		free_channel(c); /* a synchronous id's goes with it */
}

static struct cm_id *to_id(struct rdma_cm_id *id) { return (struct cm_id *)id; }

static int fail(int err)
{
	errno = err;
	return -1;
}

/* default_pd is the context's PD that an id has until its QP is made
 * (rdma-core gives each id its device's: rdma_reg_msgs and rdma_create_qp
 * with no PD use it), made once per context; one of a context given up
 * stays with it. mu held; NULL if none could be made. */
static struct ibv_pd *default_pd(void)
{
	if (verbs_pd_of != verbs) {
		verbs_pd = NULL;
		verbs_pd_of = verbs;
	}
	if (!verbs_pd && verbs)
		verbs_pd = ibv_alloc_pd(verbs);
	return verbs_pd;
}

static struct cm_id *new_id(struct cm_channel *c, void *context, enum rdma_port_space ps)
{
	struct cm_id *i = calloc(1, sizeof(*i));
	if (!i)
		return NULL;
	i->id.verbs = verbs;
	i->id.pd = default_pd();
	i->id.channel = &c->ch;
	i->id.context = context;
	i->id.ps = ps;
	i->id.port_num = 1;
	i->id.qp_type = IBV_QPT_RC;
	i->chan = c;
	i->reserve = 0;
	i->next = c->ids;
	c->ids = i;
	return i;
}

EXPORT int rdma_create_id(struct rdma_event_channel *ch, struct rdma_cm_id **id, void *context, enum rdma_port_space ps)
{
	if (!id || ps != RDMA_PS_TCP) {
		errno = !id ? EINVAL : EPROTONOSUPPORT; /* iWARP connects reliable connected QPs over TCP only */
		return -1;
	}
	struct cm_channel *c = (struct cm_channel *)ch;
	int sync = !c;
	if (sync && !(c = make_channel(1)))
		return -1; /* a synchronous id's channel is its own */
	pthread_mutex_lock(&mu);
	int err = renew();
	struct cm_id *i = err ? NULL : new_id(c, context, ps);
	if (i)
		i->sync = sync;
	pthread_mutex_unlock(&mu);
	if (!i) {
		if (sync)
			free_channel(c);
		errno = err ? err : ENOMEM;
		return -1;
	}
	*id = &i->id;
	return 0;
}

/* drop_event acknowledges the event a synchronous call left in id->event. */
static void drop_event(struct rdma_cm_id *id)
{
	if (id->event) {
		rdma_ack_cm_event(id->event);
		id->event = NULL;
	}
}

/* event_errno is the errno value of a synchronous call whose event is e,
 * or 0. */
static int event_errno(const struct rdma_cm_event *e)
{
	if (e->event == RDMA_CM_EVENT_DEVICE_REMOVAL)
		return ENODEV;
	if (e->event == RDMA_CM_EVENT_REJECTED)
		return ECONNREFUSED;
	return e->status < 0 ? -e->status : e->status;
}

/*
 * complete waits, for a synchronous id, for the event of the call just
 * made (rdma-core's ucma_complete): it is left in id.event until the id's
 * next such call or its end, and its status is the call's: 0, or -1 with
 * errno (ECONNREFUSED for REJECTED; ENODEV for DEVICE_REMOVAL, the daemon
 * gone, which rdma-core would return as success). An asynchronous id
 * returns 0 at once.
 */
static int complete(struct cm_id *i)
{
	if (!i->sync)
		return 0;
	drop_event(&i->id);
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(i->id.channel, &e))
		return -1;
	i->id.event = e;
	int err = event_errno(e);
	return err ? fail(err) : 0;
}

/* unlink_id takes i off c's list; mu held. */
static void unlink_id(struct cm_channel *c, struct cm_id *i)
{
	for (struct cm_id **p = &c->ids; *p; p = &(*p)->next) {
		if (*p == i) {
			*p = i->next;
			break;
		}
	}
}

static int call_handle(uint16_t op, uint32_t h)
{
	uint8_t b[4];
	srn_put32(b, h);
	return srn_call(&ctx()->sess, op, b, sizeof(b), NULL, 0, NULL);
}

static int reject(uint32_t cr, const void *pdata, uint8_t len)
{
	struct srn_w w = {0};
	srn_wn(&w, cr, 4);
	srn_wbytes(&w, pdata, len);
	return srn_call(&ctx()->sess, SRN_OP_REJECT_CR, w.b, w.n, NULL, 0, NULL);
}

EXPORT int rdma_destroy_id(struct rdma_cm_id *id)
{
	if (!id)
		return fail(EINVAL);
	struct cm_id *i = to_id(id);
	drop_event(id); /* a synchronous call's */
	pthread_mutex_lock(&mu);
	i->dead = 1;
	while (i->events)
		pthread_cond_wait(&acked, &mu);
	struct cm_channel *c = i->chan;
	unlink_id(c, i);
	/* events made here for it and not yet returned go with it; a
	 * request to it not yet returned, with the request's id, refused
	 * below */
	struct cm_id *orphans = NULL;
	struct cm_event **q = &c->head;
	c->tail = NULL;
	while (*q) {
		struct cm_event *e = *q;
		if (e->ev.id == id || e->ev.listen_id == id) {
			*q = e->next;
			if (e->ev.listen_id == id) {
				struct cm_id *n = to_id(e->ev.id);
				unlink_id(c, n);
				n->next = orphans;
				orphans = n;
			}
			free(e);
			continue;
		}
		c->tail = e;
		q = &e->next;
	}
	int last = i->sync || (c->destroyed && !c->ids);
	pthread_mutex_unlock(&mu);
	if (i->psp)
		call_handle(SRN_OP_FREE_PSP, i->psp);
	if (i->reserve)
		call_handle(SRN_OP_FREE_PORT, i->reserve);
	if (i->cr)
		reject(i->cr, NULL, 0);
	while (orphans) {
		struct cm_id *n = orphans;
		orphans = n->next;
		reject(n->cr, NULL, 0);
		free(n);
	}
	if (last)
		free_channel(c);
	free(i->qp_init_attr);
	free(i->connect);
	free(i);
	return 0;
}

/* local_ok: an address this host's device has (its interface's, or
 * any). */
static int local_ok(const struct sockaddr_in *a)
{
	struct in_addr mine = {0};
	inet_pton(AF_INET, ctx()->ia.address, &mine);
	return a->sin_addr.s_addr == htonl(INADDR_ANY) || a->sin_addr.s_addr == mine.s_addr;
}

static void set_src(struct cm_id *i, uint16_t port_be)
{
	struct sockaddr_in *s = &i->id.route.addr.src_sin;
	s->sin_family = AF_INET;
	inet_pton(AF_INET, ctx()->ia.address, &s->sin_addr);
	s->sin_port = port_be;
}

EXPORT int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
	if (!id || !addr)
		return fail(EINVAL);
	if (addr->sa_family != AF_INET)
		return fail(EAFNOSUPPORT); /* the device has an IPv4 address */
	struct sockaddr_in a;
	memcpy(&a, addr, sizeof(a));
	if (!local_ok(&a))
		return fail(EADDRNOTAVAIL);
	/*
	 * The port is reserved at once, as the kernel's RDMA-CM does (qperf
	 * binds port 0 and asks which it got before it listens): by the
	 * daemon, on its address in its network namespace, until
	 * rdma_listen hands it to the daemon's listener. A port reserved or
	 * listened on already is EADDRINUSE.
	 */
	struct cm_id *i = to_id(id);
	if (i->reserve || i->psp)
		return fail(EINVAL); /* bound already */
	struct srn_w w = {0};
	srn_wn(&w, ntohs(a.sin_port), 2);
	uint8_t r[6];
	size_t got = 0;
	int err = srn_call(&ctx()->sess, SRN_OP_RESERVE_PORT, w.b, w.n, r, sizeof(r), &got);
	if (!err && got != sizeof(r))
		err = EPROTO;
	if (err)
		return fail(err == EBUSY ? EADDRINUSE : err);
	i->reserve = srn_get32(r);
	a.sin_port = htons((uint16_t)(r[4] << 8 | r[5]));
	memcpy(&id->route.addr.src_sin, &a, sizeof(a));
	return 0;
}

EXPORT int rdma_listen(struct rdma_cm_id *id, int backlog)
{
	if (!id)
		return fail(EINVAL);
	struct cm_id *i = to_id(id);
	if (i->psp)
		return fail(EINVAL);
	uint16_t port = ntohs(id->route.addr.src_sin.sin_port);
	if (id->route.addr.src_addr.sa_family != AF_INET || port == 0)
		return fail(EINVAL); /* rdma_bind_addr first */
	struct srn_w w = {0};
	srn_wn(&w, port, 2);
	srn_wn(&w, i->chan->evd.h, 4);
	srn_wn(&w, 0, 1); /* the application makes the QP */
	uint8_t r[4];
	size_t got = 0;
	int err = srn_call(&ctx()->sess, SRN_OP_CREATE_PSP, w.b, w.n, r, sizeof(r), &got);
	if (!err && got != sizeof(r))
		err = EPROTO;
	if (err)
		return fail(err == EBUSY ? EADDRINUSE : err); /* the daemon's INVALID_STATE: the port is taken */
	i->reserve = 0; /* the daemon's listener took the reservation over */
	i->psp = srn_get32(r);
	return 0;
}

/* routable asks the daemon's routing, in its network namespace, whether
 * dst can be reached from its address, as the kernel's address
 * resolution asks the host's: 0 or an errno value (ENETUNREACH when the
 * daemon says no route). */
static int routable(const struct sockaddr_in *dst)
{
	char s[INET_ADDRSTRLEN];
	if (!inet_ntop(AF_INET, &dst->sin_addr, s, sizeof(s)))
		return EINVAL;
	struct srn_w w = {0};
	srn_wbytes(&w, s, strlen(s));
	int err = srn_call(&ctx()->sess, SRN_OP_RESOLVE_ROUTE, w.b, w.n, NULL, 0, NULL);
	return err == EFAULT ? ENETUNREACH : err; /* INVALID_ADDRESS: no route */
}

EXPORT int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src, struct sockaddr *dst, int timeout_ms)
{
	if (!id || !dst)
		return fail(EINVAL);
	if (dst->sa_family != AF_INET || (src && src->sa_family != AF_INET))
		return fail(EAFNOSUPPORT);
	struct cm_id *i = to_id(id);
	/* as the kernel's: src binds an id not bound yet, and is ignored by
	 * one that is (a retry after ADDR_ERROR, say) */
	if (src && !i->reserve && !i->psp && rdma_bind_addr(id, src))
		return -1;
	struct sockaddr_in d;
	memcpy(&d, dst, sizeof(d));
	if (d.sin_port == 0)
		d.sin_port = htons(1); /* routing looks at the address only */
	int err = routable(&d);
	pthread_mutex_lock(&mu);
	memcpy(&id->route.addr.dst_sin, dst, sizeof(d));
	set_src(i, id->route.addr.src_sin.sin_port);
	i->addr_resolved = !err;
	struct cm_event *e = new_event(i, err ? RDMA_CM_EVENT_ADDR_ERROR : RDMA_CM_EVENT_ADDR_RESOLVED, -err);
	if (e)
		post(i->chan, e);
	pthread_mutex_unlock(&mu);
	return e ? complete(i) : fail(ENOMEM);
}

EXPORT int rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
	if (!id)
		return fail(EINVAL);
	struct cm_id *i = to_id(id);
	pthread_mutex_lock(&mu);
	int ok = i->addr_resolved;
	struct cm_event *e = ok ? new_event(i, RDMA_CM_EVENT_ROUTE_RESOLVED, 0) : NULL;
	if (e)
		post(i->chan, e);
	pthread_mutex_unlock(&mu);
	if (!ok)
		return fail(EINVAL);
	return e ? complete(i) : fail(ENOMEM);
}

/* destroy_cqs ends the CQs and completion channels the library made for
 * the id's QP (id.send_cq and the rest are only those, as rdma-core's). */
static void destroy_cqs(struct rdma_cm_id *id)
{
	if (id->recv_cq)
		ibv_destroy_cq(id->recv_cq);
	if (id->send_cq && id->send_cq != id->recv_cq)
		ibv_destroy_cq(id->send_cq);
	if (id->recv_cq_channel)
		ibv_destroy_comp_channel(id->recv_cq_channel);
	if (id->send_cq_channel && id->send_cq_channel != id->recv_cq_channel)
		ibv_destroy_comp_channel(id->send_cq_channel);
	id->send_cq = id->recv_cq = NULL;
	id->send_cq_channel = id->recv_cq_channel = NULL;
}

/* make_cq gives the id a CQ of n entries with a completion channel of
 * its own, its context the id (rdma_verbs.h's rdma_get_send_comp and
 * rdma_get_recv_comp wait on them); 0 or -1 with errno. */
static int make_cq(struct rdma_cm_id *id, int n, struct ibv_cq **cq, struct ibv_comp_channel **ch)
{
	if (!(*ch = ibv_create_comp_channel(id->verbs)))
		return -1;
	if (!(*cq = ibv_create_cq(id->verbs, n, id, *ch, 0)))
		return -1;
	return 0;
}

/*
 * create_qp makes the id's QP, on the id's PD when none is given. A CQ
 * the attributes leave NULL is made here, as rdma-core's, sized by the
 * queue's depth and with a completion channel of its own, and ends with
 * the QP (rdma_destroy_qp); the attributes are given back with the CQs
 * the QP has. 0 or -1 with errno.
 */
static int create_qp(struct cm_id *i, struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct rdma_cm_id *id = &i->id;
	if (!pd)
		pd = id->pd;
	if (!pd || !attr || pd->context != verbs || !srn_ctx(pd->context))
		return fail(EINVAL); /* a PD of the id's context */
	if (id->qp)
		return fail(EINVAL);
	if ((!attr->send_cq && !attr->cap.max_send_wr) || (!attr->recv_cq && !attr->cap.max_recv_wr && !attr->srq))
		return fail(EINVAL); /* no CQ, and no depth to make one of */
	struct ibv_qp_init_attr a = *attr;
	int err = 0;
	if (!a.recv_cq && !a.srq && make_cq(id, a.cap.max_recv_wr, &id->recv_cq, &id->recv_cq_channel))
		err = errno;
	else if (!a.recv_cq)
		a.recv_cq = id->recv_cq;
	if (!err && !a.send_cq && make_cq(id, a.cap.max_send_wr, &id->send_cq, &id->send_cq_channel))
		err = errno;
	else if (!a.send_cq)
		a.send_cq = id->send_cq;
	const struct srn_ia *ia = &ctx()->ia;
	struct ibv_qp *qp = err ? NULL : ctx()->create_qp_cm(pd, &a, i->chan->evd.h, ia->max_ird, ia->max_ord);
	if (!qp) {
		err = err ? err : errno;
		destroy_cqs(id);
		return fail(err);
	}
	*attr = a;
	pthread_mutex_lock(&mu);
	id->qp = qp;
	i->ep = qp->handle;
	pthread_mutex_unlock(&mu);
	id->pd = qp->pd;
	return 0;
}

EXPORT int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	if (!id)
		return fail(EINVAL);
	return create_qp(to_id(id), pd, attr);
}

EXPORT int rdma_create_qp_ex(struct rdma_cm_id *id, struct ibv_qp_init_attr_ex *ax)
{
	if (!id || !ax)
		return fail(EINVAL);
	if (ax->comp_mask & ~(uint32_t)(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS))
		return fail(EOPNOTSUPP);
	if ((ax->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && ax->create_flags)
		return fail(EOPNOTSUPP);
	/* the work request API (ibv_qp_to_qp_ex), for what iWARP has */
	int ops = (ax->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0;
	if (ops && (ax->send_ops_flags & ~(uint64_t)SRN_WR_OPS))
		return fail(EOPNOTSUPP);
	struct ibv_qp_init_attr a = {.qp_context = ax->qp_context, .send_cq = ax->send_cq, .recv_cq = ax->recv_cq,
				     .srq = ax->srq, .cap = ax->cap, .qp_type = ax->qp_type, .sq_sig_all = ax->sq_sig_all};
	int r = create_qp(to_id(id), ax->comp_mask & IBV_QP_INIT_ATTR_PD ? ax->pd : NULL, &a);
	if (r)
		return r;
	ax->cap = a.cap;
	int err = ops ? ctx()->qp_wr_api(id->qp, ax->send_ops_flags) : 0;
	if (err) {
		rdma_destroy_qp(id);
		return fail(err);
	}
	return 0;
}

static struct cm_event *translate(struct cm_channel *c, const struct srn_eve *v);

/* collect queues, translated, the daemon's events waiting in the
 * channel's ring; mu held. */
static void collect(struct cm_channel *c)
{
	for (;;) {
		struct srn_eve v;
		pthread_spin_lock(&c->evd.lock);
		int r = srn_evd_next(&c->evd, &v);
		pthread_spin_unlock(&c->evd.lock);
		if (r <= 0)
			return;
		struct cm_event *e = translate(c, &v);
		if (e)
			post(c, e);
	}
}

/*
 * rdma_destroy_qp ends the id's connection with its QP. What the daemon
 * said of the QP's endpoint until it went (ibv_destroy_qp returns once
 * it has) is the id's still, as a kernel id's events are the id's, not
 * its QP's: a REJECTED or ESTABLISHED not read yet is heard. The daemon
 * tells nothing more of it, but a kernel's id goes on to hear
 * DISCONNECTED once the connection has closed, and programs wait for
 * that (cmtime destroys each QP right after rdma_disconnect, then waits
 * for every id's DISCONNECTED): an id that connected and has not been
 * told how its connection ended is told DISCONNECTED here, once.
 */
EXPORT void rdma_destroy_qp(struct rdma_cm_id *id)
{
	if (!id)
		return;
	struct cm_id *i = to_id(id);
	pthread_mutex_lock(&mu);
	struct ibv_qp *qp = id->qp;
	id->qp = NULL;
	pthread_mutex_unlock(&mu);
	if (qp)
		ibv_destroy_qp(qp);
	destroy_cqs(id);
	pthread_mutex_lock(&mu);
	if (qp) {
		/* the daemon's handles are not used again soon: none of the
		 * ring's names another EP yet */
		collect(i->chan);
		i->ep = 0; /* its events from now on concern nothing */
	}
	if (qp && i->live && !i->ended && !i->dead && !i->removed) {
		struct cm_event *e = new_event(i, RDMA_CM_EVENT_DISCONNECTED, 0);
		if (e)
			post(i->chan, e);
		i->ended = 1;
	}
	pthread_mutex_unlock(&mu);
}

static void addr_str(const struct sockaddr_in *a, char *buf, size_t n)
{
	char ip[INET_ADDRSTRLEN] = "";
	inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
	snprintf(buf, n, "%s:%u", ip, ntohs(a->sin_port));
}

EXPORT int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
	if (!id || !id->qp)
		return fail(EINVAL); /* the QP is the endpoint that connects */
	struct cm_id *i = to_id(id);
	char addr[64];
	addr_str(&id->route.addr.dst_sin, addr, sizeof(addr));
	/* rdma_create_ep's ai_connect first, then the call's, as rdma-core's */
	uint8_t pdata[MAX_PDATA];
	size_t plen = i->connect_len, more = param && param->private_data ? param->private_data_len : 0;
	if (plen + more > sizeof(pdata))
		return fail(EINVAL);
	if (plen)
		memcpy(pdata, i->connect, plen);
	if (more)
		memcpy(pdata + plen, param->private_data, more);
	struct srn_w w = {0};
	srn_wn(&w, id->qp->handle, 4);
	srn_wbytes(&w, addr, strlen(addr));
	srn_wbytes(&w, pdata, plen + more);
	srn_wn(&w, CONNECT_TIMEOUT_US, 8);
	srn_wn(&w, RETRY_REFUSED_US, 8);
	int err = srn_call(&ctx()->sess, SRN_OP_CONNECT, w.b, w.n, NULL, 0, NULL);
	if (err)
		return fail(err);
	pthread_mutex_lock(&mu);
	i->live = 1;
	pthread_mutex_unlock(&mu);
	free(i->connect); /* given once */
	i->connect = NULL;
	i->connect_len = 0;
	return complete(i);
}

EXPORT int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
	if (!id || !id->qp)
		return fail(EINVAL);
	struct cm_id *i = to_id(id);
	if (!i->cr)
		return fail(EINVAL);
	struct srn_w w = {0};
	srn_wn(&w, i->cr, 4);
	srn_wn(&w, id->qp->handle, 4);
	srn_wbytes(&w, param ? param->private_data : NULL, param && param->private_data ? param->private_data_len : 0);
	int err = srn_call(&ctx()->sess, SRN_OP_ACCEPT_CR, w.b, w.n, NULL, 0, NULL);
	if (err)
		return fail(err);
	pthread_mutex_lock(&mu);
	i->cr = 0;
	i->live = 1;
	pthread_mutex_unlock(&mu);
	return complete(i); /* a synchronous id: ESTABLISHED */
}

EXPORT int rdma_reject(struct rdma_cm_id *id, const void *pdata, uint8_t len)
{
	if (!id)
		return fail(EINVAL);
	struct cm_id *i = to_id(id);
	if (!i->cr)
		return fail(EINVAL);
	int err = reject(i->cr, pdata, len);
	i->cr = 0;
	return err ? fail(err) : 0;
}

/*
 * rdma_disconnect: a synchronous id waits for its DISCONNECTED unless no
 * connection of it is left to hear the end of: it never connected, or
 * its connection's end (DISCONNECTED, REJECTED...) was heard already.
 * The daemon's disconnect of an endpoint that has ended is a no-op that
 * tells nothing, and rdma-core's ucma_complete would wait for ever.
 */
EXPORT int rdma_disconnect(struct rdma_cm_id *id)
{
	if (!id || !id->qp)
		return fail(EINVAL);
	struct cm_id *i = to_id(id);
	struct srn_w w = {0};
	srn_wn(&w, id->qp->handle, 4);
	srn_wn(&w, 1, 1); /* graceful */
	int err = srn_call(&ctx()->sess, SRN_OP_DISCONNECT, w.b, w.n, NULL, 0, NULL);
	if (err == EBUSY)
		return 0; /* not connected (any more): nothing to end, nothing to wait for */
	if (err)
		return fail(err);
	pthread_mutex_lock(&mu);
	int over = !i->live || i->ended;
	pthread_mutex_unlock(&mu);
	return over ? 0 : complete(i); /* a synchronous id: DISCONNECTED */
}

/* parse_addr reads "a.b.c.d:port". */
static void parse_addr(const char *s, struct sockaddr_in *a)
{
	char ip[64];
	snprintf(ip, sizeof(ip), "%s", s);
	char *colon = strrchr(ip, ':');
	memset(a, 0, sizeof(*a));
	a->sin_family = AF_INET;
	if (!colon)
		return;
	*colon = 0;
	inet_pton(AF_INET, ip, &a->sin_addr);
	a->sin_port = htons((uint16_t)atoi(colon + 1));
}

/* query_cr asks the daemon of a request: its private data into e, the
 * addresses into the new id. */
static int query_cr(uint32_t cr, struct cm_event *e, struct rdma_cm_id *id)
{
	uint8_t b[4], r[1024];
	srn_put32(b, cr);
	size_t got = 0;
	int err = srn_call(&ctx()->sess, SRN_OP_QUERY_CR, b, 4, r, sizeof(r), &got);
	if (err)
		return err;
	struct srn_r rd = {.p = r, .end = r + got};
	size_t n = 0;
	char remote[64] = "", local[64] = "";
	srn_rbytes(&rd, e->pdata, sizeof(e->pdata), &n);
	size_t rn = 0, ln = 0;
	srn_rbytes(&rd, remote, sizeof(remote) - 1, &rn);
	srn_rbytes(&rd, local, sizeof(local) - 1, &ln);
	remote[rn] = local[ln] = 0;
	if (rd.bad)
		return EPROTO;
	e->ev.param.conn.private_data = n ? e->pdata : NULL;
	e->ev.param.conn.private_data_len = (uint8_t)(n > 255 ? 255 : n);
	parse_addr(remote, &id->route.addr.dst_sin);
	parse_addr(local, &id->route.addr.src_sin);
	return 0;
}

/* established fills an established event with the peer's private data,
 * and the id with the connection's addresses (QueryEP). */
static void established(struct rdma_cm_id *id, uint32_t ep, struct cm_event *e)
{
	uint8_t b[4], r[1500];
	srn_put32(b, ep);
	size_t got = 0;
	if (srn_call(&ctx()->sess, SRN_OP_QUERY_EP, b, 4, r, sizeof(r), &got))
		return;
	struct srn_r rd = {.p = r, .end = r + got};
	srn_take(&rd, 1 + 33); /* state, attributes */
	char local[64], remote[64];
	size_t ln = 0, rn = 0;
	srn_rbytes(&rd, local, sizeof(local) - 1, &ln);
	srn_rbytes(&rd, remote, sizeof(remote) - 1, &rn);
	local[ln] = remote[rn] = 0;
	if (!rd.bad && ln && rn) {
		parse_addr(local, &id->route.addr.src_sin);
		parse_addr(remote, &id->route.addr.dst_sin);
	}
	size_t n = 0;
	srn_rbytes(&rd, e->pdata, sizeof(e->pdata), &n);
	if (!rd.bad && n) {
		e->ev.param.conn.private_data = e->pdata;
		e->ev.param.conn.private_data_len = (uint8_t)(n > 255 ? 255 : n);
	}
}

static struct cm_id *by_ep(struct cm_channel *c, uint32_t ep)
{
	for (struct cm_id *i = c->ids; i; i = i->next)
		if (i->ep && i->ep == ep && !i->dead)
			return i;
	return NULL;
}

static struct cm_id *by_port(struct cm_channel *c, uint16_t port_be)
{
	for (struct cm_id *i = c->ids; i; i = i->next)
		if (i->psp && i->id.route.addr.src_sin.sin_port == port_be && !i->dead)
			return i;
	return NULL;
}

/* translate makes the application's event of a daemon's; NULL when it
 * concerns nothing the channel still has. mu held. */
static struct cm_event *translate(struct cm_channel *c, const struct srn_eve *v)
{
	const struct srn_ia *ia = &ctx()->ia;
	if (v->kind == SRN_EVENT_CR) {
		struct cm_event *e = calloc(1, sizeof(*e));
		struct cm_id *n = e ? new_id(c, NULL, RDMA_PS_TCP) : NULL;
		if (!n || query_cr(v->handle, e, &n->id)) {
			if (n) {
				c->ids = n->next;
				free(n);
			}
			free(e);
			reject(v->handle, NULL, 0);
			return NULL;
		}
		struct cm_id *l = by_port(c, n->id.route.addr.src_sin.sin_port);
		if (!l) {
			c->ids = n->next;
			free(n);
			free(e);
			reject(v->handle, NULL, 0);
			return NULL;
		}
		n->cr = v->handle;
		n->id.context = l->id.context;
		e->ev.id = &n->id;
		e->ev.listen_id = &l->id;
		e->ev.event = RDMA_CM_EVENT_CONNECT_REQUEST;
		e->ev.param.conn.responder_resources = ia->max_ird > 255 ? 255 : ia->max_ird;
		e->ev.param.conn.initiator_depth = ia->max_ord > 255 ? 255 : ia->max_ord;
		return e;
	}
	if (v->kind != SRN_EVENT_CONNECTION)
		return NULL;
	struct cm_id *i = by_ep(c, v->ep);
	if (!i)
		return NULL;
	enum rdma_cm_event_type t;
	int status = 0;
	switch (v->event) {
	case SRN_EV_ESTABLISHED: t = RDMA_CM_EVENT_ESTABLISHED; break;
	case SRN_EV_PEER_REJECTED:
	case SRN_EV_NON_PEER_REJECTED: t = RDMA_CM_EVENT_REJECTED; status = -ECONNREFUSED; break;
	case SRN_EV_UNREACHABLE:
	case SRN_EV_TIMED_OUT: t = RDMA_CM_EVENT_UNREACHABLE; status = -ETIMEDOUT; break;
	case SRN_EV_DISCONNECTED:
	case SRN_EV_BROKEN: t = RDMA_CM_EVENT_DISCONNECTED; break;
	default: t = RDMA_CM_EVENT_CONNECT_ERROR; status = -ECONNABORTED; break;
	}
	struct cm_event *e = new_event(i, t, status);
	if (e && t == RDMA_CM_EVENT_ESTABLISHED)
		established(&i->id, v->ep, e);
	else if (e)
		i->ended = 1;
	return e;
}

/* next takes the channel's next event, or NULL (errno EAGAIN when there
 * is none yet). mu held. */
static struct cm_event *next(struct cm_channel *c)
{
	for (;;) {
		if (c->head) {
			struct cm_event *e = c->head;
			c->head = e->next;
			if (!c->head)
				c->tail = NULL;
			return e;
		}
		struct srn_eve v;
		pthread_spin_lock(&c->evd.lock);
		int r = srn_evd_next(&c->evd, &v);
		pthread_spin_unlock(&c->evd.lock);
		if (r < 0) {
			errno = -r;
			return NULL;
		}
		if (r == 0) {
			if (srn_session_gone(&ctx()->sess)) {
				/* the daemon has gone: each id hears
				 * DEVICE_REMOVAL once, then the channel
				 * has nothing more (ENODEV, not a wait) */
				int made = 0;
				for (struct cm_id *i = c->ids; i; i = i->next) {
					struct cm_event *e = i->removed ? NULL : new_event(i, RDMA_CM_EVENT_DEVICE_REMOVAL, 0);
					if (e) {
						i->removed = 1;
						post(c, e);
						made = 1;
					}
				}
				if (made)
					continue;
				errno = ENODEV;
				return NULL;
			}
			if (!srn_evd_arm(&c->evd)) {
				errno = EAGAIN;
				return NULL;
			}
			continue; /* one raced in before the arm */
		}
		struct cm_event *e = translate(c, &v);
		if (e)
			return e;
	}
}

/*
 * move puts the id on channel to, with the events this library made for
 * it and has not returned yet, once the application has acknowledged
 * every event of it it holds but the held its caller is about to give it
 * (rdma-core waits for those too); the channel it leaves is freed if it
 * was the id's own or is destroyed and now empty. The id has no QP and no listener: their events come to the
 * daemon's EVD of the channel they were made on.
 */
static void move(struct cm_id *i, struct cm_channel *to, int sync, int held)
{
	pthread_mutex_lock(&mu);
	while (i->events > held)
		pthread_cond_wait(&acked, &mu);
	struct cm_channel *from = i->chan;
	unlink_id(from, i);
	i->next = to->ids;
	to->ids = i;
	struct cm_event **q = &from->head;
	from->tail = NULL;
	while (*q) {
		struct cm_event *e = *q;
		if (e->ev.id == &i->id && !e->ev.listen_id) {
			*q = e->next;
			post(to, e);
			continue;
		}
		from->tail = e;
		q = &e->next;
	}
	int was_sync = i->sync;
	i->chan = to;
	i->id.channel = &to->ch;
	i->sync = sync;
	int last = was_sync || (from->destroyed && !from->ids);
	pthread_mutex_unlock(&mu);
	if (last)
		free_channel(from);
}

/* make_sync gives the id a channel of its own and makes it synchronous
 * (rdma_migrate_id with no channel); 0 or -1 with errno. */
static int make_sync(struct cm_id *i, int held)
{
	struct cm_channel *c = make_channel(1);
	if (!c)
		return -1;
	move(i, c, 1, held);
	return 0;
}

EXPORT int rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *ch)
{
	if (!id)
		return fail(EINVAL);
	struct cm_id *i = to_id(id);
	if (i->sync && !ch)
		return fail(EINVAL); /* synchronous already */
	/* The daemon sends a QP's connection events, and a listener's
	 * requests, to the EVD of the channel they were made on, which the
	 * library cannot change under them: migrate an id before
	 * rdma_create_qp or rdma_listen (as servers do with the id of a
	 * request, before its QP). */
	if (id->qp || i->psp)
		return fail(EOPNOTSUPP);
	if (!ch)
		return make_sync(i, 0);
	if ((struct cm_channel *)ch == i->chan)
		return 0;
	drop_event(id); /* its synchronous call's: the application never held it */
	move(i, (struct cm_channel *)ch, 0, 0);
	return 0;
}

static void drain(int fd)
{
	uint64_t v;
	ssize_t n = read(fd, &v, sizeof(v));
	(void)n;
}

/* get_event is rdma_get_cm_event's wait in c, counted among its waiters:
 * 0, or an errno value. */
static int get_event(struct cm_channel *c, struct rdma_cm_event **event)
{
	int nonblock = fcntl(c->ch.fd, F_GETFL) & O_NONBLOCK;
	for (;;) {
		/* what woke the set is read first: an event that comes after
		 * signals again */
		drain(c->local);
		drain(c->evd.notify);
		pthread_mutex_lock(&mu);
		if (c->freed) {
			/* woken in a channel freed under it (the daemon's
			 * death wakes every set) */
			pthread_mutex_unlock(&mu);
			return ECANCELED;
		}
		struct cm_event *e = next(c);
		int err = errno;
		struct cm_id *fresh = NULL; /* a synchronous listener's new id */
		if (e) {
			/* a connection request counts against its listener
			 * only, as rdma-core's: the new id may be destroyed
			 * before the event is acknowledged; but a synchronous
			 * listener's request is its new id's, whose first
			 * event it stays (rdma_get_request), and the listener
			 * may go before it */
			e->owner = to_id(e->ev.listen_id ? e->ev.listen_id : e->ev.id);
			if (e->ev.listen_id && e->owner->sync)
				e->owner = fresh = to_id(e->ev.id);
			e->owner->events++;
			/* the set stays readable while more wait; else the
			 * daemon is asked again to signal the next (it
			 * disarmed as it signalled this one), and one that
			 * raced in before the arm is signalled here */
			if (c->head || srn_pending(&c->evd.ring) || srn_evd_arm(&c->evd))
				signal_fd(c->local);
		}
		pthread_mutex_unlock(&mu);
		if (fresh && make_sync(fresh, 1)) {
			/* no channel for it: refused, as rdma-core's gives
			 * up a request it cannot make an id for */
			rdma_reject(&fresh->id, NULL, 0);
			rdma_ack_cm_event(&e->ev);
			rdma_destroy_id(&fresh->id);
			continue;
		}
		if (e) {
			*event = &e->ev;
			return 0;
		}
		if (err != EAGAIN || nonblock)
			return err;
		struct epoll_event ev;
		if (epoll_wait(c->ch.fd, &ev, 1, -1) < 0 && errno != EINTR)
			return errno;
	}
}

/* rdma_get_cm_event: a thread waiting in a channel that is destroyed
 * (rdma_destroy_event_channel, or rdma_destroy_id of the synchronous id
 * whose channel it is, rdma_get_request's) goes on waiting, as over
 * rdma-core: cmtime's event thread is blocked in it when cmtime's main
 * destroys the channel and exits, and must not wake to report a failure.
 * Should something wake it all the same (the daemon's death), it
 * returns -1 with ECANCELED. */
EXPORT int rdma_get_cm_event(struct rdma_event_channel *ch, struct rdma_cm_event **event)
{
	if (!ch || !event)
		return fail(EINVAL);
	struct cm_channel *c = (struct cm_channel *)ch;
	pthread_mutex_lock(&mu);
	c->waiters++;
	pthread_mutex_unlock(&mu);
	int err = get_event(c, event);
	pthread_mutex_lock(&mu);
	int last = --c->waiters == 0 && c->freed;
	pthread_mutex_unlock(&mu);
	if (last)
		release(c); /* freed while this thread waited in it */
	return err ? fail(err) : 0;
}

EXPORT int rdma_ack_cm_event(struct rdma_cm_event *event)
{
	if (!event)
		return fail(EINVAL);
	pthread_mutex_lock(&mu);
	((struct cm_event *)event)->owner->events--;
	pthread_cond_broadcast(&acked);
	pthread_mutex_unlock(&mu);
	free(event);
	return 0;
}

/* Options of a kernel's id that change nothing here: type of service,
 * address reuse, IPv6 only, ACK timeout. */
EXPORT int rdma_set_option(struct rdma_cm_id *id, int level, int optname, void *optval, size_t optlen)
{
	if (!id || !optval)
		return fail(EINVAL);
	return 0;
}

/* rdma_establish: iWARP's connection is established by MPA, not by the
 * application (it matters to IB's ready-to-use). */
EXPORT int rdma_establish(struct rdma_cm_id *id)
{
	return id ? 0 : fail(EINVAL);
}

/* rdma_init_qp_attr: the state the id's QP is in, nothing the
 * application needs to set. */
EXPORT int rdma_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *attr, int *mask)
{
	if (!id || !attr || !mask)
		return fail(EINVAL);
	memset(attr, 0, sizeof(*attr));
	attr->qp_state = id->qp ? id->qp->state : IBV_QPS_INIT;
	attr->qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	*mask = IBV_QP_STATE | IBV_QP_ACCESS_FLAGS;
	return 0;
}

EXPORT __be16 rdma_get_src_port(struct rdma_cm_id *id)
{
	return id && id->route.addr.src_addr.sa_family == AF_INET ? id->route.addr.src_sin.sin_port : 0;
}

EXPORT __be16 rdma_get_dst_port(struct rdma_cm_id *id)
{
	return id && id->route.addr.dst_addr.sa_family == AF_INET ? id->route.addr.dst_sin.sin_port : 0;
}

/* rdma_getaddrinfo: IPv4 names and services, for reliable connected QPs
 * over the TCP port space. */
EXPORT int rdma_getaddrinfo(const char *node, const char *service, const struct rdma_addrinfo *hints,
			    struct rdma_addrinfo **res)
{
	if (!res || (!node && !service))
		return fail(EINVAL);
	int passive = hints && (hints->ai_flags & RAI_PASSIVE);
	struct addrinfo h = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
	if (passive)
		h.ai_flags |= AI_PASSIVE;
	if (hints && (hints->ai_flags & RAI_NUMERICHOST))
		h.ai_flags |= AI_NUMERICHOST;
	struct addrinfo *ai = NULL;
	int gai = getaddrinfo(node, service, &h, &ai);
	if (gai)
		return fail(gai == EAI_SYSTEM ? errno : EADDRNOTAVAIL);
	struct rdma_addrinfo *r = calloc(1, sizeof(*r));
	struct sockaddr_in *a = malloc(sizeof(*a));
	if (!r || !a) {
		freeaddrinfo(ai);
		free(r);
		free(a);
		return fail(ENOMEM);
	}
	memcpy(a, ai->ai_addr, sizeof(*a));
	freeaddrinfo(ai);
	r->ai_flags = hints ? hints->ai_flags : 0;
	r->ai_family = AF_INET;
	r->ai_qp_type = IBV_QPT_RC;
	r->ai_port_space = RDMA_PS_TCP;
	if (passive) {
		r->ai_src_addr = (struct sockaddr *)a;
		r->ai_src_len = sizeof(*a);
	} else {
		r->ai_dst_addr = (struct sockaddr *)a;
		r->ai_dst_len = sizeof(*a);
	}
	*res = r;
	return 0;
}

EXPORT void rdma_freeaddrinfo(struct rdma_addrinfo *res)
{
	while (res) {
		struct rdma_addrinfo *n = res->ai_next;
		free(res->ai_src_addr);
		free(res->ai_dst_addr);
		free(res->ai_src_canonname);
		free(res->ai_dst_canonname);
		free(res->ai_route);
		free(res->ai_connect);
		free(res);
		res = n;
	}
}

/*
 * rdma_get_request waits, on a synchronous listener, for its next
 * connection request and returns the request's id, synchronous too, with
 * the request in id->event and, when rdma_create_ep was given QP
 * attributes, its QP made (on the listener's PD).
 */
EXPORT int rdma_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **id)
{
	if (!listen || !id)
		return fail(EINVAL);
	struct cm_id *l = to_id(listen);
	if (!l->sync)
		return fail(EINVAL); /* an asynchronous listener's requests come to its channel */
	if (!l->psp)
		return fail(EINVAL); /* not listening: no request would come (rdma-core's waits for ever) */
	/* what the request's QP is made of is read before the wait: a
	 * listener destroyed during it is not read after */
	struct ibv_qp_init_attr a;
	int with_qp = l->qp_init_attr != NULL;
	if (with_qp)
		a = *l->qp_init_attr;
	struct ibv_pd *pd = listen->pd;
	drop_event(listen);
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(listen->channel, &e))
		return -1; /* ECANCELED: woken in a channel destroyed under it */
	int err = event_errno(e);
	if (!err && e->event != RDMA_CM_EVENT_CONNECT_REQUEST)
		err = EINVAL;
	if (err) {
		listen->event = e;
		return fail(err);
	}
	struct rdma_cm_id *n = e->id;
	n->event = e;
	if (with_qp) {
		if (rdma_create_qp(n, pd, &a)) {
			err = errno;
			rdma_reject(n, NULL, 0);
			rdma_destroy_id(n);
			return fail(err);
		}
	}
	*id = n;
	return 0;
}

/*
 * rdma_create_ep makes a synchronous id of an rdma_getaddrinfo result:
 * passive (RAI_PASSIVE), bound to its source address, keeping the PD and
 * QP attributes for the ids of rdma_get_request; active, with its address
 * and route resolved and, given attributes, its QP made. 0, or -1 with
 * errno and nothing left.
 */
EXPORT int rdma_create_ep(struct rdma_cm_id **id, struct rdma_addrinfo *res, struct ibv_pd *pd,
			  struct ibv_qp_init_attr *qp_init_attr)
{
	if (!id || !res)
		return fail(EINVAL);
	if (res->ai_qp_type != IBV_QPT_RC)
		return fail(EOPNOTSUPP); /* iWARP: reliable connected QPs only */
	struct rdma_cm_id *cm;
	if (rdma_create_id(NULL, &cm, NULL, res->ai_port_space))
		return -1;
	struct cm_id *i = to_id(cm);
	if (res->ai_flags & RAI_PASSIVE) {
		if (rdma_bind_addr(cm, res->ai_src_addr))
			goto err;
		if (pd)
			cm->pd = pd;
		if (qp_init_attr) {
			if (!(i->qp_init_attr = malloc(sizeof(*qp_init_attr)))) {
				errno = ENOMEM;
				goto err;
			}
			*i->qp_init_attr = *qp_init_attr;
			i->qp_init_attr->qp_type = res->ai_qp_type;
		}
		*id = cm;
		return 0;
	}
	if (rdma_resolve_addr(cm, res->ai_src_addr, res->ai_dst_addr, 2000) || rdma_resolve_route(cm, 2000))
		goto err;
	if (qp_init_attr) {
		qp_init_attr->qp_type = res->ai_qp_type;
		if (rdma_create_qp(cm, pd, qp_init_attr))
			goto err;
	}
	if (res->ai_connect_len) {
		if (!res->ai_connect || res->ai_connect_len > MAX_PDATA) {
			errno = EINVAL;
			goto err;
		}
		if (!(i->connect = malloc(res->ai_connect_len))) {
			errno = ENOMEM;
			goto err;
		}
		memcpy(i->connect, res->ai_connect, res->ai_connect_len);
		i->connect_len = res->ai_connect_len;
	}
	*id = cm;
	return 0;
err:;
	int e = errno;
	rdma_destroy_ep(cm);
	errno = e;
	return -1;
}

EXPORT void rdma_destroy_ep(struct rdma_cm_id *id)
{
	if (!id)
		return;
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
}

/* rdma_get_devices: the one device's context, the process's (every id
 * is bound to it); an empty list when no daemon serves. */
EXPORT struct ibv_context **rdma_get_devices(int *num_devices)
{
	pthread_mutex_lock(&mu);
	struct ibv_context *v = renew() ? NULL : context();
	pthread_mutex_unlock(&mu);
	struct ibv_context **list = calloc(2, sizeof(*list));
	if (list)
		list[0] = v;
	if (num_devices)
		*num_devices = list && v ? 1 : 0;
	return list;
}

EXPORT void rdma_free_devices(struct ibv_context **list)
{
	free(list); /* the context stays the process's */
}

/* rdma_notify: an InfiniBand CM's hint that the QP saw traffic before
 * ESTABLISHED; nothing on iWARP, where MPA establishes (the kernel's
 * returns 0 for iWARP devices too). */
EXPORT int rdma_notify(struct rdma_cm_id *id, enum ibv_event_type event)
{
	return id ? 0 : fail(EINVAL);
}
