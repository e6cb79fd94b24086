/*
** module.c - the roof: luaopen_async_hooks_core makes the per-state
** ah_state and the shared upvalues, then runs build, which calls every
** unit's ah_open_<unit>, bottom up.  Also the state's finalizer and the
** module's own functions (stats, persist).  Included by nothing.
*/
#include <string.h>

#include "ah.h"
#include "base.h"
#include "queue.h"
#include "anchors.h"
#include "slots.h"
#include "frames.h"
#include "hooks.h"
#include "resource.h"
#include "scope.h"
#include "coro.h"
#include "interpose.h"
#include "luv/luv.h"

/* registry[&ah_key] = module table.  The key is reachable from Lua as a
** light userdata: it points to a null pointer (see ah.h, AH_NULLOBJ) */
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
  ah_luv_stats(L); /* fast_callbacks */
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

static const luaL_Reg module_funcs[] = {
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
** destroy queue allocates nothing from now on (luv/ frees its own). */
static int state_gc(lua_State *L) {
  ah_state *st = (ah_state *)lua_touserdata(L, 1);
  /* (reachable from Lua: debug.getmetatable; only a state is one) */
  if (st == NULL || lua_rawlen(L, 1) != sizeof(ah_state) || st->self != st)
    return 0;
  ah_st_forget(st);
  st->closed = 1;
  ah_queue_free(st);
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

/* module table on top: what module.c itself owns */
static void open_module(lua_State *L) {
  lua_newtable(L);
  lua_rawseti(L, AH_UV_AUX, AUX_PERSIST);
  ah_add_funcs(L, module_funcs);
}

/* Runs as a closure with the shared upvalues, so that every ah_open_<unit>
** can use the AH_UV_* indices; each adds its aux entries, metatables and
** functions to the module table on top.  Returns the module table. */
static int build(lua_State *L) {
  lua_newtable(L); /* the module */
  ah_open_base(L);
  open_module(L);
  ah_open_anchors(L);
  ah_open_slots(L);
  ah_open_frames(L);
  ah_open_hooks(L);
  ah_open_resource(L);
  ah_open_scope(L);
  ah_open_coro(L);
  ah_open_luv(L);
  ah_open_interpose(L);
  ah_register_main(L); /* needs the slot store and the empty frame */
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
