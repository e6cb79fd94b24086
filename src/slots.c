/*
** slots.c - the native store of execution contexts: slot allocation, slot
** lifetime (release, the sweep, the per-cycle sentinel that makes
** finalizer tokens), and the ids.
**
** See ah.h for the model.  A slot is allocated when a thread first needs a
** context (the main thread at load time, a coroutine at create time, any
** other thread the first time it touches the library).  The slot's Lua
** values live in weak tables indexed by slot, kept alive by anchors keyed
** by the thread (anchors.c).  A slot is given back when its coroutine
** returns or is closed, by a finalizer token when destroy hooks need one,
** or else by a sweep when the free lists run dry: no per-coroutine
** finalizer in the common case.
**
** Near the bottom of the graph: it calls anchors.c, queue.c and base.c only.
*/
#include <string.h>

#include "slots.h"
#include "anchors.h"
#include "base.h"
#include "queue.h"

/* --------------------------------------------------------------------- */
/* slot allocation                                                        */

static void push_free(ah_state *st, int s) {
  if (s < AH_INLINE) {
    st->slots[s].next_free = st->free_low;
    st->free_low = s;
  } else {
    st->slots[s].next_free = st->free_high;
    st->free_high = s;
  }
}

/* A slot array twice as large, as a userdata anchored in AUX_SLOTS (the
** previous one becomes garbage).  Allocates (can raise, can run
** finalizers, which can free slots or shrink the array back: then nothing
** more is done).  Returns 0 only when no larger array can exist. */
static int grow(lua_State *L, ah_state *st) {
  int ocap = st->cap, ncap = ocap * 2, i;
  ah_slot *n;
  if (ncap <= ocap || (size_t)ncap > SIZE_MAX / sizeof(ah_slot)) return 0;
  /* AUX_PEND gets an entry for every new slot first (see ah_pend_set);
  ** raw sets run no finalizer */
  ah_auxt(L, AUX_PEND);
  for (i = ocap; i < ncap; i++) {
    lua_pushboolean(L, 0);
    lua_rawseti(L, -2, i);
  }
  lua_pop(L, 1);
  n = (ah_slot *)lua_newuserdatauv(L, sizeof(ah_slot) * (size_t)ncap, 0);
  if (st->cap != ocap) { /* a finalizer shrank it meanwhile: slots are free */
    lua_pop(L, 1);
    return 1;
  }
  memcpy(n, st->slots, sizeof(ah_slot) * (size_t)ocap);
  memset(n + ocap, 0, sizeof(ah_slot) * (size_t)(ncap - ocap));
  ah_anchor_slots(L); /* no allocation */
  st->slots = n;
  st->heap_stale = 0;
  for (i = ncap - 1; i >= ocap; i--) push_free(st, i);
  st->cap = ncap;
  return 1;
}

/* callers make sure a free slot exists */
static int alloc_slot(ah_state *st) {
  int s;
  if (st->free_low >= 0) {
    s = st->free_low;
    st->free_low = st->slots[s].next_free;
    st->used_low++;
  } else {
    s = st->free_high;
    st->free_high = st->slots[s].next_free;
    st->used_high++;
  }
  st->slots[s].L = NULL;
  return s;
}

/* back to the inline array once no heap slot is in use and load is low */
static void maybe_shrink(ah_state *st) {
  if (st->slots == st->inline_slots || st->used_high ||
      st->used_low > AH_INLINE / 2)
    return;
  memcpy(st->inline_slots, st->slots, sizeof(ah_slot) * AH_INLINE);
  st->slots = st->inline_slots;
  st->cap = AH_INLINE;
  st->free_high = -1;
  st->heap_stale = 1; /* its anchor is dropped by the next ah_release */
}

static void free_slot(ah_state *st, int s) {
  st->slots[s].L = NULL;
  push_free(st, s);
  if (s >= AH_INLINE)
    st->used_high--;
  else
    st->used_low--;
  maybe_shrink(st);
}

/* --------------------------------------------------------------------- */
/* slot lifetime                                                          */

