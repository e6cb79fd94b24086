/*
** anchors.c - what keeps a slot's Lua values alive exactly as long as its
** thread: the thread-keyed ephemeron anchors, the frame and resource
** writes that go with them, and a thread's current resource (made on
** demand).
**
** Calls nothing above base.c; slots.c (slot lifetime) and the units above
** it call in.  A luv callback's lazily made resource and a coroutine's own
** resource under open scopes are reached through the function pointers
** st->lazy_resource (luv/) and st->own_resource (scope.c).
*/
#include "anchors.h"
#include "base.h"

/* --------------------------------------------------------------------- */
/* thread anchors                                                         */

/* A slot's Lua values live in weak tables indexed by slot (F frames, R
** resources, TH the thread itself), so nothing there keeps a thread
** alive.  What keeps them alive as long as their thread is an ephemeron
** entry keyed by the thread: T[thread] = frame, AUX_TR[thread] = resource,
** AUX_TG[thread] = innermost open scope guard.  A frame that refers to its
** own coroutine therefore does not leak, and nothing else holds them: an
** unreachable thread goes with its values at the first full collection,
** as it would without the library.  The empty frame needs no anchor,
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
/* Plain frames.  A frame whose values are all strings, numbers, booleans
** or nil refers to nothing that can reach a thread (its keys are tokens,
** weak), so holding it strongly changes no object's lifetime but its own:
** a coroutine whose frames were all plain keeps its frame in AUX_PEND[s]
** (an array write) instead of a new key in T (a hash insert and, at the
** end, a removal).  frames.c gives plain frames their own metatable. */
int ah_frame_plain(lua_State *L, ah_state *st, int idx) {
  const void *mt, *p = lua_topointer(L, idx);
  if (p == st->empty) return 1;
  /* the frame made last is known (exact: see frames.c's push_frame_with) */
  if (p == st->lastf) return st->lastplain;
  if (!lua_getmetatable(L, idx)) return 0;
  mt = lua_topointer(L, -1);
  lua_pop(L, 1);
  return mt == st->plain_mt;
}

/* AUX_PEND[s] = the value at idx (AUX_PEND has an array entry for every
** slot index, false when unused: the write cannot fail) */
void ah_pend_set(lua_State *L, int s, int idx) {
  idx = lua_absindex(L, idx);
  ah_auxt(L, AUX_PEND);
  lua_pushvalue(L, idx);
  lua_rawseti(L, -2, s);
  lua_pop(L, 1);
}

/* Anchor the frame at idx (absolute; not the empty one) as the frame of
** slot s, whose thread is at thread_idx (0: the running one).  A thread
** with a key in T keeps using it (a write to an existing key cannot
** fail); one whose frames were all plain keeps them in AUX_PEND; its
** first frame that is not plain moves it to T for good (a new key, which
** can fail: first, before anything changes). */
static void anchor_frame(lua_State *L, ah_state *st, int s, int thread_idx,
                         int idx) {
  ah_slot *sl = &st->slots[s];
  if (!(sl->anchored & AKEY_FRAME) && sl->kind != AH_KMAIN &&
      ah_frame_plain(L, st, idx)) {
    ah_pend_set(L, s, idx);
    sl->anchored |= A_PEND;
  } else {
    ah_eph_set(L, st, AH_UV_T, thread_idx, idx);
    if (sl->anchored & A_PEND) {
      lua_pushboolean(L, 0);
      ah_pend_set(L, s, -1);
      lua_pop(L, 1);
      sl->anchored &= ~A_PEND;
    }
    sl->anchored |= AKEY_FRAME;
  }
  sl->anchored |= A_FRAME;
}

/* F[s] = the frame at idx, anchored by the thread at thread_idx (0: the
** running one); the empty frame needs no anchor (written as false where
** the thread has an anchor, which keeps its key or entry) */
static void set_frame_of(lua_State *L, ah_state *st, int s, int thread_idx,
                         int idx) {
  if (idx < 0) idx = lua_absindex(L, idx);
  if (thread_idx < 0) thread_idx = lua_absindex(L, thread_idx);
  if (lua_topointer(L, idx) != st->empty) {
    anchor_frame(L, st, s, thread_idx, idx); /* first: can fail */
  } else if (st->slots[s].anchored & A_FRAME) {
    lua_pushboolean(L, 0);
    if (st->slots[s].anchored & A_PEND)
      ah_pend_set(L, s, -1);
    else
      ah_eph_set(L, st, AH_UV_T, thread_idx, lua_gettop(L));
    lua_pop(L, 1);
    st->slots[s].anchored &= ~A_FRAME;
  }
  lua_pushvalue(L, idx);
  lua_rawseti(L, AH_UV_F, s);
  st->fgen++;
  if (st->pend_frame == s) st->pend_frame = 0;
}

