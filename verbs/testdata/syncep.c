/*
 * syncep: the RDMA-CM calls rdma_verbs.h's programs make (rdma_server,
 * rdma_client, cmtime), as rdma-core's librdmacm does them:
 *   - rdma_get_devices lists the one device;
 *   - rdma_create_ep makes synchronous ids: a passive one keeps its QP
 *     attributes for rdma_get_request, an active one has its QP, with CQs
 *     and completion channels made for it; rdma_connect, rdma_accept and
 *     rdma_disconnect return once their event came, left in id->event;
 *     a refused connect is ECONNREFUSED; a listener may go before the id
 *     of its request;
 *   - rdma_create_qp makes the CQs the attributes leave NULL, and
 *     rdma_destroy_qp ends only those;
 *   - rdma_migrate_id moves an id and its pending events to another
 *     channel, or makes it synchronous;
 *   - an id whose QP is destroyed after rdma_disconnect hears
 *     DISCONNECTED once (cmtime waits for it).
 * Prints "ok" and exits 0, or names what failed.
 *
 *   syncep PORT
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

static char port[16], closed_port[16];

static struct ibv_qp_init_attr qp_attr(void)
{
	struct ibv_qp_init_attr a = {.cap = {.max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1},
				     .qp_type = IBV_QPT_RC, .sq_sig_all = 1};
	return a;
}

static struct rdma_addrinfo *addr(const char *p, int passive)
{
	struct rdma_addrinfo hints = {.ai_port_space = RDMA_PS_TCP, .ai_flags = passive ? RAI_PASSIVE : 0}, *res;
	if (rdma_getaddrinfo("127.0.0.1", p, &hints, &res))
		FAIL("rdma_getaddrinfo %s: %s", p, strerror(errno));
	return res;
}

/* one completion of the id's CQ, by rdma_verbs.h's wait on its channel */
static void comp(struct rdma_cm_id *id, int recv, const char *what)
{
	struct ibv_wc wc;
	int n = recv ? rdma_get_recv_comp(id, &wc) : rdma_get_send_comp(id, &wc);
	if (n != 1 || wc.status != IBV_WC_SUCCESS)
		FAIL("%s: %d, status %s", what, n, n == 1 ? ibv_wc_status_str(wc.status) : strerror(errno));
}

/* the event a synchronous call left in id->event must be want */
static void left(struct rdma_cm_id *id, enum rdma_cm_event_type want, const char *after)
{
	if (!id->event || id->event->event != want)
		FAIL("id->event after %s: %s, want %s", after, id->event ? rdma_event_str(id->event->event) : "none",
		     rdma_event_str(want));
}

static void *client(void *arg)
{
	struct rdma_addrinfo *res = addr(port, 0);
	struct ibv_qp_init_attr a = qp_attr();
	struct rdma_cm_id *id;
	if (rdma_create_ep(&id, res, NULL, &a))
		FAIL("client rdma_create_ep: %s", strerror(errno));
	rdma_freeaddrinfo(res);
	if (!id->qp || !id->pd || !id->send_cq || !id->recv_cq || !id->send_cq_channel || !id->recv_cq_channel ||
	    id->send_cq == id->recv_cq)
		FAIL("client ep: qp %p pd %p CQs %p %p channels %p %p", (void *)id->qp, (void *)id->pd,
		     (void *)id->send_cq, (void *)id->recv_cq, (void *)id->send_cq_channel, (void *)id->recv_cq_channel);
	if (a.send_cq != id->send_cq || a.recv_cq != id->recv_cq)
		FAIL("the attributes were not given back with the CQs made");
	char buf[32] = "ping";
	struct ibv_mr *mr = rdma_reg_msgs(id, buf, sizeof(buf));
	if (!mr)
		FAIL("client rdma_reg_msgs: %s", strerror(errno));
	if (rdma_post_recv(id, NULL, buf + 16, 16, mr))
		FAIL("client rdma_post_recv: %s", strerror(errno));
	struct rdma_conn_param p = {.private_data = "hello", .private_data_len = 6};
	if (rdma_connect(id, &p))
		FAIL("client rdma_connect: %s", strerror(errno));
	left(id, RDMA_CM_EVENT_ESTABLISHED, "the client's connect");
	if (id->event->param.conn.private_data_len < 8 || memcmp(id->event->param.conn.private_data, "welcome", 8))
		FAIL("client: the server's private data not in id->event");
	if (rdma_post_send(id, NULL, buf, 16, mr, 0))
		FAIL("client rdma_post_send: %s", strerror(errno));
	comp(id, 0, "client send");
	comp(id, 1, "client receive");
	if (strcmp(buf + 16, "pong"))
		FAIL("client received %.16s", buf + 16);
	if (rdma_disconnect(id))
		FAIL("client rdma_disconnect: %s", strerror(errno));
	left(id, RDMA_CM_EVENT_DISCONNECTED, "the client's disconnect");
	rdma_dereg_mr(mr);
	rdma_destroy_ep(id);
	return NULL;
}

