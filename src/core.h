/*
** core.h - shared state of the async_hooks C core.
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
#ifndef AH_CORE_H
#define AH_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "compat.h"

#define AH_INLINE 64
#define AH_CB_INLINE 32

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
/* the same, checked to be a table at each use (a raw access to anything
** else is undefined behaviour); the AH_UVI_* indices unchecked, for code
** that checked them itself (ah_check_tables) */
#define AH_UV_F AH_UVT(L, AH_UVI_F)
#define AH_UV_R AH_UVT(L, AH_UVI_R)
#define AH_UV_T AH_UVT(L, AH_UVI_T)
#define AH_UV_AUX AH_UVT(L, AH_UVI_AUX)
#define AH_UV_TH AH_UVT(L, AH_UVI_TH)
#define AH_UVT(L, idx) \
  (ah_likely(lua_type((L), (idx)) == LUA_TTABLE) ? (idx) : ah_damaged((L), (idx)))
/* the AH_UV_* tables named by these bits are tables (else 0) */
enum { AH_TF = 1, AH_TR = 2, AH_TT = 4, AH_TAUX = 8, AH_TTH = 16, AH_TALL = 31 };
int ah_tables_ok(lua_State *L, int which);

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
  AUX_LUV,       /* luv integration state */
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
  int luv_pending;           /* the luv integration must hear of destroy hooks */
  int active;                /* resumes + callbacks + main-thread scopes */
  int res_on;                /* executionAsyncResource() was called */
  int watched;               /* a hook is enabled or res_on: every luv
                             ** registration is observable (luv.c) */
  unsigned fgen;             /* counts writes of F[s], any slot s */
  unsigned rgen;             /* counts writes of resource anchors (AUX_TR) */
  ah_ov ov;                  /* a coroutine's event being emitted (slot 0:
                             ** none) */
  int handles;               /* tracked luv handle registrations (upper bound) */
  lua_Integer fast_callbacks; /* luv callbacks that took the no-Lua path */
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
  lua_Integer *cb;           /* native stack of entered luv trampolines */
  size_t cb_n, cb_cap;
  lua_Integer cb_inline[AH_CB_INLINE];
  /* makes the resource of the luv callback running in slot s on demand
  ** (set by ah_open_luv; slots.c calls it without knowing luv.c) */
  int (*lazy_resource)(lua_State *L, struct ah_state *st, int s);
  /* pushes the own resource of the coroutine at thread_idx while scopes are
  ** open in it (set by ah_open_scope; slots.c calls it without knowing
  ** scope.c); 0 if none is open */
  int (*own_resource)(lua_State *L, int thread_idx);
  struct ah_luv *lv;          /* the luv integration's state (luv.c), or NULL */
  ah_slot inline_slots[AH_INLINE];
} ah_state;

/* The state of the running core function, from its AH_UV_STATE: a
** userdata whose block is the state of this Lua state (or anything else,
** if the debug library put it there).  The state that was checked last is
** remembered (ah_known), so that checking it costs a comparison: a value
** whose block is at that address is that very userdata (two live objects
** cannot share an address, and Lua code cannot make a light userdata of an
** address the library never handed out as one; ah_known is never NULL:
** see base.c).  Its self pointer is read all the same: a state whose
** finalizer the debug library took away is freed without forgetting it.
** Anything else is checked in full by ah_st_check (its size, its self
** pointer); raises if it is not a state. */
extern ah_state *ah_known;
ah_state *ah_st_check(lua_State *L, int raise);
static inline ah_state *ah_st(lua_State *L) {
  ah_state *st = (ah_state *)lua_touserdata(L, AH_UV_STATE);
  if (ah_likely(st == ah_load_ptr(ah_known) && st->self == st)) return st;
  return ah_st_check(L, 1);
}
/* the same without raising: NULL when AH_UV_STATE is not a state */
static inline ah_state *ah_st_try(lua_State *L) {
  ah_state *st = (ah_state *)lua_touserdata(L, AH_UV_STATE);
  if (ah_likely(st == ah_load_ptr(ah_known) && st->self == st)) return st;
  return ah_st_check(L, 0);
}

