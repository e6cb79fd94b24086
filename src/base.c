/*
** base.c - small helpers every other file may call: the bottom of the file
** graph (it calls no other file of the core).
*/
#include <stdlib.h>
#include <string.h>

#include "core.h"

/* push the shared upvalues of the running core function (AH_UV_*) */
void ah_push_shared(lua_State *L) {
  int i;
  for (i = 1; i <= AH_NUP; i++) lua_pushvalue(L, lua_upvalueindex(i));
}

/* module table on top: add the functions of l, with the shared upvalues */
void ah_add_funcs(lua_State *L, const luaL_Reg *l) {
  ah_push_shared(L);
  luaL_setfuncs(L, l, AH_NUP);
}

/* aux[aux_key] = a new metatable named name, whose metamethod `event`
** (__gc, __close, ...; none when fn is NULL) is fn with the shared upvalues */
void ah_new_metatable(lua_State *L, const char *name, const char *event,
                      lua_CFunction fn, int aux_key) {
  lua_createtable(L, 0, 2);
  lua_pushstring(L, name);
  lua_setfield(L, -2, "__name");
  if (fn) {
    ah_push_shared(L);
    lua_pushcclosure(L, fn, AH_NUP);
    lua_setfield(L, -2, event);
  }
  lua_rawseti(L, AH_UV_AUX, aux_key);
}

/* push a new table with __mode = mode and narr array slots */
void ah_weak_table(lua_State *L, const char *mode, int narr) {
  lua_createtable(L, narr, 0);
  lua_createtable(L, 0, 1);
  lua_pushstring(L, mode);
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
}

/* a function, or a table/userdata with a __call metamethod */
int ah_callable(lua_State *L, int idx) {
  int t = lua_type(L, idx);
  if (t == LUA_TFUNCTION) return 1;
  if (t != LUA_TTABLE && t != LUA_TUSERDATA) return 0;
  if (luaL_getmetafield(L, idx, "__call") == LUA_TNIL) return 0;
  lua_pop(L, 1);
  return 1;
}

/* queue the destroy of id, delivered by ah_flush (hooks.c); runs in
** finalizers: no Lua call, no error */
void ah_queue_destroy(ah_state *st, lua_Integer id) {
  if (ah_unlikely(st->closed)) return; /* lua_close: nothing allocates */
  if (st->dq_n == st->dq_cap) {
    size_t ncap = st->dq_cap ? st->dq_cap * 2 : 16;
    lua_Integer *n = realloc(st->dq, ncap * sizeof(lua_Integer));
    if (!n) return; /* out of memory in a finalizer: the event is lost */
    st->dq = n;
    st->dq_cap = ncap;
  }
  st->dq[st->dq_n++] = id;
}

/* luaL_where(L, level), past the frames of the library's own Lua files
** (AUX_LIBDIR): a public function written in Lua that the user called in
** tail position has no caller frame left, and the next frame may be a
** library scope's; the position is then the nearest user code's.  Called
** by core functions (the shared upvalues), on error paths only. */
void ah_where(lua_State *L, int level) {
  lua_Debug ar;
  size_t n = 0;
  const char *dir = NULL;
  luaL_checkstack(L, 2, "async_hooks");
  if (lua_rawgeti(L, AH_UV_AUX, AUX_LIBDIR) == LUA_TSTRING)
    dir = lua_tolstring(L, -1, &n);
  while (dir && lua_getstack(L, level, &ar) && lua_getinfo(L, "S", &ar) &&
         strncmp(ar.source, dir, n) == 0)
    level++;
  lua_pop(L, 1); /* (AUX keeps dir alive) */
  luaL_where(L, level);
}
