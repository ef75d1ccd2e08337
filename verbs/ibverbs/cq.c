/*
 * Completion queues and completion channels. A CQ is an EVD of
 * completions: ibv_poll_cq reads its ring in the shared region, with no
 * system call. A completion channel is an epoll descriptor over the
 * eventfds of its CQs, which the daemon signals when it adds a completion
 * to a CQ that ibv_req_notify_cq armed: it can be polled, and made
 * non-blocking, as the channel of a kernel device.
 */
#define _GNU_SOURCE
#include "srn.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

static struct srn_cq *to_cq(struct ibv_cq *cq) { return (struct srn_cq *)cq; }

EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *ctx)
{
	if (!ctx) {
		errno = EINVAL;
		return NULL;
	}
	struct ibv_comp_channel *ch = calloc(1, sizeof(*ch));
	if (!ch) {
		errno = ENOMEM;
		return NULL;
	}
	/* The set holds the CQs' eventfds and the session's socket, so that
	 * a waiter wakes when the daemon hangs up (data.ptr NULL). */
	ch->fd = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event hup = {.events = EPOLLRDHUP, .data.ptr = NULL};
	if (ch->fd < 0 || epoll_ctl(ch->fd, EPOLL_CTL_ADD, srn_session_of(ctx)->fd, &hup) < 0) {
		int e = errno;
		if (ch->fd >= 0)
			close(ch->fd);
		free(ch);
		errno = e;
		return NULL;
	}
	ch->context = ctx;
	return ch;
}

/* ibv_destroy_comp_channel: EBUSY while a CQ uses the channel. */
EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *ch)
{
	if (!ch)
		return EINVAL;
	if (__atomic_load_n(&ch->refcnt, __ATOMIC_ACQUIRE))
		return EBUSY;
	close(ch->fd);
	free(ch);
	return 0;
}

EXPORT struct ibv_cq *srn_create_cq(struct ibv_context *ctx, int cqe, void *cq_context, struct ibv_comp_channel *ch,
				    int vector)
{
	if (!ctx || cqe < 1 || (ch && ch->context != ctx) || vector < 0 || vector >= ctx->num_comp_vectors) {
		errno = EINVAL;
		return NULL;
	}
	struct srn_context *c = srn_ctx(ctx);
	if ((uint32_t)cqe > c->ia.max_evd_depth) {
		errno = EINVAL;
		return NULL;
	}
	struct srn_cq *q = calloc(1, sizeof(*q));
	if (!q) {
		errno = ENOMEM;
		return NULL;
	}
	int err = srn_evd_create(&c->sess, (uint32_t)cqe, SRN_EVD_DTO, &q->evd);
	if (err) {
		free(q);
		errno = err;
		return NULL;
	}
	if (ch) {
		struct epoll_event ev = {.events = EPOLLIN, .data.ptr = q};
		if (epoll_ctl(ch->fd, EPOLL_CTL_ADD, q->evd.notify, &ev) < 0) {
			err = errno;
			srn_evd_free(&q->evd);
			free(q);
			errno = err;
			return NULL;
		}
		__atomic_add_fetch(&ch->refcnt, 1, __ATOMIC_ACQ_REL);
	}
	q->cq.context = ctx;
	q->cq.channel = ch;
	q->cq.cq_context = cq_context;
	q->cq.handle = q->evd.h;
	q->cq.cqe = (int)q->evd.ring.entries;
	pthread_mutex_init(&q->cq.mutex, NULL);
	pthread_cond_init(&q->cq.cond, NULL);
	return &q->cq;
}
SYMVER_DEFAULT(srn_create_cq, ibv_create_cq, "IBVERBS_1.1");

/* ibv_destroy_cq: EBUSY while a QP uses it; it waits until every
 * completion event ibv_get_cq_event returned was acknowledged. */