/* slot->anchored bits: the frame is not the empty one (and is anchored in
** T), the resource is not nil (and is anchored in AUX_TR); AKEY_*: the
** thread's key exists in T / AUX_TR, so writing it cannot allocate */
enum { A_FRAME = 1, A_RES = 2, AKEY_FRAME = 4, AKEY_RES = 8,
       A_TOKPEND = 16, /* has_gc, its finalizer token not made yet */
       A_PEND = 32 };  /* the frame is anchored in AUX_PEND[s], not T */

/* Files, bottom up; each calls only files listed before it (checked
** by `make callgraph`, tests/callgraph.sh):
**   base.c    helpers (shared upvalues, tables, callable, destroy queue)
**   slots.c   the slot store: allocation, anchors, lifetime, ids
**   frames.c  frames, AsyncLocal
**   hooks.c   hook set, dispatch, destroy delivery
**   scope.c   scope guards
**   coro.c    coroutine trampoline
**   luv.c     luv trampoline, cb_pcall
**   core.c    the module entry (luaopen_async_hooks_core)
** Every file but base.c has one ah_open_<file>(L), called by core.c inside
** its build closure (AH_UV_* valid) with the module table on top: it makes
** its aux entries and metatables and adds its functions to the module. */

/* AH_NULLOBJ: every value the library hands to Lua that a C library could
** take for its own userdata is safe for a C library to look into: luv, for
** one, takes any userdata for a handle if its first pointer is not null
** and the pointer there not either, then looks up its metatable (and
** crashes on a userdata without one).  So each light userdata of the
** library points to a null pointer, each full userdata has a metatable
** (AUX_INTERNAL_MT for those with none of their own) and starts with a
** null pointer or one to readable memory. */

/* base.c */
int ah_damaged(lua_State *L, int idx);
int ah_auxt(lua_State *L, int key);
void *ah_testudata(lua_State *L, int idx, size_t size, const void *tag);
void *ah_testself(lua_State *L, int idx, size_t size);
void ah_internal_mt(lua_State *L, int idx);
void ah_anchor_slots(lua_State *L);
void ah_push_shared(lua_State *L);
void ah_add_funcs(lua_State *L, const luaL_Reg *l);
void ah_new_metatable(lua_State *L, const char *name, const char *event,
                      lua_CFunction fn, int aux_key);
void ah_weak_table(lua_State *L, const char *mode, int narr);
int ah_callable(lua_State *L, int idx);
void ah_queue_destroy(ah_state *st, lua_Integer id);
void ah_where(lua_State *L, int level);

/* slots.c */
#define AH_RELEASED UINTPTR_MAX /* extra space of a thread that gave its slot back */
int ah_slot_slow(lua_State *L, ah_state *st);
/* The slot of the running thread.  Reading the extra space is safe even
** when the host owns it (st->extra == 0): a value passes only if slot s
** names this very thread, and then s is its slot. */
static inline int ah_slot_of(lua_State *L, ah_state *st) {
  if (AH_EXTRA_FITS) {
    uintptr_t s = ah_extra(L);
    if (s < (uintptr_t)st->cap && st->slots[s].L == L) return (int)s;
  }
  return ah_slot_slow(L, st);
}
int ah_slot_find(lua_State *L, ah_state *st, lua_State *th, int thread_idx);
void ah_bind_thread(lua_State *L, ah_state *st, int s, int thread_idx);
void ah_bind_thread_table(lua_State *L, int s, int thread_idx);
void ah_reserve_binding(lua_State *L, ah_state *st, int thread_idx);
int ah_register(lua_State *L, ah_state *st, int thread_idx, int frame_idx,
                lua_Integer trigger, int kind);
int ah_take_slot(lua_State *L, ah_state *st, lua_State *co,
                 lua_Integer trigger);
