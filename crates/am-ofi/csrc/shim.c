/*
 * The libfabric calls am-ofi makes, as plain functions.
 *
 * Most of libfabric's data path (fi_send, fi_write, fi_cq_read, ...) is static inline
 * functions in its headers that call through the provider's operation tables, and its
 * structures change between releases. This file is compiled against the installed headers,
 * so every structure and table is read with the layout of the libfabric the program links
 * with, and the Rust side sees only the small structures declared below (whose sizes it
 * checks at start-up, amofi_sizes).
 */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

/* What the Rust side reads of an fi_info. */
struct amofi_attr {
	uint64_t caps;
	uint64_t mode;
	uint64_t mr_mode;
	uint64_t inject_size;
	uint64_t max_msg_size;
	uint64_t tx_size;
	uint64_t rx_size;
	uint64_t data_progress;
	uint64_t msg_order;
	char prov[64];
	char fabric[64];
	char domain[64];
};

/* One completion. */
struct amofi_cqe {
	uint64_t context;
	uint64_t flags;
	uint64_t len;
};

/* One error completion, with the provider's text. */
struct amofi_cqerr {
	uint64_t context;
	uint64_t flags;
	int32_t err;
	int32_t prov_errno;
	char text[256];
};

struct amofi {
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_av *av;
	struct fid_cq *cq;
	struct fid_ep *ep;
	/* Registrations by slot, `nmr` of them (NULL: a free slot), grown as slots are used. */
	struct fid_mr **mr;
	void **desc;
	int nmr;
	/* The last key handed out where the provider does not pick keys (no FI_MR_PROV_KEY):
	 * every registration of the endpoint's life gets another, so that a key a peer kept
	 * never names a later registration. */
	uint64_t last_key;
	int wait_fd;
};

void amofi_sizes(size_t *attr, size_t *cqe, size_t *cqerr)
{
	*attr = sizeof(struct amofi_attr);
	*cqe = sizeof(struct amofi_cqe);
	*cqerr = sizeof(struct amofi_cqerr);
}

const char *amofi_strerror(int err)
{
	return fi_strerror(err);
}

static struct fi_info *hints_for(const char *prov, uint64_t caps)
{
	struct fi_info *hints = fi_allocinfo();
	if (!hints)
		return NULL;
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = caps;
	/* No mode bits: operation contexts are opaque numbers, never provider scratch space. */
	hints->mode = 0;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
				      FI_MR_PROV_KEY | FI_MR_ENDPOINT;
	/* One thread at a time per endpoint: the transport is driven by one owner. */
	hints->domain_attr->threading = FI_THREAD_DOMAIN;
	/* Messages of one sender to one receiver arrive in the order they were sent. */
	hints->tx_attr->msg_order = FI_ORDER_SAS;
	hints->rx_attr->msg_order = FI_ORDER_SAS;
	if (prov) {
		hints->fabric_attr->prov_name = strdup(prov);
		if (!hints->fabric_attr->prov_name) {
			fi_freeinfo(hints);
			return NULL;
		}
	}
	return hints;
}

/* The RDM interfaces that offer `caps` (FI_MSG | FI_RMA, optionally FI_ATOMIC), of provider
 * `prov` (a name such as "tcp" or "tcp;ofi_rxm"; NULL for any). */
int amofi_getinfo(const char *prov, int atomics, struct fi_info **out)
{
	uint64_t caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE |
			FI_SEND | FI_RECV;
	if (atomics)
		caps |= FI_ATOMIC;
	struct fi_info *hints = hints_for(prov, caps);
	if (!hints)
		return -FI_ENOMEM;
	int rc = fi_getinfo(FI_VERSION(1, 5), NULL, NULL, 0, hints, out);
	fi_freeinfo(hints);
	return rc;
}

struct fi_info *amofi_info_next(struct fi_info *info)
{
	return info->next;
}

void amofi_freeinfo(struct fi_info *info)
{
	fi_freeinfo(info);
}

static void copy_name(char *dst, const char *src)
{
	snprintf(dst, 64, "%s", src ? src : "");
}

