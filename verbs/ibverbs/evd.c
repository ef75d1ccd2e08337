/*
 * Event dispatchers (ctl CreateEVD): a ring of events in the session's
 * region, filled by the daemon, and the eventfd it signals when it adds an
 * event to a ring the consumer armed. CQs are EVDs of completions; the
 * RDMA-CM's event channels are EVDs of connection events and requests.
 */
#define _GNU_SOURCE
#include "srn.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

int srn_evd_create(struct srn_session *s, uint32_t depth, uint8_t flags, struct srn_evd *e)
{
	struct srn_w w = {0};
	srn_wn(&w, depth, 4);
	srn_wn(&w, flags, 1);
	srn_wn(&w, 0, 4); /* vector */
	uint8_t reply[12];
	size_t got = 0;
	int fd = -1, nfds = 0;
	int err = srn_call_fds(s, SRN_OP_CREATE_EVD, w.b, w.n, reply, sizeof(reply), &got, &fd, 1, &nfds);
	if (err)
		return err;
	if (got != sizeof(reply) || nfds != 1) {
		if (nfds)
			close(fd);
		if (got == sizeof(reply)) {
			/* made, but its eventfd was lost (the process is out of
			 * descriptors): the daemon frees it now, not at close */
			uint8_t b[4];
			memcpy(b, reply, 4);
			srn_call(s, SRN_OP_FREE_EVD, b, 4, NULL, 0, NULL);
		}
		return EPROTO;
	}
	memset(e, 0, sizeof(*e));
	e->h = srn_get32(reply);
	if (srn_ring_init(&e->ring, s, srn_get32(reply + 8), srn_get32(reply + 4), SRN_EVE_SIZE)) {
		close(fd);
		uint8_t b[4];
		srn_put32(b, e->h);
		srn_call(s, SRN_OP_FREE_EVD, b, 4, NULL, 0, NULL);
		return EPROTO;
	}
	/* Readers poll it and drain it without blocking. */
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	e->notify = fd;
	e->sess = s;
	pthread_spin_init(&e->lock, PTHREAD_PROCESS_PRIVATE);
	return 0;
}

int srn_evd_free(struct srn_evd *e)
{
	uint8_t b[4];
	srn_put32(b, e->h);
	int err = srn_call(e->sess, SRN_OP_FREE_EVD, b, 4, NULL, 0, NULL);
	if (err && err != ENODEV)
		return err;
	close(e->notify);
	pthread_spin_destroy(&e->lock);
	return 0;
}

int srn_evd_next(struct srn_evd *e, struct srn_eve *ev)
{
	int corrupt = 0;
	const uint8_t *slot = srn_peek(&e->ring, &corrupt);
	if (corrupt)
		return -EIO;
	if (!slot)
		return 0;
	srn_decode_eve(slot, ev);
	srn_release(&e->ring);
	if (srn_room_wanted(&e->ring)) {
		/* The daemon holds events for lack of room and sleeps. */
		uint64_t one = 1;
		if (write(e->sess->doorbell, &one, sizeof(one)) < 0 && errno != EAGAIN)
			return -errno;
	}
	return 1;
}

int srn_evd_arm(struct srn_evd *e)
{
	srn_set_flags(&e->ring, SRN_ARMED);
	return srn_pending(&e->ring) != 0;
}
