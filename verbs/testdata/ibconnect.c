/*
 * ibconnect: one process, two pairs of QPs connected the InfiniBand way,
 * without the RDMA-CM, as perftest without -R and qperf without -cm1 do:
 * ibv_modify_qp to INIT, RTR naming the peer's qp_num and its address
 * (the GRH's dgid for one pair, the LID alone for the other), then RTS,
 * which returns at once, as on InfiniBand: one side of each pair goes to
 * RTS and posts a Send before the other's RTR, as ibv_rc_pingpong's
 * server does, and the Send arrives once the connection is up. Each pair
 * then moves a Send and an RDMA Write, and a completion names its QP by
 * the qp_num the program was given. A QP whose peer's QP is destroyed
 * keeps its receives posted until it sends, or is moved to ERR (they are
 * flushed then). A QP the RDMA-CM owns still
 * refuses such an RTR, and one naming a QP nobody has goes to ERR, what
 * was posted on it flushed. Prints "ok" and exits 0, or names what failed.
 *
 *   ibconnect
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

struct side {
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char buf[4096];
};

static void make(struct ibv_context *ctx, struct ibv_pd *pd, struct side *s)
{
	s->cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!s->cq)
		FAIL("ibv_create_cq: %s", strerror(errno));
	struct ibv_qp_init_attr ia = {.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1}};
	s->qp = ibv_create_qp(pd, &ia);
	if (!s->qp)
		FAIL("ibv_create_qp: %s", strerror(errno));
	s->mr = ibv_reg_mr(pd, s->buf, sizeof(s->buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!s->mr)
		FAIL("ibv_reg_mr: %s", strerror(errno));
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
				.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ};
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		FAIL("INIT: %s", strerror(errno));
}

/* rtr as perftest does it (grh: the peer's GID) or as qperf does (its LID) */
static int rtr(struct side *s, uint32_t qpn, const union ibv_gid *gid, uint16_t lid)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = qpn, .rq_psn = 0,
				.max_dest_rd_atomic = 1, .min_rnr_timer = 12};
	a.ah_attr.port_num = 1;
	a.ah_attr.dlid = lid;
	if (gid) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = *gid;
		a.ah_attr.grh.hop_limit = 0xff;
	}
	return ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
						 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int rts(struct side *s)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .max_rd_atomic = 1};
	return ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
						 IBV_QP_MAX_QP_RD_ATOMIC);
}

static void post_recv(struct side *s)
{
	struct ibv_sge rs = {.addr = (uintptr_t)s->buf, .length = 64, .lkey = s->mr->lkey};
	struct ibv_recv_wr rw = {.wr_id = 7, .sg_list = &rs, .num_sge = 1}, *bad;
	if (ibv_post_recv(s->qp, &rw, &bad))
		FAIL("ibv_post_recv");
}

static void post_send(struct side *s, uint32_t len)
{
	struct ibv_sge ss = {.addr = (uintptr_t)s->buf, .length = len, .lkey = s->mr->lkey};
	struct ibv_send_wr sw = {.wr_id = 8, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr *bad;
	if (ibv_post_send(s->qp, &sw, &bad))
		FAIL("ibv_post_send");
}

static enum ibv_qp_state qp_state(struct side *s)
{
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	if (ibv_query_qp(s->qp, &qa, IBV_QP_STATE, &qi))
		FAIL("ibv_query_qp: %s", strerror(errno));
	return qa.qp_state;
}

/* destroy_peer destroys gone's QP, as a program written for InfiniBand
 * ends, and waits until its peer's QP has seen the end (ERR). */
static void destroy_peer(struct side *gone, struct side *peer)
{
	if (ibv_destroy_qp(gone->qp))
		FAIL("ibv_destroy_qp: %s", strerror(errno));
	gone->qp = NULL;
	for (int i = 0; qp_state(peer) != IBV_QPS_ERR; i++) {
		if (i == 10000)
			FAIL("the peer's end not seen in 10 s");
		usleep(1000);
	}
}

static void transfer(struct side *a, struct side *b)
{
	post_recv(b);
	strcpy(a->buf, "a Send");
	strcpy(a->buf + 64, "an RDMA Write");
	struct ibv_sge ss = {.addr = (uintptr_t)a->buf, .length = 7, .lkey = a->mr->lkey};
	struct ibv_sge ws = {.addr = (uintptr_t)a->buf + 64, .length = 14, .lkey = a->mr->lkey};
	struct ibv_send_wr w = {.wr_id = 9, .sg_list = &ws, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				.send_flags = IBV_SEND_SIGNALED};
	w.wr.rdma.remote_addr = (uintptr_t)b->buf + 128;
	w.wr.rdma.rkey = b->mr->rkey;
	struct ibv_send_wr sw = {.wr_id = 8, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED};
	w.next = &sw;
	struct ibv_send_wr *bad;
	if (ibv_post_send(a->qp, &w, &bad))
		FAIL("ibv_post_send");
	for (int i = 0; i < 2; i++) {
		struct ibv_wc wc = wait_wc(a->cq);
		if (wc.status != IBV_WC_SUCCESS || wc.qp_num != a->qp->qp_num)
			FAIL("send completion %s qp_num %u, want %u", ibv_wc_status_str(wc.status), wc.qp_num, a->qp->qp_num);
	}
	struct ibv_wc wc = wait_wc(b->cq);
	if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV || wc.wr_id != 7 || wc.byte_len != 7 ||
	    wc.qp_num != b->qp->qp_num)
		FAIL("receive %s opcode %d len %u qp_num %u, want %u", ibv_wc_status_str(wc.status), wc.opcode, wc.byte_len,
		     wc.qp_num, b->qp->qp_num);
	/* the Write was placed before the Send that followed it */
	if (strcmp(b->buf, "a Send") || strcmp(b->buf + 128, "an RDMA Write"))
		FAIL("received %s / %s", b->buf, b->buf + 128);
}

