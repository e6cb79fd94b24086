/*
** ah.h - the floor of the C core: the per-state types and constants
** every unit shares.  Types only: nothing here calls a function.
**
** Every Lua thread that runs library-aware code owns a *context slot*: an
** entry of a per-state native array (inline for the first AH_INLINE threads,
** grown on the heap beyond that and shrunk back when the load drops) that
** holds the thread's current execution context: asyncId and triggerAsyncId
** in C, and the frame and resource in two weak-valued Lua tables indexed by
** slot.  The slot index lives in the thread's LUA_EXTRASPACE (unless the
** host uses it: then in a weak-keyed table, see ah_bind_thread), so finding
** the current context is O(1) and a coroutine switch needs no bookkeeping at
** all: the running thread *is* the context.
*/
#ifndef AH_AH_H
#define AH_AH_H

#include <stddef.h>
#include <stdint.h>

#include "compat.h"

#define AH_INLINE 64

/* hook kinds, also the index of their function list */
enum { AH_INIT = 1, AH_BEFORE, AH_AFTER, AH_DESTROY, AH_NKINDS = AH_DESTROY };

/* slot kinds */
enum { AH_KMAIN = 0, AH_KCORO, AH_KFOREIGN };

/* Upvalues of every core function.  Upvalue 1 is the function's own: nil,
** or the coroutine of a coroutine.wrap function (lcorolib's wrap keeps it
** there too).  Then the shared ones.  The debug library can replace any of
** them, and Lua code can change the tables: every use checks what it
** finds (a table where a table is used, the state by identity), so that a
** wrong value raises an error instead of crashing (see AH_UVT, ah_st). */
#define AH_UV_OWN lua_upvalueindex(1)
#define AH_UV_STATE lua_upvalueindex(2) /* the ah_state userdata */
#define AH_UVI_F lua_upvalueindex(3)   /* slot -> current frame (weak values) */
#define AH_UVI_R lua_upvalueindex(4)   /* slot -> current resource (weak values) */
#define AH_UVI_T lua_upvalueindex(5)   /* thread -> frame anchor (weak keys) */
#define AH_UVI_AUX lua_upvalueindex(6) /* strong table of internals */
#define AH_UVI_TH lua_upvalueindex(7)  /* slot -> thread (weak values) */
#define AH_NUP 7
/* the AH_UV_* tables named by these bits are tables (else 0) */
enum { AH_TF = 1, AH_TR = 2, AH_TT = 4, AH_TAUX = 8, AH_TTH = 16, AH_TALL = 31 };

/* integer keys of the aux table */
enum {
  AUX_EMPTY = 1, /* the empty frame */
  AUX_FRAME_MT,  /* metatable of frames */
  AUX_TOP,       /* executionAsyncResource() at top level */
  AUX_COTOK_MT,  /* metatable of coroutine finalizer tokens (ah_cotok) */
  AUX_GUARD_MT,  /* metatable of scope guards */
  AUX_GCTOK_MT,  /* metatable of GC destroy tokens */
  AUX_ORDER,     /* enabled hooks, in enable order */
  AUX_LISTS,     /* {init fns, before fns, after fns, destroy fns} */
  AUX_TR,        /* thread -> resource (weak keys) */
  AUX_TG,        /* thread -> innermost open scope guard (weak keys) */
  AUX_TGC,       /* thread -> finalizer token (weak keys) */
  AUX_MAINFRAME, /* anchor of the main thread's frame */
  AUX_MAINRES,   /* anchor of the main thread's resource */
  AUX_PERSIST,   /* table kept for the Lua front end across re-requires */
  AUX_ONDESTROY, /* on_destroy_hooks' callback, or nil */
  AUX_STATE,     /* the ah_state userdata (also every core function's
                 ** AH_UV_STATE) */
  AUX_NEXT,      /* hook lists prepared by enable/disable (see hooks.c) */
  AUX_TCORO,     /* the string "coroutine" (init's type, not re-interned) */
  AUX_KTHREAD,   /* the string "thread" (a thread's resource's key) */
  AUX_PEND_MT,   /* metatable of the per-cycle token sentinel */
  AUX_PEND,      /* slot -> plain frame, or false: see ah_frame_plain */
  AUX_FRAME_PMT, /* metatable of plain frames (see frames.c) */
  AUX_TSLOT,     /* thread -> slot, or false once released (weak keys):
                 ** the lookup used when the host owns LUA_EXTRASPACE */
  AUX_SLOTS,     /* the slot array once grown beyond the inline one: a
                 ** userdata, so that its memory outlives every finalizer
                 ** that lua_close runs (luv's loop finalizer runs
                 ** callbacks after this state's) */
  AUX_LIBDIR,    /* the folder of the library's Lua files ("@.../"), or
                 ** nil: errors are positioned past their frames (ah_where) */
  AUX_INTERNAL_MT, /* metatable of the internal userdata (see AH_NULLOBJ) */
  AUX_DESTROYED, /* resource -> true once its emitDestroy ran (weak keys) */
  AUX_HOOK1,     /* per kind (AUX_HOOK1 + kind - 1): the only hook of the
                 ** kind in use, or false (see hooks.c) */
  AUX_N = AUX_HOOK1 + AH_NKINDS

};

