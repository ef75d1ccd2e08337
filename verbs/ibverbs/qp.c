/*
 * Queue pairs: the daemon's endpoints (ctl CreateEP) with their send and
 * receive rings in the session's region. Posting writes ring entries and,
 * when the daemon's side sleeps, puts the EP on its ready queue and rings
 * the queue's doorbell: no system call while the daemon is awake.
 * Reliable connected QPs only, connected by the RDMA-CM (librdmacm), or
 * the InfiniBand way: ibv_modify_qp to RTR naming the peer's QP and
 * address, which the daemon turns into an MPA connection (ib_connect).
 */
#define _GNU_SOURCE
#include "srn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum {
	SQ_SEND = 0, SQ_SEND_INV = 1, SQ_WRITE = 2, SQ_READ = 3, SQ_FETCH_ADD = 4, SQ_CMP_SWAP = 5, SQ_LOCAL_INV = 6,
	WR_SIGNALED = 1, WR_SOLICITED = 2, WR_FENCE = 4,
	MAX_INLINE = 512,
	MIN_INLINE = 64, /* what a QP that asked for none can send inline */
};

static struct srn_qp *to_qp(struct ibv_qp *qp) { return (struct srn_qp *)qp; }

static void put_sge(uint8_t *b, uint32_t lkey, uint32_t len, uint64_t addr)
{
	memcpy(b, &lkey, 4);
	memcpy(b + 4, &len, 4);
	memcpy(b + 8, &addr, 8);
}

/* ready tells the daemon that the QP's rings have work, after a commit
 * that found the ring's need-wakeup flag up; the ring's lock held. */
static int ready(struct srn_qp *q)
{
	if (!srn_mark_queued(&q->sq))
		return 0;
	struct srn_readyq *rq = q->queue;
	pthread_mutex_lock(&rq->mu);
	int corrupt = 0;
	uint8_t *slot = srn_reserve(&rq->ring, &corrupt);
	if (slot) {
		memcpy(slot, &q->slot, 4);
		srn_commit(&rq->ring);
	}
	pthread_mutex_unlock(&rq->mu);
	if (!slot)
		return EIO; /* one entry per EP at most: only a broken daemon fills it */
	if (srn_flags(&rq->ring) & SRN_NEED_WAKEUP) {
		uint64_t one = 1;
		if (write(rq->doorbell, &one, sizeof(one)) < 0 && errno != EAGAIN)
			return errno;
	}
	return 0;
}

void srn_sq_posted(struct srn_qp *q)
{
	/* The entries are posted whatever ready says: a queue the daemon
	 * broke is found by its next look, not by an error that would have
	 * the application post them again. */
	if (srn_flags(&q->sq) & SRN_NEED_WAKEUP)
		(void)ready(q);
}

