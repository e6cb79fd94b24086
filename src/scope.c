/*
** scope.c - the scope trampoline behind AsyncResource:runInAsyncScope and
** every bound function.
**
** enter_scope(id, trigger, resource, frame) switches the current thread's
** context and returns a guard whose __close emits `after` and restores the
** previous context.  Lua code holds it in a to-be-closed variable, so the
** restore happens on return, on error (the error object and traceback are
** untouched, no pcall involved) and, inside a coroutine, when the coroutine
** is closed; the scope spans yields because it lives in the coroutine's own
** stack.  Scopes entered from Lua nest without C-stack limits.
*/
#include "core.h"

typedef struct ah_guard {
  lua_Integer id, prev_id, prev_trigger;
  int on_main;
  int closed;
} ah_guard;

static int l_enter_scope(lua_State *L) {
  ah_state *st = ah_st(L);
  lua_Integer id = luaL_checkinteger(L, 1);
  lua_Integer trigger = luaL_checkinteger(L, 2);
  ah_guard *g;
  int s;
  luaL_checkany(L, 3);
  luaL_checktype(L, 4, LUA_TTABLE);
  lua_settop(L, 4);
  s = ah_slot_of(L, st);
  g = (ah_guard *)lua_newuserdatauv(L, sizeof(ah_guard), 2); /* 5 */
  g->id = id;
  g->prev_id = st->slots[s].id;
  g->prev_trigger = st->slots[s].trigger;
  g->on_main = L == st->mainL;
  g->closed = 0;
  lua_rawgeti(L, AH_UV_AUX, AUX_GUARD_MT);
  lua_setmetatable(L, 5);
  lua_rawgeti(L, AH_UV_R, s);
  lua_setiuservalue(L, 5, 1);
  lua_rawgeti(L, AH_UV_F, s);
  lua_setiuservalue(L, 5, 2);
  /* nothing below can fail: switch */
  st->slots[s].id = id;
  st->slots[s].trigger = trigger;
  ah_set_resource(L, s, 3);
  ah_set_frame(L, s, 4);
  if (g->on_main) st->active++;
  ah_emit_id(L, st, AH_BEFORE, id);
  return 1;
}

static int guard_close(lua_State *L) {
  ah_state *st = ah_st(L);
  ah_guard *g = (ah_guard *)lua_touserdata(L, 1);
  int s;
  if (g->closed) return 0;
  g->closed = 1;
  ah_emit_id(L, st, AH_AFTER, g->id);
  s = ah_slot_of(L, st);
  st->slots[s].id = g->prev_id;
  st->slots[s].trigger = g->prev_trigger;
  lua_getiuservalue(L, 1, 1);
  ah_set_resource(L, s, -1);
  lua_getiuservalue(L, 1, 2);
  ah_set_frame(L, s, -1);
  lua_pop(L, 2);
  if (g->on_main) {
    st->active--;
    ah_flush_maybe(L, st);
  }
  return 0;
}

const luaL_Reg ah_scope_funcs[] = {
  {"enter_scope", l_enter_scope},
  {NULL, NULL}
};

void ah_open_scope(lua_State *L) {
  lua_createtable(L, 0, 2);
  lua_pushliteral(L, "async_hooks.scope");
  lua_setfield(L, -2, "__name");
  ah_push_shared(L);
  lua_pushcclosure(L, guard_close, AH_NUP);
  lua_setfield(L, -2, "__close");
  lua_rawseti(L, AH_UV_AUX, AUX_GUARD_MT);
}
