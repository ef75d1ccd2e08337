/*
 * syncedge: the edges of the synchronous RDMA-CM calls and of what an id
 * hears once its QP is gone, where a program can go wrong or a peer be
 * hostile:
 *   - an id whose QP is destroyed while the daemon's REJECTED, or its
 *     ESTABLISHED, waits unread hears that event, not a DISCONNECTED made
 *     in its place (the kernel's events are the id's, not its QP's); a
 *     request taken in with them and not read yet is refused when its
 *     listener goes;
 *   - a synchronous call with nothing to wait for returns: rdma_get_request
 *     of an id that does not listen (EINVAL), a second rdma_disconnect;
 *   - two threads in rdma_get_request on one listener each get a request;
 *     when the listener is destroyed under them, both go on waiting, as
 *     over rdma-core (cmtime's event thread is blocked so as its program
 *     ends), and so does a thread blocked in rdma_get_cm_event on a
 *     channel destroyed under it, and nothing crashes;
 *   - rdma_disconnect of a synchronous id whose peer disconnected or reset
 *     first leaves the peer's DISCONNECTED in id->event, as rdma-core's;
 *   - a peer that resets its connection before rdma_accept: the accept
 *     fails, or returns with ESTABLISHED in id->event, never with 0 and
 *     another event; a synchronous connect to a peer that resets fails,
 *     to one that stays silent times out (ETIMEDOUT);
 *   - bad arguments and states: -1 with errno, no crash.
 * Prints "ok" and exits 0, or names what failed.
 *
 *   syncedge PORT [unread|threads|reset|hostile|bad]   (one part only)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static int port;
static const char *waiting = "nothing"; /* what an alarm found hung */

static void hung(int sig)
{
	(void)sig;
	char b[160];
	int n = snprintf(b, sizeof(b), "hung in %s\n", waiting);
	ssize_t w = write(2, b, n);
	(void)w;
	_exit(1);
}

static struct ibv_qp_init_attr qp_attr(void)
{
	struct ibv_qp_init_attr a = {.cap = {.max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1},
				     .qp_type = IBV_QPT_RC, .sq_sig_all = 1};
	return a;
}

static struct rdma_addrinfo *addr(int p, int passive)
{
	char s[16];
	snprintf(s, sizeof(s), "%d", p);
	struct rdma_addrinfo hints = {.ai_port_space = RDMA_PS_TCP, .ai_flags = passive ? RAI_PASSIVE : 0}, *res;
	if (rdma_getaddrinfo("127.0.0.1", s, &hints, &res))
		FAIL("rdma_getaddrinfo %s: %s", s, strerror(errno));
	return res;
}

static struct sockaddr_in loopback(int p)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(p)};
	a.sin_addr.s_addr = htonl(0x7f000001);
	return a;
}

/* the event a synchronous call left in id->event must be want */
static void left(struct rdma_cm_id *id, enum rdma_cm_event_type want, const char *after)
{
	if (!id->event || id->event->event != want)
		FAIL("id->event after %s: %s, want %s", after, id->event ? rdma_event_str(id->event->event) : "none",
		     rdma_event_str(want));
}

/* join t within 10 s */
static void join(pthread_t t, const char *what)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 10;
	if (pthread_timedjoin_np(t, NULL, &ts))
		FAIL("%s still blocked 10 s on", what);
}

/*
 * An asynchronous client's connect to the listener l of channel sch,
 * refused or accepted; once the client's channel has the outcome waiting
 * (readable), the client's QP is destroyed before it is read: the id must
 * hear the daemon's event, then (when it connected) DISCONNECTED, once.
 */
