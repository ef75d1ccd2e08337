/*
 * The device: one per daemon, softrnic0 (or $SOFTRNIC_VERBS_DEVICE), an
 * iWARP RNIC on an Ethernet link, listed while softrnicd answers on its
 * socket. Its attributes are the daemon's (ctl.IAAttr); what no daemon
 * attribute says is given as an iWARP RNIC without the optional features
 * has it: no SRQ, no memory windows, one port.
 */
#include "srn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <net/if.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

/* The library's one device, made by ibv_get_device_list. The list holds
 * a reference, and so does each context opened on it: an application may
 * free the list and go on with its contexts (ibv_get_device_list(3)). */
struct srn_device {
	struct ibv_device dev;
	struct srn_ia ia; /* as the daemon said when the list was made */
	int refs;         /* atomic */
};

static void device_put(struct srn_device *d)
{
	if (__atomic_sub_fetch(&d->refs, 1, __ATOMIC_ACQ_REL) == 0)
		free(d);
}

static struct srn_context *to_ctx(struct ibv_context *c)
{
	return (struct srn_context *)verbs_get_ctx(c);
}

struct srn_readyq *srn_readyq_of(struct srn_context *c, uint32_t queue, uint32_t off, uint32_t entries, int doorbell)
{
	if (queue >= SRN_MAX_QUEUES) {
		close(doorbell);
		return NULL;
	}
	struct srn_readyq *q = &c->queues[queue];
	pthread_mutex_lock(&c->qmu);
	if (q->doorbell >= 0) {
		close(doorbell);
		if (q->off != off || q->ring.entries != entries)
			q = NULL; /* the daemon moved it */
	} else if (srn_ring_init(&q->ring, &c->sess, off, entries, SRN_READY_SIZE)) {
		close(doorbell);
		q = NULL;
	} else {
		q->off = off;
		q->doorbell = doorbell;
	}
	pthread_mutex_unlock(&c->qmu);
	return q;
}

struct srn_session *srn_session_of(struct ibv_context *c)
{
	return &to_ctx(c)->sess;
}

static const char *device_name(void)
{
	const char *n = getenv("SOFTRNIC_VERBS_DEVICE");
	return n && *n && strlen(n) < IBV_SYSFS_NAME_MAX ? n : "softrnic0";
}

/* guid is the node GUID: "SR" and the IPv4 address of the daemon's
 * interface; there is no NIC whose EUI-64 it could be. */
static __be64 guid(const struct srn_ia *ia)
{
	struct in_addr a = {0};
	inet_pton(AF_INET, ia->address, &a);
	uint64_t g = (uint64_t)0x5352 << 48 | (uint64_t)ntohl(a.s_addr);
	return htobe64(g);
}

EXPORT struct ibv_device **srn_get_device_list(int *num)
{
	struct srn_device *d = calloc(1, sizeof(*d));
	struct ibv_device **list = calloc(2, sizeof(*list));
	if (!d || !list) {
		free(d);
		free(list);
		errno = ENOMEM;
		return NULL;
	}
	struct srn_session sess;
	if (srn_session_open(&sess, "libibverbs", &d->ia, 0)) {
		/* No daemon: no device, as with no RDMA NIC. */
		free(d);
		if (num)
			*num = 0;
		return list;
	}
	srn_session_close(&sess);
	d->refs = 1;
	d->dev.node_type = IBV_NODE_RNIC;
	d->dev.transport_type = IBV_TRANSPORT_IWARP;
	snprintf(d->dev.name, sizeof(d->dev.name), "%s", device_name());
	snprintf(d->dev.dev_name, sizeof(d->dev.dev_name), "uverbs-%s", device_name());
	/* no sysfs: paths that lead nowhere, as ibv_read_sysfs_file says */
	snprintf(d->dev.dev_path, sizeof(d->dev.dev_path), "softrnic:%s", srn_socket_path());
	snprintf(d->dev.ibdev_path, sizeof(d->dev.ibdev_path), "softrnic:%s", srn_socket_path());
	list[0] = &d->dev;
	if (num)
		*num = 1;
	return list;
}
SYMVER_DEFAULT(srn_get_device_list, ibv_get_device_list, "IBVERBS_1.1");

EXPORT void srn_free_device_list(struct ibv_device **list)
{
	if (!list)
		return;
	for (struct ibv_device **d = list; *d; d++)
		device_put((struct srn_device *)*d); /* it starts with its ibv_device */
	free(list);
}
SYMVER_DEFAULT(srn_free_device_list, ibv_free_device_list, "IBVERBS_1.1");