typedef struct ah_slot {
  lua_State *L;        /* owning thread; NULL when free */
  lua_Integer id;      /* current executionAsyncId */
  lua_Integer trigger; /* current triggerAsyncId */
  lua_Integer base_id; /* the thread's own asyncId (coroutine resource) */
  lua_Integer base_trigger;
  void *gctok;          /* finalizer token (has_gc), valid while L lives;
                        ** NULL until the sentinel made it (A_TOKPEND) */
  int next_free;
  unsigned scopes;      /* open scope guards (coroutines: the guard chain) */
  unsigned char kind;
  unsigned char destroyed; /* destroy already queued or delivered */
  unsigned char has_gc;    /* a finalizer token frees the slot */
  unsigned char anchored;  /* A_FRAME: frame not empty; A_RES: resource set */
  unsigned char pend_age;  /* A_TOKPEND: collection cycles its thread
                           ** lived through without a token */
} ah_slot;
/* a has_gc thread gets its finalizer token once it lived through this many
** collection cycles (see slots.c's pend_gc) */
#define AH_PEND_AGE 4

/* A coroutine's before/after is emitted from its resumer (coro.c) with
** the resumer's ids switched to the coroutine's and its resource reported
** in place of the resumer's: while slot `slot` (> 0) runs the hook,
** executionAsyncResource() is the resource of slot `res`, which belongs to
** `co` with asyncId `id` (else the coroutine was closed meanwhile).  No
** table is written.  Whatever switches slot `slot` to another context
** inside the hook (a scope, a luv callback, a scope slice) suspends it. */
typedef struct ah_ov {
  int slot, res;
  lua_State *co;
  lua_Integer id;
} ah_ov;