void amofi_info_attr(const struct fi_info *info, struct amofi_attr *out)
{
	memset(out, 0, sizeof(*out));
	out->caps = info->caps;
	out->mode = info->mode;
	out->mr_mode = (uint64_t)info->domain_attr->mr_mode;
	out->inject_size = info->tx_attr->inject_size;
	out->max_msg_size = info->ep_attr->max_msg_size;
	out->tx_size = info->tx_attr->size;
	out->rx_size = info->rx_attr->size;
	out->data_progress = info->domain_attr->data_progress;
	out->msg_order = info->tx_attr->msg_order;
	copy_name(out->prov, info->fabric_attr->prov_name);
	copy_name(out->fabric, info->fabric_attr->name);
	copy_name(out->domain, info->domain_attr->name);
}

/* Every provider offering an RDM endpoint, whatever its capabilities: names separated by
 * ", " into `buf` (truncated to `len`). */
int amofi_providers(char *buf, size_t len)
{
	struct fi_info *info = NULL;
	/* No hints: every interface, whatever modes and registration it asks for. */
	int rc = fi_getinfo(FI_VERSION(1, 5), NULL, NULL, 0, NULL, &info);
	if (len)
		buf[0] = 0;
	if (rc)
		return rc == -FI_ENODATA ? 0 : rc;
	size_t at = 0;
	for (struct fi_info *i = info; i; i = i->next) {
		const char *name = i->fabric_attr->prov_name;
		if (i->ep_attr->type != FI_EP_RDM || !name || strstr(buf, name))
			continue;
		int n = snprintf(buf + at, len > at ? len - at : 0, "%s%s", at ? ", " : "", name);
		if (n < 0 || (size_t)n >= len - at)
			break;
		at += (size_t)n;
	}
	fi_freeinfo(info);
	return 0;
}

/* Closes every libfabric object of `a` (the shm provider removes its /dev/shm region
 * then), leaving `a` itself: the functions below then fail with -FI_EBADF, and reading the
 * completion queue finds nothing. The endpoint first: once it is closed no operation
 * touches memory any more. Its result is returned (0 if it was closed before): the caller
 * must not free what the provider may still touch if it failed. */
int amofi_shutdown(struct amofi *a)
{
	int rc = 0;
	if (!a)
		return 0;
	if (a->ep)
		rc = fi_close(&a->ep->fid);
	a->ep = NULL;
	for (int i = 0; i < a->nmr; i++) {
		if (a->mr[i])
			fi_close(&a->mr[i]->fid);
		a->mr[i] = NULL;
		a->desc[i] = NULL;
	}
	if (a->av)
		fi_close(&a->av->fid);
	a->av = NULL;
	if (a->cq)
		fi_close(&a->cq->fid);
	a->cq = NULL;
	if (a->domain)
		fi_close(&a->domain->fid);
	a->domain = NULL;
	if (a->fabric)
		fi_close(&a->fabric->fid);
	a->fabric = NULL;
	a->wait_fd = -1;
	return rc;
}

/* Moves every open object of `a` to a new handle, which amofi_close closes, and leaves `a`
 * with none, as after amofi_shutdown (every later call refused). NULL when out of memory
 * (then `a` is unchanged). */
struct amofi *amofi_detach(struct amofi *a)
{
	struct amofi *k = malloc(sizeof(*k));
	if (!k)
		return NULL;
	*k = *a;
	/* The info goes with the objects made from it. */
	a->info = NULL;
	a->fabric = NULL;
	a->domain = NULL;
	a->av = NULL;
	a->cq = NULL;
	a->ep = NULL;
	/* The tables go with the registrations in them. */
	a->mr = NULL;
	a->desc = NULL;
	a->nmr = 0;
	a->wait_fd = -1;
	return k;
}

/* amofi_shutdown, then frees `a`. */
int amofi_close(struct amofi *a)
{
	if (!a)
		return 0;
	int rc = amofi_shutdown(a);
	if (a->info)
		fi_freeinfo(a->info);
	free(a->mr);
	free(a->desc);
	free(a);
	return rc;
}

/* Opens fabric, domain, address vector, completion queue and an enabled endpoint on `info`
 * (copied). `*step` names the call that failed. The completion queue has a file descriptor
 * to sleep on when `want_fd` and the provider gives one (amofi_wait_fd). `shm_name`, if
 * not NULL, names the region the shm provider keeps in /dev/shm (fi_setname before
 * fi_enable), which it otherwise names after the process id: a name of the job's lets the
 * launcher remove what a killed rank left. */
