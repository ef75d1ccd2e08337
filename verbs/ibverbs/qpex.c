/*
 * The work request API (ibv_wr_*, man ibv_wr_post): a QP made by
 * ibv_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS posts by function
 * calls instead of ibv_send_wr lists. Between ibv_wr_start and
 * ibv_wr_complete each builder (ibv_wr_send, ibv_wr_rdma_write, ...) opens
 * a request and its data setter (ibv_wr_set_sge, ..., inline) fills it;
 * the request is written into the send ring's next free entry when the
 * next one opens or the batch completes. The entries are published to the
 * daemon only by ibv_wr_complete, all of them, and only if every request
 * was valid: ibv_wr_abort, or an error, leaves the ring as it was. The
 * send ring's lock is held from ibv_wr_start to the end of the batch, as
 * the man page's critical region is, and the batch names the thread in
 * it: a call from outside a region of the caller's own (a second
 * ibv_wr_complete, an abort after a failed complete, a builder with no
 * ibv_wr_start, another thread's) writes no entry and releases no lock,
 * where it would post or overwrite another's entries, or let a second
 * producer into the ring; ibv_wr_complete says EINVAL to it.
 *
 * iWARP has no immediate data, memory windows, TSO or atomic write: a QP
 * asking for them is refused (EOPNOTSUPP), and their builders, like the
 * UD and XRC setters, make the batch fail rather than crash.
 */
#define _GNU_SOURCE
#include "srn.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct srn_wr_batch {
	uint32_t ops;   /* the send_ops_flags the QP was made with */
	uint32_t n;     /* entries written since ibv_wr_start, after sq.local */
	int err;        /* the batch's first error */
	int open;       /* a builder opened wr; its setter may follow */
	/* in a region: active (atomic, release after owner) and the
	 * thread in it, set under the send ring's lock by ibv_wr_start */
	int active;
	pthread_t owner;
	struct ibv_send_wr wr;
	struct ibv_sge sge[SRN_RING_SGE];
	uint8_t inl[]; /* the open request's inline octets: max_inline_data */
};

static struct srn_qp *of(struct ibv_qp_ex *x) { return (struct srn_qp *)x; }

/* mine: the calling thread is in a region of its own (between its
 * ibv_wr_start and ibv_wr_complete or ibv_wr_abort), so holds the lock. */
static int mine(const struct srn_wr_batch *b)
{
	return __atomic_load_n(&b->active, __ATOMIC_ACQUIRE) &&
	       pthread_equal(__atomic_load_n(&b->owner, __ATOMIC_RELAXED), pthread_self());
}

static void fail(struct srn_wr_batch *b, int err)
{
	if (!b->err)
		b->err = err;
}

/* close_open writes the open request, if any, into the ring entry after
 * the batch's others; the ring is not published. */
static void close_open(struct srn_qp *q)
{
	struct srn_wr_batch *b = q->wr;
	if (!b->open)
		return;
	b->open = 0;
	if (b->err)
		return;
	int corrupt = 0;
	uint8_t *slot = srn_reserve_at(&q->sq, b->n, &corrupt);
	if (!slot) {
		fail(b, corrupt ? EIO : ENOMEM);
		return;
	}
	uint8_t e[SRN_SQE_SIZE];
	int err = srn_build_sqe(q, &b->wr, e, q->sq.local + b->n);
	if (err) {
		fail(b, err);
		return;
	}
	memcpy(slot, e, sizeof(e));
	b->n++;
}

/* open starts a request of opcode op (its operation bit: what the QP was
 * made for), with the wr_id and wr_flags the program set; a request of
 * nobody's (its fields written and thrown away) outside a region. */