static void unread_outcome(struct rdma_event_channel *sch, int accept)
{
	struct rdma_event_channel *cch = nonblocking_channel();
	struct rdma_cm_id *cli, *srv = NULL;
	struct sockaddr_in dst = loopback(port);
	if (rdma_create_id(cch, &cli, NULL, RDMA_PS_TCP) || rdma_resolve_addr(cli, NULL, (struct sockaddr *)&dst, 2000))
		FAIL("client id: %s", strerror(errno));
	rdma_ack_cm_event(wait_event(cch, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(cli, 2000))
		FAIL("route: %s", strerror(errno));
	rdma_ack_cm_event(wait_event(cch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	struct ibv_qp_init_attr ca = qp_attr();
	if (rdma_create_qp(cli, NULL, &ca) || rdma_connect(cli, NULL))
		FAIL("connect: %s", strerror(errno));
	struct rdma_cm_event *req = wait_event(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	srv = req->id;
	rdma_ack_cm_event(req);
	if (accept) {
		struct ibv_qp_init_attr sa = qp_attr();
		if (rdma_create_qp(srv, NULL, &sa) || rdma_accept(srv, NULL))
			FAIL("accept: %s", strerror(errno));
	} else if (rdma_reject(srv, NULL, 0)) {
		FAIL("reject: %s", strerror(errno));
	}
	struct pollfd pf = {.fd = cch->fd, .events = POLLIN};
	if (poll(&pf, 1, 10000) != 1)
		FAIL("no outcome of the connect in 10 s");
	usleep(100000); /* whatever else the daemon says comes too */
	rdma_destroy_qp(cli);
	const char *how = accept ? "an accepted connect" : "a refused connect";
	struct rdma_cm_event *e = expect(cch, accept ? RDMA_CM_EVENT_ESTABLISHED : RDMA_CM_EVENT_REJECTED);
	if (e->id != cli)
		FAIL("%s: the event of another id", how);
	rdma_ack_cm_event(e);
	if (accept)
		rdma_ack_cm_event(wait_event(cch, RDMA_CM_EVENT_DISCONNECTED));
	no_event(cch, 300, accept ? "after DISCONNECTED" : "after REJECTED");
	rdma_destroy_id(cli);
	if (accept) {
		rdma_ack_cm_event(wait_event(sch, RDMA_CM_EVENT_ESTABLISHED));
		rdma_destroy_qp(srv);
		/* the server's id hears how its connection ended, once */
		rdma_ack_cm_event(wait_event(sch, RDMA_CM_EVENT_DISCONNECTED));
	}
	rdma_destroy_id(srv);
	no_event(sch, 300, "the server's channel afterwards");
	rdma_destroy_event_channel(cch);
}

/* an asynchronous id of ch connecting to the listener at port */
static struct rdma_cm_id *connecting(struct rdma_event_channel *ch)
{
	struct rdma_cm_id *id;
	struct sockaddr_in dst = loopback(port);
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) || rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000))
		FAIL("client id: %s", strerror(errno));
	rdma_ack_cm_event(wait_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(id, 2000))
		FAIL("route: %s", strerror(errno));
	rdma_ack_cm_event(wait_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	struct ibv_qp_init_attr ca = qp_attr();
	if (rdma_create_qp(id, NULL, &ca) || rdma_connect(id, NULL))
		FAIL("connect: %s", strerror(errno));
	return id;
}

/*
 * A request waiting unread in the listener's channel when the QP of
 * another id of the channel is destroyed (which takes what the daemon
 * said in, to keep it) is refused when the listener is destroyed before
 * the request is read: its client hears REJECTED, not a timeout.
 */
static void request_with_listener(void)
{
	struct rdma_event_channel *sch = nonblocking_channel(), *cch = nonblocking_channel();
	struct rdma_cm_id *l;
	struct sockaddr_in any = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (rdma_create_id(sch, &l, NULL, RDMA_PS_TCP) || rdma_bind_addr(l, (struct sockaddr *)&any) ||
	    rdma_listen(l, 4))
		FAIL("listener: %s", strerror(errno));
	struct rdma_cm_id *a = connecting(cch);
	struct rdma_cm_event *req = wait_event(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *srv = req->id;
	rdma_ack_cm_event(req);
	struct ibv_qp_init_attr sa = qp_attr();
	if (rdma_create_qp(srv, NULL, &sa) || rdma_accept(srv, NULL))
		FAIL("accept: %s", strerror(errno));
	rdma_ack_cm_event(wait_event(sch, RDMA_CM_EVENT_ESTABLISHED));
	rdma_ack_cm_event(wait_event(cch, RDMA_CM_EVENT_ESTABLISHED));
	struct rdma_cm_id *b = connecting(cch);
	struct pollfd pf = {.fd = sch->fd, .events = POLLIN};
	if (poll(&pf, 1, 10000) != 1)
		FAIL("no request in 10 s");
	rdma_destroy_qp(srv);
	rdma_destroy_id(l);
	/* the first client's connection ended, the second was refused */
	for (int k = 0; k < 2; k++) {
		struct pollfd cp = {.fd = cch->fd, .events = POLLIN};
		if (poll(&cp, 1, 5000) != 1)
			FAIL("the clients heard %d events in 5 s, want 2", k);
		struct rdma_cm_event *e;
		if (rdma_get_cm_event(cch, &e))
			FAIL("rdma_get_cm_event: %s", strerror(errno));
		if (e->id == a ? e->event != RDMA_CM_EVENT_DISCONNECTED : e->event != RDMA_CM_EVENT_REJECTED)
			FAIL("the %s client heard %s", e->id == a ? "first" : "second", rdma_event_str(e->event));
		rdma_ack_cm_event(e);
	}
	rdma_ack_cm_event(expect(sch, RDMA_CM_EVENT_DISCONNECTED));
	rdma_destroy_id(srv);
	no_event(sch, 0, "the listener's channel after it went");
	rdma_destroy_qp(a);
	rdma_destroy_qp(b);
	rdma_destroy_id(a);
	rdma_destroy_id(b);
	rdma_destroy_event_channel(sch);
	rdma_destroy_event_channel(cch);
}

static struct rdma_cm_id *sync_listener;

struct getter {
	pthread_t t;
	struct rdma_cm_id *id; /* the request's, accepted */
	int err;               /* rdma_get_request's errno, or 0 */
	int done;              /* rdma_get_request returned */
};

/* rdma_get_request on sync_listener, and the request accepted */
static void *get(void *arg)
{
	struct getter *g = arg;
	g->id = NULL;
	g->err = 0;
	struct rdma_cm_id *id;
	int r = rdma_get_request(sync_listener, &id);
	__atomic_store_n(&g->done, 1, __ATOMIC_RELEASE);
	if (r) {
		g->err = errno;
		return NULL;
	}
	if (rdma_accept(id, NULL))
		FAIL("rdma_accept of a request got by a second thread: %s", strerror(errno));
	g->id = id;
	return NULL;
}

/* a synchronous client of sync_listener */
static void *connect_ep(void *arg)
{
	struct rdma_cm_id **out = arg;
	struct rdma_addrinfo *res = addr(port + 1, 0);
	struct ibv_qp_init_attr a = qp_attr();
	if (rdma_create_ep(out, res, NULL, &a))
		FAIL("client rdma_create_ep: %s", strerror(errno));
	rdma_freeaddrinfo(res);
	if (rdma_connect(*out, NULL))
		FAIL("client rdma_connect: %s", strerror(errno));
	left(*out, RDMA_CM_EVENT_ESTABLISHED, "a connect");
	return NULL;
}

static struct rdma_event_channel *blocked_channel;
static int blocked_done;

static void *get_event(void *arg)
{
	(void)arg;
	struct rdma_cm_event *e;
	(void)rdma_get_cm_event(blocked_channel, &e);
	__atomic_store_n(&blocked_done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* two threads in rdma_get_request on one listener, then the listener
 * destroyed under two more */
static void threads(void)
{
	struct rdma_addrinfo *res = addr(port + 1, 1);
	struct ibv_qp_init_attr la = qp_attr();
	if (rdma_create_ep(&sync_listener, res, NULL, &la) || rdma_listen(sync_listener, 4))
		FAIL("passive ep: %s", strerror(errno));
	rdma_freeaddrinfo(res);
	struct getter g[2];
	pthread_t c[2];
	struct rdma_cm_id *cli[2];
	for (int k = 0; k < 2; k++)
		if (pthread_create(&g[k].t, NULL, get, &g[k]))
			FAIL("pthread_create");
	usleep(100000);
	for (int k = 0; k < 2; k++)
		if (pthread_create(&c[k], NULL, connect_ep, &cli[k]))
			FAIL("pthread_create");
	for (int k = 0; k < 2; k++) {
		join(c[k], "a synchronous client's connect");
		join(g[k].t, "rdma_get_request with two requests for two threads");
		if (g[k].err || !g[k].id)
			FAIL("rdma_get_request in thread %d: %s", k, strerror(g[k].err));
	}
	if (g[0].id == g[1].id)
		FAIL("both threads got the same request");
	for (int k = 0; k < 2; k++) {
		/* the first client disconnects, the second resets (its QP
		 * destroyed while connected) */
		if (k == 0 && rdma_disconnect(cli[k]))
			FAIL("client rdma_disconnect: %s", strerror(errno));
		if (k == 0)
			left(cli[k], RDMA_CM_EVENT_DISCONNECTED, "the client's disconnect");
		rdma_destroy_ep(cli[k]);
		/* the peer disconnected first (and its end has reached the
		 * server's daemon): what the server's id is left with is the
		 * peer's DISCONNECTED, as over rdma-core */
		usleep(200000);
		if (rdma_disconnect(g[k].id))
			FAIL("server rdma_disconnect after the peer's: %s", strerror(errno));
		left(g[k].id, RDMA_CM_EVENT_DISCONNECTED, "a disconnect after the peer's");
		/* and a second disconnect has nothing to wait for */
		waiting = "a second rdma_disconnect";
		alarm(10);
		if (rdma_disconnect(g[k].id))
			FAIL("a second rdma_disconnect: %s", strerror(errno));
		alarm(0);
		rdma_destroy_ep(g[k].id);
	}

	/* the listener destroyed under two threads blocked on it: they go
	 * on waiting, and exit with the program */
	static struct getter left[2];
	for (int k = 0; k < 2; k++)
		if (pthread_create(&left[k].t, NULL, get, &left[k]))
			FAIL("pthread_create");
	usleep(300000);
	waiting = "rdma_destroy_ep of a listener two threads wait on";
	alarm(10);
	rdma_destroy_ep(sync_listener);
	alarm(0);
	usleep(300000);
	for (int k = 0; k < 2; k++) {
		if (__atomic_load_n(&left[k].done, __ATOMIC_ACQUIRE))
			FAIL("rdma_get_request on a listener destroyed under it returned (%s), want it waiting as over rdma-core",
			     left[k].err ? strerror(left[k].err) : "a request");
	}

	/* a channel destroyed under a thread blocked in rdma_get_cm_event */
	blocked_channel = rdma_create_event_channel();
	if (!blocked_channel)
		FAIL("rdma_create_event_channel: %s", strerror(errno));
	pthread_t t;
	if (pthread_create(&t, NULL, get_event, NULL))
		FAIL("pthread_create");
	usleep(300000);
	rdma_destroy_event_channel(blocked_channel);
	usleep(300000);
	if (__atomic_load_n(&blocked_done, __ATOMIC_ACQUIRE))
		FAIL("rdma_get_cm_event on a channel destroyed under it returned, want it waiting as over rdma-core");
}

/* A peer that sends its MPA request, then resets the connection before
 * the request is accepted. */
static void reset_before_accept(void)
{
	struct rdma_addrinfo *res = addr(port + 2, 1);
	struct ibv_qp_init_attr la = qp_attr();
	struct rdma_cm_id *l, *id;
	if (rdma_create_ep(&l, res, NULL, &la) || rdma_listen(l, 4))
		FAIL("passive ep: %s", strerror(errno));
	rdma_freeaddrinfo(res);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = loopback(port + 2);
	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a)))
		FAIL("raw connect: %s", strerror(errno));
	uint8_t req[20] = "MPA ID Req Frame";
	req[16] = 0x40; /* CRC */
	req[17] = 1;    /* revision 1: no RTR to wait for */
	if (write(s, req, sizeof(req)) != sizeof(req))
		FAIL("raw MPA request: %s", strerror(errno));
	waiting = "rdma_get_request of a raw peer's request";
	alarm(10);
	if (rdma_get_request(l, &id))
		FAIL("rdma_get_request: %s", strerror(errno));
	alarm(0);
	struct linger lg = {.l_onoff = 1, .l_linger = 0};
	setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(s); /* a reset */
	usleep(200000);
	waiting = "rdma_accept of a reset peer's request";
	alarm(20);
	int r = rdma_accept(id, NULL);
	alarm(0);
	if (r == 0)
		left(id, RDMA_CM_EVENT_ESTABLISHED, "an accept that returned 0");
	else if (errno == 0)
		FAIL("rdma_accept failed with no errno");
	rdma_destroy_ep(id);
	rdma_destroy_ep(l);
}

static int raw_listener;

/* the raw listener's peer: its MPA request read, then a reset */
static void *resetter(void *arg)
{
	(void)arg;
	int s = accept(raw_listener, NULL, NULL);
	if (s < 0)
		FAIL("raw accept: %s", strerror(errno));
	char b[20];
	size_t got = 0;
	while (got < sizeof(b)) {
		ssize_t n = read(s, b + got, sizeof(b) - got);
		if (n <= 0)
			FAIL("the MPA request: %s", n ? strerror(errno) : "EOF");
		got += n;
	}
	struct linger lg = {.l_onoff = 1, .l_linger = 0};
	setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(s);
	return NULL;
}

/* A synchronous connect to a peer that resets the connection after the
 * MPA request fails with errno, with its event in id->event; to one
 * that accepts the TCP connection and never answers the request it
 * fails with ETIMEDOUT, UNREACHABLE in id->event. */
static void hostile_peers(void)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = loopback(port + 4);
	int one = 1;
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof(a)) || listen(s, 4))
		FAIL("raw listener: %s", strerror(errno));
	raw_listener = s;
	for (int silent = 0; silent < 2; silent++) {
		pthread_t t;
		if (!silent && pthread_create(&t, NULL, resetter, NULL))
			FAIL("pthread_create");
		struct rdma_addrinfo *res = addr(port + 4, 0);
		struct ibv_qp_init_attr ca = qp_attr();
		struct rdma_cm_id *c;
		if (rdma_create_ep(&c, res, NULL, &ca))
			FAIL("rdma_create_ep: %s", strerror(errno));
		rdma_freeaddrinfo(res);
		waiting = silent ? "a synchronous connect to a silent peer" : "a synchronous connect to a peer that resets";
		alarm(40);
		errno = 0;
		int r = rdma_connect(c, NULL);
		alarm(0);
		if (silent && (r == 0 || errno != ETIMEDOUT))
			FAIL("a synchronous connect to a silent peer: %d, %s, want ETIMEDOUT", r, strerror(errno));
		if (!silent && (r == 0 || errno == 0))
			FAIL("a synchronous connect to a peer that resets: %d, %s", r, strerror(errno));
		if (silent)
			left(c, RDMA_CM_EVENT_UNREACHABLE, "a connect to a silent peer");
		else if (!c->event || !c->event->status)
			FAIL("a connect to a peer that resets: its event %s, status 0",
			     c->event ? rdma_event_str(c->event->event) : "none");
		if (!silent)
			join(t, "the resetting peer");
		rdma_destroy_ep(c);
	}
	close(s);
}

