/*
 * The DAT calls dtest and dapltest do not make, or make only in one way,
 * checked for what DAT says they do: EPs created without attributes and
 * again from what ep_query reports, ep_modify, ep_get_status, the queries
 * (and the IA handle they report, libdat2's own), consumer contexts,
 * handle types, psp_create_any, an RSP, a provider-created EP, a reject
 * with private data, evd_wait's threshold and nmore, set_unwaitable, an
 * RDMA Read scattered into four segments.
 *
 *   semantics IA_NAME PORT
 *
 * Prints "ok: ..." per check and "FAIL: ..." per failure; exits 1 if any
 * check failed, 2 if the setup did.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>
#include <netinet/in.h>
#include <dat2/udat.h>

static int failures;

#define CHECK(what, cond)                                                  \
	do {                                                               \
		if (cond) {                                                \
			printf("ok: %s\n", what);                          \
		} else {                                                   \
			printf("FAIL: %s\n", what);                        \
			failures++;                                        \
		}                                                          \
	} while (0)

#define MUST(what, call)                                                   \
	do {                                                               \
		DAT_RETURN r_ = (call);                                    \
		if (r_ != DAT_SUCCESS) {                                   \
			printf("FAIL: setup: %s: %#x\n", what, r_);        \
			exit(2);                                           \
		}                                                          \
	} while (0)

static DAT_EVENT wait_for(DAT_EVD_HANDLE evd, DAT_EVENT_NUMBER want, const char *what)
{
	DAT_EVENT ev;
	DAT_COUNT more;
	DAT_RETURN r = dat_evd_wait(evd, 10 * 1000 * 1000, 1, &ev, &more);
	if (r != DAT_SUCCESS || ev.event_number != want) {
		printf("FAIL: setup: wait for %s: %#x, event %#x\n", what, r, r == DAT_SUCCESS ? ev.event_number : 0);
		exit(2);
	}
	return ev;
}

static DAT_EVD_HANDLE unwait_evd;

static void *unwaiter(void *arg)
{
	(void)arg;
	usleep(100 * 1000);
	dat_evd_set_unwaitable(unwait_evd);
	return NULL;
}

int main(int argc, char **argv)
{
	DAT_IA_HANDLE ia;
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL, cr_evd, conn_evd, conn2, dto, dto2, dto3;
	DAT_PZ_HANDLE pz;
	DAT_EP_HANDLE ep, ep2, ep3, pep;
	DAT_EP_PARAM param, param2;
	DAT_EVD_PARAM eparam;
	DAT_PZ_PARAM pzp;
	DAT_PSP_PARAM pspp;
	DAT_LMR_PARAM lmrp;
	DAT_IA_ATTR ia_attr;
	DAT_PROVIDER_ATTR pattr;
	DAT_PSP_HANDLE psp, psp_any;
	DAT_RSP_HANDLE rsp;
	DAT_CONN_QUAL qual, port;
	DAT_CONTEXT ctx;
	DAT_HANDLE_TYPE type;
	DAT_EP_STATE state;
	DAT_BOOLEAN ri, qi;
	DAT_EVENT ev;
	DAT_COUNT more;
	DAT_CR_PARAM crp;
	DAT_LMR_HANDLE lmr;
	DAT_LMR_CONTEXT lctx;
	DAT_RMR_CONTEXT rctx;
	DAT_VLEN rlen;
	DAT_VADDR raddr;
	DAT_REGION_DESCRIPTION region;
	DAT_LMR_TRIPLET iov[4];
	DAT_RMR_TRIPLET riov;
	DAT_DTO_COOKIE cookie = {.as_64 = 0x1234};
	struct sockaddr_in self;
	pthread_t th;
	char *buf;
	int i, found;

	if (argc != 3) {
		fprintf(stderr, "usage: semantics IA_NAME PORT\n");
		return 2;
	}
	port = strtoul(argv[2], NULL, 10);
	MUST("ia_open", dat_ia_open(argv[1], 8, &async, &ia));
	CHECK("ia_open makes an async EVD", async != DAT_HANDLE_NULL);
	MUST("ia_query", dat_ia_query(ia, NULL, DAT_IA_FIELD_ALL, &ia_attr, DAT_PROVIDER_FIELD_ALL, &pattr));
	self = *(struct sockaddr_in *)ia_attr.ia_address_ptr;
	CHECK("ia_query: an IPv4 address", self.sin_family == AF_INET && self.sin_addr.s_addr != 0);
	CHECK("ia_query: no extension", ia_attr.extension_supported == DAT_EXTENSION_NONE);
	CHECK("ia_query: DAPL 2.0, not thread-safe (the registry key)",
	      pattr.dapl_version_major == 2 && pattr.dapl_version_minor == 0 && pattr.is_thread_safe == DAT_FALSE);
	found = 0;
	for (i = 0; i < pattr.num_provider_specific_attr; i++)
		if (!strcmp(pattr.provider_specific_attr[i].name, "DAT_IB_RDMA_READ") &&
		    !strcmp(pattr.provider_specific_attr[i].value, "TRUE"))
			found = 1;
	CHECK("ia_query: DAT_IB_RDMA_READ is TRUE", found);
	CHECK("ia_query: four segments per DTO, Read included",
	      ia_attr.max_iov_segments_per_dto >= 4 && ia_attr.max_iov_segments_per_rdma_read >= 4);

	MUST("pz_create", dat_pz_create(ia, &pz));
	MUST("pz_query", dat_pz_query(pz, DAT_PZ_FIELD_ALL, &pzp));
	CHECK("pz_query reports the consumer's IA handle", pzp.ia_handle == ia);
	MUST("set context", dat_set_consumer_context(pz, (DAT_CONTEXT){.as_64 = 0xfeed}));
	MUST("get context", dat_get_consumer_context(pz, &ctx));
	CHECK("consumer context kept", ctx.as_64 == 0xfeed);
	MUST("handle type", dat_get_handle_type(pz, &type));
	CHECK("a PZ's handle type", type == DAT_HANDLE_TYPE_PZ);
	MUST("cr evd", dat_evd_create(ia, 8, DAT_HANDLE_NULL, DAT_EVD_CR_FLAG, &cr_evd));
	MUST("conn evd", dat_evd_create(ia, 8, DAT_HANDLE_NULL, DAT_EVD_CONNECTION_FLAG, &conn_evd));
	MUST("conn evd 2", dat_evd_create(ia, 8, DAT_HANDLE_NULL, DAT_EVD_CONNECTION_FLAG, &conn2));
	MUST("dto evd", dat_evd_create(ia, 2014, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG | DAT_EVD_RMR_BIND_FLAG, &dto));
	MUST("dto evd 2", dat_evd_create(ia, 64, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &dto2));
	MUST("dto evd 3", dat_evd_create(ia, 64, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &dto3));
	MUST("evd_query", dat_evd_query(dto, DAT_EVD_FIELD_ALL, &eparam));
	CHECK("evd_query: the length asked for, the consumer's IA, the flags",
	      eparam.evd_qlen >= 2014 && eparam.ia_handle == ia && eparam.evd_flags == (DAT_EVD_DTO_FLAG | DAT_EVD_RMR_BIND_FLAG));
	MUST("handle type", dat_get_handle_type(dto, &type));
	CHECK("an EVD's handle type", type == DAT_HANDLE_TYPE_EVD);

	/* ep_create(NULL) -> ep_query -> ep_create(queried), as dapltest. */
	MUST("ep_create NULL attrs", dat_ep_create(ia, pz, dto, dto, conn_evd, NULL, &ep));
	MUST("ep_query", dat_ep_query(ep, DAT_EP_FIELD_ALL, &param));
	CHECK("ep_query: defaults of at least 4 segments and 4 Reads",
	      param.ep_attr.max_recv_iov >= 4 && param.ep_attr.max_request_iov >= 4 && param.ep_attr.max_rdma_read_in >= 4 &&
		      param.ep_attr.max_rdma_read_out >= 4);
	CHECK("ep_query: UNCONNECTED, the consumer's IA, its PZ and EVDs",
	      param.ep_state == DAT_EP_STATE_UNCONNECTED && param.ia_handle == ia && param.pz_handle == pz &&
		      param.recv_evd_handle == dto && param.connect_evd_handle == conn_evd);
	param.ep_attr.max_request_dtos = 32;
	MUST("ep_create from queried attrs", dat_ep_create(ia, pz, dto2, dto2, conn2, &param.ep_attr, &ep2));
	MUST("ep_query 2", dat_ep_query(ep2, DAT_EP_FIELD_ALL, &param2));
	CHECK("the queried attributes come back", param2.ep_attr.max_request_dtos == 32 &&
						       param2.ep_attr.max_recv_iov == param.ep_attr.max_recv_iov);
	param2.request_evd_handle = dto3;
	MUST("ep_modify the request EVD", dat_ep_modify(ep2, DAT_EP_FIELD_REQUEST_EVD_HANDLE, &param2));
	MUST("ep_query 3", dat_ep_query(ep2, DAT_EP_FIELD_ALL, &param2));
	CHECK("ep_modify took", param2.request_evd_handle == dto3 && param2.recv_evd_handle == dto2);
	MUST("ep_get_status", dat_ep_get_status(ep2, &state, &ri, &qi));
	CHECK("ep_get_status: UNCONNECTED", state == DAT_EP_STATE_UNCONNECTED);

	/* Memory: a heap buffer, queried back. */
	buf = malloc(1 << 20);
	memset(buf, 0, 1 << 20);
	region.for_va = buf;
	MUST("lmr_create", dat_lmr_create(ia, DAT_MEM_TYPE_VIRTUAL, region, 1 << 20, pz, DAT_MEM_PRIV_ALL_FLAG, DAT_VA_TYPE_VA,
					  &lmr, &lctx, &rctx, &rlen, &raddr));
	MUST("lmr_query", dat_lmr_query(lmr, DAT_LMR_FIELD_ALL, &lmrp));
	CHECK("lmr_query: the region and contexts", lmrp.region_desc.for_va == buf && lmrp.length == (1 << 20) &&
							    lmrp.lmr_context == lctx && lmrp.rmr_context == rctx &&
							    lmrp.pz_handle == pz && lmrp.ia_handle == ia);

	/* psp_create_any gives a qualifier; its query says which. */
	MUST("psp_create_any", dat_psp_create_any(ia, &qual, cr_evd, DAT_PSP_CONSUMER_FLAG, &psp_any));
	MUST("psp_query", dat_psp_query(psp_any, DAT_PSP_FIELD_ALL, &pspp));
	CHECK("psp_create_any: a qualifier, reported by psp_query", qual != 0 && pspp.conn_qual == qual && pspp.ia_handle == ia);
	MUST("psp_free any", dat_psp_free(psp_any));

	/* A reject with private data reaches the active side as PEER_REJECTED. */
	MUST("psp_create", dat_psp_create(ia, port, cr_evd, DAT_PSP_CONSUMER_FLAG, &psp));
	MUST("connect", dat_ep_connect(ep, (DAT_IA_ADDRESS_PTR)&self, port, 10000000, 5, "hello", DAT_QOS_BEST_EFFORT,
				       DAT_CONNECT_DEFAULT_FLAG));
	ev = wait_for(cr_evd, DAT_CONNECTION_REQUEST_EVENT, "a request");
	CHECK("the request names the PSP and the qualifier",
	      ev.event_data.cr_arrival_event_data.sp_handle.psp_handle == psp &&
		      ev.event_data.cr_arrival_event_data.conn_qual == port);
	MUST("cr_query", dat_cr_query(ev.event_data.cr_arrival_event_data.cr_handle, DAT_CR_FIELD_ALL, &crp));
	CHECK("cr_query: the private data", crp.private_data_size == 5 && !memcmp(crp.private_data, "hello", 5));
	MUST("cr_reject", dat_cr_reject(ev.event_data.cr_arrival_event_data.cr_handle, 3, "no!"));
	ev = wait_for(conn_evd, DAT_CONNECTION_EVENT_PEER_REJECTED, "PEER_REJECTED");
	CHECK("the rejected EP is the one in the event", ev.event_data.connect_event_data.ep_handle == ep);
	MUST("ep_query rejected", dat_ep_query(ep, DAT_EP_FIELD_ALL, &param));
	CHECK("a rejected EP is DISCONNECTED", param.ep_state == DAT_EP_STATE_DISCONNECTED);
	CHECK("disconnecting a DISCONNECTED EP is a no-op", dat_ep_disconnect(ep, DAT_CLOSE_ABRUPT_FLAG) == DAT_SUCCESS);
	MUST("reset", dat_ep_reset(ep));

	/* Connected through the PSP; an RDMA Read into four segments. */
	MUST("post_recv", dat_ep_post_recv(ep2, 1, (iov[0] = (DAT_LMR_TRIPLET){(uintptr_t)buf, 64, lctx}, iov), cookie,
					   DAT_COMPLETION_DEFAULT_FLAG));
	MUST("connect 2", dat_ep_connect(ep, (DAT_IA_ADDRESS_PTR)&self, port, 10000000, 0, NULL, DAT_QOS_BEST_EFFORT,
					 DAT_CONNECT_DEFAULT_FLAG));
	ev = wait_for(cr_evd, DAT_CONNECTION_REQUEST_EVENT, "a request");
	MUST("cr_accept", dat_cr_accept(ev.event_data.cr_arrival_event_data.cr_handle, ep2, 6, "hello!"));
	ev = wait_for(conn_evd, DAT_CONNECTION_EVENT_ESTABLISHED, "ESTABLISHED");
	CHECK("ESTABLISHED carries the accept's private data", ev.event_data.connect_event_data.private_data_size == 6 &&
								       !memcmp(ev.event_data.connect_event_data.private_data, "hello!", 6));
	wait_for(conn2, DAT_CONNECTION_EVENT_ESTABLISHED, "ESTABLISHED (passive)");
	MUST("ep_get_status 2", dat_ep_get_status(ep, &state, &ri, &qi));
	CHECK("ep_get_status: CONNECTED", state == DAT_EP_STATE_CONNECTED);
	MUST("ep_query connected", dat_ep_query(ep, DAT_EP_FIELD_ALL, &param));
	CHECK("ep_query: the remote address and port", param.remote_ia_address_ptr != NULL &&
							   ((struct sockaddr_in *)param.remote_ia_address_ptr)->sin_addr.s_addr ==
								   self.sin_addr.s_addr &&
							   param.remote_port_qual == port);
	for (i = 0; i < 65536; i++)
		buf[512 * 1024 + i] = (char)(i * 7);
	for (i = 0; i < 4; i++)
		iov[i] = (DAT_LMR_TRIPLET){(uintptr_t)buf + 4096 + i * 8192, 1000 + i, lctx};
	riov = (DAT_RMR_TRIPLET){(uintptr_t)buf + 512 * 1024, 4006, rctx};
	MUST("post_rdma_read 4 segments", dat_ep_post_rdma_read(ep, 4, iov, cookie, &riov, DAT_COMPLETION_DEFAULT_FLAG));
	ev = wait_for(dto, DAT_DTO_COMPLETION_EVENT, "the Read");
	CHECK("one completion for the scattered Read, of its whole length",
	      ev.event_data.dto_completion_event_data.status == DAT_DTO_SUCCESS &&
		      ev.event_data.dto_completion_event_data.transfered_length == 4006 &&
		      ev.event_data.dto_completion_event_data.user_cookie.as_64 == 0x1234 &&
		      ev.event_data.dto_completion_event_data.ep_handle == ep);
	{
		int off = 0, ok = 1, s;
		for (s = 0; s < 4; s++)
			for (i = 0; i < 1000 + s; i++, off++)
				if (buf[4096 + s * 8192 + i] != buf[512 * 1024 + off])
					ok = 0;
		CHECK("the scattered Read put each part where it belongs", ok);
	}
	CHECK("no second completion for it", dat_evd_dequeue(dto, &ev) == DAT_QUEUE_EMPTY);

	/* Threshold and nmore: three suppressed-then-signalled Sends. */
	for (i = 0; i < 3; i++)
		MUST("post_recv 3", dat_ep_post_recv(ep2, 1, (iov[0] = (DAT_LMR_TRIPLET){(uintptr_t)buf, 64, lctx}, iov), cookie,
						     DAT_COMPLETION_DEFAULT_FLAG));
	iov[0] = (DAT_LMR_TRIPLET){(uintptr_t)buf, 16, lctx};
	for (i = 0; i < 4; i++)
		MUST("post_send", dat_ep_post_send(ep, 1, iov, (DAT_DTO_COOKIE){.as_64 = i},
						   i == 1 ? DAT_COMPLETION_SUPPRESS_FLAG : DAT_COMPLETION_DEFAULT_FLAG));
	CHECK("wait for three", dat_evd_wait(dto, 10000000, 3, &ev, &more) == DAT_SUCCESS && more == 2);
	CHECK("a suppressed Send does not complete",
	      ev.event_data.dto_completion_event_data.user_cookie.as_64 == 0 && dat_evd_dequeue(dto, &ev) == DAT_SUCCESS &&
		      ev.event_data.dto_completion_event_data.user_cookie.as_64 == 2 && dat_evd_dequeue(dto, &ev) == DAT_SUCCESS &&
		      ev.event_data.dto_completion_event_data.user_cookie.as_64 == 3);
	CHECK("four receives, one per Send, suppressed or not",
	      dat_evd_wait(dto2, 10000000, 4, &ev, &more) == DAT_SUCCESS && more == 3 &&
		      ev.event_data.dto_completion_event_data.transfered_length == 16 &&
		      ev.event_data.dto_completion_event_data.operation == DAT_DTO_RECEIVE);

	/* set_unwaitable wakes a waiter with DAT_INVALID_STATE. */
	unwait_evd = conn2;
	pthread_create(&th, NULL, unwaiter, NULL);
	CHECK("set_unwaitable wakes the waiter", DAT_GET_TYPE(dat_evd_wait(conn2, DAT_TIMEOUT_INFINITE, 1, &ev, &more)) ==
							 DAT_INVALID_STATE);
	pthread_join(th, NULL);
	MUST("clear_unwaitable", dat_evd_clear_unwaitable(conn2));
	unwait_evd = async; /* an EVD with nothing behind it in the daemon */
	pthread_create(&th, NULL, unwaiter, NULL);
	CHECK("set_unwaitable wakes a waiter on the async EVD",
	      DAT_GET_TYPE(dat_evd_wait(async, DAT_TIMEOUT_INFINITE, 1, &ev, &more)) == DAT_INVALID_STATE);
	pthread_join(th, NULL);
	CHECK("an unwaitable EVD refuses a wait", DAT_GET_TYPE(dat_evd_wait(async, 1000, 1, &ev, &more)) == DAT_INVALID_STATE);
	MUST("clear_unwaitable async", dat_evd_clear_unwaitable(async));
	CHECK("the async EVD times out, waitable again", DAT_GET_TYPE(dat_evd_wait(async, 1000, 1, &ev, &more)) == DAT_TIMEOUT_EXPIRED);

	/* An RSP and a provider-created EP. */
	MUST("ep_create 3", dat_ep_create(ia, pz, dto3, dto3, conn2, NULL, &ep3));
	MUST("rsp_create", dat_rsp_create(ia, port + 1, ep3, cr_evd, &rsp));
	MUST("ep_query rsp", dat_ep_query(ep3, DAT_EP_FIELD_ALL, &param));
	CHECK("an RSP's EP is RESERVED", param.ep_state == DAT_EP_STATE_RESERVED);
	MUST("rsp_free", dat_rsp_free(rsp));
	MUST("ep_query rsp freed", dat_ep_query(ep3, DAT_EP_FIELD_ALL, &param));
	CHECK("freeing the RSP returns its EP to UNCONNECTED", param.ep_state == DAT_EP_STATE_UNCONNECTED);
	MUST("psp_free", dat_psp_free(psp));
	MUST("psp_create provider", dat_psp_create(ia, port, cr_evd, DAT_PSP_PROVIDER_FLAG, &psp));
	MUST("disconnect", dat_ep_disconnect(ep, DAT_CLOSE_GRACEFUL_FLAG));
	wait_for(conn_evd, DAT_CONNECTION_EVENT_DISCONNECTED, "DISCONNECTED");
	wait_for(conn2, DAT_CONNECTION_EVENT_DISCONNECTED, "DISCONNECTED (passive)");
	MUST("reset 2", dat_ep_reset(ep));
	MUST("connect 3", dat_ep_connect(ep, (DAT_IA_ADDRESS_PTR)&self, port, 10000000, 0, NULL, DAT_QOS_BEST_EFFORT,
					 DAT_CONNECT_DEFAULT_FLAG));
	ev = wait_for(cr_evd, DAT_CONNECTION_REQUEST_EVENT, "a request for a provider EP");
	MUST("cr_query provider", dat_cr_query(ev.event_data.cr_arrival_event_data.cr_handle, DAT_CR_FIELD_ALL, &crp));
	pep = crp.local_ep_handle;
	CHECK("a provider PSP's request comes with an EP", pep != DAT_HANDLE_NULL);
	if (pep != DAT_HANDLE_NULL) {
		MUST("ep_query provider EP", dat_ep_query(pep, DAT_EP_FIELD_ALL, &param));
		CHECK("it is TENTATIVE_CONNECTION_PENDING", param.ep_state == DAT_EP_STATE_TENTATIVE_CONNECTION_PENDING);
		MUST("cr_reject provider", dat_cr_reject(ev.event_data.cr_arrival_event_data.cr_handle, 0, NULL));
		wait_for(conn_evd, DAT_CONNECTION_EVENT_PEER_REJECTED, "PEER_REJECTED (provider EP)");
	}
	MUST("ia_close", dat_ia_close(ia, DAT_CLOSE_ABRUPT_FLAG));
	free(buf);
	printf("%d failures\n", failures);
	return failures ? 1 : 0;
}