int amofi_open(const struct fi_info *info, size_t cq_size, int want_fd, const char *shm_name,
	       struct amofi **out, const char **step)
{
	struct amofi *a = calloc(1, sizeof(*a));
	int rc;
	*out = NULL;
	if (!a)
		return -FI_ENOMEM;
	a->wait_fd = -1;
	*step = "fi_dupinfo";
	a->info = fi_dupinfo(info);
	if (!a->info) {
		rc = -FI_ENOMEM;
		goto fail;
	}
	*step = "fi_fabric";
	rc = fi_fabric(a->info->fabric_attr, &a->fabric, NULL);
	if (rc)
		goto fail;
	*step = "fi_domain";
	rc = fi_domain(a->fabric, a->info, &a->domain, NULL);
	if (rc)
		goto fail;
	struct fi_av_attr av_attr = { 0 };
	av_attr.type = FI_AV_TABLE;
	*step = "fi_av_open";
	rc = fi_av_open(a->domain, &av_attr, &a->av, NULL);
	if (rc)
		goto fail;
	struct fi_cq_attr cq_attr = { 0 };
	cq_attr.format = FI_CQ_FORMAT_MSG;
	cq_attr.size = cq_size;
	cq_attr.wait_obj = want_fd ? FI_WAIT_FD : FI_WAIT_NONE;
	*step = "fi_cq_open";
	rc = fi_cq_open(a->domain, &cq_attr, &a->cq, NULL);
	if (rc && want_fd) {
		/* No file descriptor from this provider: a queue without a wait object. */
		cq_attr.wait_obj = FI_WAIT_NONE;
		rc = fi_cq_open(a->domain, &cq_attr, &a->cq, NULL);
		want_fd = 0;
	}
	if (rc)
		goto fail;
	if (want_fd) {
		int fd = -1;
		*step = "fi_control(FI_GETWAIT)";
		rc = fi_control(&a->cq->fid, FI_GETWAIT, &fd);
		if (rc)
			goto fail;
		a->wait_fd = fd;
	}
	*step = "fi_endpoint";
	rc = fi_endpoint(a->domain, a->info, &a->ep, NULL);
	if (rc)
		goto fail;
	*step = "fi_ep_bind(av)";
	rc = fi_ep_bind(a->ep, &a->av->fid, 0);
	if (rc)
		goto fail;
	*step = "fi_ep_bind(cq)";
	rc = fi_ep_bind(a->ep, &a->cq->fid, FI_TRANSMIT | FI_RECV);
	if (rc)
		goto fail;
	if (shm_name && a->info->fabric_attr && a->info->fabric_attr->prov_name &&
	    strcmp(a->info->fabric_attr->prov_name, "shm") == 0) {
		*step = "fi_setname";
		rc = fi_setname(&a->ep->fid, (void *)shm_name, strlen(shm_name) + 1);
		if (rc)
			goto fail;
	}
	*step = "fi_enable";
	rc = fi_enable(a->ep);
	if (rc)
		goto fail;
	*out = a;
	return 0;
fail:
	(void)amofi_close(a);
	return rc;
}

int amofi_wait_fd(const struct amofi *a)
{
	return a->wait_fd;
}

int amofi_getname(struct amofi *a, void *buf, size_t *len)
{
	if (!a->ep)
		return -FI_EBADF;
	return fi_getname(&a->ep->fid, buf, len);
}

/* Inserts one address of `len` bytes; its fi_addr_t to `*out`. One at a time: providers
 * differ in how they step through several (by a fixed length, or past each name's NUL, as
 * shm does), and an address vector of type FI_AV_TABLE numbers them in order either way.
 * 0, or a negative error. */
int amofi_av_insert(struct amofi *a, const void *addr, size_t len, uint64_t *out)
{
	if (!a->ep)
		return -FI_EBADF;
	(void)len;
	fi_addr_t fa = FI_ADDR_NOTAVAIL;
	int n = fi_av_insert(a->av, addr, 1, &fa, 0, NULL);
	if (n < 0)
		return n;
	if (n != 1 || fa == FI_ADDR_NOTAVAIL)
		return -FI_EADDRNOTAVAIL;
	*out = (uint64_t)fa;
	return 0;
}

