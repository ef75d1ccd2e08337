/*
 * softrnic's libibverbs.so.1: the verbs ABI of Debian's rdma-core over
 * softrnicd, with no kernel RDMA device (issue 22). Internal header, also
 * compiled into librdmacm.so.1 (verbs/rdmacm), which reaches a context's
 * session and its private operations through struct srn_context.
 *
 * Exported symbols: a name the library exports in one version only, as
 * the default, is defined under its name with EXPORT; a name that also has
 * compat versions (verbs/abi: Versioned) is defined under another name and
 * bound to its node with SYMVER_DEFAULT, as rdma-core's util/symver.h
 * does. Every other symbol of the table is defined in stubs.c, which make
 * generate writes (verbs/abi/gen) for the names no source here defines.
 */
#ifndef SRN_VERBS_H
#define SRN_VERBS_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define EXPORT __attribute__((visibility("default")))
#define HIDDEN __attribute__((visibility("hidden")))
#define SYMVER_DEFAULT(impl, name, node) __asm__(".symver " #impl ", " #name "@@" node)
#define SYMVER_COMPAT(impl, name, node) __asm__(".symver " #impl ", " #name "@" node)

/* What softrnicd says of its interface adapter (ctl.IAAttr). */
struct srn_ia {
	char name[64];     /* the interface */
	char datapath[16]; /* kernel or xdp */
	char address[64];  /* its IP address */
	uint32_t max_ep, max_evd, max_evd_depth;
	uint64_t max_lmr_size;
	uint16_t max_private;
	uint8_t max_sge;
	uint16_t max_ird, max_ord;
	uint32_t max_sq, max_rq;
	char version[64];
	/* the CPUs the daemon's datapath runs on (ctl.IAAttr.DatapathCPUs):
	 * bit i%8 of cpus[i/8], ncpus octets */
	uint8_t cpus[128];
	size_t ncpus;
};

/* srn_socket_path is where a session connects: $SOFTRNIC_SOCKET, else the
 * only daemon socket in SRN_SOCKET_DIR (ctl.DefaultSocket's directory). */
#define SRN_SOCKET_DIR "/run/softrnic"
const char *srn_socket_path(void) HIDDEN;

/*
 * A session with the daemon: its socket (one request at a time), the
 * shared region its rings are carved from, and the doorbell that wakes
 * the daemon's loop of the session when an event ring it filled has room
 * again.
 */
struct srn_session {
	int fd;
	pthread_mutex_t mu;
	uint32_t next_id;
	int doorbell;
	uint8_t *region;
	size_t region_len;
	pid_t daemon_pid;
	pid_t pid;  /* the process that opened it: a fork child's calls fail */
	int broken; /* a reply did not come in time, or was not one */
	int gone;   /* the daemon hung up (atomic): srn_session_gone */
};

/*
 * srn_session_open says Hello, reads the daemon's attributes and, with
 * map set, maps the shared region and keeps the doorbell (else closes
 * both: a device list needs only the attributes). 0 or an errno value.
 */
int srn_session_open(struct srn_session *s, const char *client, struct srn_ia *ia, int map) HIDDEN;
void srn_session_close(struct srn_session *s) HIDDEN;

/* srn_session_gone says whether the daemon has hung up: it remembers a
 * hang-up seen, else asks the socket (one poll(2), never blocking). */
int srn_session_gone(struct srn_session *s) HIDDEN;

/* srn_session_dead is srn_session_gone's memory alone: no system call,
 * for the data path. */
static inline int srn_session_dead(struct srn_session *s) { return __atomic_load_n(&s->gone, __ATOMIC_RELAXED); }

/*
 * srn_call makes one request (op, with body) and reads the reply's body
 * into reply (at most cap octets; its length in *got). It returns 0, or
 * an errno value: the daemon's refusal mapped from its DAT status,
 * ENODEV when the daemon has gone, ETIMEDOUT when it does not answer,
 * EPROTO for a reply that is not one. Descriptors the reply passes are
 * closed; srn_call_fds returns up to max of them in fds (*nfds), the
 * caller's to close, and closes the rest.
 */
int srn_call(struct srn_session *s, uint16_t op, const uint8_t *body, size_t len, uint8_t *reply, size_t cap,
	     size_t *got) HIDDEN;
