/*
 * daemondeath: the daemon is killed under a connected QP pair of this
 * process, and nothing waits for ever. Once connected it prints "ready"
 * and waits, blocked in rdma_get_cm_event and in ibv_get_cq_event, for the
 * test to kill the daemon; then every wait ends: each id hears
 * DEVICE_REMOVAL, the completion channel and ibv_poll_cq fail with EIO,
 * ibv_get_async_event gives IBV_EVENT_DEVICE_FATAL, posts fail, a
 * synchronous listener's rdma_get_request fails with ENODEV, and
 * everything can be destroyed but the two channels, kept. It prints
 * "removed" and waits for a line on stdin, sent once a new daemon serves
 * the same socket; then, with the process short of descriptors so that
 * moving the channels to the new daemon fails part way, each try fails
 * whole and a later one, with descriptors to spare, moves both: the kept
 * channels' new ids and a new channel's are the new daemon's, a request
 * from one reaches the other's listener. Prints "ok" and exits 0, or
 * names what failed.
 *
 *   daemondeath PORT
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "check.h"

static struct ibv_comp_channel *cc;
static int cq_wait_errno;

/* blocked in ibv_get_cq_event when the daemon dies */
static void *cq_waiter(void *arg)
{
	(void)arg;
	struct ibv_cq *cq;
	void *cq_ctx;
	cq_wait_errno = ibv_get_cq_event(cc, &cq, &cq_ctx) == 0 ? 0 : errno;
	return NULL;
}

static struct rdma_cm_id *sync_listener;
static int get_request_errno;

/* blocked in rdma_get_request when the daemon dies */
static void *request_waiter(void *arg)
{
	(void)arg;
	struct rdma_cm_id *id;
	get_request_errno = rdma_get_request(sync_listener, &id) == 0 ? 0 : errno;
	return NULL;
}

static void line(void)
{
	char b[16];
	if (!fgets(b, sizeof(b), stdin))
		FAIL("stdin closed");
}

