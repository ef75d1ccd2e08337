/*
 * What the test programs share: FAIL names the line and what failed and
 * exits 1; expect takes the channel's next RDMA-CM event, which must be
 * want, wait_event the same once it has come (within 10 s) to a channel
 * nonblocking_channel made, and no_event says none comes; wait_wc takes a
 * CQ's next completion; open_first_device opens the device.
 */
#ifndef CHECK_H
#define CHECK_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FAIL(...)                                                                                                      \
	do {                                                                                                           \
		fprintf(stderr, "line %d: ", __LINE__);                                                                \
		fprintf(stderr, __VA_ARGS__);                                                                          \
		fprintf(stderr, "\n");                                                                                 \
		exit(1);                                                                                               \
	} while (0)

static inline struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(ch, &e))
		FAIL("rdma_get_cm_event: %s", strerror(errno));
	if (e->event != want)
		FAIL("event %s (status %d), want %s", rdma_event_str(e->event), e->status, rdma_event_str(want));
	return e;
}

/* nonblocking_channel is an event channel whose descriptor does not block. */
static inline struct rdma_event_channel *nonblocking_channel(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch || fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK))
		FAIL("channel: %s", strerror(errno));
	return ch;
}

/* wait_event is expect once ch is readable, within 10 s. */
static inline struct rdma_cm_event *wait_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct pollfd pf = {.fd = ch->fd, .events = POLLIN};
	if (poll(&pf, 1, 10000) != 1)
		FAIL("no %s in 10 s", rdma_event_str(want));
	return expect(ch, want);
}

/* no_event: no event on ch within ms, which must be non-blocking. */
static inline void no_event(struct rdma_event_channel *ch, int ms, const char *what)
{
	struct pollfd pf = {.fd = ch->fd, .events = POLLIN};
	poll(&pf, 1, ms);
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(ch, &e) == 0)
		FAIL("%s: %s", what, rdma_event_str(e->event));
	if (errno != EAGAIN)
		FAIL("%s: %s", what, strerror(errno));
}

/* open_first_device opens the first (softrnic's one) device. */
static inline struct ibv_context *open_first_device(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		FAIL("no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		FAIL("ibv_open_device: %s", strerror(errno));
	ibv_free_device_list(list);
	return ctx;
}

/* wait_wc is cq's next completion, waited for at most 10 s. */
static inline struct ibv_wc wait_wc(struct ibv_cq *cq)
{
	struct timespec start, now;
	clock_gettime(CLOCK_MONOTONIC, &start);
	struct ibv_wc wc;
	for (int i = 0;; i++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			FAIL("ibv_poll_cq: %d", n);
		if (n == 1)
			return wc;
		if (i > 1000)
			usleep(1);
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec - start.tv_sec > 10)
			FAIL("no completion in 10 s");
	}
}

#endif
