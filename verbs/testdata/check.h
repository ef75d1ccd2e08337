/*
 * What the test programs share: FAIL names the line and what failed and
 * exits 1; expect takes the channel's next RDMA-CM event, which must be
 * want.
 */
#ifndef CHECK_H
#define CHECK_H

#include <errno.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

#endif