EXPORT const char *srn_get_device_name(struct ibv_device *dev)
{
	return dev ? dev->name : NULL;
}
SYMVER_DEFAULT(srn_get_device_name, ibv_get_device_name, "IBVERBS_1.1");

EXPORT __be64 srn_get_device_guid(struct ibv_device *dev)
{
	return guid(&((struct srn_device *)dev)->ia);
}
SYMVER_DEFAULT(srn_get_device_guid, ibv_get_device_guid, "IBVERBS_1.1");

/* What the library does not have fails cleanly. */
static int no_post_srq(struct ibv_srq *s, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) { (void)s; *bad = wr; return EOPNOTSUPP; }
static struct ibv_mw *no_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type t) { (void)pd; (void)t; errno = EOPNOTSUPP; return NULL; }
static int no_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *b) { (void)qp; (void)mw; (void)b; return EOPNOTSUPP; }
static int no_dealloc_mw(struct ibv_mw *mw) { (void)mw; return EOPNOTSUPP; }

/* The data path (cq.c, qp.c). */
int srn_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) HIDDEN;
int srn_req_notify_cq(struct ibv_cq *cq, int solicited) HIDDEN;
int srn_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) HIDDEN;
int srn_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) HIDDEN;

static int query_port_op(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr, size_t len);

EXPORT struct ibv_context *srn_open_device(struct ibv_device *dev)
{
	if (!dev) {
		errno = EINVAL;
		return NULL;
	}
	struct srn_context *c = calloc(1, sizeof(*c));
	if (!c) {
		errno = ENOMEM;
		return NULL;
	}
	int err = srn_session_open(&c->sess, "libibverbs", &c->ia, 1);
	if (err) {
		free(c);
		errno = err == ENOENT || err == ECONNREFUSED ? ENODEV : err;
		return NULL;
	}
	struct ibv_context *ctx = &c->vctx.context;
	/* Asynchronous events: the one there is, IBV_EVENT_DEVICE_FATAL, is
	 * the daemon hanging up, which the set sees on the session's socket
	 * (readable from then on, as a kernel device's after a fatal
	 * error). */
	ctx->async_fd = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event hup = {.events = EPOLLRDHUP};
	if (ctx->async_fd < 0 || epoll_ctl(ctx->async_fd, EPOLL_CTL_ADD, c->sess.fd, &hup) < 0) {
		int e = errno;
		if (ctx->async_fd >= 0)
			close(ctx->async_fd);
		srn_session_close(&c->sess);
		free(c);
		errno = e;
		return NULL;
	}
	__atomic_add_fetch(&((struct srn_device *)dev)->refs, 1, __ATOMIC_ACQ_REL);
	c->magic = SRN_CONTEXT_MAGIC;
	c->vctx.sz = sizeof(c->vctx);
	c->vctx.query_port = query_port_op;
	c->vctx.create_qp_ex = srn_create_qp_ex;
	c->vctx.create_cq_ex = srn_create_cq_ex;
	ctx->abi_compat = __VERBS_ABI_IS_EXTENDED;
	ctx->device = dev;
	ctx->cmd_fd = c->sess.fd;
	pthread_mutex_init(&c->qmu, NULL);
	for (int i = 0; i < SRN_MAX_QUEUES; i++) {
		c->queues[i].doorbell = -1;
		pthread_mutex_init(&c->queues[i].mu, NULL);
	}
	c->create_qp_cm = srn_create_qp_cm;
	c->qp_wr_api = srn_qp_wr_api;
	ctx->num_comp_vectors = 1;
	pthread_mutex_init(&ctx->mutex, NULL);
	ctx->ops.poll_cq = srn_poll_cq;
	ctx->ops.req_notify_cq = srn_req_notify_cq;
	ctx->ops.post_send = srn_post_send;
	ctx->ops.post_recv = srn_post_recv;
	ctx->ops.post_srq_recv = no_post_srq;
	ctx->ops.alloc_mw = no_alloc_mw;
	ctx->ops.bind_mw = no_bind_mw;
	ctx->ops.dealloc_mw = no_dealloc_mw;
	return ctx;
}
SYMVER_DEFAULT(srn_open_device, ibv_open_device, "IBVERBS_1.1");

EXPORT int srn_close_device(struct ibv_context *ctx)
{
	if (!ctx)
		return EINVAL;
	struct srn_context *c = to_ctx(ctx);
	struct srn_device *d = (struct srn_device *)ctx->device;
	close(ctx->async_fd);
	for (int i = 0; i < SRN_MAX_QUEUES; i++) {
		if (c->queues[i].doorbell >= 0)
			close(c->queues[i].doorbell);
		pthread_mutex_destroy(&c->queues[i].mu);
	}
	pthread_mutex_destroy(&c->qmu);
	c->magic = 0;
	srn_session_close(&c->sess);
	pthread_mutex_destroy(&ctx->mutex);
	free(c);
	device_put(d);
	return 0;
}
SYMVER_DEFAULT(srn_close_device, ibv_close_device, "IBVERBS_1.1");

