/*
 * softrnic's uDAPL provider: the entry points libdat2 looks up, and the
 * table of DAT functions. The functions themselves are Go (exported through
 * cgo, declared in _cgo_export.h); C holds only what must be C: the table,
 * the few entry points that take unions by value, and the handle helpers
 * that need no daemon.
 */
#include <stdlib.h>
#include <string.h>
#include "srn.h"
#include "_cgo_export.h"

/* Every slot softrnic does not implement. The table's types differ per
 * slot; the callee takes no arguments and returns a DAT_RETURN, which the
 * C calling conventions of every Linux target Go supports make safe. */
static DAT_RETURN srn_not_implemented(void)
{
	return DAT_NOT_IMPLEMENTED;
}

static srn_obj *live(DAT_HANDLE h)
{
	srn_obj *o = (srn_obj *)h;
	if (o == NULL || (o->magic & 0xffff0000u) != SRN_MAGIC)
		return NULL;
	return o;
}

static DAT_RETURN srn_set_consumer_context(DAT_HANDLE h, DAT_CONTEXT c)
{
	srn_obj *o = live(h);
	if (o == NULL)
		return (DAT_CLASS_ERROR | DAT_INVALID_HANDLE | DAT_NO_SUBTYPE);
	o->context = c;
	return DAT_SUCCESS;
}

static DAT_RETURN srn_get_consumer_context(DAT_HANDLE h, DAT_CONTEXT *c)
{
	srn_obj *o = live(h);
	if (o == NULL)
		return (DAT_CLASS_ERROR | DAT_INVALID_HANDLE | DAT_NO_SUBTYPE);
	if (c == NULL)
		return (DAT_CLASS_ERROR | DAT_INVALID_PARAMETER | DAT_INVALID_ARG2);
	*c = o->context;
	return DAT_SUCCESS;
}

static DAT_RETURN srn_get_handle_type(DAT_HANDLE h, DAT_HANDLE_TYPE *t)
{
	static const DAT_HANDLE_TYPE types[] = {
		[SRN_IA] = DAT_HANDLE_TYPE_IA, [SRN_PZ] = DAT_HANDLE_TYPE_PZ,
		[SRN_LMR] = DAT_HANDLE_TYPE_LMR, [SRN_EVD] = DAT_HANDLE_TYPE_EVD,
		[SRN_EP] = DAT_HANDLE_TYPE_EP, [SRN_PSP] = DAT_HANDLE_TYPE_PSP,
		[SRN_RSP] = DAT_HANDLE_TYPE_RSP, [SRN_CR] = DAT_HANDLE_TYPE_CR,
	};
	srn_obj *o = live(h);
	uint32_t kind;
	if (o == NULL)
		return (DAT_CLASS_ERROR | DAT_INVALID_HANDLE | DAT_NO_SUBTYPE);
	kind = o->magic & 0xffffu;
	if (kind == 0 || kind > SRN_CR)
		return (DAT_CLASS_ERROR | DAT_INVALID_HANDLE | DAT_NO_SUBTYPE);
	if (t == NULL)
		return (DAT_CLASS_ERROR | DAT_INVALID_PARAMETER | DAT_INVALID_ARG2);
	*t = types[kind];
	return DAT_SUCCESS;
}

/* Posts: the cookie is a union passed by value. */
static DAT_RETURN srn_post_send(DAT_EP_HANDLE ep, DAT_COUNT n, DAT_LMR_TRIPLET *iov, DAT_DTO_COOKIE cookie,
				DAT_COMPLETION_FLAGS flags)
{
	return srnPost(ep, SRN_POST_SEND, n, iov, cookie.as_64, NULL, flags);
}

static DAT_RETURN srn_post_recv(DAT_EP_HANDLE ep, DAT_COUNT n, DAT_LMR_TRIPLET *iov, DAT_DTO_COOKIE cookie,
				DAT_COMPLETION_FLAGS flags)
{
	return srnPost(ep, SRN_POST_RECV, n, iov, cookie.as_64, NULL, flags);
}