int main(int argc, char **argv)
{
	alarm(120);
	int port = argc > 1 ? atoi(argv[1]) : 7999;
	struct rdma_event_channel *sch = rdma_create_event_channel(), *cch = rdma_create_event_channel();
	if (!sch || !cch)
		FAIL("rdma_create_event_channel: %s", strerror(errno));
	struct rdma_cm_id *listener, *cli, *srv;
	if (rdma_create_id(sch, &listener, NULL, RDMA_PS_TCP) || rdma_create_id(cch, &cli, NULL, RDMA_PS_TCP))
		FAIL("rdma_create_id: %s", strerror(errno));
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	a.sin_addr.s_addr = htonl(0x7f000001);
	if (rdma_bind_addr(listener, (struct sockaddr *)&a) || rdma_listen(listener, 4))
		FAIL("bind/listen: %s", strerror(errno));
	if (rdma_resolve_addr(cli, NULL, (struct sockaddr *)&a, 2000))
		FAIL("rdma_resolve_addr: %s", strerror(errno));
	rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(cli, 2000))
		FAIL("rdma_resolve_route");
	rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	struct ibv_context *vc = cli->verbs;
	struct ibv_pd *pd = ibv_alloc_pd(vc);
	cc = ibv_create_comp_channel(vc);
	struct ibv_cq *ccq = ibv_create_cq(vc, 16, NULL, NULL, 0), *scq = ibv_create_cq(vc, 16, NULL, cc, 0);
	if (!pd || !cc || !ccq || !scq)
		FAIL("pd/cq: %s", strerror(errno));
	struct ibv_qp_init_attr qa = {.send_cq = ccq, .recv_cq = ccq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
	if (rdma_create_qp(cli, pd, &qa) || rdma_connect(cli, NULL))
		FAIL("client qp/connect: %s", strerror(errno));
	struct rdma_cm_event *req = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	srv = req->id;
	rdma_ack_cm_event(req);
	struct ibv_qp_init_attr sa = qa;
	sa.send_cq = sa.recv_cq = scq;
	if (rdma_create_qp(srv, pd, &sa) || rdma_accept(srv, NULL))
		FAIL("server qp/accept: %s", strerror(errno));
	rdma_ack_cm_event(expect(sch, RDMA_CM_EVENT_ESTABLISHED));
	rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ESTABLISHED));
	static char buf[64];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		FAIL("ibv_reg_mr: %s", strerror(errno));
	struct ibv_sge sg = {.addr = (uintptr_t)buf, .length = sizeof(buf), .lkey = mr->lkey};
	struct ibv_recv_wr rw = {.wr_id = 1, .sg_list = &sg, .num_sge = 1}, *rbad;
	if (ibv_post_recv(srv->qp, &rw, &rbad) || ibv_req_notify_cq(scq, 0))
		FAIL("post_recv/notify");
	pthread_t waiter, requests;
	if (pthread_create(&waiter, NULL, cq_waiter, NULL))
		FAIL("pthread_create");
	char sport[16];
	snprintf(sport, sizeof(sport), "%d", port + 1);
	struct rdma_addrinfo hints = {.ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP}, *res;
	if (rdma_getaddrinfo("127.0.0.1", sport, &hints, &res) || rdma_create_ep(&sync_listener, res, NULL, NULL) ||
	    rdma_listen(sync_listener, 1))
		FAIL("synchronous listener: %s", strerror(errno));
	rdma_freeaddrinfo(res);
	if (pthread_create(&requests, NULL, request_waiter, NULL))
		FAIL("pthread_create");

	printf("ready\n");
	fflush(stdout);
	/* blocked here when the daemon is killed */
	rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_DEVICE_REMOVAL));
	pthread_join(waiter, NULL);
	if (cq_wait_errno != EIO)
		FAIL("ibv_get_cq_event ended with %s, want EIO", strerror(cq_wait_errno));
	pthread_join(requests, NULL);
	if (get_request_errno != ENODEV)
		FAIL("rdma_get_request ended with %s, want ENODEV", strerror(get_request_errno));
	rdma_destroy_ep(sync_listener);
	struct ibv_async_event ae;
	if (ibv_get_async_event(vc, &ae) || ae.event_type != IBV_EVENT_DEVICE_FATAL)
		FAIL("ibv_get_async_event: %s, event %d", strerror(errno), ae.event_type);
	ibv_ack_async_event(&ae);
	struct pollfd pf = {.fd = vc->async_fd, .events = POLLIN};
	if (poll(&pf, 1, 0) != 1)
		FAIL("async_fd not readable after the fatal event");
	if (ibv_get_async_event(vc, &ae) == 0 || errno != EIO)
		FAIL("second ibv_get_async_event: %s, want EIO", strerror(errno));
	struct ibv_send_wr sw = {.wr_id = 2, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND}, *sbad;
	int err = ibv_post_send(cli->qp, &sw, &sbad);
	if (err != EIO || sbad != &sw)
		FAIL("ibv_post_send after the daemon died: %s", strerror(err));
	struct ibv_wc wc;
	int n = 0;
	for (long i = 0; i < 100000000 && (n = ibv_poll_cq(ccq, 1, &wc)) == 0; i++)
		;
	if (n >= 0)
		FAIL("ibv_poll_cq after the daemon died: %d, want an error", n);
	/* the listener and the server's id hear it too, then the channels
	 * have nothing more */
	for (int k = 0; k < 2; k++) {
		struct rdma_cm_event *e = expect(sch, RDMA_CM_EVENT_DEVICE_REMOVAL);
		if (e->id != listener && e->id != srv)
			FAIL("DEVICE_REMOVAL for an id of the other channel");
		rdma_ack_cm_event(e);
	}
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(sch, &e) == 0 || errno != ENODEV)
		FAIL("server channel after its removals: %s, want ENODEV", strerror(errno));
	if (rdma_get_cm_event(cch, &e) == 0 || errno != ENODEV)
		FAIL("client channel after its removal: %s, want ENODEV", strerror(errno));
	/* everything goes */
	if (ibv_dereg_mr(mr))
		FAIL("ibv_dereg_mr");
	rdma_destroy_qp(cli);
	rdma_destroy_qp(srv);
	if (ibv_destroy_cq(ccq) || ibv_destroy_cq(scq) || ibv_destroy_comp_channel(cc) || ibv_dealloc_pd(pd))
		FAIL("destroy cq/channel/pd: %s", strerror(errno));
	if (rdma_destroy_id(cli) || rdma_destroy_id(srv) || rdma_destroy_id(listener))
		FAIL("rdma_destroy_id: %s", strerror(errno));
	/* sch and cch are kept, as a program that keeps its channels for its
	 * life */

	printf("removed\n");
	fflush(stdout);
	line();
	/* a new daemon on the socket. Short of descriptors, the move to it
	 * fails at some point for each number spared: the new session, an
	 * EVD of the first channel moved, of the second; whatever failed,
	 * a try with more to spare must move both. */
	struct rdma_cm_id *lid, *cid, *kid;
	static int filler[4096];
	int moved = 0;
	/* a table the fillers can fill, whatever the host's limit */
	struct rlimit lim, low;
	if (getrlimit(RLIMIT_NOFILE, &lim))
		FAIL("getrlimit: %s", strerror(errno));
	low = lim;
	if (low.rlim_cur > 2048)
		low.rlim_cur = 2048;
	if (setrlimit(RLIMIT_NOFILE, &low))
		FAIL("setrlimit: %s", strerror(errno));
	for (int spare = 0; spare < 64 && !moved; spare++) {
		int n = 0;
		while (n < (int)(sizeof(filler) / sizeof(filler[0])) && (filler[n] = dup(0)) >= 0)
			n++;
		if (errno != EMFILE)
			FAIL("filling the descriptor table: %s", strerror(errno));
		for (int k = 0; k < spare && n > 0; k++)
			close(filler[--n]);
		moved = rdma_create_id(cch, &lid, NULL, RDMA_PS_TCP) == 0;
		int err = errno;
		while (n > 0)
			close(filler[--n]);
		if (!moved && err == 0)
			FAIL("after the restart, short of descriptors: a failure with no errno");
	}
	if (!moved)
		FAIL("after the restart: no id with 64 descriptors to spare");
	if (setrlimit(RLIMIT_NOFILE, &lim))
		FAIL("setrlimit back: %s", strerror(errno));
	/* the kept channels' events are the new daemon's: the second's id
	 * resolves an address */
	if (rdma_create_id(sch, &kid, NULL, RDMA_PS_TCP) || rdma_resolve_addr(kid, NULL, (struct sockaddr *)&a, 2000))
		FAIL("after the restart: the second kept channel's id: %s", strerror(errno));
	struct pollfd kp = {.fd = sch->fd, .events = POLLIN};
	if (poll(&kp, 1, 20000) != 1)
		FAIL("after the restart: no event on the second kept channel in 20 s");
	rdma_ack_cm_event(expect(sch, RDMA_CM_EVENT_ADDR_RESOLVED));
	rdma_destroy_id(kid);
	/* and so are a new channel's; the daemon's events reach both */
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch || rdma_create_id(ch, &cid, NULL, RDMA_PS_TCP))
		FAIL("after the restart: channel/ids: %s", strerror(errno));
	if (rdma_bind_addr(lid, (struct sockaddr *)&a) || rdma_listen(lid, 4))
		FAIL("after the restart: bind/listen: %s", strerror(errno));
	if (rdma_resolve_addr(cid, NULL, (struct sockaddr *)&a, 2000))
		FAIL("after the restart: resolve: %s", strerror(errno));
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(cid, 2000))
		FAIL("after the restart: route");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	struct ibv_pd *pd2 = ibv_alloc_pd(cid->verbs);
	struct ibv_cq *cq2 = pd2 ? ibv_create_cq(cid->verbs, 16, NULL, NULL, 0) : NULL;
	struct ibv_qp_init_attr qa2 = qa;
	qa2.send_cq = qa2.recv_cq = cq2;
	if (!cq2 || rdma_create_qp(cid, pd2, &qa2) || rdma_connect(cid, NULL))
		FAIL("after the restart: connect: %s", strerror(errno));
	struct rdma_cm_event *req2 = expect(cch, RDMA_CM_EVENT_CONNECT_REQUEST);
	if (req2->listen_id != lid)
		FAIL("after the restart: a request for another id");
	if (rdma_reject(req2->id, NULL, 0))
		FAIL("after the restart: reject: %s", strerror(errno));
	rdma_ack_cm_event(req2);
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_REJECTED));
	rdma_destroy_qp(cid);
	ibv_destroy_cq(cq2);
	ibv_dealloc_pd(pd2);
	rdma_destroy_id(cid);
	rdma_destroy_id(lid);
	rdma_destroy_event_channel(ch);
	rdma_destroy_event_channel(cch);
	rdma_destroy_event_channel(sch);
	printf("ok\n");
	return 0;
}