/* early: FIRST goes to RTR and RTS naming SECOND and posts a Send before
 * SECOND's RTR, which SECOND makes only then, its receive posted before
 * (ibv_rc_pingpong's order: its server is at RTS before it tells the
 * client its QPN). The Send arrives once the connection is up. */
static void early(struct side *first, struct side *second, const union ibv_gid *gid, uint16_t lid)
{
	post_recv(second);
	if (rtr(first, second->qp->qp_num, gid, lid))
		FAIL("RTR of the first side: %s", strerror(errno));
	int err = rts(first);
	if (err)
		FAIL("RTS before the peer's RTR: %s", strerror(err));
	if (qp_state(first) != IBV_QPS_RTS)
		FAIL("QP in state %d after RTS, want RTS", qp_state(first));
	strcpy(first->buf, "early");
	post_send(first, 6);
	if (rtr(second, first->qp->qp_num, gid, lid) || (err = rts(second)))
		FAIL("RTR and RTS of the second side: %s", strerror(err ? err : errno));
	struct ibv_wc wc = wait_wc(first->cq);
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 8)
		FAIL("early Send: %s", ibv_wc_status_str(wc.status));
	wc = wait_wc(second->cq);
	if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV || wc.byte_len != 6 || strcmp(second->buf, "early"))
		FAIL("early receive: %s, %u octets", ibv_wc_status_str(wc.status), wc.byte_len);
}