int srn_build_sqe(struct srn_qp *q, const struct ibv_send_wr *wr, uint8_t *e, uint32_t idx)
{
	memset(e, 0, SRN_SQE_SIZE);
	uint8_t op;
	switch (wr->opcode) {
	case IBV_WR_SEND: op = SQ_SEND; break;
	case IBV_WR_SEND_WITH_INV: op = SQ_SEND_INV; break;
	case IBV_WR_RDMA_WRITE: op = SQ_WRITE; break;
	case IBV_WR_RDMA_READ: op = SQ_READ; break;
	case IBV_WR_ATOMIC_FETCH_AND_ADD: op = SQ_FETCH_ADD; break;
	case IBV_WR_ATOMIC_CMP_AND_SWP: op = SQ_CMP_SWAP; break;
	case IBV_WR_LOCAL_INV: op = SQ_LOCAL_INV; break;
	default: return EINVAL; /* immediate data, memory windows, TSO: not iWARP's */
	}
	uint8_t flags = 0;
	if ((wr->send_flags & IBV_SEND_SIGNALED) || q->sq_sig_all)
		flags |= WR_SIGNALED;
	if (wr->send_flags & IBV_SEND_SOLICITED)
		flags |= WR_SOLICITED;
	if (wr->send_flags & IBV_SEND_FENCE)
		flags |= WR_FENCE;
	if (wr->num_sge < 0 || wr->num_sge > SRN_RING_SGE || (uint32_t)wr->num_sge > q->cap.max_send_sge)
		return EINVAL;
	e[0] = op;
	e[1] = flags;
	uint64_t id = wr->wr_id;
	memcpy(e + 8, &id, 8);
	uint32_t u32;
	uint64_t u64;
	switch (op) {
	case SQ_SEND_INV:
	case SQ_LOCAL_INV:
		memcpy(e + 4, &wr->invalidate_rkey, 4);
		break;
	case SQ_WRITE:
	case SQ_READ:
		u32 = wr->wr.rdma.rkey;
		u64 = wr->wr.rdma.remote_addr;
		memcpy(e + 16, &u32, 4);
		memcpy(e + 24, &u64, 8);
		break;
	case SQ_FETCH_ADD:
	case SQ_CMP_SWAP:
		u32 = wr->wr.atomic.rkey;
		memcpy(e + 16, &u32, 4);
		memcpy(e + 24, &wr->wr.atomic.remote_addr, 8);
		memcpy(e + 32, &wr->wr.atomic.compare_add, 8);
		memcpy(e + 40, &wr->wr.atomic.swap, 8);
		break;
	}
	if ((op == SQ_READ || op == SQ_FETCH_ADD || op == SQ_CMP_SWAP) && wr->num_sge != 1)
		return EINVAL; /* the sink is one buffer */
	if ((wr->send_flags & IBV_SEND_INLINE) && (op == SQ_SEND || op == SQ_SEND_INV || op == SQ_WRITE)) {
		/* The octets go now: into an inline slot of this entry's. The
		 * daemon reads them when the request goes out, after it freed
		 * the entry; but it takes an entry only while its own queue,
		 * as deep as the ring, has room, so entry k+2N can be posted
		 * only after request k left that queue: 2N slots suffice. */
		size_t total = 0;
		for (int i = 0; i < wr->num_sge; i++)
			total += wr->sg_list[i].length;
		if (total > q->cap.max_inline_data)
			return EINVAL;
		uint8_t *dst = q->inline_buf + (size_t)(idx & (2 * q->sq.entries - 1)) * q->cap.max_inline_data;
		size_t off = 0;
		for (int i = 0; i < wr->num_sge; i++) {
			memcpy(dst + off, (const void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
			off += wr->sg_list[i].length;
		}
		if (total) {
			e[2] = 1;
			put_sge(e + 64, q->inline_stag, (uint32_t)total, (uintptr_t)dst);
		}
		return 0;
	}
	e[2] = (uint8_t)wr->num_sge;
	for (int i = 0; i < wr->num_sge; i++)
		put_sge(e + 64 + 16 * i, wr->sg_list[i].lkey, wr->sg_list[i].length, wr->sg_list[i].addr);
	return 0;
}

int srn_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct srn_qp *q = to_qp(qp);
	if (srn_session_dead(srn_session_of(qp->context))) {
		*bad = wr; /* the daemon has gone: nothing would take it */
		return EIO;
	}
	int err = 0, posted = 0;
	pthread_spin_lock(&q->sq_lock);
	for (; wr; wr = wr->next) {
		int corrupt = 0;
		uint8_t *slot = srn_reserve(&q->sq, &corrupt);
		if (!slot) {
			err = corrupt ? EIO : ENOMEM;
			break;
		}
		uint8_t e[SRN_SQE_SIZE];
		if ((err = srn_build_sqe(q, wr, e, q->sq.local)))
			break;
		memcpy(slot, e, sizeof(e));
		srn_commit(&q->sq);
		posted = 1;
	}
	if (posted)
		srn_sq_posted(q);
	pthread_spin_unlock(&q->sq_lock);
	if (err && wr)
		*bad = wr;
	return err;
}

int srn_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct srn_qp *q = to_qp(qp);
	if (srn_session_dead(srn_session_of(qp->context))) {
		*bad = wr;
		return EIO;
	}
	int err = 0, posted = 0;
	pthread_spin_lock(&q->rq_lock);
	for (; wr; wr = wr->next) {
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > q->cap.max_recv_sge) {
			err = EINVAL;
			break;
		}
		int corrupt = 0;
		uint8_t *slot = srn_reserve(&q->rq, &corrupt);
		if (!slot) {
			err = corrupt ? EIO : ENOMEM;
			break;
		}
		uint8_t e[SRN_RQE_SIZE] = {0};
		uint64_t id = wr->wr_id;
		memcpy(e, &id, 8);
		e[8] = (uint8_t)wr->num_sge;
		for (int i = 0; i < wr->num_sge; i++)
			put_sge(e + 16 + 16 * i, wr->sg_list[i].lkey, wr->sg_list[i].length, wr->sg_list[i].addr);
		memcpy(slot, e, sizeof(e));
		srn_commit(&q->rq);
		posted = 1;
	}
	pthread_spin_unlock(&q->rq_lock);
	if (posted && (srn_flags(&q->rq) & SRN_NEED_WAKEUP)) {
		/* the send ring's lock orders ready() against posts there */
		pthread_spin_lock(&q->sq_lock);
		(void)ready(q);
		pthread_spin_unlock(&q->sq_lock);
	}
	if (err && wr)
		*bad = wr;
	return err;
}

