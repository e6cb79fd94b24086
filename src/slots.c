/*
** slots.c - the native store of execution contexts: slot allocation,
** thread anchors, slot lifetime, and the ids.
**
** See core.h for the model.  A slot is allocated when a thread first needs a
** context (the main thread at load time, a coroutine at create time, any
** other thread the first time it touches the library).  The slot's Lua
** values live in weak tables indexed by slot, kept alive by ephemeron
** entries keyed by the thread (see "thread anchors" below).  A slot is
** given back when its coroutine returns or is closed, by a finalizer token
** when destroy hooks need one, or else by a sweep when the free lists run
** dry: no per-coroutine finalizer in the common case.
**
** The bottom of the file graph but for base.c: it calls nothing above it.
** A luv callback's lazily made resource is asked of st->lazy_resource, set
** by ah_open_luv (see ah_push_resource_of).
*/
#include <stdlib.h>
#include <string.h>

#include "core.h"
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

static int grow(ah_state *st) {
  int ncap = st->cap * 2, i;
  ah_slot *n;
  if (ncap <= st->cap || (size_t)ncap > SIZE_MAX / sizeof(ah_slot)) return 0;
  if (st->slots == st->inline_slots) {
    n = malloc(sizeof(ah_slot) * (size_t)ncap);
    if (n) memcpy(n, st->inline_slots, sizeof(ah_slot) * AH_INLINE);
  } else {
    n = realloc(st->slots, sizeof(ah_slot) * (size_t)ncap);
  }
  if (!n) return 0;
  memset(n + st->cap, 0, sizeof(ah_slot) * (size_t)(ncap - st->cap));
  st->slots = n;
  for (i = ncap - 1; i >= st->cap; i--) push_free(st, i);
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
  free(st->slots);
  st->slots = st->inline_slots;
  st->cap = AH_INLINE;
  st->free_high = -1;
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
/* thread anchors                                                         */

/* A slot's Lua values live in weak tables indexed by slot (F frames, R
** resources, TH the thread itself), so nothing there keeps a thread
** alive.  What keeps them alive as long as their thread is an ephemeron
** entry keyed by the thread: T[thread] = frame, AUX_TR[thread] = resource,
** AUX_TG[thread] = innermost open scope guard.  A frame that refers to its
** own coroutine therefore does not leak.  The empty frame needs no anchor,
** so a coroutine created where no value is set costs no hash insertion. */

/* eph[thread] = value at idx (nil removes); thread_idx 0: the running one.
** The main thread never dies: its anchors are plain aux slots (no hashing). */
static void eph_set(lua_State *L, ah_state *st, int eph, int thread_idx,
                    int idx) {
  lua_State *th = thread_idx ? lua_tothread(L, thread_idx) : L;
  if (th == st->mainL) {
    lua_pushvalue(L, idx);
    lua_rawseti(L, AH_UV_AUX, eph == AH_UV_T ? AUX_MAINFRAME : AUX_MAINRES);
    return;
  }
  if (thread_idx)
    lua_pushvalue(L, thread_idx);
  else
    lua_pushthread(L);
  lua_pushvalue(L, idx);
  lua_rawset(L, eph);
}

static void aux_eph_set(lua_State *L, int key, int thread_idx, int idx) {
  if (thread_idx) thread_idx = lua_absindex(L, thread_idx);
  idx = lua_absindex(L, idx);
  if (key == AUX_TR) { /* resources: see eph_set */
    lua_State *th = thread_idx ? lua_tothread(L, thread_idx) : L;
    if (th == ah_st(L)->mainL) {
      lua_pushvalue(L, idx);
      lua_rawseti(L, AH_UV_AUX, AUX_MAINRES);
      return;
    }
  }
  lua_rawgeti(L, AH_UV_AUX, key);
  if (thread_idx)
    lua_pushvalue(L, thread_idx);
  else
    lua_pushthread(L);
  lua_pushvalue(L, idx);
  lua_rawset(L, -3);
  lua_pop(L, 1);
}

/* push the guard chain head of a thread (thread_idx 0: the running one) */
void ah_get_guard(lua_State *L, int thread_idx) {
  if (thread_idx) thread_idx = lua_absindex(L, thread_idx);
  lua_rawgeti(L, AH_UV_AUX, AUX_TG);
  if (thread_idx)
    lua_pushvalue(L, thread_idx);
  else
    lua_pushthread(L);
  lua_rawget(L, -2);
  lua_remove(L, -2);
}

void ah_set_guard(lua_State *L, int idx) {
  aux_eph_set(L, AUX_TG, 0, idx);
}

/* Writes that can fail (a new key in an anchor table needs memory) come
** first, before anything changes; a key, once made, is kept (holding false
** when there is nothing to anchor) until the slot is released, so that a
** restore, which only ever returns to a value the thread had before, never
** allocates.  F[s] and R[s] exist from registration on. */
/* the frame of slot s is no longer anchored in AUX_PEND (raw set of an
** existing array key: cannot fail) */
static void unpend(lua_State *L, ah_state *st, int s) {
  lua_rawgeti(L, AH_UV_AUX, AUX_PEND);
  lua_pushnil(L);
  lua_rawseti(L, -2, s);
  lua_pop(L, 1);
  st->slots[s].anchored &= ~A_PEND;
  st->npend--;
}

/* AUX_PEND[s] = the value at idx (absolute) */
static void pend_write(lua_State *L, int s, int idx) {
  lua_rawgeti(L, AH_UV_AUX, AUX_PEND);
  lua_pushvalue(L, idx);
  lua_rawseti(L, -2, s);
  lua_pop(L, 1);
}

/* A slot whose frame is a deferred anchor (A_PEND) keeps it there: its
** entry in AUX_PEND exists, so writing it cannot fail (the empty frame
** is written as false, which keeps the entry). */
static void set_frame_of(lua_State *L, ah_state *st, int s, int thread_idx,
                         int idx) {
  if (idx < 0) idx = lua_absindex(L, idx);
  if (thread_idx < 0) thread_idx = lua_absindex(L, thread_idx);
  if (lua_topointer(L, idx) != st->empty) {
    if (st->slots[s].anchored & A_PEND) {
      pend_write(L, s, idx);
      st->slots[s].anchored |= A_FRAME;
    } else {
      eph_set(L, st, AH_UV_T, thread_idx, idx); /* first: can fail */
      st->slots[s].anchored |= A_FRAME | AKEY_FRAME;
    }
  } else if (st->slots[s].anchored & A_FRAME) {
    lua_pushboolean(L, 0);
    if (st->slots[s].anchored & A_PEND)
      pend_write(L, s, lua_gettop(L));
    else
      eph_set(L, st, AH_UV_T, thread_idx, lua_gettop(L));
    lua_pop(L, 1);
    st->slots[s].anchored &= ~A_FRAME;
  }
  lua_pushvalue(L, idx);
  lua_rawseti(L, AH_UV_F, s);
  st->fgen++;
}

/* AUX_PENDR[s] = the value at idx (absolute) */
static void pendr_write(lua_State *L, int s, int idx) {
  lua_rawgeti(L, AH_UV_AUX, AUX_PENDR);
  lua_pushvalue(L, idx);
  lua_rawseti(L, -2, s);
  lua_pop(L, 1);
}

/* the resource of slot s is no longer anchored in AUX_PENDR */
static void unpendr(lua_State *L, ah_state *st, int s) {
  lua_pushnil(L);
  pendr_write(L, s, lua_gettop(L));
  lua_pop(L, 1);
  st->slots[s].anchored &= ~A_PENDR;
  st->npend--;
}

/* R[s] holds false for "no resource" (the key stays).  A coroutine's first
** resource (its {thread = co}, made for its init or when first asked for)
** gets a deferred anchor, as its frame does (see ah_anchor_frame): an
** array write instead of a new key in AUX_TR. */
static void set_resource_of(lua_State *L, ah_state *st, int s, int thread_idx,
                            int idx) {
  int none;
  idx = lua_absindex(L, idx);
  none = ah_no_resource(L, idx);
  if (!none || (st->slots[s].anchored & A_RES)) {
    st->rgen++; /* (scope.c's ah_emit_as relies on the count) */
    if (st->slots[s].anchored & A_PENDR) { /* the entry exists: no failure */
      if (none) lua_pushboolean(L, 0);
      pendr_write(L, s, none ? lua_gettop(L) : idx);
      if (none) lua_pop(L, 1);
      st->slots[s].anchored = (unsigned char)(none ? st->slots[s].anchored & ~A_RES
                                                   : st->slots[s].anchored | A_RES);
    } else if (!none && !(st->slots[s].anchored & AKEY_RES) &&
               st->slots[s].kind != AH_KMAIN) {
      ah_slot *sl;
      ah_arm_anchors(L, st); /* can fail, can run finalizers, */
      pendr_write(L, s, idx); /* a new entry beyond the array part: can fail */
      sl = &st->slots[s]; /* (a finalizer can move the slot array) */
      if (!(sl->anchored & A_PENDR)) { /* (unless a finalizer made it) */
        sl->anchored |= A_PENDR;
        sl->pend_age = 0;
        st->npend++;
      }
      sl->anchored |= A_RES | AKEY_RES;
    } else if (none) {
      lua_pushboolean(L, 0);
      aux_eph_set(L, AUX_TR, thread_idx, -1);
      lua_pop(L, 1);
      st->slots[s].anchored &= ~A_RES;
    } else {
      aux_eph_set(L, AUX_TR, thread_idx, idx);
      st->slots[s].anchored |= A_RES | AKEY_RES;
    }
  }
  if (none)
    lua_pushboolean(L, 0);
  else
    lua_pushvalue(L, idx);
  lua_rawseti(L, AH_UV_R, s);
}

/* Make sure the anchor keys of the running thread exist, so that switching
** its frame and resource cannot fail (scope entries reserve first). */
void ah_reserve(lua_State *L, int s) {
  ah_state *st = ah_st(L);
  if (!(st->slots[s].anchored & AKEY_FRAME)) {
    lua_pushboolean(L, 0);
    eph_set(L, st, AH_UV_T, 0, lua_gettop(L));
    lua_pop(L, 1);
    st->slots[s].anchored |= AKEY_FRAME;
  }
  ah_reserve_res(L, s);
}

/* the same for the resource key alone */
void ah_reserve_res(lua_State *L, int s) {
  ah_state *st = ah_st(L);
  if (!(st->slots[s].anchored & AKEY_RES)) {
    st->rgen++;
    lua_pushboolean(L, 0);
    aux_eph_set(L, AUX_TR, 0, -1);
    lua_pop(L, 1);
    st->slots[s].anchored |= AKEY_RES;
  }
}

/* make the value at idx the current frame of L (whose slot is s) */
void ah_set_frame(lua_State *L, int s, int idx) {
  set_frame_of(L, ah_st(L), s, 0, idx);
}

/* the same for a frame at idx (absolute) that is not the empty one, for
** callers that hold st already (set, run): anchor it (first: can fail),
** then F[s].  A coroutine without a key in T gets a deferred anchor, as
** at its creation (see ah_anchor_frame): an array write instead of a new
** hash key per coroutine that sets a value. */
void ah_set_frame_full(lua_State *L, ah_state *st, int s, int idx) {
  ah_slot *sl = &st->slots[s];
  if (sl->anchored & A_PEND) {
    pend_write(L, s, idx);
  } else if (sl->kind != AH_KMAIN && !(sl->anchored & AKEY_FRAME)) {
    ah_arm_anchors(L, st); /* can fail, can run finalizers, */
    sl = &st->slots[s];    /* which can move the slot array (maybe_shrink) */
    pend_write(L, s, idx); /* a new entry beyond the array part: can fail */
    if (!(sl->anchored & A_PEND)) { /* (unless a finalizer made it) */
      sl->anchored |= A_PEND;
      sl->pend_age = 0;
      st->npend++;
    }
  } else {
    eph_set(L, st, AH_UV_T, 0, idx);
    sl->anchored |= AKEY_FRAME;
  }
  sl->anchored |= A_FRAME;
  lua_pushvalue(L, idx);
  lua_rawseti(L, AH_UV_F, s);
  st->fgen++; /* every write of F[s] is counted (luv.c's rearm, dispatch) */
}

/* make the value at idx (possibly nil) the current resource of L */
void ah_set_resource(lua_State *L, int s, int idx) {
  set_resource_of(L, ah_st(L), s, 0, idx);
}

/* --------------------------------------------------------------------- */
/* slot lifetime                                                          */

/* finalizer token of a coroutine created while destroy hooks exist */
typedef struct ah_cotok {
  ah_state *st;
  int slot; /* -1 once the slot was given back */
} ah_cotok;

static void clear(lua_State *L, ah_state *st, int s) {
  if (st->slots[s].anchored & A_PEND) unpend(L, st, s);
  if (st->slots[s].anchored & A_PENDR) unpendr(L, st, s);
  lua_pushnil(L);
  lua_rawseti(L, AH_UV_F, s);
  st->fgen++;
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
  st->ntokpend--;
}

/* The thread of slot s finished for good (returned, or was closed): its
** slot is free for reuse at once, and the thread is marked released. */
/* F[s] and TH[s] of a free slot are stale (weak values, overwritten by the
** next registration); R[s] of a free slot is always nil or false. */
void ah_release(lua_State *L, ah_state *st, int s) {
  ah_slot *sl = &st->slots[s];
  if (ah_unlikely(sl->kind == AH_KMAIN)) return;
  if (ah_unlikely(st->dispatching) &&
      (sl->anchored & (A_PENDR | A_RES)) == (A_PENDR | A_RES)) {
    /* released inside a hook (a coroutine closed from its own before or
    ** after): its resource is anchored by its thread from now on, where
    ** executionAsyncResource() in that hook finds it (see ah_ov).  First,
    ** as it can fail (inside a hook: a hook's error) */
    luaL_checkstack(L, 4, "async_hooks");
    lua_rawgeti(L, AH_UV_AUX, AUX_TR);
    lua_rawgeti(L, AH_UV_TH, s);
    lua_rawgeti(L, AH_UV_AUX, AUX_PENDR);
    lua_rawgeti(L, -1, s);
    lua_replace(L, -2);
    if (lua_type(L, -2) == LUA_TTHREAD) lua_rawset(L, -3); else lua_pop(L, 2);
    lua_pop(L, 1);
  }
  if (ah_unlikely(sl->has_gc)) {
    if (sl->gctok) {
      ((ah_cotok *)sl->gctok)->slot = -1;
    } else if (sl->anchored & A_TOKPEND) { /* ended before it needed one */
      tok_settled(st, s);
    }
  }
  if (ah_likely(st->extra)) {
    ah_extra(sl->L) = AH_RELEASED;
  } else { /* TSLOT[thread] = false: the key exists, nothing allocates */
    lua_rawgeti(L, AH_UV_AUX, AUX_TSLOT);
    if (lua_rawgeti(L, AH_UV_TH, s) == LUA_TTHREAD) {
      lua_pushboolean(L, 0);
      lua_rawset(L, -3);
    } else { /* a thread that a finalizer resurrected: its weak TH entry
             ** is gone; its TSLOT entry names a slot that lookups check */
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  if (sl->anchored & A_PENDR) unpendr(L, st, s);
  if (sl->anchored & (A_RES | A_PEND)) {
    if (sl->anchored & A_RES) {
      lua_pushnil(L);
      lua_rawseti(L, AH_UV_R, s);
    }
    if (sl->anchored & A_PEND) {
      if (s < AH_INLINE) /* dropped by the next anchor here, or the sentinel */
        sl->anchored = (unsigned char)((sl->anchored & ~A_PEND) | A_STALE);
      else /* heap slots can go away (maybe_shrink): drop it now */
        unpend(L, st, s);
    }
  }
  free_slot(st, s);
}

/* __gc of a coroutine token: the coroutine is gone. */
static int cotok_gc(lua_State *L) {
  ah_cotok *tok = (ah_cotok *)lua_touserdata(L, 1);
  ah_state *st = tok->st;
  int s = tok->slot;
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
  int s, framed, has_gc = kind != AH_KMAIN && ah_hooks_on(st, AH_DESTROY);
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
      sweep(L, st) < st->cap / 4 && !grow(st) &&
      st->free_low < 0 && st->free_high < 0)
    luaL_error(L, "not enough memory for a context slot");
  /* a coroutine's frame gets a deferred anchor (see ah_anchor_frame):
  ** its key first (can fail, and can run finalizers, which can take free
  ** slots: checked again) */
  framed = kind != AH_KMAIN && lua_topointer(L, frame_idx) != st->empty;
  if (framed) {
    ah_reserve_anchor(L, st);
    if (ah_unlikely(st->free_low < 0 && st->free_high < 0))
      luaL_error(L, "not enough memory for a context slot");
  }
  s = ah_take_slot(L, st, co, trigger);
  sl = &st->slots[s];
  if (!framed && (sl->anchored & A_STALE)) ah_drop_stale(L, st, s);
  sl->gctok = NULL;
  sl->has_gc = (unsigned char)has_gc;
  if (has_gc) {
    sl->anchored |= A_TOKPEND;
    sl->pend_age = 0;
    st->npend++;
    st->ntokpend++;
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
  if (framed) {
    ah_anchor_frame(L, st, s, thread_idx, frame_idx);
  } else if (kind == AH_KMAIN && lua_topointer(L, frame_idx) != st->empty) {
    eph_set(L, st, AH_UV_T, thread_idx, frame_idx);
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
  sl->anchored &= A_STALE; /* the caller overwrites or drops that entry */
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
  lua_rawgeti(L, AH_UV_AUX, AUX_TSLOT);
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
  lua_rawgeti(L, AH_UV_AUX, AUX_TSLOT);
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
  lua_rawgeti(L, AH_UV_AUX, AUX_TSLOT);
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

/* Deferred anchors.  A frame must stay alive as long as its coroutine,
** without keeping the coroutine alive: an ephemeron entry T[thread] does
** that, but inserting a new key per coroutine (and clearing it after) is
** most of what a tracked coroutine with a value set costs.  Most coroutines
** end before the next collection, so a new coroutine's frame is first held
** strongly in AUX_PEND[s] (an array write), dropped when the coroutine ends
** or changes its frame.  A sentinel finalizer, re-armed every cycle, moves
** the frames of coroutines that lived through AH_PEND_AGE cycles into T
** (a server's requests span a few cycles: with 50 in flight, moving them
** at the first cycle moved 0.8 frames per request, a hash insert each): a
** frame that refers to its own suspended, abandoned coroutine delays its
** collection by AH_PEND_AGE cycles, never forever; the frames of abandoned
** coroutines that nothing else keeps go at the first cycle.  Anchor the (non-empty) frame at frame_idx of the new
** coroutine at thread_idx (slot s) that way (raw sets only: cannot fail,
** runs no finalizer); the caller armed the sentinel (ah_arm_anchors). */
void ah_anchor_frame(lua_State *L, ah_state *st, int s, int thread_idx,
                     int frame_idx) {
  (void)thread_idx;
  lua_rawgeti(L, AH_UV_AUX, AUX_PEND);
  lua_pushvalue(L, frame_idx);
  lua_rawseti(L, -2, s);
  lua_pop(L, 1);
  if (st->slots[s].anchored & A_STALE) /* overwritten: still one entry */
    st->slots[s].anchored &= ~A_STALE;
  else
    st->npend++;
  st->slots[s].anchored |= A_FRAME | A_PEND;
  st->slots[s].pend_age = 0;
}

/* the new owner of slot s has no frame to anchor: drop the entry its
** previous owner left in AUX_PEND (raw set of an existing key) */
void ah_drop_stale(lua_State *L, ah_state *st, int s) {
  lua_rawgeti(L, AH_UV_AUX, AUX_PEND);
  lua_pushnil(L);
  lua_rawseti(L, -2, s);
  lua_pop(L, 1);
  st->slots[s].anchored &= ~A_STALE;
  st->npend--;
}

/* the finalizer token of the has_gc thread at thread_idx, slot s, which
** lived through AH_PEND_AGE collection cycles (one that ends before needs
** none; one collected before gets its destroy from the sentinel); allocates
** (a failure leaves it pending: the token is made at the next cycle) */
static void make_token(lua_State *L, ah_state *st, int s, int thread_idx) {
  ah_cotok *tok = (ah_cotok *)lua_newuserdatauv(L, sizeof(ah_cotok), 0);
  tok->st = st;
  tok->slot = -1; /* until it is the slot's */
  lua_rawgeti(L, AH_UV_AUX, AUX_COTOK_MT);
  lua_setmetatable(L, -2);
  aux_eph_set(L, AUX_TGC, thread_idx, -1);
  tok->slot = s;
  st->slots[s].gctok = tok;
  tok_settled(st, s);
  lua_pop(L, 1);
}

/* __gc of the sentinel: move the deferred anchors of coroutines that lived
** through AH_PEND_AGE cycles to T and give them their finalizer tokens
** (that allocates: a failure leaves the rest pending for the next cycle),
** drop the anchors of collected ones and queue their destroys, and
** re-arm */
static int pend_gc(lua_State *L) {
  ah_state *st = ah_st(L);
  int i;
  st->armed = 0;
  if (st->closed || st->npend == 0) return 0;
  ah_arm_anchors(L, st); /* first: a failure below leaves work for it (a
                         ** failure here, for the next ah_rearm) */
  lua_settop(L, 0);
  lua_rawgeti(L, AH_UV_AUX, AUX_PEND); /* 1 */
  for (i = 1; i < st->cap && st->npend > 0; i++) {
    ah_slot *sl = &st->slots[i];
    int alive;
    if (sl->anchored & A_STALE) { /* a free slot's leftover */
      ah_drop_stale(L, st, i);
      continue;
    }
    if (!sl->L || !(sl->anchored & (A_PEND | A_TOKPEND | A_PENDR))) continue;
    alive = lua_rawgeti(L, AH_UV_TH, i) == LUA_TTHREAD; /* 2 */
    if (alive && ++sl->pend_age < AH_PEND_AGE) { /* young: most coroutines
      ** end before they are old enough to need a move or a token */
      lua_settop(L, 1);
      continue;
    }
    if (sl->anchored & A_PEND) {
      if (alive) {
        lua_pushvalue(L, 2);
        lua_rawgeti(L, 1, i);
        lua_rawset(L, AH_UV_T);
        sl->anchored |= AKEY_FRAME;
      }
      lua_pushnil(L);
      lua_rawseti(L, 1, i);
      sl->anchored &= ~A_PEND;
      st->npend--;
    }
    if (sl->anchored & A_PENDR) {
      if (alive) {
        lua_rawgeti(L, AH_UV_AUX, AUX_TR); /* 3 */
        lua_pushvalue(L, 2);
        lua_rawgeti(L, AH_UV_AUX, AUX_PENDR); /* 5 */
        lua_rawgeti(L, 5, i);
        lua_replace(L, 5);
        lua_rawset(L, 3); /* can fail: the rest waits for the next cycle */
        lua_settop(L, 2);
      }
      unpendr(L, st, i);
    }
    if (sl->anchored & A_TOKPEND) {
      if (alive) {
        make_token(L, st, i, 2);
      } else { /* collected before its token was made */
        tok_settled(st, i);
        thread_gone(L, st, i);
      }
    }
    lua_settop(L, 1);
  }
  return 0;
}

/* Before ah_take_slot + ah_anchor_frame: arm the sentinel and make sure
** AUX_PEND has a key for the slot that will be taken (beyond the presized
** array part it may need memory), so that anchoring cannot fail.  Raw sets
** run no finalizer: the free-list head stays what it is now. */
void ah_reserve_anchor(lua_State *L, ah_state *st) {
  int next;
  ah_arm_anchors(L, st);
  next = st->free_low >= 0 ? st->free_low : st->free_high;
  if (next > AH_INLINE) {
    lua_rawgeti(L, AH_UV_AUX, AUX_PEND);
    lua_pushboolean(L, 0);
    lua_rawseti(L, -2, next);
    lua_pop(L, 1);
  }
}

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
  lua_newuserdatauv(L, 0, 0);
  lua_rawgeti(L, AH_UV_AUX, AUX_PEND_MT);
  lua_setmetatable(L, -2);
  lua_pop(L, 1);
  st->armed = 1;
}

/* A thread that never got a slot: a coroutine created behind the library's
** back (before install(), or by C code).  It gets an empty frame and a
** fresh asyncId the first time it touches the library. */
int ah_slot_slow(lua_State *L, ah_state *st) {
  int s;
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
  s = ah_register(L, st, -2, -1, 0, AH_KFOREIGN);
  lua_pop(L, 2);
  st->last_slot = s;
  return s;
}

/* push the current resource of the thread at thread_idx (slot s),
** materializing a thread's own resource table ({thread = co}) the first
** time it is asked for, and a luv callback's (R[s] holds its trampoline
** while its resource is not made: see luv.c) */
void ah_push_resource_of(lua_State *L, ah_state *st, int s, int thread_idx) {
  int t;
  thread_idx = lua_absindex(L, thread_idx);
  t = lua_rawgeti(L, AH_UV_R, s);
  if ((t == LUA_TFUNCTION || t == LUA_TUSERDATA ||
       (t != LUA_TTABLE && !lua_toboolean(L, -1) && st->cb_n &&
        st->cb[st->cb_n - 1] == st->slots[s].id)) && /* a luv callback's */
      st->lazy_resource && st->lazy_resource(L, st, s)) {
    set_resource_of(L, st, s, thread_idx, -1);
    return;
  }
  if (t == LUA_TTABLE || lua_toboolean(L, -1)) return;
  lua_pop(L, 1);
  if (st->slots[s].kind == AH_KMAIN) {
    lua_rawgeti(L, AH_UV_AUX, AUX_TOP);
    return;
  }
  thread_idx = lua_absindex(L, thread_idx);
  lua_createtable(L, 0, 1);
  lua_pushvalue(L, thread_idx);
  lua_setfield(L, -2, "thread");
  set_resource_of(L, st, s, thread_idx, -1);
}

/* the resource of the coroutine whose before/after slot s is emitting
** (see ah_ov in core.h): its slot's, made now if need be; if the hook
** closed it meanwhile, the one it had (anchored by its thread), else a
** new one (nobody saw one) */
static AH_NOINLINE void push_ov_resource(lua_State *L, ah_state *st) {
  int cs = st->ov.res;
  luaL_checkstack(L, 6, "async_hooks");
  if (st->slots[cs].L == st->ov.co && st->slots[cs].base_id == st->ov.id) {
    lua_rawgeti(L, AH_UV_TH, cs); /* alive: the resumer holds it */
    /* scopes open in it: its own resource, not the innermost scope's */
    if (!(st->slots[cs].scopes && st->own_resource && st->own_resource(L, -1)))
      ah_push_resource_of(L, st, cs, -1);
    lua_remove(L, -2);
    return;
  }
  /* the coroutine is alive (its resumer holds it) but has no slot now
  ** (closed or finished: its stack has room, checked all the same) */
  if (!lua_checkstack(st->ov.co, 1)) luaL_error(L, "not enough memory");
  lua_pushthread(st->ov.co);
  lua_xmove(st->ov.co, L, 1);
  lua_rawgeti(L, AH_UV_AUX, AUX_TR);
  lua_pushvalue(L, -2);
  if (lua_rawget(L, -2) != LUA_TTABLE) { /* nobody saw one: made now, and
    ** anchored by its thread, so that the rest of the event sees this one */
    lua_pop(L, 1);
    lua_createtable(L, 0, 1);
    lua_pushvalue(L, -3);
    lua_setfield(L, -2, "thread");
    lua_pushvalue(L, -3);
    lua_pushvalue(L, -2);
    lua_rawset(L, -4); /* AUX_TR[co] = it (can fail: nothing changed yet) */
    st->rgen++;
  }
  lua_replace(L, -3);
  lua_pop(L, 1);
}

void ah_push_resource(lua_State *L, ah_state *st, int s) {
  if (ah_unlikely(st->ov.slot == s)) {
    push_ov_resource(L, st);
    return;
  }
  lua_pushthread(L);
  ah_push_resource_of(L, st, s, -1);
  lua_remove(L, -2);
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

/* The manual reserves LUA_EXTRASPACE for the host: use it only when the
** main thread's bytes are all zero (a host that stores data there keeps
** it; every thread is then looked up in AUX_TSLOT instead).  Lua does not
** initialize the main thread's bytes: a host that never touches them gets
** whatever the allocator returned, zero for a fresh allocation (valgrind
** flags this deliberate read: .ci/valgrind.supp). */
static AH_NOINLINE int host_extra_unused(lua_State *mainL) {
  /* one real branch per byte (volatile reads; the empty asm keeps the
  ** compiler from folding the tests into arithmetic): memcheck reports
  ** the read here, where the suppression names it, and the result is a
  ** constant it knows to be defined */
  const volatile unsigned char *p =
      (const volatile unsigned char *)lua_getextraspace(mainL);
  size_t i;
  for (i = 0; i < LUA_EXTRASPACE; i++) {
    if (p[i] != 0) {
      AH_BRANCH_BARRIER();
      return 0;
    }
  }
  return 1;
}

/* the slot array (inline), the anchor tables and metatables, the id
** functions; the main thread is registered by core.c once frames exist */
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
  st->extra = AH_EXTRA_FITS && host_extra_unused(st->mainL);

  ah_new_metatable(L, "async_hooks.cotoken", "__gc", cotok_gc, AUX_COTOK_MT);
  ah_new_metatable(L, "async_hooks.anchors", "__gc", pend_gc, AUX_PEND_MT);
  lua_createtable(L, AH_INLINE, 0);
  lua_rawseti(L, AH_UV_AUX, AUX_PEND);
  lua_createtable(L, AH_INLINE, 0);
  lua_rawseti(L, AH_UV_AUX, AUX_PENDR);
  ah_weak_table(L, "k", 0);
  lua_rawseti(L, AH_UV_AUX, AUX_TSLOT);
  for (i = AUX_TR; i <= AUX_TGC; i++) {
    ah_weak_table(L, "k", 0);
    lua_rawseti(L, AH_UV_AUX, i);
  }
  lua_newtable(L);
  lua_rawseti(L, AH_UV_AUX, AUX_TOP);
  ah_add_funcs(L, slot_funcs);
}
