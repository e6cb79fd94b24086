/*
** hookcall.c - what one hook event costs at the least: a call from C into
** a Lua function that counts, made the way any C library must make it.
** Not part of the library: bench/http_instr.lua builds it and runs it
** under callgrind next to the HTTP rows, so that the hooks row's distance
** to this bound is printed in every run.
**   each(t, n): n protected calls of t[1](i), each with a message handler
**               (an error in a hook must be reported where it was raised)
**   bare(t, n): n unprotected calls of t[1](i) (no error handling at all)
*/
#include <lua.h>
#include <lauxlib.h>

static int handler(lua_State *L) {
  (void)L;
  return 1; /* the error as it is */
}

static int each(lua_State *L) {
  lua_Integer i, n = luaL_checkinteger(L, 2);
  luaL_checktype(L, 1, LUA_TTABLE);
  for (i = 0; i < n; i++) {
    int base = lua_gettop(L);
    lua_pushcfunction(L, handler);
    lua_rawgeti(L, 1, 1);
    lua_pushinteger(L, i);
    if (lua_pcall(L, 1, 0, base + 1) != LUA_OK) return lua_error(L);
    lua_settop(L, base);
  }
  return 0;
}

static int bare(lua_State *L) {
  lua_Integer i, n = luaL_checkinteger(L, 2);
  luaL_checktype(L, 1, LUA_TTABLE);
  for (i = 0; i < n; i++) {
    lua_rawgeti(L, 1, 1);
    lua_pushinteger(L, i);
    lua_call(L, 1, 0);
  }
  return 0;
}

int luaopen_hookcall(lua_State *L) {
  static const luaL_Reg f[] = {{"each", each}, {"bare", bare}, {NULL, NULL}};
  luaL_newlib(L, f);
  return 1;
}
