/*
 * What the test programs share: FAIL names the line and what failed and
 * exits 1; expect takes the channel's next RDMA-CM event, which must be
 * want; wait_wc takes a CQ's next completion.
 */
#ifndef CHECK_H
#define CHECK_H

#include <errno.h>
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