/* bad arguments and calls in the wrong state */
static void bad(void)
{
	struct rdma_cm_id *id = NULL, *l;
	struct rdma_addrinfo *res = addr(port + 3, 1);
#define EXPECT_FAIL(call, want)                                                                                        \
	do {                                                                                                           \
		errno = 0;                                                                                             \
		if ((call) == 0 || errno != (want))                                                                    \
			FAIL("%s: %s, want %s", #call, strerror(errno), strerror(want));                                \
	} while (0)
	EXPECT_FAIL(rdma_create_ep(NULL, res, NULL, NULL), EINVAL);
	EXPECT_FAIL(rdma_create_ep(&id, NULL, NULL, NULL), EINVAL);
	EXPECT_FAIL(rdma_get_request(NULL, &id), EINVAL);
	EXPECT_FAIL(rdma_migrate_id(NULL, NULL), EINVAL);
	EXPECT_FAIL(rdma_ack_cm_event(NULL), EINVAL);
	EXPECT_FAIL(rdma_destroy_id(NULL), EINVAL);
	EXPECT_FAIL(rdma_create_qp(NULL, NULL, NULL), EINVAL);
	EXPECT_FAIL(rdma_connect(NULL, NULL), EINVAL);
	EXPECT_FAIL(rdma_accept(NULL, NULL), EINVAL);
	EXPECT_FAIL(rdma_disconnect(NULL), EINVAL);
	rdma_destroy_ep(NULL);
	rdma_destroy_qp(NULL);
	if (rdma_create_ep(&l, res, NULL, NULL))
		FAIL("passive rdma_create_ep: %s", strerror(errno));
	EXPECT_FAIL(rdma_get_request(l, NULL), EINVAL);
	/* not listening: nothing would ever come */
	waiting = "rdma_get_request of an id that does not listen";
	alarm(5);
	EXPECT_FAIL(rdma_get_request(l, &id), EINVAL);
	alarm(0);
	EXPECT_FAIL(rdma_accept(l, NULL), EINVAL);   /* no QP, no request */
	EXPECT_FAIL(rdma_connect(l, NULL), EINVAL);  /* no QP */
	EXPECT_FAIL(rdma_create_qp(l, NULL, NULL), EINVAL);
	EXPECT_FAIL(rdma_resolve_route(l, 2000), EINVAL); /* no address resolved */
	EXPECT_FAIL(rdma_migrate_id(l, NULL), EINVAL);    /* synchronous already */
	rdma_destroy_ep(l);
	/* a passive result with no address, an active one with none */
	struct sockaddr *src = res->ai_src_addr;
	res->ai_src_addr = NULL;
	EXPECT_FAIL(rdma_create_ep(&id, res, NULL, NULL), EINVAL);
	res->ai_src_addr = src;
	rdma_freeaddrinfo(res);
	res = addr(port + 3, 0);
	struct sockaddr *dst = res->ai_dst_addr;
	res->ai_dst_addr = NULL;
	EXPECT_FAIL(rdma_create_ep(&id, res, NULL, NULL), EINVAL);
	res->ai_dst_addr = dst;
	rdma_freeaddrinfo(res);
}

int main(int argc, char **argv)
{
	signal(SIGALRM, hung);
	port = argc > 1 ? atoi(argv[1]) : 7999;

	const char *only = argc > 2 ? argv[2] : NULL;
#define RUN(name) (!only || !strcmp(only, name))

	if (RUN("unread")) {
		struct rdma_event_channel *sch = nonblocking_channel();
		struct rdma_cm_id *l;
		struct sockaddr_in any = {.sin_family = AF_INET, .sin_port = htons(port)};
		if (rdma_create_id(sch, &l, NULL, RDMA_PS_TCP) || rdma_bind_addr(l, (struct sockaddr *)&any) ||
		    rdma_listen(l, 4))
			FAIL("listener: %s", strerror(errno));
		if (!getenv("ONLY_ACCEPT")) unread_outcome(sch, 0);
		unread_outcome(sch, 1);
		rdma_destroy_id(l);
		rdma_destroy_event_channel(sch);
		request_with_listener();
	}
	if (RUN("threads"))
		threads();
	if (RUN("reset"))
		reset_before_accept();
	if (RUN("hostile"))
		hostile_peers();
	if (RUN("bad"))
		bad();
	printf("ok\n");
	return 0;
}