int main(void)
{
	struct ibv_context *ctx = open_first_device();
	union ibv_gid gid;
	struct ibv_port_attr port;
	if (ibv_query_gid(ctx, 1, 0, &gid) || ibv_query_port(ctx, 1, &port))
		FAIL("query: %s", strerror(errno));
	if (port.lid != (gid.raw[14] << 8 | gid.raw[15]))
		FAIL("LID %#x, want the address's low 16 bits", port.lid);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd)
		FAIL("ibv_alloc_pd");
	static struct side s[4];
	for (int i = 0; i < 4; i++)
		make(ctx, pd, &s[i]);
	if (s[0].qp->qp_num == s[1].qp->qp_num || s[0].qp->qp_num == 0)
		FAIL("qp_num %u and %u", s[0].qp->qp_num, s[1].qp->qp_num);

	/* Pair 0-1 by GID, the passive side (the higher QPN) first; 2-3 by
	 * LID, the active side first. */
	int hi = s[1].qp->qp_num > s[0].qp->qp_num;
	early(&s[hi], &s[!hi], &gid, 0);
	int lo = s[3].qp->qp_num < s[2].qp->qp_num;
	early(&s[2 + lo], &s[2 + !lo], NULL, port.lid);
	for (int i = 0; i < 4; i++) {
		if (qp_state(&s[i]) != IBV_QPS_RTS)
			FAIL("QP %d in state %d once connected", i, qp_state(&s[i]));
	}
	transfer(&s[0], &s[1]);
	transfer(&s[1], &s[0]);
	transfer(&s[3], &s[2]);

	/* A second RTR of a connected QP is refused. */
	if (rtr(&s[0], s[1].qp->qp_num, &gid, 0) != EINVAL)
		FAIL("second RTR accepted");

	/* The peer's QP destroyed, as a program written for InfiniBand ends
	 * (ibv_rc_pingpong): a receive posted here stays posted, as an
	 * InfiniBand QP hears nothing of it, so that a program taking its
	 * last completions two at a time finds no flushed one among them;
	 * the next Send fails, and the receive is flushed with it. */
	post_recv(&s[0]);
	destroy_peer(&s[1], &s[0]);
	usleep(100000);
	struct ibv_wc wc;
	if (ibv_poll_cq(s[0].cq, 1, &wc) != 0)
		FAIL("a completion (%s, wr_id %lu) after the peer's end", ibv_wc_status_str(wc.status), (unsigned long)wc.wr_id);
	post_send(&s[0], 1);
	int sent = 0, flushed = 0;
	for (int i = 0; i < 2; i++) {
		wc = wait_wc(s[0].cq);
		if (wc.wr_id == 8 && wc.status != IBV_WC_SUCCESS)
			sent++;
		else if (wc.wr_id == 7 && wc.status == IBV_WC_WR_FLUSH_ERR)
			flushed++;
		else
			FAIL("after the peer's end: wr_id %lu %s", (unsigned long)wc.wr_id, ibv_wc_status_str(wc.status));
	}
	if (sent != 1 || flushed != 1)
		FAIL("after the peer's end: %d failed Sends and %d flushed receives, want one of each", sent, flushed);

	/* A QP naming one nobody has: RTR and RTS go; within the daemon's
	 * bound (the test's daemon: 1 s) the QP is in ERR and what was
	 * posted on it completes flushed. */
	struct side lone;
	make(ctx, pd, &lone);
	if (rtr(&lone, 0xffffff, &gid, 0) || rts(&lone))
		FAIL("RTR and RTS to nobody: %s", strerror(errno));
	time_t start = time(NULL);
	post_send(&lone, 1);
	wc = wait_wc(lone.cq);
	if (wc.status != IBV_WC_WR_FLUSH_ERR || wc.wr_id != 8)
		FAIL("Send to nobody: %s, want flushed", ibv_wc_status_str(wc.status));
	if (time(NULL) - start > 10)
		FAIL("the connection to nobody took %ld s to fail", (long)(time(NULL) - start));
	if (qp_state(&lone) != IBV_QPS_ERR)
		FAIL("QP to nobody in state %d, want ERR", qp_state(&lone));

	/* A QP of the RDMA-CM is connected by it alone. */
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		FAIL("rdma_create_id: %s", strerror(errno));
	struct sockaddr_in sin = {.sin_family = AF_INET};
	memcpy(&sin.sin_addr, gid.raw + 12, 4);
	if (rdma_bind_addr(id, (struct sockaddr *)&sin) || !id->verbs)
		FAIL("rdma_bind_addr: %s", strerror(errno));
	struct ibv_pd *cpd = ibv_alloc_pd(id->verbs);
	struct ibv_cq *ccq = ibv_create_cq(id->verbs, 4, NULL, NULL, 0);
	if (!cpd || !ccq)
		FAIL("the RDMA-CM's PD and CQ: %s", strerror(errno));
	struct ibv_qp_init_attr cia = {.send_cq = ccq, .recv_cq = ccq, .qp_type = IBV_QPT_RC,
				       .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
	if (rdma_create_qp(id, cpd, &cia))
		FAIL("rdma_create_qp: %s", strerror(errno));
	struct side cm = {.qp = id->qp};
	if (rtr(&cm, s[3].qp->qp_num, &gid, 0) != EINVAL)
		FAIL("RTR by QPN of the RDMA-CM's QP accepted");
	rdma_destroy_qp(id);
	if (ibv_destroy_cq(ccq) || ibv_dealloc_pd(cpd))
		FAIL("the RDMA-CM's CQ and PD: %s", strerror(errno));
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);

	/* A receive kept at the peer's end is flushed when the program
	 * moves its QP to ERR, as on InfiniBand, where a program drains its
	 * QP so before destroying it. */
	post_recv(&s[2]);
	destroy_peer(&s[3], &s[2]);
	struct ibv_qp_attr ea = {.qp_state = IBV_QPS_ERR};
	if (ibv_modify_qp(s[2].qp, &ea, IBV_QP_STATE))
		FAIL("ERR: %s", strerror(errno));
	int n = 0;
	for (int i = 0; i < 5000 && (n = ibv_poll_cq(s[2].cq, 1, &wc)) == 0; i++)
		usleep(1000);
	if (n != 1)
		FAIL("at ERR after the peer's end: no completion for the kept receive (%d)", n);
	if (wc.wr_id != 7 || wc.status != IBV_WC_WR_FLUSH_ERR)
		FAIL("at ERR after the peer's end: wr_id %lu %s, want the receive flushed", (unsigned long)wc.wr_id,
		     ibv_wc_status_str(wc.status));

	for (int i = 0; i < 4; i++) {
		if ((s[i].qp && ibv_destroy_qp(s[i].qp)) || ibv_dereg_mr(s[i].mr) || ibv_destroy_cq(s[i].cq))
			FAIL("destroy %d: %s", i, strerror(errno));
	}
	if (ibv_destroy_qp(lone.qp) || ibv_dereg_mr(lone.mr) || ibv_destroy_cq(lone.cq) || ibv_dealloc_pd(pd))
		FAIL("destroy: %s", strerror(errno));
	ibv_close_device(ctx);
	printf("ok\n");
	return 0;
}