/* re-arm the sentinel if work is pending and it is not armed (its own
** re-arming ran out of memory); allocates: for paths that may raise, before
** they change anything (ah_register, coroutine resumes with hooks) */
void ah_rearm(lua_State *L, ah_state *st) {
  if (ah_unlikely(st->npend && !st->armed)) ah_arm_anchors(L, st);
}

/* make sure a sentinel will run at the end of the next collection cycle
** (allocates, can run finalizers: callers arm before anything changes) */
void ah_arm_anchors(lua_State *L, ah_state *st) {
  if (st->armed) return;
  *(void **)lua_newuserdatauv(L, sizeof(void *), 0) = NULL; /* (AH_NULLOBJ) */
  ah_auxt(L, AUX_PEND_MT);
  lua_setmetatable(L, -2);
  lua_pop(L, 1);
  st->armed = 1;
}

/* finalizer token of a coroutine created while destroy hooks exist */
typedef struct ah_cotok {
  ah_state *st;
  int slot; /* -1 once the slot was given back */
} ah_cotok;

/* AUX_PEND[s] of a free slot can still hold its last owner's plain frame:
** harmless (it reaches no thread, see ah_frame_plain), and overwritten by
** the next owner's; not clearing it saves a write per coroutine */
static void clear(lua_State *L, ah_state *st, int s) {
  (void)st;
  lua_pushnil(L);
  lua_rawseti(L, AH_UV_F, s);
  st->fgen++;
  if (st->pend_frame == s) st->pend_frame = 0;
  lua_pushnil(L);
  lua_rawseti(L, AH_UV_R, s);
  lua_pushnil(L);
  lua_rawseti(L, AH_UV_TH, s);
}

/* The has_gc thread of slot s was collected (while suspended): queue its
** destroy, once, and give the slot back. */
static void thread_gone(lua_State *L, ah_state *st, int s) {
  if (st->last_slot == s) st->last_slot = 0;
  if (!st->slots[s].destroyed) {
    st->slots[s].destroyed = 1;
    if (ah_hooks_on(st, AH_DESTROY)) ah_queue_destroy(st, st->slots[s].base_id);
  }
  clear(L, st, s);
  free_slot(st, s);
}

/* the has_gc slot s no longer waits for its finalizer token (made, or not
** needed any more) */
static void tok_settled(ah_state *st, int s) {
  st->slots[s].anchored &= ~A_TOKPEND;
  st->npend--;
}

/* A finished thread keeps nothing of its context, as a dead coroutine
** keeps nothing of its stack: its keys in T and AUX_TR (which exist: nil
** allocates nothing) are dropped.  Inside a hook its resource stays, where
** executionAsyncResource() in that hook finds it (see ah_ov). */
static void drop_thread_anchors(lua_State *L, ah_state *st, int s) {
  unsigned char a = st->slots[s].anchored;
  int res = (a & AKEY_RES) && !st->dispatching;
  if (!(a & AKEY_FRAME) && !res) return;
  if (!lua_checkstack(L, 4)) return; /* (no memory: they go with the thread) */
  if (lua_rawgeti(L, AH_UV_TH, s) == LUA_TTHREAD) {
    if (a & AKEY_FRAME) {
      lua_pushvalue(L, -1);
      lua_pushnil(L);
      lua_rawset(L, AH_UV_T);
    }
    if (res) {
      ah_auxt(L, AUX_TR);
      lua_pushvalue(L, -2);
      lua_pushnil(L);
      lua_rawset(L, -3);
      lua_pop(L, 1);
    }
  }
  lua_pop(L, 1);
}

/* the finalizer token of slot s is still the one its thread's anchor
** (AUX_TGC[thread]) keeps alive: the debug library can take it away, and
** then it may be freed (its finalizer, if it runs, frees a slot: no
** memory) */
static int tok_kept(lua_State *L, ah_state *st, int s) {
  int top = lua_gettop(L), kept = 0;
  if (lua_checkstack(L, 3) && lua_type(L, AH_UVI_AUX) == LUA_TTABLE &&
      lua_type(L, AH_UVI_TH) == LUA_TTABLE &&
      lua_rawgeti(L, AH_UVI_AUX, AUX_TGC) == LUA_TTABLE &&
      lua_rawgeti(L, AH_UVI_TH, s) == LUA_TTHREAD) {
    lua_rawget(L, -2);
    kept = lua_touserdata(L, -1) == st->slots[s].gctok;
  }
  lua_settop(L, top);
  return kept;
}