static DAT_RETURN srn_post_rdma_read(DAT_EP_HANDLE ep, DAT_COUNT n, DAT_LMR_TRIPLET *iov, DAT_DTO_COOKIE cookie,
				     const DAT_RMR_TRIPLET *remote, DAT_COMPLETION_FLAGS flags)
{
	return srnPost(ep, SRN_POST_READ, n, iov, cookie.as_64, (DAT_RMR_TRIPLET *)remote, flags);
}

static DAT_RETURN srn_post_rdma_write(DAT_EP_HANDLE ep, DAT_COUNT n, DAT_LMR_TRIPLET *iov, DAT_DTO_COOKIE cookie,
				      const DAT_RMR_TRIPLET *remote, DAT_COMPLETION_FLAGS flags)
{
	return srnPost(ep, SRN_POST_WRITE, n, iov, cookie.as_64, (DAT_RMR_TRIPLET *)remote, flags);
}

/* dat_lmr_create: the region description is a union passed by value. */
static DAT_RETURN srn_lmr_create(DAT_IA_HANDLE ia, DAT_MEM_TYPE type, DAT_REGION_DESCRIPTION region, DAT_VLEN length,
				 DAT_PZ_HANDLE pz, DAT_MEM_PRIV_FLAGS priv, DAT_VA_TYPE va_type, DAT_LMR_HANDLE *lmr,
				 DAT_LMR_CONTEXT *lctx, DAT_RMR_CONTEXT *rctx, DAT_VLEN *reg_len, DAT_VADDR *reg_addr)
{
	void *addr = type == DAT_MEM_TYPE_LMR ? NULL : region.for_va;
	return srnLMRCreate(ia, type, addr, length, pz, priv, va_type, lmr, lctx, rctx, reg_len, reg_addr);
}