static struct ibv_send_wr *open_wr(struct ibv_qp_ex *x, enum ibv_wr_opcode op, uint32_t bit)
{
	static __thread struct ibv_send_wr nowhere;
	struct srn_qp *q = of(x);
	struct srn_wr_batch *b = q->wr;
	if (!mine(b))
		return &nowhere;
	close_open(q);
	if (!(b->ops & bit))
		fail(b, EINVAL); /* not among the QP's send_ops_flags */
	memset(&b->wr, 0, sizeof(b->wr));
	b->wr.wr_id = x->wr_id;
	b->wr.opcode = op;
	b->wr.send_flags = x->wr_flags & (IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_FENCE);
	b->wr.sg_list = b->sge;
	b->open = 1;
	return &b->wr;
}

static void wr_send(struct ibv_qp_ex *x) { open_wr(x, IBV_WR_SEND, IBV_QP_EX_WITH_SEND); }

static void wr_send_inv(struct ibv_qp_ex *x, uint32_t rkey)
{
	open_wr(x, IBV_WR_SEND_WITH_INV, IBV_QP_EX_WITH_SEND_WITH_INV)->invalidate_rkey = rkey;
}

static void wr_rdma(struct ibv_qp_ex *x, enum ibv_wr_opcode op, uint32_t bit, uint32_t rkey, uint64_t addr)
{
	struct ibv_send_wr *w = open_wr(x, op, bit);
	w->wr.rdma.rkey = rkey;
	w->wr.rdma.remote_addr = addr;
}

static void wr_rdma_write(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr)
{
	wr_rdma(x, IBV_WR_RDMA_WRITE, IBV_QP_EX_WITH_RDMA_WRITE, rkey, addr);
}

static void wr_rdma_read(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr)
{
	wr_rdma(x, IBV_WR_RDMA_READ, IBV_QP_EX_WITH_RDMA_READ, rkey, addr);
}

static void wr_atomic(struct ibv_qp_ex *x, enum ibv_wr_opcode op, uint32_t bit, uint32_t rkey, uint64_t addr,
		      uint64_t compare_add, uint64_t swap)
{
	struct ibv_send_wr *w = open_wr(x, op, bit);
	w->wr.atomic.rkey = rkey;
	w->wr.atomic.remote_addr = addr;
	w->wr.atomic.compare_add = compare_add;
	w->wr.atomic.swap = swap;
}

static void wr_cmp_swp(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr, uint64_t compare, uint64_t swap)
{
	wr_atomic(x, IBV_WR_ATOMIC_CMP_AND_SWP, IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP, rkey, addr, compare, swap);
}

static void wr_fetch_add(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr, uint64_t add)
{
	wr_atomic(x, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD, rkey, addr, add, 0);
}

static void wr_local_inv(struct ibv_qp_ex *x, uint32_t rkey)
{
	open_wr(x, IBV_WR_LOCAL_INV, IBV_QP_EX_WITH_LOCAL_INV)->invalidate_rkey = rkey;
}

/* What iWARP has not: the batch fails at ibv_wr_complete. */
static void refuse(struct ibv_qp_ex *x)
{
	struct srn_qp *q = of(x);
	if (!mine(q->wr))
		return;
	close_open(q);
	fail(q->wr, EOPNOTSUPP);
}

static void no_imm_write(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr, __be32 imm)
{
	(void)rkey, (void)addr, (void)imm;
	refuse(x);
}

static void no_imm_send(struct ibv_qp_ex *x, __be32 imm)
{
	(void)imm;
	refuse(x);
}

static void no_tso(struct ibv_qp_ex *x, void *hdr, uint16_t hdr_sz, uint16_t mss)
{
	(void)hdr, (void)hdr_sz, (void)mss;
	refuse(x);
}

static void no_bind_mw(struct ibv_qp_ex *x, struct ibv_mw *mw, uint32_t rkey, const struct ibv_mw_bind_info *info)
{
	(void)mw, (void)rkey, (void)info;
	refuse(x);
}

static void no_atomic_write(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr, const void *wr)
{
	(void)rkey, (void)addr, (void)wr;
	refuse(x);
}