/* Makes room for slot `slot` in the registration tables: 0, or -FI_ENOMEM (the tables are
 * then as they were, or larger with the new entries free). */
static int mr_room(struct amofi *a, int slot)
{
	if (slot < a->nmr)
		return 0;
	int n = a->nmr ? a->nmr : 8;
	while (n <= slot) {
		if (n > (1 << 20))
			return -FI_ENOMEM;
		n *= 2;
	}
	struct fid_mr **mr = realloc(a->mr, (size_t)n * sizeof(*mr));
	if (!mr)
		return -FI_ENOMEM;
	a->mr = mr;
	void **desc = realloc(a->desc, (size_t)n * sizeof(*desc));
	if (!desc)
		return -FI_ENOMEM;
	a->desc = desc;
	for (int i = a->nmr; i < n; i++) {
		a->mr[i] = NULL;
		a->desc[i] = NULL;
	}
	a->nmr = n;
	return 0;
}

/* Registers `len` bytes at `buf` as region `slot` (any slot not in use; the tables grow to
 * hold it). `remote`: peers read and write it; otherwise it is local memory operations use,
 * registered only where the provider asks for that (FI_MR_LOCAL). The key peers use goes to
 * `*key`, the address they name it by to `*base` (the virtual address, or 0 where offsets
 * are used). On failure the slot is left free. */
int amofi_mr_reg(struct amofi *a, int slot, void *buf, size_t len, int remote, uint64_t *key,
		 uint64_t *base)
{
	if (!a->ep)
		return -FI_EBADF;
	uint64_t mr_mode = (uint64_t)a->info->domain_attr->mr_mode;
	*key = 0;
	*base = (mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)buf : 0;
	if (slot < 0)
		return -FI_EINVAL;
	int rc = mr_room(a, slot);
	if (rc)
		return rc;
	if (a->mr[slot])
		return -FI_EINVAL;
	if (!remote && !(mr_mode & FI_MR_LOCAL))
		return 0;
	uint64_t access = remote ? (FI_REMOTE_READ | FI_REMOTE_WRITE | FI_READ | FI_WRITE)
				 : (FI_SEND | FI_RECV | FI_READ | FI_WRITE);
	/* Without FI_MR_PROV_KEY the application picks the keys: never one handed out before. */
	struct fid_mr *mr = NULL;
	rc = fi_mr_reg(a->domain, buf, len, access, 0, ++a->last_key, 0, &mr, NULL);
	if (rc)
		return rc;
	if (mr_mode & FI_MR_ENDPOINT) {
		rc = fi_mr_bind(mr, &a->ep->fid, 0);
		if (!rc)
			rc = fi_mr_enable(mr);
		if (rc) {
			fi_close(&mr->fid);
			return rc;
		}
	}
	a->mr[slot] = mr;
	a->desc[slot] = fi_mr_desc(mr);
	*key = fi_mr_key(mr);
	return 0;
}

/* Closes the registration in `slot` (nothing there: nothing to do), and frees the slot. Once
 * it returns 0 the provider no longer touches the memory through it; otherwise it may. */
int amofi_mr_close(struct amofi *a, int slot)
{
	if (slot < 0 || slot >= a->nmr || !a->mr[slot])
		return 0;
	int rc = fi_close(&a->mr[slot]->fid);
	if (rc)
		return rc;
	a->mr[slot] = NULL;
	a->desc[slot] = NULL;
	return 0;
}

static void *desc(struct amofi *a, int slot)
{
	return (slot >= 0 && slot < a->nmr) ? a->desc[slot] : NULL;
}

ssize_t amofi_recv(struct amofi *a, void *buf, size_t len, int slot, uint64_t ctx)
{
	if (!a->ep)
		return -FI_EBADF;
	return fi_recv(a->ep, buf, len, desc(a, slot), FI_ADDR_UNSPEC, (void *)(uintptr_t)ctx);
}

ssize_t amofi_send(struct amofi *a, const void *buf, size_t len, int slot, uint64_t dest,
		   uint64_t ctx)
{
	if (!a->ep)
		return -FI_EBADF;
	return fi_send(a->ep, buf, len, desc(a, slot), (fi_addr_t)dest, (void *)(uintptr_t)ctx);
}

