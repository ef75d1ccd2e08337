/*
 * wrapi: the work request API (ibv_wr_*, ibv_create_qp_ex with
 * IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) between two QPs of one process,
 * connected the InfiniBand way, the receiving side's completions read
 * from an extended CQ (ibv_create_cq_ex, ibv_start_poll, ibv_next_poll,
 * ibv_wc_read_*; one asking for timestamps is refused). One batch posts an RDMA Write, a Send of
 * inline octets from two buffers, an RDMA Read, a Fetch-and-Add and a
 * Compare-and-Swap; each completes in order and does what it says. A
 * batch aborted, or one with an invalid request anywhere in it (too many
 * SGEs, an operation the QP was not made for, immediate data, a setter
 * with no builder, more requests than the ring holds), posts nothing:
 * its valid requests are not executed either, nor is one built outside
 * a region, or in a region another thread's ibv_wr_complete claims to
 * end (EINVAL). What iWARP cannot do is refused at creation with
 * EOPNOTSUPP, by ibv_create_qp_ex and by librdmacm's rdma_create_qp_ex,
 * which gives the API too. Prints "ok" and
 * exits 0, or names what failed.
 *
 *   wrapi
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

enum { DEPTH = 16 };

struct side {
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_qp_ex *x;
	struct ibv_mr *mr;
	uint64_t buf[512];
};

/* read_ex is the extended CQ's current completion, as an ibv_wc */
static struct ibv_wc read_ex(struct ibv_cq_ex *x)
{
	struct ibv_wc wc = {.wr_id = x->wr_id, .status = x->status, .opcode = ibv_wc_read_opcode(x),
			    .byte_len = ibv_wc_read_byte_len(x), .qp_num = ibv_wc_read_qp_num(x),
			    .wc_flags = ibv_wc_read_wc_flags(x)};
	return wc;
}

/* start_ex waits for the extended CQ's next completion: ibv_start_poll
 * succeeded, and ibv_end_poll is the caller's */
static struct ibv_wc start_ex(struct ibv_cq_ex *x)
{
	for (int i = 0; i < 10000000; i++) {
		struct ibv_poll_cq_attr at = {.comp_mask = 0};
		int err = ibv_start_poll(x, &at);
		if (!err)
			return read_ex(x);
		if (err != ENOENT)
			FAIL("ibv_start_poll: %s", strerror(err));
		if (i > 1000)
			usleep(1);
	}
	FAIL("no completion");
}

/* quiet: nothing completes on cq for a while */
static void quiet(struct ibv_cq *cq, const char *what)
{
	usleep(200000);
	struct ibv_wc wc;
	if (ibv_poll_cq(cq, 1, &wc) != 0)
		FAIL("%s: a completion, wr_id %lu %s", what, (unsigned long)wc.wr_id, ibv_wc_status_str(wc.status));
}

static struct ibv_qp *make_qp(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq *cq, uint64_t ops, uint32_t mask)
{
	struct ibv_qp_init_attr_ex a = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .comp_mask = mask, .pd = pd,
					.send_ops_flags = ops,
					.cap = {.max_send_wr = DEPTH, .max_recv_wr = DEPTH, .max_send_sge = 2, .max_recv_sge = 1,
						.max_inline_data = 64}};
	return ibv_create_qp_ex(ctx, &a);
}