static void no_ud_addr(struct ibv_qp_ex *x, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey)
{
	(void)ah, (void)qpn, (void)qkey;
	if (mine(of(x)->wr))
		fail(of(x)->wr, EOPNOTSUPP);
}

static void no_xrc_srqn(struct ibv_qp_ex *x, uint32_t srqn)
{
	(void)srqn;
	if (mine(of(x)->wr))
		fail(of(x)->wr, EOPNOTSUPP);
}

/* data returns the open request for a setter, or NULL (the batch
 * failed, or the caller is in no region). */
static struct ibv_send_wr *data(struct ibv_qp_ex *x)
{
	struct srn_wr_batch *b = of(x)->wr;
	if (!mine(b))
		return NULL;
	if (!b->open) {
		fail(b, EINVAL); /* a setter with no builder before it */
		return NULL;
	}
	return &b->wr;
}

static void set_sge_list(struct ibv_qp_ex *x, size_t n, const struct ibv_sge *list)
{
	struct ibv_send_wr *w = data(x);
	if (!w)
		return;
	struct srn_qp *q = of(x);
	if (n > SRN_RING_SGE || n > q->cap.max_send_sge || (n && !list)) {
		fail(q->wr, EINVAL);
		return;
	}
	memcpy(q->wr->sge, list, n * sizeof(*list));
	w->num_sge = (int)n;
}

static void set_sge(struct ibv_qp_ex *x, uint32_t lkey, uint64_t addr, uint32_t length)
{
	struct ibv_sge s = {.addr = addr, .length = length, .lkey = lkey};
	set_sge_list(x, 1, &s);
}

static void set_inline_list(struct ibv_qp_ex *x, size_t n, const struct ibv_data_buf *bufs)
{
	struct ibv_send_wr *w = data(x);
	if (!w)
		return;
	struct srn_qp *q = of(x);
	struct srn_wr_batch *b = q->wr;
	if (w->opcode != IBV_WR_SEND && w->opcode != IBV_WR_SEND_WITH_INV && w->opcode != IBV_WR_RDMA_WRITE) {
		fail(b, EINVAL); /* inline is for what carries our octets */
		return;
	}
	size_t total = 0;
	for (size_t i = 0; i < n; i++) {
		if (bufs[i].length > q->cap.max_inline_data - total) {
			fail(b, EINVAL);
			return;
		}
		memcpy(b->inl + total, bufs[i].addr, bufs[i].length);
		total += bufs[i].length;
	}
	/* Copied now, as the man page says, and taken from here into the
	 * ring entry's inline slot before another request opens. */
	b->sge[0] = (struct ibv_sge){.addr = (uintptr_t)b->inl, .length = (uint32_t)total};
	w->num_sge = 1;
	w->send_flags |= IBV_SEND_INLINE;
}

static void set_inline(struct ibv_qp_ex *x, void *addr, size_t length)
{
	struct ibv_data_buf d = {.addr = addr, .length = length};
	set_inline_list(x, 1, &d);
}

static void wr_start(struct ibv_qp_ex *x)
{
	struct srn_qp *q = of(x);
	pthread_spin_lock(&q->sq_lock);
	struct srn_wr_batch *b = q->wr;
	b->n = 0;
	b->open = 0;
	b->err = srn_session_dead(srn_session_of(q->qp.context)) ? EIO : 0;
	__atomic_store_n(&b->owner, pthread_self(), __ATOMIC_RELAXED);
	__atomic_store_n(&b->active, 1, __ATOMIC_RELEASE);
}

/* leave ends the caller's region: the batch is no one's, the lock free. */
static void leave(struct srn_qp *q)
{
	struct srn_wr_batch *b = q->wr;
	b->n = 0;
	b->open = 0;
	__atomic_store_n(&b->active, 0, __ATOMIC_RELEASE);
	pthread_spin_unlock(&q->sq_lock);
}

