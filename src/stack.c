/*
** stack.c - the native store of execution contexts and the module entry.
**
** See core.h for the model.  A slot is allocated when a thread first needs a
** context (the main thread at load time, a coroutine at create time, any
** other thread the first time it touches the library).  The slot's Lua
** values live in weak tables indexed by slot, kept alive by ephemeron
** entries keyed by the thread (see "thread anchors" below).  A slot is
** given back when its coroutine returns or is closed, by a finalizer token
** when destroy hooks need one, or else by a sweep when the free lists run
** dry: no per-coroutine finalizer in the common case.
*/
#include <stdlib.h>
#include <string.h>

#include "core.h"

static char ah_key; /* registry[&ah_key] = module table */

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
  if (st->used_high || st->used_low > AH_INLINE / 2 ||
      st->slots == st->inline_slots)
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
static void eph_set(lua_State *L, int eph, int thread_idx, int idx) {
  ah_state *st = ah_st(L);
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
static void set_frame_of(lua_State *L, ah_state *st, int s, int thread_idx,
                         int idx) {
  idx = lua_absindex(L, idx);
  if (thread_idx) thread_idx = lua_absindex(L, thread_idx);
  if (lua_topointer(L, idx) != st->empty) {
    eph_set(L, AH_UV_T, thread_idx, idx);
    st->slots[s].anchored |= A_FRAME | K_FRAME;
  } else if (st->slots[s].anchored & A_FRAME) {
    lua_pushboolean(L, 0);
    eph_set(L, AH_UV_T, thread_idx, lua_gettop(L));
    lua_pop(L, 1);
    st->slots[s].anchored &= ~A_FRAME;
  }
  lua_pushvalue(L, idx);
  lua_rawseti(L, AH_UV_F, s);
}

/* R[s] holds false for "no resource" (the key stays) */
static void set_resource_of(lua_State *L, ah_state *st, int s, int thread_idx,
                            int idx) {
  int none;
  idx = lua_absindex(L, idx);
  none = lua_isnil(L, idx) || (lua_isboolean(L, idx) && !lua_toboolean(L, idx));
  if (!none || (st->slots[s].anchored & A_RES)) {
    if (none) {
      lua_pushboolean(L, 0);
      aux_eph_set(L, AUX_TR, thread_idx, -1);
      lua_pop(L, 1);
      st->slots[s].anchored &= ~A_RES;
    } else {
      aux_eph_set(L, AUX_TR, thread_idx, idx);
      st->slots[s].anchored |= A_RES | K_RES;
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
  if (!(st->slots[s].anchored & K_FRAME)) {
    lua_pushboolean(L, 0);
    eph_set(L, AH_UV_T, 0, lua_gettop(L));
    lua_pop(L, 1);
    st->slots[s].anchored |= K_FRAME;
  }
  if (!(st->slots[s].anchored & K_RES)) {
    lua_pushboolean(L, 0);
    aux_eph_set(L, AUX_TR, 0, -1);
    lua_pop(L, 1);
    st->slots[s].anchored |= K_RES;
  }
}

/* make the value at idx the current frame of L (whose slot is s) */
void ah_set_frame(lua_State *L, int s, int idx) {
  set_frame_of(L, ah_st(L), s, 0, idx);
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

static void clear(lua_State *L, int s) {
  lua_pushnil(L);
  lua_rawseti(L, AH_UV_F, s);
  lua_pushnil(L);
  lua_rawseti(L, AH_UV_R, s);
  lua_pushnil(L);
  lua_rawseti(L, AH_UV_TH, s);
}

/* The thread of slot s finished for good (returned, or was closed): its
** slot is free for reuse at once, and the thread is marked released. */
void ah_release(lua_State *L, ah_state *st, int s) {
  ah_slot *sl = &st->slots[s];
  if (sl->kind == AH_KMAIN) return;
  if (sl->has_gc) ((ah_cotok *)sl->gctok)->slot = -1;
  ah_extra(sl->L) = AH_RELEASED;
  clear(L, s);
  free_slot(st, s);
}

/* __gc of a coroutine token: the coroutine is gone.  Queue its destroy (a
** coroutine collected while suspended) and give the slot back. */
static int cotok_gc(lua_State *L) {
  ah_cotok *tok = (ah_cotok *)lua_touserdata(L, 1);
  ah_state *st = tok->st;
  int s = tok->slot;
  if (s < 0 || st->closed) return 0;
  tok->slot = -1;
  if (!st->slots[s].destroyed) {
    st->slots[s].destroyed = 1;
    if (ah_hooks_on(st, AH_DESTROY)) ah_queue_destroy(st, st->slots[s].base_id);
  }
  clear(L, s);
  free_slot(st, s);
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
      clear(L, i);
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
  ah_cotok *tok = NULL;
  ah_slot *sl;
  int s, has_gc = kind != AH_KMAIN && ah_hooks_on(st, AH_DESTROY);
  thread_idx = lua_absindex(L, thread_idx);
  frame_idx = lua_absindex(L, frame_idx);
  co = lua_tothread(L, thread_idx);
  if (has_gc) { /* first: the only step here that can run finalizers */
    tok = (ah_cotok *)lua_newuserdatauv(L, sizeof(ah_cotok), 0);
    tok->st = st;
    tok->slot = -1;
    lua_rawgeti(L, AH_UV_AUX, AUX_REC_MT);
    lua_setmetatable(L, -2);
    aux_eph_set(L, AUX_TGC, thread_idx, -1);
    lua_pop(L, 1);
  }
  if (st->free_low < 0 && st->free_high < 0 &&
      sweep(L, st) < st->cap / 4 && !grow(st) &&
      st->free_low < 0 && st->free_high < 0)
    luaL_error(L, "not enough memory for a context slot");
  s = alloc_slot(st);
  sl = &st->slots[s];
  sl->L = co;
  sl->gctok = tok;
  sl->has_gc = (unsigned char)has_gc;
  sl->kind = (unsigned char)kind;
  sl->destroyed = 0;
  sl->anchored = kind == AH_KMAIN ? K_FRAME | K_RES : 0; /* aux slots */
  sl->base_id = sl->id = (kind == AH_KMAIN) ? 1 : st->next_id++;
  sl->base_trigger = sl->trigger = trigger;
  ah_extra(co) = (uintptr_t)s;
  if (tok) tok->slot = s;
  /* raw sets never run finalizers: nothing can reuse s meanwhile */
  lua_pushvalue(L, thread_idx);
  lua_rawseti(L, AH_UV_TH, s);
  lua_pushboolean(L, 0);
  lua_rawseti(L, AH_UV_R, s);
  set_frame_of(L, st, s, thread_idx, frame_idx);
  return s;
}

/* A thread that never got a slot: a coroutine created behind the library's
** back (before install(), or by C code).  It gets an empty frame and a
** fresh asyncId the first time it touches the library. */
int ah_slot_slow(lua_State *L, ah_state *st) {
  int s;
  lua_pushthread(L);
  lua_rawgeti(L, AH_UV_AUX, AUX_EMPTY);
  s = ah_register(L, st, -2, -1, 0, AH_KFOREIGN);
  lua_pop(L, 2);
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
      ah_luv_resource(L, st, s)) {
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

void ah_push_resource(lua_State *L, ah_state *st, int s) {
  lua_pushthread(L);
  ah_push_resource_of(L, st, s, -1);
  lua_remove(L, -2);
}

void ah_push_shared(lua_State *L) {
  int i;
  for (i = 1; i <= AH_NUP; i++) lua_pushvalue(L, lua_upvalueindex(i));
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
  st->res_on = 1;
  ah_push_resource(L, st, ah_slot_of(L, st));
  return 1;
}

/* introspection for tests and benchmarks */
static int l_stats(lua_State *L) {
  ah_state *st = ah_st(L);
  int i, used = 0;
  for (i = 0; i < st->cap; i++) used += st->slots[i].L != NULL;
  lua_createtable(L, 0, 9);
  lua_pushinteger(L, used);
  lua_setfield(L, -2, "slots");
  lua_pushinteger(L, st->cap);
  lua_setfield(L, -2, "capacity");
  lua_pushboolean(L, st->slots == st->inline_slots);
  lua_setfield(L, -2, "inline");
  lua_pushinteger(L, st->active);
  lua_setfield(L, -2, "active");
  lua_pushinteger(L, (lua_Integer)st->dq_n);
  lua_setfield(L, -2, "queued_destroys");
  lua_pushinteger(L, st->dispatching);
  lua_setfield(L, -2, "dispatching");
  lua_pushinteger(L, st->next_id);
  lua_setfield(L, -2, "next_id");
  lua_pushinteger(L, st->fast_callbacks);
  lua_setfield(L, -2, "fast_callbacks");
  return 1;
}

static int l_persist(lua_State *L) {
  lua_rawgeti(L, AH_UV_AUX, AUX_PERSIST);
  return 1;
}

const luaL_Reg ah_slot_funcs[] = {
  {"executionAsyncId", l_execution_id},
  {"triggerAsyncId", l_trigger_id},
  {"executionAsyncResource", l_execution_resource},
  {"stats", l_stats},
  {"persist", l_persist},
  {NULL, NULL}
};

/* --------------------------------------------------------------------- */
/* module                                                                  */

static int state_gc(lua_State *L) {
  ah_state *st = (ah_state *)lua_touserdata(L, 1);
  st->closed = 1;
  if (st->slots != st->inline_slots) free(st->slots);
  st->slots = st->inline_slots;
  st->cap = AH_INLINE;
  free(st->dq);
  st->dq = NULL;
  if (st->cb != st->cb_inline) free(st->cb);
  st->cb = st->cb_inline;
  st->cb_n = 0;
  st->dq_n = st->dq_cap = 0;
  return 0;
}

static void new_metatable(lua_State *L, const char *name, lua_CFunction gc,
                          int aux_key) {
  lua_createtable(L, 0, 2);
  lua_pushstring(L, name);
  lua_setfield(L, -2, "__name");
  if (gc) {
    ah_push_shared(L);
    lua_pushcclosure(L, gc, AH_NUP);
    lua_setfield(L, -2, "__gc");
  }
  lua_rawseti(L, AH_UV_AUX, aux_key);
}

static void add_funcs(lua_State *L, const luaL_Reg *l) {
  ah_push_shared(L);
  luaL_setfuncs(L, l, AH_NUP);
}

/* Build everything inside a closure so that helper code can use the
** AH_UV_* indices. */
static int build(lua_State *L) {
  ah_state *st = ah_st(L);
  int i;
  lua_State *mainL;
  st->slots = st->inline_slots;
  st->cap = AH_INLINE;
  st->free_low = st->free_high = -1;
  for (i = AH_INLINE - 1; i >= 0; i--) push_free(st, i);
  st->next_id = 2;
  st->cb = st->cb_inline;
  st->cb_cap = AH_CB_INLINE;

  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  mainL = lua_tothread(L, -1);
  st->mainL = mainL;

  new_metatable(L, "async_hooks.cotoken", cotok_gc, AUX_REC_MT);
  for (i = AUX_TR; i <= AUX_TGC; i++) {
    lua_newtable(L);
    lua_createtable(L, 0, 1);
    lua_pushliteral(L, "k");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    lua_rawseti(L, AH_UV_AUX, i);
  }
  lua_newtable(L);
  lua_rawseti(L, AH_UV_AUX, AUX_TOP);
  lua_newtable(L);
  lua_rawseti(L, AH_UV_AUX, AUX_ORDER);
  lua_createtable(L, AH_NKINDS, 0);
  for (i = 1; i <= AH_NKINDS; i++) {
    lua_newtable(L);
    lua_rawseti(L, -2, i);
  }
  lua_rawseti(L, AH_UV_AUX, AUX_LISTS);
  lua_newtable(L);
  lua_rawseti(L, AH_UV_AUX, AUX_PERSIST);
  ah_open_frames(L); /* sets AUX_FRAME_MT and AUX_EMPTY */
  lua_rawgeti(L, AH_UV_AUX, AUX_EMPTY);
  st->empty = lua_topointer(L, -1);
  lua_pop(L, 1);
  ah_open_hooks(L);
  ah_open_scope(L);

  /* the main thread: slot 0, asyncId 1, triggerAsyncId 0 */
  lua_rawgeti(L, AH_UV_AUX, AUX_EMPTY);
  ah_register(L, st, -2, -1, 0, AH_KMAIN);
  lua_pop(L, 2);

  lua_newtable(L);
  add_funcs(L, ah_slot_funcs);
  add_funcs(L, ah_frame_funcs);
  add_funcs(L, ah_hook_funcs);
  add_funcs(L, ah_scope_funcs);
  ah_open_coro(L); /* adds the coroutine functions to the module */
  add_funcs(L, ah_luv_funcs);
  return 1;
}

static void weak_table(lua_State *L, const char *mode) {
  lua_newtable(L);
  lua_createtable(L, 0, 1);
  lua_pushstring(L, mode);
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
}

AH_EXPORT int luaopen_async_hooks_core(lua_State *L) {
  ah_state *st;
  /* idempotent: busted re-runs luaopen_* in the same state */
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &ah_key) == LUA_TTABLE) return 1;
  lua_pop(L, 1);
  st = (ah_state *)lua_newuserdatauv(L, sizeof(ah_state), 0);
  memset(st, 0, sizeof *st);
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, state_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  weak_table(L, "v"); /* F */
  weak_table(L, "v"); /* R */
  weak_table(L, "k"); /* T */
  lua_createtable(L, AUX_N, 0);
  weak_table(L, "v"); /* TH */
  lua_pushcclosure(L, build, AH_NUP);
  lua_call(L, 0, 1);
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &ah_key);
  return 1;
}