int main(int argc, char **argv)
{
	snprintf(port, sizeof(port), "%s", argc > 1 ? argv[1] : "7999");
	snprintf(closed_port, sizeof(closed_port), "%d", atoi(port) + 1);

	int n = -1;
	struct ibv_context **devs = rdma_get_devices(&n);
	if (!devs || n != 1 || !devs[0] || devs[1] || !devs[0]->device)
		FAIL("rdma_get_devices: %d devices", n);
	rdma_free_devices(devs);

	/* the passive ep and the request's id */
	struct rdma_addrinfo *res = addr(port, 1);
	struct ibv_qp_init_attr la = qp_attr();
	la.cap.max_inline_data = 16;
	struct rdma_cm_id *listen, *id;
	if (rdma_create_ep(&listen, res, NULL, &la))
		FAIL("passive rdma_create_ep: %s", strerror(errno));
	rdma_freeaddrinfo(res);
	if (listen->qp || !listen->pd)
		FAIL("passive ep: qp %p pd %p", (void *)listen->qp, (void *)listen->pd);
	if (rdma_listen(listen, 4))
		FAIL("rdma_listen: %s", strerror(errno));
	pthread_t t;
	if (pthread_create(&t, NULL, client, NULL))
		FAIL("pthread_create");
	if (rdma_get_request(listen, &id))
		FAIL("rdma_get_request: %s", strerror(errno));
	if (!id->qp || !id->send_cq || !id->recv_cq || id->channel == listen->channel)
		FAIL("the request's id: qp %p, CQs %p %p, its listener's channel: %d", (void *)id->qp, (void *)id->send_cq,
		     (void *)id->recv_cq, id->channel == listen->channel);
	if (!id->event || id->event->event != RDMA_CM_EVENT_CONNECT_REQUEST ||
	    id->event->param.conn.private_data_len < 6 || memcmp(id->event->param.conn.private_data, "hello", 6))
		FAIL("the request's id->event is not its request with the client's private data");
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	if (ibv_query_qp(id->qp, &qa, IBV_QP_CAP, &qi) || qi.cap.max_inline_data < 16)
		FAIL("the request's QP: max_inline_data %u, want the listener's 16", qi.cap.max_inline_data);
	char buf[32] = "pong";
	struct ibv_mr *mr = rdma_reg_msgs(id, buf, sizeof(buf));
	if (!mr || rdma_post_recv(id, NULL, buf + 16, 16, mr))
		FAIL("server reg/post_recv: %s", strerror(errno));
	struct rdma_conn_param p = {.private_data = "welcome", .private_data_len = 8};
	if (rdma_accept(id, &p))
		FAIL("rdma_accept: %s", strerror(errno));
	left(id, RDMA_CM_EVENT_ESTABLISHED, "accept");
	comp(id, 1, "server receive");
	if (strcmp(buf + 16, "ping"))
		FAIL("server received %.16s", buf + 16);
	if (rdma_post_send(id, NULL, buf, 16, mr, IBV_SEND_INLINE))
		FAIL("server rdma_post_send: %s", strerror(errno));
	comp(id, 0, "server send");
	pthread_join(t, NULL);
	/* the client disconnected: the server's disconnect finds it over */
	if (rdma_disconnect(id))
		FAIL("server rdma_disconnect: %s", strerror(errno));
	/* the listener goes first: the request's id holds its own event */
	rdma_destroy_ep(listen);
	rdma_dereg_mr(mr);
	rdma_destroy_ep(id);

	/* an asynchronous id has no rdma_get_request */
	struct rdma_event_channel *ch1 = nonblocking_channel(), *ch2 = nonblocking_channel();
	struct rdma_cm_id *a;
	if (rdma_create_id(ch1, &a, NULL, RDMA_PS_TCP))
		FAIL("rdma_create_id: %s", strerror(errno));
	if (rdma_get_request(a, &id) == 0 || errno != EINVAL)
		FAIL("rdma_get_request of an asynchronous id: %s", strerror(errno));

	/* a refused synchronous connect (after RETRY_REFUSED_US) */
	res = addr(closed_port, 0);
	struct ibv_qp_init_attr ca = qp_attr();
	struct rdma_cm_id *c;
	if (rdma_create_ep(&c, res, NULL, &ca))
		FAIL("rdma_create_ep to a closed port: %s", strerror(errno));
	rdma_freeaddrinfo(res);
	if (rdma_connect(c, NULL) == 0 || errno != ECONNREFUSED)
		FAIL("synchronous connect to a closed port: %s, want ECONNREFUSED", strerror(errno));
	left(c, RDMA_CM_EVENT_REJECTED, "a refused connect");
	rdma_destroy_ep(c);

	/* an id of another type is not iWARP's */
	res = addr(port, 0);
	res->ai_qp_type = IBV_QPT_UD;
	if (rdma_create_ep(&c, res, NULL, NULL) == 0 || errno != EOPNOTSUPP)
		FAIL("rdma_create_ep of a UD QP: %s", strerror(errno));
	rdma_freeaddrinfo(res);

	/* migrate: the pending ADDR_RESOLVED goes with the id */
	struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(atoi(port))};
	dst.sin_addr.s_addr = htonl(0x7f000001);
	if (rdma_resolve_addr(a, NULL, (struct sockaddr *)&dst, 2000))
		FAIL("rdma_resolve_addr: %s", strerror(errno));
	if (rdma_migrate_id(a, ch2) || a->channel != ch2)
		FAIL("rdma_migrate_id: %s", strerror(errno));
	rdma_ack_cm_event(wait_event(ch2, RDMA_CM_EVENT_ADDR_RESOLVED));
	no_event(ch1, 0, "the channel an id left");
	/* to synchronous: its calls wait for their events */
	if (rdma_migrate_id(a, NULL) || a->channel == ch2)
		FAIL("rdma_migrate_id to synchronous: %s", strerror(errno));
	if (rdma_migrate_id(a, NULL) == 0 || errno != EINVAL)
		FAIL("rdma_migrate_id of a synchronous id to none: %s", strerror(errno));
	if (rdma_resolve_route(a, 2000) || !a->event || a->event->event != RDMA_CM_EVENT_ROUTE_RESOLVED)
		FAIL("synchronous rdma_resolve_route: %s", strerror(errno));
	if (rdma_notify(a, IBV_EVENT_COMM_EST))
		FAIL("rdma_notify: %s", strerror(errno));

	/* rdma_create_qp makes the CQ left NULL, and rdma_destroy_qp ends
	 * only that one */
	struct ibv_cq *mine = ibv_create_cq(a->verbs, 4, NULL, NULL, 0);
	struct ibv_qp_init_attr ma = qp_attr();
	ma.send_cq = mine;
	if (!mine || rdma_create_qp(a, NULL, &ma))
		FAIL("rdma_create_qp with one CQ: %s", strerror(errno));
	if (a->send_cq || !a->recv_cq || ma.recv_cq != a->recv_cq || ma.send_cq != mine)
		FAIL("CQs: id's %p %p, attributes' %p %p", (void *)a->send_cq, (void *)a->recv_cq, (void *)ma.send_cq,
		     (void *)ma.recv_cq);
	if (rdma_migrate_id(a, ch1) == 0 || errno != EOPNOTSUPP)
		FAIL("rdma_migrate_id of an id with a QP: %s", strerror(errno));
	rdma_destroy_qp(a);
	if (a->recv_cq || a->recv_cq_channel)
		FAIL("rdma_destroy_qp left the CQ it made");
	if (ibv_destroy_cq(mine))
		FAIL("the application's CQ after rdma_destroy_qp: %s", strerror(errno));
	rdma_destroy_id(a);

	/* cmtime's end: disconnect, destroy the QP at once, then wait for
	 * DISCONNECTED, which comes once */
	struct rdma_event_channel *sch = nonblocking_channel();
	struct rdma_cm_id *l2, *cli, *srv;
	struct sockaddr_in any = {.sin_family = AF_INET, .sin_port = htons(atoi(port))};
	if (rdma_create_id(sch, &l2, NULL, RDMA_PS_TCP) || rdma_bind_addr(l2, (struct sockaddr *)&any) ||
	    rdma_listen(l2, 4))
		FAIL("listener: %s", strerror(errno));
	if (rdma_create_id(ch1, &cli, NULL, RDMA_PS_TCP) || rdma_resolve_addr(cli, NULL, (struct sockaddr *)&dst, 2000))
		FAIL("client id: %s", strerror(errno));
	rdma_ack_cm_event(wait_event(ch1, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(cli, 2000))
		FAIL("route: %s", strerror(errno));
	rdma_ack_cm_event(wait_event(ch1, RDMA_CM_EVENT_ROUTE_RESOLVED));
	struct ibv_qp_init_attr xa = qp_attr();
	if (rdma_create_qp(cli, NULL, &xa) || rdma_connect(cli, NULL))
		FAIL("connect: %s", strerror(errno));
	struct rdma_cm_event *req = wait_event(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	srv = req->id;
	rdma_ack_cm_event(req);
	struct ibv_qp_init_attr sa = qp_attr();
	if (rdma_create_qp(srv, NULL, &sa) || rdma_accept(srv, NULL))
		FAIL("accept: %s", strerror(errno));
	rdma_ack_cm_event(wait_event(ch1, RDMA_CM_EVENT_ESTABLISHED));
	if (rdma_disconnect(cli))
		FAIL("rdma_disconnect: %s", strerror(errno));
	rdma_destroy_qp(cli);
	struct rdma_cm_event *dis = wait_event(ch1, RDMA_CM_EVENT_DISCONNECTED);
	if (dis->id != cli)
		FAIL("DISCONNECTED for another id");
	rdma_ack_cm_event(dis);
	no_event(ch1, 500, "a second event after DISCONNECTED");
	rdma_destroy_id(cli);
	rdma_destroy_qp(srv);
	rdma_destroy_id(srv);
	rdma_destroy_id(l2);
	rdma_destroy_event_channel(sch);
	rdma_destroy_event_channel(ch1);
	rdma_destroy_event_channel(ch2);
	printf("ok\n");
	return 0;
}