int srn_call_fds(struct srn_session *s, uint16_t op, const uint8_t *body, size_t len, uint8_t *reply, size_t cap,
		 size_t *got, int *fds, int max, int *nfds) HIDDEN;

/* srn_block is n octets of the region at off, or NULL when the daemon
 * named memory outside it. */
uint8_t *srn_block(struct srn_session *s, uint32_t off, size_t n) HIDDEN;

/* Control operations (ctl.Op). */
enum {
	SRN_OP_CREATE_PZ = 3,
	SRN_OP_FREE_PZ = 4,
	SRN_OP_FREE_LMR = 6,
	SRN_OP_CREATE_EVD = 7,
	SRN_OP_FREE_EVD = 8,
	SRN_OP_CREATE_EP = 9,
	SRN_OP_MODIFY_EP = 10,
	SRN_OP_QUERY_EP = 11,
	SRN_OP_FREE_EP = 12,
	SRN_OP_CONNECT = 13,
	SRN_OP_DISCONNECT = 14,
	SRN_OP_RESET_EP = 15,
	SRN_OP_CREATE_PSP = 16,
	SRN_OP_FREE_PSP = 17,
	SRN_OP_QUERY_CR = 19,
	SRN_OP_ACCEPT_CR = 20,
	SRN_OP_REJECT_CR = 21,
	SRN_OP_REGISTER_PROCESS_MEMORY = 27,
	SRN_OP_CONNECT_QP = 28,
	SRN_OP_RESERVE_PORT = 29,
	SRN_OP_FREE_PORT = 30,
	SRN_OP_RESOLVE_ROUTE = 31,
};

/* EVD flags (ctl.EVD*), LMR access (ctl.Access*), connection events
 * (ctl.Ev*), EP states (ctl.EP*). */
enum {
	SRN_EVD_DTO = 1,
	SRN_EVD_CONNECTION = 2,
	SRN_EVD_CR = 4,
	SRN_ACCESS_LOCAL_WRITE = 1,
	SRN_ACCESS_REMOTE_READ = 2,
	SRN_ACCESS_REMOTE_WRITE = 4,
	SRN_ACCESS_REMOTE_ATOMIC = 8,
	SRN_EV_ESTABLISHED = 1,
	SRN_EV_PEER_REJECTED = 2,
	SRN_EV_NON_PEER_REJECTED = 3,
	SRN_EV_UNREACHABLE = 4,
	SRN_EV_TIMED_OUT = 5,
	SRN_EV_DISCONNECTED = 6,
	SRN_EV_BROKEN = 7,
	SRN_EV_ACCEPT_COMPLETION_ERROR = 8,
	SRN_EP_CONNECTED = 6,
	SRN_EP_DISCONNECT_PENDING = 7,
	SRN_EP_DISCONNECTED = 8,
};

/* A message body under construction: fields big-endian, strings and
 * octet slices as a 16-bit length and the octets (package ctl). */
struct srn_w {
	uint8_t b[1024];
	size_t n;
	int bad;
};

static inline void srn_wn(struct srn_w *w, uint64_t v, size_t n)
{
	if (w->n + n > sizeof(w->b)) {
		w->bad = 1;
		return;
	}
	for (size_t i = 0; i < n; i++)
		w->b[w->n + i] = (uint8_t)(v >> (8 * (n - 1 - i)));
	w->n += n;
}

static inline void srn_wbytes(struct srn_w *w, const void *p, size_t n)
{
	if (n > 0xffff || w->n + 2 + n > sizeof(w->b)) {
		w->bad = 1;
		return;
	}
	srn_wn(w, n, 2);
	if (n)
		__builtin_memcpy(w->b + w->n, p, n);
	w->n += n;
}

/* A reader of a reply body that fails once anything is short. */
struct srn_r {
	const uint8_t *p, *end;
	int bad;
};

static inline const uint8_t *srn_take(struct srn_r *r, size_t n)
{
	if (r->bad || (size_t)(r->end - r->p) < n) {
		r->bad = 1;
		return NULL;
	}
	const uint8_t *p = r->p;
	r->p += n;
	return p;
}

