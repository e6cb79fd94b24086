/*
** core.c - the module entry: luaopen_async_hooks_core makes the per-state
** ah_state and the shared upvalues, then runs build, which calls every
** file's ah_open_<file> in file-graph order (see core.h).  Also the
** state's finalizer and the module's own functions (stats, persist).
*/
#include <stdlib.h>
#include <string.h>

#include "core.h"

/* registry[&ah_key] = module table.  The key is reachable from Lua as a
** light userdata: it points to a null pointer (see core.h, AH_NULLOBJ) */
static const void *const ah_key = NULL;

/* --------------------------------------------------------------------- */
/* module functions                                                        */

/* introspection for tests and benchmarks */
static int l_stats(lua_State *L) {
  ah_state *st = ah_st(L);
  int i, used = 0;
  for (i = 0; i < st->cap; i++) used += st->slots[i].L != NULL;
  lua_createtable(L, 0, 12);
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
  lua_pushboolean(L, st->extra);
  lua_setfield(L, -2, "extraspace");
  lua_pushinteger(L, st->npend);
  lua_setfield(L, -2, "pending_tokens");
  lua_pushinteger(L, AH_PEND_AGE);
  lua_setfield(L, -2, "pend_age");
  lua_pushinteger(L, st->init_res);
  lua_setfield(L, -2, "init_resources");
  return 1;
}

/* a table kept for the Lua front end across re-requires */
static int l_persist(lua_State *L) {
  lua_rawgeti(L, AH_UV_AUX, AUX_PERSIST);
  return 1;
}

static const luaL_Reg core_funcs[] = {
  {"stats", l_stats},
  {"persist", l_persist},
  {NULL, NULL}
};

/* --------------------------------------------------------------------- */
/* the state                                                               */

/* __gc of the ah_state userdata (lua_close): free the native arrays.
** Library code can still run afterwards (finalizers that run later: luv's
** loop finalizer runs pending callbacks), so what remains stays usable:
** the slot array is a userdata (AUX_SLOTS), freed with the state; the
** destroy queue and the callback stack allocate nothing from now on. */
static int state_gc(lua_State *L) {
  ah_state *st = (ah_state *)lua_touserdata(L, 1);
  /* (reachable from Lua: debug.getmetatable; only a state is one) */
  if (st == NULL || lua_rawlen(L, 1) != sizeof(ah_state) || st->self != st)
    return 0;
  if (ah_load_ptr(ah_known) == st)
    ah_store_ptr(ah_known, (ah_state *)(void *)&ah_known); /* (see base.c) */
  ah_luv_forget(st);
  st->closed = 1;
  free(st->dq);
  st->dq = NULL;
  st->dq_n = st->dq_cap = 0;
  if (st->cb != st->cb_inline) free(st->cb);
  st->cb = st->cb_inline;
  st->cb_cap = AH_CB_INLINE;
  st->cb_n = 0;
  return 0;
}

/* push a zeroed ah_state userdata with its finalizer; its metatable also
** keeps the slot array once it grew (ah_anchor_slots) */
static ah_state *new_state(lua_State *L) {
  ah_state *st = (ah_state *)lua_newuserdatauv(L, sizeof(ah_state), 0);
  memset(st, 0, sizeof *st);
  st->self = st;
  lua_createtable(L, 1, 1);
  lua_pushboolean(L, 0);
  lua_rawseti(L, -2, 1); /* (see ah_anchor_slots) */
  lua_pushcfunction(L, state_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  return st;
}

/* push the AH_NUP upvalues for the state at st_idx: nil (the function's
** own), the state, F, R, T, the aux table (which anchors the state too),
** TH */
static void push_upvalues(lua_State *L, int st_idx) {
  st_idx = lua_absindex(L, st_idx);
  lua_pushnil(L);
  lua_pushvalue(L, st_idx);
  ah_weak_table(L, "v", AH_INLINE); /* F */
  ah_weak_table(L, "v", AH_INLINE); /* R */
  ah_weak_table(L, "k", 0);         /* T */
  lua_createtable(L, AUX_N, 0);     /* AUX */
  lua_pushvalue(L, st_idx);
  lua_rawseti(L, -2, AUX_STATE);
  ah_weak_table(L, "v", AH_INLINE); /* TH */
}

/* --------------------------------------------------------------------- */
/* build                                                                   */

/* module table on top: what core.c itself owns */
static void open_core(lua_State *L) {
  ah_state *st = ah_st(L);
  st->cb = st->cb_inline; /* the luv trampolines' native stack */
  st->cb_cap = AH_CB_INLINE;
  lua_newtable(L);
  lua_rawseti(L, AH_UV_AUX, AUX_PERSIST);
  ah_new_metatable(L, "async_hooks.internal", NULL, NULL, AUX_INTERNAL_MT);
  ah_add_funcs(L, core_funcs);
}

/* the main thread: slot 1, asyncId 1, triggerAsyncId 0, the empty frame
** (needs the slot store and the frames) */
static void register_main(lua_State *L, ah_state *st) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  lua_rawgeti(L, AH_UV_AUX, AUX_EMPTY);
  ah_register(L, st, -2, -1, 0, AH_KMAIN);
  lua_pop(L, 2);
}

/* Runs as a closure with the shared upvalues, so that every ah_open_<file>
** can use the AH_UV_* indices.  Returns the module table. */
static int build(lua_State *L) {
  lua_newtable(L); /* the module */
  open_core(L);
  ah_open_slots(L);
  ah_open_frames(L); /* AUX_EMPTY: register_main needs it */
  ah_open_hooks(L);
  ah_open_scope(L);
  ah_open_coro(L);
  ah_open_luv(L);
  register_main(L, ah_st(L));
  return 1;
}

AH_EXPORT int luaopen_async_hooks_core(lua_State *L) {
  /* idempotent: busted re-runs luaopen_* in the same state */
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &ah_key) == LUA_TTABLE) return 1;
  lua_pop(L, 1);
  new_state(L);
  push_upvalues(L, -1);
  lua_pushcclosure(L, build, AH_NUP);
  lua_call(L, 0, 1);
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &ah_key);
  return 1;
}