EXPORT int srn_destroy_cq(struct ibv_cq *cq)
{
	if (!cq)
		return EINVAL;
	struct srn_cq *q = to_cq(cq);
	pthread_mutex_lock(&cq->mutex);
	/* At least as many acknowledged as handed out: fio acknowledges
	 * completions rather than events, more than it was given. */
	while (cq->comp_events_completed < __atomic_load_n(&q->events, __ATOMIC_ACQUIRE))
		pthread_cond_wait(&cq->cond, &cq->mutex);
	pthread_mutex_unlock(&cq->mutex);
	/* Out of the channel's set first: a fork child holding the eventfd
	 * would keep it there, pointing at the freed CQ. */
	if (cq->channel)
		epoll_ctl(cq->channel->fd, EPOLL_CTL_DEL, q->evd.notify, NULL);
	int err = srn_evd_free(&q->evd);
	if (err) {
		if (cq->channel) {
			struct epoll_event ev = {.events = EPOLLIN, .data.ptr = q};
			epoll_ctl(cq->channel->fd, EPOLL_CTL_ADD, q->evd.notify, &ev);
		}
		return err;
	}
	if (cq->channel)
		__atomic_sub_fetch(&cq->channel->refcnt, 1, __ATOMIC_ACQ_REL);
	pthread_mutex_destroy(&cq->mutex);
	pthread_cond_destroy(&cq->cond);
	free(q);
	return 0;
}
SYMVER_DEFAULT(srn_destroy_cq, ibv_destroy_cq, "IBVERBS_1.1");

/* ibv_wc_status of completion.Status, by number. */
static const enum ibv_wc_status wc_status[] = {
	IBV_WC_SUCCESS, IBV_WC_LOC_LEN_ERR, IBV_WC_LOC_PROT_ERR, IBV_WC_LOC_QP_OP_ERR, IBV_WC_WR_FLUSH_ERR,
	IBV_WC_REM_ACCESS_ERR, IBV_WC_REM_OP_ERR, IBV_WC_REM_INV_REQ_ERR, IBV_WC_BAD_RESP_ERR, IBV_WC_GENERAL_ERR,
};

/* ibv_wc_opcode of shm.DTOOpcode, by number. iWARP's Immediate Data
 * messages (RFC 7306) are not verbs' immediate data: neither is made
 * through verbs, and none arrives from a peer that verbs drives. */
static const enum ibv_wc_opcode wc_opcode[] = {
	IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ, IBV_WC_FETCH_ADD, IBV_WC_COMP_SWAP, IBV_WC_LOCAL_INV,
	IBV_WC_SEND, IBV_WC_RECV, IBV_WC_RECV,
};

/* on_datapath_cpu says whether this thread runs on a CPU the daemon's
 * datapath runs on (sched_getcpu reads rseq or the vDSO: no system call). */
static int on_datapath_cpu(const struct srn_ia *ia)
{
	int c = sched_getcpu();
	if (c < 0 || (size_t)c / 8 >= ia->ncpus)
		return c < 0;
	return ia->cpus[c / 8] >> (c % 8) & 1;
}

/*
 * Whether an empty ibv_poll_cq yields the processor, by
 * $SOFTRNIC_POLL_YIELD: "always" (the default: on a host whose cores the
 * programs share with the pollers, of this daemon or of another, a spin
 * that never yields holds them off for a time slice); "daemon", only on a
 * CPU the daemon's datapath runs on (a host with one daemon, its pollers
 * pinned to cores of their own: elsewhere no system call); "never". Any
 * other value is the default, said once on stderr.
 */
enum { YIELD_ALWAYS, YIELD_DAEMON, YIELD_NEVER };

static int poll_yield(void)
{
	static int mode = -1;
	int m = __atomic_load_n(&mode, __ATOMIC_RELAXED);
	if (m < 0) {
		const char *e = getenv("SOFTRNIC_POLL_YIELD");
		m = e && strcmp(e, "daemon") == 0 ? YIELD_DAEMON : e && strcmp(e, "never") == 0 ? YIELD_NEVER : YIELD_ALWAYS;
		/* one thread says so, the first to find it out */
		if (e && *e && m == YIELD_ALWAYS && strcmp(e, "always") != 0 &&
		    __atomic_exchange_n(&mode, m, __ATOMIC_RELAXED) < 0)
			fprintf(stderr, "softrnic: SOFTRNIC_POLL_YIELD=\"%s\" is none of always, daemon, never: always is used\n", e);
		__atomic_store_n(&mode, m, __ATOMIC_RELAXED);
	}
	return m;
}

