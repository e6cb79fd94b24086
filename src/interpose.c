/*
** interpose.c - a stand-in for a C method of another library (cqueues'
** controller methods), through which the original keeps its own argument
** errors: messages, argument numbers, names and positions.
**
** interpose(orig, mt, impl, post) -> stand-in.  orig: a C function with at
** most IP_MAXUP upvalues.  The stand-in is a C closure whose first
** upvalues are copies of orig's, so that orig runs in the stand-in's own
** frame (orig reads its upvalues through the running closure): Lua names
** the call as it names the stand-in's, as it would name orig's.  A call
** whose first argument has the metatable mt and whose second is a
** function goes to impl (a Lua function, given every argument); any other
** call to orig itself, whose checks raise what they raise without the
** library.  post (or nil) is called with no arguments after orig
** returns, its results kept.  mt = nil: every call goes to orig (set
** through debug.setupvalue to retire a stand-in that another library's
** interposition still calls).
*/
#include "interpose.h"
#include "base.h"

#define IP_MAXUP 8 /* upvalues of orig copied (the rest nil, as for orig) */
#define IP_ORIG lua_upvalueindex(IP_MAXUP + 1)
#define IP_MT lua_upvalueindex(IP_MAXUP + 2)
#define IP_IMPL lua_upvalueindex(IP_MAXUP + 3)
#define IP_POST lua_upvalueindex(IP_MAXUP + 4)
#define IP_NUP (IP_MAXUP + 4)

static int stand_in(lua_State *L) {
  lua_CFunction orig = lua_tocfunction(L, IP_ORIG);
  int n;
  if (lua_type(L, IP_MT) == LUA_TTABLE && lua_type(L, 2) == LUA_TFUNCTION &&
      lua_type(L, IP_IMPL) == LUA_TFUNCTION && lua_getmetatable(L, 1)) {
    int same = lua_rawequal(L, -1, IP_MT);
    lua_pop(L, 1);
    if (same) {
      n = lua_gettop(L);
      luaL_checkstack(L, 1, "async_hooks");
      lua_pushvalue(L, IP_IMPL);
      lua_insert(L, 1);
      lua_call(L, n, LUA_MULTRET);
      return lua_gettop(L);
    }
  }
  /* (the debug library can change the upvalues: check the one called) */
  if (orig == NULL)
    return luaL_error(L, "async_hooks: internal state damaged (interpose)");
  n = orig(L); /* its results: the top n values, kept above post's call */
  if (lua_type(L, IP_POST) == LUA_TFUNCTION) {
    luaL_checkstack(L, 1, "async_hooks");
    lua_pushvalue(L, IP_POST);
    lua_call(L, 0, 0);
  }
  return n;
}

static int l_interpose(lua_State *L) {
  lua_CFunction orig = lua_tocfunction(L, 1);
  int i, nup = 0;
  luaL_argexpected(L, orig != NULL, 1, "C function");
  if (!lua_isnoneornil(L, 2)) luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checktype(L, 3, LUA_TFUNCTION);
  if (!lua_isnoneornil(L, 4)) luaL_checktype(L, 4, LUA_TFUNCTION);
  lua_settop(L, 4);
  luaL_checkstack(L, IP_NUP, "async_hooks");
  while (lua_getupvalue(L, 1, nup + 1) != NULL) {
    if (++nup > IP_MAXUP) return 0; /* too many: nothing (the caller's
                                    ** fallback) */
  }
  for (i = nup; i < IP_MAXUP; i++) lua_pushnil(L);
  for (i = 1; i <= 4; i++) lua_pushvalue(L, i);
  lua_pushcclosure(L, stand_in, IP_NUP);
  return 1;
}

static const luaL_Reg interpose_funcs[] = {
  {"interpose", l_interpose},
  {NULL, NULL}
};

/* module table on top */
void ah_open_interpose(lua_State *L) {
  ah_add_funcs(L, interpose_funcs);
}
