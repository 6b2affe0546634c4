/*
 * torch_oom.h -- throw c10::OutOfMemoryError (torch.OutOfMemoryError in
 * Python) from C, for gpupool_malloc.  See torch_oom.c.
 */
#ifndef GP_TORCH_OOM_H
#define GP_TORCH_OOM_H

/* NULL when every C++ symbol the throw needs is loaded in the process, else
 * the name of the first one missing (looked up once, on the first call). */
const char *gp_torch_oom_missing(void);

/* Throw a c10::OutOfMemoryError carrying `msg` through the caller's frames
 * (they must hold no lock and own nothing).  Returns only when the symbols
 * are not there (no torch in the process): the caller then returns NULL. */
void gp_torch_throw_oom(const char *msg);

#endif