/* R[s] holds false for "no resource" (the key stays).  The resource is
** anchored by its thread (AUX_TR[thread]), never by anything the thread
** does not reach: a resource refers to its coroutine ({thread = co}). */
static void set_resource_of(lua_State *L, ah_state *st, int s, int thread_idx,
                            int idx) {
  int none;
  idx = lua_absindex(L, idx);
  none = ah_no_resource(L, idx);
  if (!none || (st->slots[s].anchored & A_RES)) {
    st->rgen++; /* (scope.c's ah_emit_as relies on the count) */
    if (none) {
      lua_pushboolean(L, 0);
      ah_aux_eph_set(L, AUX_TR, thread_idx, -1);
      lua_pop(L, 1);
      st->slots[s].anchored &= ~A_RES;
    } else {
      ah_aux_eph_set(L, AUX_TR, thread_idx, idx); /* first: can fail */
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

/* the same for a frame at idx (absolute) that frames.c just made (so not
** the empty one) and knows to be plain or not (set, run): anchor it
** (first: can fail), then F[s].  May leave a value above idx. */
void ah_set_new_frame(lua_State *L, ah_state *st, int s, int idx,
                      int plain) {
  ah_slot *sl = &st->slots[s];
  if (plain && !(sl->anchored & AKEY_FRAME) && sl->kind != AH_KMAIN) {
    /* AUX_PEND[s] (see ah_pend_set), inline: the usual first set() of a
    ** coroutine */
    if (ah_unlikely(lua_rawgeti(L, AH_UV_AUX, AUX_PEND) != LUA_TTABLE)) {
      lua_pop(L, 1);
      ah_auxt(L, AUX_PEND); /* raises */
    }
    lua_pushvalue(L, idx);
    lua_rawseti(L, -2, s);
    sl->anchored |= A_FRAME | A_PEND;
  } else {
    anchor_frame(L, st, s, 0, idx);
  }
  lua_pushvalue(L, idx);
  lua_rawseti(L, AH_UV_F, s);
  st->fgen++; /* every write of F[s] is counted (luv/'s rearm, dispatch) */
  if (st->pend_frame == s) st->pend_frame = 0;
}

/* make the value at idx (possibly nil) the current resource of L */
void ah_set_resource(lua_State *L, int s, int idx) {
  set_resource_of(L, ah_st(L), s, 0, idx);
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
** time it is asked for, and a luv callback's (R[s] holds its record while
** its resource is not made: see luv/) */
void ah_push_resource_of(lua_State *L, ah_state *st, int s, int thread_idx) {
  int t;
  thread_idx = lua_absindex(L, thread_idx);
  t = lua_rawgeti(L, AH_UV_R, s);
  if (t != LUA_TTABLE && (t == LUA_TFUNCTION || t == LUA_TUSERDATA ||
                          !lua_toboolean(L, -1)) &&
      st->lazy_resource && st->lazy_resource(L, st, s, t)) { /* a callback's */
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
** (see ah_ov in ah.h): its slot's, made now if need be; if the hook
** closed it meanwhile, the one it had (anchored by its thread), else a
** new one (nobody saw one) */
static AH_NOINLINE void push_ov_resource(lua_State *L, ah_state *st) {
  int cs = st->ov.res;
  luaL_checkstack(L, AH_RESOURCE_STACK, "async_hooks");
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

/* the anchor tables: AUX_PEND with an entry per inline slot (see
** ah_pend_set), the thread-keyed ones, the top-level resource, the key of
** a thread's resource */
void ah_open_anchors(lua_State *L) {
  int i;
  lua_createtable(L, AH_INLINE, 0);
  for (i = 1; i <= AH_INLINE; i++) {
    lua_pushboolean(L, 0);
    lua_rawseti(L, -2, i);
  }
  lua_rawseti(L, AH_UV_AUX, AUX_PEND);
  for (i = AUX_TR; i <= AUX_TGC; i++) {
    ah_weak_table(L, "k", 0);
    lua_rawseti(L, AH_UV_AUX, i);
  }
  lua_newtable(L);
  lua_rawseti(L, AH_UV_AUX, AUX_TOP);
  lua_pushliteral(L, "thread");
  lua_rawseti(L, AH_UV_AUX, AUX_KTHREAD);
}
