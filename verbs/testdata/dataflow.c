/*
 * dataflow: one process, two RDMA-CM ids connected over the daemon's
 * interface (loopback in the test), every kind of transfer checked octet
 * for octet, through softrnic's libibverbs and librdmacm as an
 * application sees them. Prints "ok" and exits 0, or names what failed.
 *
 *   dataflow PORT
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static void ok_wc(struct ibv_wc wc, enum ibv_wc_opcode op, uint64_t id)
{
	if (wc.status != IBV_WC_SUCCESS || wc.opcode != op || wc.wr_id != id)
		FAIL("completion %s opcode %d id %lu, want opcode %d id %lu", ibv_wc_status_str(wc.status), wc.opcode,
		     (unsigned long)wc.wr_id, op, (unsigned long)id);
}

struct heap_struct {
	char before[8];
	char field[16]; /* registered alone */
	char after[8];
};

int main(int argc, char **argv)
{
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

	/* the client resolves, makes its QP, connects */
	if (rdma_resolve_addr(cli, NULL, (struct sockaddr *)&a, 2000))
		FAIL("rdma_resolve_addr: %s", strerror(errno));
	/* the channel's descriptor is pollable: the event is there */
	struct pollfd pf = {.fd = cch->fd, .events = POLLIN};
	if (poll(&pf, 1, 5000) != 1)
		FAIL("channel not readable after resolve_addr");
	rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(cli, 2000))
		FAIL("rdma_resolve_route: %s", strerror(errno));
	rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	/* non-blocking: nothing waits now */
	fcntl(cch->fd, F_SETFL, fcntl(cch->fd, F_GETFL) | O_NONBLOCK);
	struct rdma_cm_event *none;
	if (rdma_get_cm_event(cch, &none) == 0 || errno != EAGAIN)
		FAIL("non-blocking channel with nothing: %s", strerror(errno));
	fcntl(cch->fd, F_SETFL, fcntl(cch->fd, F_GETFL) & ~O_NONBLOCK);

	struct ibv_pd *pd = ibv_alloc_pd(cli->verbs);
	struct ibv_comp_channel *cc = ibv_create_comp_channel(cli->verbs);
	struct ibv_cq *ccq = ibv_create_cq(cli->verbs, 64, NULL, NULL, 0);
	struct ibv_cq *scq = ibv_create_cq(cli->verbs, 64, NULL, cc, 0);
	if (!pd || !cc || !ccq || !scq)
		FAIL("pd/cq: %s", strerror(errno));
	struct ibv_qp_init_attr qa = {.send_cq = ccq, .recv_cq = ccq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2, .max_recv_sge = 2,
					      .max_inline_data = 64}};
	if (rdma_create_qp(cli, pd, &qa))
		FAIL("rdma_create_qp client: %s", strerror(errno));
	if (qa.cap.max_inline_data < 64)
		FAIL("max_inline_data %u", qa.cap.max_inline_data);
	const char pdata[] = "hello from the client";
	struct rdma_conn_param cp = {.private_data = pdata, .private_data_len = sizeof(pdata), .responder_resources = 4,
				     .initiator_depth = 4};
	if (rdma_connect(cli, &cp))
		FAIL("rdma_connect: %s", strerror(errno));

	/* the server takes the request with its private data */
	struct rdma_cm_event *req = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	srv = req->id;
	if (req->listen_id != listener || req->param.conn.private_data_len < sizeof(pdata) ||
	    memcmp(req->param.conn.private_data, pdata, sizeof(pdata)))
		FAIL("request: listen id %p (want %p), private data %d octets", (void *)req->listen_id, (void *)listener,
		     req->param.conn.private_data_len);
	rdma_ack_cm_event(req);
	struct ibv_qp_init_attr sa = {.send_cq = scq, .recv_cq = scq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1}};
	if (rdma_create_qp(srv, pd, &sa))
		FAIL("rdma_create_qp server: %s", strerror(errno));

	/* memory: a 16-octet field in the middle of a heap struct, alone */
	struct heap_struct *hs = malloc(sizeof(*hs) + 3);
	hs = (struct heap_struct *)((char *)hs + 3); /* unaligned */
	memset(hs->before, 'b', 8);
	memset(hs->field, 'f', 16);
	memset(hs->after, 'a', 8);
	struct ibv_mr *fmr = ibv_reg_mr(pd, hs->field, 16, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
							      IBV_ACCESS_REMOTE_READ);
	char *sbuf = calloc(1, 8192), *cbuf = calloc(1, 8192);
	struct ibv_mr *smr = ibv_reg_mr(pd, sbuf, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
							   IBV_ACCESS_REMOTE_WRITE);
	struct ibv_mr *cmr = ibv_reg_mr(pd, cbuf, 8192, IBV_ACCESS_LOCAL_WRITE);
	if (!fmr || !smr || !cmr)
		FAIL("ibv_reg_mr: %s", strerror(errno));
	if (ibv_reg_mr(pd, (void *)16, 4096, IBV_ACCESS_LOCAL_WRITE) || errno != EFAULT)
		FAIL("registering unmapped memory: %s, want EFAULT", strerror(errno));

	/* a receive posted before accepting */
	struct ibv_sge rs = {.addr = (uintptr_t)sbuf, .length = 4096, .lkey = smr->lkey};
	struct ibv_recv_wr rw = {.wr_id = 7, .sg_list = &rs, .num_sge = 1}, *bad;
	if (ibv_post_recv(srv->qp, &rw, &bad))
		FAIL("ibv_post_recv");
	if (rdma_accept(srv, NULL))
		FAIL("rdma_accept: %s", strerror(errno));
	rdma_ack_cm_event(expect(sch, RDMA_CM_EVENT_ESTABLISHED));
	rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ESTABLISHED));
	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	if (ibv_query_qp(cli->qp, &qattr, IBV_QP_STATE, &qinit) || qattr.qp_state != IBV_QPS_RTS)
		FAIL("client QP state %d, want RTS", qattr.qp_state);

	/* a fork: the child's copy of the field is its own */
	int pipefd[2];
	if (pipe(pipefd))
		FAIL("pipe");
	pid_t child = fork();
	if (child == 0) {
		memset(hs->field, 'C', 16);
		char c;
		if (read(pipefd[0], &c, 1) != 1)
			_exit(2);
		for (int i = 0; i < 16; i++)
			if (hs->field[i] != 'C')
				_exit(3);
		_exit(0);
	}

	/* RDMA Write into the field */
	if (ibv_req_notify_cq(scq, 0))
		FAIL("ibv_req_notify_cq");
	const char *w16 = "0123456789abcdef";
	memcpy(cbuf, w16, 16);
	struct ibv_sge ws = {.addr = (uintptr_t)cbuf, .length = 16, .lkey = cmr->lkey};
	struct ibv_send_wr sw = {.wr_id = 1, .sg_list = &ws, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED};
	sw.wr.rdma.remote_addr = (uintptr_t)hs->field;
	sw.wr.rdma.rkey = fmr->rkey;
	if (ibv_post_send(cli->qp, &sw, (struct ibv_send_wr **)&bad))
		FAIL("post write");
	ok_wc(wait_wc(ccq), IBV_WC_RDMA_WRITE, 1);
	/* the Write's completion says it left, not that it landed: watch
	 * the last octet, as ib_write_lat does */
	for (int i = 0; i < 100000 && ((volatile char *)hs->field)[15] == 'f'; i++)
		usleep(50);
	if (memcmp(hs->field, w16, 16))
		FAIL("the field holds %.16s", hs->field);
	for (int i = 0; i < 8; i++)
		if (hs->before[i] != 'b' || hs->after[i] != 'a')
			FAIL("a neighbour of the field changed");
	if (write(pipefd[1], "x", 1) != 1)
		FAIL("pipe");
	int st = 0;
	waitpid(child, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		FAIL("the child's copy of the field changed (status %d)", st);

	/* a Send, inline: the buffer is overwritten at once after posting */
	char line[48];
	memset(line, 'i', sizeof(line));
	struct ibv_sge is = {.addr = (uintptr_t)line, .length = sizeof(line), .lkey = 0};
	struct ibv_send_wr iw = {.wr_id = 2, .sg_list = &is, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE};
	if (ibv_post_send(cli->qp, &iw, (struct ibv_send_wr **)&bad))
		FAIL("post inline send");
	memset(line, 'X', sizeof(line));
	ok_wc(wait_wc(ccq), IBV_WC_SEND, 2);
	/* the completion channel says so */
	pf.fd = cc->fd;
	if (poll(&pf, 1, 5000) != 1)
		FAIL("completion channel not readable");
	struct ibv_cq *ecq;
	void *ectx;
	if (ibv_get_cq_event(cc, &ecq, &ectx) || ecq != scq)
		FAIL("ibv_get_cq_event");
	ibv_ack_cq_events(ecq, 1);
	struct ibv_wc wc = wait_wc(scq);
	ok_wc(wc, IBV_WC_RECV, 7);
	if (wc.byte_len != sizeof(line) || wc.qp_num != srv->qp->qp_num)
		FAIL("receive of %u octets on QP %u", wc.byte_len, wc.qp_num);
	for (size_t i = 0; i < sizeof(line); i++)
		if (sbuf[i] != 'i')
			FAIL("received octet %zu is %c", i, sbuf[i]);

	/* RDMA Read of 8 KiB, two SGEs on the client's side of a Write first */
	for (int i = 0; i < 8192; i++)
		sbuf[i] = (char)(i * 7 + 1);
	struct ibv_sge rd = {.addr = (uintptr_t)cbuf, .length = 8192, .lkey = cmr->lkey};
	struct ibv_send_wr rr = {.wr_id = 3, .sg_list = &rd, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
				 .send_flags = IBV_SEND_SIGNALED};
	rr.wr.rdma.remote_addr = (uintptr_t)sbuf;
	rr.wr.rdma.rkey = smr->rkey;
	if (ibv_post_send(cli->qp, &rr, (struct ibv_send_wr **)&bad))
		FAIL("post read");
	ok_wc(wait_wc(ccq), IBV_WC_RDMA_READ, 3);
	if (memcmp(cbuf, sbuf, 8192))
		FAIL("read data differs");

	/* atomics, which the device says it has (atomic with respect to the
	 * daemon's other atomics: IBV_ATOMIC_HCA), on an aligned word */
	struct ibv_device_attr da;
	if (ibv_query_device(cli->verbs, &da) || da.atomic_cap != IBV_ATOMIC_HCA)
		FAIL("atomic_cap %d, want IBV_ATOMIC_HCA", da.atomic_cap);
	uint64_t *word = aligned_alloc(8, 8);
	*word = 100;
	struct ibv_mr *amr = ibv_reg_mr(pd, word, 8, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
	if (!amr)
		FAIL("ibv_reg_mr for atomics: %s", strerror(errno));
	struct {
		enum ibv_wr_opcode op;
		uint64_t compare_add, swap, old, now;
	} atomics[] = {
		{IBV_WR_ATOMIC_FETCH_AND_ADD, 5, 0, 100, 105},
		{IBV_WR_ATOMIC_CMP_AND_SWP, 104, 1, 105, 105}, /* no match: nothing stored */
		{IBV_WR_ATOMIC_CMP_AND_SWP, 105, 7, 105, 7},
	};
	for (size_t k = 0; k < sizeof(atomics) / sizeof(atomics[0]); k++) {
		struct ibv_sge as = {.addr = (uintptr_t)cbuf, .length = 8, .lkey = cmr->lkey};
		struct ibv_send_wr aw = {.wr_id = 10 + k, .sg_list = &as, .num_sge = 1, .opcode = atomics[k].op,
					 .send_flags = IBV_SEND_SIGNALED};
		aw.wr.atomic.remote_addr = (uintptr_t)word;
		aw.wr.atomic.rkey = amr->rkey;
		aw.wr.atomic.compare_add = atomics[k].compare_add;
		aw.wr.atomic.swap = atomics[k].swap;
		if (ibv_post_send(cli->qp, &aw, (struct ibv_send_wr **)&bad))
			FAIL("post atomic %zu: %s", k, strerror(errno));
		ok_wc(wait_wc(ccq), atomics[k].op == IBV_WR_ATOMIC_FETCH_AND_ADD ? IBV_WC_FETCH_ADD : IBV_WC_COMP_SWAP,
		      10 + k);
		uint64_t old;
		memcpy(&old, cbuf, 8);
		if (old != atomics[k].old || *(volatile uint64_t *)word != atomics[k].now)
			FAIL("atomic %zu: returned %llu (want %llu), word %llu (want %llu)", k, (unsigned long long)old,
			     (unsigned long long)atomics[k].old, (unsigned long long)*word,
			     (unsigned long long)atomics[k].now);
	}
	ibv_dereg_mr(amr);

	/* a bad local key completes in error, and the connection ends */
	struct ibv_sge bs = {.addr = (uintptr_t)cbuf, .length = 16, .lkey = 0x12345600};
	struct ibv_send_wr bw = {.wr_id = 4, .sg_list = &bs, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED};
	if (ibv_post_send(cli->qp, &bw, (struct ibv_send_wr **)&bad))
		FAIL("post bad send");
	wc = wait_wc(ccq);
	if (wc.status != IBV_WC_LOC_PROT_ERR || wc.wr_id != 4)
		FAIL("bad lkey completed %s", ibv_wc_status_str(wc.status));

	/* a second request, rejected: its id destroyed before the event is
	 * acknowledged (rdma-core allows it), and the client hears REJECTED */
	struct rdma_cm_id *cli2;
	if (rdma_create_id(cch, &cli2, NULL, RDMA_PS_TCP) || rdma_resolve_addr(cli2, NULL, (struct sockaddr *)&a, 2000))
		FAIL("second id: %s", strerror(errno));
	rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(cli2, 2000))
		FAIL("second route");
	rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	struct ibv_qp_init_attr qa2 = {.send_cq = ccq, .recv_cq = ccq, .qp_type = IBV_QPT_RC,
				       .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
	if (rdma_create_qp(cli2, pd, &qa2) || rdma_connect(cli2, NULL))
		FAIL("second connect: %s", strerror(errno));
	struct rdma_cm_event *req2 = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	const char nope[] = "no";
	if (rdma_reject(req2->id, nope, sizeof(nope)) || rdma_destroy_id(req2->id))
		FAIL("reject and destroy the request's id: %s", strerror(errno));
	rdma_ack_cm_event(req2);
	/* the channel's descriptor wakes poll for an event the daemon gives
	 * after others were taken */
	pf.fd = cch->fd;
	if (poll(&pf, 1, 5000) != 1)
		FAIL("channel not readable for REJECTED");
	struct rdma_cm_event *rej = expect(cch, RDMA_CM_EVENT_REJECTED);
	if (rej->id != cli2)
		FAIL("REJECTED for another id");
	rdma_ack_cm_event(rej);
	rdma_destroy_qp(cli2);
	if (rdma_destroy_id(cli2))
		FAIL("destroy the rejected id");
	/* a port nobody listens on: tried again for 5 s (RETRY_REFUSED_US),
	 * then REJECTED with ECONNREFUSED, as a kernel iWARP device reports
	 * the peer host's reset (not UNREACHABLE: the host answered) */
	struct rdma_cm_id *cli3;
	struct sockaddr_in closed = a;
	closed.sin_port = htons(port + 1);
	if (rdma_create_id(cch, &cli3, NULL, RDMA_PS_TCP) || rdma_resolve_addr(cli3, NULL, (struct sockaddr *)&closed, 2000))
		FAIL("third id: %s", strerror(errno));
	rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(cli3, 2000))
		FAIL("third route");
	rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	if (rdma_create_qp(cli3, pd, &qa2) || rdma_connect(cli3, NULL))
		FAIL("connect to a closed port: %s", strerror(errno));
	if (poll(&pf, 1, 30000) != 1)
		FAIL("no event for a connect to a closed port in 30 s");
	struct rdma_cm_event *refused = expect(cch, RDMA_CM_EVENT_REJECTED);
	if (refused->id != cli3 || refused->status != -ECONNREFUSED)
		FAIL("closed port: status %d, want %d", refused->status, -ECONNREFUSED);
	rdma_ack_cm_event(refused);
	rdma_destroy_qp(cli3);
	rdma_destroy_id(cli3);
	rdma_disconnect(cli);
	/* and the server's channel for the peer's disconnect */
	pf.fd = sch->fd;
	if (poll(&pf, 1, 5000) != 1)
		FAIL("server's channel not readable for DISCONNECTED");
	struct rdma_cm_event *dis = expect(sch, RDMA_CM_EVENT_DISCONNECTED);
	if (dis->id != srv)
		FAIL("DISCONNECTED for another id");
	rdma_ack_cm_event(dis);
	printf("ok\n");
	return 0;
}