static int free_ep(struct srn_session *s, uint32_t h)
{
	uint8_t b[4];
	srn_put32(b, h);
	int err = srn_call(s, SRN_OP_FREE_EP, b, sizeof(b), NULL, 0, NULL);
	return err == ENODEV ? 0 : err;
}

struct ibv_qp *srn_create_qp_cm(struct ibv_pd *pd, struct ibv_qp_init_attr *attr, uint32_t connect_evd, uint16_t ird,
				uint16_t ord)
{
	if (!pd || !attr || !attr->send_cq || !attr->recv_cq || attr->send_cq->context != pd->context ||
	    attr->recv_cq->context != pd->context) {
		errno = EINVAL;
		return NULL;
	}
	if (attr->qp_type != IBV_QPT_RC || attr->srq) {
		errno = EOPNOTSUPP; /* iWARP is reliable connected; no SRQ */
		return NULL;
	}
	struct srn_context *c = srn_ctx(pd->context);
	struct ibv_qp_cap *cap = &attr->cap;
	if (cap->max_send_sge > c->ia.max_sge || cap->max_recv_sge > c->ia.max_sge || cap->max_send_sge > SRN_RING_SGE ||
	    cap->max_recv_sge > SRN_RING_SGE || cap->max_send_wr > c->ia.max_sq || cap->max_recv_wr > c->ia.max_rq ||
	    cap->max_inline_data > MAX_INLINE) {
		errno = EINVAL;
		return NULL;
	}
	struct srn_qp *q = calloc(1, sizeof(*q));
	if (!q) {
		errno = ENOMEM;
		return NULL;
	}
	struct srn_w w = {0};
	srn_wn(&w, pd->handle, 4);
	srn_wn(&w, attr->recv_cq->handle, 4);
	srn_wn(&w, attr->send_cq->handle, 4);
	srn_wn(&w, connect_evd, 4);
	srn_wn(&w, cap->max_send_wr ? cap->max_send_wr : 1, 4);
	srn_wn(&w, cap->max_recv_wr ? cap->max_recv_wr : 1, 4);
	srn_wn(&w, ird, 2);
	srn_wn(&w, ord, 2);
	srn_wn(&w, 0, 1); /* CRC */
	srn_wn(&w, 0, 1); /* no markers */
	/* MPA revision 2 in peer-to-peer mode (RFC 6581): verbs programs
	 * are written for InfiniBand, where either side may send first,
	 * and an MPA responder may not send before the initiator's first
	 * FPDU; the RTR message gives it one (as Chelsio's peer2peer
	 * default does). $SOFTRNIC_MPA_P2P=0 turns it off, for a peer that
	 * cannot take it. */
	int p2p = !getenv("SOFTRNIC_MPA_P2P") || strcmp(getenv("SOFTRNIC_MPA_P2P"), "0");
	srn_wn(&w, p2p ? 2 : 0, 1); /* MPA revision (0: the daemon's) */
	srn_wn(&w, p2p, 1);
	srn_wn(&w, 0, 1); /* RTR: write or read */
	uint8_t r[41] = {0};
	size_t got = 0;
	int fd = -1, nfds = 0;
	int err = srn_call_fds(&c->sess, SRN_OP_CREATE_EP, w.b, w.n, r, sizeof(r), &got, &fd, 1, &nfds);
	if (err) {
		free(q);
		errno = err;
		return NULL;
	}
	uint32_t h = srn_get32(r);
	if (got != sizeof(r) || !r[4] || nfds != 1) {
		if (got < 4)
			h = 0; /* no handle to free */
		err = EPROTO;
		goto fail;
	}
	if (srn_ring_init(&q->sq, &c->sess, srn_get32(r + 13), srn_get32(r + 5), SRN_SQE_SIZE) ||
	    srn_ring_init(&q->rq, &c->sess, srn_get32(r + 17), srn_get32(r + 9), SRN_RQE_SIZE)) {
		err = EPROTO;
		goto fail;
	}
	uint32_t qpn = srn_get32(r + 37);
	if (!qpn) {
		err = EPROTO;
		goto fail;
	}
	q->slot = srn_get32(r + 21);
	q->queue = srn_readyq_of(c, srn_get32(r + 25), srn_get32(r + 29), srn_get32(r + 33), fd);
	nfds = 0; /* the queue has the doorbell, or closed it */
	if (!q->queue) {
		err = EPROTO;
		goto fail;
	}
	q->cap = *cap;
	q->cap.max_send_wr = q->sq.entries;
	q->cap.max_recv_wr = q->rq.entries;
	q->cap.max_send_sge = q->cap.max_recv_sge = SRN_RING_SGE < c->ia.max_sge ? SRN_RING_SGE : c->ia.max_sge;
	/* Every QP can send some octets inline, whatever it asked for, as
	 * hardware's and siw's can (their WQEs hold a few dozen octets
	 * anyway): rdma_xclient sends 16 with IBV_SEND_INLINE and asks for
	 * none. The capacity given back says how many. */
	q->cap.max_inline_data = (cap->max_inline_data + 63) & ~63u;
	if (q->cap.max_inline_data < MIN_INLINE)
		q->cap.max_inline_data = MIN_INLINE;
	size_t n = (size_t)2 * q->sq.entries * q->cap.max_inline_data;
	if (posix_memalign((void **)&q->inline_buf, 64, n)) {
		err = ENOMEM;
		goto fail;
	}
	memset(q->inline_buf, 0, n);
	if ((err = srn_register(&c->sess, pd->handle, q->inline_buf, n, 0, &q->inline_lmr, &q->inline_stag)))
		goto fail;
	*cap = q->cap;
	q->sq_sig_all = attr->sq_sig_all;
	pthread_spin_init(&q->sq_lock, PTHREAD_PROCESS_PRIVATE);
	pthread_spin_init(&q->rq_lock, PTHREAD_PROCESS_PRIVATE);
	struct ibv_qp *qp = &q->qp;
	qp->context = pd->context;
	qp->qp_context = attr->qp_context;
	qp->pd = pd;
	qp->send_cq = attr->send_cq;
	qp->recv_cq = attr->recv_cq;
	qp->handle = h;
	qp->qp_num = qpn; /* the daemon's QP number, what a peer names it by */
	qp->state = IBV_QPS_INIT;
	q->cm = connect_evd != 0;
	pthread_mutex_lock(&c->qmu);
	q->next = c->qps;
	c->qps = q;
	pthread_mutex_unlock(&c->qmu);
	qp->qp_type = IBV_QPT_RC;
	pthread_mutex_init(&qp->mutex, NULL);
	pthread_cond_init(&qp->cond, NULL);
	return qp;
fail:
	if (nfds)
		close(fd);
	free(q->inline_buf);
	if (h)
		free_ep(&c->sess, h);
	free(q);
	errno = err;
	return NULL;
}