static inline uint64_t srn_rn(struct srn_r *r, size_t n)
{
	const uint8_t *p = srn_take(r, n);
	uint64_t v = 0;
	for (size_t i = 0; p && i < n; i++)
		v = v << 8 | p[i];
	return v;
}

/* srn_rbytes reads a string or octet slice: at most cap octets are kept
 * (*len says how many), the rest skipped. */
static inline void srn_rbytes(struct srn_r *r, void *dst, size_t cap, size_t *len)
{
	size_t n = srn_rn(r, 2);
	const uint8_t *p = srn_take(r, n);
	if (!p)
		n = 0;
	if (n > cap)
		n = cap;
	if (n)
		__builtin_memcpy(dst, p, n);
	if (len)
		*len = n;
}

/* Big-endian fields. */
static inline void srn_put32(uint8_t *b, uint32_t v)
{
	b[0] = v >> 24; b[1] = v >> 16; b[2] = v >> 8; b[3] = v;
}
static inline uint32_t srn_get32(const uint8_t *b)
{
	return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/*
 * Rings (internal/shm): a single-producer single-consumer ring in the
 * shared region: producer index at 0, consumer index at 64, flags at 128,
 * room wanted (event rings) or queued (request rings) at 192, the EP's
 * state (send rings) at 224, entries from 256. Each side keeps its own
 * index and trusts nothing the other writes: an index that claims more
 * entries than the ring holds is a broken daemon.
 */
enum {
	SRN_RING_HEADER = 256,
	SRN_RING_PROD = 0,
	SRN_RING_CONS = 64,
	SRN_RING_FLAGS = 128,
	SRN_RING_WANTED = 192,
	SRN_RING_STATE = 224,
	SRN_NEED_WAKEUP = 1, /* request rings: the daemon sleeps */
	SRN_ARMED = 1,       /* event rings: signal the eventfd */
	SRN_SQE_SIZE = 128,
	SRN_RQE_SIZE = 128,
	SRN_EVE_SIZE = 64,
	SRN_READY_SIZE = 4,
	SRN_RING_SGE = 4,
};

struct srn_ring {
	uint8_t *mem;
	uint32_t entries, esize;
	uint32_t local; /* this side's index */
};

static inline uint32_t *srn_word(const struct srn_ring *r, int off)
{
	return (uint32_t *)(void *)(r->mem + off);
}

static inline size_t srn_ring_size(uint32_t entries, uint32_t esize)
{
	return SRN_RING_HEADER + (size_t)entries * esize;
}

/* srn_ring_init views a block of the region as a ring; 0, or EPROTO for
 * a geometry that is not one. */
static inline int srn_ring_init(struct srn_ring *r, struct srn_session *s, uint32_t off, uint32_t entries,
				uint32_t esize)
{
	if (entries == 0 || (entries & (entries - 1)) || entries > 1u << 24)
		return EPROTO;
	r->mem = srn_block(s, off, srn_ring_size(entries, esize));
	if (!r->mem)
		return EPROTO;
	r->entries = entries;
	r->esize = esize;
	r->local = 0;
	return 0;
}

static inline uint8_t *srn_slot(const struct srn_ring *r, uint32_t i)
{
	return r->mem + SRN_RING_HEADER + (size_t)(i & (r->entries - 1)) * r->esize;
}

/* Producer: the free entry n after the next (entries written but not
 * yet committed before it), NULL when full; *corrupt set when the
 * consumer's index is impossible. */
static inline uint8_t *srn_reserve_at(struct srn_ring *r, uint32_t n, int *corrupt)
{
	uint32_t used = r->local + n - __atomic_load_n(srn_word(r, SRN_RING_CONS), __ATOMIC_SEQ_CST);
	if (used > r->entries) {
		*corrupt = 1;
		return NULL;
	}
	return used == r->entries ? NULL : srn_slot(r, r->local + n);
}

/* Producer: the next free entry (srn_reserve_at). */
static inline uint8_t *srn_reserve(struct srn_ring *r, int *corrupt) { return srn_reserve_at(r, 0, corrupt); }

/* srn_commit_n publishes the n entries written after the last commit. */
static inline void srn_commit_n(struct srn_ring *r, uint32_t n)
{
	r->local += n;
	__atomic_store_n(srn_word(r, SRN_RING_PROD), r->local, __ATOMIC_SEQ_CST);
}

static inline void srn_commit(struct srn_ring *r) { srn_commit_n(r, 1); }

/* Consumer: the next entry, NULL when empty (copy it before use). */
static inline const uint8_t *srn_peek(struct srn_ring *r, int *corrupt)
{
	uint32_t avail = __atomic_load_n(srn_word(r, SRN_RING_PROD), __ATOMIC_SEQ_CST) - r->local;
	if (avail > r->entries) {
		*corrupt = 1;
		return NULL;
	}
	return avail ? srn_slot(r, r->local) : NULL;
}

static inline void srn_release(struct srn_ring *r)
{
	r->local++;
	__atomic_store_n(srn_word(r, SRN_RING_CONS), r->local, __ATOMIC_SEQ_CST);
}

static inline uint32_t srn_pending(const struct srn_ring *r)
{
	uint32_t n = __atomic_load_n(srn_word(r, SRN_RING_PROD), __ATOMIC_SEQ_CST) -
		     __atomic_load_n(srn_word(r, SRN_RING_CONS), __ATOMIC_SEQ_CST);
	return n > r->entries ? r->entries : n;
}

static inline uint32_t srn_flags(const struct srn_ring *r)
{
	return __atomic_load_n(srn_word(r, SRN_RING_FLAGS), __ATOMIC_SEQ_CST);
}

static inline void srn_set_flags(const struct srn_ring *r, uint32_t v)
{
	__atomic_store_n(srn_word(r, SRN_RING_FLAGS), v, __ATOMIC_SEQ_CST);
}

/* Consumer of an event ring, after a release: did the daemon ask to be
 * woken when room came (once per request)? */
static inline int srn_room_wanted(const struct srn_ring *r)
{
	uint32_t *w = srn_word(r, SRN_RING_WANTED);
	return __atomic_load_n(w, __ATOMIC_SEQ_CST) && __atomic_exchange_n(w, 0, __ATOMIC_SEQ_CST);
}

/* Producer of a request ring: must the EP go on its ready queue? */
static inline int srn_mark_queued(const struct srn_ring *r)
{
	uint32_t *w = srn_word(r, SRN_RING_WANTED);
	return !__atomic_load_n(w, __ATOMIC_SEQ_CST) && !__atomic_exchange_n(w, 1, __ATOMIC_SEQ_CST);
}

/* An event entry (shm.EVE), native byte order, copied out of the ring. */
struct srn_eve {
	uint8_t kind, status, opcode, flags;
	uint32_t ep;
	uint64_t id;
	uint32_t byte_len, invalidated;
	uint8_t immediate[8];
	uint32_t handle, event, cause;
};

enum { SRN_EVENT_DTO = 1, SRN_EVENT_CONNECTION = 2, SRN_EVENT_CR = 3, SRN_EVENT_OVERFLOW = 4 };

static inline void srn_decode_eve(const uint8_t *slot, struct srn_eve *e)
{
	uint8_t c[SRN_EVE_SIZE];
	__builtin_memcpy(c, slot, sizeof(c));
	e->kind = c[0];
	e->status = c[1];
	e->opcode = c[2];
	e->flags = c[3];
	__builtin_memcpy(&e->ep, c + 4, 4);
	__builtin_memcpy(&e->id, c + 8, 8);
	__builtin_memcpy(&e->byte_len, c + 16, 4);
	__builtin_memcpy(&e->invalidated, c + 20, 4);
	__builtin_memcpy(e->immediate, c + 24, 8);
	__builtin_memcpy(&e->handle, c + 32, 4);
	__builtin_memcpy(&e->event, c + 36, 4);
	__builtin_memcpy(&e->cause, c + 40, 4);
}

/*
 * An event dispatcher: its ring in the region and the eventfd the daemon
 * signals when it adds an event to the armed ring. Its lock serializes
 * consumers.
 */
struct srn_evd {
	uint32_t h;
	struct srn_ring ring;
	int notify;
	pthread_spinlock_t lock;
	struct srn_session *sess;
};

/* srn_evd_create makes an EVD of at least depth entries with the flags
 * (SRN_EVD_*): 0 or an errno value. srn_evd_free frees it. */
int srn_evd_create(struct srn_session *s, uint32_t depth, uint8_t flags, struct srn_evd *e) HIDDEN;
int srn_evd_free(struct srn_evd *e) HIDDEN;
/* srn_evd_next takes the next event: 1, 0 when there is none, or a
 * negative errno value (a broken ring). Call with e->lock held. */
int srn_evd_next(struct srn_evd *e, struct srn_eve *ev) HIDDEN;
/* srn_evd_arm arms the EVD and reports whether events are waiting (then
 * the daemon may not signal: look again before sleeping). */
int srn_evd_arm(struct srn_evd *e) HIDDEN;

/*
 * A ready queue (internal/shm): where an EP with new work goes, and the
 * doorbell rung when the daemon's side of it sleeps.
 */
struct srn_readyq {
	pthread_mutex_t mu;
	struct srn_ring ring;
	uint32_t off;
	int doorbell; /* -1 until the first EP of the queue */
};

enum { SRN_MAX_QUEUES = 64 };

/*
 * The device's context: the verbs_context, whose ibv_context the
 * application holds, sits right before it (verbs.h: verbs_get_ctx).
 * librdmacm reaches the rest through srn_ctx.
 */
struct srn_context {
	struct verbs_context vctx;
	struct srn_session sess; /* with the daemon */
	struct srn_ia ia;        /* as the daemon said when the context was opened */
	pthread_mutex_t qmu; /* queues and qps */
	struct srn_readyq queues[SRN_MAX_QUEUES];
	/* The context's QPs, for a completion's qp_num (cq.c). */
	struct srn_qp *qps;
	/* Private operations for librdmacm: a QP whose connection events
	 * go to the EVD connect_evd. */
	struct ibv_qp *(*create_qp_cm)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr, uint32_t connect_evd,
				       uint16_t ird, uint16_t ord);
	/* srn_qp_wr_api, for librdmacm's rdma_create_qp_ex */
	int (*qp_wr_api)(struct ibv_qp *qp, uint64_t ops);
	int fatal_given; /* IBV_EVENT_DEVICE_FATAL handed out (atomic) */
	uint32_t magic;
};