/* The thread of slot s finished for good (returned, or was closed): its
** slot is free for reuse at once, and the thread is marked released. */
/* F[s] and TH[s] of a free slot are stale (weak values, overwritten by the
** next registration); R[s] of a free slot is always nil or false. */
void ah_release(lua_State *L, ah_state *st, int s) {
  ah_slot *sl = &st->slots[s];
  if (ah_unlikely(sl->kind == AH_KMAIN)) return;
  if (ah_unlikely(sl->has_gc)) {
    if (sl->gctok) {
      if (tok_kept(L, st, s)) ((ah_cotok *)sl->gctok)->slot = -1;
    } else if (sl->anchored & A_TOKPEND) { /* ended before it needed one */
      tok_settled(st, s);
    }
  }
  if (ah_likely(st->extra)) {
    ah_extra(sl->L) = AH_RELEASED;
  } else { /* TSLOT[thread] = false: the key exists, nothing allocates */
    ah_auxt(L, AUX_TSLOT);
    if (lua_rawgeti(L, AH_UV_TH, s) == LUA_TTHREAD) {
      lua_pushboolean(L, 0);
      lua_rawset(L, -3);
    } else { /* a thread that a finalizer resurrected: its weak TH entry
             ** is gone; its TSLOT entry names a slot that lookups check */
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  if (ah_unlikely(sl->anchored & (AKEY_FRAME | AKEY_RES))) drop_thread_anchors(L, st, s);
  if (sl->anchored & A_RES) {
    lua_pushnil(L);
    lua_rawseti(L, AH_UV_R, s);
  }
  free_slot(st, s);
  if (ah_unlikely(st->heap_stale)) { /* the array shrank back: let it go */
    lua_pushnil(L);
    ah_anchor_slots(L);
    st->heap_stale = 0;
  }
}

/* __gc of a coroutine token: the coroutine is gone. */
static int cotok_gc(lua_State *L) {
  /* (the metatable is reachable from Lua: only a token of this state) */
  ah_state *st = ah_st(L);
  ah_cotok *tok = (ah_cotok *)ah_testudata(L, 1, sizeof(ah_cotok), st);
  int s = tok ? tok->slot : -1;
  if (s < 0 || st->closed) return 0;
  tok->slot = -1;
  thread_gone(L, st, s);
  return 0;
}

/* Slots of threads that were collected without returning are found by this
** sweep, run when the free lists are empty: a slot whose TH entry was
** cleared by the collector is free.  Returns the number reclaimed. */
static int sweep(lua_State *L, ah_state *st) {
  int i, freed = 0;
  for (i = 0; i < st->cap; i++) {
    ah_slot *sl = &st->slots[i];
    if (!sl->L || sl->has_gc || sl->kind == AH_KMAIN) continue;
    if (lua_rawgeti(L, AH_UV_TH, i) == LUA_TNIL) {
      if (st->last_slot == i) st->last_slot = 0;
      clear(L, st, i);
      free_slot(st, i);
      freed++;
    }
    lua_pop(L, 1);
  }
  return freed;
}

int ah_register(lua_State *L, ah_state *st, int thread_idx, int frame_idx,
                lua_Integer trigger, int kind) {
  lua_State *co;
  ah_slot *sl;
  int s, framed, plain, has_gc = kind == AH_KCORO && ah_hooks_on(st, AH_DESTROY);
  if (thread_idx < 0) thread_idx = lua_absindex(L, thread_idx);
  if (frame_idx < 0) frame_idx = lua_absindex(L, frame_idx);
  co = lua_tothread(L, thread_idx);
  /* the finalizer token of a has_gc thread is made by the sentinel, only
  ** if the thread is still alive at the end of a collection cycle (most
  ** coroutines end before): see pend_gc */
  if (has_gc) /* first: the only step here that can run finalizers */
    ah_arm_anchors(L, st);
  else
    ah_rearm(L, st);
  if (!st->extra) ah_reserve_binding(L, st, thread_idx);
  if (ah_unlikely(st->free_low < 0 && st->free_high < 0) &&
      sweep(L, st) < st->cap / 4 && !grow(L, st) &&
      st->free_low < 0 && st->free_high < 0)
    luaL_error(L, "not enough memory for a context slot");
  /* the frame's anchor: a plain one in AUX_PEND, else a new key in T,
  ** first (can fail; it runs no finalizer) */
  framed = lua_topointer(L, frame_idx) != st->empty;
  plain = framed && kind != AH_KMAIN && ah_frame_plain(L, st, frame_idx);
  if (framed && !plain) ah_eph_set(L, st, AH_UV_T, thread_idx, frame_idx);
  s = ah_take_slot(L, st, co, trigger);
  sl = &st->slots[s];
  sl->gctok = NULL;
  sl->has_gc = (unsigned char)has_gc;
  if (has_gc) {
    sl->anchored |= A_TOKPEND;
    sl->pend_age = 0;
    st->npend++;
  }
  sl->kind = (unsigned char)kind;
  if (kind == AH_KMAIN) {
    sl->anchored = AKEY_FRAME | AKEY_RES; /* aux slots */
    sl->base_id = sl->id = 1;
    st->next_id--;
  }
  ah_bind_thread(L, st, s, thread_idx);
  /* raw sets never run finalizers: nothing can reuse s meanwhile.  Slot
  ** indices are dense from 1: F, R and TH keep them in their array part */
  lua_pushvalue(L, thread_idx);
  lua_rawseti(L, AH_UV_TH, s);
  if (plain) {
    ah_pend_set(L, s, frame_idx);
    sl->anchored |= A_FRAME | A_PEND;
  } else if (framed) {
    sl->anchored |= A_FRAME | AKEY_FRAME;
  }
  lua_pushvalue(L, frame_idx);
  lua_rawseti(L, AH_UV_F, s);
  st->fgen++;
  return s;
}

/* Take a free slot (one must exist) for thread co, a coroutine with a fresh
** asyncId; its TH and F entries are the caller's to write. */
int ah_take_slot(lua_State *L, ah_state *st, lua_State *co,
                 lua_Integer trigger) {
  int s;
  ah_slot *sl;
  if (ah_unlikely(st->free_low < 0 && st->free_high < 0)) /* never slot -1 */
    luaL_error(L, "async_hooks: no free context slot");
  s = alloc_slot(st);
  sl = &st->slots[s];
  sl->L = co;
  sl->gctok = NULL;
  sl->has_gc = 0;
  sl->kind = AH_KCORO;
  sl->destroyed = 0;
  sl->scopes = 0;
  sl->anchored = 0;
  sl->base_id = sl->id = st->next_id++;
  sl->base_trigger = sl->trigger = trigger;
  return s;
}

/* When the host owns the extra space: make the AUX_TSLOT key of the thread
** at thread_idx now (allocates; before anything changes), so that
** ah_bind_thread cannot fail. */
void ah_reserve_binding(lua_State *L, ah_state *st, int thread_idx) {
  (void)st;
  if (thread_idx < 0) thread_idx = lua_absindex(L, thread_idx);
  ah_auxt(L, AUX_TSLOT);
  lua_pushvalue(L, thread_idx);
  lua_pushboolean(L, 0);
  lua_rawset(L, -3);
  lua_pop(L, 1);
}

/* Record that the thread at thread_idx owns slot s: in its extra space, or
** (when the host owns that) in AUX_TSLOT, whose key for the thread the
** caller made beforehand (ah_register does), so that this cannot fail. */
void ah_bind_thread(lua_State *L, ah_state *st, int s, int thread_idx) {
  if (st->extra) {
    ah_extra(lua_tothread(L, thread_idx)) = (uintptr_t)s;
    return;
  }
  ah_bind_thread_table(L, s, thread_idx);
}

/* the AUX_TSLOT half of ah_bind_thread */
void ah_bind_thread_table(lua_State *L, int s, int thread_idx) {
  if (thread_idx < 0) thread_idx = lua_absindex(L, thread_idx);
  ah_auxt(L, AUX_TSLOT);
  lua_pushvalue(L, thread_idx);
  lua_pushinteger(L, s);
  lua_rawset(L, -3);
  lua_pop(L, 1);
}

/* slot of thread th (at thread_idx): > 0, or -1 when it finished and gave
** its slot back, or 0 when it never had one */
int ah_slot_find(lua_State *L, ah_state *st, lua_State *th, int thread_idx) {
  if (AH_EXTRA_FITS) {
    uintptr_t cs = ah_extra(th);
    if (cs < (uintptr_t)st->cap && st->slots[cs].L == th) return (int)cs;
    if (st->extra) return cs == AH_RELEASED ? -1 : 0;
  }
  if (thread_idx < 0) thread_idx = lua_absindex(L, thread_idx);
  ah_auxt(L, AUX_TSLOT);
  lua_pushvalue(L, thread_idx);
  switch (lua_rawget(L, -2)) {
    case LUA_TNUMBER: {
      lua_Integer s = lua_tointeger(L, -1);
      lua_pop(L, 2);
      return s > 0 && s < st->cap && st->slots[s].L == th ? (int)s : 0;
    }
    case LUA_TBOOLEAN: lua_pop(L, 2); return -1;
    default: lua_pop(L, 2); return 0;
  }
}

/* the finalizer token of the has_gc thread at thread_idx, slot s, which
** lived through AH_PEND_AGE collection cycles (one that ends before needs
** none; one collected before gets its destroy from the sentinel); allocates
** (a failure leaves it pending: the token is made at the next cycle) */
static void make_token(lua_State *L, ah_state *st, int s, int thread_idx) {
  ah_cotok *tok = (ah_cotok *)lua_newuserdatauv(L, sizeof(ah_cotok), 0);
  tok->st = st;
  tok->slot = -1; /* until it is the slot's */
  ah_auxt(L, AUX_COTOK_MT);
  lua_setmetatable(L, -2);
  ah_aux_eph_set(L, AUX_TGC, thread_idx, -1);
  tok->slot = s;
  st->slots[s].gctok = tok;
  tok_settled(st, s);
  lua_pop(L, 1);
}

/* __gc of the sentinel: give the has_gc coroutines that lived through
** AH_PEND_AGE cycles their finalizer tokens (that allocates: a failure
** leaves the rest pending for the next cycle), queue the destroys of the
** ones collected before, and re-arm */
static int pend_gc(lua_State *L) {
  ah_state *st = ah_st(L);
  int i, left;
  st->armed = 0;
  if (st->closed || st->npend == 0) return 0;
  ah_arm_anchors(L, st); /* first: a failure below leaves work for it (a
                         ** failure here, for the next ah_rearm) */
  /* TH at 1 (checked once: no Lua code runs in the loop, which only
  ** visits the npend pending slots) */
  lua_settop(L, 0);
  lua_pushvalue(L, AH_UV_TH);
  for (i = 1, left = st->npend; i < st->cap && left > 0; i++) {
    ah_slot *sl = &st->slots[i];
    if (!sl->L || !(sl->anchored & A_TOKPEND)) continue;
    left--;
    if (lua_rawgeti(L, 1, i) == LUA_TTHREAD) { /* 2: alive */
      /* young: most coroutines end before they need a token */
      if (++sl->pend_age >= AH_PEND_AGE) make_token(L, st, i, 2);
    } else { /* collected before its token was made */
      tok_settled(st, i);
      thread_gone(L, st, i);
    }
    lua_settop(L, 1);
  }
  return 0;
}

/* A thread that never got a slot: a coroutine created behind the library's
** back (before install(), or by C code).  It gets an empty frame and a
** fresh asyncId the first time it touches the library.  In debug mode,
** once a value was set anywhere (a frame was made), that is reported: it
** sees every value at its default. */
int ah_slot_slow(lua_State *L, ah_state *st) {
  int s, lost = 0;
  if (!st->extra) { /* the host owns the extra space: a one-entry cache */
    s = st->last_slot;
    /* slots[s].L can be a collected thread whose address L reuses (its
    ** slot waits for a sweep): TH[s] (weak) is that thread itself */
    if (s < st->cap && st->slots[s].L == L) {
      int same;
      lua_rawgeti(L, AH_UV_TH, s);
      lua_pushthread(L);
      same = lua_rawequal(L, -1, -2);
      lua_pop(L, 2);
      if (same) return s;
    }
  }
  lua_pushthread(L);
  if (!st->extra && (s = ah_slot_find(L, st, L, -1)) > 0) {
    lua_pop(L, 1);
    st->last_slot = s;
    return s;
  }
  lua_rawgeti(L, AH_UV_AUX, AUX_EMPTY);
  /* (not one that gave its slot back: it finished) */
  if (ah_unlikely(st->debug)) lost = st->lastf && ah_slot_find(L, st, L, -2) == 0;
  s = ah_register(L, st, -2, -1, 0, AH_KFOREIGN);
  lua_pop(L, 2);
  st->last_slot = s;
  if (ah_unlikely(lost)) ah_debug_report(L, AH_DEBUG_COROUTINE, 0);
  return s;
}

/* --------------------------------------------------------------------- */
/* ids                                                                     */

static int l_execution_id(lua_State *L) {
  ah_state *st = ah_st(L);
  lua_pushinteger(L, st->slots[ah_slot_of(L, st)].id);
  return 1;
}

static int l_trigger_id(lua_State *L) {
  ah_state *st = ah_st(L);
  lua_pushinteger(L, st->slots[ah_slot_of(L, st)].trigger);
  return 1;
}

static int l_execution_resource(lua_State *L) {
  ah_state *st = ah_st(L);
  st->res_on = st->watched = 1;
  ah_push_resource(L, st, ah_slot_of(L, st));
  return 1;
}

static const luaL_Reg slot_funcs[] = {
  {"executionAsyncId", l_execution_id},
  {"triggerAsyncId", l_trigger_id},
  {"executionAsyncResource", l_execution_resource},
  {NULL, NULL}
};

/* --------------------------------------------------------------------- */
/* open                                                                    */

/* The manual reserves LUA_EXTRASPACE for the host.  Its bytes cannot tell
** whether a host uses them: Lua leaves the main thread's uninitialized, so
** reading them would decide at random (and is undefined).  Ownership is
** declared instead: a host that stores its own data there sets the
** registry field AH_HOST_EXTRA (to any value but nil and false) before the
** module loads; the module then never writes it and finds every thread's
** slot in AUX_TSLOT.  Otherwise the module owns the extra space of the
** threads it tracks. */
#define AH_HOST_EXTRA "async_hooks.host_extraspace"
static int host_owns_extra(lua_State *L) {
  int owned = lua_getfield(L, LUA_REGISTRYINDEX, AH_HOST_EXTRA) != LUA_TNIL &&
              lua_toboolean(L, -1);
  lua_pop(L, 1);
  return owned;
}

/* the slot array (inline), the metatables, the id functions; the main
** thread is registered by ah_register_main once frames exist */
void ah_open_slots(lua_State *L) {
  ah_state *st = ah_st(L);
  int i;
  st->slots = st->inline_slots;
  st->cap = AH_INLINE;
  st->free_low = st->free_high = -1;
  /* slot 0 is never handed out: a thread whose extra space is still zero
  ** has no slot, and F/R/TH keep every slot in their array part */
  for (i = AH_INLINE - 1; i >= 1; i--) push_free(st, i);
  st->next_id = 2;
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  st->mainL = lua_tothread(L, -1);
  lua_pop(L, 1);
  st->extra = AH_EXTRA_FITS && !host_owns_extra(L);

  ah_new_metatable(L, "async_hooks.cotoken", "__gc", cotok_gc, AUX_COTOK_MT);
  ah_new_metatable(L, "async_hooks.anchors", "__gc", pend_gc, AUX_PEND_MT);
  ah_weak_table(L, "k", 0);
  lua_rawseti(L, AH_UV_AUX, AUX_TSLOT);
  ah_add_funcs(L, slot_funcs);
}

void ah_register_main(lua_State *L) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  lua_rawgeti(L, AH_UV_AUX, AUX_EMPTY);
  ah_register(L, ah_st(L), -2, -1, 0, AH_KMAIN);
  lua_pop(L, 2);
}