EXPORT struct ibv_qp *srn_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	if (!pd) {
		errno = EINVAL;
		return NULL;
	}
	const struct srn_ia *ia = &srn_ctx(pd->context)->ia;
	return srn_create_qp_cm(pd, attr, 0, ia->max_ird, ia->max_ord);
}
SYMVER_DEFAULT(srn_create_qp, ibv_create_qp, "IBVERBS_1.1");

/*
 * gone waits until the daemon has let go of a freed EP: a connected one
 * is aborted, and freed by its terminal event, holding its CQs and PD
 * until then; ibv_destroy_qp returns when they are free to destroy, as
 * a kernel device's does. At most 10 s: a daemon that takes longer has
 * the CQs refused with EBUSY.
 */
static void gone(struct srn_session *s, uint32_t h)
{
	uint8_t b[4], r[2048];
	srn_put32(b, h);
	for (int i = 0; i < 10000; i++) {
		size_t got;
		if (srn_call(s, SRN_OP_QUERY_EP, b, sizeof(b), r, sizeof(r), &got))
			return; /* no such EP (any more), or no daemon */
		usleep(i < 100 ? 100 : 1000);
	}
}

/* disconnect asks the daemon to end the QP's connection, gracefully or
 * not: 0 or an errno value (EBUSY: not connected). */
static int disconnect(struct ibv_qp *qp, int graceful)
{
	struct srn_w w = {0};
	srn_wn(&w, qp->handle, 4);
	srn_wn(&w, graceful, 1);
	return srn_call(srn_session_of(qp->context), SRN_OP_DISCONNECT, w.b, w.n, NULL, 0, NULL);
}