void ah_arm_anchors(lua_State *L, ah_state *st);
void ah_rearm(lua_State *L, ah_state *st);
void ah_release(lua_State *L, ah_state *st, int s);
void ah_set_frame(lua_State *L, int s, int idx);
void ah_set_frame_full(lua_State *L, ah_state *st, int s, int idx);
void ah_set_resource(lua_State *L, int s, int idx);
/* "no resource": nil, or the false that R[s] holds for it */
static inline int ah_no_resource(lua_State *L, int idx) {
  return lua_isnil(L, idx) || (lua_isboolean(L, idx) && !lua_toboolean(L, idx));
}
/* anchors.c: the anchors' primitives slots.c uses */
void ah_eph_set(lua_State *L, ah_state *st, int eph, int thread_idx, int idx);
int ah_frame_plain(lua_State *L, ah_state *st, int idx);
void ah_pend_set(lua_State *L, int s, int idx);
void ah_aux_eph_set(lua_State *L, int key, int thread_idx, int idx);
void ah_new_thread_resource(lua_State *L, int thread_idx);
void ah_push_resource(lua_State *L, ah_state *st, int s);
void ah_push_resource_of(lua_State *L, ah_state *st, int s, int thread_idx);
void ah_reserve(lua_State *L, int s);
void ah_reserve_res(lua_State *L, int s);
void ah_get_guard(lua_State *L, int thread_idx);
void ah_set_guard(lua_State *L, int idx);
void ah_open_slots(lua_State *L);

/* frames.c */
void ah_open_frames(lua_State *L);

/* hooks.c.  The emit functions return 0, or 1 with an error pushed: an
** error of the dispatch that is not a hook's own (a stack overflow, out of
** memory, an error raised by a debug hook; a hook's own error ends the
** process).  The event reached every hook all the same; the caller
** finishes what it was doing and then raises it (ah_raise), or hands it
** on as its operation reports errors. */
int ah_emit_id(lua_State *L, ah_state *st, int kind, lua_Integer id);
int ah_emit_init_v(lua_State *L, ah_state *st, lua_Integer id, int type_idx,
                   lua_Integer trigger, int res_idx);
int ah_emit_id_reserved(lua_State *L, ah_state *st, int kind, lua_Integer id);
int ah_emit_init(lua_State *L, ah_state *st, lua_Integer id, const char *type,
                 lua_Integer trigger, int res_idx);
int ah_raise(lua_State *L);
int ah_reraised(lua_State *L, ah_state *st, int idx);
int ah_cstack_error(lua_State *L, int idx);
int ah_flush_status(lua_State *L, ah_state *st);
/* keep the first of two errors (first, err: 1 when each was pushed, the
** first below): returns 1 when one is left on top */
static inline int ah_keep_first(lua_State *L, int first, int err) {
  if (first && err) lua_pop(L, 1);
  return first || err;
}
void ah_flush(lua_State *L, ah_state *st);
void ah_luv_notify(lua_State *L, ah_state *st);
/* at the end of an outermost callback, resume or scope: deliver queued
** destroys (and tell luv about destroy hooks); Lua code, can raise */
#define ah_flush_due(st) \
  (((st)->dq_n || (st)->luv_pending) && !(st)->active && !(st)->dispatching)
#define ah_flush_maybe(L, st) \
  do { \
    if (ah_flush_due(st)) ah_flush((L), (st)); \
  } while (0)
#define ah_hooks_on(st, k) ((st)->nhooks[k] != 0)
void ah_open_hooks(lua_State *L);

/* scope.c */
int ah_emit_as(lua_State *L, ah_state *st, int kind, lua_Integer id,
               lua_Integer trigger, int res_idx);
int ah_scopes_slice(lua_State *L, ah_state *st, int kind, int co_idx);
void ah_open_scope(lua_State *L);

/* coro.c */
void ah_open_coro(lua_State *L);

/* luv.c, luv_dispatch.c */
int ah_luv_resource(lua_State *L, ah_state *st, int s);
void ah_luv_forget(ah_state *st);
void ah_open_luv(lua_State *L);

#endif
