/*
** anchors.c - what keeps a slot's Lua values alive exactly as long as its
** thread: the thread-keyed ephemeron anchors, the deferred anchors (strong
** array entries, moved to the ephemerons by the per-cycle sentinel in
** slots.c), the frame and resource writes that go with them, and a
** thread's current resource (made on demand).
**
** Calls nothing above base.c; slots.c (slot lifetime, the sentinel) and
** the files above it call in.  A luv callback's lazily made resource and a
** coroutine's own resource under open scopes are reached through the
** function pointers st->lazy_resource (luv.c) and st->own_resource
** (scope.c).
*/
#include "core.h"

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
void ah_eph_set(lua_State *L, ah_state *st, int eph, int thread_idx,
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

void ah_aux_eph_set(lua_State *L, int key, int thread_idx, int idx) {
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
  ah_auxt(L, key);
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
  ah_auxt(L, AUX_TG);
  if (thread_idx)
    lua_pushvalue(L, thread_idx);
  else
    lua_pushthread(L);
  lua_rawget(L, -2);
  lua_remove(L, -2);
}

void ah_set_guard(lua_State *L, int idx) {
  ah_aux_eph_set(L, AUX_TG, 0, idx);
}

/* Writes that can fail (a new key in an anchor table needs memory) come
** first, before anything changes; a key, once made, is kept (holding false
** when there is nothing to anchor) until the slot is released, so that a
** restore, which only ever returns to a value the thread had before, never
** allocates.  F[s] and R[s] exist from registration on. */
/* AUX_PEND[s] = nil, and flag (A_PEND, A_STALE) no longer counted (raw
** set of an existing array key: cannot fail) */
static void drop_pend(lua_State *L, ah_state *st, int s, unsigned char flag) {
  ah_auxt(L, AUX_PEND);
  lua_pushnil(L);
  lua_rawseti(L, -2, s);
  lua_pop(L, 1);
  st->slots[s].anchored &= (unsigned char)~flag;
  st->npend--;
}

/* the frame of slot s is no longer anchored in AUX_PEND */
void ah_unpend(lua_State *L, ah_state *st, int s) {
  drop_pend(L, st, s, A_PEND);
}

/* AUX_PEND[s] = the value at idx (absolute) */
static void pend_write(lua_State *L, int s, int idx) {
  ah_auxt(L, AUX_PEND);
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
      ah_eph_set(L, st, AH_UV_T, thread_idx, idx); /* first: can fail */
      st->slots[s].anchored |= A_FRAME | AKEY_FRAME;
    }
  } else if (st->slots[s].anchored & A_FRAME) {
    lua_pushboolean(L, 0);
    if (st->slots[s].anchored & A_PEND)
      pend_write(L, s, lua_gettop(L));
    else
      ah_eph_set(L, st, AH_UV_T, thread_idx, lua_gettop(L));
    lua_pop(L, 1);
    st->slots[s].anchored &= ~A_FRAME;
  }
  lua_pushvalue(L, idx);
  lua_rawseti(L, AH_UV_F, s);
  st->fgen++;
}

/* AUX_PENDR[s] = the value at idx (absolute) */
static void pendr_write(lua_State *L, int s, int idx) {
  ah_auxt(L, AUX_PENDR);
  lua_pushvalue(L, idx);
  lua_rawseti(L, -2, s);
  lua_pop(L, 1);
}

/* the resource of slot s is no longer anchored in AUX_PENDR */
void ah_unpendr(lua_State *L, ah_state *st, int s) {
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
      ah_aux_eph_set(L, AUX_TR, thread_idx, -1);
      lua_pop(L, 1);
      st->slots[s].anchored &= ~A_RES;
    } else {
      ah_aux_eph_set(L, AUX_TR, thread_idx, idx);
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
    ah_eph_set(L, st, AH_UV_T, 0, lua_gettop(L));
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
    ah_aux_eph_set(L, AUX_TR, 0, -1);
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
    ah_eph_set(L, st, AH_UV_T, 0, idx);
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
  ah_auxt(L, AUX_PEND);
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
  drop_pend(L, st, s, A_STALE);
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
    ah_auxt(L, AUX_PEND);
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
  *(void **)lua_newuserdatauv(L, sizeof(void *), 0) = NULL; /* (AH_NULLOBJ) */
  ah_auxt(L, AUX_PEND_MT);
  lua_setmetatable(L, -2);
  lua_pop(L, 1);
  st->armed = 1;
}

/* push a new resource table for the thread at thread_idx: {thread = co} */
void ah_new_thread_resource(lua_State *L, int thread_idx) {
  thread_idx = lua_absindex(L, thread_idx);
  lua_createtable(L, 0, 1);
  lua_rawgeti(L, AH_UV_AUX, AUX_KTHREAD);
  lua_pushvalue(L, thread_idx);
  lua_rawset(L, -3);
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
  ah_new_thread_resource(L, thread_idx);
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
  ah_auxt(L, AUX_TR);
  lua_pushvalue(L, -2);
  if (lua_rawget(L, -2) != LUA_TTABLE) { /* nobody saw one: made now, and
    ** anchored by its thread, so that the rest of the event sees this one */
    lua_pop(L, 1);
    ah_new_thread_resource(L, -2);
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
