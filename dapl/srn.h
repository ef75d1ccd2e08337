/*
 * softrnic's uDAPL provider: the handle every DAT object is to its consumer.
 * Shared by the C table (provider.c) and the Go implementation (cgo).
 */
#ifndef SRN_H
#define SRN_H

#include <stdint.h>
#include <netinet/in.h>
/* libdat2 is built with extensions: its provider table ends with the
 * extension slot, so ours must too. */
#ifndef DAT_EXTENSIONS
#define DAT_EXTENSIONS 1
#endif
#include <dat2/udat.h>
#include <dat2/dat_registry.h>

/* The most private data MPA carries (RFC 5044 §7.1: 512 octets). */
#define SRN_MAX_PDATA 512

/* magic | kind marks a live handle; freeing clears magic. */
#define SRN_MAGIC 0x5e7f0000u

enum srn_kind {
	SRN_IA = 1, SRN_PZ, SRN_LMR, SRN_EVD, SRN_EP, SRN_PSP, SRN_RSP, SRN_CR,
};

/* What srnPost posts. */
enum srn_post { SRN_POST_SEND = 1, SRN_POST_RECV, SRN_POST_READ, SRN_POST_WRITE };

/*
 * srn_obj is a DAT handle. libdat2 finds the provider's table through the
 * first word of every handle (DAT_HANDLE_TO_PROVIDER). The memory is never
 * returned to malloc, and a freed handle is reused only after a quarantine
 * of 1024 others (main.go): a consumer that passes a freed handle gets
 * DAT_INVALID_HANDLE, not a crash.
 */
typedef struct srn_obj {
	DAT_PROVIDER *provider;
	uint32_t magic;
	uint32_t id;		/* index of the object in the Go table */
	DAT_CONTEXT context;	/* dat_set_consumer_context */
	/* Addresses the object reports by pointer: the IA's own address, an
	 * EP's local and remote addresses, a CR's remote address. */
	struct sockaddr_in local, remote;
	/* Private data reported by pointer: a CR's request, an EP's last
	 * connection event. */
	DAT_COUNT pdata_len;
	unsigned char pdata[SRN_MAX_PDATA];
} srn_obj;

/* Event builders (events.c): DAT_EVENT's data is a union, which Go cannot
 * write by member. */
void srn_dto_event(DAT_EVENT *e, DAT_EVD_HANDLE evd, DAT_EP_HANDLE ep, uint64_t cookie, DAT_DTO_COMPLETION_STATUS status,
		   DAT_SEG_LENGTH len, DAT_DTOS op, DAT_RMR_CONTEXT rmr);
void srn_conn_event(DAT_EVENT *e, DAT_EVD_HANDLE evd, DAT_EVENT_NUMBER n, DAT_EP_HANDLE ep, DAT_COUNT pdata_len,
		    DAT_PVOID pdata);
void srn_cr_event(DAT_EVENT *e, DAT_EVD_HANDLE evd, DAT_HANDLE sp, DAT_IA_ADDRESS_PTR local, DAT_CONN_QUAL qual,
		  DAT_CR_HANDLE cr);
void srn_async_event(DAT_EVENT *e, DAT_EVD_HANDLE evd, DAT_EVENT_NUMBER n, DAT_HANDLE h, DAT_COUNT reason);

/* The provider attributes' named attributes (events.c). */
extern DAT_NAMED_ATTR srn_provider_attrs[];
extern const int srn_num_provider_attrs;

/* move.c */
int srn_move_held(int uffd, int memfd, uintptr_t start, uintptr_t len, int prot);

/* libdat2 maps the IA handle a consumer holds to the provider's; it is
 * exported by libdat2 but declared in no installed header. */
extern DAT_RETURN dats_get_ia_handle(DAT_IA_HANDLE, DAT_IA_HANDLE *);

#endif
