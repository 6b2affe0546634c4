/*
 * torch_abi.c -- PyTorch's C++ ABI, reached from C: torch.OutOfMemoryError
 * and RuntimeError from gpupool_malloc, and the allocator methods PyTorch's
 * pluggable allocator gets wrong for gpupool (cacheInfo, peer access).
 *
 * PyTorch's CUDAPluggableAllocator does not check what the malloc hook
 * returns (measured with torch 2.11): a NULL becomes a tensor whose data
 * pointer is NULL, and the next kernel that touches it faults and poisons the
 * CUDA context.  PyTorch's own allocator throws c10::OutOfMemoryError, which
 * its Python bindings turn into torch.OutOfMemoryError.  We do the same from
 * C, through the C++ ABI that the process has loaded anyway (torch brings
 * libstdc++ and libc10): nothing is linked, every symbol is looked up in the
 * libraries already loaded, and if any is missing the caller gets NULL back
 * as before.
 *
 * The thrown object is built by c10::Error's exported constructor
 * Error(SourceLocation, std::string) and thrown with c10::Error's type_info
 * (PyTorch's bindings raise RuntimeError) or, for running out of memory,
 * c10::OutOfMemoryError's: that class adds no member to c10::Error, so the
 * object is caught as one (catch clauses match on type_info; virtual calls
 * go through Error's vtable, which serves both).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "torch_abi.h"

/* c10::SourceLocation, passed by value: {function, file, line}. */
typedef struct gp_srcloc {
    const char *function;
    const char *file;
    uint32_t line;
} gp_srcloc;

/* Large enough for c10::Error (about 150 bytes in torch 2.x): the size only
 * sets how much the exception allocation holds. */
#define GP_EXC_BYTES 1024

typedef void *(*cxa_alloc_fn)(size_t);
typedef void (*cxa_throw_fn)(void *, void *, void (*)(void *));
typedef void (*string_ctor_fn)(void *self, const char *s, const void *alloc);
typedef void (*string_dtor_fn)(void *self);
/* std::string is not trivially copyable: passed by value, it travels as a
 * pointer to the caller's copy, after `this` and before nothing else (the
 * 24-byte SourceLocation goes on the stack and takes no register). */
typedef void (*error_ctor_fn)(void *self, gp_srcloc loc, void *str);

static struct {
    cxa_alloc_fn alloc;
    cxa_throw_fn throw_exc;
    string_ctor_fn str_ctor;
    string_dtor_fn str_dtor;
    error_ctor_fn err_ctor;
    void *oom_typeinfo, *error_typeinfo;
} gp_cxx;

static pthread_once_t gp_cxx_once = PTHREAD_ONCE_INIT;

/* A symbol from any of the libraries torch loads (they are loaded locally,
 * so the global scope may not see them). */
static void *gp_cxx_sym(const char *name)
{
    static const char *libs[] = {"libc10.so", "libtorch_python.so", "libtorch_cpu.so",
                                 "libc10_cuda.so", "libtorch_cuda.so", "libstdc++.so.6", NULL};
    void *p = dlsym(RTLD_DEFAULT, name);
    for (int i = 0; !p && libs[i]; i++) {
        void *h = dlopen(libs[i], RTLD_NOW | RTLD_NOLOAD);
        if (h) {
            p = dlsym(h, name);
            dlclose(h); /* NOLOAD took a reference; the library stays loaded */
        }
    }
    return p;
}

static const char *gp_cxx_missing; /* the first symbol not found, if any */

static void *gp_cxx_need(const char *name)
{
    void *p = gp_cxx_sym(name);
    if (!p && !gp_cxx_missing) gp_cxx_missing = name;
    return p;
}

static void gp_cxx_init(void)
{
    gp_cxx.alloc = (cxa_alloc_fn)gp_cxx_need("__cxa_allocate_exception");
    gp_cxx.throw_exc = (cxa_throw_fn)gp_cxx_need("__cxa_throw");
    gp_cxx.str_ctor = (string_ctor_fn)gp_cxx_need("_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEC1EPKcRKS3_");
    gp_cxx.str_dtor = (string_dtor_fn)gp_cxx_need("_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEED1Ev");
    gp_cxx.err_ctor = (error_ctor_fn)gp_cxx_need(
        "_ZN3c105ErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE");
    gp_cxx.oom_typeinfo = gp_cxx_need("_ZTIN3c1016OutOfMemoryErrorE");
    gp_cxx.error_typeinfo = gp_cxx_need("_ZTIN3c105ErrorE");
}

const char *gp_torch_throw_missing(void)
{
    pthread_once(&gp_cxx_once, gp_cxx_init);
    return gp_cxx_missing;
}