ssize_t amofi_inject(struct amofi *a, const void *buf, size_t len, uint64_t dest)
{
	if (!a->ep)
		return -FI_EBADF;
	return fi_inject(a->ep, buf, len, (fi_addr_t)dest);
}

/* An RMA write (`write` != 0) or read of `len` bytes between local `buf` (in region `slot`)
 * and `raddr` under `key` at `dest`. A write completes once the data is at the target
 * (FI_DELIVERY_COMPLETE) when `delivery`. */
ssize_t amofi_rma(struct amofi *a, int write, void *buf, size_t len, int slot, uint64_t dest,
		  uint64_t raddr, uint64_t key, uint64_t ctx, int delivery)
{
	if (!a->ep)
		return -FI_EBADF;
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	void *d = desc(a, slot);
	struct fi_rma_iov rma = { .addr = raddr, .len = len, .key = key };
	struct fi_msg_rma msg = {
		.msg_iov = &iov,
		.desc = &d,
		.iov_count = 1,
		.addr = (fi_addr_t)dest,
		.rma_iov = &rma,
		.rma_iov_count = 1,
		.context = (void *)(uintptr_t)ctx,
		.data = 0,
	};
	uint64_t flags = FI_COMPLETION;
	if (write) {
		if (delivery)
			flags |= FI_DELIVERY_COMPLETE;
		return fi_writemsg(a->ep, &msg, flags);
	}
	return fi_readmsg(a->ep, &msg, flags);
}

static int atomic_op(int code, enum fi_op *op)
{
	/* amnet's atomic codes (am_core::atomic::Code). */
	switch (code) {
	case 0: *op = FI_ATOMIC_READ; return 0;
	case 1: *op = FI_ATOMIC_WRITE; return 0;
	case 2: *op = FI_ATOMIC_WRITE; return 0;
	case 3: *op = FI_CSWAP; return 0;
	case 4: *op = FI_SUM; return 0;
	case 5: *op = FI_BAND; return 0;
	case 6: *op = FI_BOR; return 0;
	case 7: *op = FI_BXOR; return 0;
	case 8: *op = FI_MIN; return 0;
	case 9: *op = FI_MAX; return 0;
	case 10: *op = FI_PROD; return 0;
	default: return -FI_EINVAL;
	}
}

/* A word of `width` bytes read as `type` (am_core::atomic::WordType's wire code: 0 unsigned,
 * 1 signed, 2 float). */
static int atomic_type(int width, int type, enum fi_datatype *t)
{
	static const enum fi_datatype types[3][2] = {
		{ FI_UINT32, FI_UINT64 },
		{ FI_INT32, FI_INT64 },
		{ FI_FLOAT, FI_DOUBLE },
	};
	if (type < 0 || type > 2 || (width != 4 && width != 8))
		return -FI_EINVAL;
	*t = types[type][width == 8];
	return 0;
}

/* Whether the provider applies amnet atomic `code` on words of `width` bytes read as `type`:
 * `kind` 0 as a plain atomic, 1 fetching, 2 comparing. 1 yes, 0 no, negative on a bad
 * argument. */
int amofi_atomic_valid(struct amofi *a, int code, int width, int type, int kind)
{
	if (!a->ep)
		return 0;
	enum fi_op op;
	enum fi_datatype t;
	size_t count = 0;
	if (atomic_op(code, &op) || atomic_type(width, type, &t))
		return -FI_EINVAL;
	int rc;
	if (kind == 2)
		rc = fi_compare_atomicvalid(a->ep, t, op, &count);
	else if (kind == 1)
		rc = fi_fetch_atomicvalid(a->ep, t, op, &count);
	else
		rc = fi_atomicvalid(a->ep, t, op, &count);
	return rc == 0 && count >= 1;
}

/* An atomic on the word at `raddr` under `key` at `dest`, read as `type`: with `compare` (a
 * compare-and-swap, old value to `result`), with `result` only (fetching) or neither.
 * `operand`, `compare` and `result` are one word each in region `slot`. */
