/* DAT_EVENT builders for the Go side, which cannot write union members. */
#include <string.h>
#include "srn.h"

void srn_dto_event(DAT_EVENT *e, DAT_EVD_HANDLE evd, DAT_EP_HANDLE ep, uint64_t cookie, DAT_DTO_COMPLETION_STATUS status,
		   DAT_SEG_LENGTH len, DAT_DTOS op, DAT_RMR_CONTEXT rmr)
{
	DAT_DTO_COMPLETION_EVENT_DATA *d = &e->event_data.dto_completion_event_data;

	memset(e, 0, sizeof(*e));
	e->event_number = DAT_DTO_COMPLETION_EVENT;
	e->evd_handle = evd;
	d->ep_handle = ep;
	d->user_cookie.as_64 = cookie;
	d->status = status;
	d->transfered_length = len;
	d->operation = op;
	d->rmr_context = rmr;
}

void srn_conn_event(DAT_EVENT *e, DAT_EVD_HANDLE evd, DAT_EVENT_NUMBER n, DAT_EP_HANDLE ep, DAT_COUNT pdata_len,
		    DAT_PVOID pdata)
{
	DAT_CONNECTION_EVENT_DATA *d = &e->event_data.connect_event_data;

	memset(e, 0, sizeof(*e));
	e->event_number = n;
	e->evd_handle = evd;
	d->ep_handle = ep;
	d->private_data_size = pdata_len;
	d->private_data = pdata;
}

void srn_cr_event(DAT_EVENT *e, DAT_EVD_HANDLE evd, DAT_HANDLE sp, DAT_IA_ADDRESS_PTR local, DAT_CONN_QUAL qual,
		  DAT_CR_HANDLE cr)
{
	DAT_CR_ARRIVAL_EVENT_DATA *d = &e->event_data.cr_arrival_event_data;

	memset(e, 0, sizeof(*e));
	e->event_number = DAT_CONNECTION_REQUEST_EVENT;
	e->evd_handle = evd;
	d->sp_handle.psp_handle = sp;
	d->local_ia_address_ptr = local;
	d->conn_qual = qual;
	d->cr_handle = cr;
}

void srn_async_event(DAT_EVENT *e, DAT_EVD_HANDLE evd, DAT_EVENT_NUMBER n, DAT_HANDLE h, DAT_COUNT reason)
{
	memset(e, 0, sizeof(*e));
	e->event_number = n;
	e->evd_handle = evd;
	e->event_data.asynch_error_event_data.dat_handle = h;
	e->event_data.asynch_error_event_data.reason = reason;
}

/* What consumers look up by name: dtest runs its RDMA Read phases only
 * when DAT_IB_RDMA_READ is TRUE (libdaplofa reports the same on iWARP). */
DAT_NAMED_ATTR srn_provider_attrs[] = {
	{"DAT_IB_RDMA_READ", "TRUE"},
	{"DAT_IOV_SEGMENTS_PER_RDMA_READ", "4"},
	{"DAT_IW_TRANSPORT", "softrnic"},
};
const int srn_num_provider_attrs = sizeof(srn_provider_attrs) / sizeof(srn_provider_attrs[0]);

