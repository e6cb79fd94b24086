/*
** extrahost.c - a small host that uses LUA_EXTRASPACE, as the Lua manual
** allows, to check that async_hooks never writes it once told so.
**
** usage: extrahost host|none SCRIPT
** "host" fills the main thread's extra space with a pattern before anything
** else runs (threads made later copy it) and declares it in the registry
** field async_hooks.host_extraspace; "none" fills it with the same bytes
** but declares nothing, so the module owns it (whatever bytes are there:
** Lua leaves them uninitialized).  The global function host_check() tells whether the
** running thread's extra space still holds the host's bytes ("none": it
** returns true).  Exit status 0 when SCRIPT ran without error and the main
** thread's bytes are intact at the end.
*/
#include <stdio.h>
#include <string.h>

#include "lauxlib.h"
#include "lua.h"
#include "lualib.h"

static int host_mode;

static void pattern(unsigned char *p) {
  size_t i;
  for (i = 0; i < LUA_EXTRASPACE; i++) p[i] = (unsigned char)(0xA5 ^ (i * 7));
}

static int intact(lua_State *L) {
  unsigned char want[LUA_EXTRASPACE];
  if (!host_mode) return 1;
  pattern(want);
  return memcmp(lua_getextraspace(L), want, LUA_EXTRASPACE) == 0;
}

static int host_check(lua_State *L) {
  lua_pushboolean(L, intact(L));
  return 1;
}

int main(int argc, char **argv) {
  lua_State *L;
  int ok;
  if (argc != 3 || (strcmp(argv[1], "host") && strcmp(argv[1], "none"))) {
    fprintf(stderr, "usage: %s host|none SCRIPT\n", argv[0]);
    return 2;
  }
  host_mode = strcmp(argv[1], "host") == 0;
  L = luaL_newstate();
  if (!L) return 2;
  /* Lua does not initialize the main thread's extra space: "none" leaves
  ** non-zero bytes there too, which must not matter */
  pattern((unsigned char *)lua_getextraspace(L));
  if (host_mode) {
    lua_pushboolean(L, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, "async_hooks.host_extraspace");
  }
  luaL_openlibs(L);
  lua_pushcfunction(L, host_check);
  lua_setglobal(L, "host_check");
  lua_pushboolean(L, host_mode);
  lua_setglobal(L, "host_mode");
  ok = luaL_dofile(L, argv[2]) == LUA_OK;
  if (!ok) fprintf(stderr, "%s\n", lua_tostring(L, -1));
  if (!intact(L)) {
    fprintf(stderr, "the main thread's extra space was overwritten\n");
    ok = 0;
  }
  lua_close(L);
  if (ok) printf("extrahost %s: ok\n", argv[1]);
  return ok ? 0 : 1;
}