/* state is the QP's state as the daemon publishes its EP's in the send
 * ring (ctl.EP*): connected is RTS; one that was and is no more, error. */
static enum ibv_qp_state state(struct srn_qp *q)
{
	uint32_t s = __atomic_load_n(srn_word(&q->sq, SRN_RING_STATE), __ATOMIC_ACQUIRE);
	switch (s) {
	case SRN_EP_CONNECTED: return IBV_QPS_RTS;
	case SRN_EP_DISCONNECT_PENDING: return IBV_QPS_SQD;
	case SRN_EP_DISCONNECTED: return IBV_QPS_ERR;
	default:
		/* not connected (yet): ERR and RTR as the program set them,
		 * and RTS on a QP connecting the InfiniBand way */
		if (q->qp.state == IBV_QPS_ERR || q->qp.state == IBV_QPS_RTR || (q->ib && q->qp.state == IBV_QPS_RTS))
			return q->qp.state;
		return IBV_QPS_INIT;
	}
}

int srn_qp_destroy(struct ibv_qp *qp)
{
	struct srn_qp *q = to_qp(qp);
	struct srn_session *s = srn_session_of(qp->context);
	if (q->ib && state(q) == IBV_QPS_RTS) {
		/* A program written for InfiniBand ends its connection so,
		 * its last Sends completed but perhaps not yet all on the
		 * wire: they go, then our FIN, rather than a reset that
		 * would throw them away (the daemon frees a graceful close
		 * with nothing left to send in order). */
		(void)disconnect(qp, 1);
	}
	int err = free_ep(s, qp->handle);
	if (err)
		return err;
	gone(s, qp->handle);
	struct srn_context *c = srn_ctx(qp->context);
	pthread_mutex_lock(&c->qmu);
	for (struct srn_qp **p = &c->qps; *p; p = &(*p)->next) {
		if (*p == q) {
			*p = q->next;
			break;
		}
	}
	pthread_mutex_unlock(&c->qmu);
	if (q->inline_buf) {
		srn_free_lmr(s, q->inline_lmr);
		free(q->inline_buf);
	}
	free(q->wr);
	pthread_spin_destroy(&q->sq_lock);
	pthread_spin_destroy(&q->rq_lock);
	pthread_mutex_destroy(&qp->mutex);
	pthread_cond_destroy(&qp->cond);
	free(q);
	return 0;
}

EXPORT int srn_destroy_qp(struct ibv_qp *qp)
{
	return qp ? srn_qp_destroy(qp) : EINVAL;
}
SYMVER_DEFAULT(srn_destroy_qp, ibv_destroy_qp, "IBVERBS_1.1");

uint32_t srn_qpn_of(struct srn_context *c, uint32_t ep)
{
	uint32_t qpn = ep;
	if (!c)
		return qpn;
	pthread_mutex_lock(&c->qmu);
	for (struct srn_qp *q = c->qps; q; q = q->next) {
		if (q->qp.handle == ep) {
			qpn = q->qp.qp_num;
			break;
		}
	}
	pthread_mutex_unlock(&c->qmu);
	return qpn;
}

EXPORT int srn_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask, struct ibv_qp_init_attr *init)
{
	if (!qp || !attr || !init)
		return EINVAL;
	struct srn_qp *q = to_qp(qp);
	memset(attr, 0, sizeof(*attr));
	memset(init, 0, sizeof(*init));
	attr->qp_state = attr->cur_qp_state = qp->state = state(q);
	attr->path_mtu = IBV_MTU_1024;
	attr->qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	attr->cap = q->cap;
	attr->port_num = 1;
	const struct srn_ia *ia = &srn_ctx(qp->context)->ia;
	attr->max_rd_atomic = ia->max_ord;
	attr->max_dest_rd_atomic = ia->max_ird;
	init->qp_context = qp->qp_context;
	init->send_cq = qp->send_cq;
	init->recv_cq = qp->recv_cq;
	init->cap = q->cap;
	init->qp_type = IBV_QPT_RC;
	init->sq_sig_all = q->sq_sig_all;
	return 0;
}
SYMVER_DEFAULT(srn_query_qp, ibv_query_qp, "IBVERBS_1.1");

