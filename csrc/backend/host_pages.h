/*
 * host_pages.h -- faulting in the pages of host memory ahead of pinning it,
 * the part of backend.h's host_populate that every backend shares.
 */
#ifndef GP_HOST_PAGES_H
#define GP_HOST_PAGES_H

#include <stdint.h>

#include "error.h"

/* Fault in [ptr, ptr+size) (page-aligned, anonymous, writable) on the
 * calling thread.  GP_ERR_NOMEM, naming the range and the host's reason,
 * when the host has no memory for it. */
gp_status gp_host_pages_populate(void *ptr, uint64_t size);

#endif /* GP_HOST_PAGES_H */