static int wr_complete(struct ibv_qp_ex *x)
{
	struct srn_qp *q = of(x);
	struct srn_wr_batch *b = q->wr;
	if (!mine(b))
		return EINVAL; /* no region of the caller's to complete */
	close_open(q);
	int err = b->err;
	if (!err && b->n) {
		srn_commit_n(&q->sq, b->n);
		srn_sq_posted(q);
	}
	leave(q);
	return err;
}

static void wr_abort(struct ibv_qp_ex *x)
{
	struct srn_qp *q = of(x);
	if (mine(q->wr))
		leave(q);
}

struct ibv_qp *srn_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *ax)
{
	const uint32_t known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	if (!ax || !(ax->comp_mask & IBV_QP_INIT_ATTR_PD) || !ax->pd || ax->pd->context != ctx) {
		errno = EINVAL;
		return NULL;
	}
	int ops = (ax->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0;
	if ((ax->comp_mask & ~known) || ((ax->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && ax->create_flags) ||
	    (ops && (ax->send_ops_flags & ~(uint64_t)SRN_WR_OPS))) {
		errno = EOPNOTSUPP; /* TSO, RSS, XRC, immediate data, windows: not here */
		return NULL;
	}
	struct ibv_qp_init_attr a = {.qp_context = ax->qp_context, .send_cq = ax->send_cq, .recv_cq = ax->recv_cq,
				     .srq = ax->srq, .cap = ax->cap, .qp_type = ax->qp_type, .sq_sig_all = ax->sq_sig_all};
	const struct srn_ia *ia = &srn_ctx(ctx)->ia;
	struct ibv_qp *qp = srn_create_qp_cm(ax->pd, &a, 0, ia->max_ird, ia->max_ord);
	if (!qp)
		return NULL;
	ax->cap = a.cap;
	int err = ops ? srn_qp_wr_api(qp, ax->send_ops_flags) : 0;
	if (err) {
		srn_qp_destroy(qp);
		errno = err;
		return NULL;
	}
	return qp;
}

int srn_qp_wr_api(struct ibv_qp *qp, uint64_t ops)
{
	struct srn_qp *q = (struct srn_qp *)qp;
	if (ops & ~(uint64_t)SRN_WR_OPS)
		return EOPNOTSUPP;
	q->wr = calloc(1, sizeof(*q->wr) + q->cap.max_inline_data);
	if (!q->wr)
		return ENOMEM;
	q->wr->ops = (uint32_t)ops;
	struct ibv_qp_ex *x = &q->qpx;
	x->wr_send = wr_send;
	x->wr_send_inv = wr_send_inv;
	x->wr_rdma_write = wr_rdma_write;
	x->wr_rdma_read = wr_rdma_read;
	x->wr_atomic_cmp_swp = wr_cmp_swp;
	x->wr_atomic_fetch_add = wr_fetch_add;
	x->wr_local_inv = wr_local_inv;
	x->wr_rdma_write_imm = no_imm_write;
	x->wr_send_imm = no_imm_send;
	x->wr_send_tso = no_tso;
	x->wr_bind_mw = no_bind_mw;
	x->wr_atomic_write = no_atomic_write;
	x->wr_set_ud_addr = no_ud_addr;
	x->wr_set_xrc_srqn = no_xrc_srqn;
	x->wr_set_sge = set_sge;
	x->wr_set_sge_list = set_sge_list;
	x->wr_set_inline_data = set_inline;
	x->wr_set_inline_data_list = set_inline_list;
	x->wr_start = wr_start;
	x->wr_complete = wr_complete;
	x->wr_abort = wr_abort;
	return 0;
}

/* ibv_qp_to_qp_ex: the QP's work request API, NULL for a QP made without
 * it (as rdma-core's). */
EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	struct srn_qp *q = (struct srn_qp *)qp;
	return q && q->wr ? &q->qpx : NULL;
}