#define SRN_CONTEXT_MAGIC 0x53524e43u /* "SRNC" */

static inline struct srn_context *srn_ctx(struct ibv_context *c)
{
	struct srn_context *s = (struct srn_context *)verbs_get_ctx(c);
	return s && s->magic == SRN_CONTEXT_MAGIC ? s : NULL;
}

struct srn_session *srn_session_of(struct ibv_context *ctx) HIDDEN;

/* srn_readyq_of returns the context's ready queue for an EP reply, keeping
 * the doorbell passed with it if the queue is new (else closing it). */
struct srn_readyq *srn_readyq_of(struct srn_context *c, uint32_t queue, uint32_t off, uint32_t entries,
				 int doorbell) HIDDEN;

/* A QP: the daemon's EP with its rings. */
struct srn_wr_batch;

struct srn_qp {
	/* qpx for a QP made with the work request API (qpex.c): its
	 * qp_base is qp */
	union {
		struct ibv_qp qp;
		struct ibv_qp_ex qpx;
	};
	pthread_spinlock_t sq_lock, rq_lock;
	struct srn_ring sq, rq;
	uint32_t slot;
	struct srn_readyq *queue;
	struct ibv_qp_cap cap;
	int sq_sig_all;
	/* Inline data: two slots of max_inline octets per send ring entry
	 * (qp.c: build), registered with the daemon (STag inline_stag). */
	uint8_t *inline_buf;
	uint32_t inline_lmr, inline_stag;
	enum ibv_qp_state state;
	/* cm: the RDMA-CM's (connected by librdmacm); ib: connecting the
	 * InfiniBand way, since its RTR (qp.c: ib_connect). */
	int cm, ib;
	/* wr: the requests of the work request API being built, NULL
	 * for a QP made without it */
	struct srn_wr_batch *wr;
	struct srn_qp *next; /* in the context's qps */
};