static void connect_pair(struct side *a, struct side *b, const union ibv_gid *gid)
{
	struct side *s[2] = {a, b};
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_attr at = {.qp_state = IBV_QPS_INIT, .port_num = 1,
					 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
							    IBV_ACCESS_REMOTE_ATOMIC};
		if (ibv_modify_qp(s[i]->qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
			FAIL("INIT: %s", strerror(errno));
	}
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_attr at = {.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = s[!i]->qp->qp_num,
					 .max_dest_rd_atomic = 1, .min_rnr_timer = 12};
		at.ah_attr.port_num = 1;
		at.ah_attr.is_global = 1;
		at.ah_attr.grh.dgid = *gid;
		if (ibv_modify_qp(s[i]->qp, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
							 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
			FAIL("RTR: %s", strerror(errno));
	}
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_attr at = {.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .max_rd_atomic = 1};
		if (ibv_modify_qp(s[i]->qp, &at, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
							 IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
			FAIL("RTS: %s", strerror(errno));
	}
}

static void post_recv(struct side *s, uint64_t id, int at)
{
	struct ibv_sge sge = {.addr = (uintptr_t)&s->buf[at], .length = 64, .lkey = s->mr->lkey};
	struct ibv_recv_wr w = {.wr_id = id, .sg_list = &sge, .num_sge = 1}, *bad;
	if (ibv_post_recv(s->qp, &w, &bad))
		FAIL("ibv_post_recv: %s", strerror(errno));
}

/* stray_complete is another thread's ibv_wr_complete of x, whose
 * region it is not in */
static void *stray_complete(void *x)
{
	return (void *)(intptr_t)ibv_wr_complete(x);
}

/* one_send posts one signaled Send of len octets at buf[at] through the API */
static int one_send(struct side *s, uint64_t id, int at, uint32_t len)
{
	ibv_wr_start(s->x);
	s->x->wr_id = id;
	s->x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(s->x);
	ibv_wr_set_sge(s->x, s->mr->lkey, (uintptr_t)&s->buf[at], len);
	return ibv_wr_complete(s->x);
}

int main(void)
{
	struct ibv_context *ctx = open_first_device();
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, 0, &gid))
		FAIL("ibv_query_gid: %s", strerror(errno));
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq0 = ibv_create_cq(ctx, 4 * DEPTH, NULL, NULL, 0);
	if (!pd || !cq0)
		FAIL("PD and CQ: %s", strerror(errno));

	/* What iWARP has not is refused when the QP is made. */
	const uint64_t all = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_RDMA_WRITE |
			     IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
			     IBV_QP_EX_WITH_LOCAL_INV;
	const uint32_t mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	static const uint64_t refused[] = {IBV_QP_EX_WITH_SEND_WITH_IMM, IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM,
					   IBV_QP_EX_WITH_TSO, IBV_QP_EX_WITH_BIND_MW};
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		errno = 0;
		if (make_qp(ctx, pd, cq0, IBV_QP_EX_WITH_SEND | refused[i], mask) || errno != EOPNOTSUPP)
			FAIL("send_ops_flags %#lx: errno %d, want EOPNOTSUPP", (unsigned long)refused[i], errno);
	}
	errno = 0;
	if (make_qp(ctx, pd, cq0, IBV_QP_EX_WITH_SEND, mask | IBV_QP_INIT_ATTR_MAX_TSO_HEADER) || errno != EOPNOTSUPP)
		FAIL("a TSO header: errno %d, want EOPNOTSUPP", errno);
	errno = 0;
	if (make_qp(ctx, NULL, cq0, IBV_QP_EX_WITH_SEND, mask) || errno != EINVAL)
		FAIL("no PD: errno %d, want EINVAL", errno);
	/* librdmacm's rdma_create_qp_ex gives the API too, and refuses what
	 * iWARP has not. */
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct sockaddr_in sin = {.sin_family = AF_INET};
	memcpy(&sin.sin_addr, gid.raw + 12, 4);
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) || rdma_bind_addr(id, (struct sockaddr *)&sin) || !id->verbs)
		FAIL("an RDMA-CM id: %s", strerror(errno));
	struct ibv_pd *cpd = ibv_alloc_pd(id->verbs);
	struct ibv_cq *ccq = ibv_create_cq(id->verbs, 4, NULL, NULL, 0);
	if (!cpd || !ccq)
		FAIL("the RDMA-CM's PD and CQ: %s", strerror(errno));
	struct ibv_qp_init_attr_ex ca = {.send_cq = ccq, .recv_cq = ccq, .qp_type = IBV_QPT_RC, .comp_mask = mask, .pd = cpd,
					 .send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM,
					 .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
	errno = 0;
	if (rdma_create_qp_ex(id, &ca) == 0 || errno != EOPNOTSUPP || id->qp)
		FAIL("rdma_create_qp_ex with immediate data: errno %d, want EOPNOTSUPP", errno);
	ca.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
	if (rdma_create_qp_ex(id, &ca) || !id->qp || !ibv_qp_to_qp_ex(id->qp))
		FAIL("rdma_create_qp_ex with send operations: %s", strerror(errno));
	rdma_destroy_qp(id);
	if (ibv_destroy_cq(ccq) || ibv_dealloc_pd(cpd) || rdma_destroy_id(id))
		FAIL("the RDMA-CM's: %s", strerror(errno));
	rdma_destroy_event_channel(ch);

	struct ibv_qp_init_attr plain_attr = {.send_cq = cq0, .recv_cq = cq0, .qp_type = IBV_QPT_RC,
					      .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *plain = ibv_create_qp(pd, &plain_attr);
	if (!plain || ibv_qp_to_qp_ex(plain))
		FAIL("a QP made without the API: %p, its qp_ex %p", (void *)plain, plain ? (void *)ibv_qp_to_qp_ex(plain) : NULL);
	ibv_destroy_qp(plain);

	/* The receiving side's CQ is an extended one; timestamps are not
	 * to be had. */
	struct ibv_cq_init_attr_ex cxa = {.cqe = 4 * DEPTH, .wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP};
	errno = 0;
	if (ibv_create_cq_ex(ctx, &cxa) || errno != EOPNOTSUPP)
		FAIL("an extended CQ with timestamps: errno %d, want EOPNOTSUPP", errno);
	cxa.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM;
	struct ibv_cq_ex *bx = ibv_create_cq_ex(ctx, &cxa);
	if (!bx)
		FAIL("ibv_create_cq_ex: %s", strerror(errno));
	static struct side a, b;
	struct side *s[2] = {&a, &b};
	for (int i = 0; i < 2; i++) {
		s[i]->cq = i ? ibv_cq_ex_to_cq(bx) : ibv_create_cq(ctx, 4 * DEPTH, NULL, NULL, 0);
		s[i]->qp = make_qp(ctx, pd, s[i]->cq, all, mask);
		if (!s[i]->cq || !s[i]->qp)
			FAIL("QP %d: %s", i, strerror(errno));
		s[i]->x = ibv_qp_to_qp_ex(s[i]->qp);
		if (!s[i]->x || &s[i]->x->qp_base != s[i]->qp)
			FAIL("ibv_qp_to_qp_ex");
		s[i]->mr = ibv_reg_mr(pd, s[i]->buf, sizeof(s[i]->buf),
				      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
					      IBV_ACCESS_REMOTE_ATOMIC);
		if (!s[i]->mr)
			FAIL("ibv_reg_mr: %s", strerror(errno));
	}
	connect_pair(&a, &b, &gid);

	/* One batch of each kind of request. */
	for (int i = 0; i < 64; i++) {
		a.buf[i] = 0x1000 + i;
		b.buf[256 + i] = 0x2000 + i;
	}
	b.buf[128] = 40;  /* fetch-and-add's target */
	b.buf[129] = 7;   /* compare-and-swap's */
	post_recv(&b, 50, 192);
	struct ibv_qp_ex *x = a.x;
	ibv_wr_start(x);
	x->wr_id = 1;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(x, b.mr->rkey, (uintptr_t)&b.buf[0]);
	struct ibv_sge two[2] = {{(uintptr_t)&a.buf[0], 64, a.mr->lkey}, {(uintptr_t)&a.buf[8], 64, a.mr->lkey}};
	ibv_wr_set_sge_list(x, 2, two);
	x->wr_id = 2;
	ibv_wr_send(x);
	char h[] = "inline ", t[] = "octets";
	struct ibv_data_buf inl[2] = {{h, strlen(h)}, {t, strlen(t) + 1}};
	ibv_wr_set_inline_data_list(x, 2, inl);
	h[0] = 'X'; /* copied by the setter: this is not sent */
	x->wr_id = 3;
	ibv_wr_rdma_read(x, b.mr->rkey, (uintptr_t)&b.buf[256]);
	ibv_wr_set_sge(x, a.mr->lkey, (uintptr_t)&a.buf[256], 512);
	x->wr_id = 4;
	ibv_wr_atomic_fetch_add(x, b.mr->rkey, (uintptr_t)&b.buf[128], 2);
	ibv_wr_set_sge(x, a.mr->lkey, (uintptr_t)&a.buf[128], 8);
	x->wr_id = 5;
	ibv_wr_atomic_cmp_swp(x, b.mr->rkey, (uintptr_t)&b.buf[129], 7, 99);
	ibv_wr_set_sge(x, a.mr->lkey, (uintptr_t)&a.buf[129], 8);
	int err = ibv_wr_complete(x);
	if (err)
		FAIL("ibv_wr_complete: %s", strerror(err));
	for (uint64_t id = 1; id <= 5; id++) {
		struct ibv_wc wc = wait_wc(a.cq);
		if (wc.status != IBV_WC_SUCCESS || wc.wr_id != id)
			FAIL("completion %lu: %s, want %lu", (unsigned long)wc.wr_id, ibv_wc_status_str(wc.status),
			     (unsigned long)id);
	}
	struct ibv_wc wc = start_ex(bx);
	ibv_end_poll(bx);
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 50 || wc.opcode != IBV_WC_RECV || wc.qp_num != b.qp->qp_num ||
	    wc.byte_len != strlen("inline octets") + 1 || strcmp((char *)&b.buf[192], "inline octets"))
		FAIL("the inline Send: %s, %u octets, \"%s\"", ibv_wc_status_str(wc.status), wc.byte_len, (char *)&b.buf[192]);
	/* empty: ENOENT, and the CQ's lock is not held after it */
	struct ibv_poll_cq_attr pa = {.comp_mask = 0};
	if (ibv_start_poll(bx, &pa) != ENOENT || ibv_poll_cq(b.cq, 1, &wc) != 0)
		FAIL("an empty extended CQ");
	for (int i = 0; i < 16; i++) {
		if (b.buf[i] != (uint64_t)(0x1000 + i))
			FAIL("the Write's word %d: %#lx", i, (unsigned long)b.buf[i]);
	}
	for (int i = 0; i < 64; i++) {
		if (a.buf[256 + i] != (uint64_t)(0x2000 + i))
			FAIL("the Read's word %d: %#lx", i, (unsigned long)a.buf[256 + i]);
	}
	if (a.buf[128] != 40 || b.buf[128] != 42 || a.buf[129] != 7 || b.buf[129] != 99)
		FAIL("atomics: fetched %lu (now %lu), compared %lu (now %lu)", (unsigned long)a.buf[128],
		     (unsigned long)b.buf[128], (unsigned long)a.buf[129], (unsigned long)b.buf[129]);

	/* Aborted, and failed, batches post nothing, their valid requests
	 * included: b's buffer stays as it is and no completion comes. */
	b.buf[300] = 0;
	a.buf[300] = 0xfeed;
	struct {
		const char *what;
		int want;
	} cases[] = {
		{"aborted", 0},
		{"five SGEs", EINVAL},
		{"immediate data", EOPNOTSUPP},
		{"a setter before any builder", EINVAL},
		{"more than the ring holds", ENOMEM},
	};
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	if (ibv_query_qp(a.qp, &qa, IBV_QP_CAP, &qi))
		FAIL("ibv_query_qp: %s", strerror(errno));
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		ibv_wr_start(x);
		if (c == 3)
			ibv_wr_set_sge(x, a.mr->lkey, (uintptr_t)&a.buf[300], 8);
		x->wr_id = 100 + c;
		x->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_write(x, b.mr->rkey, (uintptr_t)&b.buf[300]);
		ibv_wr_set_sge(x, a.mr->lkey, (uintptr_t)&a.buf[300], 8);
		if (c == 1) {
			struct ibv_sge five[5];
			for (int i = 0; i < 5; i++)
				five[i] = (struct ibv_sge){(uintptr_t)&a.buf[300], 8, a.mr->lkey};
			ibv_wr_send(x);
			ibv_wr_set_sge_list(x, 5, five);
		} else if (c == 2) {
			ibv_wr_send_imm(x, 1);
		} else if (c == 4) {
			for (uint32_t i = 0; i < qa.cap.max_send_wr; i++) {
				ibv_wr_rdma_write(x, b.mr->rkey, (uintptr_t)&b.buf[300]);
				ibv_wr_set_sge(x, a.mr->lkey, (uintptr_t)&a.buf[300], 8);
			}
		}
		if (c == 0) {
			ibv_wr_abort(x);
		} else if ((err = ibv_wr_complete(x)) != cases[c].want) {
			FAIL("%s: ibv_wr_complete %d (%s), want %d", cases[c].what, err, strerror(err), cases[c].want);
		}
		quiet(a.cq, cases[c].what);
		if (b.buf[300] != 0)
			FAIL("%s: its valid Write was done", cases[c].what);
	}
	/* A QP made for Sends alone refuses a Write in its batch. */
	struct ibv_qp *sends = make_qp(ctx, pd, cq0, IBV_QP_EX_WITH_SEND, mask);
	if (!sends)
		FAIL("a QP for Sends: %s", strerror(errno));
	struct ibv_qp_ex *sx = ibv_qp_to_qp_ex(sends);
	ibv_wr_start(sx);
	ibv_wr_rdma_write(sx, b.mr->rkey, (uintptr_t)&b.buf[300]);
	ibv_wr_set_sge(sx, a.mr->lkey, (uintptr_t)&a.buf[300], 8);
	if ((err = ibv_wr_complete(sx)) != EINVAL)
		FAIL("a Write on a QP made for Sends: %d, want EINVAL", err);
	if (ibv_destroy_qp(sends))
		FAIL("ibv_destroy_qp: %s", strerror(errno));

	/* Calls outside a critical region of the caller's own change
	 * nothing: a second ibv_wr_complete, or one from another thread
	 * while this one builds, is EINVAL and neither posts this thread's
	 * requests nor lets go of its region; a builder with no
	 * ibv_wr_start writes no entry. */
	ibv_wr_start(x);
	x->wr_id = 110;
	ibv_wr_rdma_write(x, b.mr->rkey, (uintptr_t)&b.buf[300]);
	ibv_wr_set_sge(x, a.mr->lkey, (uintptr_t)&a.buf[300], 8);
	pthread_t th;
	void *stray = NULL;
	if (pthread_create(&th, NULL, stray_complete, x) || pthread_join(th, &stray))
		FAIL("pthread: %s", strerror(errno));
	if ((intptr_t)stray != EINVAL)
		FAIL("ibv_wr_complete from a thread outside the region: %d, want EINVAL", (int)(intptr_t)stray);
	ibv_wr_abort(x);
	ibv_wr_start(x);
	if ((err = ibv_wr_complete(x)) || (err = ibv_wr_complete(x)) != EINVAL)
		FAIL("a second ibv_wr_complete: %d, want EINVAL", err);
	x->wr_id = 111;
	ibv_wr_rdma_write(x, b.mr->rkey, (uintptr_t)&b.buf[300]);
	ibv_wr_set_sge(x, a.mr->lkey, (uintptr_t)&a.buf[300], 8);
	if ((err = ibv_wr_complete(x)) != EINVAL)
		FAIL("ibv_wr_complete with no ibv_wr_start: %d, want EINVAL", err);
	ibv_wr_abort(x); /* nothing to abort: no effect */
	quiet(a.cq, "calls outside a region");
	if (b.buf[300] != 0)
		FAIL("a Write built outside a region, or aborted, was done");

	/* The QP still works after them, and the API and ibv_post_send
	 * share its ring. */
	post_recv(&b, 60, 200);
	strcpy((char *)&a.buf[400], "after");
	if ((err = one_send(&a, 7, 400, 6)))
		FAIL("a Send after the failed batches: %s", strerror(err));
	post_recv(&b, 61, 208);
	struct ibv_sge sge = {(uintptr_t)&a.buf[400], 6, a.mr->lkey};
	struct ibv_send_wr w = {.wr_id = 8, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED},
			   *bad;
	if (ibv_post_send(a.qp, &w, &bad))
		FAIL("ibv_post_send: %s", strerror(errno));
	for (uint64_t id = 7; id <= 8; id++) {
		wc = wait_wc(a.cq);
		if (wc.status != IBV_WC_SUCCESS || wc.wr_id != id)
			FAIL("Send %lu: %s (wr_id %lu)", (unsigned long)id, ibv_wc_status_str(wc.status), (unsigned long)wc.wr_id);
	}
	/* both receives in one polling region: start_poll, then next_poll */
	struct ibv_wc got[2];
	got[0] = start_ex(bx);
	for (int i = 0;; i++) {
		int err = ibv_next_poll(bx);
		if (!err)
			break;
		if (err != ENOENT || i == 10000000)
			FAIL("ibv_next_poll: %s", strerror(err));
	}
	got[1] = read_ex(bx);
	ibv_end_poll(bx);
	for (int k = 0; k < 2; k++) {
		if (got[k].status != IBV_WC_SUCCESS || got[k].wr_id != (uint64_t)(60 + k) || strcmp((char *)&b.buf[200 + 8 * k], "after"))
			FAIL("receive %d: %s (wr_id %lu)", k, ibv_wc_status_str(got[k].status), (unsigned long)got[k].wr_id);
	}
	if (b.buf[300] != 0)
		FAIL("a Write of a failed batch was done late");

	for (int i = 0; i < 2; i++) {
		if (ibv_destroy_qp(s[i]->qp) || ibv_dereg_mr(s[i]->mr) || ibv_destroy_cq(s[i]->cq))
			FAIL("destroy %d: %s", i, strerror(errno));
	}
	if (ibv_destroy_cq(cq0) || ibv_dealloc_pd(pd))
		FAIL("destroy: %s", strerror(errno));
	ibv_close_device(ctx);
	printf("ok\n");
	return 0;
}