static void fill(DAT_PROVIDER *p)
{
	void (**slot)(void) = (void (**)(void))&p->ia_open_func;
	void (**end)(void) = (void (**)(void))(p + 1);

	for (; slot < end; slot++)
		*slot = (void (*)(void))srn_not_implemented;

	p->ia_open_func = (DAT_IA_OPEN_FUNC)srnIAOpen;
	p->ia_query_func = (DAT_IA_QUERY_FUNC)srnIAQuery;
	p->ia_close_func = (DAT_IA_CLOSE_FUNC)srnIAClose;
	p->set_consumer_context_func = srn_set_consumer_context;
	p->get_consumer_context_func = srn_get_consumer_context;
	p->get_handle_type_func = srn_get_handle_type;

	p->cr_query_func = (DAT_CR_QUERY_FUNC)srnCRQuery;
	p->cr_accept_func = (DAT_CR_ACCEPT_FUNC)srnCRAccept;
	p->cr_reject_func = (DAT_CR_REJECT_FUNC)srnCRReject;

	p->evd_create_func = (DAT_EVD_CREATE_FUNC)srnEVDCreate;
	p->evd_query_func = (DAT_EVD_QUERY_FUNC)srnEVDQuery;
	p->evd_modify_cno_func = (DAT_EVD_MODIFY_CNO_FUNC)srnEVDModifyCNO;
	p->evd_enable_func = (DAT_EVD_ENABLE_FUNC)srnEVDEnable;
	p->evd_disable_func = (DAT_EVD_DISABLE_FUNC)srnEVDDisable;
	p->evd_wait_func = (DAT_EVD_WAIT_FUNC)srnEVDWait;
	p->evd_dequeue_func = (DAT_EVD_DEQUEUE_FUNC)srnEVDDequeue;
	p->evd_free_func = (DAT_EVD_FREE_FUNC)srnEVDFree;
	p->evd_set_unwaitable_func = (DAT_EVD_SET_UNWAITABLE_FUNC)srnEVDSetUnwaitable;
	p->evd_clear_unwaitable_func = (DAT_EVD_CLEAR_UNWAITABLE_FUNC)srnEVDClearUnwaitable;

	p->ep_create_func = (DAT_EP_CREATE_FUNC)srnEPCreate;
	p->ep_query_func = (DAT_EP_QUERY_FUNC)srnEPQuery;
	p->ep_modify_func = (DAT_EP_MODIFY_FUNC)srnEPModify;
	p->ep_connect_func = (DAT_EP_CONNECT_FUNC)srnEPConnect;
	p->ep_disconnect_func = (DAT_EP_DISCONNECT_FUNC)srnEPDisconnect;
	p->ep_post_send_func = srn_post_send;
	p->ep_post_recv_func = srn_post_recv;
	p->ep_post_rdma_read_func = srn_post_rdma_read;
	p->ep_post_rdma_write_func = srn_post_rdma_write;
	p->ep_get_status_func = (DAT_EP_GET_STATUS_FUNC)srnEPGetStatus;
	p->ep_free_func = (DAT_EP_FREE_FUNC)srnEPFree;
	p->ep_reset_func = (DAT_EP_RESET_FUNC)srnEPReset;

	p->lmr_create_func = srn_lmr_create;
	p->lmr_query_func = (DAT_LMR_QUERY_FUNC)srnLMRQuery;
	p->lmr_free_func = (DAT_LMR_FREE_FUNC)srnLMRFree;
	p->lmr_sync_rdma_read_func = (DAT_LMR_SYNC_RDMA_READ_FUNC)srnLMRSync;
	p->lmr_sync_rdma_write_func = (DAT_LMR_SYNC_RDMA_WRITE_FUNC)srnLMRSync;

	p->psp_create_func = (DAT_PSP_CREATE_FUNC)srnPSPCreate;
	p->psp_create_any_func = (DAT_PSP_CREATE_ANY_FUNC)srnPSPCreateAny;
	p->psp_query_func = (DAT_PSP_QUERY_FUNC)srnPSPQuery;
	p->psp_free_func = (DAT_PSP_FREE_FUNC)srnSPFree;
	p->rsp_create_func = (DAT_RSP_CREATE_FUNC)srnRSPCreate;
	p->rsp_query_func = (DAT_RSP_QUERY_FUNC)srnRSPQuery;
	p->rsp_free_func = (DAT_RSP_FREE_FUNC)srnSPFree;

	p->pz_create_func = (DAT_PZ_CREATE_FUNC)srnPZCreate;
	p->pz_query_func = (DAT_PZ_QUERY_FUNC)srnPZQuery;
	p->pz_free_func = (DAT_PZ_FREE_FUNC)srnPZFree;
}

/*
 * libdat2 calls dat_provider_init for each dat.conf entry naming this
 * library, on the first dat_ia_open of that name, with the entry's
 * ia_params. Each entry gets its own table: the handles of an IA opened
 * through it lead back to it.
 */
void dat_provider_init(const DAT_PROVIDER_INFO *info, const char *params)
{
	DAT_PROVIDER *p;
	char *name;

	if (info == NULL)
		return;
	p = calloc(1, sizeof(*p));
	name = strdup(info->ia_name);
	if (p == NULL || name == NULL) {
		free(p);
		free(name);
		return;
	}
	p->device_name = name;
	fill(p);
	if (srnRegister(p, (char *)info->ia_name, (char *)(params ? params : "")) != DAT_SUCCESS)
		return; /* the table stays allocated: libdat2 may hold it */
	dat_registry_add_provider(p, info);
}

void dat_provider_fini(const DAT_PROVIDER_INFO *info)
{
	DAT_PROVIDER *p;

	if (info == NULL)
		return;
	p = srnUnregister((char *)info->ia_name);
	if (p != NULL)
		dat_registry_remove_provider(p, info);
}