void gp_torch_throw(int oom, const char *msg)
{
    if (gp_torch_throw_missing()) return;
    /* std::string of libstdc++'s new ABI: 32 bytes; room to spare. */
    _Alignas(16) unsigned char str[64];
    char alloc_tag = 0; /* std::allocator<char> is empty */
    gp_cxx.str_ctor(str, msg, &alloc_tag);
    void *exc = gp_cxx.alloc(GP_EXC_BYTES);
    memset(exc, 0, GP_EXC_BYTES);
    gp_srcloc loc = {"gpupool_malloc", __FILE__, (uint32_t)__LINE__};
    gp_cxx.err_ctor(exc, loc, str);
    gp_cxx.str_dtor(str);
    /* c10::Error's destructor is not exported, but every std::exception's
     * vtable begins with the complete-object destructor (Itanium C++ ABI:
     * ~exception is its first virtual function): take it from there. */
    void (*dtor)(void *) = (*(void (***)(void *))exc)[0];
    gp_cxx.throw_exc(exc, oom ? gp_cxx.oom_typeinfo : gp_cxx.error_typeinfo, dtor);
}

/*
 * Methods of CUDAPluggableAllocator answered by gpupool (torch_abi.h says
 * which and why: cacheInfo throws, enablePeerAccess and memcpyAsync do not
 * reach memory mapped with cuMemMap).  The methods are virtual and Python
 * cannot reach them, so we rewrite their entries in the class's vtable --
 * the exported symbol _ZTV... -- after finding each slot by value: the
 * entry equal to the address of PyTorch's own method.  No vtable layout is
 * assumed; if the entry is not among the first GP_VT_SCAN, nothing is
 * written.  The vtable lies in relocated read-only memory (RELRO): its page
 * is made writable for the one store, then given back the protection it
 * had.
 */
#define GP_VT_SCAN 256

static pthread_mutex_t gp_vt_lock = PTHREAD_MUTEX_INITIALIZER;

/* The protection of the mapping that holds `addr`, from /proc/self/maps, or
 * -1.  Restored after the store as it was: the last page of a RELRO region
 * may be shared with writable data, which PROT_READ would break. */
static int gp_page_prot(uintptr_t addr)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[512];
    int prot = -1;
    while (prot < 0 && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[5];
        if (sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) == 3 && addr >= lo && addr < hi)
            prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
                   (perms[2] == 'x' ? PROT_EXEC : 0);
    }
    fclose(f);
    return prot;
}

#define GP_PLUGGABLE "_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator"

/* Each method's symbol, in gp_torch_method's order. */
static const char *const gp_method_names[GP_TORCH_METHODS] = {
    GP_PLUGGABLE "9cacheInfoEaPm",
    GP_PLUGGABLE "16enablePeerAccessEaa",
    GP_PLUGGABLE "11memcpyAsyncEPviPKvimP11CUstream_stb",
};

void *gp_torch_own(gp_torch_method m)
{
    return (unsigned)m < GP_TORCH_METHODS ? gp_cxx_sym(gp_method_names[m]) : NULL;
}

const char *gp_torch_override(gp_torch_method m, void *fn)
{
    static const char vt_name[] = "_ZTVN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocatorE";
    static void *ours[GP_TORCH_METHODS]; /* the function in each entry now, if one of ours */
    if ((unsigned)m >= GP_TORCH_METHODS) return "no such method";
    void **vt = gp_cxx_sym(vt_name);
    void *theirs = gp_torch_own(m);
    if (!vt) return vt_name;
    if (!theirs) return gp_method_names[m];
    void *want = fn ? fn : theirs;
    const char *why = NULL;
    pthread_mutex_lock(&gp_vt_lock);
    /* Entries 0 and 1 are the offset to top and the type_info. */
    void **slot = NULL;
    for (int i = 2; i < GP_VT_SCAN && !slot; i++)
        if (vt[i] == theirs || (ours[m] && vt[i] == ours[m])) slot = &vt[i];
    if (!slot) {
        why = "the method is not in CUDAPluggableAllocator's vtable";
    } else if (*slot != want) {
        uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
        uintptr_t lo = (uintptr_t)slot & ~(page - 1);
        int prot = gp_page_prot((uintptr_t)slot);
        if (prot < 0) {
            why = "the vtable's page is not in /proc/self/maps";
        } else if (!(prot & PROT_WRITE) && mprotect((void *)lo, page, prot | PROT_WRITE) != 0) {
            why = "mprotect refused to make the vtable writable";
        } else {
            __atomic_store_n(slot, want, __ATOMIC_RELEASE);
            if (!(prot & PROT_WRITE)) mprotect((void *)lo, page, prot);
            ours[m] = fn;
        }
    }
    pthread_mutex_unlock(&gp_vt_lock);
    return why;
}