ssize_t amofi_atomic(struct amofi *a, int code, int width, int type, const void *operand,
		     const void *compare, void *result, int slot, uint64_t dest, uint64_t raddr,
		     uint64_t key, uint64_t ctx)
{
	if (!a->ep)
		return -FI_EBADF;
	enum fi_op op;
	enum fi_datatype t;
	if (atomic_op(code, &op) || atomic_type(width, type, &t))
		return -FI_EINVAL;
	void *d = desc(a, slot);
	void *c = (void *)(uintptr_t)ctx;
	if (compare)
		return fi_compare_atomic(a->ep, operand, 1, d, compare, d, result, d,
					 (fi_addr_t)dest, raddr, key, t, op, c);
	if (result)
		return fi_fetch_atomic(a->ep, operand, 1, d, result, d, (fi_addr_t)dest, raddr,
				       key, t, op, c);
	return fi_atomic(a->ep, operand, 1, d, (fi_addr_t)dest, raddr, key, t, op, c);
}

/* Up to `n` completions into `out`: their number, -FI_EAGAIN for none, -FI_EAVAIL when an
 * error completion is next (amofi_cq_readerr). */
ssize_t amofi_cq_read(struct amofi *a, struct amofi_cqe *out, size_t n)
{
	if (!a->cq)
		return -FI_EAGAIN;
	struct fi_cq_msg_entry entries[64];
	if (n > 64)
		n = 64;
	ssize_t got = fi_cq_read(a->cq, entries, n);
	for (ssize_t i = 0; i < got; i++) {
		out[i].context = (uint64_t)(uintptr_t)entries[i].op_context;
		out[i].flags = entries[i].flags;
		out[i].len = entries[i].len;
	}
	return got;
}

int amofi_cq_readerr(struct amofi *a, struct amofi_cqerr *out)
{
	if (!a->cq)
		return 0;
	struct fi_cq_err_entry e;
	memset(&e, 0, sizeof(e));
	memset(out, 0, sizeof(*out));
	ssize_t rc = fi_cq_readerr(a->cq, &e, 0);
	if (rc < 0)
		return (int)rc;
	out->context = (uint64_t)(uintptr_t)e.op_context;
	out->flags = e.flags;
	out->err = e.err;
	out->prov_errno = e.prov_errno;
	const char *text = fi_cq_strerror(a->cq, e.prov_errno, e.err_data, out->text,
					  sizeof(out->text));
	if (text && text != out->text)
		snprintf(out->text, sizeof(out->text), "%s", text);
	return 1;
}

/* Whether the caller may sleep on the wait descriptor now: 0 yes, -FI_EAGAIN when
 * completions are there to read first. */
int amofi_trywait(struct amofi *a)
{
	if (!a->cq)
		return -FI_EAGAIN;
	struct fid *fids[1] = { &a->cq->fid };
	return fi_trywait(a->fabric, fids, 1);
}

/*
 * Debian's libfabric links its psm provider's libpsm_infinipath, whose libinfinipath
 * installs handlers for SIGSEGV, SIGBUS, SIGILL, SIGABRT, SIGINT and SIGTERM from a
 * constructor, before main: they print a backtrace and exit(1). A program's own SIGTERM
 * handler then ends in exit(1) (handler libraries chain to the one they found), and a
 * launcher's SIGTERM ends a rank with a status that says neither the signal nor the cause.
 * Each of those that is still libinfinipath's goes back to the default action. Returns how
 * many were reset. (`IPATH_NO_BACKTRACE=1` in the environment keeps them from being
 * installed at all.)
 */
int amofi_unhook_signals(void)
{
	static const int sigs[] = { SIGSEGV, SIGBUS, SIGILL, SIGABRT, SIGINT, SIGTERM };
	int reset = 0;
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
		struct sigaction old;
		if (sigaction(sigs[i], NULL, &old) != 0)
			continue;
		void *h = (old.sa_flags & SA_SIGINFO) ? (void *)old.sa_sigaction
						      : (void *)old.sa_handler;
		if (h == (void *)SIG_DFL || h == (void *)SIG_IGN)
			continue;
		Dl_info where;
		if (!dladdr(h, &where) || !where.dli_fname ||
		    !strstr(where.dli_fname, "libinfinipath"))
			continue;
		struct sigaction dfl;
		memset(&dfl, 0, sizeof(dfl));
		dfl.sa_handler = SIG_DFL;
		sigemptyset(&dfl.sa_mask);
		if (sigaction(sigs[i], &dfl, NULL) == 0)
			reset++;
	}
	return reset;
}
