/*
** passthrough.c - the least an interposer of luv and coroutines pays,
** through the public Lua C API, to carry one value to callbacks: no
** context library, no checks, no error handling.  Not part of the
** library: bench/http_server.lua's "passthrough" server puts it under the
** pure-Lua physical pieces, and bench/http_instr.lua prints the row, so
** that the AsyncLocal's distance to what interposing costs at all is
** printed in every run.
**   wrap(f, pos): a C function calling luv's C function f in its own
**     frame, with the callback at pos replaced by a closure over the
**     callback and the current value (one allocation per registration)
**   wrapco(f): the same for coroutine.create/wrap: the new coroutine or
**     function is given the current value (one weak table entry)
** A callback's closure makes its value current around the call and puts
** the previous one back (unprotected: an error skips that).
*/
#include <lua.h>
#include <lauxlib.h>

#define CUR lua_upvalueindex(3) /* {current value} (shared) */

static int dispatch(lua_State *L) {
  int i, n = lua_gettop(L);
  lua_rawgeti(L, CUR, 1);             /* previous value */
  lua_pushvalue(L, lua_upvalueindex(2));
  lua_rawseti(L, CUR, 1);             /* enter */
  lua_pushvalue(L, lua_upvalueindex(1));
  for (i = 1; i <= n; i++) lua_pushvalue(L, i);
  lua_call(L, n, 0);
  lua_rawseti(L, CUR, 1);             /* leave */
  return 0;
}

static int wrapped(lua_State *L) {
  lua_CFunction f = lua_tocfunction(L, lua_upvalueindex(1));
  int pos = (int)lua_tointeger(L, lua_upvalueindex(2));
  if (lua_type(L, pos) == LUA_TFUNCTION) {
    lua_pushvalue(L, pos);
    lua_rawgeti(L, CUR, 1);
    lua_pushvalue(L, CUR);
    lua_pushcclosure(L, dispatch, 3);
    lua_replace(L, pos);
  }
  return f(L);
}

static int wrappedco(lua_State *L) {
  lua_CFunction f = lua_tocfunction(L, lua_upvalueindex(1));
  int n = f(L);
  lua_pushvalue(L, -n);
  lua_rawgeti(L, CUR, 1);
  lua_rawset(L, lua_upvalueindex(2)); /* anchors[new] = current */
  return n;
}

static void push_cur(lua_State *L) {
  lua_getfield(L, LUA_REGISTRYINDEX, "passthrough.cur");
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    lua_createtable(L, 1, 0);
    lua_pushboolean(L, 1);
    lua_rawseti(L, -2, 1);
    lua_pushvalue(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, "passthrough.cur");
  }
}

static int wrap(lua_State *L) {
  lua_Integer pos = luaL_checkinteger(L, 2);
  luaL_argcheck(L, lua_tocfunction(L, 1) != NULL, 1, "a C function");
  lua_settop(L, 1);
  lua_pushinteger(L, pos);
  push_cur(L);
  lua_pushcclosure(L, wrapped, 3);
  return 1;
}

static int wrapco(lua_State *L) {
  luaL_argcheck(L, lua_tocfunction(L, 1) != NULL, 1, "a C function");
  lua_settop(L, 1);
  lua_newtable(L); /* anchors, weak-keyed */
  lua_newtable(L);
  lua_pushliteral(L, "k");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  push_cur(L);
  lua_pushcclosure(L, wrappedco, 3);
  return 1;
}

int luaopen_passthrough(lua_State *L) {
  static const luaL_Reg f[] = {{"wrap", wrap}, {"wrapco", wrapco}, {NULL, NULL}};
  luaL_newlib(L, f);
  return 1;
}