/* ibv_get_async_event: IBV_EVENT_DEVICE_FATAL once the daemon has gone,
 * then -1 with EIO, as a kernel device's after a fatal error; blocking
 * until then unless the application made async_fd non-blocking (EAGAIN). */
EXPORT int srn_get_async_event(struct ibv_context *ctx, struct ibv_async_event *event)
{
	struct srn_context *c = ctx ? srn_ctx(ctx) : NULL;
	if (!c || !event) {
		errno = EINVAL;
		return -1;
	}
	int nonblock = fcntl(ctx->async_fd, F_GETFL) & O_NONBLOCK;
	while (!srn_session_gone(&c->sess)) {
		struct epoll_event ev;
		int n = epoll_wait(ctx->async_fd, &ev, 1, nonblock ? 0 : -1);
		if (n < 0 && errno != EINTR)
			return -1;
		if (n == 0) {
			errno = EAGAIN;
			return -1;
		}
	}
	if (__atomic_exchange_n(&c->fatal_given, 1, __ATOMIC_ACQ_REL)) {
		errno = EIO;
		return -1;
	}
	memset(event, 0, sizeof(*event));
	event->event_type = IBV_EVENT_DEVICE_FATAL;
	return 0;
}
SYMVER_DEFAULT(srn_get_async_event, ibv_get_async_event, "IBVERBS_1.1");

static const struct srn_ia *ia_of(struct ibv_context *ctx)
{
	return &to_ctx(ctx)->ia;
}

EXPORT int srn_query_device(struct ibv_context *ctx, struct ibv_device_attr *a)
{
	if (!ctx || !a)
		return EINVAL;
	const struct srn_ia *ia = ia_of(ctx);
	memset(a, 0, sizeof(*a));
	snprintf(a->fw_ver, sizeof(a->fw_ver), "%.40s %.15s", ia->version, ia->datapath);
	a->node_guid = a->sys_image_guid = guid(ia);
	a->max_mr_size = ia->max_lmr_size;
	a->page_size_cap = (uint64_t)sysconf(_SC_PAGESIZE);
	a->max_qp = ia->max_ep; /* objects per session, EPs among them */
	a->max_qp_wr = ia->max_sq < ia->max_rq ? ia->max_sq : ia->max_rq;
	a->max_sge = ia->max_sge;
	a->max_sge_rd = 1;
	a->max_cq = ia->max_evd;
	a->max_cqe = ia->max_evd_depth;
	a->max_mr = ia->max_ep;
	a->max_pd = ia->max_ep;
	a->max_qp_rd_atom = a->max_res_rd_atom = ia->max_ird;
	a->max_qp_init_rd_atom = ia->max_ord;
	/* atomic with respect to the daemon's other atomics, not to the
	 * processor's stores (qp/atomic.go) */
	a->atomic_cap = IBV_ATOMIC_HCA;
	a->max_pkeys = 1;
	a->phys_port_cnt = 1;
	return 0;
}
SYMVER_DEFAULT(srn_query_device, ibv_query_device, "IBVERBS_1.1");

/* An MTU of the verbs enumeration no larger than the interface's. */
static enum ibv_mtu mtu(void)
{
	return IBV_MTU_1024; /* as siw reports: what MPA FPDUs carry on a 1500-octet link */
}

static int query_port_op(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr, size_t len)
{
	if (!ctx || !attr || port != 1)
		return EINVAL;
	struct ibv_port_attr a = {0};
	a.state = IBV_PORT_ACTIVE;
	a.max_mtu = a.active_mtu = mtu();
	a.gid_tbl_len = 1;
	a.max_msg_sz = (uint32_t)(ia_of(ctx)->max_lmr_size > UINT32_MAX ? UINT32_MAX : ia_of(ctx)->max_lmr_size);
	a.pkey_tbl_len = 1;
	a.active_width = 1;  /* 1X */
	a.active_speed = 1;  /* not a link the verbs speeds describe */
	a.phys_state = 5;    /* LinkUp */
	a.link_layer = IBV_LINK_LAYER_ETHERNET;
	/* The LID: the low 16 bits of the interface's IPv4 address. A LID
	 * names a port within a subnet, and an InfiniBand program that
	 * connects its QPs with an address vector without a GRH (qperf)
	 * gives the peer's LID alone: the daemon finds the peer at this
	 * host's address with those 16 bits (ctl.ConnectQP). */
	struct in_addr in = {0};
	if (inet_pton(AF_INET, ia_of(ctx)->address, &in) == 1)
		a.lid = ntohl(in.s_addr) & 0xffff;
	/* a program built with a newer verbs.h passes a longer struct:
	 * what this one does not know of is zero */
	memset(attr, 0, len);
	memcpy(attr, &a, len < sizeof(a) ? len : sizeof(a));
	return 0;
}