int srn_cq_take(struct srn_cq *q, struct ibv_wc *w)
{
	for (;;) {
		struct srn_eve e;
		int r = srn_evd_next(&q->evd, &e);
		if (r <= 0)
			return r;
		if (e.kind == SRN_EVENT_OVERFLOW)
			return -1; /* the daemon lost completions: the CQ overran */
		if (e.kind != SRN_EVENT_DTO)
			continue;
		memset(w, 0, sizeof(*w));
		w->wr_id = e.id;
		w->status = e.status < sizeof(wc_status) / sizeof(wc_status[0]) ? wc_status[e.status] : IBV_WC_GENERAL_ERR;
		w->opcode = e.opcode < sizeof(wc_opcode) / sizeof(wc_opcode[0]) ? wc_opcode[e.opcode] : IBV_WC_SEND;
		w->byte_len = e.byte_len;
		if (e.ep != q->last_ep) {
			q->last_qpn = srn_qpn_of(srn_ctx(q->cq.context), e.ep);
			q->last_ep = e.ep;
		}
		w->qp_num = q->last_qpn;
		if (e.flags & 2) { /* shm.EVEInvalidated */
			w->wc_flags |= IBV_WC_WITH_INV;
			w->invalidated_rkey = e.invalidated;
		}
		return 1;
	}
}

int srn_cq_found_empty(struct srn_cq *q)
{
	struct srn_context *c = srn_ctx(q->cq.context);
	++q->empty;
	if (srn_session_dead(&c->sess) || (q->empty % SRN_GONE_EVERY == 0 && srn_session_gone(&c->sess))) {
		/* The daemon has gone: what was in the CQ was taken, and
		 * nothing more will come. An error, not a wait forever. */
		return EIO;
	}
	int mode = poll_yield();
	if (q->empty % SRN_YIELD_EVERY == 0 && (mode == YIELD_ALWAYS || (mode == YIELD_DAEMON && on_datapath_cpu(&c->ia)))) {
		/* The work this completion waits for is a daemon's, which may
		 * share this processor: a program that spins on an empty CQ
		 * (perftest does) would hold it off for a time slice. */
		sched_yield();
	}
	return 0;
}

int srn_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	struct srn_cq *q = to_cq(cq);
	int got = 0;
	pthread_spin_lock(&q->evd.lock);
	while (got < n) {
		int r = srn_cq_take(q, &wc[got]);
		if (r < 0)
			got = got ? got : -1;
		if (r <= 0)
			break;
		got++;
	}
	pthread_spin_unlock(&q->evd.lock);
	if (got) {
		q->empty = 0;
		return got;
	}
	int err = srn_cq_found_empty(q);
	if (err) {
		errno = err;
		return -1;
	}
	return 0;
}

/* ibv_req_notify_cq: the next completion added signals the channel, as
 * with a kernel device: completions already in the CQ do not (an
 * application polls after arming). No event without a new completion:
 * fio's rdma engine, given one, leaves it unacknowledged and its
 * ibv_destroy_cq waits forever. Solicited only is not told apart: every
 * completion is one an application waiting for solicited ones may see
 * early, never late. */
int srn_req_notify_cq(struct ibv_cq *cq, int solicited)
{
	struct srn_cq *q = to_cq(cq);
	if (!cq->channel)
		return EINVAL;
	srn_evd_arm(&q->evd);
	return 0;
}

EXPORT int srn_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context)
{
	if (!ch || !cq || !cq_context) {
		errno = EINVAL;
		return -1;
	}
	int nonblock = fcntl(ch->fd, F_GETFL) & O_NONBLOCK;
	for (;;) {
		struct epoll_event ev;
		int n = epoll_wait(ch->fd, &ev, 1, nonblock ? 0 : -1);
		if (n < 0)
			return -1;
		if (n == 0) {
			errno = EAGAIN;
			return -1;
		}
		struct srn_cq *q = ev.data.ptr;
		if (!q) {
			/* the daemon has gone: no completion will come */
			srn_session_gone(srn_session_of(ch->context));
			errno = EIO;
			return -1;
		}
		uint64_t v;
		if (read(q->evd.notify, &v, sizeof(v)) != sizeof(v))
			continue; /* another thread took it */
		__atomic_add_fetch(&q->events, 1, __ATOMIC_ACQ_REL);
		*cq = &q->cq;
		*cq_context = q->cq.cq_context;
		return 0;
	}
}
SYMVER_DEFAULT(srn_get_cq_event, ibv_get_cq_event, "IBVERBS_1.1");

EXPORT void srn_ack_cq_events(struct ibv_cq *cq, unsigned int n)
{
	if (!cq)
		return;
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += n;
	pthread_cond_signal(&cq->cond);
	pthread_mutex_unlock(&cq->mutex);
}
SYMVER_DEFAULT(srn_ack_cq_events, ibv_ack_cq_events, "IBVERBS_1.1");
