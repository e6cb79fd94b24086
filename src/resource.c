/*
** resource.c - what AsyncResource (api.lua) needs of the core: fresh ids,
** its init, its destroy (queued and delivered at once when nothing is
** active) and the GC token that queues the destroy of a resource
** collected before emitDestroy.
*/
#include "resource.h"
#include "base.h"
#include "slots.h"
#include "hooks.h"
#include "queue.h"

typedef struct ah_gctok {
  ah_state *st;
  lua_Integer id;
  int done;
} ah_gctok;

/* new_ids([trigger]) -> asyncId, triggerAsyncId */
static int l_new_ids(lua_State *L) {
  ah_state *st = ah_st(L);
  lua_Integer trigger;
  if (lua_isnoneornil(L, 1))
    trigger = st->slots[ah_slot_of(L, st)].id;
  else
    trigger = luaL_checkinteger(L, 1);
  lua_pushinteger(L, st->next_id++);
  lua_pushinteger(L, trigger);
  return 2;
}

/* emit_init(id, type, trigger, resource) */
static int l_emit_init(lua_State *L) {
  ah_state *st = ah_st(L);
  lua_Integer id = luaL_checkinteger(L, 1);
  const char *type = luaL_checkstring(L, 2);
  lua_Integer trigger = luaL_checkinteger(L, 3);
  if (ah_emit_init(L, st, id, type, trigger, 4)) return ah_raise(L);
  return 0;
}

static int gctok_gc(lua_State *L) {
  /* (the metatable is reachable from Lua: only a token of this state) */
  ah_gctok *t = (ah_gctok *)ah_testudata(L, 1, sizeof(ah_gctok), ah_st(L));
  if (t && !t->done && !t->st->closed && t->st->nhooks[AH_DESTROY])
    ah_queue_destroy(t->st, t->id);
  if (t) t->done = 1;
  return 0;
}

/* gc_token(id): queues destroy(id) when collected, unless cancelled */
static int l_gc_token(lua_State *L) {
  ah_state *st = ah_st(L);
  lua_Integer id = luaL_checkinteger(L, 1);
  ah_gctok *t = (ah_gctok *)lua_newuserdatauv(L, sizeof(ah_gctok), 0);
  t->st = st;
  t->id = id;
  t->done = 0;
  ah_auxt(L, AUX_GCTOK_MT);
  lua_setmetatable(L, -2);
  return 1;
}

/* the GC token at idx, or NULL */
static ah_gctok *gc_token_at(lua_State *L, int idx) {
  ah_gctok *t = (ah_gctok *)lua_touserdata(L, idx);
  int ok = t != NULL && lua_getmetatable(L, idx);
  if (ok) {
    lua_rawgeti(L, AH_UV_AUX, AUX_GCTOK_MT);
    ok = lua_rawequal(L, -1, -2);
    lua_pop(L, 2);
  }
  return ok ? t : NULL;
}

static int l_gc_token_cancel(lua_State *L) {
  ah_gctok *t = gc_token_at(L, 1);
  luaL_argexpected(L, t != NULL, 1, "gc token");
  t->done = 1;
  return 0;
}

/* emit_destroy(id[, resource, token]): queue, and deliver now when nothing
** is active.  The resource is marked destroyed: a scope of it open in a
** suspended coroutine is out, and stays out (see scope.c's
** ah_scopes_slice).  The resource's GC token is cancelled first: when a
** destroy hook's dispatch raises, the destroy was delivered all the same,
** and the collection must not queue another */
static int l_emit_destroy(lua_State *L) {
  ah_state *st = ah_st(L);
  lua_Integer id = luaL_checkinteger(L, 1);
  ah_gctok *t = lua_isuserdata(L, 3) ? gc_token_at(L, 3) : NULL;
  if (lua_type(L, 2) == LUA_TTABLE) { /* first: can fail */
    ah_auxt(L, AUX_DESTROYED);
    lua_pushvalue(L, 2);
    lua_pushboolean(L, 1);
    lua_rawset(L, -3);
    lua_pop(L, 1);
  }
  if (t) t->done = 1;
  if (st->nhooks[AH_DESTROY]) ah_queue_destroy(st, id);
  ah_flush_maybe(L, st);
  return 0;
}

static const luaL_Reg resource_funcs[] = {
  {"new_ids", l_new_ids},
  {"emit_init", l_emit_init},
  {"emit_destroy", l_emit_destroy},
  {"gc_token", l_gc_token},
  {"gc_token_cancel", l_gc_token_cancel},
  {NULL, NULL}
};

int ah_resource_destroyed(lua_State *L, int idx) {
  int destroyed;
  idx = lua_absindex(L, idx);
  ah_auxt(L, AUX_DESTROYED);
  lua_pushvalue(L, idx);
  destroyed = lua_rawget(L, -2) == LUA_TBOOLEAN && lua_toboolean(L, -1);
  lua_pop(L, 2);
  return destroyed;
}

void ah_open_resource(lua_State *L) {
  ah_weak_table(L, "k", 0);
  lua_rawseti(L, AH_UV_AUX, AUX_DESTROYED);
  ah_new_metatable(L, "async_hooks.gctoken", "__gc", gctok_gc, AUX_GCTOK_MT);
  ah_add_funcs(L, resource_funcs);
}