/* The exported ibv_query_port, for programs built before verbs_context
 * had query_port: their struct ends at link_layer. */
EXPORT int srn_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
	return query_port_op(ctx, port, attr, offsetof(struct ibv_port_attr, flags));
}
SYMVER_DEFAULT(srn_query_port, ibv_query_port, "IBVERBS_1.1");

/* The one GID: the interface's IPv4 address, IPv4-mapped, as iWARP
 * addresses its peers by IP. */
EXPORT int srn_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
	if (!ctx || !gid || port != 1 || index != 0) {
		errno = EINVAL;
		return -1;
	}
	struct in_addr a = {0};
	memset(gid, 0, sizeof(*gid));
	if (inet_pton(AF_INET, ia_of(ctx)->address, &a) == 1) {
		gid->raw[10] = gid->raw[11] = 0xff;
		memcpy(&gid->raw[12], &a, 4);
	}
	return 0;
}
SYMVER_DEFAULT(srn_query_gid, ibv_query_gid, "IBVERBS_1.1");

/* ibv_query_gid_type (IBVERBS_PRIVATE_34, which ibv_devinfo uses): what
 * the kernel's sysfs says of an iWARP device's GIDs, "IB/RoCE v1" (0). */
EXPORT int ibv_query_gid_type(struct ibv_context *ctx, uint8_t port, unsigned int index, int *type)
{
	if (!ctx || !type || port != 1 || index != 0)
		return EINVAL;
	*type = 0;
	return 0;
}

EXPORT int srn_query_pkey(struct ibv_context *ctx, uint8_t port, int index, __be16 *pkey)
{
	if (!ctx || !pkey || port != 1 || index != 0) {
		errno = EINVAL;
		return -1;
	}
	*pkey = htobe16(0xffff);
	return 0;
}
SYMVER_DEFAULT(srn_query_pkey, ibv_query_pkey, "IBVERBS_1.1");

/* There is no sysfs device: every read fails as for a missing file. */
EXPORT int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)
{
	(void)dir; (void)file; (void)buf; (void)size;
	errno = ENOENT;
	return -1;
}

EXPORT const char *ibv_get_sysfs_path(void)
{
	return "/sys"; /* libibverbs' default; nothing of ours is there */
}

/* The device's index: there is one device. */
EXPORT int ibv_get_device_index(struct ibv_device *dev)
{
	return dev ? 0 : -1;
}

/*
 * fork: nothing of the application's memory is shared with the daemon or
 * pinned (the daemon reaches registered memory through /proc/PID/mem,
 * internal/procmem), so a child needs no
 * preparation: fork support is not needed, and asking for it succeeds.
 */
EXPORT int ibv_fork_init(void)
{
	return 0;
}

EXPORT enum ibv_fork_status ibv_is_fork_initialized(void)
{
	return IBV_FORK_UNNEEDED;
}

/* Ranges need no protection from fork either (see ibv_fork_init). */
EXPORT int ibv_dontfork_range(void *base, size_t size)
{
	return 0;
}

EXPORT int ibv_dofork_range(void *base, size_t size)
{
	return 0;
}

static void gid_entry(struct ibv_context *ctx, struct ibv_gid_entry *e)
{
	memset(e, 0, sizeof(*e));
	srn_query_gid(ctx, 1, 0, &e->gid);
	e->port_num = 1;
	e->gid_type = IBV_GID_TYPE_IB; /* what the kernel reports of an iWARP device's */
	e->ndev_ifindex = if_nametoindex(ia_of(ctx)->name);
}

/* The GID table: one entry, the interface's address (srn_query_gid). */
EXPORT int _ibv_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index, struct ibv_gid_entry *entry,
			     uint32_t flags, size_t entry_size)
{
	if (!ctx || !entry || flags || entry_size < sizeof(*entry))
		return EINVAL;
	if (port != 1 || index != 0)
		return ENODATA;
	gid_entry(ctx, entry);
	return 0;
}

EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *entries, size_t max, uint32_t flags,
				    size_t entry_size)
{
	if (!ctx || (max && !entries) || flags || entry_size < sizeof(*entries))
		return -EINVAL;
	if (max < 1)
		return -EINVAL;
	gid_entry(ctx, entries);
	return 1;
}