typedef struct ah_state {
  const void *self;          /* this very struct: what ah_st checks */
  lua_State *mainL;
  lua_Integer next_id;
  ah_slot *slots;
  int cap;       /* capacity of the slot array (AH_INLINE when inline) */
  int free_low;  /* free list of slots < AH_INLINE */
  int free_high; /* free list of slots >= AH_INLINE */
  int used_low;  /* slots < AH_INLINE in use */
  int used_high; /* slots >= AH_INLINE in use */
  int nhooks[AH_NKINDS + 1]; /* enabled hook functions per kind */
  int dispatching;           /* depth of hook dispatch */
  int reraised;              /* an error kept for an enclosing dispatch */
  int dirty;                 /* hook set changed during dispatch */
  int next_n[AH_NKINDS + 1]; /* sizes of the prepared lists (AUX_NEXT) */
  int init_res;              /* init hooks that can see their 4th argument
                             ** (the resource: made for init only then) */
  int next_init_res;         /* the same, of the prepared lists */
  int notify_pending;        /* on_destroy_hooks' callback must hear of
                             ** destroy hooks */
  int active;                /* resumes + callbacks + main-thread scopes */
  int res_on;                /* executionAsyncResource() was called */
  int watched;               /* a hook is enabled or res_on: every
                             ** registration is observable (luv/) */
  unsigned fgen;             /* counts writes of F[s], any slot s */
  unsigned rgen;             /* counts writes of resource anchors (AUX_TR) */
  ah_ov ov;                  /* a coroutine's event being emitted (slot 0:
                             ** none) */
  int closed;                /* state finalized (lua_close) */
  int heap_stale;            /* the slots are inline again: AUX_SLOTS can go */
  int extra;                 /* LUA_EXTRASPACE is ours (the host's was zero) */
  int npend;                 /* A_TOKPEND flags set, over all slots */
  int armed;                 /* a sentinel will move them at the next cycle */
  int last_slot;             /* !extra: slot of the thread last looked up */
  const void *empty;         /* the empty frame */
  const void *plain_mt;      /* the metatable of plain frames */
  const void *lastf;         /* the frame push_frame_with made last ... */
  int lastn;                 /* ... and its number of entries (frames.c) */
  int lastplain;             /* ... and whether it is plain (anchors.c) */
  lua_Integer *dq;           /* queued destroy ids */
  size_t dq_n, dq_cap;
  /* A layer above the core that runs callbacks (luv/) may keep a
  ** resource it makes only when asked for: R[s] of a thread running one of
  ** its callbacks holds a marker instead (type t: a function or userdata,
  ** or no resource at all).  lazy_resource(L, st, s, t) replaces the
  ** value on top (R[s], of type t) by that resource and returns 1, or by
  ** false and returns 0; anchors.c calls it without knowing the layer
  ** (NULL: none). */
  int (*lazy_resource)(lua_State *L, struct ah_state *st, int s, int t);
  /* The same layer may leave F[s] of the thread running one of its
  ** callbacks unwritten at the callback's entry: pend_frame is then that
  ** slot (0: none), and the callback's frame (at address pend_ptr) is the
  ** value at index pend_idx of that layer's frame on the thread's stack
  ** (the activation record lua_getstack gave for it, pend_ci).
  ** Every reader of F[s] calls sync_frame first (ah_frame_sync), which
  ** writes it into F[s] and clears the note; every writer clears it. */
  int pend_frame, pend_idx;
  const void *pend_ptr;
  void *pend_ci; /* that layer's frame (lua_Debug's i_ci), or NULL */
  void (*sync_frame)(lua_State *L, struct ah_state *st);
  /* pushes the own resource of the coroutine at thread_idx while scopes are
  ** open in it (set by ah_open_scope; anchors.c calls it without knowing
  ** scope.c); 0 if none is open */
  int (*own_resource)(lua_State *L, int thread_idx);
  /* the diagnostic of silent context loss is on (install{debug}): the
  ** paths it watches test this flag alone (see base.c's ah_debug_report) */
  int debug;
  ah_slot inline_slots[AH_INLINE];
} ah_state;

/* slot->anchored bits: the frame is not the empty one (and is anchored in
** T), the resource is not nil (and is anchored in AUX_TR); AKEY_*: the
** thread's key exists in T / AUX_TR, so writing it cannot allocate */
enum { A_FRAME = 1, A_RES = 2, AKEY_FRAME = 4, AKEY_RES = 8,
       A_TOKPEND = 16, /* has_gc, its finalizer token not made yet */
       A_PEND = 32 };  /* the frame is anchored in AUX_PEND[s], not T */


#define AH_RELEASED UINTPTR_MAX /* extra space of a thread that gave its slot back */

#define ah_hooks_on(st, k) ((st)->nhooks[k] != 0)

/* AH_NULLOBJ: every value the library hands to Lua that a C library could
** take for its own userdata is safe for a C library to look into: luv, for
** one, takes any userdata for a handle if its first pointer is not null
** and the pointer there not either, then looks up its metatable (and
** crashes on a userdata without one).  So each light userdata of the
** library points to a null pointer, each full userdata has a metatable
** (AUX_INTERNAL_MT for those with none of their own) and starts with a
** null pointer or one to readable memory. */

#endif