/*
 * ib_connect connects a QP the InfiniBand way, at RTR with IBV_QP_AV and
 * IBV_QP_DEST_QPN: the program swapped QP numbers and addresses with its
 * peer out of band (perftest without -R, qperf without -cm1), and the
 * daemon turns the pair into an MPA connection (ctl.ConnectQP,
 * daemon/ibconn.go): the lower (address, QPN) connects to the peer
 * daemon's IB-connection port, the other waits for it. The peer's IPv4
 * address is the AV's GRH dgid when it has one (this device's GID is its
 * address, IPv4-mapped), else the LID's (this device's LID is the low 16
 * bits of its address, the rest the same within a subnet). Receives
 * posted before RTR are the QP's before the peer can send.
 */
static int ib_connect(struct srn_qp *q, const struct ibv_qp_attr *attr)
{
	static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	const struct ibv_ah_attr *ah = &attr->ah_attr;
	char ip[INET_ADDRSTRLEN] = "";
	if (ah->is_global) {
		if (memcmp(ah->grh.dgid.raw, mapped, sizeof(mapped)))
			return EINVAL; /* not an IPv4 address: no peer of iWARP's */
		if (!inet_ntop(AF_INET, ah->grh.dgid.raw + 12, ip, sizeof(ip)))
			return EINVAL;
	} else if (!ah->dlid) {
		return EINVAL;
	}
	struct srn_w w = {0};
	srn_wn(&w, q->qp.handle, 4);
	srn_wbytes(&w, ip, strlen(ip));
	srn_wn(&w, ah->is_global ? 0 : ah->dlid, 2);
	srn_wn(&w, attr->dest_qp_num, 4);
	uint8_t r[128];
	size_t got = 0;
	int err = srn_call(srn_session_of(q->qp.context), SRN_OP_CONNECT_QP, w.b, w.n, r, sizeof(r), &got);
	if (err)
		return err == EOPNOTSUPP ? EINVAL : err; /* a daemon without the port: as siw */
	q->ib = 1;
	return 0;
}

/*
 * ibv_modify_qp: an iWARP QP's states follow its connection. On a QP of
 * the RDMA-CM, which makes the connection, the transitions an application
 * asks for on the way (INIT, RTR, RTS) are noted, and an attempt to
 * connect it the InfiniBand way is refused (EINVAL), as siw refuses it. On
 * a QP of the verbs alone, RTR naming the peer's QP and address starts
 * its connection (ib_connect) and RTS returns at once, as on InfiniBand:
 * ibv_rc_pingpong's server goes to RTS before it sends the client the
 * QPN the client's RTR needs, so waiting there for the connection would
 * wait for ever. What is posted meanwhile goes out once the connection
 * is up; a connection that never comes puts the QP in ERR, and what was
 * posted completes flushed. A move to ERR
 * ends the connection at once, flushing what is outstanding. Other
 * attributes are the connection's and are not changed here.
 */
EXPORT int srn_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	if (!qp || !attr)
		return EINVAL;
	if (!(mask & IBV_QP_STATE))
		return 0;
	struct srn_qp *q = to_qp(qp);
	int ib = (mask & (IBV_QP_AV | IBV_QP_DEST_QPN)) == (IBV_QP_AV | IBV_QP_DEST_QPN);
	switch (attr->qp_state) {
	case IBV_QPS_RTR:
		if (!q->cm && ib && !q->ib && state(q) == IBV_QPS_INIT) {
			int err = ib_connect(q, attr);
			if (err)
				return err;
			qp->state = IBV_QPS_RTR;
			return 0;
		}
		if (q->ib && ib)
			return EINVAL; /* connected, or connecting, to a peer already */
		/* fall through */
	case IBV_QPS_RTS:
		/* An InfiniBand connection, made by naming the peer's QP and
		 * address vector, on a QP the RDMA-CM connects (or without
		 * both, or twice): refused at once, rather than a QP that
		 * looks ready and never moves a message. */
		if ((mask & (IBV_QP_AV | IBV_QP_DEST_QPN)) && state(q) != IBV_QPS_RTS)
			return EINVAL;
		/* fall through */
	case IBV_QPS_RESET:
	case IBV_QPS_INIT:
		qp->state = attr->qp_state;
		return 0;
	case IBV_QPS_ERR: {
		int err = disconnect(qp, 0);
		if (err && err != EBUSY && err != ENODEV)
			return err; /* EBUSY: not connected, nothing to end */
		qp->state = IBV_QPS_ERR;
		return 0;
	}
	default:
		return EINVAL;
	}
}
SYMVER_DEFAULT(srn_modify_qp, ibv_modify_qp, "IBVERBS_1.1");