/* srn_build_sqe writes one work request as the send ring entry e of ring
 * index idx (which picks its inline slot): 0 or an errno value. */
int srn_build_sqe(struct srn_qp *q, const struct ibv_send_wr *wr, uint8_t *e, uint32_t idx) HIDDEN;

/* srn_sq_posted tells the daemon, if its side sleeps, that the send ring
 * has new entries; the ring's lock held. */
void srn_sq_posted(struct srn_qp *q) HIDDEN;

/* srn_create_qp_cm makes a QP; connect_evd names the RDMA-CM's EVD for a
 * QP of librdmacm's, 0 for one of the verbs alone (qp.c). */
struct ibv_qp *srn_create_qp_cm(struct ibv_pd *pd, struct ibv_qp_init_attr *attr, uint32_t connect_evd, uint16_t ird,
				uint16_t ord) HIDDEN;

/* srn_create_qp_ex is verbs_context's create_qp_ex (qpex.c). */
struct ibv_qp *srn_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *attr) HIDDEN;

/* SRN_WR_OPS: the send_ops_flags the work request API takes here, those
 * of ibv_post_send's opcodes. */
#define SRN_WR_OPS                                                                                            \
	(IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ | \
	 IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_LOCAL_INV)

/* srn_qp_wr_api gives qp the work request API for the operations ops
 * (within SRN_WR_OPS): 0 or an errno value (qpex.c). */
int srn_qp_wr_api(struct ibv_qp *qp, uint64_t ops) HIDDEN;

/* srn_qpn_of is the qp_num of the context's QP whose EP is ep. */
uint32_t srn_qpn_of(struct srn_context *c, uint32_t ep) HIDDEN;

/* srn_qp_destroy frees a QP's EP; librdmacm destroys through it. */
int srn_qp_destroy(struct ibv_qp *qp) HIDDEN;

/* CQs. */
struct srn_cq {
	/* cqx for a CQ of ibv_create_cq_ex (cqex.c), whose first fields
	 * are cq's */
	union {
		struct ibv_cq cq;
		struct ibv_cq_ex cqx;
	};
	struct srn_evd evd;
	uint32_t events; /* completion events handed out by ibv_get_cq_event */
	uint32_t last_ep, last_qpn; /* the last completion's EP and its qp_num */
	uint32_t empty;  /* polls in a row that found nothing */
	struct ibv_wc cur; /* ibv_start_poll's and ibv_next_poll's completion */
};

/* srn_cq_take takes the CQ's next completion into w, the CQ's lock held:
 * 1, 0 when it is empty, -1 when the daemon lost completions (overrun)
 * or its ring is broken (cq.c). */
int srn_cq_take(struct srn_cq *q, struct ibv_wc *w) HIDDEN;

/* srn_cq_found_empty is what a poll that found the CQ empty does, the
 * lock released: EIO once the daemon has gone, else 0, after yielding
 * the processor as $SOFTRNIC_POLL_YIELD says (cq.c). */
int srn_cq_found_empty(struct srn_cq *q) HIDDEN;

/* srn_create_cq is ibv_create_cq (cq.c). */
struct ibv_cq *srn_create_cq(struct ibv_context *ctx, int cqe, void *cq_context, struct ibv_comp_channel *ch, int vector);

/* srn_create_cq_ex is verbs_context's create_cq_ex (cqex.c). */
struct ibv_cq_ex *srn_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *attr) HIDDEN;

/* ibv_poll_cq yields the processor after this many polls in a row find
 * the CQ empty (cq.c, as $SOFTRNIC_POLL_YIELD says): 1 measured best
 * (hack/bench-verbs.sh: ib_write_bw 558 MB/s against 451 with 16, on a
 * 2-core host). */
#define SRN_YIELD_EVERY 1

/* ibv_poll_cq asks whether the daemon has gone (srn_session_gone: one
 * poll(2)) after this many polls in a row find the CQ empty; a program
 * that waits on a CQ fails with EIO then, instead of spinning for ever. */
#define SRN_GONE_EVERY 65536

/* Register [addr, addr+len) of this process (ctl RegisterProcessMemory):
 * 0 or an errno value. */
int srn_register(struct srn_session *s, uint32_t pz, const void *addr, size_t len, uint8_t access, uint32_t *lmr,
		 uint32_t *stag) HIDDEN;
int srn_free_lmr(struct srn_session *s, uint32_t lmr) HIDDEN;

#endif
